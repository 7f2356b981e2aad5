"""Global thresholds: exact counts across layers of different shapes, overlap accounting, N:M."""

from __future__ import annotations

import functools

import pytest
import torch

from surgeon.errors import SurgeonError
from surgeon.method import threshold
from surgeon_kernels import Deferred, available_backends, ops

SHAPES = [(7, 5), (3, 11), (13, 4)]


def random_costs(gen):
    return [torch.rand(R, C, generator=gen) for R, C in SHAPES]


@pytest.mark.parametrize("k", [0, 1, 17, 50, 120])
def test_smallest_k_exact(k, gen):
    costs = random_costs(gen)
    masks = [mask() for mask in threshold.smallest_k(costs, k)]
    assert sum(int(m.sum()) for m in masks) == k
    chosen = torch.cat([c[m] for c, m in zip(costs, masks)])
    rest = torch.cat([c[~m] for c, m in zip(costs, masks)])
    if 0 < k < 120:
        assert chosen.max() <= rest.min()


def test_smallest_k_ties_and_previous():
    costs = [torch.zeros(2, 2), torch.zeros(3)]
    costs[1][0] = float("-inf")
    masks = [mask() for mask in threshold.smallest_k(costs, 3)]
    assert sum(int(m.sum()) for m in masks) == 3 and masks[1][0]


def cheapest_total_within(costs, k, limits):
    """The least sum of k costs taking between `limits` of each tensor: every admissible count per tensor tried,
    each tensor's cheapest taken (the closed form `smallest_k_within` must reach)."""
    ordered = [c.reshape(-1).double().sort().values for c in costs]
    best = float("inf")
    for first in range(limits[0][0], limits[0][1] + 1):
        for second in range(limits[1][0], limits[1][1] + 1):
            third = k - first - second
            if limits[2][0] <= third <= limits[2][1]:
                best = min(best, sum(float(o[:n].sum()) for o, n in zip(ordered, (first, second, third))))
    return best


@pytest.mark.parametrize("deviation", [0.0, 0.05, 0.2, 0.6])
@pytest.mark.parametrize("k", [1, 17, 60, 119])
def test_bounded_selection_is_the_cheapest_within_each_tensors_limits(deviation, k, gen):
    """Every tensor's count lies within k's fraction ± `deviation` of its size (floor and ceiling), and no other
    choice within those limits costs less; an entry already pruned (−inf) stays chosen."""
    costs = random_costs(gen)
    costs[2][0, :3] = float("-inf")
    limits = threshold.bounds(k, [c.numel() for c in costs], deviation)
    masks = [mask() for mask in threshold.smallest_k_within(costs, k, deviation)]
    counts = [int(m.sum()) for m in masks]
    assert sum(counts) == k and bool(masks[2][0, :3].all()) == (k >= 3)
    for (low, high), count, c in zip(limits, counts, costs):
        assert low <= count <= high
        assert low >= (k / 120 - deviation) * c.numel() - 1 and high <= (k / 120 + deviation) * c.numel() + 1
    finite = [c.masked_fill(torch.isinf(c), -1.0) for c in costs]  # −inf priced as any cost below the rest
    chosen = sum(float(c[m].double().sum()) for c, m in zip(finite, masks))
    assert chosen == pytest.approx(cheapest_total_within(finite, k, limits), rel=1e-9)


def test_bounds_always_admit_the_count_and_a_full_deviation_is_one_global_threshold(gen):
    for k in range(0, 121):
        for deviation in (0.0, 0.1, 0.5):
            limits = threshold.bounds(k, [35, 33, 52], deviation)
            assert sum(low for low, _ in limits) <= k <= sum(high for _, high in limits)
    costs = random_costs(gen)
    for got, want in zip(threshold.smallest_k_within(costs, 50, 1.0), threshold.smallest_k(costs, 50)):
        assert torch.equal(got(), want())
    with pytest.raises(SurgeonError, match="cannot select 121 of 120"):
        threshold.bounds(121, [35, 33, 52], 0.0)


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
    masks = [mask() for mask in threshold.nm_selection(costs, 2, 4, target_zeros=20)]
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


def counted(costs: list[torch.Tensor], calls: list[int]) -> list[Deferred]:
    """Each cost tensor as a `Deferred` copy that counts how often it is computed."""
    def compute(i: int) -> torch.Tensor:
        calls[i] += 1
        return costs[i].clone()

    return [Deferred(c.numel(), c.device, functools.partial(compute, i)) for i, c in enumerate(costs)]


@pytest.mark.parametrize("backend", available_backends("cpu", "kth_smallest"))
@pytest.mark.parametrize("selection", ["smallest_k", "within", "2:4"])
def test_deferred_costs_select_what_held_costs_select(selection, backend, gen):
    """Deferred costs (recomputed at each read, never all held) give the held costs' masks, with τ on ties
    spread over two tensors (some taken, some not) and −inf entries."""
    costs = [torch.rand(4, 8, generator=gen), torch.rand(3, 12, generator=gen), torch.rand(5, 4, generator=gen)]
    costs[0][0, :4] = costs[2][1, :4] = 0.25  # ties: 4 weights (2:4: one group) in each of two tensors
    costs[1][2, :4] = float("-inf")  # already pruned
    if selection == "smallest_k":
        k = sum(int((c < 0.25).sum()) for c in costs) + 5  # τ = 0.25: all 4 ties of tensor 0, 1 of tensor 2
        select = functools.partial(threshold.smallest_k, k=k, backend=backend)
    elif selection == "within":  # limits wide enough for the ties at τ to stay split alike; +∞ beyond them
        k = sum(int((c < 0.25).sum()) for c in costs) + 5
        select = functools.partial(threshold.smallest_k_within, k=k, deviation=0.45, backend=backend)
    else:
        k = 2 * (sum(int((ops.nm_select(c, 2, 4)[0] < 0.5).sum()) for c in costs) + 1)  # τ = 0.5: 1 of 2 groups
        select = functools.partial(threshold.nm_selection, n=2, m=4, target_zeros=k, backend=backend)
    calls = [0] * len(costs)
    deferred = select(counted(costs, calls))
    assert calls[0] > 0 and len(set(calls)) == 1  # read while selecting, each as often
    reads = calls[0]
    if selection == "within":  # the limits' cuts come from the costs of the first read, not a read of their own
        plain = [0] * len(costs)
        threshold.smallest_k(counted(costs, plain), k, backend)
        assert reads == plain[0]
    held = [mask() for mask in select(costs)]
    for got, want in zip(deferred, held):
        assert torch.equal(got(), want)
    assert calls == [reads + 1] * len(costs)  # a mask computes its costs once more
    assert sum(int(m.sum()) for m in held) == k
    split = (2, 0) if selection == "2:4" else (4, 1)  # ties taken in tensor order (2:4: 2 of 4 per group)
    assert (int(held[0][0, :4].sum()), int(held[2][1, :4].sum())) == split


def test_selecting_nothing_reads_no_costs(gen):
    """k = 0 (a shot with nothing left to remove): τ = −∞ without reading a cost, and empty masks."""
    costs = [torch.rand(4, 8, generator=gen), torch.full((3,), float("-inf"))]
    calls = [0] * len(costs)
    masks = threshold.smallest_k(counted(costs, calls), 0)
    assert calls == [0, 0]
    assert not any(bool(mask().any()) for mask in masks)
