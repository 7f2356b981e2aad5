"""Memory and time of a pruning run, counted from the model's configuration alone (`surgeon plan`).

The model is built on the meta device (shapes, no weights), so the count needs only its config.
Per phase of a shot (docs/DESIGN.md, "Memory design" and "Planning"):

- curvature: the weights; the packed float32 Kronecker factors of every layer (one A per input
  that several layers read, one G per layer); the tensors autograd saves in one forward pass of
  `batch_size × seqlen` tokens, read off a meta-device forward under `saved_tensors_hooks` (with
  fused attention, which keeps no L×L scores); the logits with their float32 probabilities and
  gradient; the queue of activations waiting for a grouped accumulation (CUDA);
- prune: the weights; the packed inverses (or inverse roots) of the factors, the same size; one
  layer's dense temporaries; with N:M's propagated last shot, one block's inputs for every window;
- for SparseGPT, SparseGPT-exact and Wanda (block by block): the weights, one block's inputs for
  every window, and one block's H.

Strategies: the packed factors on one device; over `gpus` torchrun ranks, split by batches with
the weights on every rank, or by blocks with the weights sharded by FSDP2 (one rank's share is
counted, docs/DESIGN.md "Several processes"); and, counted for comparison but not run by `surgeon
prune`, factors held in host memory. Time is projected from the rates measured on an H100
(bench/results/gpu) by counted products.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from surgeon import hub
from surgeon.config import PlanConfig, PruneConfig, parse_bytes
from surgeon.errors import SurgeonError, first_line
from surgeon.model import DTYPES, decoder_blocks, prunable_layers, resolve_source

logger = logging.getLogger(__name__)

GIB = 2**30
# The counts ran 9-11% under the peaks measured on an H100 (Llama-2-7B 60.3 vs 66.9 GiB, OPT-6.7B 65.4 vs
# 72.2, OPT-1.3B 16.1 vs 18.0: bench/RESULTS.md); a run fits when its count plus this headroom does.
HEADROOM = 0.12
QUEUE_BYTES_CUDA = 1 << 29  # curvature.DEFAULT_GROUP_BYTES on CUDA
TILE = 128  # surgeon_kernels.symmetric.TILE
# Measured on one H100 with a Llama-2-7B of random weights, 128 × 2048 tokens, bfloat16, batch 2
# (bench/results/gpu/shot-llama2-7b-32blocks-*): the curvature pass, which does not depend on the
# structure, and the prune phase of one LLM Surgeon shot per kind of run.
H100_PARAMETERS = 6_476_005_376  # prunable parameters of that model
H100_TOKENS = 128 * 2048
H100_CURVATURE_S = 38.6
H100_PRUNE_S = {"structured": 13.1, "unstructured": 50.9, "N:M": 34.6, "N:M propagated": 66.8}
H100_SOURCES = ["bench/results/gpu/shot-llama2-7b-32blocks-1shots-batch2@7b5fd7c.json",
                "bench/results/gpu/shot-llama2-7b-32blocks-1shots-batch2-unstructured@513bded.json",
                "bench/results/gpu/shot-llama2-7b-32blocks-4shots-batch2-2of4@513bded.json"]


def packed_bytes(n: int) -> int:
    """Bytes of an n×n float32 factor held as its upper-triangle tiles (`PackedSymmetric`)."""
    blocks = -(-n // TILE)
    return blocks * (blocks + 1) // 2 * TILE * TILE * 4


def meta_model(name: str, dtype: str) -> nn.Module:
    """The model named `name` (hub id, folder, config.json, .gguf file, built-in name) on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        if name.endswith(".json"):
            settings = json.loads(Path(name).read_text())
            config = AutoConfig.for_model(**settings)
        else:
            source = resolve_source(name)
            with hub.cache_only_when_unreachable(source.on_hub):
                config = AutoConfig.from_pretrained(source.path, gguf_file=source.gguf_file)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype], attn_implementation="sdpa")
    except (OSError, ValueError, KeyError) as error:
        raise SurgeonError(f"cannot build {name!r} from its configuration: {first_line(error)}") from error
    prunable_layers(model)  # names the architecture when nothing in it can be pruned
    return model.eval()


@dataclass
class _Trace:
    """What one meta-device forward shows: which layers read one input, and what autograd saves."""

    owners: dict[str, str]  # layer -> the first layer reading the same input tensor (shares its A)
    saved_bytes: int


def _trace(model: nn.Module, layers: list[tuple[str, nn.Linear]], batch: int, seqlen: int) -> _Trace:
    """Run one forward of `batch × seqlen` tokens on the meta device, as the curvature pass runs it.

    Attention is counted as the fused kernels (flash, memory-efficient, cuDNN) keep it for the
    backward pass: query, key, value, output and one float32 statistic per query row, no scores.
    """
    import torch.nn.functional as F

    params = {id(p) for p in model.parameters()}
    inputs: dict[str, torch.Tensor] = {}
    saved: dict[int, torch.Tensor] = {}  # by id, the tensors themselves held so that no id is reused
    statistics = 0

    def keep(t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if id(base) not in params and id(t) not in params:
            saved[id(base)] = base
        return t

    def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any,
                        **kwargs: Any) -> torch.Tensor:
        out = (query[..., :1] * 0).expand(*query.shape[:-1], value.shape[-1]).clone()  # keeps nothing itself
        nonlocal statistics
        for t in (query, key, value, out):
            keep(t)
        statistics += query.shape[:-1].numel() * 4  # the row statistics (log-sum-exp), float32
        return out

    handles = [module.register_forward_pre_hook(lambda m, args, name=name: inputs.__setitem__(name, args[0]))
               for name, module in layers]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    sdpa = F.scaled_dot_product_attention
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        F.scaled_dot_product_attention = fused_attention
        ids = torch.zeros(batch, seqlen, dtype=torch.long, device="meta")
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            lm: Any = model  # a transformers causal LM
            embeds = lm.get_input_embeddings()(ids).detach().requires_grad_(True)
            lm(inputs_embeds=embeds)
    finally:
        F.scaled_dot_product_attention = sdpa
        for handle in handles:
            handle.remove()
        for p, flag in flags:
            p.requires_grad_(flag)
    owners: dict[str, str] = {}
    first: dict[int, str] = {}
    for name, _ in layers:
        owners[name] = first.setdefault(id(inputs[name]), name)
    return _Trace(owners, sum(t.numel() * t.element_size() for t in saved.values()) + statistics)


def count(model: nn.Module, config: PruneConfig, nsamples: int, seqlen: int, device: str) -> dict[str, Any]:
    """Bytes per phase of one shot (the phases of docs/DESIGN.md, "Planning") and the counts behind them."""
    from surgeon.shots import NEEDS_A, NEEDS_G

    layers = [pair for block in prunable_layers(model) for pair in block]
    settings: Any = model.config
    itemsize = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * itemsize
    vocab = settings.vocab_size
    tokens = config.batch_size * seqlen
    largest = max(m.weight.numel() for _, m in layers)
    widest = max(max(m.weight.shape) + 1 for _, m in layers)
    layer_temporaries = 3 * largest * 4 + 2 * widest * widest * 4  # W, update, mask in float32; one dense inverse
    block_inputs = 2 * nsamples * seqlen * settings.hidden_size * itemsize  # for block-by-block pruning
    phases: dict[str, dict[str, int]] = {}
    accumulation = 0
    if config.method in NEEDS_A:
        trace = _trace(model, layers, config.batch_size, seqlen)
        widths = {name: m.in_features + (m.bias is not None) for name, m in layers}
        terms = config.kronecker_terms
        A = sum(packed_bytes(widths[name]) for name, _ in layers if trace.owners[name] == name) * terms
        G = sum(packed_bytes(m.out_features) for _, m in layers) * terms if config.method in NEEDS_G else 0
        accumulation = sum(widths[name] ** 2 // 2 for name, _ in layers if trace.owners[name] == name) + \
            sum(m.out_features ** 2 // 2 for _, m in layers) * (config.method in NEEDS_G)
        phases["curvature"] = {
            "weights": weights, "factors": A + G, "activations": trace.saved_bytes,
            "logits": tokens * vocab * (2 * itemsize + 4),  # logits, float32 probabilities, their gradient
            "queue": QUEUE_BYTES_CUDA if device == "cuda" and config.group_bytes is None else (config.group_bytes or 0),
        }
        phases["prune"] = {"weights": weights, "inverses": A + G, "layer": layer_temporaries}
        if config.propagate:  # N:M's last shot runs block by block on every window's block inputs
            phases["prune"]["block_inputs"] = block_inputs
    else:
        block = [m for _, m in prunable_layers(model)[0]]
        phases["prune"] = {
            "weights": weights, "block_inputs": block_inputs,
            "hessians": sum(packed_bytes(m.in_features) * 2 for m in block), "layer": layer_temporaries,
        }
    blocks = decoder_blocks(model)
    block_bytes = max(sum(p.numel() for p in block.parameters()) * itemsize for block in blocks)
    in_blocks = sum(p.numel() for block in blocks for p in block.parameters()) * itemsize
    prunable = sum(m.weight.numel() for _, m in layers)
    return {"phases": phases, "weights_bytes": weights, "parameters": sum(p.numel() for p in model.parameters()),
            "prunable_parameters": prunable, "prunable_bytes": prunable * itemsize, "layers": len(layers),
            "blocks": len(blocks), "block_bytes": block_bytes, "root_bytes": weights - in_blocks,
            # products per token: the forward and input-gradient passes, and the factors' upper triangles
            "pass_products": 2 * prunable, "accumulation_products": accumulation}


def _projected_seconds(counts: dict[str, Any], config: PruneConfig, nsamples: int, seqlen: int) -> dict[str, float]:
    """Seconds per shot on one H100 from the measured Llama-2-7B rates: curvature scaled by parameters × tokens,
    the prune phase by parameters.

    Only for LLM Surgeon with one Kronecker term, the runs those rates were measured on; empty otherwise.
    """
    if config.method != "surgeon" or config.kronecker_terms != 1:
        return {}
    kind = config.structure if config.nm is None else "N:M propagated" if config.propagate else "N:M"
    if kind not in H100_PRUNE_S:
        return {}
    size = counts["prunable_parameters"] / H100_PARAMETERS
    return {"curvature": H100_CURVATURE_S * size * nsamples * seqlen / H100_TOKENS, "prune": H100_PRUNE_S[kind] * size}


def _peak(phases: dict[str, dict[str, int]]) -> tuple[dict[str, dict[str, int]], str, int]:
    """Each phase's parts with their "total", the phase with the largest total, and that total."""
    totals = {name: {**parts, "total": sum(parts.values())} for name, parts in phases.items()}
    phase = max(totals, key=lambda name: totals[name]["total"])
    return totals, phase, totals[phase]["total"]


def _needed(peak: int) -> float:
    """Bytes of GPU memory a counted peak is planned with: the count plus `HEADROOM`."""
    return peak * (1 + HEADROOM)


def _per_rank(counts: dict[str, Any], ranks: int, fsdp: bool, split: str) -> dict[str, dict[str, int]]:
    """The phases of `count` as each of `ranks` torchrun ranks holds them (docs/DESIGN.md, "Several processes").

    A rank owns ⌈blocks / ranks⌉ blocks: their inverses, and with `split` "blocks" their factors only
    (by "batches" every rank accumulates every factor before they are summed onto the owners). With
    `fsdp` a rank holds 1/ranks of the weights, the unsharded root (embeddings, head) and two blocks
    being gathered, and its own layers whole while it prunes them.
    """
    share = -(-counts["blocks"] // ranks) / counts["blocks"]
    weights = counts["weights_bytes"]
    if fsdp:
        weights = math.ceil(weights / ranks) + counts["root_bytes"] + 2 * counts["block_bytes"]
    phases = {name: dict(parts, weights=weights) for name, parts in counts["phases"].items()}
    if "curvature" in phases:
        if split == "blocks":
            phases["curvature"]["factors"] = math.ceil(phases["curvature"]["factors"] * share)
        phases["prune"]["inverses"] = math.ceil(phases["prune"]["inverses"] * share)
    if fsdp:
        phases["prune"]["own_layers"] = math.ceil(counts["prunable_bytes"] * share)
    return phases


def _rank_seconds(seconds: dict[str, float], counts: dict[str, Any], ranks: int, split: str) -> dict[str, float]:
    """Projected seconds per shot on `ranks` H100s: the prune phase and, split by batches, the whole curvature pass
    divide by the ranks; split by blocks, only its factor accumulation does (the share of the pass's products
    it counts)."""
    if not seconds:
        return {}
    accumulation = counts["accumulation_products"] / (counts["accumulation_products"] + counts["pass_products"])
    kept = 1 / ranks if split == "batches" else 1 - accumulation + accumulation / ranks
    return {"curvature": seconds["curvature"] * kept, "prune": seconds["prune"] / ranks}


def make_plan(plan: PlanConfig, config: PruneConfig) -> dict[str, Any]:
    """The plan of `surgeon plan`: memory per phase, the strategies and whether one fits, projected time."""
    model = meta_model(plan.model, plan.dtype)
    counts = count(model, config, plan.nsamples, plan.seqlen, "cuda")
    budget = parse_bytes(plan.gpu_memory)
    phases, peak_phase, peak = _peak(counts["phases"])
    seconds = _projected_seconds(counts, config, plan.nsamples, plan.seqlen)
    factors = phases.get("curvature", {}).get("factors", 0)  # none for the block-by-block methods
    strategies: list[dict[str, Any]] = [{"name": "on-device" if not factors else "packed-factors-on-device",
                                         "runs": True, "gpus": 1, "launch": "surgeon prune", "peak_gpu_bytes": peak,
                                         "host_bytes": 0, "seconds_per_shot": seconds}]
    if factors:
        one_block = factors // counts["blocks"]  # on the device while its factors accumulate
        strategies.append({"name": "factors-offloaded-to-host", "runs": False, "gpus": 1, "launch": None,
                           "peak_gpu_bytes": peak - factors + one_block, "host_bytes": factors,
                           "seconds_per_shot": {}})
    if plan.gpus > 1:
        torchrun = f"torchrun --nproc-per-node {plan.gpus} -m surgeon prune"
        splits = (("batches", False, ""), ("blocks", True, " --fsdp --curvature-split blocks")) if factors else \
            (("batches", True, " --fsdp"),)
        for split, fsdp, flags in splits:
            rank_phases = _per_rank(counts, plan.gpus, fsdp, split)
            name = f"{plan.gpus}-ranks{'-fsdp' if fsdp else ''}-split-by-{split}"
            strategies.append({"name": name, "runs": True, "gpus": plan.gpus, "launch": torchrun + flags,
                               "peak_gpu_bytes": _peak(rank_phases)[2], "host_bytes": 0,
                               "seconds_per_shot": _rank_seconds(seconds, counts, plan.gpus, split)})
    for strategy in strategies:
        strategy["fits"] = _needed(strategy["peak_gpu_bytes"]) <= budget
    # the first that runs and fits, on the GPUs asked for before fewer
    chosen = next((s for s in sorted(strategies, key=lambda s: s["gpus"] != plan.gpus) if s["runs"] and s["fits"]),
                  None)
    return {
        "model": plan.model, "dtype": plan.dtype, "nsamples": plan.nsamples, "seqlen": plan.seqlen,
        "gpus": plan.gpus, "gpu_memory_bytes": budget, "config": {"structure": config.structure,
                                                                   "method": config.method, "shots": config.shots,
                                                                   "batch_size": config.batch_size},
        "parameters": counts["parameters"], "prunable_parameters": counts["prunable_parameters"],
        "phases": phases, "peak_phase": peak_phase, "peak_gpu_bytes": peak, "fits": chosen is not None,
        "strategy": chosen["name"] if chosen else None, "strategies": strategies,
        "headroom": HEADROOM, "shortfall_bytes": max(round(_needed(min(
            s["peak_gpu_bytes"] for s in strategies if s["runs"]))) - budget, 0),
        "seconds_per_shot_h100": seconds,
        "time_source": H100_SOURCES,
    }


def check_fits(model_name: str, dtype: str, nsamples: int, seqlen: int, config: PruneConfig, budget: int,
               ranks: int = 1, fsdp: bool = False) -> None:
    """Refuse, before any weight is loaded, a run whose counted peak (plus `HEADROOM`) exceeds `budget` bytes.

    ranks, fsdp: a torchrun run's ranks and whether its weights are sharded; the peak is one rank's.

    A model whose configuration transformers cannot build alone (a heterogeneous compact checkpoint,
    say) is not counted: the check is skipped with a warning.
    """
    try:
        model = meta_model(model_name, dtype)
    except SurgeonError as error:
        logger.warning("memory not checked before loading: %s", error)
        return
    counts = count(model, config, nsamples, seqlen, "cuda")
    phases, phase, peak = _peak(_per_rank(counts, ranks, fsdp, config.curvature_split) if ranks > 1
                                else counts["phases"])
    need = _needed(peak)
    if need > budget:
        parts = ", ".join(f"{part} {value / GIB:.1f}" for part, value in phases[phase].items() if part != "total")
        raise SurgeonError(f"does not fit the GPU: the {phase} phase needs {need / GIB:.1f} GiB ({parts} GiB, plus "
                           f"{HEADROOM:.0%} headroom), the GPU has {budget / GIB:.1f} GiB, short by "
                           f"{(need - budget) / GIB:.1f} GiB; lower --batch-size or --seqlen (see `surgeon plan`)")
