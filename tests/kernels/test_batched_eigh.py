"""batched_eigh: every backend against torch.linalg.eigh; reconstruction, orthogonality, warm start."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import available_backends, ops
from tests._tolerances import FLOAT64, assert_within_reference_error

CASES = [
    pytest.param(2, 1, id="B2-n1"),
    pytest.param(3, 2, id="B3-n2"),
    pytest.param(2, 7, id="B2-n7-odd"),
    pytest.param(1, 12, id="B1-n12"),
    pytest.param(0, 4, id="B0-empty"),
]


def symmetric(B: int, n: int, dtype, seed: int) -> torch.Tensor:
    x = torch.randn(B, n, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return x + x.mT


def check(A, values, vectors):
    """Eigenvalues, orthogonality and reconstruction against float64: to `FLOAT64` in float64, in float32 within
    2× the error of `torch.linalg.eigh` in float32 (tests/_tolerances.py)."""
    n = A.shape[1]
    exact = torch.linalg.eigvalsh(A.double())
    eye = torch.eye(n, dtype=torch.float64).expand_as(A)
    ref_values, ref_vectors = torch.linalg.eigh(A)
    def rebuilt(values: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        return vectors @ torch.diag_embed(values) @ vectors.mT

    pairs = [(values, ref_values, exact), (vectors.mT @ vectors, ref_vectors.mT @ ref_vectors, eye),
             (rebuilt(values, vectors), rebuilt(ref_values, ref_vectors), A.double())]
    for got, reference, expected in pairs:
        if A.dtype == torch.float64:
            torch.testing.assert_close(got, expected, **FLOAT64)
        else:
            assert_within_reference_error(got, expected, reference)


@pytest.mark.parametrize("B,n", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("backend", available_backends("cpu", "batched_eigh"))
def test_matches_eigh(B, n, dtype, backend):
    A = symmetric(B, n, dtype, seed=B * 10 + n)
    values, vectors = ops.batched_eigh(A, backend=backend)
    check(A, values, vectors)


@pytest.mark.parametrize("backend", available_backends("cpu", "batched_eigh"))
def test_warm_start_from_nearby_matrix(backend):
    A = symmetric(2, 9, torch.float64, seed=1)
    _, Q0 = torch.linalg.eigh(A)
    moved = A + 1e-3 * symmetric(2, 9, torch.float64, seed=2)  # the next shot's factor
    values, vectors = ops.batched_eigh(moved, Q0, backend=backend)
    check(moved, values, vectors)


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
    assert_within_reference_error(warm.sort(-1).values, exact, torch.linalg.eigvalsh(moved))
    assert float((cold.double().sort(-1).values - exact).abs().max()) > 1e-2 * scale


def test_repeated_eigenvalues():
    A = torch.diag_embed(torch.tensor([[2.0, 2.0, 1.0, 2.0]], dtype=torch.float64))
    for backend in available_backends("cpu", "batched_eigh"):
        values, vectors = ops.batched_eigh(A, backend=backend)
        check(A, values, vectors)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"\[B, n, n\]"):
        ops.batched_eigh(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="Q0"):
        ops.batched_eigh(torch.zeros(1, 3, 3), torch.zeros(1, 2, 2))


@pytest.mark.requires_cuda
def test_cuda_triton_matches_eigh(cuda_device):
    """At the widths `auto` runs Jacobi for on CUDA (ops.JACOBI_WIDTHS)."""
    A = symmetric(6, ops.JACOBI_WIDTHS.stop - 1, torch.float32, seed=3)
    values, vectors = ops.batched_eigh(A.to(cuda_device), backend="triton")
    check(A, values.cpu(), vectors.cpu())
