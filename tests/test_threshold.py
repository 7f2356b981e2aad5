"""Global thresholds: exact counts across layers of different shapes, overlap accounting, N:M."""

from __future__ import annotations

import pytest
import torch

from surgeon import threshold
from surgeon.errors import SurgeonError

SHAPES = [(7, 5), (3, 11), (13, 4)]


def random_costs(gen):
    return [torch.rand(R, C, generator=gen) for R, C in SHAPES]


@pytest.mark.parametrize("k", [0, 1, 17, 50, 120])
def test_smallest_k_exact(k, gen):
    costs = random_costs(gen)
    masks = threshold.smallest_k(costs, k)
    assert sum(int(m.sum()) for m in masks) == k
    chosen = torch.cat([c[m] for c, m in zip(costs, masks)])
    rest = torch.cat([c[~m] for c, m in zip(costs, masks)])
    if 0 < k < 120:
        assert chosen.max() <= rest.min()


def test_smallest_k_ties_and_previous():
    costs = [torch.zeros(2, 2), torch.zeros(3)]
    costs[1][0] = float("-inf")
    masks = threshold.smallest_k(costs, 3)
    assert sum(int(m.sum()) for m in masks) == 3 and masks[1][0]


def zeros_of(rows, cols):
    return sum(R * C - (R - int(r.sum())) * (C - int(c.sum())) for (R, C), r, c in zip(SHAPES, rows, cols))


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.8])
def test_structured_selection_hits_target_within_one_structure(fraction, gen):
    rows = [torch.rand(R, generator=gen) for R, _ in SHAPES]
    cols = [torch.rand(C, generator=gen) for _, C in SHAPES]
    total = sum(R * C for R, C in SHAPES)
    target = round(fraction * total)
    row_masks, col_masks = threshold.structured_selection(rows, cols, target)
    reached = zeros_of(row_masks, col_masks)
    largest = max(max(R, C) for R, C in SHAPES)
    assert target <= reached < target + largest
    # the selection is a prefix of the global cost order
    chosen = torch.cat([t[m] for pair in zip(rows, row_masks, cols, col_masks) for t, m in (pair[:2], pair[2:])])
    rest = torch.cat([t[~m] for pair in zip(rows, row_masks, cols, col_masks) for t, m in (pair[:2], pair[2:])])
    assert chosen.max() <= rest.min()


def test_structured_overlap_counts_new_weights_only():
    # one 4x4 layer: removing row 0 (4 weights) then column 0 adds only 3 new zeros
    rows = [torch.tensor([0.0, 9.0, 9.0, 9.0])]
    cols = [torch.tensor([1.0, 9.0, 9.0, 9.0])]
    r, c = threshold.structured_selection(rows, cols, 7)
    assert r[0].tolist() == [True, False, False, False] and c[0].tolist() == [True, False, False, False]
    with pytest.raises(SurgeonError):
        threshold.structured_selection(rows, cols, 17)


def test_nm_groups_and_global_selection(gen):
    costs = [torch.rand(4, 8, generator=gen), torch.rand(3, 12, generator=gen)]
    masks = threshold.nm_selection(costs, 2, 4, target_zeros=20)
    assert sum(int(m.sum()) for m in masks) == 20
    for cost, mask in zip(costs, masks):
        groups = mask.reshape(mask.shape[0], -1, 4).sum(2)
        assert set(groups.unique().tolist()) <= {0, 2}
        # inside a pruned group the two cheapest go
        g = cost.reshape(cost.shape[0], -1, 4)
        m = mask.reshape(mask.shape[0], -1, 4)
        for idx in (groups == 2).nonzero():
            assert g[idx[0], idx[1]][m[idx[0], idx[1]]].max() <= g[idx[0], idx[1]][~m[idx[0], idx[1]]].min()
    with pytest.raises(ValueError, match="m | C"):  # the op's own validation
        threshold.nm_selection([torch.rand(2, 6)], 2, 4, 4)
