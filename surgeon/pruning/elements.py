"""Element shots: unstructured and N:M weights priced by eq. 7 and removed with the correlated update
(eqs. 4-5), globally thresholded or, for N:M's propagated last shot, block by block; and the per-layer
baselines (SparseGPT, Wanda), which prune block by block on the inputs of the blocks already pruned."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from surgeon.errors import require_finite
from surgeon.method import baselines, costs, inverses, solver, threshold, updates
from surgeon.method.damping import damp
from surgeon.method.factors import InputGroup, LayerFactors, by_layer, grouped
from surgeon.method.threshold import Elsewhere
from surgeon.methods import DEFAULT_DAMP_A, LayerRule
from surgeon.models.adapter import decoder_blocks, prunable_layers
from surgeon.models.layer import Layer
from surgeon.pruning import curvature
from surgeon.pruning.block_inputs import BlockInputs
from surgeon.pruning.phases import Blocks, PerLayer, Update
from surgeon.pruning.report import bar, clock, phases, ticker
from surgeon.scale.distributed import Ranks
from surgeon_kernels import ops
from surgeon_kernels.ops import Deferred, PackedSymmetric


def element_shot(layers: list[Layer], raw: list[InputGroup], target_zeros: int, update: Update,
                 nm: tuple[int, int] | None, ranks: Ranks, desc: str | None) -> dict[str, float]:
    """Elements (unstructured or N:M): costs, global threshold, correlated update (eqs. 4-5).

    Costs are not held: each layer keeps what they are computed from (its packed inverse, whose
    diagonals are all eq. 7 reads, or the diagonal curvature), and the threshold recomputes them when
    it reads them (`Deferred`). They read the layer's weights and mask as they are, so each layer's
    mask is made before its update. The layers of an input group (`raw`) share one A⁻¹. Split over
    `ranks`, each holds only its own layers' costs (`Elsewhere` for the others'), the threshold is
    selected over all of them together, and the updated layers are broadcast with their masks. Returns
    the seconds spent on costs, threshold and updates. With `desc`, a progress bar per phase, named
    after it.
    """
    times = [clock(layers[0].mask.device)]
    plans, masks = _thresholded(layers, raw, target_zeros, update, nm, ranks, desc, times)
    with bar(inverses.unpacked(plans), desc and f"{desc} · updates", desc is not None,
             total=sum(len(kept) for _, kept in plans)) as updating:
        for i, inverse in updating:
            _element_update(layers[i], masks[i](), inverse, update, ticker(updating, "CG iteration"))
    ranks.broadcast_layers(layers, masks=True)
    times.append(clock(layers[0].mask.device))
    return phases(times)


def element_zeros(layers: list[Layer], raw: list[InputGroup], target_zeros: int, update: Update, ranks: Ranks,
                  desc: str | None) -> dict[str, int]:
    """How many weights of each of this rank's layers an unstructured shot leaves zero: its costs under the global
    threshold (those pruned before included, each layer within the shot's deviation), where the propagated last
    shot then prunes each layer by its costs on the inputs of the blocks already pruned (`propagated_shot`). The
    shot's factors stay for that pass, so the costs' inverses are held beside them until the threshold is chosen."""
    _, masks = _thresholded(layers, list(raw), target_zeros, update, None, ranks, desc, [])  # raw kept for its G
    return {layer.name: int(mask().sum()) for layer, mask in zip(layers, masks) if not isinstance(mask, Elsewhere)}


def _thresholded(layers: list[Layer], raw: list[InputGroup], target_zeros: int, update: Update,
                 nm: tuple[int, int] | None, ranks: Ranks, desc: str | None, times: list[float]
                 ) -> tuple[list[inverses.Shared], list[Deferred]]:
    """An element shot's costs and global threshold: the inverses each layer's update reads (by input group) and
    each layer's mask, computed when called; `times` gets the clock after each phase."""
    device = layers[0].mask.device
    plans: list[inverses.Shared] = []
    element_costs: list[Deferred] = [Elsewhere(layer.module.weight.numel(), device) for layer in layers]
    ranks.gather_layers(layers)
    with bar(None, desc and f"{desc} · costs", desc is not None, total=len(layers)) as progress:
        for group, members in grouped([layer.name for layer in layers], raw):  # each group freed once used
            A = inverses.input_inverse(group.A, slice(None), update.strengths[1], root=False).packed() \
                if update.correlated and group is not None else None
            kept = []
            for i in members:
                layer = layers[i]
                progress.update()
                if ranks.mine(layer.name):
                    G, layer_costs = _element_plan(layer, None if group is None else group.layers[layer.name],
                                                   update, A)
                    kept.append((i, G))
                    element_costs[i] = Deferred(layer.module.weight.numel(), layer.mask.device, layer_costs)
            plans.append((A, kept))
    times.append(clock(device))
    with bar(None, desc and f"{desc} · threshold (layers' costs read)", desc is not None) as reads:
        counted = [c if isinstance(c, Elsewhere) else Deferred(c.numel(), c.device, _counted(c, reads))
                   for c in element_costs]
        if nm:
            masks = threshold.nm_selection(counted, *nm, target_zeros, update.backend, ranks.reduce())
        else:
            masks = threshold.smallest_k_within(counted, target_zeros, update.deviation, update.backend,
                                                ranks.reduce())
    times.append(clock(device))
    return plans, [Elsewhere(c.numel(), device) if isinstance(c, Elsewhere) else m
                   for c, m in zip(element_costs, masks)]


def _counted(costs: Deferred, reads: Any) -> Callable[[], torch.Tensor]:
    """`costs`' computation, each call counted on the progress bar `reads`."""

    def read() -> torch.Tensor:
        value = costs()
        reads.update()
        return value

    return read


def _element_plan(layer: Layer, entry: LayerFactors | None, update: Update, A: inverses.FactorInverse | None
                  ) -> tuple[inverses.FactorInverse | None, Callable[[], torch.Tensor]]:
    """What one layer's element update keeps besides its input group's A⁻¹ (`A`): its G⁻¹, packed, or nothing for
    the OBD baselines; and its element costs (eq. 7, computed when called)."""
    R, C = layer.module.out_features, layer.module.in_features
    G: inverses.FactorInverse | None = None
    if update.correlated and entry is not None:
        assert A is not None  # the group's, inverted where the update is correlated
        G = inverses.output_inverse(entry, slice(None), update.strengths[0], root=False).packed()
        weigh = functools.partial(costs.element_costs, f=inverses.kronecker(G, A))
    else:
        g, a = costs.diagonal_curvature(entry, (R, C + layer.bias), layer.mask.device, update.strengths)
        weigh = functools.partial(costs.diagonal_costs, g=g, a=a)
    dead = costs.dead(entry, slice(None), slice(0, C), R) if entry is not None else None
    return G, functools.partial(_layer_element_costs, layer, weigh, dead)


def _element_update(layer: Layer, mask: torch.Tensor, inverse: inverses.KroneckerInverse | None,
                    update: Update, on_iteration: Callable[[int], None] | None = None) -> None:
    """Add `mask` to the layer's pruned weights and apply the correlated update (eqs. 4-5) with `inverse` (dense),
    `on_iteration` told of each conjugate-gradient iteration."""
    layer.mask = mask | layer.mask  # computed from the layer's costs before its mask and weights change
    W = layer.weight()
    if inverse is not None:
        pruned, original = layer.with_bias_col(layer.mask, False), W
        W = updates.finite_update(layer.name, inverse, lambda g: updates.unstructured(
            original, g, pruned, update.max_correlate, update.cg_tol, update.cg_max_iter, update.backend,
            update.cg_dtype, on_iteration), max(update.strengths))
    layer.store(W)


def _layer_element_costs(layer: Layer, weigh: Callable[[torch.Tensor], torch.Tensor],
                         dead_structures: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Element costs `weigh(W)` of the layer's weights as they are now: dead ones 0, pruned ones −inf."""
    e = weigh(layer.weight())[:, : layer.module.in_features]
    if dead_structures is not None:
        e = e.masked_fill(dead_structures[0].unsqueeze(1) | dead_structures[1].unsqueeze(0), 0)
    return e.masked_fill(layer.mask, float("-inf"))


# a layer, its costs (computed when called) and its raw input factor A -> its mask
Selection = Callable[[Layer, Callable[[], torch.Tensor], PackedSymmetric], torch.Tensor]


def nm_selection(nm: tuple[int, int], backend: str, rule: str = "costs", damp_a: float = DEFAULT_DAMP_A
                 ) -> Selection:
    """Each layer's own N of every M weights (`PruneConfig.nm_mask`): those the OBS sweep over its columns removes on
    its A damped by `damp_a`, each group chosen after the earlier columns' updates ("sweep", `baselines.sparsegpt`;
    [G⁻¹]ᵢᵢ scales a row's costs alike, so G would choose nothing in it), or the cheapest by its costs at once
    ("costs", eq. 7)."""

    def select(layer: Layer, layer_costs: Callable[[], torch.Tensor], A: PackedSymmetric) -> torch.Tensor:
        if rule == "costs":
            return ops.nm_select(layer_costs(), *nm, backend)[1]
        C = layer.module.in_features
        return baselines.sparsegpt(layer.weight()[:, :C], A.dense()[:C, :C], 1 - nm[0] / nm[1], layer.mask, nm,
                                   percdamp=damp_a)[1]

    return select


def counted_selection(zeros: dict[str, int], backend: str) -> Selection:
    """Each layer's `zeros[name]` cheapest weights (those pruned before, priced −inf, first)."""
    return lambda layer, layer_costs, A: threshold.smallest_k([layer_costs()], zeros[layer.name], backend)[0]()


def propagated_shot(model: nn.Module, layers: list[Layer], raw: list[InputGroup], calibration: torch.Tensor,
                    update: Update, select: Selection, blocks: Blocks, ranks: Ranks, progress: bool) -> None:
    """The last shot, which prunes every layer block by block (`PruneConfig.propagate`).

    Each layer's mask is `select`ed from its own weights and A: N of every M by the OBS sweep or by its costs (no
    global threshold, sec. 3.3; `nm_selection`), or as many weights as the shot's global threshold took from it
    (`element_zeros`, by its costs); each block's A is estimated again from
    the inputs the blocks before it give, already pruned and updated in this shot (as SparseGPT prunes), G is the
    shot's (docs/DESIGN.md). Over `ranks`, the block's owner, which holds its G, prunes it
    (`_pruned_block_by_block`), with the method's mask and update (eqs. 4-5).
    """
    shot = by_layer(raw)  # G of the shot's pass; each block's A comes from its propagated inputs
    raw.clear()  # each layer's factors freed once it is pruned
    for block in _pruned_block_by_block(model, layers, calibration, blocks, ranks, progress):
        for fresh, members in block:
            A = inverses.input_inverse(fresh.A, slice(None), update.strengths[1], root=False) \
                if update.correlated else None
            for layer in members:
                entry = dataclasses.replace(shot.pop(layer.name), A=fresh.A)  # methods with a curvature pass
                G, layer_costs = _element_plan(layer, entry, update, A)
                mask = select(layer, layer_costs, fresh.A)
                inverse = None if G is None or A is None else inverses.kronecker(G.dense(), A)
                _element_update(layer, mask, inverse, update)


def _pruned_block_by_block(model: nn.Module, layers: list[Layer], calibration: torch.Tensor, blocks: Blocks,
                           ranks: Ranks, progress: bool) -> Iterator[list[tuple[InputGroup, Iterator[Layer]]]]:
    """Per decoder block, this rank's input groups of it (their input factors) with their layers, for the caller
    to prune in place.

    Each block's inputs come from the blocks before it, already pruned: the block runs once to
    estimate its layers' input factors and once, pruned, to give the next block's inputs
    (`BlockInputs`). Split over `ranks` by batches, each runs its share of the batches and a block's
    factors are summed onto its owner; by blocks, each runs every batch and the owner keeps its
    block's factors. The block's layers are gathered whole before it is yielded and broadcast from
    their owners after; a bar counts the layers the caller has pruned, and below it one counts the block's two runs
    over the batches (at the CLI's 128 windows of 2048 tokens, minutes on a wide block).
    """
    by_name = {layer.name: layer for layer in layers}
    share = calibration
    if blocks.curvature_split == "batches":
        batches = calibration.split(blocks.batch_size)
        share = torch.cat([batches[i] for i in ranks.batches(len(batches))])
    inputs = BlockInputs(model, decoder_blocks(model), share, blocks.batch_size)
    named_blocks = prunable_layers(model, blocks.leave_out)
    mine = sum(ranks.mine(name) for named in named_blocks for name, _ in named)
    with tqdm(total=mine, desc="blocks (layers pruned)", leave=False, disable=not progress) as pruned:
        for named in named_blocks:
            with tqdm(total=2 * len(inputs.batches), desc="block inputs (batches, twice)", leave=False,
                      disable=not progress) as runs:
                groups = curvature.estimate_inputs(named, inputs.forwards(runs.update), calibration.numel(),
                                                   blocks.backend)
                if blocks.curvature_split == "batches":
                    ranks.reduce_factors(groups)
                block = [by_name[name] for name, _ in named]
                ranks.gather_layers(block)
                yield [(group, _advancing([by_name[name] for name in group.layers], pruned)) for group in groups
                       if ranks.mine(next(iter(group.layers)))]
                ranks.broadcast_layers(block, masks=True)
                inputs.advance(runs.update)


def _advancing(layers: list[Layer], progress: Any) -> Iterator[Layer]:
    """`layers`, the progress bar advanced as the caller finishes each."""
    for layer in layers:
        yield layer
        progress.update()


def per_layer_shot(model: nn.Module, layers: list[Layer], calibration: torch.Tensor, target_size: float,
                   shot: PerLayer, ranks: Ranks, progress: bool) -> None:
    """SparseGPT or Wanda: each layer pruned to the same sparsity with its own algorithm, block by block on the
    inputs of the blocks already pruned, as published (`_pruned_block_by_block`)."""
    for block in _pruned_block_by_block(model, layers, calibration, shot.blocks, ranks, progress):
        for group, members in block:
            A = group.A.dense()  # once for the layers that read it
            for layer in members:
                _prune_one_layer(layer, A, target_size, shot)


def _prune_one_layer(layer: Layer, A: torch.Tensor, target_size: float, shot: PerLayer) -> None:
    """The method's per-layer rule (`Method.layer_rule`) on one layer, given its input factor A."""
    require_finite({f"the weights of layer {layer.name}": layer.weight()})
    LAYER_RULES[shot.rule](layer, A, 1 - target_size, shot.nm)


def _wanda_layer(layer: Layer, A: torch.Tensor, sparsity: float, nm: tuple[int, int] | None) -> None:
    """Wanda on one layer: its smallest |w|·‖x‖ in each output row (or N:M group) removed, no update."""
    W, C = layer.weight(), layer.module.in_features
    layer.mask = layer.mask | baselines.per_row_mask(
        baselines.wanda_scores(W[:, :C], A.diagonal()[:C]), sparsity, layer.mask, nm)
    layer.store(W)


def _sparsegpt_layer(update: LayerRule, layer: Layer, A: torch.Tensor, sparsity: float,
                     nm: tuple[int, int] | None) -> None:
    """SparseGPT's mask on one layer with its sweep's weights (SWEEP), every row's kept weights solved exactly for
    that mask (EXACT, G = I), or `solver.REFINE_ITERATIONS` conjugate-gradient steps from the sweep toward that
    solve (REFINE: an early stop, which on scarce calibration tokens generalises better; docs/DESIGN.md)."""
    W, C = layer.weight(), layer.module.in_features
    A = A[:C, :C]
    pruned, mask = baselines.sparsegpt(W[:, :C], A, sparsity, layer.mask, nm)
    layer.mask = mask | layer.mask
    if update is LayerRule.EXACT:
        pruned = solver.solve(W[:, :C], A, mask=layer.mask).weight
    elif update is LayerRule.REFINE:
        pruned = solver.refine_rows(W[:, :C].float(), damp(A.float(), DEFAULT_DAMP_A), pruned.float(), layer.mask,
                                    solver.REFINE_ITERATIONS).to(W.dtype)
    W[:, :C] = pruned
    layer.store(W)


LayerPruner = Callable[[Layer, torch.Tensor, float, "tuple[int, int] | None"], None]
# each per-layer rule's pruner: (layer, its input factor A, sparsity, N:M) -> None, the layer pruned in place
LAYER_RULES: dict[LayerRule, LayerPruner] = {
    LayerRule.WANDA: _wanda_layer,
    **{rule: functools.partial(_sparsegpt_layer, rule) for rule in (LayerRule.SWEEP, LayerRule.EXACT,
                                                                    LayerRule.REFINE)},
}
