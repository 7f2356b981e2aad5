"""K×K correlated-update solves u_S = M_S⁻¹ w_S for ragged chunks S of a layer's pruned weights (eq. 4)."""
