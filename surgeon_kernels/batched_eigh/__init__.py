"""Batched symmetric eigendecomposition (many matrices of up to a few hundred rows), warm-startable."""
