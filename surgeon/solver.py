"""LLM Surgeon's costs and updates for one layer, as pure functions of tensors (docs/DESIGN.md).

A layer `y = W a` has weights W [R, C] (a bias, if any, as a last column of W and of A) and
curvature F ≈ G ⊗ A with G [R, R], A [C, C] the damped, symmetric positive definite Kronecker
factors (eq. 6), in W's floating dtype, on any device. With θ = vec(W) row-major,
F⁻¹ = G⁻¹ ⊗ A⁻¹ and the quadratic model of the loss change is ½ tr(ΔWᵀ G ΔW A).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from surgeon import costs, updates
from surgeon.config import ChunkSemantics
from surgeon.inverses import KroneckerInverse


def _check_factors(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> None:
    """W [R, C] with G [R, R] and A [C, C] of one floating dtype, or a ValueError naming the mismatch."""
    if W.dim() != 2:
        raise ValueError(f"W must be a matrix [R, C], not {list(W.shape)}")
    R, C = W.shape
    if G.shape != (R, R) or A.shape != (C, C):
        raise ValueError(f"W is {R}×{C}, so G must be {R}×{R} and A {C}×{C}; got G {list(G.shape)}, A {list(A.shape)}")
    if not (W.is_floating_point() and G.dtype == W.dtype and A.dtype == W.dtype):
        raise TypeError(f"W, G and A must share one floating dtype; got {W.dtype}, {G.dtype}, {A.dtype}")


def element_costs(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Independent OBS cost of removing each weight, ½ W_rc² / ([G⁻¹]_rr [A⁻¹]_cc) (eq. 7): [R, C]."""
    _check_factors(W, G, A)
    return costs.element_costs(W, KroneckerInverse.of(G, A, roots=True))


def row_costs(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Independent cost of removing each row, ½ w_rᵀ A w_r / [G⁻¹]_rr (eq. 7): [R]."""
    _check_factors(W, G, A)
    return costs.structure_costs(((W @ A) * W).sum(1), KroneckerInverse.of(G, A, roots=True).G_diagonal)


def col_costs(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Independent cost of removing each column, ½ w_cᵀ G w_c / [A⁻¹]_cc (eq. 7): [C]."""
    _check_factors(W, G, A)
    return costs.structure_costs(((G @ W) * W).sum(0), KroneckerInverse.of(G, A, roots=True).A_diagonal)


def as_indices(index: torch.Tensor | Sequence[int], size: int, name: str) -> torch.Tensor:
    """Sorted unique int64 indices in [0, size) from a boolean mask [size] (True = selected) or from indices."""
    if not isinstance(index, torch.Tensor):
        try:
            index = torch.as_tensor(index, dtype=torch.long)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{name} must be a boolean mask [{size}] or a sequence of indices") from error
    if index.dtype == torch.bool:
        if index.shape != (size,):
            raise ValueError(f"{name} as a boolean mask must have shape [{size}], not {list(index.shape)}")
        return index.nonzero().squeeze(1)
    if index.is_floating_point() or index.is_complex() or index.dim() > 1:
        raise TypeError(f"{name} must be a boolean mask [{size}] or 1-D integer indices, not {index.dtype} "
                        f"{list(index.shape)}")
    index = index.reshape(-1).long()
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        raise ValueError(f"{name} holds indices outside [0, {size})")
    unique = index.unique()
    if unique.numel() != index.numel():
        raise ValueError(f"{name} holds repeated indices")
    return unique


def structured_update(
    W: torch.Tensor, G: torch.Tensor, A: torch.Tensor, rows: torch.Tensor | Sequence[int],
    cols: torch.Tensor | Sequence[int],
) -> torch.Tensor:
    """Remove rows and columns with the exact joint correlated update (sec. 3.4): new W [R, C].

    rows and cols are the removed structures, each as a boolean mask ([R], [C]; True = remove) or
    as indices. The result is the minimiser of ½ tr(ΔWᵀ G ΔW A) with removed rows and columns
    exactly zero.
    """
    _check_factors(W, G, A)
    R, C = W.shape
    rows, cols = as_indices(rows, R, "rows").to(W.device), as_indices(cols, C, "cols").to(W.device)
    return updates.structured(W, KroneckerInverse.of(G, A, roots=True), rows, cols, "joint")


def unstructured_update(
    W: torch.Tensor,
    G: torch.Tensor,
    A: torch.Tensor,
    mask: torch.Tensor,
    max_correlate: int | None = None,
    semantics: ChunkSemantics = "sequential",
    tol: float | None = None,
    max_iter: int | None = None,
) -> torch.Tensor:
    """Remove the weights in `mask` (True = prune) with correlated updates (eqs. 4-5): new W [R, C].

    mask is a boolean [R, C]. max_correlate None solves all pruned weights jointly, exactly with the
    default tol=None (a direct solve up to `updates.DIRECT_SOLVE_MAX` weights, else conjugate
    gradients to the dtype's precision), or by conjugate gradients to relative residual `tol` in at
    most `max_iter` iterations; an integer solves chunks of at most that many weights (the reference
    code's approximation), their semantics `sequential` or `independent`.
    """
    _check_factors(W, G, A)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != W.shape:
        raise ValueError(f"mask must be a boolean tensor of W's shape {list(W.shape)} (True = prune)")
    return updates.unstructured(W, KroneckerInverse.of(G, A), mask, max_correlate, semantics, tol, max_iter)


def quadratic_loss(delta: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """½ vec(ΔW)ᵀ (G ⊗ A) vec(ΔW) = ½ tr(ΔWᵀ G ΔW A), the local loss model (eq. 2)."""
    return 0.5 * (delta * (G @ delta @ A)).sum()
