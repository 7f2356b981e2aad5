"""Plain-PyTorch reference of the Kronecker-factor accumulation (paper eq. 6)."""

from collections.abc import Sequence

import torch

from surgeon_kernels.symmetric import PackedSymmetric


def kfac_accumulate(out: PackedSymmetric, x: torch.Tensor, scale: float, bias: bool) -> None:
    """Add `scale · [x, 1]ᵀ [x, 1]` to the packed symmetric `out` in place (eq. 6: A = Σ a aᵀ / √N).

    Args:
        out: packed [C(+1), C(+1)] accumulator (float32 or float64 tiles); the last row/column is
            the bias column when `bias` is True.
        x: [N, C] inputs (or output gradients) of one token batch, any floating dtype.
        scale: multiplier of this batch's contribution.
        bias: whether `out` carries an extra constant-1 input column.
    """
    xf = x.to(out.tiles.dtype)
    if bias:
        xf = torch.cat([xf, xf.new_ones(xf.shape[0], 1)], 1)
    out.tiles += PackedSymmetric.pack(scale * (xf.T @ xf), out.tile).tiles


def kfac_accumulate_group(outs: Sequence[PackedSymmetric], xs: Sequence[torch.Tensor], scale: float,
                          biases: Sequence[bool]) -> None:
    """`kfac_accumulate` for each (out, x, bias) of a group, one after the other."""
    for out, x, bias in zip(outs, xs, biases):
        kfac_accumulate(out, x, scale, bias)
