"""Plain-PyTorch reference of the Kronecker-factor accumulation (paper eq. 6)."""

import torch


def kfac_accumulate(out: torch.Tensor, x: torch.Tensor, scale: float, bias: bool) -> None:
    """Add `scale · [x, 1]ᵀ [x, 1]` to `out` in place (eq. 6: A = Σ a aᵀ / √N).

    Args:
        out: [C(+1), C(+1)] accumulator (float32 or float64); the last row/column is the bias
            column when `bias` is True.
        x: [N, C] inputs (or output gradients) of one token batch, any floating dtype.
        scale: multiplier of this batch's contribution.
        bias: whether `out` carries an extra constant-1 input column.
    """
    c = x.shape[1]
    xf = x.to(out.dtype)
    out[:c, :c].addmm_(xf.T, xf, alpha=scale)
    if bias:
        sums = xf.sum(0) * scale
        out[:c, c] += sums
        out[c, :c] += sums
        out[c, c] += scale * x.shape[0]
