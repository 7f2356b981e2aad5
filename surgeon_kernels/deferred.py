"""A tensor computed on each use instead of held: e.g. one layer's element costs.

The global threshold reads every layer's costs a few times (`ops.kth_smallest`); holding them all
would take 4 bytes per weight (24 GiB for Llama-2-7B, next to 30 GiB of packed inverses and the
weights). A `Deferred` is recomputed from what is held anyway, and its size and device are known
without computing it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class Deferred:
    """`compute()` returns a tensor of `numel` elements on `device`, the same values on every call."""

    def __init__(self, numel: int, device: torch.device, compute: Callable[[], torch.Tensor]):
        self._numel, self.device, self._compute = numel, torch.device(device), compute

    def numel(self) -> int:
        """The element count, known before computing."""
        return self._numel

    def __call__(self) -> torch.Tensor:
        """Compute the tensor (checked against the declared size)."""
        value = self._compute()
        if value.numel() != self._numel:
            raise ValueError(f"deferred tensor declared {self._numel} elements, computed {value.numel()}")
        return value


Lazy = torch.Tensor | Deferred


def materialise(value: Lazy) -> torch.Tensor:
    """The tensor itself, or the deferred one computed now."""
    return value() if isinstance(value, Deferred) else value
