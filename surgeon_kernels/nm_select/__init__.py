"""N:M group selection: the M−N cheapest weights of every group of M (paper sec. 3.3, N:M)."""
