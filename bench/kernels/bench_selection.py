"""Microbenchmarks: N:M group selection and the global threshold (radix select vs kthvalue), CPU.

    python -m pytest bench/kernels/bench_selection.py --benchmark-only

Both are memory-bound: the fraction is of the measured copy bandwidth (bench/kernels/_roofline.py), with
the bytes each op must read and write at least.
"""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import available_backends, ops
from surgeon_kernels.kth_smallest import reference as kth_reference

LAYERS = {"smollm2-mlp": (1536, 576), "llama2-7b-mlp": (11008, 4096)}


@pytest.mark.parametrize("backend", [b for b in available_backends("cpu", "nm_select") if b != "triton"])
@pytest.mark.parametrize("layer", list(LAYERS), ids=str)
def test_nm_select(benchmark, roofline, layer, backend):
    costs = torch.rand(*LAYERS[layer])
    benchmark(ops.nm_select, costs, 2, 4, backend)
    roofline(bytes=costs.numel() * (4 + 1) + costs.numel() // 4 * 4)


@pytest.mark.parametrize("method", ["radix", "kthvalue"])
def test_global_threshold(benchmark, roofline, method):
    costs = [torch.rand(1536, 576) for _ in range(60)] + [torch.rand(576, 576) for _ in range(60)]
    k = sum(c.numel() for c in costs) // 2
    if method == "radix":
        fn = lambda: ops.kth_smallest(costs, k, "torch")  # noqa: E731
    else:
        fn = lambda: kth_reference.kth_smallest(costs, k)  # noqa: E731
    benchmark(fn)
    roofline(bytes=4 * 4 * sum(c.numel() for c in costs))
