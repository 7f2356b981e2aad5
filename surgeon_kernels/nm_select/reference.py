"""Plain-PyTorch reference of the N:M group selection."""

import torch


def nm_select(costs: torch.Tensor, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group of m consecutive costs of a row: the m−n cheapest (ties: lower index first).

    Args:
        costs: [R, C] element costs, C a multiple of m.
        n: weights kept per group; m: group size.
    Returns:
        (group_costs [R, C/m], the sum of each group's m−n cheapest costs;
         mask [R, C], True on those m−n cheapest elements).
    """
    R, C = costs.shape
    groups = costs.reshape(R, C // m, m)
    order = groups.sort(dim=2, stable=True).indices[..., : m - n]
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, order, True)
    return groups.gather(2, order).sum(2), mask.reshape(R, C)
