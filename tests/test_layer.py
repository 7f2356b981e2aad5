"""surgeon.models.layer: reading and writing a layer's kept block."""

from __future__ import annotations

import torch

from surgeon.method.submatrix import put_submatrix, submatrix


def test_submatrix_and_put_submatrix_match_advanced_indexing(gen):
    M = torch.randn(9, 7, generator=gen)
    rows, cols = torch.tensor([0, 3, 4, 8]), torch.tensor([1, 2, 6])
    assert torch.equal(submatrix(M, rows, cols), M[rows.unsqueeze(1), cols])
    assert torch.equal(submatrix(M, slice(None), cols), M[:, cols])
    block = torch.randn(4, 3, generator=gen)
    expected = M.clone()
    expected[rows.unsqueeze(1), cols] = block
    assert torch.equal(put_submatrix(M.clone(), rows, cols, block), expected)


def test_whole_index_reads_and_writes_without_copies_and_permutations_still_gather(gen):
    M = torch.randn(5, 4, generator=gen)
    every_row, every_col = torch.arange(5), torch.arange(4)
    assert submatrix(M, every_row, every_col).data_ptr() == M.data_ptr()  # no copy
    permuted = torch.tensor([1, 0, 2, 3, 4])  # as many entries as rows, but not the identity
    assert torch.equal(submatrix(M, permuted, every_col), M[permuted])
    assert torch.equal(submatrix(M, every_row, torch.tensor([0, 1, 2, 2])), M[:, [0, 1, 2, 2]])
    block = torch.randn(5, 4, generator=gen)
    target = torch.zeros(5, 4)
    assert put_submatrix(target, every_row, every_col, block) is target and torch.equal(target, block)
    scattered = put_submatrix(torch.zeros(5, 4), permuted, every_col, block)
    assert torch.equal(scattered[permuted], block)
