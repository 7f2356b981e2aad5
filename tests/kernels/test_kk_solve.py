"""kk_solve: every backend against a dense solve of each chunk, ragged and empty chunks, failures, batching."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import HAS_CPP_OPS, available_backends, ops
from surgeon_kernels.kk_solve import reference
from tests._helpers import random_spd
from tests._tolerances import FLOAT64, assert_within_reference_error

BACKENDS = available_backends("cpu", "kk_solve")


def problem(R: int, C: int, lengths: list[int], dtype: torch.dtype, seed: int):
    """Inverse factors, and chunks of the given lengths over random (row, col) pairs without repeats."""
    gen = torch.Generator().manual_seed(seed)
    G_inv, A_inv = random_spd(R, gen).to(dtype), random_spd(C, gen).to(dtype)
    flat = torch.randperm(R * C, generator=gen)[: sum(lengths)]
    rows, cols = flat // C, flat % C
    w = torch.randn(sum(lengths), generator=gen, dtype=torch.float64).to(dtype)
    offsets = torch.tensor([0] + lengths).cumsum(0)
    return G_inv, A_inv, rows, cols, w, offsets


def dense(G_inv, A_inv, rows, cols, w, offsets) -> torch.Tensor:
    """Each chunk's M_S built with kron(G⁻¹, A⁻¹) and solved in float64."""
    F_inv = torch.kron(G_inv.double(), A_inv.double())
    flat = rows * A_inv.shape[0] + cols
    u = torch.zeros(w.shape, dtype=torch.float64)
    for start, end in zip(offsets.tolist(), offsets.tolist()[1:]):
        k = flat[start:end]
        u[start:end] = torch.linalg.solve(F_inv[k][:, k], w[start:end].double())
    return u


@pytest.mark.parametrize("lengths", [[1], [5, 1, 7], [3, 0, 4, 0], [33, 17, 32, 1, 2], []], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_dense_solves(lengths, dtype, backend):
    G_inv, A_inv, rows, cols, w, offsets = problem(9, 11, lengths, dtype, seed=len(lengths))
    u, failed = ops.kk_solve(G_inv, A_inv, rows, cols, w, offsets, budget=200, backend=backend)
    assert u.dtype == dtype and u.shape == w.shape and failed.shape == (len(lengths),) and not failed.any()
    exact = dense(G_inv, A_inv, rows, cols, w, offsets)
    if dtype == torch.float64:
        torch.testing.assert_close(u.double(), exact, **FLOAT64)
    else:
        plain, _ = reference.kk_solve(G_inv, A_inv, rows, cols, w, offsets, budget=200)
        assert_within_reference_error(u, exact, plain)


@pytest.mark.parametrize("backend", BACKENDS)
def test_singular_chunk_is_flagged_and_left_zero(backend):
    _, _, rows, cols, w, offsets = problem(5, 4, [2, 3], torch.float64, seed=3)
    G_inv = torch.diag(torch.tensor([1.0, 2.0, 3.0, 4.0, -1.0], dtype=torch.float64))  # row 4: not positive
    A_inv = torch.eye(4, dtype=torch.float64)
    assert 4 in rows[2:].tolist() and 4 not in rows[:2].tolist()
    u, failed = ops.kk_solve(G_inv, A_inv, rows, cols, w, offsets, backend=backend)
    assert failed.tolist() == [False, True]
    assert torch.equal(u[2:], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(u[:2], dense(G_inv, A_inv, rows[:2], cols[:2], w[:2], offsets[:2]), **FLOAT64)


@pytest.mark.skipif(not HAS_CPP_OPS, reason="compiled ops not built")
def test_cpp_checks_its_arguments():
    G_inv, A_inv, rows, cols, w, offsets = problem(5, 4, [2, 3], torch.float64, seed=1)
    with pytest.raises(RuntimeError, match="offsets must run"):
        torch.ops.surgeon.kk_solve(G_inv, A_inv, rows, cols, w, offsets[:-1])
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ops.surgeon.kk_solve(G_inv, A_inv, rows + 5, cols, w, offsets)
    with pytest.raises(RuntimeError, match="one dtype"):
        torch.ops.surgeon.kk_solve(G_inv, A_inv.float(), rows, cols, w, offsets)
    torch.library.opcheck(torch.ops.surgeon.kk_solve.default, (G_inv, A_inv, rows, cols, w, offsets))


@pytest.mark.parametrize("seed", range(4))
def test_chunk_batches_bound_padding_and_budget(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 300, (60,), generator=gen).tolist() + [7, 7, 7]
    budget = 300 * 300 * 4
    batches = reference.chunk_batches(lengths, budget)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    padded = 0
    for batch in batches:
        top = max(lengths[i] for i in batch)
        assert all(lengths[i] >= reference.PAD_RATIO * top for i in batch)
        assert len(batch) == 1 or len(batch) * top * top <= budget
        padded += sum(top * top - lengths[i] ** 2 for i in batch)
    assert padded <= (1 - reference.PAD_RATIO**2) * sum(k * k for k in lengths)


def test_chunk_batches_in_arrival_order_would_pad_more():
    """The reason for sorting: long and short chunks alternating would otherwise share batches."""
    lengths = [200, 10] * 8
    batches = reference.chunk_batches(lengths, 1 << 30)
    assert sorted(map(sorted, batches)) == [list(range(0, 16, 2)), list(range(1, 16, 2))]
    assert reference.chunk_batches([500], 10) == [[0]]  # a chunk over the budget is solved alone
