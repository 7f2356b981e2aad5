"""The Kronecker factors of one layer (eq. 6), as the curvature pass leaves them, and where they are held.

`LayerFactors` holds a layer's raw (undamped) G and A in packed symmetric form; layers reading one
input (q/k/v, gate/up) hold the very same A object, so that it is stored, moved and inverted once.
`HostFactors` keeps them in host memory between the curvature pass and the prune phase
(`PruneConfig.offload`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from surgeon_kernels.ops import PackedSymmetric


@dataclass
class LayerFactors:
    """Raw (undamped) Kronecker factors of one layer, packed; `A` may be shared with sibling layers.

    With G come `row_quadratic` [R] = diag(W A Wᵀ) and `col_quadratic` [C] = diag(Wᵀ G W) (bias
    column excluded) of the weights the pass ran with.
    """

    A: PackedSymmetric
    G: PackedSymmetric | None
    row_quadratic: torch.Tensor | None = None
    col_quadratic: torch.Tensor | None = None


def input_owner(owners: Mapping[str, str], previous: tuple[str, torch.Tensor, bool] | None, name: str,
                x: torch.Tensor, bias: bool) -> str:
    """The layer whose A layer `name` (input `x`, with a bias column or not) holds: the owner of the `previous`
    layer run (name, input, bias) when that one read the very same tensor object with a bias alike (q/k/v,
    gate/up), else `name` itself. The curvature pass and the memory plan's trace both decide it here."""
    if previous is not None and previous[1] is x and previous[2] == bias:
        return owners[previous[0]]
    return name


def _moved(entry: LayerFactors, device: torch.device | str, memo: dict[int, PackedSymmetric]) -> LayerFactors:
    """`entry` with its packed factors on `device`; a factor already in `memo` (by the id of the one it was
    moved from) is taken from there, so that siblings sharing one A share one copy of it."""
    def move(factor: PackedSymmetric) -> PackedSymmetric:
        if id(factor) not in memo:
            memo[id(factor)] = factor.to(device)
        return memo[id(factor)]

    return dataclasses.replace(entry, A=move(entry.A), G=None if entry.G is None else move(entry.G))


class HostFactors:
    """Layers' factors held in host memory, each moved to `device` when it is taken (`pop`).

    `update` moves a pass's factors off the device. Siblings that read one input (q/k/v, gate/up)
    share one A on the host and, taken one after another, one copy of it on the device.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.entries: dict[str, LayerFactors] = {}
        self._last: tuple[PackedSymmetric, PackedSymmetric] | None = None  # the last A taken, on host and device

    def update(self, factors: Mapping[str, LayerFactors]) -> None:
        """Add `factors` (on the device), moved to host memory."""
        memo: dict[int, PackedSymmetric] = {}
        for name, entry in factors.items():
            self.entries[name] = _moved(entry, "cpu", memo)

    def pop(self, name: str, default: LayerFactors | None = None) -> LayerFactors | None:
        """Layer `name`'s factors on the device, removed from the host (`default` when it has none)."""
        entry = self.entries.pop(name, None)
        if entry is None:
            return default
        memo = {} if self._last is None else {id(self._last[0]): self._last[1]}
        moved = _moved(entry, self.device, memo)
        self._last = (entry.A, moved.A)
        return moved
