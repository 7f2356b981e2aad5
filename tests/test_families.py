"""Every decoder family: a tiny random model of each prunes to its target, stays finite and loads back."""

from __future__ import annotations

import pytest
import torch

from surgeon import PruneConfig, prune, save_model
from surgeon.model import prunable_layers
from tests._families import FAMILIES, VOCAB, family_model
from tests._tolerances import assert_reaches_target


def calibration() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))


def shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    return [tuple(m.weight.shape) for block in prunable_layers(model) for _, m in block]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("structure", ["structured", "unstructured", "2:4"])
def test_family_prunes_to_target_and_loads_back(family, structure, tmp_path):
    from transformers import AutoModelForCausalLM

    model = family_model(family)
    assert model.config.model_type.removesuffix("_text") == family
    size = None if structure == "2:4" else 0.7
    report = prune(model, calibration(), PruneConfig(structure=structure, target_size=size, shots=1), progress=False)
    assert_reaches_target(report.removed, shapes(model), report.config["target_size"], structure,
                          freed=report.shots[0].freed)
    zeros = sum(int((m.weight == 0).sum()) for block in prunable_layers(model) for _, m in block)
    assert zeros == report.removed  # random weights hold no zeros of their own
    assert all(torch.isfinite(p).all() for p in model.parameters())

    save_model(tmp_path / family, model)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / family)
    for (name, param), (_, again) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(param, again), name


@pytest.mark.parametrize("structure", ["structured", "unstructured", "2:4"])
def test_weights_that_are_already_zero_do_not_count_as_pruned(structure):
    """A dequantized checkpoint holds exact zeros; the target counts what pruning removes, not those."""
    model = family_model("qwen2")
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for block in prunable_layers(model):
            for _, module in block:
                module.weight[torch.rand(module.weight.shape, generator=generator) < 0.05] = 0
    size = None if structure == "2:4" else 0.9
    report = prune(model, calibration(), PruneConfig(structure=structure, target_size=size, shots=1), progress=False)
    assert_reaches_target(report.removed, shapes(model), report.config["target_size"], structure,
                          freed=report.shots[0].freed)
    if structure == "structured":
        assert report.zero_fraction > report.sparsity + 0.03  # scattered zeros remain beside the removed rows
    else:
        assert report.zero_fraction >= report.sparsity  # zeros cost nothing: they are the first weights chosen
