"""Microbenchmarks: packing and unpacking symmetric factors (`surgeon_kernels.symmetric`), CPU.

    python -m pytest bench/kernels/bench_symmetric.py -o python_files='bench_*.py' --benchmark-only

A structured shot unpacks every layer's two factors and packs and unpacks their inverse roots.
"tile rows" is the package's way (one copy per tile row, mirrored tile by tile); "scatter" is one
advanced-index gather or scatter of all tiles (the earlier implementation). Rates count the bytes of
the dense matrix plus its packed half (read + write), against the measured copy bandwidth.
"""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels.symmetric import PackedSymmetric


def _scatter(packed: PackedSymmetric, op: str, dense: torch.Tensor) -> torch.Tensor:
    """`op` by one advanced-index gather (pack) or scatter (dense, upper) of all tiles."""
    nb, t, n = packed.blocks, packed.tile, packed.n
    i, j = packed.index()
    if op == "pack":
        padded = torch.nn.functional.pad(dense, (0, nb * t - n, 0, nb * t - n))
        return padded.reshape(nb, t, nb, t).transpose(1, 2)[i, j]
    full = packed.tiles.new_zeros(nb * t, nb * t)
    view = full.view(nb, t, nb, t).transpose(1, 2)
    if op == "dense":
        view[j, i] = packed.tiles.transpose(1, 2)
    view[i, j] = packed.tiles
    return full[:n, :n] if op == "dense" else full[:n, :n].triu_()


@pytest.mark.parametrize("way", ["tile rows", "scatter"])
@pytest.mark.parametrize("op", ["pack", "dense", "upper"])
@pytest.mark.parametrize("n", [576, 1536])
def test_symmetric(benchmark, roofline, n, op, way):
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(0))
    dense = x + x.T
    packed = PackedSymmetric.pack(dense)
    if way == "scatter":
        assert torch.equal(_scatter(packed, op, dense), {"pack": packed.tiles, "dense": dense,
                                                         "upper": dense.triu()}[op])
        benchmark(_scatter, packed, op, dense)
    else:
        benchmark({"pack": lambda: PackedSymmetric.pack(dense), "dense": packed.dense, "upper": packed.upper}[op])
    roofline(bytes=4 * (n * n + packed.tiles.numel()))
