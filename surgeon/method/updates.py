"""Correlated weight updates: structured (sec. 3.4) and element-wise (eqs. 4-5), docs/DESIGN.md.

A layer `y = W a` has weights W [R, C] and F⁻¹ = G⁻¹ ⊗ A⁻¹ (`inverses.KroneckerInverse`). Removing
a set S of weights changes W by the minimiser of ½ tr(ΔWᵀ G ΔW A) with ΔW_S = −W_S:
ΔW = −G⁻¹ V A⁻¹, where vec(V) is zero outside S and solves F⁻¹[S, S] v_S = w_S.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from surgeon.config import Correlation
from surgeon.method.damping import damp
from surgeon.method.inverses import KroneckerInverse, eigen_solve, spd_inverse
from surgeon.method.submatrix import put_submatrix, submatrix
from surgeon_kernels import ops

logger = logging.getLogger(__name__)


def _complement(index: torch.Tensor, size: int) -> torch.Tensor:
    keep = torch.ones(size, dtype=torch.bool, device=index.device)
    keep[index] = False
    return keep.nonzero().squeeze(1)


def structured(
    W: torch.Tensor, f: KroneckerInverse, rows: torch.Tensor, cols: torch.Tensor, correlation: Correlation = "joint",
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
    f: KroneckerInverse, r: torch.Tensor, c: torch.Tensor, w: torch.Tensor, chunks: list[slice],
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
    G_inv, A_inv = f.matrices()
    offsets = torch.tensor([0] + [chunk.stop for chunk in chunks], dtype=torch.int64, device=w.device)
    u, failed = ops.kk_solve(G_inv, A_inv, r, c, w, offsets, budget, backend)
    for b in failed.nonzero().squeeze(1).tolist():
        chunk = chunks[b]
        valid = torch.ones(1, chunk.stop - chunk.start, dtype=torch.bool, device=w.device)
        M = ops.kk_gather(G_inv, A_inv, r[chunk].unsqueeze(0), c[chunk].unsqueeze(0), valid, backend)
        u[chunk] = eigen_solve(M, w[chunk].reshape(1, -1, 1), backend).reshape(-1)
    return u


DIRECT_SOLVE_MAX = 4096  # joint_solve with tol=None: up to this many pruned weights, M is formed and solved
CG_MIN_ITERATIONS = 1000  # joint_solve with max_iter=None: at least this many iterations (and at least K)


def cg_tolerance(dtype: torch.dtype) -> float:
    """The relative residual at which conjugate gradients stop by default: 1e-13 in float64, 1e-6 below."""
    return 1e-13 if dtype == torch.float64 else 1e-6


def joint_solve(
    f: KroneckerInverse, r: torch.Tensor, c: torch.Tensor, w: torch.Tensor,
    shape: torch.Size | tuple[int, int], tol: float | None = None, max_iter: int | None = None,
    operator_dtype: torch.dtype | None = None, on_iteration: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """u = M⁻¹ w for all K pruned weights at once, M = F⁻¹[S, S] (eqs. 4-5, one chunk).

    tol=None asks for the exact solution: with K ≤ DIRECT_SOLVE_MAX,
    M = G⁻¹[r, r] ∘ A⁻¹[c, c] is formed and solved directly; otherwise conjugate gradients run to
    relative residual `cg_tolerance(dtype)`. Jacobi-preconditioned conjugate gradients never form M:
    M u = (F⁻¹ vec(V))[S] with V the scatter of u into an R×C matrix (G⁻¹ V A⁻¹: two GEMMs per
    iteration); they stop when ‖w − M u‖ ≤ tol·‖w‖ or after `max_iter`
    iterations (None: max(K, CG_MIN_ITERATIONS)). `operator_dtype` runs the
    two products in that dtype, e.g. bfloat16, and the recurrences in w's. `on_iteration` is called with
    the count of iterations done after each one (a progress display).
    """
    if tol is None and 0 < w.numel() <= DIRECT_SOLVE_MAX:
        G_inv, A_inv = f.matrices()
        exact: torch.Tensor = torch.linalg.solve(submatrix(G_inv, r, r) * submatrix(A_inv, c, c), w)
        return exact
    tol = cg_tolerance(w.dtype) if tol is None else tol
    max_iter = max(w.numel(), CG_MIN_ITERATIONS) if max_iter is None else max_iter
    u = torch.zeros_like(w)
    bound = tol * torch.linalg.vector_norm(w)
    if w.numel() == 0 or bound == 0:
        return u
    V = torch.zeros(shape, dtype=w.dtype, device=w.device)

    if operator_dtype is not None:  # the products G⁻¹ V A⁻¹ in a lower precision, the recurrences in w's
        G_low, A_low = (matrix.to(operator_dtype) for matrix in f.matrices())

        def apply(x: torch.Tensor) -> torch.Tensor:
            V[r, c] = x
            return (G_low @ V.to(operator_dtype) @ A_low)[r, c].to(w.dtype)
    else:
        def apply(x: torch.Tensor) -> torch.Tensor:
            V[r, c] = x
            return f.apply(V)[r, c]

    inv_diag = 1.0 / f.element_diagonal()[r, c]
    residual = w.clone()
    z = residual * inv_diag
    direction, rz = z.clone(), residual @ z
    for done in range(1, max_iter + 1):
        product = apply(direction)
        step = rz / (direction @ product)
        u += step * direction
        residual -= step * product
        if on_iteration is not None:
            on_iteration(done)
        if torch.linalg.vector_norm(residual) <= bound:
            break
        z = residual * inv_diag
        rz, rz_old = residual @ z, rz
        direction = z + (rz / rz_old) * direction
    return u


def unstructured(
    W: torch.Tensor,
    f: KroneckerInverse,
    mask: torch.Tensor,
    max_correlate: int | None = None,
    tol: float | None = None,
    max_iter: int | None = None,
    backend: str = "auto",
    operator_dtype: torch.dtype | None = None,
    on_iteration: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """New W with the weights in `mask` removed and the rest corrected (eqs. 4-5, docs/DESIGN.md).

    max_correlate=None: all pruned weights solved jointly (exact eqs. 4-5) by `joint_solve`, with
    relative residual `tol` in at most `max_iter` iterations (None: exact, see `joint_solve`), its
    products in `operator_dtype` when given, `on_iteration` told of each iteration.
    Otherwise pruned weights are split into chunks of whole rows (at most `max_correlate` each, the
    paper's m, sec. 3.4) and the chunks' independent updates are summed, as the paper does: every
    chunk's w comes from the original W, so all chunks are solved in batches, u = M⁻¹ w scattered
    into V, and one pair of GEMMs updates the layer, ΔW = −G⁻¹ V A⁻¹.
    """
    r, c = mask.nonzero(as_tuple=True)
    U = torch.zeros_like(W)
    if max_correlate is None:
        U[r, c] = joint_solve(f, r, c, W[r, c], W.shape, tol, max_iter, operator_dtype, on_iteration)
        delta = f.apply(U)
    else:
        G_inv, A_inv = f.matrices()
        U[r, c] = solve_chunks(f, r, c, W[r, c], row_chunks(r, max_correlate), backend=backend)
        delta = G_inv @ (U @ A_inv)
    out = W - delta
    out[mask] = 0
    return out


RETRIES = 3


def finite_update(name: str, f: KroneckerInverse, update: Callable[[KroneckerInverse], torch.Tensor],
                  strength: float) -> torch.Tensor:
    """`update(f)`, retried with 10× stronger damping (from `strength`, up to RETRIES times) while it is not finite.

    The stronger damping is added to G and A recovered from their inverses (the raw factors are
    freed by then). If every retry fails, the non-finite result goes back and `Layer.store`
    refuses it with an error naming the layer, so no NaN weight is ever written.
    """
    W = update(f)
    for _ in range(RETRIES):
        if torch.isfinite(W).all():
            break
        strength *= 10
        logger.warning("layer %s: non-finite update; retrying with damping %g", name, strength)
        G_inv, A_inv = f.matrices()
        f = KroneckerInverse.of(damp(spd_inverse(G_inv), strength), damp(spd_inverse(A_inv), strength))
        W = update(f)
    return W
