"""kk_gather: every backend against the reference and against an explicit kron(G⁻¹, A⁻¹) block."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import available_backends, ops
from surgeon_kernels.kk_gather import reference

CASES = [
    pytest.param(1, 1, 3, 4, id="B1-K1"),
    pytest.param(3, 5, 6, 7, id="B3-K5"),
    pytest.param(4, 19, 11, 13, id="B4-K19-odd"),
    pytest.param(2, 70, 9, 11, id="B2-K70-two-tiles-ragged"),
    pytest.param(2, 0, 3, 3, id="K0-empty-chunks"),
]


def test_reference_equals_kronecker_block():
    gen = torch.Generator().manual_seed(0)
    G, A = torch.randn(4, 4, generator=gen, dtype=torch.float64), torch.randn(5, 5, generator=gen, dtype=torch.float64)
    rows, cols = torch.tensor([[0, 2, 3]]), torch.tensor([[4, 1, 1]])
    M = reference.kk_gather(G, A, rows, cols, torch.ones(1, 3, dtype=torch.bool))
    flat = rows[0] * 5 + cols[0]
    assert torch.equal(M[0], torch.kron(G, A)[flat][:, flat])


@pytest.mark.parametrize("B,K,R,C", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("backend", available_backends("cpu", "kk_gather"))
def test_matches_reference(B, K, R, C, dtype, backend):
    gen = torch.Generator().manual_seed(B * 100 + K)
    G, A = torch.randn(R, R, generator=gen, dtype=dtype), torch.randn(C, C, generator=gen, dtype=dtype)
    rows, cols = torch.randint(0, R, (B, K), generator=gen), torch.randint(0, C, (B, K), generator=gen)
    lengths = torch.randint(0, K + 1, (B,), generator=gen)
    valid = torch.arange(K).unsqueeze(0) < lengths.unsqueeze(1)
    M = ops.kk_gather(G, A, rows, cols, valid, backend)
    assert torch.equal(M, reference.kk_gather(G, A, rows, cols, valid))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="one \\[B, K\\] shape"):
        ops.kk_gather(torch.eye(2), torch.eye(2), torch.zeros(1, 2, dtype=torch.long),
                      torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))


@pytest.mark.requires_cuda
def test_cuda_triton_matches_reference(cuda_device):
    gen = torch.Generator().manual_seed(0)
    G, A = torch.randn(577, 577, generator=gen), torch.randn(1537, 1537, generator=gen)
    rows, cols = torch.randint(0, 577, (3, 257), generator=gen), torch.randint(0, 1537, (3, 257), generator=gen)
    valid = torch.arange(257).unsqueeze(0) < torch.tensor([[257], [100], [1]])
    M = ops.kk_gather(G.to(cuda_device), A.to(cuda_device), rows.to(cuda_device), cols.to(cuda_device),
                      valid.to(cuda_device), "triton")
    assert torch.equal(M.cpu(), reference.kk_gather(G, A, rows, cols, valid))
