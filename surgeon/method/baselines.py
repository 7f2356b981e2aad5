"""The per-layer baselines as published: SparseGPT (Frantar & Alistarh, 2023) and Wanda (Sun et al., 2023).

Each prunes every layer to the same sparsity with its own algorithm (docs/DESIGN.md). The OBD
baselines (magnitude, L-OBD, K-OBD) are costs in the shot loop: `costs.diagonal_costs`.
"""

from __future__ import annotations

import torch

from surgeon.errors import require_finite
from surgeon.method.damping import damp
from surgeon.methods import DEFAULT_DAMP_A
from surgeon_kernels import ops


def wanda_scores(W: torch.Tensor, a_diag: torch.Tensor) -> torch.Tensor:
    """Wanda's metric |W_rc|·‖x_c‖₂ (the input norms are √diag(A) up to a constant): [R, C]."""
    return W.abs() * a_diag.clamp_min(0).sqrt()


def per_row_mask(scores: torch.Tensor, sparsity: float, previous: torch.Tensor,
                 nm: tuple[int, int] | None) -> torch.Tensor:
    """Prune the lowest scores uniformly per output row (Wanda), or m−n of every m for N:M."""
    scores = scores.masked_fill(previous, float("-inf"))
    if nm is not None:
        return ops.nm_select(scores, *nm)[1]
    k = round(sparsity * scores.shape[1])
    idx = scores.topk(k, dim=1, largest=False).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(1, idx, True)


def sparsegpt(
    W: torch.Tensor,
    H: torch.Tensor,
    sparsity: float,
    previous: torch.Tensor,
    nm: tuple[int, int] | None = None,
    blocksize: int = 128,
    percdamp: float = DEFAULT_DAMP_A,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT's lazy-batch OBS pruning of one layer with Hessian H = XᵀX: (new W, mask).

    Columns are processed left to right in blocks; within a block the mask is chosen by the OBS
    saliency W²/[H⁻¹]_cc² (exactly round(sparsity · R · b) weights per block for unstructured, m−n of
    every group of m for N:M), each pruned column's error is spread over the later columns through
    the Cholesky factor of H⁻¹, and whole blocks update the rest lazily. Weights in `previous` are
    pruned first. The sweep runs in `dtype` (float32 is the published implementation's precision).
    The arithmetic of `sparsegpt_reference` (up to rounding and the order of ties), laid out for speed: each
    block is held transposed, so that a column of W is a contiguous row and its error spreads by one rank-1
    update in place.
    """
    W, Hinv = sweep_inputs(W, H, percdamp, dtype)
    C = W.shape[1]
    mask = torch.zeros_like(previous)
    for i1 in range(0, C, blocksize):
        i2 = min(i1 + blocksize, C)
        Wt, Hinv1, before = W[:, i1:i2].t().contiguous(), Hinv[i1:i2, i1:i2], previous[:, i1:i2].t()
        d = Hinv1.diagonal()
        Errt = torch.empty_like(Wt)
        if nm is None:
            block_mask = smallest(Wt.square() / d.square()[:, None], before, round(sparsity * Wt.numel()))
            scale = block_mask / d[:, None]  # a pruned weight's error is w / [H⁻¹]_cc, a kept one's 0
        else:
            block_mask, scale = torch.zeros_like(Wt, dtype=torch.bool), torch.empty_like(Wt)
        for i in range(i2 - i1):
            if nm is not None and i % nm[1] == 0:
                n, m = nm
                group = (Wt[i : i + m].square() / d[i : i + m, None].square()).masked_fill(before[i : i + m],
                                                                                        float("-inf"))
                block_mask[i : i + m].scatter_(0, group.topk(m - n, dim=0, largest=False).indices, True)
                torch.div(block_mask[i : i + m], d[i : i + m, None], out=scale[i : i + m])
            err = torch.mul(Wt[i], scale[i], out=Errt[i])
            Wt[i:].addr_(Hinv1[i, i:], err, alpha=-1)
        W[:, i1:i2] = Wt.masked_fill_(block_mask, 0.0).t()
        W[:, i2:] -= Errt.t() @ Hinv[i1:i2, i2:]
        mask[:, i1:i2] = block_mask.t()
    return W, mask


def sparsegpt_reference(
    W: torch.Tensor,
    H: torch.Tensor,
    sparsity: float,
    previous: torch.Tensor,
    nm: tuple[int, int] | None = None,
    blocksize: int = 128,
    percdamp: float = DEFAULT_DAMP_A,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT's column loop as published (Frantar & Alistarh, 2023): `sparsegpt`'s reference and yardstick."""
    W, Hinv = sweep_inputs(W, H, percdamp, dtype)
    C = W.shape[1]
    mask = torch.zeros_like(previous)
    for i1 in range(0, C, blocksize):
        i2 = min(i1 + blocksize, C)
        W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        d = Hinv1.diagonal()
        saliency = (W1.square() / d.square()).masked_fill(previous[:, i1:i2], float("-inf"))
        if nm is None:
            k = round(sparsity * saliency.numel())
            block_mask = torch.zeros_like(saliency, dtype=torch.bool)
            if k:
                block_mask.view(-1)[saliency.reshape(-1).topk(k, largest=False).indices] = True
        else:
            block_mask = torch.zeros_like(saliency, dtype=torch.bool)
        for i in range(i2 - i1):
            if nm is not None and i % nm[1] == 0:
                n, m = nm
                group = (W1[:, i : i + m].square() / d[i : i + m].square())
                group = group.masked_fill(previous[:, i1 + i : i1 + i + m], float("-inf"))
                block_mask.scatter_(1, i + group.topk(m - n, dim=1, largest=False).indices, True)
            w = W1[:, i]
            q = w.masked_fill(block_mask[:, i], 0.0)
            err = (w - q) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) * Hinv1[i, i:].unsqueeze(0)
            W1[:, i] = q
            Err1[:, i] = err
        W[:, i1:i2] = W1
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
        mask[:, i1:i2] = block_mask
    return W.masked_fill(mask, 0.0), mask


def sweep_inputs(W: torch.Tensor, H: torch.Tensor, percdamp: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The sweep's copy of W and the upper Cholesky factor of the damped H⁻¹, dead inputs (H_cc = 0) zeroed.

    Raises `SurgeonError` when W or H holds a NaN or an infinity: no mask chosen from such saliencies means anything.
    """
    require_finite({"the weights W": W, "the inputs' matrix H": H})
    W = W.to(dtype, copy=True)
    H = H.to(dtype, copy=True)
    dead = H.diagonal() == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H = damp(H, percdamp)
    return W, torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)


def smallest(saliency: torch.Tensor, before: torch.Tensor, k: int) -> torch.Tensor:
    """The mask of the k smallest saliencies, those `before` first and ties in order, by selection, not a sort."""
    flat = saliency.masked_fill(before, float("-inf")).reshape(-1)
    if k == 0:
        return torch.zeros_like(saliency, dtype=torch.bool)
    tau = flat.kthvalue(k).values
    below, tied = flat < tau, flat == tau
    return (below | (tied & (tied.cumsum(0) <= k - below.sum()))).reshape(saliency.shape)
