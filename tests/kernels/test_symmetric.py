"""PackedSymmetric: pack/dense round trip, diagonal, zeros, tile order, memory, on odd sizes."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels.symmetric import PackedSymmetric


def symmetric(n: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x + x.T


@pytest.mark.parametrize("n,tile", [(1, 4), (5, 4), (8, 4), (9, 4), (37, 16), (130, 128)])
def test_round_trip(n, tile):
    A = symmetric(n, seed=n)
    packed = PackedSymmetric.pack(A, tile)
    nb = -(-n // tile)
    assert packed.tiles.shape == (nb * (nb + 1) // 2, tile, tile)
    assert torch.equal(packed.dense(), A)
    assert torch.equal(packed.diagonal(), A.diagonal())


def test_tiles_are_the_upper_triangle_in_row_major_order():
    A = symmetric(6, seed=0)
    packed = PackedSymmetric.pack(A, 2)
    expected = [A[2 * i : 2 * i + 2, 2 * j : 2 * j + 2] for i in range(3) for j in range(i, 3)]
    assert torch.equal(packed.tiles, torch.stack(expected))


def test_lower_triangle_outside_diagonal_tiles_is_never_read():
    A = symmetric(8, seed=1)
    corrupted = A.clone()
    corrupted[4:, :4] = float("nan")  # the lower-left tile of a 2×2 tiling
    assert torch.equal(PackedSymmetric.pack(corrupted, 4).dense(), A)


def test_zeros_and_padding():
    packed = PackedSymmetric.zeros(5, tile=4)
    assert packed.tiles.shape == (3, 4, 4) and not packed.tiles.any()
    A = symmetric(5, seed=2)
    tiles = PackedSymmetric.pack(A, 4).tiles
    assert not tiles[2, 1:].any() and not tiles[2, :, 1:].any() and not tiles[1, :, 1:].any()


def test_about_half_the_dense_memory():
    packed = PackedSymmetric.zeros(4096)
    assert packed.tiles.numel() / 4096**2 == pytest.approx(33 / 64)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_isfinite(bad):
    packed = PackedSymmetric.pack(symmetric(5, seed=3), 4)
    assert packed.isfinite()
    packed.tiles[1, 0, 0] = bad
    assert not packed.isfinite()


@pytest.mark.parametrize("n,tile", [(1, 4), (9, 4), (37, 16)])
def test_upper_triangular_round_trip(n, tile):
    U = torch.triu(symmetric(n, seed=n + 1))
    assert torch.equal(PackedSymmetric.pack(U, tile).upper(), U)
    M = symmetric(n, seed=n + 2)
    assert torch.equal(PackedSymmetric.pack(M, tile).upper(), torch.triu(M))
