"""Plain-PyTorch reference of the global threshold selection."""

import torch


def kth_smallest(values: list[torch.Tensor], k: int) -> float:
    """The k-th smallest (1-based) of all elements of `values` together (one global τ, sec. 3.3)."""
    return float(torch.kthvalue(torch.cat([v.reshape(-1).float().cpu() for v in values]), k).values)
