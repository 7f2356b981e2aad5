"""One dispatcher for every op: `backend="auto"|"triton"|"cpp"|"torch"`.

`auto` picks Triton for CUDA tensors (when Triton imports) only for kernels that have run on GPU
hardware as they are now (`RUN_ON_CUDA`) and measured faster there than PyTorch (not in
`AUTO_TORCH_ON_CUDA`; `JACOBI_WIDTHS`), the compiled C++ op for CPU tensors
when `surgeon_kernels._C` was built and has the op, and the PyTorch path otherwise. `triton` on
CPU tensors is offered only under the interpreter (`TRITON_INTERPRET=1`), which is how the tests
run it. The environment variable `SURGEON_BACKEND` overrides `auto`. `cpp` runs the PyTorch path
for ops the compiled library does not have; a backend that is not available here raises one line
naming those that are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

from surgeon_kernels._ext import HAS_CPP_OPS
from surgeon_kernels._triton import HAS_TRITON, INTERPRET
from surgeon_kernels.batched_eigh import reference as eigh_reference
from surgeon_kernels.deferred import Deferred, Lazy, materialise
from surgeon_kernels.kfac_accumulate import reference as kfac_reference
from surgeon_kernels.kk_gather import reference as kk_reference
from surgeon_kernels.kk_solve import reference as kk_solve_reference
from surgeon_kernels.kth_smallest import radix
from surgeon_kernels.kth_smallest import reference as kth_reference
from surgeon_kernels.nm_select import reference as nm_reference
from surgeon_kernels.symmetric import PackedSymmetric

__all__ = [  # the ops, and the data types they take (so that callers need only this module)
    "Deferred", "Lazy", "PackedSymmetric", "available_backends", "batched_eigh", "kfac_accumulate",
    "kfac_accumulate_group", "kk_gather", "kk_solve", "kth_smallest", "materialise", "nm_select",
]
CPP_OPS = ("kfac_accumulate", "nm_select", "kk_solve")
CONCAT_MAX = 1 << 28  # torch kth_smallest: concatenate and kthvalue up to this many costs (1 GiB of float32)
# Every choice and rate taken from a measurement, with the measurement (measured.json, which RESULTS cites)
MEASURED: dict[str, Any] = json.loads((Path(__file__).parent / "measured.json").read_text())
_CUDA = MEASURED["cuda_kernels"]
# batched_eigh on CUDA: `auto` runs Triton Jacobi for widths in this range, where it measured faster
JACOBI_WIDTHS = range(_CUDA["jacobi_widths"]["low"], _CUDA["jacobi_widths"]["high"] + 1)
# Ops whose Triton kernel measured slower than the PyTorch path on CUDA: `auto` keeps PyTorch for them there
AUTO_TORCH_ON_CUDA = tuple(_CUDA["torch_faster"]["ops"])
# Triton kernels that have run on GPU hardware as they are, with the commit of that run; `auto` runs no other
# Triton kernel on CUDA
RUN_ON_CUDA: dict[str, str] = _CUDA["ran_on_gpu"]["kernels"]


def available_backends(device: torch.device | str = "cpu", op: str | None = "kfac_accumulate") -> list[str]:
    """The backends that have `op` for tensors of `device` (without `op`: that exist here at all)."""
    device = torch.device(device)
    names = ["torch"]
    if device.type == "cpu" and HAS_CPP_OPS and (op is None or op in CPP_OPS):
        names.append("cpp")
    if HAS_TRITON and (device.type == "cuda" or (device.type == "cpu" and INTERPRET)):
        names.append("triton")
    return names


def _resolve(backend: str, device: torch.device, op: str) -> str:
    """Pick a concrete backend for `op` on `device`; raise if the requested one is missing."""
    if backend == "auto":
        backend = os.environ.get("SURGEON_BACKEND", "auto")
    available = available_backends(device, op)
    if backend == "auto":
        if device.type == "cuda" and "triton" in available and op in RUN_ON_CUDA and op not in AUTO_TORCH_ON_CUDA:
            return "triton"
        return "cpp" if "cpp" in available else "torch"
    if backend not in ("triton", "cpp", "torch"):
        raise ValueError(f"backend={backend!r} is not one of auto, triton, cpp, torch")
    if backend == "cpp" and "cpp" in available_backends(device, None) and "cpp" not in available:
        return "torch"  # the compiled library is loaded but has no version of this op
    if backend not in available:
        raise RuntimeError(
            f"backend {backend!r} cannot run {op} on {device.type} tensors here; available: {', '.join(available)}"
        )
    return backend


def kfac_accumulate(
    out: PackedSymmetric, x: torch.Tensor, scale: float, bias: bool = False, backend: str = "auto"
) -> None:
    """Add `scale · [x, 1]ᵀ [x, 1]` to the packed symmetric factor `out` in place (paper eq. 6)."""
    kfac_accumulate_group([out], [x], scale, [bias], backend)


def kfac_accumulate_group(
    outs: Sequence[PackedSymmetric], xs: Sequence[torch.Tensor], scale: float, biases: Sequence[bool],
    backend: str = "auto",
) -> None:
    """`kfac_accumulate` for a group of factors (e.g. a block's layers) in one launch (eq. 6).

    Triton and the compiled op spread the tiles of all factors over one grid / one parallel region,
    per input dtype. float64 accumulators or inputs take the PyTorch path (the kernels read
    float32/bfloat16/float16 and accumulate in float32).
    """
    if not len(outs) == len(xs) == len(biases):
        raise ValueError(f"{len(outs)} outs, {len(xs)} xs and {len(biases)} biases: need one of each per factor")
    if not outs:
        return
    for out, x, bias in zip(outs, xs, biases):
        if x.dim() != 2:
            raise ValueError(f"x must be 2-D [tokens, features], got shape {tuple(x.shape)}")
        width = x.shape[1] + int(bias)
        if not isinstance(out, PackedSymmetric) or out.n != width:
            raise ValueError(f"out must be a PackedSymmetric of width {width}, got {out!r:.80}")
    chosen = _resolve(backend, xs[0].device, "kfac_accumulate")
    if (chosen == "torch" or any(out.tiles.dtype != torch.float32 for out in outs)
            or any(x.dtype not in (torch.float32, torch.bfloat16, torch.float16) for x in xs)):
        kfac_reference.kfac_accumulate_group(outs, xs, scale, biases)
    elif chosen == "cpp":
        torch.ops.surgeon.kfac_accumulate([out.tiles for out in outs], list(xs), float(scale),
                                          [bool(b) for b in biases])
    else:
        from surgeon_kernels.kfac_accumulate import kernel

        for dtype in dict.fromkeys(x.dtype for x in xs):
            group = [i for i, x in enumerate(xs) if x.dtype == dtype]
            kernel.kfac_accumulate([outs[i] for i in group], [xs[i] for i in group], scale, [biases[i] for i in group])


def nm_select(costs: torch.Tensor, n: int, m: int, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(group_costs [R, C/m], mask [R, C]): the m−n cheapest of every m consecutive costs of a row.

    Ties go to the lower index. A group's cost is the sum of its m−n cheapest (sec. 3.3, N:M).
    """
    if costs.dim() != 2 or costs.shape[1] % m or not 0 < n < m:
        raise ValueError(f"nm_select needs [R, C] costs with m | C and 0 < n < m; got {tuple(costs.shape)}, "
                         f"n={n}, m={m}")
    chosen = _resolve(backend, costs.device, "nm_select")
    if chosen == "triton" and costs.dtype == torch.float32:
        from surgeon_kernels.nm_select import kernel

        return kernel.nm_select(costs, n, m)
    if chosen == "cpp" and costs.dtype in (torch.float32, torch.float64):
        return cast(tuple[torch.Tensor, torch.Tensor], torch.ops.surgeon.nm_select(costs, n, m))
    return nm_reference.nm_select(costs, n, m)


Reduce = radix.Reduce  # sums a selection histogram over processes (`kth_smallest`)


def kth_smallest(values: Sequence[Lazy], k: int, backend: str = "auto", reduce: Reduce | None = None,
                 device: torch.device | None = None) -> float:
    """The k-th smallest (1-based) element of all `values` together, without sorting.

    Triton: radix selection over order-preserving float32 keys, four byte-histogram passes, no
    concatenation. torch: `torch.kthvalue` of the concatenation up to `CONCAT_MAX` elements (on the
    CPU it measured faster than radix selection with `torch.bincount`, bench/RESULTS.md), radix
    selection above, where a concatenated copy of the costs would not fit. A value may be a
    `Deferred` tensor, computed each time it is read (once, or once per radix pass), so that the
    costs of a whole model need not be held at once.
    `reduce`: the values are this process's share; each radix pass's histogram is summed with the other
    processes' through it (always radix selection, k over all shares). `device`: where the values live
    when this share is empty (default: the first value's device).
    """
    values = [v for v in values if v.numel()]
    total = sum(v.numel() for v in values)
    if reduce is None and not 1 <= k <= total:
        raise ValueError(f"k={k}: must be in [1, {total}]")
    device = values[0].device if device is None else torch.device(device)
    if _resolve(backend, device, "kth_smallest") == "triton":
        from surgeon_kernels.kth_smallest import kernel

        return kernel.kth_smallest(values, k, reduce)
    if reduce is None and total <= CONCAT_MAX:
        return kth_reference.kth_smallest(values, k)
    return radix.kth_smallest(values, k, reduce=reduce)


def kk_gather(G_inv: torch.Tensor, A_inv: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
              valid: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """M [B, K, K], M[b,i,j] = G⁻¹[r_bi, r_bj]·A⁻¹[c_bi, c_bj] of padded chunks, identity on padding (eq. 4)."""
    if rows.shape != cols.shape or rows.shape != valid.shape or rows.dim() != 2:
        raise ValueError(f"rows, cols, valid must share one [B, K] shape; got {tuple(rows.shape)}, "
                         f"{tuple(cols.shape)}, {tuple(valid.shape)}")
    if _resolve(backend, G_inv.device, "kk_gather") == "triton":
        from surgeon_kernels.kk_gather import kernel

        return kernel.kk_gather(G_inv, A_inv, rows, cols, valid)
    return kk_reference.kk_gather(G_inv, A_inv, rows, cols, valid)


def kk_solve(G_inv: torch.Tensor, A_inv: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, w: torch.Tensor,
             offsets: torch.Tensor, budget: int | None = None,
             backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(u, failed): u_S = M_S⁻¹ w_S by Cholesky for every chunk S = [offsets[b], offsets[b+1]) of the flat
    (rows, cols, w), M_S[i,j] = G⁻¹[r_i, r_j]·A⁻¹[c_i, c_j] (eq. 4); u_S = 0 and failed[b] where M_S is
    not positive definite.

    cpp: each chunk gathered at its own size and solved in one pass, chunks over threads (no padding).
    torch / triton: batches of similar length padded to their longest (at most `budget` entries,
    default `kk_solve.reference.BUDGET`), the gather by `kk_gather` of that backend.
    """
    if not rows.shape == cols.shape == w.shape or rows.dim() != 1 or offsets.dim() != 1:
        raise ValueError(f"rows, cols, w must be 1-D of one length and offsets 1-D; got {tuple(rows.shape)}, "
                         f"{tuple(cols.shape)}, {tuple(w.shape)}, {tuple(offsets.shape)}")
    chosen = _resolve(backend, G_inv.device, "kk_solve")
    if chosen == "cpp" and G_inv.dtype in (torch.float32, torch.float64):
        return cast(tuple[torch.Tensor, torch.Tensor],
                    torch.ops.surgeon.kk_solve(G_inv, A_inv, rows, cols, w, offsets.to(torch.int64)))
    gather_backend = "triton" if chosen == "triton" else "torch"
    return kk_solve_reference.kk_solve(G_inv, A_inv, rows, cols, w, offsets, budget or kk_solve_reference.BUDGET,
                                       lambda G, A, r, c, valid: kk_gather(G, A, r, c, valid, gather_backend))


def batched_eigh(A: torch.Tensor, Q0: torch.Tensor | None = None,
                 backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues [B, n] (ascending) and eigenvectors [B, n, n] of symmetric A [B, n, n].

    `Q0` [B, n, n] is an optional orthogonal warm start (e.g. the previous shot's eigenvectors).
    `backend="triton"` runs the batched cyclic Jacobi solver; `auto` runs it on CUDA only for the
    widths where it measured faster (`JACOBI_WIDTHS`), `torch.linalg.eigh` everywhere else.
    """
    if A.dim() != 3 or A.shape[1] != A.shape[2]:
        raise ValueError(f"A must be [B, n, n], got {tuple(A.shape)}")
    if Q0 is not None and Q0.shape != A.shape:
        raise ValueError(f"Q0 must have A's shape {tuple(A.shape)}, got {tuple(Q0.shape)}")
    chosen = _resolve(backend, A.device, "batched_eigh")
    if chosen == "triton" and (backend == "triton" or A.shape[1] in JACOBI_WIDTHS):
        from surgeon_kernels.batched_eigh import kernel

        return kernel.batched_eigh(A, Q0)
    return eigh_reference.batched_eigh(A, Q0)
