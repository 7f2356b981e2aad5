"""Plain-PyTorch reference of the batched symmetric eigendecomposition."""

from typing import cast

import torch


def batched_eigh(A: torch.Tensor, Q0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues [B, n] (ascending) and eigenvectors [B, n, n] of symmetric A [B, n, n].

    With a warm start Q0 (e.g. the previous shot's eigenvectors) the problem solved is
    Q0ᵀ A Q0 = Q' Λ Q'ᵀ, returning Q0 Q' — the same decomposition of A.
    """
    if Q0 is None:
        return cast(tuple[torch.Tensor, torch.Tensor], torch.linalg.eigh(A))
    values, vectors = torch.linalg.eigh(Q0.mT @ A @ Q0)
    return values, Q0 @ vectors
