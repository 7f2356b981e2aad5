"""Triton kernel: batched cyclic Jacobi eigensolver, one program per symmetric matrix.

Each sweep visits every pair (p, q) once, in n−1 rounds of the round-robin ("circle") order, so
the n/2 rotations of a round touch disjoint rows and columns and are applied together: first to
the rows of A (Jᵀ A), then to its columns (A J) and to the eigenvector matrix (V J). The angle
zeroes A[p, q] (Golub & Van Loan, Alg. 8.4.1). Sweeps stop when the squared off-diagonal mass
seen in a sweep falls below tol²·‖A‖²_F. A warm start (V₀ from the previous shot) rotates A into
that basis first, so a nearly diagonal problem converges in one or two sweeps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from surgeon_kernels._triton import INTERPRET


@triton.jit
def _rotate(ptr, first, second, c, s, ok, n, stride_first, stride_second, BLOCK_N: tl.constexpr):
    """x_first, x_second ← c·x_first − s·x_second, s·x_first + c·x_second along lines `first`/`second`."""
    for start in range(0, n, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        mask = ok[:, None] & (j < n)[None, :]
        at_first = ptr + first[:, None] * stride_first + j[None, :] * stride_second
        at_second = ptr + second[:, None] * stride_first + j[None, :] * stride_second
        x = tl.load(at_first, mask=mask, other=0.0)
        y = tl.load(at_second, mask=mask, other=0.0)
        tl.store(at_first, c[:, None] * x - s[:, None] * y, mask=mask)
        tl.store(at_second, s[:, None] * x + c[:, None] * y, mask=mask)


@triton.jit
def _div(x, y, F32: tl.constexpr):
    """x / y rounded as IEEE prescribes. The GPU's default float32 division is approximate (2 ulp), the likely
    reason the solver missed its accuracy policy on an H100: c² + s² further from 1, over thousands of
    rotations, lets V drift from orthogonal."""
    if F32:  # noqa: SIM108 (a constexpr branch: Triton compiles one side)
        result = tl.div_rn(x, y)
    else:
        result = x / y
    return result


@triton.jit
def _sqrt(x, F32: tl.constexpr):
    """√x rounded as IEEE prescribes (see `_div`)."""
    if F32:  # noqa: SIM108 (a constexpr branch: Triton compiles one side)
        result = tl.sqrt_rn(x)
    else:
        result = tl.sqrt(x)
    return result


@triton.jit
def _jacobi_kernel(a_ptr, v_ptr, n, players, max_sweeps, tol2, F32: tl.constexpr, HALF: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Diagonalise A[b] in place (A ← Vᵀ A V) and accumulate V[b] (V ← V J per rotation)."""
    b = tl.program_id(0).to(tl.int64)
    A = a_ptr + b * n * n
    V = v_ptr + b * n * n
    k = tl.arange(0, HALF)
    zero = tl.sum(tl.zeros([BLOCK_N], dtype=a_ptr.dtype.element_ty), axis=0)  # a scalar of A's dtype
    total = zero
    for start in range(0, n * n, BLOCK_N):
        i = start + tl.arange(0, BLOCK_N)
        x = tl.load(A + i, mask=i < n * n, other=0.0)
        total += tl.sum(x * x, axis=0)
    off = total
    sweep = 0
    while (sweep < max_sweeps) & (off > tol2 * total):
        off = zero
        for r in range(0, players - 1):
            first = tl.where(k == 0, r, (r + k) % (players - 1))
            second = tl.where(k == 0, players - 1, (r - k + players - 1) % (players - 1))
            p = tl.minimum(first, second).to(tl.int64)
            q = tl.maximum(first, second).to(tl.int64)
            ok = (2 * k < players) & (q < n)
            app = tl.load(A + p * n + p, mask=ok, other=1.0)
            aqq = tl.load(A + q * n + q, mask=ok, other=1.0)
            apq = tl.load(A + p * n + q, mask=ok, other=0.0)
            off += 2.0 * tl.sum(apq * apq, axis=0)
            nonzero = apq != 0.0
            tau = _div(aqq - app, 2.0 * tl.where(nonzero, apq, 1.0), F32)
            sign = tl.where(tau >= 0.0, 1.0, -1.0)
            t = _div(sign, tl.abs(tau) + _sqrt(1.0 + tau * tau, F32), F32)
            t = tl.where(nonzero, t, 0.0)
            c = _div(1.0, _sqrt(1.0 + t * t, F32), F32)
            s = t * c
            _rotate(A, p, q, c, s, ok, n, n, 1, BLOCK_N)  # rows: Jᵀ A
            tl.debug_barrier()
            _rotate(A, p, q, c, s, ok, n, 1, n, BLOCK_N)  # columns: A J
            _rotate(V, p, q, c, s, ok, n, 1, n, BLOCK_N)  # eigenvectors: V J
            tl.debug_barrier()
        sweep += 1


def batched_eigh(A: torch.Tensor, Q0: torch.Tensor | None = None, tol: float | None = None,
                 max_sweeps: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues [B, n] (ascending) and eigenvectors [B, n, n] of symmetric A [B, n, n] by Jacobi."""
    B, n, _ = A.shape
    if tol is None:
        tol = 4 * torch.finfo(A.dtype).eps
    work = (Q0.mT @ A @ Q0 if Q0 is not None else A).contiguous().clone()
    V = torch.eye(n, dtype=A.dtype, device=A.device).repeat(B, 1, 1)
    if B and n > 1:
        players = n + n % 2
        block = 16 if INTERPRET else min(128, triton.next_power_of_2(n))
        _jacobi_kernel[(B,)](work, V, n, players, max_sweeps, tol * tol, F32=A.dtype == torch.float32,
                             HALF=triton.next_power_of_2(players // 2), BLOCK_N=block, num_warps=1 if INTERPRET else 4)
    values = work.diagonal(dim1=1, dim2=2)
    values, order = values.sort(dim=1)
    vectors = V.gather(2, order.unsqueeze(1).expand(B, n, n))
    if Q0 is not None:
        vectors = Q0 @ vectors
    return values, vectors
