"""Triton kernel: one byte histogram of the radix selection (see `radix.py`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from surgeon_kernels._triton import autotune_configs
from surgeon_kernels.deferred import Lazy
from surgeon_kernels.kth_smallest import radix

CONFIGS = autotune_configs([dict(BLOCK=4096, num_warps=8), dict(BLOCK=16384, num_warps=16)],
                           test=dict(BLOCK=1024, num_warps=1))


@triton.autotune(configs=CONFIGS, key=[], reset_to_zero=["hist_ptr"])
@triton.jit
def _byte_histogram_kernel(x_ptr, hist_ptr, n, prefix, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """hist[b] += #{i: byte SHIFT of key(x_i) = b and key(x_i) >> (SHIFT + 8) = prefix}."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    bits = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
    bits = bits & 0xFFFFFFFF
    keys = tl.where(bits >= 0x80000000, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    if SHIFT < 24:
        ok = ok & ((keys >> (SHIFT + 8)) == prefix)
    digits = ((keys >> SHIFT) & 0xFF).to(tl.int32)
    counts = tl.histogram(digits, 256, mask=ok)
    tl.atomic_add(hist_ptr + tl.arange(0, 256), counts)


def byte_histogram(x: torch.Tensor, prefix: int, shift: int) -> torch.Tensor:
    """Counts [256] of byte `shift` of the keys of x whose higher bits equal `prefix` (Triton)."""
    x = x.reshape(-1).contiguous()
    hist = torch.zeros(256, dtype=torch.int32, device=x.device)
    grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)  # noqa: E731
    _byte_histogram_kernel[grid](x, hist, x.numel(), prefix, SHIFT=shift)
    return hist.cpu()


def kth_smallest(values: Sequence[Lazy], k: int, reduce: radix.Reduce | None = None) -> float:
    """The k-th smallest (1-based) of all elements of `values` together, histograms in Triton (`reduce`: see
    `radix.kth_smallest`)."""
    return radix.kth_smallest(values, k, byte_histogram, reduce)
