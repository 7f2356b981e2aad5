"""surgeon.models.layer: reading and writing a layer's kept block, and what it holds of what was removed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from surgeon import PruneConfig, prune
from surgeon.errors import SurgeonError
from surgeon.method.submatrix import put_submatrix, submatrix
from surgeon.models.layer import Layer
from tests._helpers import tiny_model


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


def test_a_structured_layer_holds_no_mask_and_reads_its_removed_rows_and_columns_as_one():
    layer = Layer.unpruned("layer", nn.Linear(5, 4), elements=False)
    layer.rows[1], layer.cols[[0, 3]] = True, True
    expected = torch.zeros(4, 5, dtype=torch.bool)
    expected[1], expected[:, [0, 3]] = True, True
    assert layer.elements is None and torch.equal(layer.mask, expected)
    with pytest.raises(SurgeonError, match="layer removes rows and columns, not single weights"):
        layer.mask = expected
    element = Layer.unpruned("layer", nn.Linear(5, 4), elements=True)
    assert not element.mask.any()
    element.mask = expected
    assert element.elements is expected and element.mask is expected


@pytest.mark.parametrize("settings", [dict(structure="structured", target_size=0.6),
                                      dict(structure="unstructured", target_size=0.5)])
def test_a_run_holds_a_mask_only_of_single_weights_and_zeroes_what_it_removed(monkeypatch, settings):
    """A structured run's layers hold their removed rows and columns, no [R, C] mask; an unstructured run's hold one.
    Either way the pruned model's zeros are the layers' masks, and the report counts them."""
    layers: list[Layer] = []
    unpruned = Layer.unpruned

    def recorded(name: str, module: nn.Linear, elements: bool) -> Layer:
        layers.append(unpruned(name, module, elements))
        return layers[-1]

    monkeypatch.setattr(Layer, "unpruned", recorded)
    model = tiny_model("llama")
    report = prune(model, torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(0)),
                   PruneConfig(shots=2, **settings), progress=False)
    assert layers and all((layer.elements is not None) == (settings["structure"] == "unstructured")
                          for layer in layers)
    for layer in layers:
        assert torch.equal(layer.module.weight == 0, layer.mask), layer.name
    removed = sum(int(layer.mask.sum()) for layer in layers)
    assert report.removed == removed and report.sparsity == removed / sum(layer.mask.numel() for layer in layers)
