"""The Kronecker factors of one layer (eq. 6), as the curvature pass leaves them, and where they are held.

`LayerFactors` holds a layer's raw (undamped) G and A in packed symmetric form. The curvature pass
returns `InputGroup`s: the layers that read one input (q/k/v, gate/up) with its one A, so that it is
stored, moved and inverted once for all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from surgeon_kernels.ops import PackedSymmetric


@dataclass
class LayerFactors:
    """Raw (undamped) Kronecker factors of one layer, packed; `A` is its input group's (`InputGroup`).

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


@dataclass
class InputGroup:
    """The layers that read one input (q/k/v, gate/up; any other layer alone) with that input's raw A, held once:
    each of `layers`' factors (in the order the layers ran) holds this `A`."""

    A: PackedSymmetric
    layers: dict[str, LayerFactors]

    def to(self, device: torch.device | str) -> InputGroup:
        """The group with A, moved once, and each layer's G on `device` (host memory between the curvature pass
        and the prune phase: `PruneConfig.offload`)."""
        A = self.A.to(device)
        return InputGroup(A, {name: dataclasses.replace(entry, A=A, G=None if entry.G is None else entry.G.to(device))
                              for name, entry in self.layers.items()})


def by_layer(groups: Iterable[InputGroup]) -> dict[str, LayerFactors]:
    """Every layer's factors, by its name."""
    return {name: entry for group in groups for name, entry in group.layers.items()}


def grouped(names: Sequence[str], groups: list[InputGroup]) -> Iterator[tuple[InputGroup | None, list[int]]]:
    """Each input group with the positions of its layers in `names`, taken out of `groups` as it is reached (so
    that it is freed once used); then each layer of `names` that has no factors, alone (None)."""
    position = {name: i for i, name in enumerate(names)}
    reached: set[int] = set()
    while groups:
        group = groups.pop(0)
        members = [position[name] for name in group.layers]
        reached.update(members)
        yield group, members
    for i in range(len(names)):
        if i not in reached:
            yield None, [i]
