"""Plain-PyTorch reference of the K×K system gather."""

import torch


def kk_gather(G_inv: torch.Tensor, A_inv: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
              valid: torch.Tensor) -> torch.Tensor:
    """M[b, i, j] = G⁻¹[r_bi, r_bj]·A⁻¹[c_bi, c_bj] (eq. 4); identity where i or j is padding.

    Args:
        G_inv: [R, R], A_inv: [C, C] inverse Kronecker factors.
        rows, cols: [B, K] row and column of each chunk entry (any value where not valid).
        valid: [B, K] True on real entries (chunks shorter than K are padded).
    Returns:
        M: [B, K, K] in the factors' dtype.
    """
    M = G_inv[rows.unsqueeze(2), rows.unsqueeze(1)] * A_inv[cols.unsqueeze(2), cols.unsqueeze(1)]
    eye = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device).expand_as(M)
    return torch.where(valid.unsqueeze(2) & valid.unsqueeze(1), M, eye)
