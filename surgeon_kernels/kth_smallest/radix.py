"""Exact k-th smallest over many tensors by radix selection on order-preserving float keys.

A float32 x maps to a 32-bit key whose unsigned order is the order of x (flip every bit of a
negative number, only the sign bit of a positive one). Four passes each count one byte of the
keys (256 bins) among the elements whose higher bytes equal the prefix found so far, and pick
the bin holding the k-th element: 4 reads of the costs, no concatenation, no sort. The byte
histogram is the only backend-specific piece (Triton on CUDA, `torch.bincount` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from surgeon_kernels.deferred import Lazy, materialise

Histogram = Callable[[torch.Tensor, int, int], torch.Tensor]
Reduce = Callable[[torch.Tensor], torch.Tensor]


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving unsigned keys of float32 values, held in int64 (NaN-free input)."""
    bits = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    negative = bits >= 0x80000000
    return torch.where(negative, bits ^ 0xFFFFFFFF, bits | 0x80000000)


def key_to_float(key: int) -> float:
    """Inverse of `order_keys` for one key."""
    bits = key ^ 0x80000000 if key >= 0x80000000 else key ^ 0xFFFFFFFF
    return float(torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32))


def torch_histogram(x: torch.Tensor, prefix: int, shift: int) -> torch.Tensor:
    """Counts [256] of byte `shift` of the keys of x whose bits above `shift + 8` equal `prefix`."""
    keys = order_keys(x.reshape(-1))
    if shift < 24:
        keys = keys[(keys >> (shift + 8)) == prefix]
    return torch.bincount((keys >> shift) & 0xFF, minlength=256).cpu()


def kth_smallest(values: Sequence[Lazy], k: int, histogram: Histogram = torch_histogram,
                 reduce: Reduce | None = None) -> float:
    """The k-th smallest (1-based) of all elements of `values` together (a `Deferred` is computed once per pass).

    `reduce` sums each pass's histogram [256] (int64, CPU) with those of the other processes that hold
    the rest of the values (torch.distributed): k then counts over all of them, and every process
    returns the same value.
    """
    total = sum(v.numel() for v in values)
    if reduce is None and not 1 <= k <= total:
        raise ValueError(f"k={k}: must be in [1, {total}]")
    prefix = 0
    for shift in (24, 16, 8, 0):
        counts = sum((histogram(materialise(v), prefix, shift).to(torch.int64) for v in values if v.numel()),
                     torch.zeros(256, dtype=torch.int64))
        if reduce is not None:
            counts = reduce(counts)
        cumulative = counts.cumsum(0)
        digit = int(torch.searchsorted(cumulative, torch.tensor(k)))
        k -= int(cumulative[digit - 1]) if digit else 0
        prefix = (prefix << 8) | digit
    return key_to_float(prefix)
