"""Plain-PyTorch reference of the chunked K×K solves: padded batches of similar length, batched Cholesky."""

from __future__ import annotations

from collections.abc import Callable

import torch

from surgeon_kernels.kk_gather import reference as kk_reference

PAD_RATIO = 0.875  # a batch of K×K solves holds chunks at least this fraction of its longest
BUDGET = 1 << 24  # padded matrix entries per batch


def chunk_batches(lengths: list[int], budget: int = BUDGET, pad_ratio: float = PAD_RATIO) -> list[list[int]]:
    """Group chunks (by index) for batched K×K solves, longest first, so little is padding.

    A batch holds chunks no shorter than `pad_ratio` of its longest (so at most 1 − pad_ratio² of
    any matrix in it is padding) and at most `budget` padded matrix entries.
    """
    batches: list[list[int]] = []
    top = 0
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        k = lengths[index]
        current = batches[-1] if batches else None
        if current is None or k < pad_ratio * top or (len(current) + 1) * top * top > budget:
            batches.append([])
            top = k
        batches[-1].append(index)
    return batches


def kk_solve(G_inv: torch.Tensor, A_inv: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, w: torch.Tensor,
             offsets: torch.Tensor, budget: int = BUDGET,
             gather: Callable[..., torch.Tensor] = kk_reference.kk_gather,
             pad_ratio: float = PAD_RATIO) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, failed): u_S = M_S⁻¹ w_S for every chunk S = [offsets[b], offsets[b+1]) (eq. 4), zero where
    Cholesky rejects M_S (failed[b]).

    Chunks are solved in batches of similar length (`chunk_batches`), each padded to its longest
    with identity rows and built by `gather` (`kk_gather` signature).
    """
    u = torch.zeros_like(w)
    bounds = offsets.tolist()
    lengths = [end - start for start, end in zip(bounds, bounds[1:])]
    failed = torch.zeros(len(lengths), dtype=torch.bool, device=w.device)
    for members in chunk_batches(lengths, budget, pad_ratio):
        members = [b for b in members if lengths[b]]
        if not members:
            continue
        starts = torch.tensor([bounds[b] for b in members], device=w.device)
        sizes = torch.tensor([lengths[b] for b in members], device=w.device)
        steps = torch.arange(int(sizes.max()), device=w.device)
        valid = steps.unsqueeze(0) < sizes.unsqueeze(1)  # [B, k]
        idx = torch.where(valid, starts.unsqueeze(1) + steps.unsqueeze(0), starts.unsqueeze(1))
        M = gather(G_inv, A_inv, rows[idx], cols[idx], valid)
        rhs = torch.where(valid, w[idx], torch.zeros((), dtype=w.dtype, device=w.device)).unsqueeze(2)
        factor, info = torch.linalg.cholesky_ex(M)
        solution = torch.cholesky_solve(rhs, factor).squeeze(2)
        ok = (info == 0).unsqueeze(1) & valid
        u[idx[ok]] = solution[ok]
        failed[torch.tensor(members, device=w.device)] = info != 0
    return u, failed
