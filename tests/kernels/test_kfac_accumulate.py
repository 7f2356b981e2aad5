"""kfac_accumulate: every backend against the dense float64 math, shapes, dtypes and tile sizes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from surgeon_kernels import HAS_CPP_OPS, available_backends, ops
from surgeon_kernels.kfac_accumulate import reference
from surgeon_kernels.symmetric import PackedSymmetric
from tests._tolerances import FLOAT32, assert_within_reference_error

SHAPES = [
    pytest.param(1, 1, id="N1-C1"),
    pytest.param(7, 5, id="N7-C5"),
    pytest.param(33, 127, id="N33-C127-below-tile"),
    pytest.param(65, 257, id="N65-C257-odd-tiles"),
    pytest.param(19, 128, id="N19-C128-whole-tiles"),  # the bias column alone in its own tile
    pytest.param(0, 9, id="N0-empty"),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def oracle(x: torch.Tensor, scale: float, bias: bool, start: torch.Tensor) -> torch.Tensor:
    """start + scale·[x, 1]ᵀ[x, 1] in dense float64."""
    xd = x.double()
    if bias:
        xd = torch.cat([xd, torch.ones(xd.shape[0], 1, dtype=torch.float64)], 1)
    return start.double() + scale * xd.T @ xd


def assert_accumulated(got: torch.Tensor, x: torch.Tensor, scale: float, bias: bool, start: torch.Tensor) -> None:
    """got is within 2× the float32 error of the PyTorch reference (tests/_tolerances.py) of the float64 oracle."""
    plain = PackedSymmetric.pack(start, 16)
    reference.kfac_accumulate(plain, x, scale, bias)
    assert_within_reference_error(got, oracle(x, scale, bias, start), plain.dense())


@pytest.mark.parametrize("N,C", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tile", [16, 128])
@pytest.mark.parametrize("backend", available_backends("cpu"))
def test_matches_reference(N, C, dtype, bias, tile, backend):
    gen = torch.Generator().manual_seed(N * 1000 + C)
    x = torch.randn(N, C, generator=gen).to(dtype)
    start = torch.randn(C + bias, C + bias, generator=gen)
    start = start + start.T
    out = PackedSymmetric.pack(start, tile)
    ops.kfac_accumulate(out, x, 0.25, bias, backend=backend)
    dense = out.dense()
    assert_accumulated(dense, x, 0.25, bias, start)
    if backend == "triton":  # a dot sums a diagonal tile's (r, c) and (c, r) in whatever order its matmul takes
        torch.testing.assert_close(dense, dense.T, **FLOAT32)
    else:
        assert torch.equal(dense, dense.T)
    i, j = out.index()
    rows = (i[:, None] * tile + torch.arange(tile))[:, :, None]
    cols = (j[:, None] * tile + torch.arange(tile))[:, None, :]
    padding = (rows >= C + bias) | (cols >= C + bias)
    assert not out.tiles[padding].any(), "padding beyond the matrix must stay zero"


def test_reference_hand_computed():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    out = PackedSymmetric.zeros(3, dtype=torch.float64, tile=2)
    reference.kfac_accumulate(out, x, 0.5, True)
    expected = 0.5 * torch.tensor([[10.0, 14.0, 4.0], [14.0, 20.0, 6.0], [4.0, 6.0, 2.0]], dtype=torch.float64)
    assert torch.equal(out.dense(), expected)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="width 2"):
        ops.kfac_accumulate(PackedSymmetric.zeros(3), torch.zeros(4, 2), 1.0, bias=False)
    with pytest.raises(ValueError, match="PackedSymmetric"):
        ops.kfac_accumulate(torch.zeros(3, 3), torch.zeros(4, 3), 1.0)
    with pytest.raises(ValueError, match="2-D"):
        ops.kfac_accumulate(PackedSymmetric.zeros(3), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="backend"):
        ops.kfac_accumulate(PackedSymmetric.zeros(3), torch.zeros(4, 3), 1.0, backend="fortran")


@pytest.mark.parametrize("layout", ["transposed", "column-slice"])
@pytest.mark.parametrize("backend", available_backends("cpu"))
def test_strided_inputs(layout, backend):
    """Inputs that are views with strides (read in place by the compiled op) give the same factor."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(40, 37, generator=gen).T if layout == "transposed" else torch.randn(37, 90, generator=gen)[:, 3:43]
    start = torch.zeros(41, 41)
    out = PackedSymmetric.zeros(41, tile=16)
    ops.kfac_accumulate(out, x, 0.5, True, backend=backend)
    assert_accumulated(out.dense(), x, 0.5, True, start)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("backend", available_backends("cpu"))
def test_group_matches_reference(seed, backend):
    """A group of factors of different widths, token counts, dtypes and bias flags, one call."""
    gen = torch.Generator().manual_seed(seed)
    count = int(torch.randint(1, 6, (), generator=gen))
    outs, xs, biases, starts = [], [], [], []
    for _ in range(count):
        N, C = (int(v) for v in torch.randint(0, 70, (2,), generator=gen))
        C, bias = max(C, 1), bool(torch.randint(0, 2, (), generator=gen))
        dtype = DTYPES[int(torch.randint(0, len(DTYPES), (), generator=gen))]
        x = torch.randn(N, C, generator=gen).to(dtype)
        start = torch.randn(C + bias, C + bias, generator=gen)
        start = start + start.T
        outs.append(PackedSymmetric.pack(start, 16))
        xs.append(x)
        biases.append(bias)
        starts.append(start)
    ops.kfac_accumulate_group(outs, xs, 0.75, biases, backend=backend)
    for out, x, bias, start in zip(outs, xs, biases, starts):
        assert_accumulated(out.dense(), x, 0.75, bias, start)


@pytest.mark.skipif("triton" not in available_backends("cpu"), reason="needs Triton under TRITON_INTERPRET=1")
def test_triton_group_is_one_launch(monkeypatch):
    from surgeon_kernels.kfac_accumulate import kernel

    launches = []
    run = kernel._kfac_accumulate_kernel.run
    monkeypatch.setattr(kernel._kfac_accumulate_kernel, "run", lambda *a, **k: launches.append(1) or run(*a, **k))
    outs = [PackedSymmetric.zeros(w + b, tile=16) for w, b in ((20, 0), (40, 1), (9, 0))]
    xs = [torch.randn(n, w) for n, w in ((5, 20), (3, 40), (0, 9))]
    ops.kfac_accumulate_group(outs, xs, 1.0, [False, True, False], backend="triton")
    assert len(launches) == 1
    assert torch.equal(outs[2].tiles, torch.zeros_like(outs[2].tiles))


@pytest.mark.skipif("triton" not in available_backends("cpu"), reason="needs Triton under TRITON_INTERPRET=1")
def test_autotune_hooks_restore_outputs():
    """Trial launches while autotuning must not leave their sums in the factors."""
    from surgeon_kernels.kfac_accumulate import kernel

    outs = [torch.randn(3, 4, 4), torch.randn(1, 4, 4)]
    before = [t.clone() for t in outs]
    table = torch.zeros(2, kernel.FACTOR_FIELDS.value, dtype=torch.int64)
    table.outputs = outs
    kernel.snapshot_outputs({"factor_ptr": table})
    for t in outs:
        t.add_(1.0)
    kernel.restore_outputs({"factor_ptr": table}, None)
    assert all(torch.equal(t, b) for t, b in zip(outs, before))


@pytest.mark.parametrize("backend", available_backends("cpu"))
def test_float64_inputs_take_the_reference_path(backend, monkeypatch):
    calls = []
    group = reference.kfac_accumulate_group
    monkeypatch.setattr(reference, "kfac_accumulate_group", lambda *a: calls.append(1) or group(*a))
    x = torch.randn(6, 5, dtype=torch.float64)
    out = PackedSymmetric.zeros(5)
    ops.kfac_accumulate(out, x, 1.0, False, backend=backend)
    assert calls == [1]  # the kernels read float32/bfloat16/float16 only
    plain = PackedSymmetric.zeros(5)
    group([plain], [x], 1.0, [False])
    assert torch.equal(out.tiles, plain.tiles)


def test_group_arguments_checked():
    with pytest.raises(ValueError, match="one of each"):
        ops.kfac_accumulate_group([PackedSymmetric.zeros(3)], [], 1.0, [False])
    with pytest.raises(ValueError, match="width 4"):
        ops.kfac_accumulate_group([PackedSymmetric.zeros(3), PackedSymmetric.zeros(3)],
                                  [torch.zeros(2, 3), torch.zeros(2, 3)], 1.0, [False, True])


@pytest.mark.skipif(not HAS_CPP_OPS, reason="compiled ops not built")
def test_opcheck():
    outs = [PackedSymmetric.zeros(6, tile=4), PackedSymmetric.zeros(3, tile=2)]
    xs = [torch.randn(10, 5), torch.randn(7, 3, dtype=torch.bfloat16)]
    torch.library.opcheck(torch.ops.surgeon.kfac_accumulate.default, ([o.tiles for o in outs], xs, 0.5, [True, False]))


@pytest.mark.skipif(not HAS_CPP_OPS, reason="compiled ops not built")
def test_cpp_rejects_bad_groups():
    with pytest.raises(RuntimeError, match="do not pack"):
        torch.ops.surgeon.kfac_accumulate([torch.zeros(3, 4, 4)], [torch.randn(5, 9)], 1.0, [False])
    with pytest.raises(RuntimeError, match="one of each per factor"):
        torch.ops.surgeon.kfac_accumulate([torch.zeros(3, 4, 4)], [], 1.0, [False])


def test_fallback_without_compiled_ops():
    code = (
        "import torch, surgeon, surgeon_kernels as k\n"
        "assert not k.HAS_CPP_OPS and k.available_backends() == ['torch']\n"
        "from surgeon_kernels.symmetric import PackedSymmetric\n"
        "o = PackedSymmetric.zeros(3); k.kfac_accumulate(o, torch.ones(4, 3), 1.0)\n"
        "assert torch.equal(o.dense(), torch.full((3, 3), 4.0))\n"
        "try:\n    k.kfac_accumulate(o, torch.ones(4, 3), 1.0, backend='cpp')\nexcept RuntimeError as e:\n"
        "    assert 'available: torch' in str(e)\nelse:\n    raise SystemExit('cpp backend should be unavailable')\n"
    )
    env = dict(os.environ, SURGEON_DISABLE_CPP="1", TRITON_INTERPRET="0")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_triton_matches_reference(cuda_device, dtype):
    x = torch.randn(1000, 577).to(dtype)
    start = torch.randn(578, 578)
    start = start + start.T
    out = PackedSymmetric.pack(start.to(cuda_device))
    ops.kfac_accumulate(out, x.to(cuda_device), 0.5, True, backend="triton")
    assert_accumulated(out.dense().cpu(), x, 0.5, True, start)


@pytest.mark.requires_cuda
def test_cuda_triton_group_matches_reference(cuda_device):
    """A block's worth of factors in one launch, autotuned on CUDA (the hooks restore the outputs)."""
    shapes = [(1000, 577, True), (1000, 192, False), (999, 1536, False), (1000, 64, True)]
    xs = [torch.randn(n, c).bfloat16() for n, c, _ in shapes]
    starts = [torch.randn(c + b, c + b) for _, c, b in shapes]
    starts = [s + s.T for s in starts]
    outs = [PackedSymmetric.pack(s.to(cuda_device)) for s in starts]
    ops.kfac_accumulate_group(outs, [x.to(cuda_device) for x in xs], 0.5, [b for *_, b in shapes], backend="triton")
    for out, x, start, (_, _, b) in zip(outs, xs, starts, shapes):
        assert_accumulated(out.dense().cpu(), x, 0.5, b, start)
