"""kth_smallest: radix selection on every backend against torch.kthvalue over many tensors."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import Deferred, available_backends, ops
from surgeon_kernels.kth_smallest import radix, reference


def test_order_keys_preserve_order():
    x = torch.tensor([float("-inf"), -3.5, -1e-30, -0.0, 1e-30, 2.0, 7e30, float("inf")])
    keys = radix.order_keys(x)
    assert (keys[1:] > keys[:-1]).all()
    assert [radix.key_to_float(int(k)) for k in keys] == x.tolist()


@pytest.mark.parametrize("sizes", [(1,), (5, 0, 9), (300, 17, 1, 64), (2500, 3)],
                         ids=["one", "with-empty", "mixed", "several-blocks"])
@pytest.mark.parametrize("backend", available_backends("cpu", "kth_smallest") + ["radix-torch"])
def test_matches_kthvalue(sizes, backend):
    gen = torch.Generator().manual_seed(sum(sizes))
    values = [torch.randn(n, generator=gen) * 10 ** torch.randint(-3, 3, (1,), generator=gen).item() for n in sizes]
    if sizes[0] > 3:
        values[0][:3] = float("-inf")  # already pruned structures
        values[0][3:6] = 0.25  # ties
    total = sum(sizes)
    lazy = [Deferred(v.numel(), v.device, v.clone) if i % 2 else v for i, v in enumerate(values)]
    for k in sorted({1, min(2, total), total // 3 + 1, max(1, total // 2), total}):
        for given in (values, lazy):  # held tensors, and every other one deferred
            got = radix.kth_smallest(given, k) if backend == "radix-torch" else ops.kth_smallest(given, k, backend)
            assert got == reference.kth_smallest(values, k)


def test_deferred_of_the_wrong_size_raises():
    with pytest.raises(ValueError, match="declared 4 elements, computed 3"):
        ops.kth_smallest([Deferred(4, "cpu", lambda: torch.rand(3))], 2)


def test_k_out_of_range_raises():
    with pytest.raises(ValueError, match="k=4"):
        ops.kth_smallest([torch.rand(3)], 4)
    with pytest.raises(ValueError, match="k=0"):
        radix.kth_smallest([torch.rand(3)], 0)


@pytest.mark.requires_cuda
def test_cuda_triton_matches_kthvalue(cuda_device):
    values = [torch.randn(1537, 576), torch.randn(100_003)]
    k = 123_457
    assert ops.kth_smallest([v.to(cuda_device) for v in values], k, "triton") == reference.kth_smallest(values, k)
