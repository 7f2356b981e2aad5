"""The sum of two Kronecker factors: the power method finds the nearest sum, and its inverse is exact."""

from __future__ import annotations

import pytest
import torch

from surgeon import costs, kronecker_sum, updates
from surgeon.kronecker_sum import KroneckerSum, estimate_sum, simultaneous_diagonalisation
from surgeon.model import prunable_layers
from tests._helpers import SHAPES, closed_form_of, per_token_inputs_and_gradients, random_spd, tiny_model
from tests._tolerances import FLOAT64, assert_within_reference_error


def sum_problem(R: int, C: int, gen: torch.Generator, size: float = 0.3):
    """G₁, A₁ SPD and small symmetric (indefinite) G₂, A₂."""
    def small(n):
        x = torch.randn(n, n, generator=gen, dtype=torch.float64)
        return size * (x + x.T) / (2 * n**0.5)
    return random_spd(R, gen), random_spd(C, gen), small(R), small(C)


def test_power_method_finds_the_nearest_sum_of_two_kronecker_factors():
    """G ⊗ A and G2 ⊗ A2 are the first two singular terms of the rearranged Fisher R(F) = Σ vec(ggᵀ) vec(aaᵀ)ᵀ."""
    model = tiny_model("opt").double()
    named = [pair for block in prunable_layers(model) for pair in block][:4]
    windows = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(4))
    state = {}
    raw = estimate_sum(model, named, windows, state, iterations=60)
    warm = estimate_sum(model, named, windows, state, iterations=1)  # a later shot: one pass
    direct = per_token_inputs_and_gradients(model, named, windows)
    checked = 0
    for name, _ in named:
        a, g = direct[name]
        rearranged = torch.einsum("ni,nj,nk,nl->ijkl", g, g, a, a).reshape(g.shape[1] ** 2, a.shape[1] ** 2)
        U, S, Vh = torch.linalg.svd(rearranged, full_matrices=False)
        for index, (G, A) in enumerate(((raw[name].G, raw[name].A), (raw[name].G2, raw[name].A2))):
            if S[index + 1] > 0.8 * S[index]:
                continue  # power iteration converges as (S[i+1]/S[i])^k: too slow to check here
            want = S[index] * torch.outer(U[:, index], Vh[index])
            for factors in (raw, warm):
                G, A = (factors[name].G, factors[name].A) if index == 0 else (factors[name].G2, factors[name].A2)
                got = torch.outer(G.dense().reshape(-1), A.dense().reshape(-1)).double()
                assert_within_reference_error(got, want, want.float())  # converged to float32 precision
            checked += 1
    assert checked >= 6




def test_simultaneous_diagonalisation(gen):
    M1, _, M2, _ = sum_problem(9, 2, gen, size=2.0)
    K, s = simultaneous_diagonalisation(M1, M2, backend="torch")
    torch.testing.assert_close(K.T @ M1 @ K, torch.eye(9, dtype=torch.float64), **FLOAT64)
    torch.testing.assert_close(K.T @ M2 @ K, torch.diag(s), **FLOAT64)


@pytest.mark.parametrize("R,C", SHAPES)
def test_kronecker_sum_inverse_matches_dense(R, C, gen):
    G1, A1, G2, A2 = sum_problem(R, C, gen)
    f = KroneckerSum.of(G1, A1, G2, A2, backend="torch")
    assert f.D.max() < 1 / kronecker_sum.SUM_FLOOR  # no floor needed here: this is the exact inverse
    F_inv = torch.linalg.inv(torch.kron(G1, A1) + torch.kron(G2, A2))
    V = torch.randn(R, C, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(f.apply(V).reshape(-1), F_inv @ V.reshape(-1), **FLOAT64)
    torch.testing.assert_close(f.element_diagonal().reshape(-1), F_inv.diagonal(), **FLOAT64)
    W = torch.randn(R, C, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(costs.element_costs(W, f), 0.5 * W.square() / F_inv.diagonal().reshape(R, C),
                               **FLOAT64)


@pytest.mark.parametrize("R,C", SHAPES + [pytest.param(4, 6, id="R4-C6")])
def test_kronecker_sum_joint_update_equals_closed_form(R, C, gen):
    G1, A1, G2, A2 = sum_problem(R, C, gen)
    W = torch.randn(R, C, generator=gen, dtype=torch.float64)
    mask = torch.rand(R, C, generator=gen) < 0.4
    mask[0, 0] = True
    expected, _ = closed_form_of(W, torch.linalg.inv(torch.kron(G1, A1) + torch.kron(G2, A2)), mask)
    f = KroneckerSum.of(G1, A1, G2, A2, backend="torch")
    new = updates.unstructured(W, f, mask, None, tol=1e-14, max_iter=10 * R * C)
    torch.testing.assert_close(new, expected.masked_fill(mask, 0.0), **FLOAT64)
    with pytest.raises(ValueError, match="joint solve"):
        updates.unstructured(W, f, mask, 4)


def test_kronecker_sum_floor_keeps_the_inverse_positive_definite(gen):
    """A second term that cancels the first (F̃ = G₁⊗A₁ − 2 G₁⊗A₁) is floored to SUM_FLOOR of the first."""
    G1, A1, _, _ = sum_problem(4, 3, gen)
    f = KroneckerSum.of(G1, A1, -2 * G1, A1, backend="torch")
    torch.testing.assert_close(f.D, torch.full((4, 3), 1 / kronecker_sum.SUM_FLOOR, dtype=torch.float64), **FLOAT64)
    expected = torch.kron(torch.linalg.inv(G1), torch.linalg.inv(A1)) / kronecker_sum.SUM_FLOOR
    V = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(f.apply(V).reshape(-1), expected @ V.reshape(-1), **FLOAT64)
