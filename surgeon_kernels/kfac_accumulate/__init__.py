"""Kronecker-factor accumulation `A += s·[X,1]ᵀ[X,1]` (paper eq. 6)."""
