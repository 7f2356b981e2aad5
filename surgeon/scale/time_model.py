"""Time of a pruning run on one H100, from what `plan.count` counts (`surgeon plan`; docs/DESIGN.md, "Planning").

Two views of the same shot: projected seconds, the rates measured on an H100 with a Llama-2-7B of random weights
scaled by counted products (`projected_seconds`, `held_out_seconds`), and the floor, the counted FLOPs and bytes at
the H100's peak rates (`work`, `floor_seconds`).
"""

from __future__ import annotations

import math
from typing import Any

from surgeon.config import PruneConfig
from surgeon_kernels import ops

# Measured on one H100 with a Llama-2-7B of random weights (surgeon_kernels/measured.json, "h100_shot" and
# "h100_parts"): one LLM Surgeon shot's curvature pass and prune phase per kind of run, and the rates of its parts
_SHOT, _PARTS = ops.MEASURED["h100_shot"], ops.MEASURED["h100_parts"]
H100_PARAMETERS: int = _SHOT["parameters"]  # prunable parameters of that model
H100_TOKENS: int = _SHOT["tokens"]
H100_CURVATURE_S: float = _SHOT["curvature_s"]
H100_PRUNE_S: dict[str, float] = _SHOT["prune_s"]
H100_SOURCES: list[str] = _SHOT["sources"]
H100_PASS_FLOPS_PER_S: float = _PARTS["pass_flops_per_s"]
H100_ACCUMULATION_FLOPS_PER_S: float = _PARTS["accumulation_flops_per_s"]
H100_SWEEP_S_PER_COLUMN: dict[str, float] = _PARTS["sweep_s_per_column"]
CURVATURE_PARTS_SOURCE: str = _PARTS["curvature_parts_source"]
SWEEP_SOURCE: str = _PARTS["sweep_source"]
# Peak rates of one H100 SXM, dense: products on the tensor cores from 2-byte (bfloat16, float16) inputs, IEEE
# float32 products (no TF32, PyTorch's default for matmul) by element size, and HBM3 bandwidth.
H100_FLOPS = {2: 989e12, 4: 67e12}
H100_BYTES_PER_S = 3.35e12


def projected_seconds(counts: dict[str, Any], config: PruneConfig, nsamples: int, seqlen: int) -> dict[str, float]:
    """Seconds per shot on one H100 from the measured Llama-2-7B rates: curvature scaled by the weights a token
    runs through (all of a dense model's, a share of the experts') × tokens, the prune phase by parameters.
    The measured N:M shots took eq. 7's masks: N:M masks by the sweep (`PruneConfig.mask_rule`) add one sweep per
    layer at the drop-in's time per input column.

    Only for LLM Surgeon's correlated method, the runs those rates were measured on; empty otherwise.
    """
    if not config.spec.correlated:
        return {}
    kind = config.structure if config.nm is None else "N:M propagated" if config.propagates else "N:M"
    if kind not in H100_PRUNE_S:
        return {}
    active, size = counts["active_parameters"] / H100_PARAMETERS, counts["prunable_parameters"] / H100_PARAMETERS
    sweeps = counts["input_columns"] * H100_SWEEP_S_PER_COLUMN["N:M"] if config.mask_rule == "sweep" else 0.0
    return {"curvature": H100_CURVATURE_S * active * nsamples * seqlen / H100_TOKENS,
            "prune": H100_PRUNE_S[kind] * size + sweeps}


def held_out_windows(nsamples: int) -> int:
    """The held-out windows a run that `chooses` scores both models on, as `app.data.held_out_count` counts them."""
    return max(2, nsamples // 16)


def held_out_seconds(counts: dict[str, Any], config: PruneConfig, nsamples: int, seqlen: int) -> dict[str, float]:
    """Seconds on one H100 of the alternative's shot (`Method.alternative`) that a run which `chooses` adds, by
    part, from the measured rates (`H100_PASS_FLOPS_PER_S`, `H100_ACCUMULATION_FLOPS_PER_S`, `H100_SWEEP_S_PER_COLUMN`).

    passes: forward passes only (half the pass's products of the blocks' weights, a third of attention's), twice over
    the calibration windows, block by block, and once per model over the held-out windows, with the output
    embedding; factors: the input factors alone; sweeps: every layer's input columns. The copies of the weights to
    and from host memory are not counted. Empty for a run that weighs nothing.
    """
    if not config.chooses:
        return {}
    blocks = counts["pass_products"] / 2 + counts["attention_products"] / 3
    held_out = 2 * held_out_windows(nsamples) * (blocks + counts["head_products"] / 2)
    kind = "unstructured" if config.nm is None else "N:M"
    return {"passes": 2 * seqlen * (2 * nsamples * blocks + held_out) / H100_PASS_FLOPS_PER_S,
            "factors": 2 * nsamples * seqlen * counts["input_accumulation_products"] / H100_ACCUMULATION_FLOPS_PER_S,
            "sweeps": counts["input_columns"] * H100_SWEEP_S_PER_COLUMN[kind]}


def work(counts: dict[str, Any], config: PruneConfig, nsamples: int,
         seqlen: int) -> dict[str, dict[str, dict[str, float]]]:
    """FLOPs and bytes of one LLM Surgeon shot by phase and part, each with the H100 peak rate its FLOPs run at.

    curvature: the forward and input-gradient passes (the blocks' weights and the output embedding read twice per
    batch), and the factor accumulation (each token's inputs and output gradients read once, every factor read
    and written once); prune: each factor's Cholesky factor and triangular inverse in float32, which every kind
    of run needs. What the prune phase does beyond them (costs, selection, updates) is not counted: a floor.
    """
    if not config.spec.correlated:
        return {}
    tokens, batches = nsamples * seqlen, math.ceil(nsamples / config.batch_size)
    itemsize, factor_bytes = counts["itemsize"], sum(counts["block_factor_bytes"])
    products = counts["pass_products"] + counts["head_products"] + counts["attention_products"]
    read = counts["weights_bytes"] - counts["root_bytes"] + counts["head_products"] // 2 * itemsize
    return {
        "curvature": {
            "pass": {"flops": 2 * tokens * products, "bytes": 2 * read * batches, "flops_per_s": H100_FLOPS[itemsize]},
            "accumulation": {"flops": 2 * tokens * counts["accumulation_products"],
                             "bytes": tokens * counts["accumulation_widths"] * itemsize + 2 * factor_bytes,
                             "flops_per_s": H100_FLOPS[itemsize]},
        },
        "prune": {"inverses": {"flops": counts["inverse_flops"], "bytes": 2 * factor_bytes,
                               "flops_per_s": H100_FLOPS[4]}},
    }


def part_seconds(part: dict[str, float]) -> float:
    """Seconds one of `work`'s parts takes at least on one H100: its FLOPs at its peak rate or its bytes at the
    memory bandwidth, whichever is longer."""
    return max(part["flops"] / part["flops_per_s"], part["bytes"] / H100_BYTES_PER_S)


def floor_seconds(parts: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Seconds per phase that `work`'s parts take at least on one H100 (`part_seconds`, summed)."""
    return {phase: sum(part_seconds(part) for part in phase_parts.values()) for phase, phase_parts in parts.items()}


def rank_seconds(seconds: dict[str, float], counts: dict[str, Any], config: PruneConfig,
                 ranks: int) -> dict[str, float]:
    """Projected seconds per shot on `ranks` H100s, from those of one (`projected_seconds`).

    The curvature pass's products (`pass_products`) run once per block group, and half as many again
    with activation checkpointing (one more forward beside the forward and input-gradient passes);
    its factor accumulation runs once. Split by batches the whole pass divides by the ranks, split
    by blocks only the accumulation does. The prune phase divides by the ranks. Moving factors to and
    from host memory (`offload`) is not counted.
    """
    if not seconds:
        return {}
    accumulation = counts["accumulation_products"] / (counts["accumulation_products"] + counts["pass_products"])
    passes = (1 - accumulation) * pass_count(config)
    curvature = (passes + accumulation) / ranks if config.curvature_split == "batches" else \
        passes + accumulation / ranks
    return {"curvature": seconds["curvature"] * curvature, "prune": seconds["prune"] / ranks}


def pass_count(config: PruneConfig) -> float:
    """The curvature pass's work per shot under `config`'s memory options, in passes without them: one per block
    group, half as much again with activation checkpointing."""
    return config.block_groups * (1.5 if config.activation_checkpointing else 1.0)
