"""Triton kernel: N:M group selection, one row of a [groups, M] block per lane.

An element is among the m−n cheapest of its group when fewer than m−n elements of the group
come before it in (cost, index) order, so each program compares every pair within its groups
([BLOCK, M, M]) instead of sorting; M is small (4, 8, 16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surgeon_kernels._triton import autotune_configs

CONFIGS = autotune_configs(
    [dict(BLOCK=128, num_warps=4), dict(BLOCK=256, num_warps=8)], test=dict(BLOCK=32, num_warps=1)
)


@triton.autotune(configs=CONFIGS, key=["M"])
@triton.jit
def _nm_select_kernel(costs_ptr, group_ptr, mask_ptr, groups, N, M: tl.constexpr, MP: tl.constexpr,
                      BLOCK: tl.constexpr):
    """Group costs and element mask of the M−N cheapest of BLOCK groups (sec. 3.3, N:M)."""
    g = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    e = tl.arange(0, MP)
    ok = (g < groups)[:, None] & (e < M)[None, :]
    offs = g[:, None] * M + e[None, :]
    c = tl.load(costs_ptr + offs, mask=ok, other=float("inf")).to(tl.float32)
    ci = c[:, :, None]
    cj = c[:, None, :]
    earlier = (e[None, :] < e[:, None])[None, :, :]
    before = ((cj < ci) | ((cj == ci) & earlier)) & (e < M)[None, None, :]
    rank = tl.sum(before.to(tl.int32), axis=2)
    chosen = (rank < M - N) & ok
    tl.store(mask_ptr + offs, chosen.to(tl.int8), mask=ok)
    tl.store(group_ptr + g, tl.sum(tl.where(chosen, c, 0.0), axis=1), mask=g < groups)


def nm_select(costs: torch.Tensor, n: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(group_costs [R, C/m], mask [R, C]) of the m−n cheapest of every group of m (float32 costs)."""
    costs = costs.contiguous()
    R, C = costs.shape
    groups = R * (C // m)
    group_costs = torch.empty(R, C // m, dtype=torch.float32, device=costs.device)
    mask = torch.empty(R, C, dtype=torch.int8, device=costs.device)
    if groups:
        grid = lambda meta: (triton.cdiv(groups, meta["BLOCK"]),)  # noqa: E731
        _nm_select_kernel[grid](costs, group_costs, mask, groups, n, M=m, MP=triton.next_power_of_2(m))
    return group_costs, mask.view(torch.bool)
