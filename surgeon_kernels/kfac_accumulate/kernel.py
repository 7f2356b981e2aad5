"""Triton kernel: symmetric Kronecker-factor accumulation `out += s·[X,1]ᵀ[X,1]` (paper eq. 6).

The output is packed (`surgeon_kernels.symmetric`): only tiles on or above the diagonal exist, and
each program owns one of them (a 1-D grid over the stored tiles, so no program is launched for the
lower triangle), reduces over the tokens in fp32 and adds the tile in place. The bias column
(constant 1) is generated inside the load, so no wider X is ever built. float32 inputs use IEEE
fp32 products (no TF32); bf16/fp16 inputs use the tensor cores with fp32 accumulation. Under the
interpreter low-precision tiles are widened to fp32 before the product (its bf16 `tl.dot` is
wrong in Triton 3.9); products of two bf16/fp16 numbers are exact in fp32, so only the summation
order differs from the GPU path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surgeon_kernels._triton import INTERPRET, autotune_configs
from surgeon_kernels.symmetric import PackedSymmetric

CONFIGS = autotune_configs(
    [
        dict(BLOCK_K=32, num_warps=4, num_stages=3),
        dict(BLOCK_K=32, num_warps=8, num_stages=3),
        dict(BLOCK_K=64, num_warps=8, num_stages=4),
    ],
    test=dict(BLOCK_K=16, num_warps=1, num_stages=1),
)


@triton.autotune(configs=CONFIGS, key=["C", "FP32_DOT", "BLOCK"], restore_value=["out_ptr"])
@triton.jit
def _kfac_accumulate_kernel(
    out_ptr, tile_i_ptr, tile_j_ptr, x_ptr, N, C, stride_x, scale,
    HAS_BIAS: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Stored tile p = (i, j), i ≤ j, of out += scale · Σ_n [x_n, 1][x_n, 1]ᵀ over the N tokens (eq. 6)."""
    p = tl.program_id(0)
    i = tl.load(tile_i_ptr + p)
    j = tl.load(tile_j_ptr + p)
    rows = i * BLOCK + tl.arange(0, BLOCK)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for start in range(0, N, BLOCK_K):
        n = start + tl.arange(0, BLOCK_K)
        n_ok = n < N
        offs = n.to(tl.int64)[:, None] * stride_x
        a = tl.load(x_ptr + offs + rows[None, :], mask=n_ok[:, None] & (rows < C)[None, :], other=0.0)
        b = tl.load(x_ptr + offs + cols[None, :], mask=n_ok[:, None] & (cols < C)[None, :], other=0.0)
        if HAS_BIAS:
            a = tl.where(n_ok[:, None] & (rows == C)[None, :], 1.0, a.to(tl.float32)).to(a.dtype)
            b = tl.where(n_ok[:, None] & (cols == C)[None, :], 1.0, b.to(tl.float32)).to(b.dtype)
        if FP32_DOT:
            acc += tl.dot(tl.trans(a.to(tl.float32)), b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(tl.trans(a), b)
    local = tl.arange(0, BLOCK)
    tile = out_ptr + p.to(tl.int64) * BLOCK * BLOCK + local[:, None] * BLOCK + local[None, :]
    tl.store(tile, tl.load(tile) + scale * acc)  # padding rows/columns add zeros


def kfac_accumulate(out: PackedSymmetric, x: torch.Tensor, scale: float, bias: bool) -> None:
    """Add `scale · [x, 1]ᵀ [x, 1]` to the packed symmetric float32 factor `out` in place (eq. 6)."""
    if out.tiles.dtype != torch.float32 or not out.tiles.is_contiguous():
        raise ValueError("triton kfac_accumulate needs contiguous float32 tiles")
    x = x.contiguous()
    N, C = x.shape
    if N == 0:
        return
    tile_i, tile_j = out.index(torch.int32)
    _kfac_accumulate_kernel[(out.tiles.shape[0],)](
        out.tiles, tile_i, tile_j, x, N, C, x.stride(0), float(scale),
        HAS_BIAS=bool(bias), FP32_DOT=x.dtype == torch.float32 or INTERPRET, BLOCK=out.tile,
    )
