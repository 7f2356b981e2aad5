"""batched_eigh: every backend against torch.linalg.eigh; reconstruction, orthogonality, warm start."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import available_backends, ops

CASES = [
    pytest.param(2, 1, id="B2-n1"),
    pytest.param(3, 2, id="B3-n2"),
    pytest.param(2, 7, id="B2-n7-odd"),
    pytest.param(1, 12, id="B1-n12"),
    pytest.param(0, 4, id="B0-empty"),
]
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def symmetric(B: int, n: int, dtype, seed: int) -> torch.Tensor:
    x = torch.randn(B, n, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return x + x.mT


def check(A, values, vectors, dtype):
    """Backward-stable accuracy: errors within max(TOL, 4·n·eps)·‖A‖₂ (the O(n·eps·‖A‖) bound)."""
    expected = torch.linalg.eigvalsh(A.double())
    n = A.shape[1]
    norm = max(1.0, float(expected.abs().max())) if A.numel() else 1.0
    tol = max(TOL[dtype], 4 * n * torch.finfo(dtype).eps)
    torch.testing.assert_close(values, expected.to(dtype), rtol=0, atol=tol * norm)
    eye = torch.eye(n, dtype=dtype).expand_as(A)
    torch.testing.assert_close(vectors.mT @ vectors, eye, rtol=0, atol=tol * 10)
    torch.testing.assert_close(vectors @ torch.diag_embed(values) @ vectors.mT, A, rtol=0, atol=tol * norm * 10)


@pytest.mark.parametrize("B,n", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("backend", available_backends("cpu", "batched_eigh"))
def test_matches_eigh(B, n, dtype, backend):
    A = symmetric(B, n, dtype, seed=B * 10 + n)
    values, vectors = ops.batched_eigh(A, backend=backend)
    check(A, values, vectors, dtype)


@pytest.mark.parametrize("backend", available_backends("cpu", "batched_eigh"))
def test_warm_start_from_nearby_matrix(backend):
    A = symmetric(2, 9, torch.float64, seed=1)
    _, Q0 = torch.linalg.eigh(A)
    moved = A + 1e-3 * symmetric(2, 9, torch.float64, seed=2)  # the next shot's factor
    values, vectors = ops.batched_eigh(moved, Q0, backend=backend)
    check(moved, values, vectors, torch.float64)


@pytest.mark.skipif("triton" not in available_backends("cpu", "batched_eigh"), reason="needs the Triton kernel")
def test_warm_start_converges_in_one_sweep_where_a_cold_start_does_not():
    """Rotated into the previous eigenvectors, a nearby matrix is nearly diagonal: one Jacobi sweep suffices."""
    from surgeon_kernels.batched_eigh import kernel

    A = symmetric(2, 9, torch.float32, seed=1)
    _, Q0 = torch.linalg.eigh(A)
    moved = A + 1e-3 * symmetric(2, 9, torch.float32, seed=2)
    exact = torch.linalg.eigvalsh(moved.double())
    warm, _ = kernel.batched_eigh(moved, Q0, max_sweeps=1)
    cold, _ = kernel.batched_eigh(moved, None, max_sweeps=1)
    scale = float(exact.abs().max())
    assert float((warm.double().sort(-1).values - exact).abs().max()) < 1e-5 * scale
    assert float((cold.double().sort(-1).values - exact).abs().max()) > 1e-2 * scale


def test_repeated_eigenvalues():
    A = torch.diag_embed(torch.tensor([[2.0, 2.0, 1.0, 2.0]], dtype=torch.float64))
    for backend in available_backends("cpu", "batched_eigh"):
        values, vectors = ops.batched_eigh(A, backend=backend)
        check(A, values, vectors, torch.float64)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"\[B, n, n\]"):
        ops.batched_eigh(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="Q0"):
        ops.batched_eigh(torch.zeros(1, 3, 3), torch.zeros(1, 2, 2))


@pytest.mark.requires_cuda
def test_cuda_triton_matches_eigh(cuda_device):
    A = symmetric(6, 129, torch.float32, seed=3)
    values, vectors = ops.batched_eigh(A.to(cuda_device), backend="triton")
    check(A, values.cpu(), vectors.cpu(), torch.float32)
