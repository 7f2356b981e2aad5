"""One dispatcher for every op: `backend="auto"|"triton"|"cpp"|"torch"`.

`auto` picks Triton for CUDA tensors (when Triton kernels exist for the op and Triton imports),
the compiled C++ op for CPU tensors when `surgeon_kernels._C` was built, and the PyTorch
reference otherwise. The environment variable `SURGEON_BACKEND` overrides `auto`.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from surgeon_kernels._ext import HAS_CPP_OPS
from surgeon_kernels.kfac_accumulate import reference as kfac_reference

Backend = Literal["auto", "triton", "cpp", "torch"]


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """The backends that can run on tensors of `device`."""
    device = torch.device(device)
    names = ["torch"]
    if device.type == "cpu" and HAS_CPP_OPS:
        names.append("cpp")
    return names


def _resolve(backend: Backend, device: torch.device) -> str:
    """Pick a concrete backend for tensors on `device`; raise if the requested one is missing."""
    if backend == "auto":
        backend = os.environ.get("SURGEON_BACKEND", "auto")  # type: ignore[assignment]
    available = available_backends(device)
    if backend == "auto":
        return "cpp" if "cpp" in available else "torch"
    if backend not in ("triton", "cpp", "torch"):
        raise ValueError(f"backend={backend!r} is not one of auto, triton, cpp, torch")
    if backend not in available:
        raise RuntimeError(
            f"backend {backend!r} is not available for {device.type} tensors here; "
            f"available: {', '.join(available)}"
        )
    return backend


def kfac_accumulate(
    out: torch.Tensor, x: torch.Tensor, scale: float, bias: bool = False, backend: Backend = "auto"
) -> None:
    """Add `scale · [x, 1]ᵀ [x, 1]` to the symmetric factor `out` in place (paper eq. 6)."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [tokens, features], got shape {tuple(x.shape)}")
    width = x.shape[1] + int(bias)
    if out.shape != (width, width):
        raise ValueError(f"out must have shape {(width, width)}, got {tuple(out.shape)}")
    chosen = _resolve(backend, x.device)
    if chosen == "cpp" and out.dtype == torch.float32:
        torch.ops.surgeon.kfac_accumulate(out, x, float(scale), bool(bias))
    else:
        kfac_reference.kfac_accumulate(out, x, scale, bias)
