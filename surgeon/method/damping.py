"""Damping, one rule for every method: M + λ·mean(diag M)·I (paper app. "Dampening", docs/DESIGN.md)."""

from __future__ import annotations

import torch


def damping(diagonal: torch.Tensor, strength: float) -> torch.Tensor:
    """δ = λ·mean(diag M), what `damp` adds to the diagonal of M."""
    return strength * diagonal.mean()


def damp(matrix: torch.Tensor, strength: float) -> torch.Tensor:
    """M + λ·mean(diag M)·I, as a new matrix."""
    out = matrix.clone()
    out.diagonal().add_(damping(matrix.diagonal(), strength))
    return out


def damped_diagonal(diagonal: torch.Tensor, strength: float) -> torch.Tensor:
    """diag(M + λ·mean(diag M)·I) from diag(M): the diagonal curvature of the OBD baselines."""
    return diagonal + damping(diagonal, strength)
