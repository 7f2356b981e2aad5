"""Inverses of the damped Kronecker factors: F⁻¹ = G⁻¹ ⊗ A⁻¹ (eq. 6 inverted, docs/DESIGN.md).

`KroneckerInverse` is what a shot keeps of one layer between its costs and its update: each
factor's inverse M⁻¹, or its upper-triangular root U (U Uᵀ = M⁻¹, one triangular inverse instead of
two), dense while it is used and packed while it waits. The linear algebra under it (Cholesky with
an eigenvalue-floored fallback, the blocked triangular inverse) is here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from surgeon.method.damping import damp
from surgeon.method.factors import LayerFactors
from surgeon.method.submatrix import Index, submatrix
from surgeon_kernels import ops
from surgeon_kernels.ops import PackedSymmetric


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


# Devices on which `lower_inverse_` works by row blocks of GEMMs, where they measured faster; elsewhere one
# triangular solve against I (surgeon_kernels/measured.json, "blocked_inverse")
BLOCKED_INVERSE_ON = tuple(ops.MEASURED["blocked_inverse"]["devices"])
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


def _diagonal(inverse: torch.Tensor, roots: bool) -> torch.Tensor:
    """diag(M⁻¹) from M⁻¹ itself or from its root U (the squared row norms of U), as a new tensor."""
    return inverse.square().sum(1) if roots else inverse.diagonal().clone()


@dataclass(frozen=True)
class KroneckerInverse:
    """F⁻¹ = G⁻¹ ⊗ A⁻¹ of one layer [R·C, R·C], held as its two factors' inverses.

    `G`, `A`: G⁻¹ [R, R] and A⁻¹ [C, C], or with `roots` their upper-triangular roots U_G, U_A
    (U Uᵀ = M⁻¹); dense tensors, or `PackedSymmetric` while the layer waits for its update (`packed`).
    Structured shots keep roots: their costs read only the diagonals and their updates only the
    rows of the removed structures, O(n²) and O(|P| n²) from a root, where a full inverse costs a
    second triangular inverse. `G_diagonal`, `A_diagonal` are diag(G⁻¹), diag(A⁻¹), all that
    element costs (eq. 7) read of F⁻¹.
    """

    G: torch.Tensor | PackedSymmetric
    A: torch.Tensor | PackedSymmetric
    G_diagonal: torch.Tensor
    A_diagonal: torch.Tensor
    roots: bool = False

    @classmethod
    def of(cls, G: torch.Tensor, A: torch.Tensor | KroneckerInverse, roots: bool = False) -> KroneckerInverse:
        """Invert the damped SPD factors G and A; A may instead be a sibling layer's inverse, whose A⁻¹ is reused."""
        invert = inverse_root if roots else spd_inverse
        G_inv = invert(G)
        if isinstance(A, KroneckerInverse):
            if A.roots != roots:
                raise ValueError("a shared A must be inverted the same way (roots or full inverses)")
            return cls(G_inv, A.A, _diagonal(G_inv, roots), A.A_diagonal, roots)
        A_inv = invert(A)
        return cls(G_inv, A_inv, _diagonal(G_inv, roots), _diagonal(A_inv, roots), roots)

    def packed(self, A: PackedSymmetric | None = None) -> KroneckerInverse:
        """The same inverse with both factors packed (about half the memory); `A`: A⁻¹ already packed for a sibling."""
        if isinstance(self.G, PackedSymmetric) or isinstance(self.A, PackedSymmetric):
            raise ValueError("already packed")
        return dataclasses.replace(self, G=PackedSymmetric.pack(self.G),
                                   A=PackedSymmetric.pack(self.A) if A is None else A)

    def dense(self, A: torch.Tensor | None = None) -> KroneckerInverse:
        """The same inverse with both factors dense; `A`: A⁻¹ already unpacked for a sibling."""
        return dataclasses.replace(self, G=_unpack(self.G, self.roots),
                                   A=_unpack(self.A, self.roots) if A is None else A)

    def to(self, device: torch.device | str, A: torch.Tensor | PackedSymmetric | None = None) -> KroneckerInverse:
        """The same inverse with its factors on `device` (the diagonals stay); `A`: A⁻¹ already moved for a
        sibling."""
        return dataclasses.replace(self, G=self.G.to(device), A=self.A.to(device) if A is None else A)

    def element_diagonal(self) -> torch.Tensor:
        """[F⁻¹]_(rc),(rc) = [G⁻¹]_rr [A⁻¹]_cc as an [R, C] matrix."""
        return torch.outer(self.G_diagonal, self.A_diagonal)

    def matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """G⁻¹ and A⁻¹ as dense matrices (from roots: one product each)."""
        G, A = as_dense(self.G), as_dense(self.A)
        return (G @ G.T, A @ A.T) if self.roots else (G, A)

    def inverse_rows(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G⁻¹[rows, :] and A⁻¹[cols, :] (from roots: U_G[rows] U_Gᵀ and U_A[cols] U_Aᵀ)."""
        G, A = as_dense(self.G), as_dense(self.A)
        if self.roots:
            return G[rows] @ G.T, A[cols] @ A.T
        return G[rows], A[cols]

    def apply(self, V: torch.Tensor) -> torch.Tensor:
        """F⁻¹ vec(V) as a matrix: G⁻¹ V A⁻¹."""
        G_inv, A_inv = self.matrices()
        return G_inv @ V @ A_inv


def as_dense(matrix: torch.Tensor | PackedSymmetric) -> torch.Tensor:
    """A dense factor of a `KroneckerInverse` as it is; a packed one is refused (unpack it with `dense()`)."""
    if isinstance(matrix, PackedSymmetric):
        raise ValueError("a packed KroneckerInverse is read only after `dense()`")
    return matrix


def _unpack(matrix: torch.Tensor | PackedSymmetric, roots: bool) -> torch.Tensor:
    """A packed inverse (symmetric) or root (upper triangular) as a dense matrix; a dense one as it is."""
    if not isinstance(matrix, PackedSymmetric):
        return matrix
    return matrix.upper() if roots else matrix.dense()


def unpacked(kept: Iterable[KroneckerInverse | None],
             device: torch.device | None = None) -> Iterator[KroneckerInverse | None]:
    """Each packed inverse of a shot made dense in turn (on `device`, when given, from host memory); layers
    reading one input (q/k/v, gate/up) come one after another and share one packed A⁻¹, which is moved and
    unpacked once for all of them."""
    last: tuple[PackedSymmetric | torch.Tensor, torch.Tensor] | None = None
    for inverse in kept:
        if inverse is None:
            yield None
            continue
        if last is None or last[0] is not inverse.A:
            last = (inverse.A, _unpack(inverse.A if device is None else inverse.A.to(device), inverse.roots))
        yield (inverse if device is None else inverse.to(device, A=last[1])).dense(A=last[1])


Sibling = tuple[LayerFactors, Index, KroneckerInverse, torch.Tensor | PackedSymmetric]


def layer_inverse(entry: LayerFactors, rows: Index, cols: Index, strengths: tuple[float, float], roots: bool,
                  sibling: Sibling | None = None) -> tuple[KroneckerInverse, KroneckerInverse]:
    """One layer's F⁻¹ from its raw factors: G[rows, rows] and A[cols, cols] damped by `strengths` (λ_G, λ_A)
    and inverted, dense (for its costs) and packed (kept for its update).

    `sibling`: the previous layer's raw factors, columns, packed inverse and dense A⁻¹. A layer that
    reads the same input with the same columns (q/k/v, gate/up come one after another and share one
    raw A) takes that A⁻¹, dense and packed, instead of inverting A again.
    """
    if entry.G is None:
        raise ValueError("F⁻¹ needs the factor G: estimate the curvature with need_g=True")
    G = damp(submatrix(entry.G.dense(), rows, rows), strengths[0])
    if sibling is not None and sibling[0].A is entry.A and _same(sibling[1], cols):
        _, _, kept, A_inv = sibling
        inverse = KroneckerInverse.of(G, dataclasses.replace(kept, A=A_inv), roots)
        assert isinstance(kept.A, PackedSymmetric)
        return inverse, inverse.packed(A=kept.A)
    inverse = KroneckerInverse.of(G, damp(submatrix(entry.A.dense(), cols, cols), strengths[1]), roots)
    return inverse, inverse.packed()


def _same(a: Index, b: Index) -> bool:
    """Whether two row or column selections are the same."""
    if isinstance(a, slice) or isinstance(b, slice):
        return a == b
    return a.shape == b.shape and bool((a == b).all())
