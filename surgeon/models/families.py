"""The decoder families `surgeon` knows, by transformers' `model_type`, and what each supports: one table.

Every family here is covered by the property test on tiny random models (tests/test_families.py);
any other causal LM goes through the generic block discovery with a warning (`adapter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Channel = tuple[tuple[str, ...], str]  # (producer layers, consumer layer) of a hidden channel in a decoder block


@dataclass(frozen=True)
class Family:
    """What one family supports beyond unstructured, N:M and row/column pruning, which every family has.

    channels: the hidden channels inside a decoder block, MLP then attention (`channels`); a family with fused
        projections lists only its unfused ones.
    coupled: coupled units (`units`): gated MLP neurons (OPT: fc1/fc2), query heads with `head_dim`, KV groups.
    compact: the standard compact export (`export.compact`); decilm: the per-layer DeciLM export too.
    expert_width, expert_count: the config keys of the fused routed experts' width (compact export) and count
        (`--structure experts`); None where the family has no routed experts, or they cannot leave whole.
    whole_qk_norm: q_norm and k_norm normalise all heads at once, so a head cannot leave on its own.
    """

    channels: tuple[Channel, ...] = ()
    coupled: bool = False
    compact: bool = False
    decilm: bool = False
    expert_width: str | None = None
    expert_count: str | None = None
    whole_qk_norm: bool = False


_GATED: tuple[Channel, ...] = ((("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj"),
                               (("self_attn.v_proj",), "self_attn.o_proj"))
_COUPLED = Family(_GATED, coupled=True, compact=True)
_MOE = Family(coupled=True, compact=True, expert_width="moe_intermediate_size", expert_count="num_experts")

FAMILIES: dict[str, Family] = {
    "llama": Family(_GATED, coupled=True, compact=True, decilm=True),
    "mistral": _COUPLED,
    "qwen2": _COUPLED,
    "qwen3": _COUPLED,
    "smollm": _COUPLED,
    "opt": Family(((("fc1",), "fc2"), (("self_attn.v_proj",), "self_attn.out_proj")), coupled=True, compact=True),
    "mixtral": Family(coupled=True, compact=True, expert_width="intermediate_size", expert_count="num_local_experts"),
    "olmoe": Family(coupled=True, compact=True, expert_width="intermediate_size", expert_count="num_experts",
                    whole_qk_norm=True),
    "qwen2_moe": _MOE,
    "qwen3_moe": _MOE,
    **{name: Family(_GATED) for name in ("gemma", "gemma2", "gemma3_text", "olmo2", "granite", "stablelm", "smollm3")},
    "starcoder2": Family(((("mlp.c_fc",), "mlp.c_proj"), (("self_attn.v_proj",), "self_attn.o_proj"))),
    "gpt_neox": Family(((("mlp.dense_h_to_4h",), "mlp.dense_4h_to_h"),)),
    "phi3": Family(),
    "deepseek_v3": Family(),
}


def family_of(config: Any) -> Family:
    """The family of a transformers config; a family not in the table supports nothing beyond the generic."""
    return FAMILIES.get(getattr(config, "model_type", ""), Family())


def supporting(feature: str) -> tuple[str, ...]:
    """The families whose `feature` (a `Family` field) is set, in the table's order."""
    return tuple(name for name, family in FAMILIES.items() if getattr(family, feature))
