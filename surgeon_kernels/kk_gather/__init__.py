"""K×K correlated-update systems M[b,i,j] = G⁻¹[r_bi, r_bj]·A⁻¹[c_bi, c_bj] built from the inverse factors (eq. 4)."""
