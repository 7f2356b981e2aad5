"""The one tolerance policy of the test suite.

- float64 against a float64 closed form: `FLOAT64`, 1e-10 relative.
- A computation in low precision (float32, bfloat16) against its float64 closed form: its error may
  be at most twice that of the plain-PyTorch reference run in the same dtype, plus `TINY` times the
  exact result's scale (`assert_within_reference_error`). The reference's own error sets the bar,
  so a kernel that is merely "close" but worse than PyTorch fails.
- `FLOAT32`: two float32 computations of the same quantity by different, equally valid orders of
  summation (e.g. block by block against the whole model), or one passed through float32 storage,
  where no float64 oracle is at hand.
- `FLOORED`: a float64 result of a singular matrix whose eigenvalues were floored at √eps·max|λ|
  (`inverses.floored_eigh`) against its definition: exact up to that floor.
- Pruning targets are counts, not tolerances (`assert_reaches_target`): element-wise and N:M
  pruning remove exactly the weights their rule asks for; structured pruning at least that and at
  most one structure more, plus the dead weights its choices free.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT64 = dict(rtol=1e-10, atol=1e-10)
FLOAT32 = dict(rtol=2e-4, atol=1e-5)
FLOORED = dict(rtol=torch.finfo(torch.float64).eps ** 0.5, atol=torch.finfo(torch.float64).eps ** 0.5)
TINY = 1e-6


def error(actual: torch.Tensor, exact: torch.Tensor) -> float:
    """Largest absolute deviation of `actual` from the float64 `exact`; ±inf must match exactly."""
    actual, exact = actual.double(), exact.double()
    finite = torch.isfinite(exact)
    if not torch.equal(actual[~finite], exact[~finite]):
        return float("inf")
    return float((actual[finite] - exact[finite]).abs().max()) if finite.any() else 0.0


def assert_within_reference_error(actual: torch.Tensor, exact: torch.Tensor, reference: torch.Tensor) -> None:
    """`actual` deviates from `exact` by at most 2× the deviation of `reference` (same dtype) + TINY·scale."""
    finite = exact[torch.isfinite(exact)]
    scale = float(finite.double().abs().max()) if finite.numel() else 0.0
    own = error(reference, exact)
    got = error(actual, exact)
    assert got <= 2 * own + TINY * scale, f"error {got:.3g} exceeds 2× the reference's {own:.3g} (+{TINY * scale:.3g})"


SPARSEGPT_BLOCK = 128  # SparseGPT chooses its mask per block of this many columns


def removed_by_rule(shapes: Sequence[tuple[int, int]], target_size: float, method: str = "surgeon") -> int:
    """Weights an element-wise prune to `target_size` removes from layers of `shapes` [(R, C)]: round((1 − α)·total)
    for one global threshold; Wanda rounds per row and SparseGPT per block of columns."""
    s = 1 - target_size
    if method == "wanda":
        return sum(R * round(s * C) for R, C in shapes)
    if method.startswith("sparsegpt"):
        return sum(round(s * R * min(SPARSEGPT_BLOCK, C - j)) for R, C in shapes for j in range(0, C, SPARSEGPT_BLOCK))
    return round(s * sum(R * C for R, C in shapes))


def assert_reaches_target(removed: int, shapes: Sequence[tuple[int, int]], target_size: float, structure: str,
                          method: str = "surgeon", freed: int = 0, largest: int | None = None) -> None:
    """`removed` weights hit the target: exactly (elements, N:M), or within one structure (`largest` weights;
    default the longest row or column) plus `freed` (structured, coupled)."""
    if structure in ("structured", "coupled"):
        wanted = removed_by_rule(shapes, target_size)
        largest = largest or max(max(shape) for shape in shapes)
        assert wanted <= removed <= wanted + largest + freed, f"removed {removed} of target {wanted}"
    else:
        wanted = removed_by_rule(shapes, target_size, method)
        assert removed == wanted, f"removed {removed}, the rule asks for {wanted}"
