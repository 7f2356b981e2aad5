"""Microbenchmark: Kronecker-factor accumulation per backend at LLM shapes (pytest-benchmark, CPU).

    python -m pytest bench/bench_kfac_accumulate.py --benchmark-only

Achieved GFLOP/s counts the full product (2·N·C² flops) for every backend, so the symmetric
kernels, which compute only half, show their saving as a higher rate.
"""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import available_backends, ops

SHAPES = {"smollm2-576": (512, 576), "smollm2-1536": (512, 1536)}


@pytest.mark.parametrize("backend", available_backends("cpu"))
@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
def test_kfac_accumulate(benchmark, shape, backend):
    tokens, width = SHAPES[shape]
    x = torch.randn(tokens, width)
    out = torch.zeros(width, width)
    benchmark(ops.kfac_accumulate, out, x, 1.0, False, backend)
    seconds = benchmark.stats.stats.median
    benchmark.extra_info["gflops"] = 2 * tokens * width**2 / seconds / 1e9
