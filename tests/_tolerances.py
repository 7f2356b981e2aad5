"""Tolerances, stated once (STYLE.md): float64 against float64 agrees to 1e-10 relative."""

FLOAT64 = dict(rtol=1e-10, atol=1e-10)
FLOAT32 = dict(rtol=2e-4, atol=1e-5)
