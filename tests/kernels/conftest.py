"""Kernel-test fixtures: outputs allocated by an op start as NaN (or a sentinel), never as zeros."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def poison_new_outputs(monkeypatch):
    """Make `torch.empty` return poisoned memory, so elements a kernel forgets to write fail."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        if out.is_floating_point():
            out.fill_(float("nan"))
        elif out.dtype == torch.bool:
            out.fill_(True)
        else:
            out.fill_(-77 if out.dtype.is_signed else 77)
        return out

    monkeypatch.setattr(torch, "empty", poisoned)


@pytest.fixture
def cuda_device() -> torch.device:
    """The CUDA device with compiled (not interpreted) Triton kernels; skips where there is none."""
    import os

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA GPU and TRITON_INTERPRET=0")
    return torch.device("cuda")
