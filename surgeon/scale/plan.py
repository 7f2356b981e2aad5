"""Memory and time of a pruning run, counted from the model's configuration alone (`surgeon plan`).

The model is built on the meta device (shapes, no weights), so the count needs only its config.
Per phase of a shot (docs/DESIGN.md, "Memory design" and "Planning"):

Every phase holds the weights and what each layer has removed, whole on every rank: an unstructured or N:M
run's mask (one byte per prunable weight), a structured run's rows and columns; beside them:

- curvature: the packed float32 Kronecker factors of every layer (one A per input
  that several layers read, one G per layer), or of one block group's layers; the tensors autograd
  saves in one forward pass of `batch_size × seqlen` tokens, read off a meta-device forward under
  `saved_tensors_hooks` (with fused attention, which keeps no L×L scores), or with activation
  checkpointing each block's input and one block's own tensors; the logits with their float32
  probabilities and gradient; the queue of activations waiting for a grouped accumulation (CUDA);
- prune: the packed inverses (or inverse roots) of the factors, the same size, or
  with offload one layer's factors and inverse; one layer's dense temporaries; with N:M's
  propagated last shot, one block's inputs for every window;
- for SparseGPT, SparseGPT-exact and Wanda (block by block): one block's inputs for every window,
  and one block's H;
- held-out: the same for the sparsegpt-refine shot that an unstructured or N:M LLM Surgeon run in one
  process is weighed against, with two copies of the prunable weights and masks in host memory.

Strategies: one process, or `gpus` torchrun ranks split by batches with the weights on every rank,
or by blocks with the weights sharded by FSDP2 (one rank's share is counted, docs/DESIGN.md
"Several processes"); each with the least of activation checkpointing, offload and block groups
that it needs to fit. Time (`time_model`) is projected from the rates measured on an H100
(bench/results/gpu) by counted products, and set against the floor that the counted FLOPs and bytes of
each phase allow at the H100's peak rates.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError, first_line
from surgeon.methods import Shot
from surgeon.models import hub
from surgeon.models.adapter import DTYPES, decoder_blocks, prunable_layers, resolve_source
from surgeon.models.experts import experts_as_layers, is_fused_experts, routed_share
from surgeon.scale.block_groups import group_edges, groups_limit
from surgeon.scale.plan_config import PlanConfig, parse_bytes
from surgeon.scale.settings import check_skeleton
from surgeon.scale.time_model import (
    H100_SOURCES,
    floor_seconds,
    held_out_seconds,
    pass_count,
    projected_seconds,
    rank_seconds,
    work,
)
from surgeon.scale.trace import trace_forward
from surgeon_kernels import ops

logger = logging.getLogger(__name__)

GIB = 2**30
# A run fits when its count plus this headroom does: the counts run a few percent under the peaks allocated on an
# H100, and the allocator reserves more (surgeon_kernels/measured.json, "plan_headroom")
HEADROOM: float = ops.MEASURED["plan_headroom"]["fraction"]
QUEUE_BYTES_CUDA = 1 << 29  # curvature.DEFAULT_GROUP_BYTES on CUDA
TILE = 128  # surgeon_kernels.symmetric.TILE


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
            # attention as load_model gets it
            model: nn.Module = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError) as error:
        raise SurgeonError(f"cannot build {name!r} from its configuration: {first_line(error)}") from error
    prunable_layers(model)  # names the architecture when nothing in it can be pruned
    return model.eval()


def count(model: nn.Module, config: PruneConfig, nsamples: int, seqlen: int, device: str) -> dict[str, Any]:
    """What a shot holds, counted part by part, and its phases (`phases`) in one process (docs/DESIGN.md,
    "Planning"). Fused Mixture-of-Experts experts are counted as a run splits them, one layer per projection
    of each expert, each reached by an equal share of the tokens (`experts.ExpertLayers` on the meta device)."""
    with experts_as_layers(decoder_blocks(model)):
        return _count(model, config, nsamples, seqlen, device)


def _count(model: nn.Module, config: PruneConfig, nsamples: int, seqlen: int, device: str) -> dict[str, Any]:
    """`count` once any fused experts are layers."""
    blocks = prunable_layers(model, config.leave_out_parts)
    layers = [pair for block in blocks for pair in block]
    settings: Any = model.config
    itemsize = next(model.parameters()).element_size()
    tokens = config.batch_size * seqlen
    largest = max(m.weight.numel() for _, m in layers)
    widest = max(max(m.weight.shape) + 1 for _, m in layers)
    parts = {
        "layer": 3 * largest * 4 + 2 * widest * widest * 4,  # W, update, mask in float32; one dense inverse
        "block_inputs": 2 * nsamples * seqlen * settings.hidden_size * itemsize,  # for block-by-block pruning
        "logits": tokens * settings.vocab_size * (2 * itemsize + 4),  # logits, float32 probabilities, their gradient
        "queue": QUEUE_BYTES_CUDA if device == "cuda" else 0,
        "hessians": sum(packed_bytes(m.in_features) * 2 for _, m in blocks[0]),
        # what each layer has removed, whole on every rank (`Layer`): an element run's mask, a bool per weight; a
        # structured run's removed rows and columns
        "masks": sum(m.weight.numel() if config.elements else m.out_features + m.in_features for _, m in layers),
    }
    block_factors: list[int] = []  # the packed factors of each decoder block's layers
    layer_factors, accumulation, inputs, widths, inverse_flops = 0, 0.0, 0.0, 0.0, 0.0
    share = {name: routed_share(settings) if ".experts." in name else 1.0 for name, _ in layers}  # tokens reaching
    if config.spec.needs_a:
        trace = trace_forward(model, layers, config.batch_size, seqlen)
        need_g = config.spec.needs_g  # else the pass runs forward only, under no_grad: it saves nothing
        parts["activations"] = trace.saved_bytes * need_g
        parts["checkpointed_activations"] = trace.checkpointed_bytes * need_g
        for block in blocks:
            sizes = []
            for name, m in block:
                width = m.in_features + (m.bias is not None)
                owner = trace.owners[name] == name
                A = packed_bytes(width) if owner else 0
                sizes.append(A + packed_bytes(m.out_features) * need_g)
                layer_factors = max(layer_factors, packed_bytes(width) + packed_bytes(m.out_features) * need_g)
                inputs += share[name] * (width ** 2 // 2 if owner else 0)
                accumulation += share[name] * ((width ** 2 // 2 if owner else 0) + m.out_features ** 2 // 2 * need_g)
                widths += share[name] * ((width if owner else 0) + m.out_features * need_g)
                inverse_flops += 2 / 3 * ((width ** 3 if owner else 0) + m.out_features ** 3 * need_g)
            block_factors.append(sum(sizes))
    decoder = decoder_blocks(model)
    in_blocks = sum(p.numel() for block in decoder for p in block.parameters()) * itemsize
    prunable = sum(m.weight.numel() for _, m in layers)
    active = sum(m.weight.numel() * share[name] for name, m in layers)  # the weights a token runs through
    head: nn.Linear = model.get_output_embeddings()  # type: ignore[operator]  # a transformers model
    counts = {"parts": parts, "block_factor_bytes": block_factors, "layer_factor_bytes": layer_factors,
              "weights_bytes": sum(p.numel() for p in model.parameters()) * itemsize,
              "parameters": sum(p.numel() for p in model.parameters()),
              "prunable_parameters": prunable, "active_parameters": round(active),
              "prunable_bytes": prunable * itemsize, "layers": len(layers),
              "blocks": len(decoder), "root_bytes": sum(p.numel() for p in model.parameters()) * itemsize - in_blocks,
              "block_bytes": max(sum(p.numel() for p in block.parameters()) * itemsize for block in decoder),
              # products per token: the forward and input-gradient passes, and the factors' upper triangles
              "pass_products": 2 * active, "accumulation_products": accumulation,
              "input_accumulation_products": inputs,  # of the input factors alone
              "input_columns": sum(m.in_features for _, m in layers),  # what SparseGPT's sweeps run through
              # the same passes through the output embedding and attention's scores (`_attention_products`)
              "head_products": 2 * head.weight.numel(),
              "attention_products": _attention_products(settings, len(decoder), seqlen),
              "accumulation_widths": widths,  # elements per token the factors are accumulated from
              "inverse_flops": inverse_flops,  # a Cholesky factor and its triangular inverse per factor
              "itemsize": itemsize}
    counts["phases"] = held(counts, config)
    return counts


def held(counts: dict[str, Any], config: PruneConfig, ranks: int = 1, fsdp: bool = False) -> dict[str, dict[str, int]]:
    """The bytes each phase holds on the device of one of `ranks` processes, under `config`'s memory options.

    curvature: the weights, the factors of the blocks one pass accumulates (this rank's, split by
    blocks; the largest of `block_groups` groups of them), the activations (checkpointed or not),
    logits and queue. prune: the weights and the inverses of this rank's blocks (with `offload`: the
    factors and roots of a layer and the one before it, the rest in host memory), one layer's dense work.
    held-out: in one process, a run that `chooses` first prunes the dense model in one shot of its method's
    alternative (`Method.alternative`), block by block, which holds what SparseGPT's runs hold.
    A rank owns ⌈blocks / ranks⌉ blocks (rank 0 the most). With `fsdp` it holds 1/ranks of the
    weights, the unsharded root (embeddings, head) and two blocks being gathered, and its own
    layers whole while it prunes them (docs/DESIGN.md, "Several processes").
    Every phase holds what every layer has removed (`masks`) whole, on every rank.
    """
    parts, factors, blocks = counts["parts"], counts["block_factor_bytes"], counts["blocks"]
    owned = range(0, blocks, ranks)
    weights = counts["weights_bytes"]
    if fsdp:
        weights = math.ceil(weights / ranks) + counts["root_bytes"] + 2 * counts["block_bytes"]
    block_by_block = {"weights": weights, "masks": parts["masks"], "block_inputs": parts["block_inputs"],
                      "hessians": parts["hessians"], "layer": parts["layer"]}  # one block's inputs for every window, H
    if not factors:
        phases = {"prune": block_by_block}
    else:
        hooked = [factors[b] for b in (owned if ranks > 1 and config.curvature_split == "blocks" else range(blocks))]
        edges = group_edges(len(hooked), config.block_groups)
        phases = {
            "curvature": {"weights": weights, "masks": parts["masks"],
                          "factors": max(sum(hooked[a:b]) for a, b in zip(edges, edges[1:])),
                          "activations": parts["checkpointed_activations" if config.activation_checkpointing
                                               else "activations"],
                          "logits": parts["logits"], "queue": parts["queue"]},
            # offloaded: the factors and packed roots of a layer and of the one before it
            "prune": {"weights": weights, "masks": parts["masks"],
                      "inverses": 4 * counts["layer_factor_bytes"] if config.offload
                      else sum(factors[b] for b in owned),
                      "layer": parts["layer"]},
        }
        if config.propagates:  # N:M's last shot runs block by block on every window's block inputs
            phases["prune"]["block_inputs"] = parts["block_inputs"]
    if fsdp:
        phases["prune"]["own_layers"] = math.ceil(counts["prunable_bytes"] * len(owned) / blocks)
    if config.chooses and ranks == 1:
        phases["held-out"] = dict(block_by_block)
    return phases


def _attention_products(settings: Any, blocks: int, seqlen: int) -> float:
    """Products per token of causal attention's two matmuls in the forward pass and its four in the input-gradient
    pass (none recomputed), each over half the keys a query sees: every block's query heads × head width × keys."""
    heads = settings.num_attention_heads
    head_dim = getattr(settings, "head_dim", None) or settings.hidden_size // heads
    keys = min(seqlen, getattr(settings, "sliding_window", None) or seqlen)
    products: float = blocks * 6 * heads * head_dim * keys / 2
    return products


def _peak(phases: dict[str, dict[str, int]]) -> tuple[dict[str, dict[str, int]], str, int]:
    """Each phase's parts with their "total", the phase with the largest total, and that total."""
    totals = {name: {**parts, "total": sum(parts.values())} for name, parts in phases.items()}
    phase = max(totals, key=lambda name: totals[name]["total"])
    return totals, phase, totals[phase]["total"]


def _needed(peak: int) -> float:
    """Bytes of GPU memory a counted peak is planned with: the count plus `HEADROOM`."""
    return peak * (1 + HEADROOM)


def _variants(config: PruneConfig, counts: dict[str, Any], ranks: int, split: str) -> list[PruneConfig]:
    """Every combination of memory options a plan tries, least costly first (`pass_count`; offload, whose transfers
    are not counted, after the same passes without it): activation checkpointing where the pass runs backward
    (surgeon, kobd, one Kronecker term), offload and 1 up to `groups_limit` block groups where the run is
    structured or coupled."""
    base = dataclasses.replace(config, curvature_split=split, activation_checkpointing=False, offload=False,
                               block_groups=1)
    if not counts["block_factor_bytes"]:
        return [base]
    checkpointing = (False, True) if config.spec.needs_g else (False,)
    offload = config.shot is Shot.STRUCTURED
    limit = groups_limit(counts["blocks"], ranks, split) if offload else 1
    variants = [dataclasses.replace(base, activation_checkpointing=ac, offload=off, block_groups=groups)
                for ac in checkpointing for off in ((False, True) if offload else (False,))
                for groups in range(1, limit + 1 if off else 2)]
    return sorted(variants, key=lambda v: (pass_count(v), v.offload))


def _options(config: PruneConfig) -> list[str]:
    """The `surgeon prune` options of a variant's memory options, without their dashes."""
    return (["activation-checkpointing"] * config.activation_checkpointing + ["offload"] * config.offload
            + [f"block-groups {config.block_groups}"] * (config.block_groups > 1))


def make_plan(plan: PlanConfig, config: PruneConfig) -> dict[str, Any]:
    """The plan of `surgeon plan`: memory per phase, the strategies and whether one fits, projected time.

    A strategy is a way to launch (one process; torchrun ranks split by batches, with the weights
    whole or sharded by FSDP2; ranks with FSDP2 split by blocks) with the least costly memory options
    that fit it (`_variants`), or with all of them when none fits. The chosen strategy is the fastest
    that fits on the GPUs asked for, or else on one.
    """
    if config.shot is Shot.EXPERTS:
        raise SurgeonError("surgeon plan does not count whole-expert runs (structure experts) yet")
    model = meta_model(plan.model, plan.dtype)
    check_skeleton(model, config, 1)
    whole = any(is_fused_experts(module) for module in model.modules())  # experts are pruned unsharded
    notes = ["no FSDP2: Mixture-of-Experts experts are pruned with their weights whole on every rank"] * whole
    counts = count(model, config, plan.nsamples, plan.seqlen, "cuda")
    held_out = held_out_seconds(counts, config, plan.nsamples, plan.seqlen)
    # the dense layers and the alternative's pruned ones, weights and masks, both in host memory for a moment
    held_out_host = 2 * (counts["prunable_bytes"] + counts["prunable_parameters"]) if held_out else 0
    if held_out:
        notes.append(f"in one process the run also prunes the dense model in one {config.spec.alternative} shot and "
                     "keeps the model with the lower held-out loss (held_out_choice): about "
                     f"{sum(held_out.values()):.0f} s more on one H100 ("
                     + ", ".join(f"{part} {value:.0f} s" for part, value in held_out.items())
                     + f"), and {held_out_host / GIB:.1f} GiB of host memory for the weights and masks it sets aside")
    budget = parse_bytes(plan.gpu_memory)
    phases, peak_phase, peak = _peak(counts["phases"])
    seconds = projected_seconds(counts, config, plan.nsamples, plan.seqlen)
    parts = work(counts, config, plan.nsamples, plan.seqlen)
    floor = floor_seconds(parts)
    if floor:
        notes.append("floor per shot on one H100 by counted FLOPs and bytes at its peak rates: "
                     + ", ".join(f"{phase} {value:.1f} s" for phase, value in floor.items()))
    factors = bool(counts["block_factor_bytes"])
    launches = [(1, False, "batches", "packed-factors-on-device" if factors else "on-device", "surgeon prune")]
    if plan.gpus > 1:
        torchrun = f"torchrun --nproc-per-node {plan.gpus} -m surgeon prune"
        if factors:
            launches.append((plan.gpus, False, "batches", f"{plan.gpus}-ranks-split-by-batches", torchrun))
        if not whole:
            launches.append((plan.gpus, True, "batches", f"{plan.gpus}-ranks-fsdp-split-by-batches",
                             torchrun + " --fsdp"))
        if factors:  # experts are not sharded: their ranks split the blocks with the weights whole
            launches.append((plan.gpus, not whole, "blocks", f"{plan.gpus}-ranks{'' if whole else '-fsdp'}-split-"
                             "by-blocks", torchrun + ("" if whole else " --fsdp") + " --curvature-split blocks"))
    strategies: list[dict[str, Any]] = []
    for ranks, fsdp, split, name, launch in launches:
        variants = _variants(config, counts, ranks, split)
        for variant in variants:
            need = _peak(held(counts, variant, ranks, fsdp))[2]
            # offload serves structured runs, the held-out choice unstructured and N:M ones in one process
            host = sum(counts["block_factor_bytes"][b] for b in range(0, counts["blocks"], ranks)) \
                if variant.offload else held_out_host * (ranks == 1)
            options = _options(variant)
            strategy = {"name": "+".join([name] + [option.replace(" ", "-") for option in options]), "gpus": ranks,
                        "launch": " --".join([launch] + options), "peak_gpu_bytes": need, "host_bytes": host,
                        "fits": _needed(need) <= budget, "passes": pass_count(variant),
                        "seconds_per_shot": rank_seconds(seconds, counts, variant, ranks)}
            if strategy["fits"] or variant is variants[-1]:
                strategies.append(strategy)
                break
    fitting = [s for s in strategies if s["fits"]]
    chosen = min(fitting, key=lambda s: (s["gpus"] != plan.gpus, sum(s["seconds_per_shot"].values()),
                                         s["passes"], strategies.index(s)), default=None)
    return {
        "model": plan.model, "dtype": plan.dtype, "nsamples": plan.nsamples, "seqlen": plan.seqlen,
        "gpus": plan.gpus, "gpu_memory_bytes": budget, "config": {"structure": config.structure,
                                                                   "method": config.method, "shots": config.shot_count,
                                                                   "batch_size": config.batch_size},
        "parameters": counts["parameters"], "prunable_parameters": counts["prunable_parameters"],
        "phases": phases, "peak_phase": peak_phase, "peak_gpu_bytes": peak, "fits": chosen is not None,
        "strategy": chosen["name"] if chosen else None, "strategies": strategies,
        "headroom": HEADROOM, "shortfall_bytes": max(round(_needed(min(
            s["peak_gpu_bytes"] for s in strategies))) - budget, 0),
        "seconds_per_shot_h100": seconds, "work_per_shot": parts, "floor_seconds_per_shot_h100": floor,
        "held_out_seconds_h100": held_out, "held_out_host_bytes": held_out_host,
        "notes": notes,
        "time_source": H100_SOURCES,
    }


def fit_to_gpu(model_name: str, dtype: str, nsamples: int, seqlen: int, config: PruneConfig, budget: int,
               ranks: int = 1, fsdp: bool = False) -> PruneConfig:
    """The settings a run on GPUs of `budget` bytes runs with, decided before any weight is loaded, as `surgeon
    plan` decides: `config` when its counted peak (plus `HEADROOM`) fits; else `config` with the least costly
    memory options added that fit (`_variants`, which change no result), with a warning; else refused, naming the
    phase, its parts and the shortfall with every option.

    ranks, fsdp: a torchrun run's ranks and whether its weights are sharded; the peak is one rank's.
    `config` is one `settings.check_skeleton` accepted for the model and ranks. A model whose configuration
    transformers cannot build alone (a DeciLM compact checkpoint, say), and a whole-expert run, whose own pass
    the plan does not count, are not checked: `config` is
    returned with a warning.
    """
    if config.shot is Shot.EXPERTS:
        logger.warning("memory not checked before loading: the plan does not count whole-expert runs")
        return config
    try:
        model = meta_model(model_name, dtype)
    except SurgeonError as error:
        logger.warning("memory not checked before loading: %s", error)
        return config
    counts = count(model, config, nsamples, seqlen, "cuda")
    chosen = [config] + [variant for variant in _variants(config, counts, ranks, config.curvature_split)
                         if variant.activation_checkpointing >= config.activation_checkpointing
                         and variant.offload >= config.offload and variant.block_groups >= config.block_groups]
    for candidate in chosen:
        if _needed(_peak(held(counts, candidate, ranks, fsdp))[2]) <= budget:
            if candidate is not config:
                logger.warning("the run needs more than the GPU's %.1f GiB as configured: it runs with --%s (the "
                               "same result, more time; see `surgeon plan`)", budget / GIB,
                               " --".join(_options(candidate)))
            return candidate
    phases, phase, peak = _peak(held(counts, chosen[-1], ranks, fsdp))
    need = _needed(peak)
    parts = ", ".join(f"{part} {value / GIB:.1f}" for part, value in phases[phase].items() if part != "total")
    options = " --".join(_options(chosen[-1]))
    raise SurgeonError(f"does not fit the GPU: the {phase} phase needs {need / GIB:.1f} GiB ({parts} GiB, plus "
                       f"{HEADROOM:.0%} headroom{f', with --{options}' if options else ''}), the GPU has "
                       f"{budget / GIB:.1f} GiB, short by {(need - budget) / GIB:.1f} GiB; lower --batch-size or "
                       "--seqlen, or share the run over more GPUs (see `surgeon plan`)")
