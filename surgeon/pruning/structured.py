"""A structured shot (sec. 3.4): rows and columns, or coupled units, priced by eq. 7, chosen by one global
threshold, and removed with the correlated structured update."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from surgeon.method import costs, inverses, threshold, updates
from surgeon.method.damping import damp
from surgeon.method.factors import HostFactors, LayerFactors
from surgeon.method.submatrix import put_submatrix, submatrix
from surgeon.models import channels, units
from surgeon.models.layer import Layer
from surgeon.pruning.phases import Units, Update
from surgeon.pruning.report import bar, clock, phases
from surgeon.scale.distributed import Ranks


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


def structured_shot(layers: list[Layer], raw: dict[str, LayerFactors] | HostFactors, target_zeros: int,
                    update: Update, allocation: Units, offload: bool, coupled: list[channels.Coupling],
                    kinds: list[units.UnitKind] | None, ranks: Ranks, desc: str | None) -> tuple[dict[str, float], int]:
    """Rows and columns, or coupled units: costs (eq. 7), global threshold, joint or within update (sec. 3.4).

    With `kinds` (structure coupled) the structures are neurons, heads and KV groups (`surgeon.models.units`),
    removed whole: a unit costs the joint cost of its consumer columns (`costs.set_costs`; the OBD baselines:
    the sum of their element costs), whose removal leaves its producer rows dead: they are freed without an update.
    The rows and columns that the chosen ones leave dead (`coupled` channels, freed KV heads) are removed
    too and count toward the target; they take no part in the updates (their inputs or outputs are gone).

    Between costs and updates each layer keeps only its packed inverse roots (weights are read again),
    so a shot never holds more than the factors' packed size plus one layer's dense work; with
    `offload` the factors (`raw`, a `HostFactors`) and the kept roots wait in host
    memory, and the device holds those of a layer and the one before it (whose A it may share). Split over
    `ranks`, each computes its own layers' costs and updates; the costs are summed so that all make
    the same choice, and the updated layers are broadcast.
    Returns the seconds spent on costs, threshold and updates, and the number of dead weights freed. With `desc`,
    a progress bar per phase that runs layer by layer, named after it.
    """
    device = layers[0].rows.device
    times = [clock(device)]
    plans, row_costs, col_costs, set_cost = _costs(layers, raw, update, offload, ranks, kinds,
                                                   desc and f"{desc} · costs")
    times.append(clock(device))
    row_sel, col_sel, removed_rows, removed_cols = _select(layers, row_costs, col_costs, set_cost, target_zeros,
                                                           allocation, coupled, kinds)
    freed = threshold.removed_weights(removed_rows, removed_cols) - threshold.removed_weights(row_sel, col_sel)
    times.append(clock(device))
    dense = inverses.unpacked((kept for _, _, kept in plans), device if offload else None)
    for layer, (keep_r, keep_c, _), inverse, new_rows, new_cols, rows_out, cols_out in bar(zip(
            layers, plans, dense, row_sel, col_sel, removed_rows, removed_cols), desc and f"{desc} · updates",
            desc is not None, total=len(layers)):
        layer.rows, layer.cols = rows_out, cols_out
        if ranks.mine(layer.name):
            _update(layer, keep_r, keep_c, inverse, new_rows, new_cols, update)
    ranks.broadcast_layers(layers, masks=False)
    times.append(clock(device))
    return phases(times), freed


Plan = tuple[torch.Tensor, torch.Tensor, inverses.KroneckerInverse | None]  # kept rows, kept columns, F⁻¹ roots


def _costs(layers: list[Layer], raw: dict[str, LayerFactors] | HostFactors, update: Update, offload: bool,
           ranks: Ranks, kinds: list[units.UnitKind] | None, desc: str | None
           ) -> tuple[list[Plan], list[torch.Tensor], list[torch.Tensor], dict[tuple[int, int], torch.Tensor]]:
    """Every layer's row and column costs (eq. 7; −inf where already removed), the costs of its consumer column
    sets of each unit size (keyed by layer index and size), and what its update keeps; summed over `ranks`; with
    `desc`, a progress bar of the layers so named."""
    plans: list[Plan] = []
    row_costs: list[torch.Tensor] = []
    col_costs: list[torch.Tensor] = []
    device = layers[0].rows.device
    sets: dict[int, set[int]] = {}  # consumer layer -> its units' column-set sizes (o: heads, KV groups)
    for kind in kinds or []:
        if kind.consumer.size > 1:
            sets.setdefault(kind.consumer.layer, set()).add(kind.consumer.size)
    set_cost: dict[tuple[int, int], torch.Tensor] = {}
    sibling: inverses.Sibling | None = None
    offloaded: tuple[inverses.KroneckerInverse, inverses.KroneckerInverse] | None = None  # the last, on device and host
    ranks.gather_layers(layers)
    for index, layer in enumerate(bar(layers, desc, desc is not None)):
        R, C, sizes = layer.module.out_features, layer.module.in_features, sorted(sets.get(index, ()))
        keep_r, keep_c, real_c = layer.kept()
        if not ranks.mine(layer.name):  # another rank's: zeros here, its costs once summed
            plans.append((keep_r, keep_c, None))
            row_costs.append(torch.zeros(R, device=device))
            col_costs.append(torch.zeros(C, device=device))
            for size in sizes:
                set_cost[index, size] = torch.zeros(C // size, device=device)
            continue
        entry = raw.pop(layer.name, None)  # frees each raw factor after its last layer
        rows, cols, joint, kept, sibling = _layer_costs(layer, (keep_r, keep_c, real_c), entry, update, sibling,
                                                        sets=bool(sizes))
        for size in sizes:  # a consumer of several columns per unit (o: head_dim per head, more per KV group)
            set_cost[index, size] = _column_set_costs(cols, real_c, size, joint)
        if offload and kept is not None:  # siblings' shared A⁻¹ goes to host memory once
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
    return plans, row_costs, col_costs, set_cost


def _layer_costs(layer: Layer, kept_indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                 entry: LayerFactors | None, update: Update, sibling: inverses.Sibling | None, sets: bool,
                 ) -> tuple[torch.Tensor, torch.Tensor, Callable[[int], torch.Tensor] | None,
                            inverses.KroneckerInverse | None, inverses.Sibling | None]:
    """One layer's row and column costs (eq. 7: LLM Surgeon from F⁻¹, the OBD baselines from a diagonal; dead
    structures 0, removed ones −inf), with `sets` the joint cost of its column sets of m kept columns (LLM
    Surgeon; else None: their columns' costs are summed), the packed inverse roots its update keeps, and the
    sibling the next layer may share A⁻¹ with; `kept_indices` are the layer's `Layer.kept()`."""
    R, C = layer.module.out_features, layer.module.in_features
    keep_r, keep_c, real_c = kept_indices
    strengths = update.strengths
    W = layer.weight()
    rows = torch.full((R,), float("-inf"), device=W.device)
    cols = torch.full((C,), float("-inf"), device=W.device)
    kept = joint = None
    if update.correlated:
        assert entry is not None and entry.G is not None  # surgeon's pass gives every layer both factors
        f, kept = inverses.layer_inverse(entry, keep_r, keep_c, strengths, roots=True, sibling=sibling)
        sibling = (entry, keep_c, kept, f.A)
        rc, cc = costs.layer_structure_costs(W, entry, f, keep_r, keep_c, real_c.numel(), strengths)
        if sets:
            G = damp(submatrix(entry.G.dense(), keep_r, keep_r), strengths[0])
            root = inverses.as_dense(f.A)[: real_c.numel()]
            joint = functools.partial(costs.set_costs, submatrix(W, keep_r, real_c).T, root, G)
    else:
        g, a = costs.diagonal_curvature(entry, W.shape, W.device, strengths)
        e = costs.diagonal_costs(submatrix(W, keep_r, keep_c), g[keep_r], a[keep_c])
        rc, cc = e.sum(1), e.sum(0)[: real_c.numel()]
    if entry is not None:
        dead_r, dead_c = costs.dead(entry, keep_r, real_c, R)
        rc, cc = rc.masked_fill(dead_r, 0), cc.masked_fill(dead_c, 0)
    rows[keep_r] = rc.to(rows.dtype)  # a float64 model's factors give float64 costs; W and the costs are float32
    cols[real_c] = cc.to(cols.dtype)
    return rows, cols, joint, kept, sibling


def _select(layers: list[Layer], row_costs: list[torch.Tensor], col_costs: list[torch.Tensor],
            set_cost: dict[tuple[int, int], torch.Tensor], target_zeros: int, allocation: Units,
            coupled: list[channels.Coupling], kinds: list[units.UnitKind] | None,
            ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The global threshold (sec. 3.3): the rows and columns chosen, whose updates remove them, and all that is
    removed once the structures they leave dead go too (rows and columns, or the coupled units' masks)."""
    with_dead = functools.partial(channels.with_dead, coupled)
    if kinds is None:
        row_sel, col_sel = threshold.structured_selection(row_costs, col_costs, target_zeros, with_dead)
        return row_sel, col_sel, *with_dead(row_sel, col_sel)
    before = ([layer.rows for layer in layers], [layer.cols for layer in layers])
    unit_costs = [set_cost[kind.consumer.layer, kind.consumer.size] if kind.consumer.size > 1
                  else col_costs[kind.consumer.layer] for kind in kinds]
    if allocation.speed_context is not None:  # every unit of a kind saves the same: the order within it stays
        shapes = [(layer.module.out_features, layer.module.in_features) for layer in layers]
        unit_costs = [cost / units.decode_macs(kind, shapes, allocation.speed_context)
                      for cost, kind in zip(unit_costs, kinds)]
    group_costs, chosen_units = units.allocation(kinds, unit_costs, allocation.layout, allocation.width_multiple)

    def zeros(groups: list[torch.Tensor]) -> int:
        masks = units.masks_of(kinds, chosen_units(groups), *before, free_kv=True)
        return threshold.removed_weights(*with_dead(*masks))

    prefix = threshold.cheapest_prefix(group_costs, zeros, target_zeros, "neurons, heads and KV groups")
    chosen = chosen_units(prefix)
    row_sel, col_sel = units.masks_of(kinds, chosen, *before, free_kv=False, consumers_only=True)
    return row_sel, col_sel, *with_dead(*units.masks_of(kinds, chosen, *before, free_kv=True))


def _update(layer: Layer, keep_r: torch.Tensor, keep_c: torch.Tensor, inverse: inverses.KroneckerInverse | None,
            new_rows: torch.Tensor, new_cols: torch.Tensor, update: Update) -> None:
    """The structured update (sec. 3.4) removing the layer's newly chosen rows and columns, then its masks
    applied; the OBD baselines (no inverse) only apply the masks."""
    W = layer.weight()
    if inverse is not None:
        p = new_rows[keep_r].nonzero().squeeze(1)
        q = torch.isin(keep_c, new_cols.nonzero().squeeze(1)).nonzero().squeeze(1)
        sub = submatrix(W, keep_r, keep_c)
        put_submatrix(W, keep_r, keep_c, updates.finite_update(
            layer.name, inverse, lambda g: updates.structured(sub, g, p, q, update.correlation),
            max(update.strengths)))
    layer.store(W)
