"""Every decoder family: a tiny random model of each prunes to its target, stays finite and loads back; a
Mixture-of-Experts family prunes its experts as layers, or is refused naming a fused layout it cannot split."""

from __future__ import annotations

import pytest
import torch

from surgeon import PruneConfig, prune, save_model
from surgeon.errors import SurgeonError
from surgeon.export.compact import compact_model, same_logits
from surgeon.method.factors import by_layer
from surgeon.models.adapter import block_weights, decoder_blocks, prunable_layers, unprunable_weights
from surgeon.models.experts import experts_as_layers
from surgeon.pruning import curvature
from tests._families import COMMON, FAMILIES, HIDDEN, INTERMEDIATE, MOE_FAMILIES, VOCAB, family_model
from tests._tolerances import FLOAT32, FLOAT64, assert_reaches_target


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


SPLIT = sorted(family for family in MOE_FAMILIES if family != "gpt_oss")  # the fused layout experts.py splits


def expert_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [param for name, param in model.named_parameters() if name.endswith(("experts.gate_up_proj",
                                                                                "experts.down_proj"))]


@pytest.mark.parametrize("family", SPLIT)
def test_experts_as_layers_compute_the_same_and_fuse_back(family):
    """While split, each expert is three nn.Linear layers with the same logits; after, the fused weights are back."""
    model = family_model(family)
    ids = calibration()
    before = model(ids).logits
    state = {name: value.clone() for name, value in model.state_dict().items()}
    with experts_as_layers(decoder_blocks(model)):
        torch.testing.assert_close(model(ids).logits, before, **FLOAT32)
        layers = [name for block in prunable_layers(model) for name, _ in block if ".experts." in name]
        assert layers[:3] == [f"model.layers.0.mlp.experts.0.{part}" for part in ("gate_proj", "up_proj", "down_proj")]
        assert len(layers) == 3 * 4 * 2 and unprunable_weights(model) == []
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(value, state[name]) for name, value in model.state_dict().items())


@pytest.mark.parametrize("family", SPLIT)
@pytest.mark.parametrize("structure", ["structured", "unstructured", "2:4"])
def test_moe_family_prunes_its_experts_and_loads_back(family, structure, tmp_path):
    """Each expert's projections are layers with their own factors under the one threshold; the fused
    checkpoint holds the zeros and loads in transformers."""
    from transformers import AutoModelForCausalLM

    model = family_model(family)
    size = None if structure == "2:4" else 0.7
    report = prune(model, calibration(), PruneConfig(structure=structure, target_size=size, shots=1), progress=False)
    shapes = {name: shape for name, shape in [(n, tuple(p.shape)) for n, p in model.named_parameters()]}
    experts = expert_weights(model)
    expert_layers = [name for name in report.layers if ".experts." in name]
    assert len(expert_layers) == 3 * 4 * 2 and any(report.layers[name] > 0 for name in expert_layers)
    assert sum(int((w == 0).sum()) for w in experts) > 0.2 * sum(w.numel() for w in experts)
    if structure == "2:4":  # along each expert's rows, every 4 consecutive weights keep at most 2
        for weight in experts:
            assert int((weight.reshape(-1, 4) == 0).sum(1).min()) >= 2
    assert_reaches_target(report.removed, [tuple(shapes.get(f"{name}.weight", (0, 0))) for name in report.layers
                                           if ".experts." not in name] + expert_shapes(model),
                          report.config["target_size"], structure, freed=report.shots[0].freed)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    save_model(tmp_path / family, model)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / family)
    for (name, param), (_, again) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(param, again), name


def expert_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """[out, in] of every expert's gate, up and down projection."""
    shapes = []
    for weight in expert_weights(model):
        experts, rows, columns = weight.shape
        split = 2 if weight.shape[1] != model.config.hidden_size else 1  # gate_up: gate rows, then up rows
        shapes += [(rows // split, columns)] * (experts * split)
    return shapes


def test_a_fused_layout_it_cannot_split_is_refused_naming_its_weights():
    """gpt_oss fuses its experts [E, in, out] with biases: named, and nothing changes, rather than skipped."""
    model = family_model("gpt_oss")
    before = {name: param.clone() for name, param in model.named_parameters()}
    with pytest.raises(SurgeonError) as error:
        prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.5, shots=1), progress=False)
    message = str(error.value)
    assert "\n" not in message and message.startswith("gpt_oss: ")
    assert "model.layers.*.mlp.experts.gate_up_proj" in message and "--leave-out 'router," in message
    assert all(torch.equal(param, before[name]) for name, param in model.named_parameters())


def test_no_calibration_token_reaching_an_expert_is_named():
    from transformers import AutoModelForCausalLM, MixtralConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(MixtralConfig(**{**COMMON, "num_local_experts": 16,
                                                               "num_experts_per_tok": 1})).eval()
    unreached = r"no calibration token reached \d+ layers \(model\.layers\.\d\.mlp\.experts"
    with pytest.raises(SurgeonError, match=unreached):
        prune(model, calibration()[:1, :6], PruneConfig(structure="unstructured", target_size=0.5), progress=False)
    assert all(param.numel() > 0 for param in model.parameters())  # the fused weights are back


def test_leaving_out_a_fused_weight_leaves_out_its_experts_layers():
    model = family_model("mixtral")
    down = [param.clone() for name, param in model.named_parameters() if name.endswith("experts.down_proj")]
    report = prune(model, calibration(), PruneConfig(structure="unstructured", target_size=0.5, shots=1,
                                                     leave_out="router,model.layers.*.mlp.experts.down_proj"),
                   progress=False)
    assert not any(name.endswith("down_proj") and ".experts." in name for name in report.layers)
    assert any(name.endswith("experts.0.gate_proj") for name in report.layers)
    assert all(torch.equal(param, down[i]) for i, param in
               enumerate(p for n, p in model.named_parameters() if n.endswith("experts.down_proj")))


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


COUPLED_MOE = ["mixtral", "qwen2_moe", "qwen3_moe"]  # attention heads of the gated layout, experts fused


@pytest.mark.parametrize("family", COUPLED_MOE)
def test_expert_neurons_are_coupled_units_and_export_compactly(family):
    """Each expert's gate and up rows and down column leave together under the one threshold with heads and dense
    neurons; `uniform` keeps as many in every expert, and the standard export cuts them out with the same logits."""
    model = family_model(family)
    dense = sum(p.numel() for p in model.parameters())
    report = prune(model, calibration(), PruneConfig(structure="coupled", target_size=0.7, shots=1, layout="uniform"),
                   progress=False)
    gate_ups = [w for w in expert_weights(model) if w.shape[1] != HIDDEN]
    downs = [w for w in expert_weights(model) if w.shape[1] == HIDDEN]
    round_of_neurons = 3 * HIDDEN * len(downs) * downs[0].shape[0]  # a neuron of every expert, as `uniform` takes them
    assert_reaches_target(report.removed, [tuple(shapes_of(model)[name]) for name in report.layers
                                           if ".experts." not in name] + expert_shapes(model),
                          0.7, "coupled", freed=report.shots[0].freed, largest=round_of_neurons)
    live = torch.stack([(~(down == 0).all(1)).sum(1) for down in downs])  # [blocks, experts]
    assert bool((live == live[0, 0]).all()) and 0 < int(live[0, 0]) < downs[0].shape[2]
    for gate_up, down in zip(gate_ups, downs):  # a removed neuron is gone from gate, up and down together
        inner = down.shape[2]
        gone = (down == 0).all(1)
        assert torch.equal(gone, (gate_up[:, :inner] == 0).all(2))
        assert torch.equal(gone, (gate_up[:, inner:] == 0).all(2))
    compact = compact_model(model)
    same_logits(model, compact)
    width = compact.config.intermediate_size if family == "mixtral" else compact.config.moe_intermediate_size
    assert width == -(-int(live[0, 0]) // 8) * 8 and sum(p.numel() for p in compact.parameters()) < dense


@pytest.mark.parametrize("family,message", [
    ("olmoe", "olmoe normalises q and k over all heads at once, so its heads cannot leave alone; leave its attention "
              "out"),
    ("deepseek_v3", "structure coupled supports .*'deepseek_v3'"),
])
def test_coupled_refuses_moe_attention_it_cannot_couple(family, message):
    with pytest.raises(SurgeonError, match=message):
        prune(family_model(family), calibration(), PruneConfig(structure="coupled", shots=1), progress=False)


def test_olmoe_expert_neurons_are_coupled_units_with_its_attention_left_out():
    """olmoe's q/k norm spans all heads, so its heads stay; its expert neurons leave as units and export compactly."""
    model = family_model("olmoe")
    attention = [p.detach().clone() for n, p in model.named_parameters() if ".self_attn." in n]
    config = PruneConfig(structure="coupled", target_size=0.7, shots=1, layout="uniform",
                         leave_out="router,model.layers.*.self_attn.*")
    report = prune(model, calibration(), config, progress=False)
    assert all(torch.equal(a, p) for a, p in zip(attention, (p for n, p in model.named_parameters()
                                                              if ".self_attn." in n)))
    downs = [w for w in expert_weights(model) if w.shape[1] == HIDDEN]
    assert_reaches_target(report.removed, expert_shapes(model), 0.7, "coupled", freed=report.shots[0].freed,
                          largest=3 * HIDDEN * len(downs) * downs[0].shape[0])  # a neuron of every expert
    live = torch.stack([(~(down == 0).all(1)).sum(1) for down in downs])  # [blocks, experts]
    assert bool((live == live[0, 0]).all()) and 0 < int(live[0, 0]) < downs[0].shape[2]
    compact = compact_model(model)
    same_logits(model, compact)
    assert compact.config.intermediate_size == -(-int(live[0, 0]) // 8) * 8


def shapes_of(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name.removesuffix(".weight"): tuple(p.shape) for name, p in model.named_parameters()}


def dense_as_moe(dense: torch.nn.Module, experts: int) -> torch.nn.Module:
    """A Mixtral model that computes `dense` (a Llama model) exactly: `experts` experts partition its MLP neurons,
    every token goes to all of them with router weight 1/experts (the router is zero), and each expert's down
    projection is scaled by `experts`."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = dense.config
    moe = MixtralForCausalLM(MixtralConfig(**{**COMMON, "intermediate_size": INTERMEDIATE // experts},
                                           num_local_experts=experts, num_experts_per_tok=experts,
                                           rms_norm_eps=config.rms_norm_eps, rope_parameters=config.rope_parameters,
                                           tie_word_embeddings=config.tie_word_embeddings)).eval()
    state = dense.state_dict()
    with torch.no_grad():
        for name, param in moe.named_parameters():
            if name in state:
                param.copy_(state[name])
            elif name.endswith("mlp.gate.weight"):
                param.zero_()
        for block, source in zip(moe.model.layers, dense.model.layers):
            parts = [slice(e * INTERMEDIATE // experts, (e + 1) * INTERMEDIATE // experts) for e in range(experts)]
            mlp = source.mlp
            block.mlp.experts.gate_up_proj.copy_(
                torch.stack([torch.cat([mlp.gate_proj.weight[p], mlp.up_proj.weight[p]]) for p in parts]))
            block.mlp.experts.down_proj.copy_(torch.stack([experts * mlp.down_proj.weight[:, p] for p in parts]))
    return moe


def test_a_dense_model_rewritten_as_experts_prunes_as_the_dense_model():
    """Experts partitioning a dense MLP compute it exactly. With one expert its factors are the dense layers' own,
    so pruning gives the dense model's result; with several, each expert's factors are the diagonal blocks of the
    dense ones (its neurons alone), so the results differ, by the cross-expert terms only (docs/DESIGN.md)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    dense = LlamaForCausalLM(LlamaConfig(**COMMON)).eval()
    ids = calibration()
    with torch.no_grad():
        for experts in (1, 2, 4):
            assert torch.allclose(dense_as_moe(dense, experts)(ids).logits, dense(ids).logits, atol=1e-5)
    for structure, size in (("unstructured", 0.5), ("coupled", 0.7)):
        pruned = LlamaForCausalLM(dense.config).eval()
        pruned.load_state_dict(dense.state_dict())
        moe = dense_as_moe(pruned, 1)
        config = PruneConfig(structure=structure, target_size=size, shots=1)
        prune(pruned, ids, config, progress=False)
        prune(moe, ids, config, progress=False)
        with torch.no_grad():
            expected, got = pruned(ids).logits, moe(ids).logits
        assert torch.allclose(got, expected, atol=1e-4 * float(expected.abs().max())), structure


def test_experts_partitioning_a_dense_mlp_get_the_diagonal_blocks_of_its_factors():
    """What the experts' own curvature is, exactly: with 2 experts splitting a dense MLP, each expert's gate and up
    read every token (A the dense one), their G is the dense G over the expert's neurons, its down projection's A
    the dense A over them, and its G the dense one over E² (the router weight 1/E before the scaled output)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    dense = LlamaForCausalLM(LlamaConfig(**COMMON)).double().eval()
    moe = dense_as_moe(dense, 2).double()
    ids = calibration()
    with experts_as_layers(decoder_blocks(moe)):
        layers = [pair for block in prunable_layers(moe) for pair in block]
        got = by_layer(curvature.estimate(moe, layers, ids, progress=False))
    layers = [pair for block in prunable_layers(dense) for pair in block]
    want = by_layer(curvature.estimate(dense, layers, ids, progress=False))
    half = INTERMEDIATE // 2
    for block in range(COMMON["num_hidden_layers"]):
        for e in range(2):
            p = slice(e * half, (e + 1) * half)
            expert, mlp = f"model.layers.{block}.mlp.experts.{e}.", f"model.layers.{block}.mlp."
            for part in ("gate_proj", "up_proj"):
                torch.testing.assert_close(got[expert + part].A.dense(), want[mlp + part].A.dense(), **FLOAT64)
                torch.testing.assert_close(got[expert + part].G.dense(), want[mlp + part].G.dense()[p, p], **FLOAT64)
            torch.testing.assert_close(got[expert + "down_proj"].A.dense(), want[mlp + "down_proj"].A.dense()[p, p],
                                       **FLOAT64)
            torch.testing.assert_close(got[expert + "down_proj"].G.dense(), want[mlp + "down_proj"].G.dense() / 4,
                                       **FLOAT64)


def test_moe_export_refuses_what_its_config_cannot_hold():
    """A model mixing dense and routed blocks, and any per-layer format, are refused in one line each."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    torch.manual_seed(0)
    mixed = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**{**COMMON, **MOE_FAMILIES["qwen3_moe"][1]},
                                                            mlp_only_layers=[0])).eval()
    prune(mixed, calibration(), PruneConfig(structure="coupled", target_size=0.7, shots=1), progress=False)
    with pytest.raises(SurgeonError, match="mixes dense MLP and Mixture-of-Experts blocks"):
        compact_model(mixed)
    with pytest.raises(SurgeonError, match="export in the standard format, not 'decilm'"):
        compact_model(family_model("mixtral"), "decilm")


@pytest.mark.parametrize("structure", ["structured", "coupled"])
def test_memory_options_prune_moe_blocks_as_the_plain_pass(structure):
    """Activation checkpointing, offload and block groups hold the experts' factors as a dense layer's: the same
    pruned weights, bit for bit."""
    results = []
    for settings in ({}, dict(activation_checkpointing=True, offload=True, block_groups=2)):
        model = family_model("qwen2_moe")
        prune(model, calibration(), PruneConfig(structure=structure, target_size=0.7, shots=2, **settings),
              progress=False)
        results.append({name: param.detach().clone() for name, param in model.named_parameters()})
    assert all(torch.equal(results[0][name], results[1][name]) for name in results[0])
    assert any(bool((results[0][name] == 0).any()) for name in results[0] if ".mlp.experts." in name)
