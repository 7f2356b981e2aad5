"""The multi-shot LLM Surgeon loop (paper Algorithm 1) and the baselines in the same loop.

Each shot t: estimate curvature on the current (pruned) model, compute costs, choose what to
remove with one global threshold for the shot's target size α_t, apply the (correlated) update,
keep every pruned weight exactly zero, and optionally run interleaved LoRA corrections.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm

from surgeon import baselines, channels, costs, curvature, inverses, solver, threshold, units, updates
from surgeon.block_inputs import BlockInputs
from surgeon.config import NEEDS_A, NEEDS_G, PruneConfig
from surgeon.damping import damp
from surgeon.distributed import Elsewhere, Ranks, sharded
from surgeon.errors import SurgeonError
from surgeon.experts import experts_as_layers, is_fused_experts
from surgeon.layer import Layer, put_submatrix, submatrix
from surgeon.model import block_weights, check_prunable, decoder_blocks, max_seqlen, prunable_layers
from surgeon.report import PruneReport, ShotReport, peak_memory_gb, removed_fractions, zero_fraction
from surgeon.resume import Checkpoint
from surgeon_kernels import ops
from surgeon_kernels.ops import Deferred

logger = logging.getLogger(__name__)

PER_LAYER = ("sparsegpt", "sparsegpt-exact", "wanda")  # estimate each block's inputs themselves, block by block


def _column_set_costs(cols: torch.Tensor, real_c: torch.Tensor, size: int,
                      joint: Callable[[int], torch.Tensor] | None) -> torch.Tensor:
    """Cost of removing each set of `size` consecutive columns whole, given the columns' costs `cols` (−inf:
    removed) and the kept ones `real_c`: the joint cost of a set's kept columns (`joint(m)`, eq. 7 for sets of
    m consecutive kept columns), or without `joint` the sum of their costs (OBD). Sets already removed cost
    −inf. Every live set keeps equally many columns: query heads leave a KV group in rounds."""
    by_set = cols.reshape(-1, size)
    removed = torch.isneginf(by_set)
    per_set = by_set.masked_fill(removed, 0).sum(1).masked_fill(removed.all(1), float("-inf"))
    if joint is not None and real_c.numel():
        live, kept = torch.unique_consecutive(real_c // size, return_counts=True)
        assert bool((kept == kept[0]).all()), "live column sets keep unequal numbers of columns"
        per_set[live] = joint(int(kept[0]))
    return per_set


def _structured_shot(layers: list[Layer], raw: dict | curvature.HostFactors, target_zeros: int, config: PruneConfig,
                     coupled: list[channels.Coupling], ranks: Ranks, kinds: list[units.UnitKind] | None = None,
                     ) -> tuple[dict[str, float], int]:
    """Rows and columns, or coupled units: costs (eq. 7), global threshold, joint or within update (sec. 3.4).

    With `kinds` (structure coupled) the structures are neurons, heads and KV groups (`surgeon.units`),
    removed whole: a unit costs the joint cost of its consumer columns (`costs.set_costs`; the OBD baselines:
    the sum of their element costs), whose removal leaves its producer rows dead: they are freed without an update.
    The rows and columns that the chosen ones leave dead (`coupled` channels, freed KV heads) are removed
    too and count toward the target; they take no part in the updates (their inputs or outputs are gone).

    Between costs and updates each layer keeps only its packed inverse roots (weights are read again),
    so a shot never holds more than the factors' packed size plus one layer's dense work; with
    `config.offload` the factors (`raw`, a `curvature.HostFactors`) and the kept roots wait in host
    memory, and the device holds those of a layer and the one before it (whose A it may share). Split over
    `ranks`, each computes its own layers' costs and updates; the costs are summed so that all make
    the same choice, and the updated layers are broadcast.
    Returns the seconds spent on costs, threshold and updates, and the number of dead weights freed.
    """
    plans: list[tuple[torch.Tensor, torch.Tensor, inverses.KroneckerInverse | None]] = []
    row_costs: list[torch.Tensor] = []
    col_costs: list[torch.Tensor] = []
    device = layers[0].mask.device
    strengths = config.strengths
    sets: dict[int, set[int]] = {}  # consumer layer -> its units' column-set sizes (o: heads, KV groups)
    for kind in kinds or []:
        if kind.consumer.size > 1:
            sets.setdefault(kind.consumer.layer, set()).add(kind.consumer.size)
    set_cost: dict[tuple[int, int], torch.Tensor] = {}
    sibling: inverses.Sibling | None = None
    offloaded: tuple[inverses.KroneckerInverse, inverses.KroneckerInverse] | None = None  # the last, on device and host
    times = [_clock(device)]
    ranks.gather_layers(layers)
    for index, layer in enumerate(layers):
        R, C, sizes = layer.module.out_features, layer.module.in_features, sorted(sets.get(index, ()))
        keep_r, keep_c, real_c = layer.kept()
        if not ranks.mine(layer.name):  # another rank's: zeros here, its costs once summed
            plans.append((keep_r, keep_c, None))
            row_costs.append(torch.zeros(R, device=device))
            col_costs.append(torch.zeros(C, device=device))
            for size in sizes:
                set_cost[index, size] = torch.zeros(C // size, device=device)
            continue
        W = layer.weight()
        rows = torch.full((R,), float("-inf"), device=W.device)
        cols = torch.full((C,), float("-inf"), device=W.device)
        entry = raw.pop(layer.name, None)  # frees each raw factor after its last layer
        kept = None
        if config.method == "surgeon":
            assert entry is not None and entry.G is not None  # surgeon's pass gives every layer both factors
            raw_G = entry.G
            f, kept = inverses.layer_inverse(entry, keep_r, keep_c, strengths, roots=True, sibling=sibling)
            sibling = (entry, keep_c, kept, f.A)
            rc, cc = costs.layer_structure_costs(W, entry, f, keep_r, keep_c, real_c.numel(), strengths)
        else:
            g, a = costs.diagonal_curvature(entry, W.shape, W.device, strengths)
            e = costs.diagonal_costs(submatrix(W, keep_r, keep_c), g[keep_r], a[keep_c])
            rc, cc = e.sum(1), e.sum(0)[: real_c.numel()]
        if entry is not None:
            dead_r, dead_c = costs.dead(entry, keep_r, real_c, R)
            rc, cc = rc.masked_fill(dead_r, 0), cc.masked_fill(dead_c, 0)
        rows[keep_r] = rc
        cols[real_c] = cc
        if sizes:  # a consumer of several columns per unit (o: head_dim per head, more per KV group)
            joint = None
            if config.method == "surgeon":
                G = damp(submatrix(raw_G.dense(), keep_r, keep_r), strengths[0])
                root = inverses.as_dense(f.A)[: real_c.numel()]
                sub = submatrix(W, keep_r, real_c).T
                joint = functools.partial(costs.set_costs, sub, root, G)
            for size in sizes:
                set_cost[index, size] = _column_set_costs(cols, real_c, size, joint)
        if config.offload and kept is not None:  # siblings' shared A⁻¹ goes to host memory once
            A = offloaded[1].A if offloaded is not None and offloaded[0].A is kept.A else None
            offloaded = (kept, kept.to("cpu", A=A))
            kept = offloaded[1]
        plans.append((keep_r, keep_c, kept))
        row_costs.append(rows)
        col_costs.append(cols)
    del sibling, offloaded
    if ranks.world > 1:  # −inf (removed) plus the other ranks' zeros stays −inf
        every = row_costs + col_costs + list(set_cost.values())
        parts = ranks.sum(torch.cat(every)).split([t.numel() for t in every])
        row_costs, col_costs = list(parts[:len(layers)]), list(parts[len(layers):2 * len(layers)])
        set_cost = dict(zip(set_cost, parts[2 * len(layers):]))
    times.append(_clock(device))
    with_dead = functools.partial(channels.with_dead, coupled)
    if kinds is None:
        row_sel, col_sel = threshold.structured_selection(row_costs, col_costs, target_zeros, with_dead)
        removed_rows, removed_cols = with_dead(row_sel, col_sel)
    else:
        before = ([layer.rows for layer in layers], [layer.cols for layer in layers])
        unit_costs = [set_cost[kind.consumer.layer, kind.consumer.size] if kind.consumer.size > 1
                      else col_costs[kind.consumer.layer] for kind in kinds]
        if config.speed_context is not None:  # every unit of a kind saves the same: the order within it stays
            shapes = [(layer.module.out_features, layer.module.in_features) for layer in layers]
            unit_costs = [cost / units.decode_macs(kind, shapes, config.speed_context)
                          for cost, kind in zip(unit_costs, kinds)]

        group_costs, chosen_units = units.allocation(kinds, unit_costs, config.uniform, config.width_multiple)

        def zeros(groups: list[torch.Tensor]) -> int:
            masks = units.masks_of(kinds, chosen_units(groups), *before, free_kv=True)
            return threshold.removed_weights(*with_dead(*masks))

        prefix = threshold.cheapest_prefix(group_costs, zeros, target_zeros, "neurons, heads and KV groups")
        chosen = chosen_units(prefix)
        row_sel, col_sel = units.masks_of(kinds, chosen, *before, free_kv=False, consumers_only=True)
        removed_rows, removed_cols = with_dead(*units.masks_of(kinds, chosen, *before, free_kv=True))
    freed = threshold.removed_weights(removed_rows, removed_cols) - threshold.removed_weights(row_sel, col_sel)
    times.append(_clock(device))
    dense = inverses.unpacked((kept for _, _, kept in plans), device if config.offload else None)
    for layer, (keep_r, keep_c, _), inverse, new_rows, new_cols, rows_out, cols_out in zip(
            layers, plans, dense, row_sel, col_sel, removed_rows, removed_cols):
        layer.rows, layer.cols = rows_out, cols_out
        layer.mask = rows_out.unsqueeze(1) | cols_out.unsqueeze(0)
        if not ranks.mine(layer.name):
            continue
        W = layer.weight()
        if inverse is not None:
            p = new_rows[keep_r].nonzero().squeeze(1)
            q = torch.isin(keep_c, new_cols.nonzero().squeeze(1)).nonzero().squeeze(1)
            sub = submatrix(W, keep_r, keep_c)
            put_submatrix(W, keep_r, keep_c, updates.finite_update(
                layer.name, inverse, lambda g: updates.structured(sub, g, p, q, config.correlation), max(strengths)))
        layer.store(W)
    ranks.broadcast_layers(layers, masks=False)
    times.append(_clock(device))
    return _phases(times), freed


def _element_shot(layers: list[Layer], raw: dict, target_zeros: int, config: PruneConfig,
                  ranks: Ranks) -> dict[str, float]:
    """Elements (unstructured or N:M): costs, global threshold, correlated update (eqs. 4-5).

    Costs are not held: each layer keeps what they are computed from (its packed inverse, whose
    diagonals are all eq. 7 reads, or the diagonal curvature), and the threshold recomputes them when
    it reads them (`Deferred`). They read the layer's weights and mask as they are, so each layer's
    mask is made before its update. Split over `ranks`, each holds only its own layers' costs
    (`Elsewhere` for the others'), the threshold is selected over all of them together, and the
    updated layers are broadcast with their masks. Returns the seconds spent on costs, threshold and
    updates.
    """
    plans: list[inverses.KroneckerInverse | None] = []
    element_costs: list[Deferred] = []
    device = layers[0].mask.device
    sibling: inverses.Sibling | None = None
    times = [_clock(device)]
    ranks.gather_layers(layers)
    for layer in layers:
        R, C = layer.module.out_features, layer.module.in_features
        if not ranks.mine(layer.name):
            plans.append(None)
            element_costs.append(Elsewhere(R * C, device))
            continue
        kept, layer_costs, sibling = _element_plan(layer, raw.pop(layer.name, None), config, sibling)
        plans.append(kept)  # the raw factor is freed after its last layer
        element_costs.append(Deferred(R * C, layer.mask.device, layer_costs))
    del sibling
    times.append(_clock(device))
    nm = config.nm
    masks = (threshold.nm_selection(element_costs, *nm, target_zeros, config.backend, ranks.reduce()) if nm
             else threshold.smallest_k(element_costs, target_zeros, config.backend, ranks.reduce()))
    times.append(_clock(device))
    for layer, inverse, mask in zip(layers, inverses.unpacked(plans), masks):
        if ranks.mine(layer.name):
            _element_update(layer, mask(), inverse, config)
    ranks.broadcast_layers(layers, masks=True)
    times.append(_clock(device))
    return _phases(times)


def _element_plan(layer: Layer, entry: curvature.LayerFactors | None, config: PruneConfig,
                  sibling: inverses.Sibling | None
                  ) -> tuple[inverses.KroneckerInverse | None, Callable[[], torch.Tensor], inverses.Sibling | None]:
    """What one layer's element update keeps (its packed inverse, or nothing for the OBD baselines), its element
    costs (eq. 7, computed when called) and the sibling the next layer may share A⁻¹ with."""
    R, C = layer.module.out_features, layer.module.in_features
    strengths = config.strengths
    kept: inverses.KroneckerInverse | None = None
    if config.method == "surgeon" and entry is not None:
        f, kept = inverses.layer_inverse(entry, slice(None), slice(None), strengths, roots=False, sibling=sibling)
        sibling = (entry, slice(None), kept, f.A)
        weigh = functools.partial(costs.element_costs, f=kept)
    else:
        g, a = costs.diagonal_curvature(entry, (R, C + layer.bias), layer.mask.device, strengths)
        weigh = functools.partial(costs.diagonal_costs, g=g, a=a)
    dead = costs.dead(entry, slice(None), slice(0, C), R) if entry is not None else None
    return kept, functools.partial(costs.layer_element_costs, layer, weigh, dead), sibling


def _element_update(layer: Layer, mask: torch.Tensor, inverse: inverses.KroneckerInverse | None,
                    config: PruneConfig) -> None:
    """Add `mask` to the layer's pruned weights and apply the correlated update (eqs. 4-5) with `inverse` (dense)."""
    layer.mask = mask | layer.mask  # computed from the layer's costs before its mask and weights change
    W = layer.weight()
    if inverse is not None:
        pruned, original = layer.with_bias_col(layer.mask, False), W
        W = updates.finite_update(layer.name, inverse, lambda g: updates.unstructured(
            original, g, pruned, config.max_correlate or None, config.cg_tol,
            config.cg_max_iter, config.backend, None if config.cg_dtype is None else getattr(torch, config.cg_dtype)),
            max(config.strengths))
    layer.store(W)


def _propagated_shot(model: nn.Module, layers: list[Layer], raw: dict, calibration: torch.Tensor,
                     config: PruneConfig, ranks: Ranks, progress: bool) -> None:
    """The N:M shot that prunes every group left, block by block (`PruneConfig.propagate`).

    Every group goes, so each layer's mask is its own N of every M (no global threshold, sec. 3.3);
    each block's A is estimated again from the inputs the blocks before it give, already pruned and
    updated in this shot (as SparseGPT prunes), G is the shot's (docs/DESIGN.md). Over `ranks`, the
    block's owner, which holds its G, prunes it (`_pruned_block_by_block`).
    """
    assert config.nm is not None  # PruneConfig allows propagate only with an N:M structure
    n, m = config.nm
    for block in _pruned_block_by_block(model, layers, calibration, config, ranks, progress):
        sibling: inverses.Sibling | None = None
        for layer, fresh in block:
            entry = dataclasses.replace(raw.pop(layer.name), A=fresh.A)  # propagate: methods with a curvature pass
            kept, layer_costs, sibling = _element_plan(layer, entry, config, sibling)
            mask = ops.nm_select(layer_costs(), n, m, config.backend)[1]
            inverse = next(inverses.unpacked([kept]))
            _element_update(layer, mask, inverse, config)


def _pruned_block_by_block(model: nn.Module, layers: list[Layer], calibration: torch.Tensor, config: PruneConfig,
                           ranks: Ranks, progress: bool) -> Iterator[list[tuple[Layer, curvature.LayerFactors]]]:
    """Per decoder block, this rank's layers of it with their input factors, for the caller to prune in place.

    Each block's inputs come from the blocks before it, already pruned: the block runs once to
    estimate its layers' input factors and once, pruned, to give the next block's inputs
    (`BlockInputs`). Split over `ranks` by batches, each runs its share of the batches and a block's
    factors are summed onto its owner; by blocks, each runs every batch and the owner keeps its
    block's factors. The block's layers are gathered whole before it is yielded and broadcast from
    their owners after.
    """
    by_name = {layer.name: layer for layer in layers}
    share = calibration
    if config.curvature_split == "batches":
        batches = calibration.split(config.batch_size)
        share = torch.cat([batches[i] for i in ranks.batches(len(batches))])
    inputs = BlockInputs(model, decoder_blocks(model), share, config.batch_size)
    for named in tqdm(prunable_layers(model, config.leave_out_parts), desc="blocks", leave=False,
                      disable=not progress):
        factors = curvature.estimate_inputs(named, inputs.forwards(), calibration.numel(), config.backend)
        if config.curvature_split == "batches":
            ranks.reduce_factors(factors)
        block = [by_name[name] for name, _ in named]
        ranks.gather_layers(block)
        yield [(layer, factors[layer.name]) for layer in block if ranks.mine(layer.name)]
        ranks.broadcast_layers(block, masks=True)
        inputs.advance()


def group_edges(blocks: int, count: int) -> list[int]:
    """Where `count` groups of consecutive blocks, as even as they divide, start and end among `blocks`."""
    return [round(i * blocks / count) for i in range(count + 1)]


def groups_limit(blocks: int, ranks: int, split: str) -> int:
    """The most block groups a run can have: the decoder blocks each process accumulates factors of (split by
    blocks over several ranks, the fewest any rank owns)."""
    return blocks // ranks if split == "blocks" and ranks > 1 else blocks


def check_block_groups(blocks: int, ranks: int, config: PruneConfig) -> None:
    """Refuse more block groups than `groups_limit` allows, the same way on every rank."""
    limit = groups_limit(blocks, ranks, config.curvature_split)
    if config.block_groups > limit:
        raise SurgeonError(f"block_groups={config.block_groups}: more groups than the {limit} decoder blocks "
                           f"{'each rank' if limit < blocks else 'the model'} accumulates factors of")


def _block_groups(blocks: list[list[tuple[str, nn.Linear]]], count: int) -> list[list[tuple[str, nn.Linear]]]:
    """The layers of `blocks` in `count` groups (`group_edges`), for one curvature pass each
    (`PruneConfig.block_groups`)."""
    edges = group_edges(len(blocks), count)
    return [[pair for block in blocks[start:end] for pair in block] for start, end in zip(edges, edges[1:])]


def _phases(times: list[float]) -> dict[str, float]:
    """Seconds of costs, threshold and updates from the four clock readings around them."""
    return {name: end - start for name, start, end in zip(("costs", "threshold", "update"), times, times[1:])}


def _per_layer_shot(model: nn.Module, layers: list[Layer], calibration: torch.Tensor, target_size: float,
                    config: PruneConfig, ranks: Ranks, progress: bool) -> None:
    """SparseGPT or Wanda: each layer pruned to the same sparsity with its own algorithm, block by block on the
    inputs of the blocks already pruned, as published (`_pruned_block_by_block`)."""
    for block in _pruned_block_by_block(model, layers, calibration, config, ranks, progress):
        for layer, factors in block:
            _prune_one_layer(layer, factors.A.dense(), target_size, config)


def _prune_one_layer(layer: Layer, A: torch.Tensor, target_size: float, config: PruneConfig) -> None:
    """SparseGPT (as published, or its mask with the exact update) or Wanda on one layer, given its input factor A."""
    W, C = layer.weight(), layer.module.in_features
    A = A[:C, :C]
    if config.method == "wanda":
        layer.mask = layer.mask | baselines.per_row_mask(
            baselines.wanda_scores(W[:, :C], A.diagonal()), 1 - target_size, layer.mask, config.nm)
    else:
        pruned, mask = baselines.sparsegpt(W[:, :C], A, 1 - target_size, layer.mask, config.nm)
        layer.mask = mask | layer.mask
        if config.method == "sparsegpt-exact":  # the row-wise exact minimiser for the same mask (docs/DESIGN.md)
            pruned = solver.solve(W[:, :C], A, mask=layer.mask).weight
        W[:, :C] = pruned
    layer.store(W)


def _clock(device: torch.device) -> float:
    """`time.perf_counter()` after the device's queued work has finished (GPU work is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _check_inputs(model: nn.Module, calibration_ids: torch.Tensor) -> None:
    """Refuse a model or calibration batch that `prune` cannot use, naming the argument."""
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers causal LM (e.g. from surgeon.load_model or "
                        f"AutoModelForCausalLM.from_pretrained), not {type(model).__name__}")
    if not isinstance(calibration_ids, torch.Tensor):
        raise TypeError(f"calibration_ids must be a torch.LongTensor [n, seqlen] of token ids (see "
                        f"surgeon.calibration_windows), not {type(calibration_ids).__name__}")
    if calibration_ids.dim() != 2 or calibration_ids.shape[0] < 1 or calibration_ids.shape[1] < 2:
        raise ValueError(f"calibration_ids must have shape [n, seqlen] with n >= 1 and seqlen >= 2, not "
                         f"{list(calibration_ids.shape)} (a single sequence [seqlen] is ids.unsqueeze(0))")
    if calibration_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"calibration_ids must hold integer token ids (torch.long), not {calibration_ids.dtype}")
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and (int(calibration_ids.min()) < 0 or int(calibration_ids.max()) >= vocab):
        raise ValueError(f"calibration_ids holds ids outside the model's vocabulary [0, {vocab})")
    limit = max_seqlen(model)
    if limit is not None and calibration_ids.shape[1] > limit:
        raise ValueError(f"calibration_ids has seqlen {calibration_ids.shape[1]}, longer than the model allows "
                         f"({limit})")


def prune(model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig, progress: bool = True,
          after_shot: Callable[[ShotReport], None] | None = None, checkpoint: Checkpoint | None = None,
          group: dist.ProcessGroup | None = None) -> PruneReport:
    """Prune `model` in place to `config.target_size` in `config.shots` shots (Algorithm 1).

    model: a transformers causal LM whose decoder blocks hold `nn.Linear` layers (embeddings and
        the LM head are never pruned); any dtype and device, its weights change in place.
    calibration_ids: `torch.LongTensor [n, seqlen]`, n windows of token ids (`calibration_windows`).
    config: what to prune and how (`PruneConfig`). progress: draw progress bars (False: silent).
    after_shot: called with each shot's `ShotReport` once the shot is done (e.g. to evaluate it).
    checkpoint: a `surgeon.resume.Checkpoint` written after the shots (and `after_shot`); one holding a
        saved state continues that run after its last saved shot. Split over ranks, only rank 0 writes it.
    group: a torch.distributed process group whose ranks all call `prune` with the same model and
        arguments and share the work (`surgeon.distributed`); each ends with the same pruned model.
    Returns a `PruneReport`: `sparsity` (fraction of zero prunable weights), `layers` (that fraction
    per layer, by qualified name), `shots` (per shot: target size, sparsity reached, seconds per
    phase, peak memory in GiB), `config` and `seconds`.
    """
    if not isinstance(config, PruneConfig):
        raise TypeError(f"config must be a surgeon.PruneConfig, not {type(config).__name__}")
    _check_inputs(model, calibration_ids)
    check_prunable(model, config.leave_out_parts)
    experts = [module for module in decoder_blocks(model).modules() if is_fused_experts(module)]
    if any(isinstance(module.gate_up_proj, DTensor) for module in experts):
        raise SurgeonError("Mixture-of-Experts experts are pruned with their weights whole: launch without --fsdp")
    with experts_as_layers(decoder_blocks(model)):
        return _prune(model, calibration_ids, config, progress, after_shot, checkpoint, group)


def _prune(model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig, progress: bool,
           after_shot: Callable[[ShotReport], None] | None, checkpoint: Checkpoint | None,
           group: dist.ProcessGroup | None) -> PruneReport:
    """`prune` once its inputs are checked and any fused experts are layers (`experts.experts_as_layers`)."""
    blocks = prunable_layers(model, config.leave_out_parts)
    named = [pair for block in blocks for pair in block]
    if not named:
        raise SurgeonError(f"leave_out {config.leave_out!r} leaves no layer of the decoder blocks to prune")
    layers = []
    for name, module in named:
        C = module.in_features
        if config.nm and C % config.nm[1]:
            raise SurgeonError(f"{config.structure}: M={config.nm[1]} does not divide the {C} columns of {name}")
        layers.append(Layer.unpruned(name, module))
    if config.method in PER_LAYER and config.nm and config.shot_count != 1:
        raise SurgeonError(f"{config.method} prunes N:M in one shot; use --shots 1")
    ranks = Ranks(group, [[name for name, _ in block] for block in blocks])
    check_block_groups(len(blocks), ranks.world, config)
    if ranks.world > 1 and config.lora_steps:
        raise SurgeonError("lora_steps run in one process; launch without torchrun")
    count = -(-calibration_ids.shape[0] // config.batch_size)
    batches = ranks.batches(count, even=any(sharded(module) for _, module in named)) \
        if config.curvature_split == "batches" else list(range(count))
    hooked = [[(name, module) for name, module in block if config.curvature_split == "batches" or ranks.mine(name)]
              for block in blocks]
    groups = _block_groups([block for block in hooked if block], config.block_groups)
    checkpointed: list[nn.Module] = list(decoder_blocks(model)) if config.activation_checkpointing else []
    total = sum(layer.module.weight.numel() for layer in layers)
    coupled = channels.couplings(model, [name for name, _ in named])
    kinds = (units.coupled_units(model, [name for name, _ in named], config.width_multiple)
             if config.structure == "coupled" else None)
    device = next(model.parameters()).device
    report = PruneReport(config=dataclasses.asdict(config))
    done, elapsed = checkpoint.restore(layers) if checkpoint is not None else ([], 0.0)
    report.shots.extend(done)
    start = time.perf_counter() - elapsed
    last = config.shot_count
    for shot in tqdm(range(len(done) + 1, last + 1), desc="shots", initial=len(done), total=last,
                     disable=not progress):
        target_size = config.shot_target(shot)
        target_zeros = round((1.0 - target_size) * total)
        t0 = _clock(device)
        collective_seconds = ranks.seconds
        raw: dict[str, curvature.LayerFactors] = {}
        host = curvature.HostFactors(device) if config.offload else None
        if config.method in NEEDS_A:
            for part, group_layers in enumerate(groups, 1):
                factors = curvature.estimate(
                    model, group_layers, calibration_ids, need_g=config.method in NEEDS_G,
                    batch_size=config.batch_size, backend=config.backend, progress=progress, batches=batches,
                    checkpoint_blocks=checkpointed,
                    desc=f"shot {shot}/{last} · curvature" + (f" {part}/{len(groups)}" if len(groups) > 1 else ""))
                if config.curvature_split == "batches":
                    ranks.reduce_factors(factors)
                (raw if host is None else host).update(factors)
                del factors
        t1 = _clock(device)
        phases: dict[str, float] = {}
        freed = 0
        with torch.no_grad():
            if config.method in PER_LAYER:  # "prune" time includes their input estimation
                _per_layer_shot(model, layers, calibration_ids, target_size, config, ranks, progress)
            elif config.propagate and shot == last:
                _propagated_shot(model, layers, raw, calibration_ids, config, ranks, progress)
            elif config.structure in ("structured", "coupled"):
                phases, freed = _structured_shot(layers, raw if host is None else host, target_zeros, config,
                                                 coupled, ranks, kinds)
            else:
                phases = _element_shot(layers, raw, target_zeros, config, ranks)
        t2 = _clock(device)
        seconds = {"curvature": t1 - t0, "prune": t2 - t1, **phases}
        if ranks.world > 1:
            seconds["collectives"] = ranks.seconds - collective_seconds
        if config.lora_steps:
            from surgeon.lora import lora_correction

            lora_correction(model, layers, calibration_ids, config)
            seconds["lora"] = time.perf_counter() - t2
        _, _, sparsity = removed_fractions([(layer.name, layer.mask) for layer in layers])
        shot_report = ShotReport(shot, target_size, sparsity, freed, seconds, peak_memory_gb(device))
        report.shots.append(shot_report)
        logger.info("shot %d/%d · target size %.3f · sparsity %.4f · %s · peak %.2f GB", shot, last,
                    target_size, sparsity, " · ".join(f"{k} {v:.2f}s" for k, v in seconds.items()),
                    shot_report.peak_memory_gb)
        if after_shot is not None:
            after_shot(shot_report)
        if checkpoint is not None and checkpoint.due(shot, shot == last):
            ranks.gather_layers(layers, onto=0)  # sharded weights, whole on the rank that writes
            if ranks.rank == 0:
                checkpoint.save(layers, report.shots, time.perf_counter() - start, shot == last)
            for layer in layers:
                layer.held = None
    report.layers, report.removed, report.sparsity = removed_fractions([(layer.name, layer.mask) for layer in layers])
    report.zero_fraction = zero_fraction(named)
    report.block_sparsity = report.removed / sum(param.numel() for _, param in block_weights(model))
    report.seconds = time.perf_counter() - start
    return report
