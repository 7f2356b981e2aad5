"""Measured ceilings for roofline fractions: dense GEMM FLOP/s and copy bandwidth of this machine.

Both are measured, not looked up: the GEMM rate with torch.matmul at 2048³ in float32 on the CPU,
8192³ in bfloat16 on a GPU (smaller products do not fill it), the bandwidth as a large tensor copy
(read + write bytes). Cached per process.
"""

from __future__ import annotations

import functools
import time

import torch


def _time(fn, repeat: int = 5) -> float:
    """Median seconds of `fn()` (GPU: synchronised), after one warm-up call."""
    fn()
    samples = []
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


@functools.cache
def gemm_flops(device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """Measured dense GEMM rate (FLOP/s) at n³: n = 2048 on the CPU, 8192 on a GPU."""
    n = 8192 if torch.device(device).type == "cuda" else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / _time(lambda: a @ a)


@functools.cache
def copy_bandwidth(device: str = "cpu") -> float:
    """Measured copy bandwidth (bytes/s, read + write) of a 256 MiB float32 tensor."""
    src = torch.randn(64 << 20, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _time(lambda: dst.copy_(src))
