"""surgeon.solve: W, A (or SparseGPT's H), optional G and a target in; checked against eqs. 4-5 in float64."""

from __future__ import annotations

import pytest
import torch

import surgeon
import surgeon.method.solver as solver
from surgeon.errors import SurgeonError
from surgeon.method import baselines
from tests._helpers import closed_form, problem
from tests._tolerances import FLOAT64, SPARSEGPT_BLOCK, removed_by_rule


def random_mask(R: int, C: int, gen: torch.Generator, fraction: float = 0.4) -> torch.Tensor:
    return torch.rand(R, C, generator=gen, dtype=torch.float64) < fraction


@pytest.mark.parametrize("with_g", [False, True], ids=["G=I", "G"])
def test_given_mask_is_the_closed_form(with_g, gen):
    W, G, A = problem(6, 10, gen)
    G = G if with_g else None
    mask = random_mask(6, 10, gen)
    solution = surgeon.solve(W, A, G, mask=mask, damp_a=0, damp_g=0)
    expected, cost = closed_form(W, torch.eye(6, dtype=torch.float64) if G is None else G, A, mask)
    torch.testing.assert_close(solution.weight, expected, **FLOAT64)
    torch.testing.assert_close(torch.tensor(solution.loss, dtype=torch.float64), cost, **FLOAT64)
    assert torch.equal(solution.mask, mask) and (solution.weight[mask] == 0).all()


def test_rows_and_cols_are_the_closed_form(gen):
    W, G, A = problem(7, 9, gen)
    rows, cols = [1, 4], torch.tensor([0, 0, 0, 1, 0, 0, 0, 0, 1], dtype=torch.bool)
    solution = surgeon.solve(W, A, G, rows=rows, cols=cols, damp_a=0, damp_g=0)
    mask = torch.zeros(7, 9, dtype=torch.bool)
    mask[rows] = True
    mask[:, cols] = True
    expected, cost = closed_form(W, G, A, mask)
    torch.testing.assert_close(solution.weight, expected, **FLOAT64)
    torch.testing.assert_close(torch.tensor(solution.loss, dtype=torch.float64), cost, **FLOAT64)
    assert torch.equal(solution.mask, mask)


@pytest.mark.parametrize("shots", [1, 3])
@pytest.mark.parametrize("with_g", [False, True], ids=["G=I", "G"])
def test_sparsity_is_exact_and_the_update_optimal_for_its_mask(with_g, shots, gen):
    R, C = 8, 2 * SPARSEGPT_BLOCK + 16
    W, G, A = problem(R, C, gen)
    G = G if with_g else None
    solution = surgeon.solve(W, A, G, sparsity=0.5, shots=shots)
    expected = removed_by_rule([(R, C)], 0.5, "surgeon" if with_g else "sparsegpt")
    assert int(solution.mask.sum()) == expected
    again = surgeon.solve(W, A, G, mask=solution.mask)
    torch.testing.assert_close(solution.weight, again.weight, **FLOAT64)
    assert solution.loss == pytest.approx(again.loss, rel=1e-10)


@pytest.mark.parametrize("shots", [1, 2])
@pytest.mark.parametrize("with_g", [False, True], ids=["G=I", "G"])
@pytest.mark.parametrize("n,m", [(2, 4), (4, 8)])
def test_nm_pattern_is_exact(n, m, with_g, shots, gen):
    R, C = 6, 32
    W, G, A = problem(R, C, gen)
    solution = surgeon.solve(W, A, G if with_g else None, nm=(n, m), shots=shots)
    assert (solution.mask.reshape(R, C // m, m).sum(-1) == m - n).all()
    assert (solution.weight[solution.mask] == 0).all()


def test_sparsegpt_h_scale_changes_only_the_loss(gen):
    W, _, A = problem(5, 16, gen)
    half, full = surgeon.solve(W, A, sparsity=0.5, blocksize=8), surgeon.solve(W, 2 * A, sparsity=0.5, blocksize=8)
    assert torch.equal(half.mask, full.mask)
    torch.testing.assert_close(half.weight, full.weight, **FLOAT64)
    assert full.loss == pytest.approx(2 * half.loss, rel=1e-10)


def test_low_precision_weights_come_back_in_their_dtype(gen):
    W, _, A = problem(4, 16, gen)
    solution = surgeon.solve(W.bfloat16(), A.float(), sparsity=0.5, blocksize=16)
    assert solution.weight.dtype == torch.bfloat16 and (solution.weight[solution.mask] == 0).all()


@pytest.mark.parametrize("kwargs,message", [
    (dict(), "exactly one target"),
    (dict(sparsity=0.5, nm=(2, 4)), "exactly one target"),
    (dict(sparsity=1.0), r"sparsity must be in \[0, 1\)"),
    (dict(sparsity=-0.1), r"sparsity must be in \[0, 1\)"),
    (dict(nm=(2, 3)), "multiple of m"),
    (dict(nm=(4, 4)), "0 ≤ n < m"),
    (dict(nm=(2, 8), blocksize=12), "blocksize 12 must be a multiple of m=8"),
    (dict(mask=torch.zeros(3, 3, dtype=torch.bool)), "boolean tensor of W's shape"),
    (dict(sparsity=0.5, shots=0), "shots must be at least 1"),
])
def test_bad_targets_are_refused(kwargs, message, gen):
    W, _, A = problem(4, 16, gen)
    with pytest.raises(ValueError, match=message):
        surgeon.solve(W, A, **kwargs)


def test_mismatched_factors_are_refused(gen):
    W, G, A = problem(4, 16, gen)
    with pytest.raises(ValueError, match="G must be 4×4 and A 16×16"):
        surgeon.solve(W, A[:8, :8], sparsity=0.5)
    with pytest.raises(ValueError, match="G must be 4×4"):
        surgeon.solve(W, A, A, sparsity=0.5)


@pytest.mark.parametrize("factor,what", [(0, "weights W"), (1, "output factor G"), (2, r"input factor A \(")])
def test_non_finite_inputs_are_refused_before_any_inversion(factor, what, gen):
    given = list(problem(4, 16, gen))
    given[factor][1, 2] = float("inf") if factor else float("nan")
    W, G, A = given
    with pytest.raises(SurgeonError, match=f"^NaN or infinity in the {what}"):
        surgeon.solve(W, A, G, sparsity=0.5)
    if factor != 1:
        with pytest.raises(SurgeonError, match=f"^NaN or infinity in the {what}"):
            solver.refine(W, A, sparsity=0.5)
        with pytest.raises(SurgeonError, match="^NaN or infinity in the (weights W|inputs' matrix H);"):
            baselines.sparsegpt(W, A, 0.5, torch.zeros_like(W, dtype=torch.bool))


def test_refined_rows_reach_the_closed_form(gen):
    """Run to as many steps as kept weights, conjugate gradients solve each row's system: eqs. 4-5 with G = I."""
    W, _, A = problem(5, 12, gen)
    mask = random_mask(5, 12, gen)
    start = W.masked_fill(mask, 0) + 0.1 * torch.randn(5, 12, generator=gen, dtype=torch.float64)
    refined = solver.refine_rows(W, A, start, mask, iterations=12)
    expected, _ = closed_form(W, torch.eye(5, dtype=torch.float64), A, mask)
    torch.testing.assert_close(refined, expected, **FLOAT64)
    assert (refined[mask] == 0).all()


def test_no_refinement_step_raises_a_rows_loss(gen):
    W, _, A = problem(6, 32, gen)
    swept, mask = baselines.sparsegpt(W, A, 0.5, torch.zeros(6, 32, dtype=torch.bool), blocksize=8, percdamp=0)

    def row_losses(X: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((X - W) * ((X - W) @ A)).sum(1)

    losses = [row_losses(solver.refine_rows(W, A, swept, mask, k)) for k in range(6)]
    assert torch.equal(solver.refine_rows(W, A, swept, mask, 0), swept)
    for fewer, more in zip(losses, losses[1:]):
        assert (more <= fewer * (1 + 1e-12)).all()
    assert (losses[-1] < losses[0]).all()


@pytest.mark.parametrize("target", [dict(sparsity=0.5), dict(nm=(2, 4))], ids=["unstructured-0.5", "2:4"])
def test_refine_keeps_sparsegpts_mask_below_its_loss(target, gen):
    W, _, A = problem(8, 256, gen)
    W, A = W.float(), A.float()
    nm = target.get("nm")
    swept, mask = baselines.sparsegpt(W, A, target.get("sparsity", 0.0), torch.zeros(8, 256, dtype=torch.bool), nm,
                                      dtype=torch.float32)
    fast = solver.refine(W, A, **target)
    exact = surgeon.solve(W, A, **target)
    assert torch.equal(fast.mask, mask) and fast.weight.dtype == torch.float32 and (fast.weight[mask] == 0).all()
    assert int(mask.sum()) == removed_by_rule([(8, 256)], 0.5, "sparsegpt")
    delta = (swept - W).double()
    sweep_loss = float(0.5 * (delta * (delta @ A.double())).sum())
    assert exact.loss <= fast.loss * (1 + 1e-5) and fast.loss < 0.95 * sweep_loss


@pytest.mark.parametrize("kwargs,message", [
    (dict(sparsity=0.5, iterations=-1), "iterations must be at least 0"),
    (dict(sparsity=1.0), r"sparsity must be in \[0, 1\)"),
    (dict(nm=(2, 8), blocksize=12), "blocksize 12 must be a multiple of m=8"),
    (dict(), "give exactly one target"),
])
def test_refine_refuses_bad_arguments(kwargs, message, gen):
    W, _, A = problem(4, 16, gen)
    with pytest.raises(ValueError, match=message):
        solver.refine(W, A, **kwargs)


@pytest.mark.parametrize("R,C,blocksize,nm,sparsity,before,dead", [
    (7, 40, 16, None, 0.5, None, 0), (5, 64, 64, None, 0.3, None, 0), (9, 48, 16, None, 0.6, 0.2, 3),
    (3, 20, 128, None, 0.5, None, 0), (6, 32, 8, (2, 4), 0.0, None, 0), (4, 48, 16, (4, 8), 0.0, None, 2),
    (8, 40, 8, (2, 4), 0.0, (3, 4), 0),
], ids=["unstructured", "one-block", "previous-and-dead", "narrower-than-a-block", "2:4", "4:8-dead", "2:4-after-3:4"])
def test_sweep_is_the_published_loop(R, C, blocksize, nm, sparsity, before, dead, gen):
    """`baselines.sparsegpt` (transposed blocks, rank-1 updates) against the published column loop it lays out anew."""
    W, _, A = problem(R, C, gen)
    A[:dead], A[:, :dead] = 0, 0
    if isinstance(before, tuple):
        previous = baselines.sparsegpt_reference(W, A, 0.0, torch.zeros(R, C, dtype=torch.bool), before, blocksize)[1]
    else:
        previous = random_mask(R, C, gen, before) if before else torch.zeros(R, C, dtype=torch.bool)
    fast, mask = baselines.sparsegpt(W, A, sparsity, previous, nm, blocksize)
    reference, reference_mask = baselines.sparsegpt_reference(W, A, sparsity, previous, nm, blocksize)
    assert torch.equal(mask, reference_mask) and (mask | ~previous).all() and (fast[mask] == 0).all()
    torch.testing.assert_close(fast, reference, **FLOAT64)


def test_a_blocks_mask_takes_exactly_k_earlier_first_and_ties_in_order():
    saliency = torch.tensor([[3.0, 1.0, 1.0, 4.0], [1.0, 0.5, 2.0, 1.0]])
    before = torch.tensor([[True, False, False, False], [False, False, True, False]])
    expected = {0: [], 2: [(0, 0), (1, 2)], 4: [(0, 0), (1, 2), (1, 1), (0, 1)],
                7: [(0, 0), (1, 2), (1, 1), (0, 1), (0, 2), (1, 0), (1, 3)], 8: "all"}
    for k, chosen in expected.items():
        mask = baselines.smallest(saliency, before, k)
        assert int(mask.sum()) == k
        if chosen != "all":
            assert sorted(mask.nonzero().tolist()) == sorted(map(list, chosen)), k
