"""Microbenchmarks: the K×K gather at K = 2000, and one layer's correlated update at 50% (CPU).

    python -m pytest bench/kernels/bench_kk_solve.py --benchmark-only

The gather is memory-bound (fraction of the measured copy bandwidth, counting the bytes of M
written and of the two factor entries read per element). The whole-layer update compares the exact
joint solve (conjugate gradients, two GEMMs per iteration) with chunked K×K solves (gather +
batched Cholesky) at two chunk sizes, by time only (their flop counts differ by construction).
"""

from __future__ import annotations

import pytest
import torch

from surgeon.method import costs, updates
from surgeon.method.damping import damp
from surgeon.method.inverses import KroneckerInverse
from surgeon_kernels import ops


def _problem(R: int, C: int):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(R, 2 * R, generator=gen)
    y = torch.randn(C, 2 * C, generator=gen)
    G = damp(x @ x.T / (2 * R), 0.01)
    A = damp(y @ y.T / (2 * C), 0.01)
    W = torch.randn(R, C, generator=gen)
    f = KroneckerInverse.of(G, A)
    element = costs.element_costs(W, f)
    mask = element <= element.flatten().kthvalue(W.numel() // 2).values
    return W, f, mask


@pytest.mark.parametrize("max_correlate", [None, 64, 576], ids=lambda m: f"m{m or 'all-cg'}")
def test_unstructured_update(benchmark, roofline, max_correlate):
    R, C = 576, 1536
    W, f, mask = _problem(R, C)
    semantics = "independent"
    benchmark.pedantic(updates.unstructured, args=(W, f, mask, max_correlate, semantics), rounds=3)


@pytest.mark.parametrize("chunks", [1, 4])
def test_kk_gather(benchmark, roofline, chunks):
    K = 2000
    W, f, mask = _problem(576, 1536)
    r, c = mask.nonzero(as_tuple=True)
    rows, cols = r[: chunks * K].reshape(chunks, K), c[: chunks * K].reshape(chunks, K)
    valid = torch.ones(chunks, K, dtype=torch.bool)
    benchmark(ops.kk_gather, f.G, f.A, rows, cols, valid, "torch")
    roofline(bytes=3 * 4 * chunks * K * K)
