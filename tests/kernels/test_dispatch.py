"""ops._resolve: which backend `auto` picks per device and op (the measured choices of bench/RESULTS.md)."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import HAS_CPP_OPS, ops
from surgeon_kernels._triton import HAS_TRITON

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")
def test_auto_on_cuda_runs_only_triton_kernels_that_ran_on_a_gpu_and_measured_faster(monkeypatch):
    monkeypatch.delenv("SURGEON_BACKEND", raising=False)
    for op in ("kfac_accumulate", "nm_select", "kth_smallest"):
        assert ops._resolve("auto", CUDA, op) == "triton", op
    for op in ("kk_gather", "kk_solve"):  # measured slower than PyTorch
        assert ops._resolve("auto", CUDA, op) == "torch", op
    assert ops._resolve("auto", CUDA, "batched_eigh") == "torch"  # changed since its GPU run
    assert ops._resolve("triton", CUDA, "batched_eigh") == "triton"


def test_auto_on_cpu_uses_the_compiled_op_only_where_it_exists(monkeypatch):
    monkeypatch.delenv("SURGEON_BACKEND", raising=False)
    for op in ("kfac_accumulate", "nm_select"):
        assert ops._resolve("auto", CPU, op) == ("cpp" if HAS_CPP_OPS else "torch"), op
    for op in ("kth_smallest", "kk_gather", "batched_eigh"):
        assert ops._resolve("auto", CPU, op) == "torch", op


@pytest.mark.skipif(not HAS_TRITON, reason="needs Triton (the interpreter runs it on the CPU)")
def test_environment_overrides_auto(monkeypatch):
    """`auto` never picks Triton for CPU tensors; SURGEON_BACKEND=triton makes it (under the interpreter)."""
    assert ops._resolve("auto", CPU, "kfac_accumulate") != "triton"
    monkeypatch.setenv("SURGEON_BACKEND", "triton")
    assert ops._resolve("auto", CPU, "kfac_accumulate") == "triton"


