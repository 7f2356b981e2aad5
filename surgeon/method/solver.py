"""LLM Surgeon's costs and updates for one layer, as pure functions of tensors (docs/DESIGN.md).

`solve` is the one call for code outside the package: a weight matrix, its curvature factors and a
target in, the pruned matrix, its mask and the quadratic loss out. `refine` is its fast form for
G = I (the SparseGPT drop-in's default). The other functions expose one step each.

A layer `y = W a` has weights W [R, C] (a bias, if any, as a last column of W and of A) and
curvature F ≈ G ⊗ A with G [R, R], A [C, C] the damped, symmetric positive definite Kronecker
factors (eq. 6), in W's floating dtype, on any device. With θ = vec(W) row-major,
F⁻¹ = G⁻¹ ⊗ A⁻¹ and the quadratic model of the loss change is ½ tr(ΔWᵀ G ΔW A).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from surgeon.errors import require_finite
from surgeon.method import baselines, costs, threshold, updates
from surgeon.method.damping import damp
from surgeon.method.inverses import KroneckerInverse, spd_inverse
from surgeon.methods import DEFAULT_DAMP_A, DEFAULT_DAMP_G

REFINE_ITERATIONS = 8  # `refine`'s conjugate-gradient steps: with its sweep, about the published loop's time (RESULTS)


def _check_factors(W: torch.Tensor, G: torch.Tensor | None, A: torch.Tensor, one_dtype: bool = True) -> None:
    """W [R, C], G [R, R] or None, A [C, C], floating (`one_dtype`: of one dtype), or an error naming the mismatch."""
    if W.dim() != 2:
        raise ValueError(f"W must be a matrix [R, C], not {list(W.shape)}")
    R, C = W.shape
    if (G is not None and G.shape != (R, R)) or A.shape != (C, C):
        raise ValueError(f"W is {R}×{C}, so G must be {R}×{R} and A {C}×{C}; got "
                         f"G {None if G is None else list(G.shape)}, A {list(A.shape)}")
    factors = [A] if G is None else [G, A]
    if not all(t.is_floating_point() for t in [W, *factors]) or (
            one_dtype and any(t.dtype != W.dtype for t in factors)):
        raise TypeError(f"W, G and A must be floating{' and share one dtype' if one_dtype else ''}; got "
                        f"{W.dtype}, {None if G is None else G.dtype}, {A.dtype}")


def _check_mask(W: torch.Tensor, mask: object) -> None:
    """A boolean mask of W's shape, or a ValueError."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != W.shape:
        raise ValueError(f"mask must be a boolean tensor of W's shape {list(W.shape)} (True = prune)")


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
    unique: torch.Tensor = index.unique()
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
    tol: float | None = None,
    max_iter: int | None = None,
) -> torch.Tensor:
    """Remove the weights in `mask` (True = prune) with correlated updates (eqs. 4-5): new W [R, C].

    mask is a boolean [R, C]. max_correlate None solves all pruned weights jointly, exactly with the
    default tol=None (a direct solve up to `updates.DIRECT_SOLVE_MAX` weights, else conjugate
    gradients to the dtype's precision), or by conjugate gradients to relative residual `tol` in at
    most `max_iter` iterations; an integer solves chunks of at most that many weights and sums their
    independent updates (the paper's approximation, sec. 3.4).
    """
    _check_factors(W, G, A)
    _check_mask(W, mask)
    return updates.unstructured(W, KroneckerInverse.of(G, A), mask, max_correlate, tol, max_iter)


def quadratic_loss(delta: torch.Tensor, G: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """½ vec(ΔW)ᵀ (G ⊗ A) vec(ΔW) = ½ tr(ΔWᵀ G ΔW A), the local loss model (eq. 2)."""
    return 0.5 * (delta * (G @ delta @ A)).sum()


@dataclass(frozen=True)
class Solution:
    """What `solve` returns: the pruned W (W's dtype and device), its mask (True = removed) and the loss."""

    weight: torch.Tensor
    mask: torch.Tensor
    loss: float


def _check_target(W: torch.Tensor, sparsity: float | None, nm: tuple[int, int] | None, mask: torch.Tensor | None,
                  rows: object, cols: object, shots: int) -> None:
    """Exactly one valid target for W, or a ValueError naming what is wrong."""
    given = [name for name, value in (("sparsity", sparsity), ("nm", nm), ("mask", mask)) if value is not None]
    if rows is not None or cols is not None:
        given.append("rows/cols")
    if len(given) != 1:
        raise ValueError(f"give exactly one target (sparsity, nm, mask or rows/cols), not {given or 'none'}")
    if sparsity is not None and not 0 <= sparsity < 1:
        raise ValueError(f"sparsity must be in [0, 1), not {sparsity}")
    if nm is not None:
        n, m = nm
        if not 0 <= n < m:
            raise ValueError(f"nm=({n}, {m}) must keep n of every m weights with 0 ≤ n < m")
        if W.shape[1] % m:
            raise ValueError(f"N:M with m={m} needs the column count {W.shape[1]} to be a multiple of m")
    if mask is not None:
        _check_mask(W, mask)
    if shots < 1:
        raise ValueError(f"shots must be at least 1, not {shots}")


def solve(
    W: torch.Tensor,
    A: torch.Tensor,
    G: torch.Tensor | None = None,
    *,
    sparsity: float | None = None,
    nm: tuple[int, int] | None = None,
    mask: torch.Tensor | None = None,
    rows: torch.Tensor | Sequence[int] | None = None,
    cols: torch.Tensor | Sequence[int] | None = None,
    shots: int = 1,
    damp_a: float = DEFAULT_DAMP_A,
    damp_g: float = DEFAULT_DAMP_G,
    blocksize: int = 128,
) -> Solution:
    """Prune one layer to a target with the exact correlated update (eqs. 4-5, sec. 3.4): a `Solution`.

    W [R, C]; A [C, C] the input factor E[a aᵀ], or SparseGPT's H = (2/n)·X Xᵀ = 2A (the update and
    the mask do not change with A's scale, the loss doubles); G [R, R] the output factor, None for
    the identity (a layer-wise reconstruction loss). Both are damped by `damping.damp` (λ_A =
    `damp_a`, λ_G = `damp_g`). One target:
    - `sparsity`: that fraction of weights removed, in `shots` steps of growing sparsity;
    - `nm`: (n, m) keeps n of every m consecutive weights in each row (2:4 is (2, 4)); shot s of
      the at most m − n shots prunes ⌈(m − n)·s/shots⌉ of each group;
    - `mask`: a boolean [R, C], True = remove;
    - `rows`, `cols`: removed rows and columns (boolean masks or indices).
    With G = None the rows decouple: each shot chooses the mask with SparseGPT's column sweep
    (exactly round(sparsity·R·b) weights in each block of b = `blocksize` columns), then every row's
    kept weights are solved exactly from the original W. With G the mask comes from eq. 7's element
    costs under one threshold over the layer, and all pruned weights are solved jointly. `loss` is
    ½ tr(ΔWᵀ G ΔW A) with the undamped factors as given. Factors may be of any floating dtype:
    the solve runs in float64.
    """
    _check_factors(W, G, A, one_dtype=False)
    given = {"the weights W": W, "the input factor A (SparseGPT's H)": A}
    require_finite(given if G is None else {**given, "the output factor G": G})
    _check_target(W, sparsity, nm, mask, rows, cols, shots)
    if nm is not None and G is None and blocksize % nm[1]:
        raise ValueError(f"blocksize {blocksize} must be a multiple of m={nm[1]}")
    R, C = W.shape
    W0, A0 = W.double(), A.double()
    A_inv = spd_inverse(damp(A0, damp_a))
    f = None  # G⁻¹ ⊗ A⁻¹: needed with G, and for rows/cols (G = None: the identity)
    if G is not None or rows is not None or cols is not None:
        G_inv = torch.eye(R, dtype=torch.float64, device=W.device) if G is None else spd_inverse(damp(G.double(),
                                                                                                     damp_g))
        f = KroneckerInverse(G_inv, A_inv, G_inv.diagonal().clone(), A_inv.diagonal().clone(), False)

    def exact(pruned: torch.Tensor) -> torch.Tensor:
        if f is None:  # G = I, the rows decouple: one exact solve per row against A alone
            return row_update(W0, A_inv, pruned)
        return updates.unstructured(W0, f, pruned)

    if rows is not None or cols is not None:
        assert f is not None  # built above for rows/cols
        removed_rows = as_indices(rows if rows is not None else [], R, "rows").to(W.device)
        removed_cols = as_indices(cols if cols is not None else [], C, "cols").to(W.device)
        new = updates.structured(W0, f, removed_rows, removed_cols, "joint")
        pruned = torch.zeros(R, C, dtype=torch.bool, device=W.device)
        pruned[removed_rows] = True
        pruned[:, removed_cols] = True
    elif mask is not None:
        pruned, new = mask, exact(mask)
    else:
        pruned, new = torch.zeros(R, C, dtype=torch.bool, device=W.device), W0
        if nm is not None:  # a shot prunes at least one more weight per group
            shots = min(shots, nm[1] - nm[0])
        for shot in range(1, shots + 1):
            pruned = _select(new, A0, f, pruned, sparsity, nm, (shot, shots), damp_a, blocksize)
            new = exact(pruned)
    delta = new - W0
    loss = 0.5 * (delta * (delta @ A0)).sum() if G is None else quadratic_loss(delta, G.double(), A0)
    return Solution(new.to(W.dtype), pruned, float(loss))


def refine(
    W: torch.Tensor,
    A: torch.Tensor,
    *,
    sparsity: float | None = None,
    nm: tuple[int, int] | None = None,
    iterations: int = REFINE_ITERATIONS,
    damp_a: float = DEFAULT_DAMP_A,
    blocksize: int = 128,
) -> Solution:
    """SparseGPT's sweep for the mask and its updates, then `iterations` steps toward the exact row update.

    The fast form of `solve` with G = None: the same mask as its column sweep (run in float32, the
    published precision), then `refine_rows` from the sweep's weights instead of one exact solve
    per row. W, A, `sparsity` or `nm`, `damp_a` and `blocksize` mean what they mean in `solve`;
    the result is in float32 arithmetic, W's dtype and device, with `loss` ½ tr(ΔW A ΔWᵀ) on the
    undamped A.
    """
    _check_factors(W, None, A, one_dtype=False)
    require_finite({"the weights W": W, "the input factor A (SparseGPT's H)": A})
    _check_target(W, sparsity, nm, None, None, None, 1)
    if nm is not None and blocksize % nm[1]:
        raise ValueError(f"blocksize {blocksize} must be a multiple of m={nm[1]}")
    if iterations < 0:
        raise ValueError(f"iterations must be at least 0, not {iterations}")
    W0, A0 = W.float(), A.float()
    swept, pruned = baselines.sparsegpt(W0, A0, sparsity or 0.0, torch.zeros_like(W0, dtype=torch.bool), nm,
                                        blocksize, damp_a, torch.float32)
    new = refine_rows(W0, damp(A0, damp_a), swept, pruned, iterations)
    delta = new - W0
    return Solution(new.to(W.dtype), pruned, float(0.5 * (delta * (delta @ A0)).sum()))


def row_update(W: torch.Tensor, A_inv: torch.Tensor, pruned: torch.Tensor) -> torch.Tensor:
    """W with the `pruned` weights removed and every row's kept weights solved exactly for G = I (eqs. 4-5).

    With G = I the rows decouple: row r's system is A⁻¹[P_r, P_r] u = w[P_r] for its pruned columns
    P_r, and ΔW = −U A⁻¹. One system per row (the solves see G⁻¹ = 1 through a 1×1 factor), so no
    R×R identity is built and no two rows share a system.
    """
    r, c = pruned.nonzero(as_tuple=True)
    U = torch.zeros_like(W)
    if r.numel():
        starts = torch.ones(r.numel(), dtype=torch.bool, device=r.device)
        starts[1:] = r[1:] != r[:-1]
        bounds = starts.nonzero().squeeze(1).tolist() + [r.numel()]
        one = torch.ones(1, 1, dtype=W.dtype, device=W.device)
        f = KroneckerInverse(one, A_inv, one.reshape(1), A_inv.diagonal().clone(), False)
        U[r, c] = updates.solve_chunks(f, torch.zeros_like(r), c, W[r, c],
                                       [slice(a, b) for a, b in zip(bounds, bounds[1:])])
    out = W - U @ A_inv
    out[pruned] = 0
    return out


def refine_rows(W0: torch.Tensor, A: torch.Tensor, W: torch.Tensor, pruned: torch.Tensor,
                iterations: int) -> torch.Tensor:
    """W moved toward `row_update`'s exact solution for the mask `pruned` (eqs. 4-5, G = I) by conjugate gradients.

    Each row r minimises ½ (w_r − w0_r) A (w_r − w0_r)ᵀ over its kept weights, its pruned ones held
    at zero: `iterations` steps of Jacobi-preconditioned conjugate gradients started from W (a
    SparseGPT sweep's solution, say), every row with its own step sizes, all rows in one [R, C] ×
    [C, C] product per step. Conjugate gradients never raise a row's loss above its start's, so the
    result is at least as good as W on the damped A it is given.
    """
    keep = ~pruned
    X = W.masked_fill(pruned, 0)
    residual = ((W0 - X) @ A) * keep  # the negative gradient, on the kept weights
    inv_diag = 1 / A.diagonal()
    z = residual * inv_diag
    direction, rz = z, (residual * z).sum(1, keepdim=True)
    for step in range(iterations):
        product = (direction @ A) * keep
        curvature = (direction * product).sum(1, keepdim=True)
        alpha = torch.where(curvature > 0, rz / curvature, torch.zeros_like(rz))
        X += alpha * direction
        if step + 1 == iterations:
            break
        residual -= alpha * product
        z = residual * inv_diag
        rz, rz_old = (residual * z).sum(1, keepdim=True), rz
        direction = z + torch.where(rz_old > 0, rz / rz_old, torch.zeros_like(rz)) * direction
    return X


def _select(W: torch.Tensor, A: torch.Tensor, f: KroneckerInverse | None, previous: torch.Tensor,
            sparsity: float | None, nm: tuple[int, int] | None, step: tuple[int, int], damp_a: float,
            blocksize: int) -> torch.Tensor:
    """The mask of shot `step` = (s, shots), s/shots of the way to the target, containing `previous` (True = removed).

    Without F⁻¹ (G = I): SparseGPT's column sweep on the current W and A (exact per block of columns);
    with it, eq. 7's element costs under one threshold over the layer.
    """
    if nm is not None:
        n, m = nm
        pruned_per_group = -(-(m - n) * step[0] // step[1])  # ⌈(m − n)·s/shots⌉
        if f is None:
            return baselines.sparsegpt(W, A, 0.0, previous, (m - pruned_per_group, m), blocksize, damp_a)[1]
        target = W.numel() // m * pruned_per_group
        return threshold.nm_selection([costs.element_costs(W, f)], m - pruned_per_group, m, target)[0]()
    assert sparsity is not None
    fraction = sparsity * step[0] / step[1]
    if f is None:
        return baselines.sparsegpt(W, A, fraction, previous, None, blocksize, damp_a)[1]
    return threshold.smallest_k([costs.element_costs(W, f)], round(fraction * W.numel()))[0]()
