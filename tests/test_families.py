"""Every decoder family: a tiny random model of each prunes to its target, stays finite and loads back; a
Mixture-of-Experts family, whose fused expert weights no layer can prune yet, is refused unless they are left out."""

from __future__ import annotations

import pytest
import torch

from surgeon import PruneConfig, prune, save_model
from surgeon.errors import SurgeonError
from surgeon.model import block_weights, prunable_layers, unprunable_weights
from tests._families import FAMILIES, MOE_FAMILIES, VOCAB, family_model
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
    assert unprunable_weights(model) == []  # every weight matrix of a dense family is a layer's
    assert report.block_sparsity == report.removed / sum(p.numel() for _, p in block_weights(model))
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


EXPERTS = "model.layers.*.mlp.experts.*"


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
@pytest.mark.parametrize("structure", ["structured", "unstructured", "2:4"])
def test_moe_family_is_refused_naming_its_fused_experts(family, structure):
    """Fused 3-D expert weights are no nn.Linear: the run names them and changes nothing, rather than skip them."""
    model = family_model(family)
    before = {name: param.clone() for name, param in model.named_parameters()}
    size = None if structure == "2:4" else 0.7
    with pytest.raises(SurgeonError) as error:
        prune(model, calibration(), PruneConfig(structure=structure, target_size=size, shots=1), progress=False)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{model.config.model_type}: ")
    assert "model.layers.*.mlp.experts.gate_up_proj" in message and "model.layers.*.mlp.experts.down_proj" in message
    assert "--leave-out 'router," in message
    assert all(torch.equal(param, before[name]) for name, param in model.named_parameters())


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_moe_family_prunes_the_rest_when_its_experts_are_left_out(family):
    """Left out by name, the experts and routers keep their weights; the target counts what is pruned, and
    block_sparsity says how little of the blocks that is."""
    model = family_model(family)
    kept = {name: param.clone() for name, param in model.named_parameters() if ".experts." in name
            or name.endswith(("mlp.gate.weight", "mlp.router.weight", "shared_expert_gate.weight"))}
    report = prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.5, shots=1,
                                                     leave_out=f"router,{EXPERTS}"), progress=False)
    layers = prunable_layers(model, ("router", EXPERTS))
    assert_reaches_target(report.removed, [tuple(m.weight.shape) for block in layers for _, m in block], 0.5,
                          "unstructured")
    assert set(report.layers) == {name for block in layers for name, _ in block}
    assert not any(".experts." in name or "gate.weight" in name for name in report.layers)
    assert report.block_sparsity == report.removed / sum(p.numel() for _, p in block_weights(model))
    assert report.block_sparsity < report.sparsity
    assert all(torch.equal(param, kept[name]) for name, param in model.named_parameters() if name in kept)


def test_a_weight_matrix_outside_any_linear_layer_is_refused_by_name():
    """Any 2-D parameter of a block that no layer owns is named, whatever the family."""
    model = family_model("llama")
    model.model.layers[1].mlp.register_parameter("scale_table", torch.nn.Parameter(torch.ones(4, 8)))
    assert unprunable_weights(model) == [("model.layers.1.mlp.scale_table", (4, 8))]
    with pytest.raises(SurgeonError, match=r"llama: 1 weight matrices .* model\.layers\.\*\.mlp\.scale_table \[4, 8\]"):
        prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.5, shots=1), progress=False)
    report = prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.5, shots=1,
                                                     leave_out="*.scale_table"), progress=False)
    assert report.sparsity == pytest.approx(0.5, abs=0.01)
    with pytest.raises(SurgeonError, match="leaves no layer of the decoder blocks to prune"):
        prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.5, leave_out="*"),
              progress=False)
