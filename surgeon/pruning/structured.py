"""A structured shot (sec. 3.4): rows and columns, or coupled units, priced by eq. 7, chosen by one global
threshold, and removed with the correlated structured update."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from surgeon.method import costs, inverses, threshold, updates
from surgeon.method.damping import damp
from surgeon.method.factors import InputGroup, LayerFactors, grouped
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


def structured_shot(layers: list[Layer], raw: list[InputGroup], target_zeros: int, update: Update,
                    allocation: Units, offload: bool, coupled: list[channels.Coupling],
                    kinds: list[units.UnitKind] | None, ranks: Ranks, desc: str | None) -> tuple[dict[str, float], int]:
    """Rows and columns, or coupled units: costs (eq. 7), global threshold, joint or within update (sec. 3.4).

    With `kinds` (structure coupled) the structures are neurons, heads and KV groups (`surgeon.models.units`),
    removed whole: a unit costs the joint cost of its consumer columns (`costs.set_costs`; the OBD baselines:
    the sum of their element costs), whose removal leaves its producer rows dead: they are freed without an update.
    The rows and columns that the chosen ones leave dead (`coupled` channels, freed KV heads) are removed
    too and count toward the target; they take no part in the updates (their inputs or outputs are gone).

    Between costs and updates each layer keeps only its packed inverse roots (weights are read again),
    so a shot never holds more than the factors' packed size plus one input group's dense work; with
    `offload` the factors (`raw`, in host memory) and the kept roots wait in host memory, and the device
    holds those of one input group at a time. Split over `ranks`, each computes its own layers' costs and
    updates; the costs are summed so that all make the same choice, and the updated layers are broadcast.
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
    kept = [layer.kept() for layer in layers]  # before the masks change
    for layer, rows_out, cols_out in zip(layers, removed_rows, removed_cols):
        layer.rows, layer.cols = rows_out, cols_out
    for i, inverse in bar(inverses.unpacked(plans, device if offload else None), desc and f"{desc} · updates",
                          desc is not None, total=sum(len(members) for _, members in plans)):
        keep_r, keep_c, _ = kept[i]
        _update(layers[i], keep_r, keep_c, inverse, row_sel[i], col_sel[i], update)
    ranks.broadcast_layers(layers, masks=False)
    times.append(clock(device))
    return phases(times), freed




def _costs(layers: list[Layer], raw: list[InputGroup], update: Update, offload: bool, ranks: Ranks,
           kinds: list[units.UnitKind] | None, desc: str | None
           ) -> tuple[list[inverses.Shared], list[torch.Tensor], list[torch.Tensor],
                      dict[tuple[int, int], torch.Tensor]]:
    """Every layer's row and column costs (eq. 7; −inf where already removed), the costs of its consumer column
    sets of each unit size (keyed by layer index and size), and what the updates keep, by the layers that share one
    A⁻¹ root (the layers of an input group with the same kept columns); summed over `ranks`; with `desc`, a
    progress bar of the layers so named."""
    plans: list[inverses.Shared] = []
    row_by: dict[int, torch.Tensor] = {}
    col_by: dict[int, torch.Tensor] = {}
    device = layers[0].rows.device
    sets: dict[int, set[int]] = {}  # consumer layer -> its units' column-set sizes (o: heads, KV groups)
    for kind in kinds or []:
        if kind.consumer.size > 1:
            sets.setdefault(kind.consumer.layer, set()).add(kind.consumer.size)
    set_cost: dict[tuple[int, int], torch.Tensor] = {}
    ranks.gather_layers(layers)
    with bar(None, desc, desc is not None, total=len(layers)) as progress:
        for group, members in grouped([layer.name for layer in layers], raw):  # each group freed once used
            for index in members:
                if not ranks.mine(layers[index].name):  # another rank's: zeros here, its costs once summed
                    R, C = layers[index].module.out_features, layers[index].module.in_features
                    row_by[index], col_by[index] = torch.zeros(R, device=device), torch.zeros(C, device=device)
                    for size in sets.get(index, ()):
                        set_cost[index, size] = torch.zeros(C // size, device=device)
            mine = [index for index in members if ranks.mine(layers[index].name)]
            if mine:  # the group's work in a call of its own: its factors and dense roots go before the next's come
                plans += _group_costs(layers, mine, group.to(device) if offload and group is not None else group,
                                      update, offload, sets, (row_by, col_by, set_cost))
            progress.update(len(members))
    row_costs, col_costs = [row_by[i] for i in range(len(layers))], [col_by[i] for i in range(len(layers))]
    set_cost = dict(sorted(set_cost.items()))  # one order on every rank, whichever groups it holds
    if ranks.world > 1:  # −inf (removed) plus the other ranks' zeros stays −inf
        every = row_costs + col_costs + list(set_cost.values())
        parts = ranks.sum(torch.cat(every)).split([t.numel() for t in every])
        row_costs, col_costs = list(parts[:len(layers)]), list(parts[len(layers):2 * len(layers)])
        set_cost = dict(zip(set_cost, parts[2 * len(layers):]))
    return plans, row_costs, col_costs, set_cost


def _group_costs(layers: list[Layer], members: list[int], group: InputGroup | None, update: Update, offload: bool,
                 sets: dict[int, set[int]], into: tuple[dict[int, torch.Tensor], dict[int, torch.Tensor],
                                                        dict[tuple[int, int], torch.Tensor]]) -> list[inverses.Shared]:
    """The costs of one input group's layers (at `members` of `layers`; `group` None: a layer without factors), put
    `into` the row, column and column-set costs by layer index, and what their updates keep: one plan per set of
    kept columns, whose layers share the A⁻¹ root."""
    row_by, col_by, set_cost = into
    shared: list[tuple[torch.Tensor, inverses.Shared]] = []  # by kept columns: their A⁻¹ root, dense, and layers
    for index in members:
        layer, sizes = layers[index], sorted(sets.get(index, ()))
        keep_r, keep_c, real_c = layer.kept()
        entry = None if group is None else group.layers[layer.name]
        A, same = next((plan for columns, plan in shared if torch.equal(columns, keep_c)), (None, None))
        if same is None:  # the first of the group's layers with these columns inverts their A
            A = inverses.input_inverse(entry.A, keep_c, update.strengths[1], root=True) \
                if update.correlated and entry is not None else None
            same = []
            shared.append((keep_c, (A, same)))
        rows, cols, joint, G = _layer_costs(layer, (keep_r, keep_c, real_c), entry, update, A, sets=bool(sizes))
        for size in sizes:  # a consumer of several columns per unit (o: head_dim per head, more per KV group)
            set_cost[index, size] = _column_set_costs(cols, real_c, size, joint)
        same.append((index, None if G is None else _kept(G.packed(), offload)))
        row_by[index], col_by[index] = rows, cols
    return [(None if A is None else _kept(A.packed(), offload), kept) for _, (A, kept) in shared]


def _kept(inverse: inverses.FactorInverse, offload: bool) -> inverses.FactorInverse:
    """A packed root as the shot keeps it until its update: in host memory with `offload`."""
    return inverse.to("cpu") if offload else inverse


def _layer_costs(layer: Layer, kept_indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                 entry: LayerFactors | None, update: Update, A: inverses.FactorInverse | None, sets: bool,
                 ) -> tuple[torch.Tensor, torch.Tensor, Callable[[int], torch.Tensor] | None,
                            inverses.FactorInverse | None]:
    """One layer's row and column costs (eq. 7: LLM Surgeon from F⁻¹, the OBD baselines from a diagonal; dead
    structures 0, removed ones −inf), with `sets` the joint cost of its column sets of m kept columns (LLM
    Surgeon; else None: their columns' costs are summed), and the G⁻¹ root its update keeps beside its input's A⁻¹
    root `A`; `kept_indices` are the layer's `Layer.kept()`."""
    R, C = layer.module.out_features, layer.module.in_features
    keep_r, keep_c, real_c = kept_indices
    strengths = update.strengths
    W = layer.weight()
    rows = torch.full((R,), float("-inf"), device=W.device)
    cols = torch.full((C,), float("-inf"), device=W.device)
    G = joint = None
    if update.correlated:
        assert entry is not None and entry.G is not None and A is not None  # surgeon's pass: both factors
        G = inverses.output_inverse(entry, keep_r, strengths[0], root=True)
        f = inverses.kronecker(G, A)
        rc, cc = costs.layer_structure_costs(W, entry, f, keep_r, keep_c, real_c.numel(), strengths)
        if sets:
            damped = damp(submatrix(entry.G.dense(), keep_r, keep_r), strengths[0])
            root = inverses.as_dense(f.A)[: real_c.numel()]
            joint = functools.partial(costs.set_costs, submatrix(W, keep_r, real_c).T, root, damped)
    else:
        g, a = costs.diagonal_curvature(entry, W.shape, W.device, strengths)
        e = costs.diagonal_costs(submatrix(W, keep_r, keep_c), g[keep_r], a[keep_c])
        rc, cc = e.sum(1), e.sum(0)[: real_c.numel()]
    if entry is not None:
        dead_r, dead_c = costs.dead(entry, keep_r, real_c, R)
        rc, cc = rc.masked_fill(dead_r, 0), cc.masked_fill(dead_c, 0)
    rows[keep_r] = rc.to(rows.dtype)  # a float64 model's factors give float64 costs; W and the costs are float32
    cols[real_c] = cc.to(cols.dtype)
    return rows, cols, joint, G


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
