"""surgeon.costs: the numerators and costs of eq. 7."""

from __future__ import annotations

import pytest
import torch

from surgeon import costs
from surgeon.damping import damp
from tests._tolerances import FLOAT64
from tests.conftest import problem

SHAPES = [pytest.param(5, 7, id="R5-C7"), pytest.param(8, 3, id="R8-C3"), pytest.param(1, 6, id="R1-C6")]


@pytest.mark.parametrize("R,C", SHAPES)
def test_damped_quadratic_is_the_quadratic_form_of_the_damped_factor(R, C, gen):
    W, G, A = problem(R, C, gen)
    for strength in (0.0, 0.1, 3.0):
        rows = costs.damped_quadratic(((W @ A) * W).sum(1), W, A.diagonal(), strength, 1)
        torch.testing.assert_close(rows, ((W @ damp(A, strength)) * W).sum(1), **FLOAT64)
        cols = costs.damped_quadratic(((G @ W) * W).sum(0), W, G.diagonal(), strength, 0)
        torch.testing.assert_close(cols, ((damp(G, strength) @ W) * W).sum(0), **FLOAT64)
    assert not torch.allclose(costs.damped_quadratic(((W @ A) * W).sum(1), W, A.diagonal(), 0.5, 1),
                              ((W @ A) * W).sum(1))


@pytest.mark.parametrize("n, m", [(2, 4), (1, 4), (4, 8), (1, 2)])
def test_nm_group_mask_removes_each_groups_set_of_least_joint_cost(n, m, gen):
    """Against eq. 7 on the explicit F⁻¹ = G⁻¹ ⊗ A⁻¹ in float64: every group's removed set is the cheapest of its
    sets, and a set that would keep an already pruned weight is never chosen."""
    import itertools

    R, C = 3, 2 * m
    W, G, A = problem(R, C, gen)
    G_inv, A_inv = torch.linalg.inv(damp(G, 0.1)), torch.linalg.inv(damp(A, 0.01))
    pruned = torch.zeros(R, C, dtype=torch.bool)
    pruned[0, 0] = True
    W = W.masked_fill(pruned, 0)
    mask = costs.nm_group_mask(W, G_inv.diagonal(), A_inv, pruned, n, m)
    F_inv, theta = torch.kron(G_inv, A_inv), W.reshape(-1)
    assert int(mask.sum()) == R * C // m * (m - n) and not (pruned & ~mask).any()
    for r, g in itertools.product(range(R), range(C // m)):
        best, chosen = float("inf"), None
        for subset in itertools.combinations(range(m), m - n):
            S = torch.tensor([r * C + g * m + j for j in subset])
            if pruned.reshape(-1)[torch.arange(r * C + g * m, r * C + g * m + m)].sum() > pruned.reshape(-1)[S].sum():
                continue
            cost = float(0.5 * theta[S] @ torch.linalg.solve(F_inv[S][:, S], theta[S]))
            if cost < best:
                best, chosen = cost, set(subset)
        assert {j for j in range(m) if mask[r, g * m + j]} == chosen, (r, g)
