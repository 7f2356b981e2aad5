"""Global thresholds: one τ over all layers (paper sec. 3.3, "dynamic allocation").

Every function picks exactly as many structures as reach the requested number of zero weights
(to within one structure), cheapest first, across layers of different shapes. Structures already
pruned carry cost −inf, so they are always kept pruned and count toward the target.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from surgeon.errors import SurgeonError
from surgeon_kernels import ops


def smallest_k(costs: list[torch.Tensor], k: int, backend: str = "auto") -> list[torch.Tensor]:
    """Masks (same shapes as `costs`) selecting the k smallest costs over all tensors together.

    τ is the k-th smallest cost by selection, never a full sort (`surgeon_kernels.ops.kth_smallest`);
    every cost below τ is taken, then ties at τ in order until k.
    """
    total = sum(c.numel() for c in costs)
    if not 0 <= k <= total:
        raise SurgeonError(f"cannot select {k} of {total} structures")
    if k == 0:
        return [torch.zeros_like(c, dtype=torch.bool) for c in costs]
    costs = [c.float() for c in costs]
    tau = ops.kth_smallest(costs, k, backend)
    masks = [c < tau for c in costs]
    missing = k - sum(int(m.sum()) for m in masks)
    for c, mask in zip(costs, masks):
        if missing <= 0:
            break
        ties = (c == tau).reshape(-1).nonzero().squeeze(1)[:missing]
        mask.view(-1)[ties] = True
        missing -= ties.numel()
    return masks


Masks = list[torch.Tensor]


def structured_selection(
    row_costs: list[torch.Tensor], col_costs: list[torch.Tensor], target_zeros: int,
    extend: Optional[Callable[[Masks, Masks], tuple[Masks, Masks]]] = None,
) -> tuple[Masks, Masks]:
    """Rows and columns to remove so that at least `target_zeros` weights are zero (sec. 3.3).

    Structures are taken cheapest first over all layers; a row of a layer with q removed
    columns newly removes C − q weights (and vice versa), so removing p rows and q columns of an
    R×C layer zeroes RC − (R−p)(C−q). `extend` adds what a choice removes along with it (dead
    channels, `surgeon.channels`), counted too. The shortest prefix of the cost order that reaches
    the target is found by bisection. Returns the chosen structures (without the extension).
    """
    shapes = [(r.numel(), c.numel()) for r, c in zip(row_costs, col_costs)]
    flat = torch.cat([t.reshape(-1).double().cpu() for pair in zip(row_costs, col_costs) for t in pair])
    order = torch.argsort(flat, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    row_ranks, col_ranks, offset = [], [], 0
    for R, C in shapes:
        row_ranks.append(rank[offset : offset + R])
        col_ranks.append(rank[offset + R : offset + R + C])
        offset += R + C

    def chosen(prefix: int) -> tuple[Masks, Masks]:
        return [r < prefix for r in row_ranks], [c < prefix for c in col_ranks]

    def zeros_after(prefix: int) -> int:
        rows, cols = chosen(prefix)
        if extend is not None:
            rows, cols = extend(rows, cols)
        return sum(R * C - (R - int(r.sum())) * (C - int(c.sum())) for (R, C), r, c in zip(shapes, rows, cols))

    if target_zeros > zeros_after(flat.numel()):
        raise SurgeonError(f"cannot zero {target_zeros} weights by removing rows and columns")
    low, high = 0, flat.numel()
    while low < high:
        mid = (low + high) // 2
        if zeros_after(mid) >= target_zeros:
            high = mid
        else:
            low = mid + 1
    rows, cols = chosen(low)
    return [m.to(r.device) for m, r in zip(rows, row_costs)], [m.to(c.device) for m, c in zip(cols, col_costs)]


def nm_selection(costs: list[torch.Tensor], n: int, m: int, target_zeros: int, backend: str = "auto") -> list[torch.Tensor]:
    """Element masks pruning the m−n cheapest weights of the cheapest groups over all layers (sec. 3.3, N:M).

    A group's cost is the sum of its m−n cheapest costs; one global τ over group costs. Every
    layer's columns must be a multiple of m (`prune` checks this up front, naming the layer).
    """
    grouped = [ops.nm_select(c, n, m, backend) for c in costs]
    groups = smallest_k([g for g, _ in grouped], round(target_zeros / (m - n)), backend)
    return [
        (chosen.repeat_interleave(m, dim=1) & element_mask)
        for chosen, (_, element_mask) in zip(groups, grouped)
    ]
