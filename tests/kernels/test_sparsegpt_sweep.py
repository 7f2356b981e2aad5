"""The fused SparseGPT sweep prepared in bench/kernels/sparsegpt_sweep.py prunes as `baselines.sparsegpt` does
(under the Triton interpreter here; `--device cuda` times it on a GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from bench.kernels.sparsegpt_sweep import sparsegpt  # noqa: E402
from surgeon.method import baselines  # noqa: E402
from tests._tolerances import FLOAT32, FLOAT64  # noqa: E402


@pytest.mark.parametrize("nm", [None, (2, 4), (4, 8)], ids=["unstructured", "2of4", "4of8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_fused_sweep_prunes_as_the_sweep_of_surgeon(nm, dtype):
    """Same mask and weights on a layer of two blocks (the second partial), rows not a multiple of the kernel's,
    a dead input and weights pruned before (at most one per N:M group, so no tie decides the mask)."""
    generator = torch.Generator().manual_seed(0)
    R, C = 21, 200
    W = torch.randn(R, C, generator=generator)
    X = torch.randn(300, C, generator=generator) @ (torch.eye(C) + torch.randn(C, C, generator=generator) / C)
    H = X.T @ X / 300
    H[7, :] = H[:, 7] = 0
    previous = (torch.arange(C) % 8 == 3)[None, :] & (torch.arange(R) % 3 == 0)[:, None]
    expected, expected_mask = baselines.sparsegpt(W, H, 0.5, previous, nm, 128, dtype=dtype)
    got, got_mask = sparsegpt(W, H, 0.5, previous, nm, 128, dtype=dtype)
    assert torch.equal(got_mask, expected_mask)
    assert got.dtype == dtype and not got[got_mask].any()
    torch.testing.assert_close(got, expected, **(FLOAT64 if dtype == torch.float64 else FLOAT32))
