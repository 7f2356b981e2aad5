"""What removing a weight, a row or a column costs (eq. 7), for every method (docs/DESIGN.md).

LLM Surgeon prices a structure by the loss increase ½ θ_Sᵀ ([F⁻¹]_SS)⁻¹ θ_S of setting it to zero
with F⁻¹ = G⁻¹ ⊗ A⁻¹ (`inverses.KroneckerInverse`); the OBD baselines by ½ W_rc² g_r a_c for a
diagonal curvature (magnitude: I ⊗ I, L-OBD: I ⊗ diag A, K-OBD: diag G ⊗ diag A). A structure
whose curvature diagonal is exactly zero is dead and costs 0 (`dead`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from surgeon.method.damping import damped_diagonal, damping
from surgeon.method.factors import LayerFactors
from surgeon.method.inverses import KroneckerInverse
from surgeon.method.submatrix import Index, submatrix


def element_costs(W: torch.Tensor, f: KroneckerInverse) -> torch.Tensor:
    """L_rc = ½ W_rc² / ([G⁻¹]_rr [A⁻¹]_cc) (eq. 7, elements)."""
    return 0.5 * W.square() / f.element_diagonal()


def structure_costs(quadratic: torch.Tensor, inverse_diagonal: torch.Tensor) -> torch.Tensor:
    """L_r = ½ w_rᵀ A w_r / [G⁻¹]_rr, L_c = ½ w_cᵀ G w_c / [A⁻¹]_cc (eq. 7, rows and columns) from the numerators."""
    return 0.5 * quadratic / inverse_diagonal


def damped_quadratic(raw: torch.Tensor, W: torch.Tensor, diagonal: torch.Tensor, strength: float,
                     dim: int) -> torch.Tensor:
    """wᵀ (M + δI) w = wᵀ M w + δ‖w‖² for each row (dim=1) or column (dim=0) w of W, given `raw` = wᵀ M w.

    δ = `damping(diagonal, strength)` with `diagonal` = diag M: the damped numerators of eq. 7
    from undamped ones (`LayerFactors.row_quadratic`, `col_quadratic`).
    """
    return raw + damping(diagonal, strength) * W.square().sum(dim)


def layer_structure_costs(W: torch.Tensor, entry: LayerFactors, f: KroneckerInverse, keep_r: torch.Tensor,
                          keep_c: torch.Tensor, real: int, strengths: tuple[float, float],
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Costs (eq. 7) of the kept rows and the first `real` kept columns of W, numerators from the curvature pass.

    Removed rows and columns of W are zero, so the pass's diag(W A Wᵀ) and diag(Wᵀ G W) are those
    of the kept block W[keep_r, keep_c]; damping by `strengths` (λ_G, λ_A) adds δ‖w‖²
    (`damped_quadratic`), the δ of the damped factors inverted in `f`. A bias column (last in
    `keep_c`) adds to row costs only.
    """
    if entry.G is None or entry.row_quadratic is None or entry.col_quadratic is None:
        raise ValueError("structure costs need G and the quadratic terms: estimate the curvature with need_g=True")
    sub = submatrix(W, keep_r, keep_c)
    row_q = damped_quadratic(entry.row_quadratic[keep_r], sub, entry.A.diagonal()[keep_c], strengths[1], 1)
    col_q = damped_quadratic(entry.col_quadratic[keep_c[:real]], sub[:, :real], entry.G.diagonal()[keep_r],
                             strengths[0], 0)
    return structure_costs(row_q, f.G_diagonal), structure_costs(col_q, f.A_diagonal[:real])


def diagonal_costs(W: torch.Tensor, g: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """OBD element costs ½ W_rc² g_r a_c for a diagonal curvature diag(g) ⊗ diag(a): [R, C]."""
    return 0.5 * W.square() * torch.outer(g, a)


def diagonal_curvature(entry: LayerFactors | None, shape: Sequence[int], device: torch.device,
                       strengths: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The damped diagonals g [R], a [C] of an R×C [W | b]'s curvature: of G and A where estimated, else ones (I)."""
    factors = (entry.G, entry.A) if entry is not None else (None, None)
    return tuple(  # type: ignore[return-value]
        torch.ones(size, device=device) if matrix is None else damped_diagonal(matrix.diagonal(), strength)
        for matrix, size, strength in zip(factors, shape, strengths))


def dead(entry: LayerFactors, rows: Index, cols: Index, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of `rows` (of R) and `cols` have an exactly zero raw curvature diagonal.

    Such a row's output never reaches the loss (G_rr = 0: e.g. a gate row whose down-projection
    column was removed) or such a column's input is always zero (A_cc = 0: e.g. the down-projection
    column of a removed gate row). Removing it changes nothing, so its cost is exactly 0 — the
    damped factors alone would price it like a live structure. Rows are never dead without G.
    """
    dead_cols = entry.A.diagonal()[cols] == 0
    if entry.G is None:
        return torch.zeros(R, dtype=torch.bool, device=dead_cols.device)[rows], dead_cols
    return entry.G.diagonal()[rows] == 0, dead_cols


def set_costs(W: torch.Tensor, root: torch.Tensor, M: torch.Tensor, size: int) -> torch.Tensor:
    """Cost of removing each set P of `size` consecutive rows of W whole (eq. 7 for a set): [rows / size].

    With F⁻¹ = G⁻¹ ⊗ A⁻¹ and S = P × all columns, [F⁻¹]_SS = G⁻¹[P, P] ⊗ A⁻¹, so
    L_P = ½ vec(W_P)ᵀ ((G⁻¹[P, P])⁻¹ ⊗ A) vec(W_P) = ½ tr((G⁻¹[P, P])⁻¹ W_P A W_Pᵀ), with
    G⁻¹[P, P] = U_P U_Pᵀ from the root U of G⁻¹ (`root`, [rows, rows]) and `M` the damped A. A single
    row is eq. 7's row cost. For sets of columns pass Wᵀ, the root of A⁻¹ and the damped G.
    """
    n = W.shape[0] // size
    numerators = (W @ M).reshape(n, size, -1) @ W.reshape(n, size, -1).mT
    blocks = root.reshape(n, size, -1)
    costs: torch.Tensor = 0.5 * torch.linalg.solve(blocks @ blocks.mT, numerators).diagonal(dim1=1, dim2=2).sum(1)
    return costs
