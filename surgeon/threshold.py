"""Global thresholds: one τ over all layers (paper sec. 3.3, "dynamic allocation").

Every function picks exactly as many structures as reach the requested number of zero weights
(to within one structure), cheapest first, across layers of different shapes. Structures already
pruned carry cost −inf, so they are always kept pruned and count toward the target.
"""

from __future__ import annotations

import torch

from surgeon.errors import SurgeonError


def smallest_k(costs: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """Masks (same shapes as `costs`) selecting the k smallest costs over all tensors together.

    Uses selection (`kthvalue`), not a full sort; ties at the threshold are taken in order.
    """
    flat = torch.cat([c.reshape(-1).float().cpu() for c in costs])
    total = flat.numel()
    if not 0 <= k <= total:
        raise SurgeonError(f"cannot select {k} of {total} structures")
    if k == 0:
        return [torch.zeros_like(c, dtype=torch.bool) for c in costs]
    tau = torch.kthvalue(flat, k).values
    chosen = flat < tau
    ties = (flat == tau).nonzero().squeeze(1)
    chosen[ties[: k - int(chosen.sum())]] = True
    masks, offset = [], 0
    for c in costs:
        masks.append(chosen[offset : offset + c.numel()].reshape(c.shape).to(c.device))
        offset += c.numel()
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


def nm_group_costs(costs: torch.Tensor, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of m consecutive weights of a row: the cost of its m−n cheapest, and which they are.

    Returns (group_costs [R, C/m], element mask [R, C] of the m−n cheapest of every group).
    """
    R, C = costs.shape
    if C % m:
        raise SurgeonError(f"N:M with M={m} does not divide the {C} input columns of a layer")
    groups = costs.reshape(R, C // m, m)
    cheapest = groups.topk(m - n, dim=2, largest=False)
    element_mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, cheapest.indices, True)
    return cheapest.values.sum(2), element_mask.reshape(R, C)


def nm_selection(costs: list[torch.Tensor], n: int, m: int, target_zeros: int) -> list[torch.Tensor]:
    """Element masks pruning m−n weights in the cheapest groups over all layers (sec. 3.3, N:M)."""
    grouped = [nm_group_costs(c, n, m) for c in costs]
    groups = smallest_k([g for g, _ in grouped], round(target_zeros / (m - n)))
    return [
        (chosen.repeat_interleave(m, dim=1) & element_mask)
        for chosen, (_, element_mask) in zip(groups, grouped)
    ]
