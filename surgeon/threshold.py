"""Global thresholds: one τ over all layers (paper sec. 3.3, "dynamic allocation").

Every function picks exactly as many structures as reach the requested number of zero weights
(to within one structure), cheapest first, across layers of different shapes. Structures already
pruned carry cost −inf, so they are always kept pruned and count toward the target.
"""

from __future__ import annotations

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


def structured_selection(
    row_costs: list[torch.Tensor], col_costs: list[torch.Tensor], target_zeros: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Rows and columns to remove so that at least `target_zeros` weights are zero (sec. 3.3).

    Structures are taken cheapest first over all layers; a row of a layer with q removed
    columns newly removes C − q weights (and vice versa), so removing p rows and q columns of an
    R×C layer zeroes RC − (R−p)(C−q). The shortest prefix of the cost order that reaches the
    target is found by bisection, counting each layer's rows and columns in the prefix.
    """
    shapes = [(r.numel(), c.numel()) for r, c in zip(row_costs, col_costs)]
    flat = torch.cat([t.reshape(-1).double().cpu() for pair in zip(row_costs, col_costs) for t in pair])
    order = torch.argsort(flat, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    sorted_ranks, offset = [], 0
    for R, C in shapes:
        sorted_ranks.append((rank[offset : offset + R].sort().values, rank[offset + R : offset + R + C].sort().values))
        offset += R + C

    def zeros_after(prefix: int) -> int:
        bound = torch.tensor([prefix])
        total = 0
        for (R, C), (rows, cols) in zip(shapes, sorted_ranks):
            p = int(torch.searchsorted(rows, bound)) if R else 0
            q = int(torch.searchsorted(cols, bound)) if C else 0
            total += R * C - (R - p) * (C - q)
        return total

    if target_zeros > zeros_after(flat.numel()):
        raise SurgeonError(f"cannot zero {target_zeros} weights by removing rows and columns")
    low, high = 0, flat.numel()
    while low < high:
        mid = (low + high) // 2
        if zeros_after(mid) >= target_zeros:
            high = mid
        else:
            low = mid + 1
    row_masks, col_masks, offset = [], [], 0
    for (R, C), r, c in zip(shapes, row_costs, col_costs):
        row_masks.append((rank[offset : offset + R] < low).to(r.device))
        col_masks.append((rank[offset + R : offset + R + C] < low).to(c.device))
        offset += R + C
    return row_masks, col_masks


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
