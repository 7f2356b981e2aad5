"""Plain-PyTorch reference of the global threshold selection."""

from collections.abc import Sequence

import torch

from surgeon_kernels.deferred import Lazy, materialise


def kth_smallest(values: Sequence[Lazy], k: int) -> float:
    """The k-th smallest (1-based) of all elements of `values` together (one global τ, sec. 3.3).

    `torch.kthvalue` of their concatenation, filled in place (each `Deferred` computed once).
    """
    flat = torch.empty(sum(v.numel() for v in values), dtype=torch.float32)
    offset = 0
    for value in values:
        n = value.numel()
        if n:
            flat[offset:offset + n] = materialise(value).reshape(-1)
        offset += n
    return float(torch.kthvalue(flat, k).values)
