"""Microbenchmark: Kronecker-factor accumulation per backend at LLM shapes (pytest-benchmark, CPU).

    python -m pytest bench/kernels/bench_kfac_accumulate.py --benchmark-only

The rate counts the full product (2·N·C² flops) for every backend, so the symmetric kernels,
which compute only the upper-triangle tiles of the packed factor, show their saving as a higher
rate (the torch reference computes the full product and packs it); the fraction is of the measured
float32 GEMM rate (bench/kernels/_roofline.py).
"""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import available_backends, ops
from surgeon_kernels.symmetric import PackedSymmetric

SHAPES = {"smollm2-576": (512, 576), "smollm2-1536": (512, 1536), "llama2-7b-4096": (2048, 4096)}


@pytest.mark.parametrize("backend", [b for b in available_backends("cpu") if b != "triton"])
@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
def test_kfac_accumulate(benchmark, roofline, shape, backend):
    tokens, width = SHAPES[shape]
    x = torch.randn(tokens, width)
    out = PackedSymmetric.zeros(width)
    benchmark(ops.kfac_accumulate, out, x, 1.0, False, backend)
    roofline(flops=2 * tokens * width**2)


# The factors one SmolLM2 block adds per pass: A of q/k/v, o, gate/up, down; G of every layer.
BLOCK_WIDTHS = [576, 576, 576, 1536, 576, 192, 192, 576, 1536, 1536, 576]


@pytest.mark.parametrize("grouped", [False, True], ids=["one-call-per-factor", "one-group"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", [b for b in available_backends("cpu") if b != "triton"])
def test_kfac_accumulate_block(benchmark, roofline, backend, dtype, grouped):
    """A SmolLM2 block's eleven factors at 512 tokens: separate calls against one grouped call."""
    xs = [torch.randn(512, w).to(dtype) for w in BLOCK_WIDTHS]
    outs = [PackedSymmetric.zeros(w) for w in BLOCK_WIDTHS]
    biases = [False] * len(xs)

    def separate() -> None:
        for out, x in zip(outs, xs):
            ops.kfac_accumulate(out, x, 1.0, False, backend)

    benchmark(lambda: ops.kfac_accumulate_group(outs, xs, 1.0, biases, backend) if grouped else separate())
    roofline(flops=sum(2 * 512 * w**2 for w in BLOCK_WIDTHS))
