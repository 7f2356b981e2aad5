"""Triton kernel: grouped symmetric Kronecker-factor accumulation `out_g += s·[X_g,1]ᵀ[X_g,1]` (eq. 6).

One launch serves a whole group of factors (e.g. every factor of a transformer block): the grid is
the union of their stored tiles. Each output is packed (`surgeon_kernels.symmetric`): only tiles on
or above the diagonal exist, and each program owns one of them, reduces over its factor's tokens in
fp32 and adds the tile in place. A program reads its (factor, tile row, tile column, slot) from a
program table and its factor's addresses and sizes from a factor table, so factors of different
widths and token counts share the launch and small factors (576 wide: 15 tiles) no longer leave most
of the GPU idle. The bias column (constant 1) is generated inside the load, so no wider X is ever
built. float32 inputs use IEEE fp32 products (no TF32); bf16/fp16 inputs use the tensor cores with
fp32 accumulation. A sum over thousands of tokens kept in the tensor cores' accumulator loses
precision on Hopper (10× the error of cuBLAS on an H100), so each partial sum of `PROMOTE` token
chunks is added to the tile's total with plain fp32 adds. Launches whose inputs all start 16-byte
aligned, with widths and row strides multiples of 16, declare it (`ALIGNED`), which lets Triton
vectorise the loads that the factor table's run-time addresses and sizes would otherwise leave
scalar. Under the interpreter low-precision tiles are widened to fp32 before the product (its bf16
`tl.dot` is wrong in Triton 3.9); products of two bf16/fp16 numbers are exact in fp32, so only the
summation order differs from the GPU path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
FACTOR_FIELDS = tl.constexpr(6)  # x address, out address, tokens, width, row stride of x, bias flag
# token chunks per partial sum, by input dtype: at 8, float16 (whose products keep 22 bits against
# bfloat16's 16) still missed the accuracy policy; 2 was most accurate and slower (H100, bench/RESULTS.md)
PROMOTE = {torch.float32: 8, torch.bfloat16: 8, torch.float16: 4}


def snapshot_outputs(nargs: dict[str, Any], reset_only: bool = False) -> None:
    """Autotune pre-hook: copy every output of the group before a trial launch adds to it."""
    if not reset_only:
        table = nargs["factor_ptr"]
        table.saved = [tiles.clone() for tiles in table.outputs]


def restore_outputs(nargs: dict[str, Any], exception: Exception | None) -> None:
    """Autotune post-hook: put the outputs back as they were before the trial launch."""
    table = nargs["factor_ptr"]
    for tiles, saved in zip(table.outputs, table.__dict__.pop("saved", [])):
        tiles.copy_(saved)


@triton.autotune(configs=CONFIGS, key=["MAX_C", "FP32_DOT", "ALIGNED", "PROMOTE", "BLOCK"], pre_hook=snapshot_outputs,
                 post_hook=restore_outputs)
@triton.jit(do_not_specialize=["MAX_C"])
def _kfac_accumulate_kernel(
    program_ptr, factor_ptr, scale, MAX_C,
    X_DTYPE: tl.constexpr, ANY_BIAS: tl.constexpr, FP32_DOT: tl.constexpr, ALIGNED: tl.constexpr,
    PROMOTE: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Stored tile (i, j), i ≤ j, of factor g: out_g += scale · Σ_n [x_n, 1][x_n, 1]ᵀ (eq. 6)."""
    p = tl.program_id(0)
    g = tl.load(program_ptr + 4 * p)
    i = tl.load(program_ptr + 4 * p + 1)
    j = tl.load(program_ptr + 4 * p + 2)
    slot = tl.load(program_ptr + 4 * p + 3).to(tl.int64)
    entry = factor_ptr + FACTOR_FIELDS * g
    x_ptr = tl.load(entry).to(tl.pointer_type(X_DTYPE))
    out_ptr = tl.load(entry + 1).to(tl.pointer_type(tl.float32))
    N = tl.load(entry + 2)
    C = tl.load(entry + 3)
    stride_x = tl.load(entry + 4)
    if ALIGNED:  # the launch's inputs all start 16-byte aligned with widths and row strides multiples of 16
        x_ptr = tl.multiple_of(x_ptr, 16)
        C = tl.multiple_of(C, 16)
        stride_x = tl.multiple_of(stride_x, 16)
    bias_col = tl.where(tl.load(entry + 5) != 0, C, -1)  # -1: no bias column
    rows = i * BLOCK + tl.arange(0, BLOCK)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for start in range(0, N, BLOCK_K * PROMOTE):
        # PROMOTE chunks summed in the dot's accumulator, then added to `acc` (see the module docstring)
        part = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for step in range(PROMOTE):
            n = start + step * BLOCK_K + tl.arange(0, BLOCK_K)
            n_ok = n < N
            offs = n.to(tl.int64)[:, None] * stride_x
            a = tl.load(x_ptr + offs + rows[None, :], mask=n_ok[:, None] & (rows < C)[None, :], other=0.0)
            b = tl.load(x_ptr + offs + cols[None, :], mask=n_ok[:, None] & (cols < C)[None, :], other=0.0)
            if ANY_BIAS:
                a = tl.where(n_ok[:, None] & (rows == bias_col)[None, :], 1.0, a.to(tl.float32)).to(a.dtype)
                b = tl.where(n_ok[:, None] & (cols == bias_col)[None, :], 1.0, b.to(tl.float32)).to(b.dtype)
            if FP32_DOT:
                part = tl.dot(tl.trans(a.to(tl.float32)), b.to(tl.float32), part, input_precision="ieee")
            else:
                part = tl.dot(tl.trans(a), b, part)
        acc += part
    local = tl.arange(0, BLOCK)
    tile = out_ptr + slot * BLOCK * BLOCK + local[:, None] * BLOCK + local[None, :]
    tl.store(tile, tl.load(tile) + scale * acc)  # padding rows/columns add zeros


def kfac_accumulate(outs: Sequence[PackedSymmetric], xs: Sequence[torch.Tensor], scale: float,
                    biases: Sequence[bool]) -> None:
    """Add `scale · [x, 1]ᵀ [x, 1]` to each packed float32 factor of the group in one launch (eq. 6).

    All `xs` share one dtype and device; all outputs one tile size.
    """
    if len({x.dtype for x in xs}) > 1 or len({out.tile for out in outs}) > 1:
        raise ValueError("triton kfac_accumulate needs one input dtype and one tile size per group")
    device = outs[0].tiles.device
    programs: list[torch.Tensor] = []
    factors: list[list[int]] = []
    live: list[tuple[PackedSymmetric, torch.Tensor]] = []
    for out, x, bias in zip(outs, xs, biases):
        if out.tiles.dtype != torch.float32 or not out.tiles.is_contiguous():
            raise ValueError("triton kfac_accumulate needs contiguous float32 tiles")
        if x.shape[0] == 0:
            continue
        x = x if x.stride(1) == 1 else x.contiguous()
        live.append((out, x))
        tile_i, tile_j = out.index(torch.int32)
        g = len(factors)
        slots = torch.arange(tile_i.numel(), dtype=torch.int32, device=tile_i.device)
        programs.append(torch.stack([torch.full_like(slots, g), tile_i, tile_j, slots], 1))
        factors.append([x.data_ptr(), out.tiles.data_ptr(), x.shape[0], x.shape[1], x.stride(0), int(bias)])
    if not live:
        return
    program_table = torch.cat(programs).to(device)
    factor_table = torch.tensor(factors, dtype=torch.int64)
    if device.type == "cuda":  # from pinned memory the copy is queued; from pageable memory it waits for the device
        factor_table = factor_table.pin_memory().to(device, non_blocking=True)
    # what the autotune hooks save and restore
    factor_table.outputs = [out.tiles for out, _ in live]  # type: ignore[attr-defined]
    dtype = live[0][1].dtype
    _kfac_accumulate_kernel[(program_table.shape[0],)](
        program_table, factor_table, float(scale), max(x.shape[1] for _, x in live),
        X_DTYPE=TL_DTYPES[dtype], ANY_BIAS=any(biases), FP32_DOT=dtype == torch.float32 or INTERPRET,
        ALIGNED=all(x.data_ptr() % 16 == 0 and x.stride(0) % 16 == 0 and x.shape[1] % 16 == 0 for _, x in live),
        PROMOTE=PROMOTE[dtype], BLOCK=outs[0].tile,
    )
