"""Costs and correlated weight updates from Kronecker factors (paper sec. 3.3-3.4, docs/DESIGN.md).

A layer `y = W a` has weights W [R, C] and curvature F ≈ G ⊗ A with G [R, R], A [C, C] (already
damped, symmetric positive definite). With θ = vec(W) row-major, F⁻¹ = G⁻¹ ⊗ A⁻¹ and the
quadratic model of the loss change is ½ tr(ΔWᵀ G ΔW A). Every function here is a pure function
of tensors (float32 or float64, CPU or GPU); the public API is `row_costs`, `col_costs`,
`element_costs`, `structured_update` and `unstructured_update`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from surgeon.config import ChunkSemantics, Correlation
from surgeon_kernels import ops

if TYPE_CHECKING:
    from surgeon.kronecker_sum import KroneckerSum  # it inverts with `inverse_root` from here


def spd_inverse(matrix: torch.Tensor) -> torch.Tensor:
    """Inverse of a symmetric positive definite matrix by Cholesky (eigendecomposition fallback)."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if int(info) == 0:
        return torch.cholesky_inverse(factor)  # symmetric by construction (one triangle mirrored)
    inverse = eigen_solve(matrix.double().unsqueeze(0)).squeeze(0).to(matrix.dtype)
    return (inverse + inverse.T) / 2


def inverse_root(matrix: torch.Tensor) -> torch.Tensor:
    """Upper-triangular U with U Uᵀ = M⁻¹ (U = L⁻ᵀ for M = L Lᵀ): one triangular solve, no inverse.

    Where Cholesky fails, M's eigenvalues are floored as in `eigen_solve` and the repaired matrix
    is factored in float64.
    """
    factor, info = torch.linalg.cholesky_ex(matrix)
    if int(info) != 0:
        values, vectors = floored_eigh(matrix.double().unsqueeze(0))
        repaired = (vectors * values.unsqueeze(1)) @ vectors.mT
        factor = torch.linalg.cholesky(repaired.squeeze(0)).to(matrix.dtype)
    return lower_inverse_(factor).T


# Devices on which `lower_inverse_` works by row blocks of GEMMs; elsewhere one triangular solve
# against I, as measured in the H100 runs. On the 2-core CPU at n = 1536 (bench/bench_inverse_root.py,
# bench/RESULTS.md, medians): row blocks 13.5-13.9 ms, recursive halves (two full GEMMs a level, twice
# the flops) 19.1-20.7 ms, a triangular solve against I 36.1-38.8 ms.
BLOCKED_INVERSE_ON = ("cpu",)
INVERSE_BLOCK = 128


def lower_inverse_(L: torch.Tensor) -> torch.Tensor:
    """L⁻¹ written over a lower-triangular L, by row blocks: X_ii = L_ii⁻¹, X_ij = −X_ii Σ_{j≤l<i} L_il X_lj.

    Row block i reads only row block i of L and the rows of X above it, so X replaces L block by
    block (no n×n buffer). Each column block j of the sum is one GEMM over the rows l ≥ j where
    X_lj is not zero, so the products skip the zero triangle (n³/3 flops in all, the least a
    triangular inverse needs).
    """
    n = L.shape[0]
    if n <= INVERSE_BLOCK or L.device.type not in BLOCKED_INVERSE_ON:
        return L.copy_(torch.linalg.solve_triangular(L, torch.eye(n, dtype=L.dtype, device=L.device), upper=False))
    eye = torch.eye(INVERSE_BLOCK, dtype=L.dtype, device=L.device)
    partial = L.new_empty(INVERSE_BLOCK, n)
    edges = list(range(0, n, INVERSE_BLOCK)) + [n]
    for i, (s, e) in enumerate(zip(edges, edges[1:])):
        X_ii = torch.linalg.solve_triangular(L[s:e, s:e], eye[: e - s, : e - s], upper=False)
        if i:
            sums = partial[: e - s, :s]
            for js, je in zip(edges[:i], edges[1:i + 1]):
                torch.mm(L[s:e, js:s], L[js:s, js:je], out=sums[:, js:je])  # rows above i already hold X
            torch.mm(X_ii.neg(), sums, out=L[s:e, :s])
        L[s:e, s:e] = X_ii
    return L


def floored_eigh(M: torch.Tensor, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (tiny ones raised to √eps·max|λ|) and eigenvectors of symmetric M [B, n, n].

    The floor bounds the condition number by 1/√eps (a floor near eps would let rounding noise in
    the near-null space through, multiplied by 1/eps). An all-zero matrix (a layer the loss does not
    see) is floored at √eps, as if it were the identity.
    """
    values, vectors = ops.batched_eigh(M, backend=backend)
    scale = values.abs().amax(1, keepdim=True)
    floor = torch.where(scale > 0, scale, torch.ones_like(scale)) * torch.finfo(M.dtype).eps ** 0.5
    return values.clamp_min(floor), vectors


def eigen_solve(M: torch.Tensor, rhs: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """M⁻¹ rhs (or M⁻¹) for a batch of symmetric M [B, n, n] via Q diag(1/λ) Qᵀ, tiny λ floored.

    The robust path where Cholesky fails (`floored_eigh`).
    """
    values, vectors = floored_eigh(M, backend)
    scaled = vectors / values.unsqueeze(1)
    if rhs is None:
        return scaled @ vectors.mT
    return scaled @ (vectors.mT @ rhs)


@dataclass(frozen=True)
class InverseDiagonals:
    """diag(G⁻¹) [R] and diag(A⁻¹) [C] of one layer: all that its element costs (eq. 7) read of F⁻¹."""

    G_inv: torch.Tensor
    A_inv: torch.Tensor

    @classmethod
    def of(cls, f: Factors | RootFactors) -> InverseDiagonals:
        """Copies of f's inverse diagonals (views would keep its dense inverses alive)."""
        return cls(f.G_inv_diagonal().clone(), f.A_inv_diagonal().clone())

    def element_inverse_diagonal(self) -> torch.Tensor:
        """[F⁻¹]_(rc),(rc) = [G⁻¹]_rr [A⁻¹]_cc as an [R, C] matrix."""
        return torch.outer(self.G_inv, self.A_inv)


class _KroneckerInverse(abc.ABC):
    """What element costs and the joint update read of F⁻¹ = G⁻¹ ⊗ A⁻¹ (shared with `KroneckerSum`)."""

    @abc.abstractmethod
    def G_inv_diagonal(self) -> torch.Tensor:
        """diag(G⁻¹)."""

    @abc.abstractmethod
    def A_inv_diagonal(self) -> torch.Tensor:
        """diag(A⁻¹)."""

    @abc.abstractmethod
    def dense_inverses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """G⁻¹ and A⁻¹."""

    def element_inverse_diagonal(self) -> torch.Tensor:
        """[F⁻¹]_(rc),(rc) = [G⁻¹]_rr [A⁻¹]_cc as an [R, C] matrix."""
        return InverseDiagonals(self.G_inv_diagonal(), self.A_inv_diagonal()).element_inverse_diagonal()

    def inverse_apply(self, V: torch.Tensor) -> torch.Tensor:
        """F⁻¹ vec(V) as a matrix: G⁻¹ V A⁻¹."""
        G_inv, A_inv = self.dense_inverses()
        return G_inv @ V @ A_inv


@dataclass(frozen=True)
class Factors(_KroneckerInverse):
    """Damped Kronecker factors G [R, R], A [C, C] of one layer and their inverses.

    Costs need all four; updates need only the inverses (see `inverses_only`).
    """

    G: torch.Tensor | None
    A: torch.Tensor | None
    G_inv: torch.Tensor
    A_inv: torch.Tensor

    @classmethod
    def of(cls, G: torch.Tensor, A: torch.Tensor) -> Factors:
        """Invert the (damped, SPD) factors once for all costs and updates of a layer."""
        return cls(G, A, spd_inverse(G), spd_inverse(A))

    def inverses_only(self) -> Factors:
        """The same factors without G and A, which updates do not use (halves what is kept)."""
        return Factors(None, None, self.G_inv, self.A_inv)

    def G_inv_diagonal(self) -> torch.Tensor:
        """diag(G⁻¹)."""
        return self.G_inv.diagonal()

    def A_inv_diagonal(self) -> torch.Tensor:
        """diag(A⁻¹)."""
        return self.A_inv.diagonal()

    def inverse_rows(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G⁻¹[rows, :] and A⁻¹[cols, :]."""
        return self.G_inv[rows], self.A_inv[cols]

    def dense_inverses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """G⁻¹ and A⁻¹."""
        return self.G_inv, self.A_inv


@dataclass(frozen=True)
class RootFactors(_KroneckerInverse):
    """Damped G, A and upper-triangular U_G, U_A with U Uᵀ = G⁻¹, A⁻¹ (`inverse_root`).

    Structured pruning needs only the inverses' diagonals (costs) and the rows of the removed
    rows/columns (updates): from the roots they cost O(n²) and O(|P| n²), where a full inverse
    (`Factors`) costs a second n³ triangular solve.
    """

    G: torch.Tensor | None
    A: torch.Tensor | None
    U_G: torch.Tensor
    U_A: torch.Tensor

    @classmethod
    def of(cls, G: torch.Tensor, A: torch.Tensor) -> RootFactors:
        """The inverse roots of the (damped, SPD) factors."""
        return cls(G, A, inverse_root(G), inverse_root(A))

    def G_inv_diagonal(self) -> torch.Tensor:
        """diag(G⁻¹): the squared row norms of U_G."""
        return self.U_G.square().sum(1)

    def A_inv_diagonal(self) -> torch.Tensor:
        """diag(A⁻¹): the squared row norms of U_A."""
        return self.U_A.square().sum(1)

    def inverse_rows(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G⁻¹[rows, :] = U_G[rows] U_Gᵀ and A⁻¹[cols, :] = U_A[cols] U_Aᵀ."""
        return self.U_G[rows] @ self.U_G.T, self.U_A[cols] @ self.U_A.T

    def dense_inverses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """G⁻¹ and A⁻¹ in full (one product each)."""
        return self.U_G @ self.U_G.T, self.U_A @ self.U_A.T


def damping(diagonal: torch.Tensor, strength: float) -> torch.Tensor:
    """δ = λ·mean(diag M), what `damp` adds to the diagonal of M (paper app. "Dampening")."""
    return strength * diagonal.mean()


def damp(matrix: torch.Tensor, strength: float) -> torch.Tensor:
    """`M + λ·mean(diag M)·I` (paper app. "Dampening")."""
    out = matrix.clone()
    out.diagonal().add_(damping(matrix.diagonal(), strength))
    return out


def damped_quadratic(raw: torch.Tensor, W: torch.Tensor, diagonal: torch.Tensor, strength: float,
                     dim: int) -> torch.Tensor:
    """wᵀ (M + δI) w = wᵀ M w + δ‖w‖² for each row (dim=1) or column (dim=0) w of W, given `raw` = wᵀ M w.

    δ = `damping(diagonal, strength)` with `diagonal` = diag M: the damped numerators of eq. 7
    from undamped ones (`curvature.LayerFactors.row_quadratic`, `col_quadratic`).
    """
    return raw + damping(diagonal, strength) * W.square().sum(dim)


# ---------------------------------------------------------------- costs (eq. 7)


def element_costs_of(W: torch.Tensor,
                     f: Factors | RootFactors | KroneckerSum | InverseDiagonals) -> torch.Tensor:
    """L_rc = ½ W_rc² / [F⁻¹]_(rc),(rc) = ½ W_rc² / ([G⁻¹]_rr [A⁻¹]_cc) for one Kronecker factor (eq. 7, elements)."""
    return 0.5 * W.square() / f.element_inverse_diagonal()


def structure_costs(quadratic: torch.Tensor, inverse_diagonal: torch.Tensor) -> torch.Tensor:
    """L_r = ½ w_rᵀ A w_r / [G⁻¹]_rr, L_c = ½ w_cᵀ G w_c / [A⁻¹]_cc (eq. 7, rows and columns) from the numerators."""
    return 0.5 * quadratic / inverse_diagonal


def row_costs_of(W: torch.Tensor, f: Factors | RootFactors) -> torch.Tensor:
    """L_r = ½ w_rᵀ A w_r / [G⁻¹]_rr (eq. 7, rows)."""
    if f.A is None:
        raise ValueError("row costs need the factor A itself, not only its inverse")
    return structure_costs(((W @ f.A) * W).sum(1), f.G_inv_diagonal())


def col_costs_of(W: torch.Tensor, f: Factors | RootFactors) -> torch.Tensor:
    """L_c = ½ w_cᵀ G w_c / [A⁻¹]_cc (eq. 7, columns)."""
    if f.G is None:
        raise ValueError("column costs need the factor G itself, not only its inverse")
    return structure_costs(((f.G @ W) * W).sum(0), f.A_inv_diagonal())


def element_costs(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Independent OBS cost of removing each weight (eq. 7): [R, C]."""
    return element_costs_of(W, RootFactors.of(G, A))


def row_costs(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Independent cost of removing each row (eq. 7): [R]."""
    return row_costs_of(W, RootFactors.of(G, A))


def col_costs(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Independent cost of removing each column (eq. 7): [C]."""
    return col_costs_of(W, RootFactors.of(G, A))


# ---------------------------------------------------------------- structured updates (sec. 3.4)


def _whole(index: torch.Tensor | slice, size: int) -> bool:
    """Whether `index` is a tensor holding 0, 1, …, size−1: indexing with it changes nothing."""
    return (isinstance(index, torch.Tensor) and index.numel() == size
            and bool((index == torch.arange(size, device=index.device)).all()))


def submatrix(M: torch.Tensor, rows: torch.Tensor | slice, cols: torch.Tensor | slice) -> torch.Tensor:
    """M[rows][:, cols] for reading: index tensors through `index_select` (several times faster than advanced
    indexing on the CPU); M itself, not a copy, where both take everything (a first shot's kept rows and columns)."""
    if _whole(rows, M.shape[0]) and _whole(cols, M.shape[1]):
        return M
    M = M.index_select(0, rows) if isinstance(rows, torch.Tensor) else M[rows]
    return M.index_select(1, cols) if isinstance(cols, torch.Tensor) else M[:, cols]


def put_submatrix(M: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """M[rows[:, None], cols] = block through two `index_copy_` (2× faster than 2-D advanced indexing); returns M."""
    if _whole(rows, M.shape[0]) and _whole(cols, M.shape[1]):
        return M.copy_(block)
    return M.index_copy_(0, rows, M.index_select(0, rows).index_copy_(1, cols, block))


def _complement(index: torch.Tensor, size: int) -> torch.Tensor:
    keep = torch.ones(size, dtype=torch.bool, device=index.device)
    keep[index] = False
    return keep.nonzero().squeeze(1)


def structured_update_of(
    W: torch.Tensor, f: Factors | RootFactors, rows: torch.Tensor, cols: torch.Tensor,
    correlation: Correlation = "joint",
) -> torch.Tensor:
    """New W with rows P and columns Q removed and the kept block corrected (sec. 3.4, docs/DESIGN.md).

    joint: the exact minimiser of ½ tr(ΔWᵀ G ΔW A) with ΔW = −W on P rows and Q columns, i.e.
    Z = −G_KK⁻¹ (G D A)[K_r, K_c] A_KK⁻¹, evaluated with Schur complements of G⁻¹ and A⁻¹:
    with B = G⁻¹[K_r, P] (G⁻¹[P, P])⁻¹ and M = B W[P, :] − W[K_r, :]·1_Q,
    Z = −M[:, K_c] + M[:, Q] (A⁻¹[Q, Q])⁻¹ A⁻¹[Q, K_c].
    within: the reference code's form, the rows-only update −G⁻¹[:, P] (G⁻¹[P, P])⁻¹ W[P, :] plus
    the columns-only update −W[:, Q] (A⁻¹[Q, Q])⁻¹ A⁻¹[Q, :], both from the original W.
    """
    R, C = W.shape
    rows, cols = rows.to(W.device).long(), cols.to(W.device).long()
    keep_r, keep_c = _complement(rows, R), _complement(cols, C)
    G_inv_P, A_inv_Q = f.inverse_rows(rows, cols)  # G⁻¹[P, :], A⁻¹[Q, :]
    B = torch.linalg.solve(G_inv_P.index_select(1, rows), G_inv_P.index_select(1, keep_r)).T  # [|K_r|, |P|]
    W_K = W.index_select(0, keep_r)
    kept_rows = W_K - B @ W.index_select(0, rows)  # W[K_r, :] after the rows-only update
    if correlation == "joint":
        M_q = -kept_rows.index_select(1, cols)
    elif correlation == "within":
        M_q = -W_K.index_select(1, cols)
    else:
        raise ValueError(f"correlation={correlation!r}: use 'joint' or 'within'")
    col_solve = torch.linalg.solve(A_inv_Q.index_select(1, cols), A_inv_Q.index_select(1, keep_c))  # [|Q|, |K_c|]
    return put_submatrix(torch.zeros_like(W), keep_r, keep_c, kept_rows.index_select(1, keep_c) + M_q @ col_solve)


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


def _check_factors(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> None:
    """W [R, C] with G [R, R] and A [C, C] of one floating dtype, or a ValueError naming the mismatch."""
    if W.dim() != 2:
        raise ValueError(f"W must be a matrix [R, C], not {list(W.shape)}")
    R, C = W.shape
    if G.shape != (R, R) or A.shape != (C, C):
        raise ValueError(f"W is {R}×{C}, so G must be {R}×{R} and A {C}×{C}; got G {list(G.shape)}, A {list(A.shape)}")
    if not (W.is_floating_point() and G.dtype == W.dtype and A.dtype == W.dtype):
        raise TypeError(f"W, G and A must share one floating dtype; got {W.dtype}, {G.dtype}, {A.dtype}")


def structured_update(
    W: torch.Tensor, G: torch.Tensor, A: torch.Tensor, rows: torch.Tensor | Sequence[int],
    cols: torch.Tensor | Sequence[int],
) -> torch.Tensor:
    """Remove rows and columns with the exact joint correlated update (sec. 3.4): new W [R, C].

    W [R, C] (a bias, if any, as a last column of W and of A); G [R, R] and A [C, C] the damped,
    symmetric positive definite Kronecker factors (eq. 6) in W's dtype; rows and cols the removed
    structures, each as a boolean mask ([R], [C]; True = remove) or as indices. The result is the
    minimiser of ½ tr(ΔWᵀ G ΔW A) with removed rows and columns exactly zero.
    """
    _check_factors(W, G, A)
    R, C = W.shape
    rows, cols = as_indices(rows, R, "rows").to(W.device), as_indices(cols, C, "cols").to(W.device)
    return structured_update_of(W, RootFactors.of(G, A), rows, cols, "joint")


# ---------------------------------------------------------------- element updates (eqs. 4-5)


def row_chunks(rows: torch.Tensor, max_correlate: int | None) -> list[slice]:
    """Split row-major pruned indices into chunks of whole rows of at most `max_correlate` entries.

    A row with more than `max_correlate` pruned entries is split into pieces of that size.
    """
    total = rows.numel()
    if total == 0:
        return []
    if max_correlate is None or max_correlate >= total:
        return [slice(0, total)]
    starts = torch.ones(total, dtype=torch.bool)
    starts[1:] = rows[1:].cpu() != rows[:-1].cpu()
    boundaries = starts.nonzero().squeeze(1).tolist() + [total]
    chunks, begin = [], 0
    for row_start, row_end in zip(boundaries[:-1], boundaries[1:]):
        if row_end - begin > max_correlate and row_start > begin:
            chunks.append(slice(begin, row_start))
            begin = row_start
        while row_end - begin > max_correlate:
            chunks.append(slice(begin, begin + max_correlate))
            begin += max_correlate
    if begin < total:
        chunks.append(slice(begin, total))
    return chunks


def solve_chunks(
    f: Factors, r: torch.Tensor, c: torch.Tensor, w: torch.Tensor, chunks: list[slice],
    budget: int | None = None, backend: str = "auto",
) -> torch.Tensor:
    """u_S = M_S⁻¹ w_S for every chunk S, with M_S[i, j] = [G⁻¹]_{r_i r_j} [A⁻¹]_{c_i c_j} (eq. 4).

    `chunks` tile the pruned weights in order. `ops.kk_solve` gathers and solves them by Cholesky
    (compiled: each at its own size; PyTorch: padded batches of similar length, at most `budget`
    entries, default `kk_solve.reference.BUDGET`); a system Cholesky rejects takes the eigen path
    (`eigen_solve`). Returns u aligned with r, c, w.
    """
    if [chunk.start for chunk in chunks[1:]] != [chunk.stop for chunk in chunks[:-1]] or (
            chunks and (chunks[0].start != 0 or chunks[-1].stop != w.numel())):
        raise ValueError("chunks must tile the pruned weights in order")
    offsets = torch.tensor([0] + [chunk.stop for chunk in chunks], dtype=torch.int64, device=w.device)
    u, failed = ops.kk_solve(f.G_inv, f.A_inv, r, c, w, offsets, budget, backend)
    for b in failed.nonzero().squeeze(1).tolist():
        chunk = chunks[b]
        valid = torch.ones(1, chunk.stop - chunk.start, dtype=torch.bool, device=w.device)
        M = ops.kk_gather(f.G_inv, f.A_inv, r[chunk].unsqueeze(0), c[chunk].unsqueeze(0), valid, backend)
        u[chunk] = eigen_solve(M, w[chunk].reshape(1, -1, 1), backend).reshape(-1)
    return u


DIRECT_SOLVE_MAX = 4096  # joint_solve with tol=None: up to this many pruned weights, M is formed and solved
CG_MIN_ITERATIONS = 1000  # joint_solve with max_iter=None: at least this many iterations (and at least K)


def cg_tolerance(dtype: torch.dtype) -> float:
    """The relative residual at which conjugate gradients stop by default: 1e-13 in float64, 1e-6 below."""
    return 1e-13 if dtype == torch.float64 else 1e-6


def joint_solve(
    f: Factors | KroneckerSum, r: torch.Tensor, c: torch.Tensor, w: torch.Tensor,
    shape: torch.Size | tuple[int, int], tol: float | None = None, max_iter: int | None = None,
) -> torch.Tensor:
    """u = M⁻¹ w for all K pruned weights at once, M = F⁻¹[S, S] (eqs. 4-5, one chunk).

    tol=None asks for the exact solution: with `Factors` and K ≤ DIRECT_SOLVE_MAX, M = G⁻¹[r, r] ∘
    A⁻¹[c, c] is formed and solved directly; otherwise conjugate gradients run to relative residual
    `cg_tolerance(dtype)`. Jacobi-preconditioned conjugate gradients never form M: M u = (F⁻¹ vec(V))[S]
    with V the scatter of u into an R×C matrix (G⁻¹ V A⁻¹: two GEMMs per iteration; four for a
    `KroneckerSum`); they stop when ‖w − M u‖ ≤ tol·‖w‖ or after `max_iter` iterations (None:
    max(K, CG_MIN_ITERATIONS)).
    """
    if tol is None and isinstance(f, Factors) and 0 < w.numel() <= DIRECT_SOLVE_MAX:
        M = submatrix(f.G_inv, r, r) * submatrix(f.A_inv, c, c)
        return torch.linalg.solve(M, w)
    tol = cg_tolerance(w.dtype) if tol is None else tol
    max_iter = max(w.numel(), CG_MIN_ITERATIONS) if max_iter is None else max_iter
    u = torch.zeros_like(w)
    bound = tol * torch.linalg.vector_norm(w)
    if w.numel() == 0 or bound == 0:
        return u
    V = torch.zeros(shape, dtype=w.dtype, device=w.device)

    def apply(x: torch.Tensor) -> torch.Tensor:
        V[r, c] = x
        return f.inverse_apply(V)[r, c]

    inv_diag = 1.0 / f.element_inverse_diagonal()[r, c]
    residual = w.clone()
    z = residual * inv_diag
    direction, rz = z.clone(), residual @ z
    for _ in range(max_iter):
        product = apply(direction)
        step = rz / (direction @ product)
        u += step * direction
        residual -= step * product
        if torch.linalg.vector_norm(residual) <= bound:
            break
        z = residual * inv_diag
        rz, rz_old = residual @ z, rz
        direction = z + (rz / rz_old) * direction
    return u


def unstructured_update_of(
    W: torch.Tensor,
    f: Factors | KroneckerSum,
    mask: torch.Tensor,
    max_correlate: int | None = None,
    semantics: ChunkSemantics = "sequential",
    tol: float | None = None,
    max_iter: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """New W with the weights in `mask` removed and the rest corrected (eqs. 4-5, docs/DESIGN.md).

    max_correlate=None: all pruned weights solved jointly (exact eqs. 4-5) by `joint_solve`, with
    relative residual `tol` in at most `max_iter` iterations (None: exact, see `joint_solve`).
    Otherwise pruned weights are split into chunks of whole rows (at most `max_correlate` each). Each chunk
    solves u = M⁻¹ w and scatters u into V; the update is ΔW = −G⁻¹ V A⁻¹.
    independent: every chunk's w comes from the original W, so all chunks are solved in batches,
    then one pair of GEMMs updates the layer.
    sequential: chunk b's w includes the updates of chunks before it (the reference's
    "addupdate"), kept as U = V A⁻¹ accumulated row-block by row-block, so the correction at
    chunk b is (G⁻¹[rows_b, :] U)[entries] — O(R²C + RC²) per layer in all.
    A `KroneckerSum` takes the joint solve only: ΔW = −F̃⁻¹ vec(V).
    """
    if semantics not in ("sequential", "independent"):
        raise ValueError(f"semantics={semantics!r}: use 'sequential' or 'independent'")
    r, c = mask.nonzero(as_tuple=True)
    U = torch.zeros_like(W)
    if max_correlate is None:
        U[r, c] = joint_solve(f, r, c, W[r, c], W.shape, tol, max_iter)
        delta = f.inverse_apply(U)
    elif not isinstance(f, Factors):
        raise ValueError("a sum of Kronecker factors needs the joint solve (max_correlate=None)")
    else:
        chunks = row_chunks(r, max_correlate)
        if semantics == "independent":
            U[r, c] = solve_chunks(f, r, c, W[r, c], chunks, backend=backend)
            U = U @ f.A_inv
        else:
            for chunk in chunks:
                rb, cb = r[chunk], c[chunk]
                block_rows, local = torch.unique(rb, return_inverse=True)
                w = W[rb, cb] - (f.G_inv[block_rows] @ U)[local, cb]
                V = torch.zeros(block_rows.numel(), W.shape[1], dtype=W.dtype, device=W.device)
                V[local, cb] = solve_chunks(f, rb, cb, w, [slice(0, rb.numel())], backend=backend)
                U[block_rows] += V @ f.A_inv
        delta = f.G_inv @ U
    out = W - delta
    out[mask] = 0
    return out


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

    W [R, C]; G [R, R] and A [C, C] damped SPD factors in W's dtype; mask a boolean [R, C].
    max_correlate None solves all pruned weights jointly, exactly with the default tol=None (a direct
    solve up to DIRECT_SOLVE_MAX weights, else conjugate gradients to the dtype's precision), or
    by conjugate gradients to relative residual `tol` in at most `max_iter` iterations; an integer
    solves chunks of at most that many weights (the reference code's approximation).
    """
    _check_factors(W, G, A)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != W.shape:
        raise ValueError(f"mask must be a boolean tensor of W's shape {list(W.shape)} (True = prune)")
    return unstructured_update_of(W, Factors.of(G, A), mask, max_correlate, semantics, tol, max_iter)


def quadratic_loss(delta: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """½ vec(ΔW)ᵀ (G ⊗ A) vec(ΔW) = ½ tr(ΔWᵀ G ΔW A), the local loss model (eq. 2)."""
    return 0.5 * (delta * (G @ delta @ A)).sum()
