"""The one tolerance policy of the test suite.

- float64 against a float64 closed form: `FLOAT64`, 1e-10 relative.
- A computation in low precision (float32, bfloat16) against its float64 closed form: its error may
  be at most twice that of the plain-PyTorch reference run in the same dtype, plus `TINY` times the
  exact result's scale (`assert_within_reference_error`). The reference's own error sets the bar,
  so a kernel that is merely "close" but worse than PyTorch fails.
- `FLOAT32`: two float32 computations of the same quantity by different, equally valid orders of
  summation (e.g. block by block against the whole model), where no float64 oracle is at hand.
"""

from __future__ import annotations

import torch

FLOAT64 = dict(rtol=1e-10, atol=1e-10)
FLOAT32 = dict(rtol=2e-4, atol=1e-5)
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
