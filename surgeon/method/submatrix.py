"""Reading and writing a submatrix M[rows][:, cols], the index sets every cost and update works on."""

from __future__ import annotations

import torch

Index = torch.Tensor | slice  # kept rows or columns: an index tensor, or a slice (all of them)


def _whole(index: torch.Tensor | slice, size: int) -> bool:
    """Whether `index` is a tensor holding 0, 1, …, size−1: indexing with it changes nothing."""
    return (isinstance(index, torch.Tensor) and index.numel() == size
            and bool((index == torch.arange(size, device=index.device)).all()))


def submatrix(M: torch.Tensor, rows: torch.Tensor | slice, cols: torch.Tensor | slice) -> torch.Tensor:
    """M[rows][:, cols] for reading: index tensors through `index_select` (several times faster than advanced
    indexing on the CPU); M itself, not a copy, where both take everything (a first shot's kept rows and columns)."""
    if _whole(rows, M.shape[0]) and _whole(cols, M.shape[1]):
        return M
    M = M.index_select(0, rows) if isinstance(rows, torch.Tensor) else M[rows]
    return M.index_select(1, cols) if isinstance(cols, torch.Tensor) else M[:, cols]


def put_submatrix(M: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """M[rows[:, None], cols] = block through two `index_copy_` (faster than 2-D advanced indexing); returns M."""
    if _whole(rows, M.shape[0]) and _whole(cols, M.shape[1]):
        return M.copy_(block)
    return M.index_copy_(0, rows, M.index_select(0, rows).index_copy_(1, cols, block))
