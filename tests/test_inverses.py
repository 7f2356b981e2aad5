"""surgeon.method.inverses: inverses, inverse roots and F⁻¹ = G⁻¹ ⊗ A⁻¹ of the damped factors."""

from __future__ import annotations

import pytest
import torch

from surgeon.method import inverses
from surgeon.method.damping import damp
from surgeon.method.factors import LayerFactors
from surgeon.method.inverses import KroneckerInverse
from surgeon_kernels.ops import PackedSymmetric
from tests._helpers import problem, random_spd
from tests._tolerances import FLOAT64, FLOORED, assert_within_reference_error


def test_eigen_solve_equals_solve_on_spd(gen):
    M = torch.stack([random_spd(6, gen) for _ in range(3)])
    rhs = torch.randn(3, 6, 1, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(inverses.eigen_solve(M, rhs), torch.linalg.solve(M, rhs), **FLOAT64)
    torch.testing.assert_close(inverses.eigen_solve(M), torch.linalg.inv(M), **FLOAT64)


def test_spd_inverse_of_singular_matrix_is_finite_pseudo_inverse(gen):
    x = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    M = x @ x.T  # rank 3: Cholesky fails
    assert int(torch.linalg.cholesky_ex(M).info) != 0
    inverse = inverses.spd_inverse(M)
    assert torch.isfinite(inverse).all()
    torch.testing.assert_close(M @ inverse @ M, M, **FLOORED)


def test_inverse_root_is_upper_triangular_root_of_the_inverse(gen):
    M = random_spd(7, gen)
    U = inverses.inverse_root(M)
    assert torch.equal(U, torch.triu(U))
    torch.testing.assert_close(U @ U.T, torch.linalg.inv(M), **FLOAT64)


@pytest.mark.parametrize("rank", [0, 3])
def test_inverse_root_of_singular_matrix_is_finite(gen, rank):
    x = torch.randn(6, rank, generator=gen, dtype=torch.float64)
    M = x @ x.T  # Cholesky fails; rank 0 is the all-zero factor of a layer the loss does not see
    U = inverses.inverse_root(M)
    assert torch.isfinite(U).all() and torch.equal(U, torch.triu(U))
    if rank:
        torch.testing.assert_close(M @ (U @ U.T) @ M, M, **FLOORED)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed-and-back"])
def test_roots_and_full_inverses_are_the_same_inverse(packed, gen):
    """Everything read of F⁻¹ agrees whether each factor is held as M⁻¹ or as its root, before or after packing."""
    W, G, A = problem(150, 11, gen)  # 150 > one packed tile
    G_inv, A_inv = torch.linalg.inv(G), torch.linalg.inv(A)
    for roots in (False, True):
        f = KroneckerInverse.of(G, A, roots=roots)
        if packed:
            f = f.packed().dense()
        torch.testing.assert_close(f.G_diagonal, G_inv.diagonal(), **FLOAT64)
        torch.testing.assert_close(f.A_diagonal, A_inv.diagonal(), **FLOAT64)
        torch.testing.assert_close(f.element_diagonal(), torch.outer(G_inv.diagonal(), A_inv.diagonal()), **FLOAT64)
        rows, cols = torch.tensor([1, 4, 149]), torch.tensor([0, 3, 7])
        for got, expected in zip(f.inverse_rows(rows, cols), (G_inv[rows], A_inv[cols])):
            torch.testing.assert_close(got, expected, **FLOAT64)
        for got, expected in zip(f.matrices(), (G_inv, A_inv)):
            torch.testing.assert_close(got, expected, **FLOAT64)
        torch.testing.assert_close(f.apply(W), G_inv @ W @ A_inv, **FLOAT64)


def test_packed_inverse_is_read_only_after_unpacking(gen):
    _, G, A = problem(6, 5, gen)
    packed = KroneckerInverse.of(G, A, roots=True).packed()
    with pytest.raises(ValueError, match="dense"):
        packed.matrices()
    with pytest.raises(ValueError, match="already packed"):
        packed.packed()


@pytest.mark.parametrize("root", [False, True])
def test_a_layers_inverse_is_its_groups_a_inverse_beside_its_own_g_inverse(gen, root):
    """q/k/v read one input: each one's F⁻¹ is its own G⁻¹ beside the one A⁻¹ of their group, inverted, packed and
    unpacked once, and equals the layer's F⁻¹ inverted alone."""
    A_raw, G_raw = random_spd(140, gen).float(), random_spd(30, gen).float()
    entry = LayerFactors(PackedSymmetric.pack(A_raw), PackedSymmetric.pack(G_raw))
    A = inverses.input_inverse(entry.A, slice(None), 0.01, root)
    G = inverses.output_inverse(entry, slice(None), 0.1, root)
    alone = KroneckerInverse.of(damp(entry.G.dense(), 0.1), damp(entry.A.dense(), 0.01), roots=root)
    for f in (inverses.kronecker(G, A), inverses.kronecker(G.packed().dense(), A.packed().dense())):
        assert torch.equal(f.G, alone.G) and torch.equal(f.A, alone.A)
        assert torch.equal(f.G_diagonal, alone.G_diagonal) and torch.equal(f.A_diagonal, alone.A_diagonal)
    fewer = inverses.input_inverse(entry.A, torch.arange(139), 0.01, root)
    assert fewer.matrix.shape == (139, 139)
    with pytest.raises(ValueError, match="the same way"):
        inverses.kronecker(G, inverses.input_inverse(entry.A, slice(None), 0.01, not root))
    with pytest.raises(ValueError, match="needs the factor G"):
        inverses.output_inverse(LayerFactors(entry.A, None), slice(None), 0.1, root)


@pytest.mark.parametrize("n", [1, 7, 128, 129, 200, 256, 257, 513])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("row_major", [False, True])
def test_lower_inverse_matches_triangular_solve(n, dtype, row_major, gen):
    """Row blocks (n > INVERSE_BLOCK, a last block of any width included) write L⁻¹ over L, lower-triangular."""
    L = torch.linalg.cholesky(random_spd(n, gen)).to(dtype)  # column-major, as Cholesky returns it
    expected = torch.linalg.solve_triangular(L.double(), torch.eye(n, dtype=torch.float64), upper=False)
    L = L.contiguous() if row_major else L
    plain = torch.linalg.solve_triangular(L, torch.eye(n, dtype=dtype), upper=False)  # PyTorch in the same dtype
    X = inverses.lower_inverse_(L)
    assert X is L
    assert torch.equal(X, X.tril())
    if dtype == torch.float64:
        torch.testing.assert_close(X, expected, **FLOAT64)
    else:
        assert_within_reference_error(X, expected, plain)
