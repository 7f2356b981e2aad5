"""Microbenchmarks: the inverse root U = L⁻ᵀ of a damped factor (structured shots), CPU.

    python -m pytest bench/kernels/bench_inverse_root.py --benchmark-only

`inverses.lower_inverse_` works in place by row blocks of GEMMs that skip the zero triangle, where the
plain way is one triangular solve against I (into a new matrix); `cholesky_inverse` (the full
inverse, what element shots use) is the third column. Each round gets a fresh copy of L. Fractions
are of the measured GEMM rate, counting n³/3 flops for a triangular inverse and 2n³/3 for
`cholesky_inverse` (the work they must do at least).
"""

from __future__ import annotations

import pytest
import torch

from surgeon.method import inverses
from surgeon.method.damping import damp

WAYS = {
    "row_blocks": inverses.lower_inverse_,
    "solve_triangular": lambda L: torch.linalg.solve_triangular(L, torch.eye(L.shape[0]), upper=False),
    "cholesky_inverse": torch.cholesky_inverse,
}


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("n", [576, 1536])
def test_lower_inverse(benchmark, roofline, n, way):
    x = torch.randn(n, 2 * n, generator=torch.Generator().manual_seed(0))
    L = torch.linalg.cholesky(damp(x @ x.T / (2 * n), 0.1))
    benchmark.pedantic(WAYS[way], setup=lambda: ((L.clone(),), {}), rounds=30)
    roofline(flops=(2 if way == "cholesky_inverse" else 1) * n**3 / 3)
