"""Every decoder family: a tiny random model of each prunes to its target, stays finite and loads back."""

from __future__ import annotations

import pytest
import torch

from surgeon import PruneConfig, prune, save_model
from surgeon.model import prunable_layers
from tests._families import FAMILIES, VOCAB, family_model


def calibration() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))


def largest_structure(model: torch.nn.Module) -> int:
    """Weights in the largest single row or column of any prunable layer."""
    return max(max(m.weight.shape) for block in prunable_layers(model) for _, m in block)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("structure", ["structured", "unstructured", "2:4"])
def test_family_prunes_to_target_and_loads_back(family, structure, tmp_path):
    from transformers import AutoModelForCausalLM

    model = family_model(family)
    assert model.config.model_type.removesuffix("_text") == family
    size = None if structure == "2:4" else 0.7
    report = prune(model, calibration(), PruneConfig(structure=structure, target_size=size, shots=1), progress=False)
    total = sum(m.weight.numel() for block in prunable_layers(model) for _, m in block)
    removed = round((1 - report.config["target_size"]) * total)
    zeros = sum(int((m.weight == 0).sum()) for block in prunable_layers(model) for _, m in block)
    if structure == "structured":
        assert removed <= report.removed <= removed + largest_structure(model) + report.shots[0].freed
    else:
        assert report.removed == removed
    assert report.sparsity == pytest.approx(report.removed / total)
    assert zeros == report.removed  # random weights hold no zeros of their own
    assert all(torch.isfinite(p).all() for p in model.parameters())

    save_model(tmp_path / family, model)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / family)
    for (name, param), (_, again) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(param, again), name
