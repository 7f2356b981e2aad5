"""Triton kernel: gather the K×K systems of the chunked correlated update in one launch (eq. 4).

Program (b, i, j) builds one BLOCK×BLOCK tile of chunk b's matrix straight from the two inverse
factors: two 2-D gathers and a product, padding rows/columns set to the identity. The matrix
is written once; no [B, K, K] index tensors are materialised.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surgeon_kernels._triton import autotune_configs

CONFIGS = autotune_configs([dict(BLOCK=32, num_warps=4), dict(BLOCK=64, num_warps=4)], test=dict(BLOCK=64, num_warps=1))


@triton.autotune(configs=CONFIGS, key=["K"])
@triton.jit
def _kk_gather_kernel(g_ptr, a_ptr, rows_ptr, cols_ptr, valid_ptr, out_ptr, K, stride_g, stride_a,
                      BLOCK: tl.constexpr):
    """out[b, i, j] = G⁻¹[r_bi, r_bj]·A⁻¹[c_bi, c_bj] on valid pairs, δ_ij elsewhere (eq. 4)."""
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    j = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    i_in, j_in = i < K, j < K
    ri = tl.load(rows_ptr + b * K + i, mask=i_in, other=0).to(tl.int64)
    rj = tl.load(rows_ptr + b * K + j, mask=j_in, other=0).to(tl.int64)
    ci = tl.load(cols_ptr + b * K + i, mask=i_in, other=0).to(tl.int64)
    cj = tl.load(cols_ptr + b * K + j, mask=j_in, other=0).to(tl.int64)
    vi = tl.load(valid_ptr + b * K + i, mask=i_in, other=0) != 0
    vj = tl.load(valid_ptr + b * K + j, mask=j_in, other=0) != 0
    both = vi[:, None] & vj[None, :]
    g = tl.load(g_ptr + ri[:, None] * stride_g + rj[None, :], mask=both, other=0.0)
    a = tl.load(a_ptr + ci[:, None] * stride_a + cj[None, :], mask=both, other=0.0)
    eye = tl.where(i[:, None] == j[None, :], 1.0, 0.0)
    value = tl.where(both, g * a, eye)
    tl.store(out_ptr + b * K * K + i.to(tl.int64)[:, None] * K + j[None, :], value, mask=i_in[:, None] & j_in[None, :])


def kk_gather(G_inv: torch.Tensor, A_inv: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
              valid: torch.Tensor) -> torch.Tensor:
    """M [B, K, K] of the padded chunks (see `reference.kk_gather`), in the factors' dtype."""
    B, K = rows.shape
    G_inv, A_inv = G_inv.contiguous(), A_inv.contiguous()
    out = torch.empty(B, K, K, dtype=G_inv.dtype, device=G_inv.device)
    if B and K:
        grid = lambda meta: (B, triton.cdiv(K, meta["BLOCK"]), triton.cdiv(K, meta["BLOCK"]))  # noqa: E731
        _kk_gather_kernel[grid](G_inv, A_inv, rows.contiguous(), cols.contiguous(),
                                valid.to(torch.int8).contiguous(), out, K, G_inv.stride(0), A_inv.stride(0))
    return out
