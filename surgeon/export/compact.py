"""Compact export: a pruned model with its removed MLP neurons and attention heads cut out (docs/DESIGN.md).

A unit leaves the model exactly when its contribution to the block's output is zero for every input:

- MLP neuron j (of a dense MLP, a shared expert or each routed expert),
  `down[:, j] · act(gate_j · x) · (up_j · x)`: down column j is zero, or up row j is
  zero, or gate row j is zero and act(0) = 0 (OPT: `fc2[:, j] · act(fc1_j · x + b_j)`, fc2 column j
  zero, or fc1 row j and b_j zero and act(0) = 0).
- Query head h, `o[:, h] · softmax(q_h k_gᵀ) v_g`: o's columns of head h are zero, or the rows of its
  KV head g in v (and v's bias) are zero.
- KV head g: every query head that reads it can leave.

The "standard" format keeps the architecture and its `model_type`, whose config holds one width for
every block: each block keeps the most units any block needs, its own live units first, then removable
ones (whose output is exactly zero) as padding. The head count stays a multiple of the KV heads and,
for Llama (whose config requires it), a divisor of `hidden_size`; `head_dim` is written explicitly.
OPT keeps its heads (its attention has no `head_dim`: q, k, v stay hidden × hidden) and compacts its MLP.
Mixture-of-Experts models (mixtral, olmoe, qwen2_moe, qwen3_moe) compact their fused experts the same way, in
this format only (olmoe keeps its heads): every expert keeps the widest expert's live neurons, rounded up to
`EXPERT_ALIGN`.
The "decilm" format (Llama) is the per-layer one: DeciLM's `block_configs`, which vLLM serves natively
and `compact_modeling` loads in transformers. Each layer keeps its own MLP width (exact, or rounded up
to a multiple of 256 and written as `ffn_mult` for readers that need that key, such as llama.cpp's
converter) and its own KV heads, the query heads and head_dim of the original in every layer, and a
part with no live unit and no output bias is left out (no-op). Padding that no original unit provides
is new zero weights: a zero neuron, or a query head with zero q rows and zero o columns, adds exactly 0.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from surgeon.errors import SurgeonError
from surgeon.export import EXPORT_FORMATS
from surgeon.models import compact_modeling
from surgeon.models.adapter import attention_layout, causal_lm_class, decoder_blocks
from surgeon.models.channels import maps_zero_to_zero
from surgeon.models.experts import fused_weights, is_fused_experts, kept_neurons
from surgeon.models.families import family_of, supporting

# transformers runs fused experts with torch's grouped GEMM, whose operands need rows of a multiple of 16 bytes:
# the experts keep a multiple of 8 neurons (padding with removable ones), enough for 16-bit weights and wider
EXPERT_ALIGN = 8


@dataclass(frozen=True)
class BlockUnits:
    """Which units of one decoder block must stay (True) because their output is not exactly zero."""

    neurons: torch.Tensor  # [intermediate] of the dense MLP or shared expert ([0]: none)
    heads: torch.Tensor  # [kv_heads, heads per kv head]
    experts: torch.Tensor | None = None  # [experts, intermediate] of a Mixture-of-Experts block's fused experts


def _zero_rows(weight: torch.Tensor, bias: torch.Tensor | None, groups: int) -> torch.Tensor:
    """Per group of consecutive rows: whether every weight (and bias entry) in it is zero."""
    zero = (weight == 0).all(1)
    if bias is not None:
        zero = zero & (bias == 0)
    return zero.reshape(groups, -1).all(1)


def _zero_cols(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """Per group of consecutive columns: whether every weight in it is zero."""
    return (weight == 0).all(0).reshape(groups, -1).all(1)


def _linear(block: nn.Module, name: str) -> nn.Linear:
    """The `nn.Linear` at `name` inside a decoder block."""
    module = block.get_submodule(name)
    if not isinstance(module, nn.Linear):
        raise SurgeonError(f"compact export: {name} is {type(module).__name__}, not nn.Linear")
    return module


def _config(model: nn.Module) -> Any:
    """The transformers config of `model`."""
    return model.config


def _head_layout(config: Any) -> tuple[int, int, int]:
    """(KV heads, query heads per KV head, head_dim) of a gated-family config."""
    heads, kv_heads, head_dim = attention_layout(config)
    return kv_heads, heads // kv_heads, head_dim


def live_units(model: nn.Module) -> list[BlockUnits]:
    """Per decoder block, the MLP neurons and query heads whose output can be non-zero."""
    config = _config(model)
    family = getattr(config, "model_type", "")
    if not family_of(config).compact:
        raise SurgeonError(f"compact export supports {', '.join(supporting('compact'))}; the model is {family!r}")
    zero_act = maps_zero_to_zero(config)
    units = []
    for block in decoder_blocks(model):
        if family == "opt":
            fc1, fc2 = _linear(block, "fc1"), _linear(block, "fc2")
            dead = _zero_cols(fc2.weight, fc2.in_features)
            if zero_act:
                dead = dead | _zero_rows(fc1.weight, fc1.bias, fc1.out_features)
            heads = torch.ones(config.num_attention_heads, 1, dtype=torch.bool)
            units.append(BlockUnits(~dead, heads))
            continue
        dead = torch.ones(0, dtype=torch.bool)
        mlp = _mlp(block)
        if mlp is not None:
            gate, up, down = (_linear(block, f"{mlp}{name}_proj") for name in ("gate", "up", "down"))
            dead = _dead_neurons(gate.weight, gate.bias, up.weight, up.bias, down.weight, zero_act)
        o, v = _linear(block, "self_attn.o_proj"), _linear(block, "self_attn.v_proj")
        kv_heads, per_kv, _ = _head_layout(config)
        dead_heads = _zero_cols(o.weight, kv_heads * per_kv).reshape(kv_heads, per_kv)
        dead_heads = dead_heads | _zero_rows(v.weight, v.bias, kv_heads).unsqueeze(1)
        if family_of(config).whole_qk_norm and bool(dead_heads.any()):
            raise SurgeonError(f"compact export: {family} normalises q and k over all heads at once, so its heads "
                               "stay; this model has heads with zero output")
        units.append(BlockUnits(~dead, ~dead_heads, _live_experts(block, zero_act)))
    return units


def _mlp(block: nn.Module) -> str | None:
    """The prefix of a gated block's dense MLP ("mlp.") or shared expert; None for routed experts alone."""
    mlp = block.get_submodule("mlp")
    for prefix, module in (("mlp.", mlp), ("mlp.shared_expert.", getattr(mlp, "shared_expert", None))):
        if isinstance(getattr(module, "down_proj", None), nn.Linear):
            return prefix
    return None


def _dead_neurons(gate: torch.Tensor, gate_bias: torch.Tensor | None, up: torch.Tensor, up_bias: torch.Tensor | None,
                  down: torch.Tensor, zero_act: bool) -> torch.Tensor:
    """A gated MLP's neurons whose output is exactly zero: down column or up row zero, or gate row if act(0) = 0."""
    inner = down.shape[1]
    dead = _zero_cols(down, inner) | _zero_rows(up, up_bias, inner)
    return dead | _zero_rows(gate, gate_bias, inner) if zero_act else dead


def _live_experts(block: nn.Module, zero_act: bool) -> torch.Tensor | None:
    """[experts, intermediate]: the fused experts' neurons whose output can be non-zero (None: no fused experts)."""
    fused = getattr(block.get_submodule("mlp"), "experts", None)
    if fused is None or not is_fused_experts(fused):
        return None
    gate_up, down = (weight.detach() for weight in fused_weights(fused))
    inner = down.shape[2]
    return ~torch.stack([_dead_neurons(g[:inner], None, g[inner:], None, d, zero_act) for g, d in zip(gate_up, down)])


def _first(live: torch.Tensor, count: int) -> torch.Tensor:
    """`count` indices of a 1-D mask: the live ones, in order, then padding from the rest, in order."""
    order = torch.cat([live.nonzero().squeeze(1), (~live).nonzero().squeeze(1)])
    return order[:count].sort().values


def standard_widths(model: nn.Module, units: list[BlockUnits]) -> tuple[int, int, int]:
    """(intermediate size, KV heads, query heads per KV head) that every block of the standard format keeps."""
    config = _config(model)
    inner = max(int(u.neurons.sum()) for u in units)
    if family_of(config).expert_width and len({u.experts is None for u in units}) > 1:
        raise SurgeonError("compact export: the model mixes dense MLP and Mixture-of-Experts blocks, whose widths "
                           "its config holds under different names; the pruned (masked) checkpoint is the one to use")
    if config.model_type == "opt":
        return max(inner, 1), config.num_attention_heads, 1
    kv_heads, per_kv, _ = _head_layout(config)
    kv = max(max(int(u.heads.any(1).sum()) for u in units), 1)
    per = max(max(int(u.heads.sum(1).max()) for u in units), 1)
    if config.model_type == "llama":  # LlamaConfig requires hidden_size % num_attention_heads == 0
        fits = [(k, p) for k in range(kv, kv_heads + 1) for p in range(per, per_kv + 1)
                if config.hidden_size % (k * p) == 0]
        kv, per = min(fits, key=lambda pair: (pair[0] * pair[1], pair))
    return max(inner, 1), kv, per


def _select(module: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None,
            ) -> dict[str, torch.Tensor]:
    """The weight (and bias) of `module` restricted to `rows` and `cols` (None: all)."""
    weight = module.weight.detach()
    weight = weight if rows is None else weight.index_select(0, rows)
    weight = weight if cols is None else weight.index_select(1, cols)
    out = {"weight": weight}
    if module.bias is not None:
        out["bias"] = module.bias.detach() if rows is None else module.bias.detach().index_select(0, rows)
    return out


def _head_rows(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Row indices of `heads` (head numbers) in a projection of `head_dim` rows per head."""
    return (heads.unsqueeze(1) * head_dim + torch.arange(head_dim)).reshape(-1)


def _has_bias(module: nn.Linear) -> bool:
    """Whether `module` adds a non-zero bias."""
    return module.bias is not None and bool(module.bias.any())


def _live_parts(block: nn.Module, unit: BlockUnits) -> tuple[bool, bool]:
    """Whether a gated block's attention and MLP can add anything: a live unit, or a non-zero output bias."""
    return (bool(unit.heads.any()) or _has_bias(_linear(block, "self_attn.o_proj")),
            bool(unit.neurons.any()) or _has_bias(_linear(block, "mlp.down_proj")))


def _padded(live: torch.Tensor, count: int) -> torch.Tensor:
    """`_first(live, count)`, followed by −1 (a new zero unit) for each unit beyond those `live` has."""
    kept = _first(live, min(count, live.numel()))
    return torch.cat([kept, kept.new_full((count - kept.numel(),), -1)])


def _take(tensor: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """`tensor.index_select(dim, index)` with zeros where the index is −1."""
    out = tensor.index_select(dim, index.clamp(min=0))
    shape = [1] * tensor.dim()
    shape[dim] = -1
    return out * (index >= 0).reshape(shape).to(out.dtype)


def _decilm_block(unit: BlockUnits, heads: int, per_kv: int, head_dim: int, block: nn.Module, ffn_mult: bool,
                  ) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """One layer in DeciLM's schema: its block config and the weights of its parts that are not no-ops.

    The MLP keeps its live neurons, its width written as `intermediate_size` (or, with `ffn_mult`, padded
    to a multiple of 256 and written as `ffn_mult`, and never a no-op beside a live attention, whose output
    llama.cpp's graph would drop); attention the fewest KV groups g that hold its live groups, with g dividing
    the query heads and each group's heads (heads / g) at least its live query heads.
    """
    parts: dict[str, dict[str, torch.Tensor]] = {}
    live_groups = unit.heads.any(1)
    groups_needed, per_needed = int(live_groups.sum()), int(unit.heads.sum(1).max())
    attention_live, ffn_live = _live_parts(block, unit)
    ffn_live = ffn_live or (ffn_mult and attention_live)  # llama.cpp drops the attention of a layer without MLP
    attention: dict[str, Any] = {"no_op": not attention_live, "replace_with_linear": False, "n_heads_in_group": None}
    if attention_live:
        kv = min(g for g in range(max(groups_needed, 1), heads + 1) if heads % g == 0 and heads // g >= per_needed)
        per = heads // kv
        groups = _first(live_groups, kv)
        chosen = torch.cat([torch.where(within >= 0, g * per_kv + within, within)
                            for g, within in ((g, _padded(unit.heads[g], per)) for g in groups.tolist())])
        q_rows = torch.where(chosen.unsqueeze(1) >= 0, chosen.unsqueeze(1) * head_dim + torch.arange(head_dim),
                             -1).reshape(-1)
        kv_rows = _head_rows(groups, head_dim)
        for name, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            parts[f"self_attn.{name}"] = {kind: _take(tensor, rows, 0)
                                          for kind, tensor in _select(_linear(block, f"self_attn.{name}")).items()}
        o = _select(_linear(block, "self_attn.o_proj"))
        parts["self_attn.o_proj"] = {**o, "weight": _take(o["weight"], q_rows, 1)}
        attention["n_heads_in_group"] = per
    live = int(unit.neurons.sum())
    hidden = _linear(block, "mlp.down_proj").out_features
    key = "ffn_mult" if ffn_mult else "intermediate_size"  # readers take ffn_mult whenever the key is there
    ffn: dict[str, Any] = {"no_op": not ffn_live, "replace_with_linear": False, key: None}
    if ffn_live:
        multiple = compact_modeling.FFN_MULTIPLE if ffn_mult else 1
        width = max(1, -(-live // multiple)) * multiple
        neurons = _padded(unit.neurons, width)
        for name, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            tensors = _select(_linear(block, f"mlp.{name}"))
            parts[f"mlp.{name}"] = {kind: tensor if kind == "bias" and dim else _take(tensor, neurons, dim)
                                    for kind, tensor in tensors.items()}
        ffn[key] = compact_modeling.ffn_mult(width, hidden) if ffn_mult else width
    return {"attention": attention, "ffn": ffn}, parts


def _decilm_model(model: nn.Module, units: list[BlockUnits], ffn_mult: bool) -> nn.Module:
    """The compact model in DeciLM's schema (`compact_modeling.DeciLMForCausalLM`)."""
    config = _config(model)
    if not family_of(config).decilm:
        raise SurgeonError(f"compact export format decilm writes {', '.join(supporting('decilm'))} models; the "
                           f"model is {config.model_type!r}")
    kv_heads, per_kv, head_dim = _head_layout(config)
    heads = kv_heads * per_kv
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    blocks = []
    for block, unit in zip(decoder_blocks(model), units):
        prefix = _prefix(model, block)
        for name in [name for name in state if name.startswith(prefix)]:
            del state[name]
        block_config, parts = _decilm_block(unit, heads, per_kv, head_dim, block, ffn_mult)
        blocks.append(block_config)
        for norm, part in (("input_layernorm", "attention"), ("post_attention_layernorm", "ffn")):
            if not block_config[part]["no_op"]:
                norm_module: Any = block.get_submodule(norm)
                parts[norm] = {"weight": norm_module.weight.detach()}
        _put(state, prefix, parts)
    settings = dict(num_attention_heads=heads, head_dim=head_dim, block_configs=blocks,
                    num_key_value_heads=max([heads // b["attention"]["n_heads_in_group"] for b in blocks
                                             if not b["attention"]["no_op"]], default=1),
                    intermediate_size=max([compact_modeling.mlp_width(b["ffn"], config.hidden_size)
                                           for b in blocks if not b["ffn"]["no_op"]], default=1))
    compact = _shipped_model(config, settings, next(model.parameters()).dtype)
    return _loaded(compact, state)


def _prefix(model: nn.Module, block: nn.Module) -> str:
    """The state-dict prefix of a decoder block of `model` ("model.layers.3.")."""
    prefix: str = next(name for name, module in model.named_modules() if module is block) + "."
    return prefix


def _put(state: dict[str, torch.Tensor], prefix: str, parts: dict[str, dict[str, torch.Tensor]]) -> None:
    """Write a block's parts ({"mlp.up_proj": {"weight": …, "bias": …}}) into `state` under `prefix`."""
    for name, tensors in parts.items():
        for kind, tensor in tensors.items():
            state[f"{prefix}{name}.{kind}"] = tensor


def _shipped_model(config: Any, settings: dict[str, Any], dtype: torch.dtype) -> Any:
    """A `compact_modeling.DeciLMForCausalLM` from `config`'s settings updated with `settings`; its config's
    `auto_map` names the copy of `compact_modeling` that the checkpoint ships (`trust_remote_code=True`)."""
    base = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures", "auto_map")}
    compact_config = compact_modeling.DeciLMConfig(**{**base, **settings})
    compact_config.architectures = ["DeciLMForCausalLM"]
    compact_config.auto_map = {"AutoConfig": "compact_modeling.DeciLMConfig",
                               "AutoModelForCausalLM": "compact_modeling.DeciLMForCausalLM"}
    model: Any = compact_modeling.DeciLMForCausalLM(compact_config)
    return model.to(dtype)


def _loaded(compact: Any, state: dict[str, torch.Tensor]) -> nn.Module:
    """`compact` with the weights of `state`, which must name every one of its weights and nothing else."""
    missing, unexpected = compact.load_state_dict(state, strict=False)
    if unexpected or [name for name in missing if not name.endswith("lm_head.weight")]:
        raise SurgeonError(f"compact export: the new model's weights do not match ({(missing + unexpected)[:3]})")
    compact.tie_weights()
    loaded: nn.Module = compact.eval()
    return loaded


def compact_model(model: nn.Module, format: str = "standard", ffn_mult: bool = False) -> nn.Module:
    """A new model without the units that `live_units` finds removable, in the `standard` format (the original
    architecture) or the per-layer `decilm` one (`ffn_mult`: MLP widths rounded up to multiples of 256).

    Its logits equal the pruned model's up to float rounding; the pruned model is left as it is.
    """
    if format not in EXPORT_FORMATS:
        raise SurgeonError(f"compact export format {format!r}: use {' or '.join(EXPORT_FORMATS)}")
    if ffn_mult and format != "decilm":
        raise SurgeonError("compact export: ffn_mult is a setting of the decilm format")
    units = live_units(model)
    expert_width = family_of(_config(model)).expert_width  # the config key of a Mixture-of-Experts model's experts
    if expert_width is not None and format != "standard":
        raise SurgeonError(f"compact export: Mixture-of-Experts models export in the standard format, not {format!r}")
    if format == "decilm":
        return _decilm_model(model, units, ffn_mult)
    inner, kv, per = standard_widths(model, units)
    config = copy.deepcopy(_config(model))
    opt = config.model_type == "opt"
    if opt:
        config.ffn_dim = inner
    else:
        kv_heads, per_kv, head_dim = _head_layout(config)
        config.num_key_value_heads, config.num_attention_heads, config.head_dim = kv, kv * per, head_dim
        if expert_width is None:
            config.intermediate_size = inner
        else:  # every block routes; qwen2_moe's shared experts are its dense MLPs
            if hasattr(config, "shared_expert_intermediate_size"):
                config.shared_expert_intermediate_size = inner
            live = max(int(u.experts.sum(1).max()) for u in units if u.experts is not None)
            full = next(u.experts.shape[1] for u in units if u.experts is not None)
            setattr(config, expert_width, min(full, -(-live // EXPERT_ALIGN) * EXPERT_ALIGN))
    from transformers import AutoModelForCausalLM

    compact = AutoModelForCausalLM.from_config(config, dtype=next(model.parameters()).dtype)
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    for block, unit in zip(decoder_blocks(model), units):
        neurons = _first(unit.neurons, inner)
        prefix = _prefix(model, block)
        if opt:
            parts = {"fc1": _select(_linear(block, "fc1"), rows=neurons),
                     "fc2": _select(_linear(block, "fc2"), cols=neurons)}
        else:
            selection: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] = {}
            mlp = _mlp(block)
            if mlp is not None:
                selection.update({f"{mlp}gate_proj": (neurons, None), f"{mlp}up_proj": (neurons, None),
                                  f"{mlp}down_proj": (None, neurons)})
            if unit.experts is not None and expert_width is not None:  # each expert's live neurons first
                width = getattr(config, expert_width)
                kept = torch.stack([_first(expert, width) for expert in unit.experts])
                _put(state, prefix, {"mlp.experts": kept_neurons(block.get_submodule("mlp.experts"), kept)})
            groups = _first(unit.heads.any(1), kv)
            heads = torch.cat([g * per_kv + _first(unit.heads[g], per) for g in groups.tolist()])
            q_rows, kv_rows = _head_rows(heads, head_dim), _head_rows(groups, head_dim)
            selection.update({"self_attn.q_proj": (q_rows, None), "self_attn.k_proj": (kv_rows, None),
                              "self_attn.v_proj": (kv_rows, None), "self_attn.o_proj": (None, q_rows)})
            parts = {name: _select(_linear(block, name), rows, cols) for name, (rows, cols) in selection.items()}
        _put(state, prefix, parts)
    return _loaded(compact, state)


def load_compact(path: str | Path, **kwargs: Any) -> nn.Module:
    """Load a compact checkpoint, DeciLM ones without remote code (`compact_modeling`); `kwargs` go to
    `from_pretrained` (dtype, device_map, …)."""
    model: nn.Module = causal_lm_class(str(path)).from_pretrained(path, **kwargs)
    return model


def same_logits(model: nn.Module, compact: nn.Module, tokens: int = 32) -> None:
    """Refuse a compact model whose logits on `tokens` random tokens differ from the pruned model's by more than
    max(1e-5, 8·eps of the dtype) of their largest magnitude (a wrong unit anywhere differs by O(1))."""
    vocab = _config(model).vocab_size
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        expected, got = model(ids).logits.float(), compact.to(device)(ids).logits.float()
    dtype = next(model.parameters()).dtype
    tolerance = max(1e-5, 8 * torch.finfo(dtype).eps) * float(expected.abs().max())
    difference = float((got - expected).abs().max())
    if not difference <= tolerance:
        raise SurgeonError(f"compact export: logits differ from the pruned model's by {difference:.3g} "
                           f"(allowed {tolerance:.3g}); nothing was written")
