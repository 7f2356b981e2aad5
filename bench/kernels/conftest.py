"""Benchmark helpers: record roofline fractions and the machine with every pytest-benchmark result."""

from __future__ import annotations

import platform

import pytest
import torch

from bench.kernels import _roofline


@pytest.fixture
def roofline(benchmark):
    """`roofline(flops=…, bytes=…)` stores achieved rates and fractions of the measured ceilings."""

    def record(flops: float = 0.0, bytes: float = 0.0, device: str = "cpu") -> None:
        if benchmark.stats is None:  # --benchmark-disable: the function ran once, untimed
            return
        seconds = benchmark.stats.stats.median
        info = benchmark.extra_info
        info["machine"] = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
        if flops:
            info["gflops"] = flops / seconds / 1e9
            info["gemm_fraction"] = flops / seconds / _roofline.gemm_flops(device)
        if bytes:
            info["gbytes_per_s"] = bytes / seconds / 1e9
            info["bandwidth_fraction"] = bytes / seconds / _roofline.copy_bandwidth(device)

    return record
