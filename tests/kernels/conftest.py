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
