"""nm_select: every backend against the reference; hand-computed case; ties; -inf; odd shapes."""

from __future__ import annotations

import pytest
import torch

from surgeon_kernels import HAS_CPP_OPS, available_backends, ops
from surgeon_kernels.nm_select import reference
from tests._tolerances import assert_within_reference_error

SHAPES = [
    pytest.param(1, 4, 2, 4, id="R1-C4-2of4"),
    pytest.param(7, 24, 2, 4, id="R7-C24-2of4"),
    pytest.param(13, 40, 1, 8, id="R13-C40-1of8"),
    pytest.param(5, 18, 5, 6, id="R5-C18-5of6-M-not-pow2"),
    pytest.param(3, 48, 4, 16, id="R3-C48-4of16"),
    pytest.param(0, 8, 2, 4, id="R0-empty"),
]


def test_reference_hand_computed():
    costs = torch.tensor([[4.0, 1.0, 3.0, 2.0, 0.5, 0.5, 9.0, 0.5]])
    groups, mask = reference.nm_select(costs, 2, 4)
    assert groups.tolist() == [[3.0, 1.0]]
    assert mask.tolist() == [[False, True, False, True, True, True, False, False]]


@pytest.mark.parametrize("R,C,n,m", SHAPES)
@pytest.mark.parametrize("backend", available_backends("cpu", "nm_select"))
def test_matches_reference(R, C, n, m, backend):
    gen = torch.Generator().manual_seed(R * 100 + C)
    costs = torch.randn(R, C, generator=gen)
    costs[costs > 1.5] = float("-inf")  # already pruned weights
    if R > 1:
        costs[1] = costs[1].round()  # ties
    groups, mask = ops.nm_select(costs, n, m, backend)
    expected_groups, expected_mask = reference.nm_select(costs, n, m)
    exact_groups, _ = reference.nm_select(costs.double(), n, m)
    assert torch.equal(mask, expected_mask)
    assert_within_reference_error(groups, exact_groups, expected_groups)
    assert (mask.reshape(R, C // m, m).sum(2) == m - n).all()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="m | C"):
        ops.nm_select(torch.rand(2, 6), 2, 4)
    with pytest.raises(ValueError, match="0 < n < m"):
        ops.nm_select(torch.rand(2, 8), 4, 4)


@pytest.mark.skipif(not HAS_CPP_OPS, reason="compiled ops not built")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cpp_opcheck_and_dtypes(dtype):
    costs = torch.randn(9, 12, dtype=dtype)
    torch.library.opcheck(torch.ops.surgeon.nm_select.default, (costs, 2, 4))
    groups, mask = ops.nm_select(costs, 1, 3, "cpp")
    expected_groups, expected_mask = reference.nm_select(costs, 1, 3)
    assert groups.dtype == dtype and torch.equal(mask, expected_mask)
    torch.testing.assert_close(groups, expected_groups)


@pytest.mark.requires_cuda
def test_cuda_triton_matches_reference(cuda_device):
    costs = torch.randn(1537, 576)
    groups, mask = ops.nm_select(costs.to(cuda_device), 2, 4, "triton")
    expected_groups, expected_mask = reference.nm_select(costs, 2, 4)
    assert torch.equal(mask.cpu(), expected_mask)
    torch.testing.assert_close(groups.cpu(), expected_groups)
