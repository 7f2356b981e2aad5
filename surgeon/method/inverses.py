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
    def of(cls, G: torch.Tensor, A: torch.Tensor, roots: bool = False) -> KroneckerInverse:
        """Invert the damped SPD factors G and A."""
        return kronecker(FactorInverse.of(G, roots), FactorInverse.of(A, roots))

    def packed(self) -> KroneckerInverse:
        """The same inverse with both factors packed (about half the memory)."""
        if isinstance(self.G, PackedSymmetric) or isinstance(self.A, PackedSymmetric):
            raise ValueError("already packed")
        return dataclasses.replace(self, G=PackedSymmetric.pack(self.G), A=PackedSymmetric.pack(self.A))

    def dense(self) -> KroneckerInverse:
        """The same inverse with both factors dense."""
        return dataclasses.replace(self, G=_unpack(self.G, self.roots), A=_unpack(self.A, self.roots))

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


@dataclass(frozen=True)
class FactorInverse:
    """One damped Kronecker factor's inverse M⁻¹, or with `root` its upper-triangular root U (U Uᵀ = M⁻¹): dense, or
    packed while it waits; `diagonal` is diag(M⁻¹). Layers that read one input (q/k/v, gate/up) share their A's."""

    matrix: torch.Tensor | PackedSymmetric
    diagonal: torch.Tensor
    root: bool

    @classmethod
    def of(cls, M: torch.Tensor, root: bool) -> FactorInverse:
        """Invert the damped SPD factor M (or take its inverse root)."""
        inverse = (inverse_root if root else spd_inverse)(M)
        return cls(inverse, _diagonal(inverse, root), root)

    def packed(self) -> FactorInverse:
        """The same inverse packed (about half the memory)."""
        return self if isinstance(self.matrix, PackedSymmetric) else \
            dataclasses.replace(self, matrix=PackedSymmetric.pack(self.matrix))

    def dense(self) -> FactorInverse:
        """The same inverse dense."""
        return dataclasses.replace(self, matrix=_unpack(self.matrix, self.root))

    def to(self, device: torch.device | str) -> FactorInverse:
        """The same inverse on `device` (its diagonal stays)."""
        return dataclasses.replace(self, matrix=self.matrix.to(device))


def kronecker(G: FactorInverse, A: FactorInverse) -> KroneckerInverse:
    """F⁻¹ of one layer from its factors' inverses, both inverses or both roots."""
    if G.root != A.root:
        raise ValueError("G and A must be inverted the same way (roots or full inverses)")
    return KroneckerInverse(G.matrix, A.matrix, G.diagonal, A.diagonal, G.root)


# Layers that share one A⁻¹ (one input, the same kept columns) as a shot keeps them until their updates: that
# inverse and each layer's position and G⁻¹ (None where the update keeps no inverse: the OBD baselines)
Shared = tuple[FactorInverse | None, list[tuple[int, FactorInverse | None]]]


def unpacked(kept: Iterable[Shared], device: torch.device | str | None = None
             ) -> Iterator[tuple[int, KroneckerInverse | None]]:
    """Each layer's position and F⁻¹ made dense in turn (on `device`, when given, from host memory), the A⁻¹ its
    layers share moved and unpacked once for all of them."""
    for A, layers in kept:
        A_dense = None if A is None else (A if device is None else A.to(device)).dense()
        for index, G in layers:
            yield index, None if G is None or A_dense is None else \
                kronecker((G if device is None else G.to(device)).dense(), A_dense)


def input_inverse(A: PackedSymmetric, cols: Index, strength: float, root: bool) -> FactorInverse:
    """The inverse (or root) of one input's raw A[cols, cols] damped by `strength` (λ_A): one for all the layers
    that read the input with those columns."""
    return FactorInverse.of(damp(submatrix(A.dense(), cols, cols), strength), root)


def output_inverse(entry: LayerFactors, rows: Index, strength: float, root: bool) -> FactorInverse:
    """The inverse (or root) of one layer's raw G[rows, rows] damped by `strength` (λ_G)."""
    if entry.G is None:
        raise ValueError("F⁻¹ needs the factor G: estimate the curvature with need_g=True")
    return FactorInverse.of(damp(submatrix(entry.G.dense(), rows, rows), strength), root)
