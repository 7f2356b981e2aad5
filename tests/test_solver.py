"""surgeon.method.solver and .updates against the closed form of eqs. 4-5 built with explicit kron(G, A)."""

from __future__ import annotations

import pytest
import torch

from surgeon.method import solver, updates
from surgeon.method.inverses import KroneckerInverse
from surgeon_kernels import available_backends
from tests._helpers import SHAPES, closed_form, problem
from tests._tolerances import FLOAT32, FLOAT64, assert_within_reference_error


@pytest.mark.parametrize("R,C", SHAPES)
def test_costs_match_closed_form(R, C, gen):
    W, G, A = problem(R, C, gen)
    elements = solver.element_costs(W, G, A)
    rows = solver.row_costs(W, G, A)
    cols = solver.col_costs(W, G, A)
    for r in range(R):
        for c in range(C):
            mask = torch.zeros(R, C, dtype=torch.bool)
            mask[r, c] = True
            torch.testing.assert_close(elements[r, c], closed_form(W, G, A, mask)[1], **FLOAT64)
    for r in range(R):
        mask = torch.zeros(R, C, dtype=torch.bool)
        mask[r] = True
        torch.testing.assert_close(rows[r], closed_form(W, G, A, mask)[1], **FLOAT64)
    for c in range(C):
        mask = torch.zeros(R, C, dtype=torch.bool)
        mask[:, c] = True
        torch.testing.assert_close(cols[c], closed_form(W, G, A, mask)[1], **FLOAT64)


def test_costs_hand_computed():
    W = torch.tensor([[2.0, 0.0], [1.0, 3.0]], dtype=torch.float64)
    G = torch.diag(torch.tensor([2.0, 4.0], dtype=torch.float64))
    A = torch.eye(2, dtype=torch.float64)
    # [G⁻¹]_rr = 1/2, 1/4; element cost ½ W² · G_rr A_cc (diagonal factors)
    expected = 0.5 * W.square() * torch.tensor([[2.0], [4.0]], dtype=torch.float64)
    torch.testing.assert_close(solver.element_costs(W, G, A), expected, **FLOAT64)
    torch.testing.assert_close(solver.row_costs(W, G, A), torch.tensor([4.0, 20.0], dtype=torch.float64), **FLOAT64)


@pytest.mark.parametrize("R,C", SHAPES + [pytest.param(6, 9, id="R6-C9")])
@pytest.mark.parametrize("n_rows,n_cols", [(1, 0), (0, 2), (2, 1), (1, 1)])
def test_structured_joint_equals_closed_form(R, C, n_rows, n_cols, gen):
    if n_rows >= R or n_cols >= C:
        pytest.skip("would remove every row or every column: nothing is left to update")
    W, G, A = problem(R, C, gen)
    rows = torch.randperm(R, generator=gen)[:n_rows]
    cols = torch.randperm(C, generator=gen)[:n_cols]
    mask = torch.zeros(R, C, dtype=torch.bool)
    mask[rows] = True
    mask[:, cols] = True
    expected, _ = closed_form(W, G, A, mask)
    new = solver.structured_update(W, G, A, rows, cols)
    torch.testing.assert_close(new, expected.masked_fill(mask, 0.0), **FLOAT64)
    assert (new[mask] == 0).all()


def test_structured_empty_selection_is_identity(gen):
    W, G, A = problem(4, 5, gen)
    empty = torch.empty(0, dtype=torch.long)
    torch.testing.assert_close(solver.structured_update(W, G, A, empty, empty), W, **FLOAT64)


@pytest.mark.parametrize("seed", range(5))
def test_joint_never_worse_than_within(seed):
    gen = torch.Generator().manual_seed(seed)
    W, G, A = problem(9, 11, gen)
    rows, cols = torch.tensor([1, 4]), torch.tensor([0, 3, 7])
    f = KroneckerInverse.of(G, A)
    joint = updates.structured(W, f, rows, cols, "joint")
    within = updates.structured(W, f, rows, cols, "within")
    loss_joint = solver.quadratic_loss(joint - W, G, A)
    loss_within = solver.quadratic_loss(within - W, G, A)
    assert loss_joint <= loss_within * (1 + FLOAT64["rtol"])
    assert not torch.allclose(joint, within)  # the two really differ when both rows and columns go


def test_within_rows_only_equals_joint(gen):
    W, G, A = problem(6, 5, gen)
    f = KroneckerInverse.of(G, A)
    rows, empty = torch.tensor([2, 3]), torch.empty(0, dtype=torch.long)
    torch.testing.assert_close(updates.structured(W, f, rows, empty, "within"),
                               updates.structured(W, f, rows, empty, "joint"), **FLOAT64)


def test_previously_pruned_rows_stay_zero(gen):
    W, G, A = problem(6, 7, gen)
    W[1] = 0
    new = solver.structured_update(W, G, A, torch.tensor([1, 4]), torch.tensor([2]))
    assert (new[[1, 4]] == 0).all() and (new[:, 2] == 0).all()


@pytest.mark.parametrize("R,C", SHAPES + [pytest.param(4, 6, id="R4-C6")])
def test_unstructured_one_chunk_equals_closed_form(R, C, gen):
    W, G, A = problem(R, C, gen)
    mask = torch.rand(R, C, generator=gen) < 0.4
    mask[0, 0] = True
    expected, _ = closed_form(W, G, A, mask)
    new = solver.unstructured_update(W, G, A, mask, int(mask.sum()))
    torch.testing.assert_close(new, expected.masked_fill(mask, 0.0), **FLOAT64)
    assert (new[mask] == 0).all()


@pytest.mark.parametrize("R,C", SHAPES + [pytest.param(4, 6, id="R4-C6")])
def test_unstructured_update_default_arguments_equal_closed_form(R, C, gen):
    W, G, A = problem(R, C, gen)
    mask = torch.rand(R, C, generator=gen) < 0.4
    mask[0, 0] = True
    expected, _ = closed_form(W, G, A, mask)
    new = solver.unstructured_update(W, G, A, mask)
    torch.testing.assert_close(new, expected.masked_fill(mask, 0.0), **FLOAT64)
    assert (new[mask] == 0).all()


def test_joint_solve_default_conjugate_gradients_are_exact_in_float64(gen):
    R, C = 90, 100  # more pruned weights than DIRECT_SOLVE_MAX: conjugate gradients at float64's tolerance
    W, G, A = problem(R, C, gen)
    mask = torch.rand(R, C, generator=gen) < 0.5
    r, c = mask.nonzero(as_tuple=True)
    assert r.numel() > updates.DIRECT_SOLVE_MAX
    f = KroneckerInverse.of(G, A)
    M = f.G[r][:, r] * f.A[c][:, c]
    expected = torch.linalg.solve(M, W[r, c])
    torch.testing.assert_close(updates.joint_solve(f, r, c, W[r, c], (R, C)), expected, **FLOAT64)


def test_joint_solve_tells_of_each_iteration_and_solves_as_without(gen):
    W, G, A = problem(24, 30, gen)
    r, c = (torch.rand(24, 30, generator=gen) < 0.5).nonzero(as_tuple=True)
    f, counts = KroneckerInverse.of(G.float(), A.float()), []
    told = updates.joint_solve(f, r, c, W.float()[r, c], (24, 30), tol=1e-4, on_iteration=counts.append)
    assert counts == list(range(1, len(counts) + 1)) and len(counts) > 1
    assert torch.equal(told, updates.joint_solve(f, r, c, W.float()[r, c], (24, 30), tol=1e-4))


def test_a_ticker_redraws_its_bar_at_most_every_interval():
    from surgeon.pruning.report import ticker

    class Bar:
        def __init__(self) -> None:
            self.shown: list[str] = []

        def set_postfix_str(self, text: str) -> None:
            self.shown.append(text)

    often, never = Bar(), Bar()
    tick, idle = ticker(often, "CG iteration", every=0.0), ticker(never, "CG iteration", every=3600.0)
    for count in (1, 2, 3):
        tick(count)
        idle(count)
    assert often.shown == ["CG iteration 1", "CG iteration 2", "CG iteration 3"] and never.shown == []


def test_joint_solve_float32_default_tolerance_reaches_the_minimum(gen):
    W, G, A = problem(24, 30, gen)
    mask = torch.rand(24, 30, generator=gen) < 0.5
    expected, _ = closed_form(W, G, A, mask)
    r, c = mask.nonzero(as_tuple=True)
    f = KroneckerInverse.of(G.float(), A.float())
    U = torch.zeros(24, 30)
    U[r, c] = updates.joint_solve(f, r, c, W.float()[r, c], (24, 30), tol=updates.cg_tolerance(torch.float32))
    new = (W.float() - f.apply(U)).masked_fill(mask, 0.0)
    best = solver.quadratic_loss(expected.masked_fill(mask, 0.0) - W, G, A)
    got = solver.quadratic_loss(new.double() - W, G, A)
    assert best <= got <= best * 1.001
    assert got < solver.quadratic_loss(W.masked_fill(mask, 0.0) - W, G, A)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_joint_solve_with_low_precision_products_nears_the_minimum(gen, dtype):
    """The products G⁻¹ V A⁻¹ in bfloat16 or float16, the recurrences in float32: within 2% of the minimum of the
    quadratic loss, which float32 reaches to 1e-3, and not float32's iterate (the products were rounded)."""
    W, G, A = problem(24, 30, gen)
    mask = torch.rand(24, 30, generator=gen) < 0.5
    expected, _ = closed_form(W, G, A, mask)
    best = solver.quadratic_loss(expected.masked_fill(mask, 0.0) - W, G, A)
    r, c = mask.nonzero(as_tuple=True)
    f = KroneckerInverse.of(G.float(), A.float())
    losses, iterates = [], []
    for low in (None, dtype):
        U = torch.zeros(24, 30)
        U[r, c] = updates.joint_solve(f, r, c, W.float()[r, c], (24, 30), tol=1e-3, max_iter=200, operator_dtype=low)
        iterates.append(U)
        losses.append(solver.quadratic_loss((W.float() - f.apply(U)).masked_fill(mask, 0.0).double() - W, G, A))
    assert best <= losses[0] <= best * 1.001
    assert best <= losses[1] <= best * 1.02
    assert not torch.equal(*iterates)


def test_joint_solve_stops_at_max_iter(gen):
    W, G, A = problem(10, 12, gen)
    mask = torch.rand(10, 12, generator=gen) < 0.5
    expected, _ = closed_form(W, G, A, mask)
    one_step = solver.unstructured_update(W, G, A, mask, None, tol=0.0, max_iter=1)
    assert not torch.allclose(one_step, expected.masked_fill(mask, 0.0), **FLOAT32)


def chunked_reference(W, G, A, mask, max_correlate):
    """Chunked updates by the definition: each chunk's closed form on the original W, the updates summed."""
    r, c = mask.nonzero(as_tuple=True)
    total = torch.zeros_like(W)
    for chunk in updates.row_chunks(r, max_correlate):
        chunk_mask = torch.zeros_like(mask)
        chunk_mask[r[chunk], c[chunk]] = True
        updated, _ = closed_form(W, G, A, chunk_mask)
        total += updated - W
    return (W + total).masked_fill(mask, 0.0)


@pytest.mark.parametrize("max_correlate", [1, 3, 5, 7])
def test_unstructured_chunks_match_definition(max_correlate, gen):
    W, G, A = problem(6, 5, gen)
    mask = torch.rand(6, 5, generator=gen) < 0.5
    expected = chunked_reference(W, G, A, mask, max_correlate)
    new = solver.unstructured_update(W, G, A, mask, max_correlate)
    torch.testing.assert_close(new, expected, **FLOAT64)


def test_row_chunks_keep_whole_rows():
    rows = torch.tensor([0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 3])
    chunks = updates.row_chunks(rows, 4)
    assert [(s.start, s.stop) for s in chunks] == [(0, 2), (2, 6), (6, 10), (10, 11)]
    assert updates.row_chunks(rows, None) == [slice(0, 11)]
    assert updates.row_chunks(torch.empty(0, dtype=torch.long), 3) == []


def test_float32_matches_float64(gen):
    W, G, A = problem(12, 10, gen)
    mask = torch.rand(12, 10, generator=gen) < 0.5
    exact = solver.unstructured_update(W, G, A, mask, 8)
    approx = solver.unstructured_update(W.float(), G.float(), A.float(), mask, 8)
    plain = chunked_reference(W.float(), G.float(), A.float(), mask, 8)  # the definition, float32
    assert_within_reference_error(approx, exact, plain)


def test_update_changes_kept_weights(gen):
    W, G, A = problem(5, 6, gen)
    mask = torch.zeros(5, 6, dtype=torch.bool)
    mask[2, 3] = True
    new = solver.unstructured_update(W, G, A, mask, 1)
    assert (new[~mask] != W[~mask]).any()


@pytest.mark.parametrize("budget", [1, 40, 1 << 20], ids=["one-per-batch", "small-batches", "one-batch"])
@pytest.mark.parametrize("backend", [b for b in available_backends("cpu", "kk_solve") if b != "triton"])
def test_solve_chunks_batched_equals_one_by_one(budget, backend, gen, monkeypatch):
    from surgeon_kernels.kk_solve import reference

    batches: list[int] = []
    chunk_batches = reference.chunk_batches
    monkeypatch.setattr(reference, "chunk_batches", lambda *a: batches.append(len(out := chunk_batches(*a))) or out)
    W, G, A = problem(7, 9, gen)
    f = KroneckerInverse.of(G, A)
    r, c = (torch.rand(7, 9, generator=gen) < 0.6).nonzero(as_tuple=True)
    w = W[r, c]
    chunks = updates.row_chunks(r, 6)
    assert len({s.stop - s.start for s in chunks}) > 1  # ragged chunks
    batched = updates.solve_chunks(f, r, c, w, chunks, budget=budget, backend=backend)
    for s in chunks:
        M = f.G[r[s]][:, r[s]] * f.A[c[s]][:, c[s]]
        torch.testing.assert_close(batched[s], torch.linalg.solve(M, w[s]), **FLOAT64)
    if backend == "torch":  # the budget decides how the PyTorch path batches (the compiled op does not batch)
        if budget == 1:
            assert batches == [len(chunks)]  # one chunk a batch
        else:
            assert len(batches) == 1 and batches[0] < len(chunks)  # chunks share batches


@pytest.mark.parametrize("backend", [b for b in available_backends("cpu", "kk_solve") if b != "triton"])
def test_solve_chunks_singular_system_falls_back_to_least_squares(backend, gen):
    _, G, A = problem(3, 3, gen)
    f = KroneckerInverse.of(G, A)
    r, c = torch.tensor([0, 1, 1]), torch.tensor([0, 2, 2])  # the same weight twice: the second M is singular
    w = torch.tensor([3.0, 1.0, 1.0], dtype=torch.float64)
    u = updates.solve_chunks(f, r, c, w, [slice(0, 1), slice(1, 3)], backend=backend)
    m = f.G[1, 1] * f.A[2, 2]
    torch.testing.assert_close(u[1:], torch.full((2,), 0.5 / m.item(), dtype=torch.float64), **FLOAT64)
    torch.testing.assert_close(u[0], 3.0 / (f.G[0, 0] * f.A[0, 0]), **FLOAT64)
    assert updates.solve_chunks(f, r[:0], c[:0], w[:0], [], backend=backend).numel() == 0
    with pytest.raises(ValueError, match="tile"):
        updates.solve_chunks(f, r, c, w, [slice(0, 1), slice(2, 3)], backend=backend)
