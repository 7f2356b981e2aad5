"""Packed storage of symmetric matrices: the upper-triangle tiles only (about half the memory).

A symmetric n×n matrix is cut into square tiles of `tile` rows; tile (i, j) with i ≤ j is stored,
in row-major order over the upper triangle, as one slice of `tiles` [T, tile, tile] with
T = nb(nb+1)/2 and nb = ⌈n/tile⌉. Diagonal tiles are stored whole, padding (beyond n) is zero.
Kronecker factors are accumulated straight into this layout (`ops.kfac_accumulate`), so a model's
factors take ≈ half of their dense size while they wait to be used (Llama-2-7B: 32 GB, not 64).
An upper-triangular matrix packs the same way (its tiles below the diagonal are zero): `upper()`
gives it back.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

TILE = 128


@functools.cache
def _tile_index(nb: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column tile of every stored tile (upper triangle, row-major), cached per device."""
    i, j = torch.triu_indices(nb, nb, device=device)
    return i.to(dtype), j.to(dtype)


@dataclass
class PackedSymmetric:
    """A symmetric n×n matrix held as its upper-triangle tiles (`tiles` [T, tile, tile])."""

    tiles: torch.Tensor
    n: int
    tile: int = TILE

    @property
    def blocks(self) -> int:
        """Tiles per row and column, nb = ⌈n / tile⌉."""
        return -(-self.n // self.tile)

    @classmethod
    def zeros(cls, n: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
              tile: int = TILE) -> PackedSymmetric:
        """The n×n zero matrix."""
        nb = -(-n // tile)
        return cls(torch.zeros(nb * (nb + 1) // 2, tile, tile, device=device, dtype=dtype), n, tile)

    def index(self, dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
        """(row tile, column tile) of each stored tile, on the tiles' device."""
        return _tile_index(self.blocks, self.tiles.device, dtype)

    @classmethod
    def pack(cls, dense: torch.Tensor, tile: int = TILE) -> PackedSymmetric:
        """The upper-triangle tiles of the symmetric matrix `dense` [n, n] (its lower triangle is not read
        outside the diagonal tiles)."""
        n = dense.shape[0]
        packed = cls(dense.new_empty(0, tile, tile), n, tile)
        nb, pad = packed.blocks, packed.blocks * tile - n
        padded = F.pad(dense, (0, pad, 0, pad)) if pad else dense
        packed.tiles = dense.new_empty(nb * (nb + 1) // 2, tile, tile)
        for i, first, count in packed._tile_rows():
            band = padded[i * tile:(i + 1) * tile, i * tile:].unflatten(1, (count, tile))
            packed.tiles[first:first + count].copy_(band.transpose(0, 1))
        return packed

    def _tile_rows(self) -> Iterator[tuple[int, int, int]]:
        """(i, first, count) for each tile row i: its stored tiles (i, i), …, (i, nb−1) are
        `tiles[first:first + count]`, consecutive in storage."""
        nb, first = self.blocks, 0
        for i in range(nb):
            yield i, first, nb - i
            first += nb - i

    def _unpacked(self, mirror: bool) -> torch.Tensor:
        """The padded nb·t square with the stored tiles in place; below the diagonal, their transposes
        (`mirror`) or zeros (diagonal tiles cut to their upper triangle). One copy per tile row:
        advanced-index scatters of all tiles measured slower on the CPU (bench/kernels/bench_symmetric.py)."""
        nb, t = self.blocks, self.tile
        full = self.tiles.new_empty(nb * t, nb * t)
        for i, first, count in self._tile_rows():
            band = full[i * t:(i + 1) * t, i * t:]
            band.unflatten(1, (count, t)).copy_(self.tiles[first:first + count].transpose(0, 1))
            below = full[(i + 1) * t:, i * t:(i + 1) * t]
            if mirror:  # tile by tile: each transpose stays in cache (faster than one strided transpose)
                below.unflatten(0, (count - 1, t)).copy_(self.tiles[first + 1:first + count].transpose(1, 2))
            else:
                below.zero_()
                band[:, :t].triu_()
        return full

    def dense(self) -> torch.Tensor:
        """The full n×n matrix (a new tensor)."""
        return self._unpacked(mirror=True)[: self.n, : self.n]

    def upper(self) -> torch.Tensor:
        """The upper triangle as a dense matrix: the matrix itself when an upper-triangular one was packed."""
        return self._unpacked(mirror=False)[: self.n, : self.n]

    def diagonal(self) -> torch.Tensor:
        """The n diagonal entries."""
        i, j = self.index()
        return self.tiles[i == j].diagonal(dim1=1, dim2=2).reshape(-1)[: self.n]

    def to(self, device: torch.device | str) -> PackedSymmetric:
        """The same matrix with its tiles on `device` (a new object; tiles already there are not copied)."""
        return dataclasses.replace(self, tiles=self.tiles.to(device))

    def isfinite(self) -> bool:
        """Whether every stored entry is finite: its least and largest are (NaN propagates to both).

        One reduction pass, where `torch.isfinite(...).all()` makes a boolean copy of every tile.
        """
        low, high = torch.aminmax(self.tiles)
        return bool(torch.isfinite(low) & torch.isfinite(high))
