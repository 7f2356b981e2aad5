"""Global thresholds: one τ over all layers (paper sec. 3.3, "dynamic allocation").

Every function picks exactly as many structures as reach the requested number of zero weights
(to within one structure), cheapest first, across layers of different shapes. Structures already
pruned carry cost −inf, so they are always kept pruned and count toward the target.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

from surgeon.errors import SurgeonError
from surgeon_kernels import ops
from surgeon_kernels.ops import Deferred, Lazy, Reduce, materialise


class Elsewhere(Deferred):
    """A tensor that another rank holds (e.g. the element costs of a layer it owns): its size is known here,
    its values are not (calling it raises)."""

    def __init__(self, numel: int, device: torch.device):
        super().__init__(numel, device, self._missing)

    @staticmethod
    def _missing() -> torch.Tensor:
        raise RuntimeError("this tensor is held by another rank")


def _select(costs: Sequence[Lazy], k: int, backend: str, reduce: Reduce | None = None) -> tuple[float, list[int]]:
    """τ, the k-th smallest of all costs, and how many costs equal to τ each tensor takes (in order, until k).

    Split over ranks (`surgeon.scale.distributed`), `costs` lists every layer's, those of layers owned by other
    ranks as `Elsewhere`; `reduce` sums the selection's histograms and the counts at τ over the ranks, so
    every rank finds the same τ and the same ties.
    """
    total = sum(c.numel() for c in costs)
    if not 0 <= k <= total:
        raise SurgeonError(f"cannot select {k} of {total} structures")
    if not k:
        return float("-inf"), [0] * len(costs)  # nothing is below −∞ and no tie is taken: no costs read
    here = [c for c in costs if not isinstance(c, Elsewhere)]
    tau = ops.kth_smallest(here, k, backend, reduce, device=costs[0].device)
    counts = torch.zeros(len(costs), 2, dtype=torch.int64)
    for index, c in enumerate(costs):
        if not isinstance(c, Elsewhere):
            values = materialise(c).float()
            counts[index] = torch.stack([(values < tau).sum(), (values == tau).sum()])
    if reduce is not None:
        counts = reduce(counts)
    missing, ties = k - int(counts[:, 0].sum()), []
    for equal in counts[:, 1].tolist():
        ties.append(min(missing, equal))
        missing -= ties[-1]
    return tau, ties


def _below(costs: torch.Tensor, tau: float, ties: int) -> torch.Tensor:
    """The mask of costs below τ and of the first `ties` costs equal to τ."""
    costs = costs.float()
    mask = costs < tau
    if ties:
        mask.view(-1)[(costs == tau).reshape(-1).nonzero().squeeze(1)[:ties]] = True
    return mask


def smallest_k(costs: Sequence[Lazy], k: int, backend: str = "auto", reduce: Reduce | None = None) -> list[Deferred]:
    """Masks (same shapes as `costs`) selecting the k smallest costs over all tensors together.

    τ is the k-th smallest cost by selection, never a full sort (`surgeon_kernels.ops.kth_smallest`);
    every cost below τ is taken, then ties at τ in order until k. Costs may be `Deferred`, and so
    are the masks: each is computed from its costs when called, so no layer's costs or mask need
    be held before its update (Llama-2-7B: 24 GiB of float32 costs). `reduce`: see `_select`.
    """
    def mask(c: Lazy, ties: int) -> torch.Tensor:
        return _below(materialise(c), tau, ties)

    tau, ties = _select(costs, k, backend, reduce)
    return [Deferred(c.numel(), c.device, functools.partial(mask, c, t)) for c, t in zip(costs, ties)]


def bounds(k: int, sizes: Sequence[int], deviation: float) -> list[tuple[int, int]]:
    """How many of each tensor's structures a selection of k over tensors of `sizes` may take when each tensor's
    fraction may stray at most `deviation` from k's fraction of all: the floor of its lower and the ceiling of its
    upper limit, so that the limits always admit k."""
    total = sum(sizes)
    if not 0 <= k <= total:
        raise SurgeonError(f"cannot select {k} of {total} structures")
    low, high = max(0.0, k / total - deviation), min(1.0, k / total + deviation)
    return [(math.floor(low * size), min(size, math.ceil(high * size))) for size in sizes]


def _clamped(costs: Lazy, low: int, high: int, backend: str) -> Deferred:
    """`costs` with their `low` cheapest at −∞ and all but their `high` cheapest at +∞ (ties in order), computed when
    called; where the two limits cut is selected once, from the first call's costs (`ops.kth_smallest`, no sort)."""
    cuts: list[tuple[float, int]] = []

    def compute() -> torch.Tensor:
        values = materialise(costs)
        flat = values.float().reshape(-1).clone()
        if not cuts:
            cuts.extend((_cut(flat, low, backend), _cut(flat, high, backend)))
        (tau_low, ties_low), (tau_high, ties_high) = cuts
        keep = _below(flat, tau_high, ties_high)
        flat[_below(flat, tau_low, ties_low)] = float("-inf")
        flat[~keep] = float("inf")
        return flat.reshape(values.shape)

    return Deferred(costs.numel(), costs.device, compute)


def _cut(flat: torch.Tensor, count: int, backend: str) -> tuple[float, int]:
    """τ and the ties at τ that `_below` takes for the `count` cheapest of `flat`."""
    if not count:
        return float("-inf"), 0
    tau = ops.kth_smallest([flat], count, backend, device=flat.device)
    return tau, count - int((flat < tau).sum())


def smallest_k_within(costs: Sequence[Lazy], k: int, deviation: float, backend: str = "auto",
                      reduce: Reduce | None = None) -> list[Deferred]:
    """`smallest_k` with every tensor's share of the k within `deviation` of k's fraction of all (`bounds`): the
    cheapest choice under those limits, since each tensor's costs are taken cheapest first. `deviation` 1 is one
    global threshold (sec. 3.3), 0 each tensor the same fraction (to one structure), its remainder by cost."""
    if deviation >= 1:
        return smallest_k(costs, k, backend, reduce)
    limits = bounds(k, [c.numel() for c in costs], deviation)
    clamped = [c if isinstance(c, Elsewhere) else _clamped(c, *limit, backend) for c, limit in zip(costs, limits)]
    return smallest_k(clamped, k, backend, reduce)


Masks = list[torch.Tensor]


def cheapest_prefix(costs: list[torch.Tensor], zeros: Callable[[list[torch.Tensor]], int], target_zeros: int,
                    what: str) -> list[torch.Tensor]:
    """Masks (True = chosen) of the shortest prefix of all `costs` in one order, cheapest first (ties in order),
    whose removal zeroes at least `target_zeros` weights as counted by `zeros(masks)` (sec. 3.3).

    `zeros` must not decrease as the prefix grows; the prefix is found by bisection. `what` names the
    structures in the error raised when even all of them do not reach the target.
    """
    flat = torch.cat([c.reshape(-1).double().cpu() for c in costs])
    order = torch.argsort(flat, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    ranks = list(rank.split([c.numel() for c in costs]))

    def chosen(prefix: int) -> list[torch.Tensor]:
        return [r < prefix for r in ranks]

    if target_zeros > zeros(chosen(flat.numel())):
        raise SurgeonError(f"cannot zero {target_zeros} weights by removing {what}")
    low, high = 0, flat.numel()
    while low < high:
        mid = (low + high) // 2
        if zeros(chosen(mid)) >= target_zeros:
            high = mid
        else:
            low = mid + 1
    return [m.reshape(c.shape).to(c.device) for m, c in zip(chosen(low), costs)]


def removed_weights(rows: Masks, cols: Masks) -> int:
    """Weights zeroed by removing `rows` and `cols` of each layer: RC − (R − p)(C − q)."""
    return sum(r.numel() * c.numel() - int((~r).sum()) * int((~c).sum()) for r, c in zip(rows, cols))


def structured_selection(
    row_costs: list[torch.Tensor], col_costs: list[torch.Tensor], target_zeros: int,
    extend: Callable[[Masks, Masks], tuple[Masks, Masks]] | None = None,
) -> tuple[Masks, Masks]:
    """Rows and columns to remove so that at least `target_zeros` weights are zero (sec. 3.3).

    Structures are taken cheapest first over all layers; a row of a layer with q removed
    columns newly removes C − q weights (and vice versa), so removing p rows and q columns of an
    R×C layer zeroes RC − (R−p)(C−q). `extend` adds what a choice removes along with it (dead
    channels, `surgeon.models.channels`), counted too. Returns the chosen structures (without the extension).
    """
    def zeros(masks: list[torch.Tensor]) -> int:
        rows, cols = masks[0::2], masks[1::2]
        if extend is not None:
            rows, cols = extend(rows, cols)
        return removed_weights(rows, cols)

    masks = cheapest_prefix([t for pair in zip(row_costs, col_costs) for t in pair], zeros, target_zeros,
                            "rows and columns")
    return masks[0::2], masks[1::2]


def nm_selection(costs: Sequence[Lazy], n: int, m: int, target_zeros: int, backend: str = "auto",
                 reduce: Reduce | None = None) -> list[Deferred]:
    """Element masks pruning the m−n cheapest weights of the cheapest groups over all layers (sec. 3.3, N:M).

    A group's cost is the sum of its m−n cheapest costs; one global τ over group costs. Every
    layer's columns must be a multiple of m (`prune` checks this up front, naming the layer). Like
    `smallest_k`, the masks (and the group costs) are `Deferred`, computed from each layer's costs
    (`reduce`: see `_select`).
    """
    def groups(c: Lazy) -> torch.Tensor:
        return ops.nm_select(materialise(c), n, m, backend)[0]

    def mask(c: Lazy, ties: int) -> torch.Tensor:
        group_costs, element_mask = ops.nm_select(materialise(c), n, m, backend)
        return _below(group_costs, tau, ties).repeat_interleave(m, dim=1) & element_mask

    group_costs = [Elsewhere(c.numel() // m, c.device) if isinstance(c, Elsewhere)
                   else Deferred(c.numel() // m, c.device, functools.partial(groups, c)) for c in costs]
    tau, ties = _select(group_costs, round(target_zeros / (m - n)), backend, reduce)
    return [Deferred(c.numel(), c.device, functools.partial(mask, c, t)) for c, t in zip(costs, ties)]
