"""surgeon's llm-compressor modifiers inside `oneshot`, and `surgeon quantize` (runs in the pinned environment of
`make test-llmcompressor`)."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

llmcompressor = pytest.importorskip("llmcompressor", reason="the llm-compressor environment: make test-llmcompressor")

from datasets import Dataset  # noqa: E402
from llmcompressor import oneshot  # noqa: E402
from llmcompressor.modifiers.pruning.sparsegpt import SparseGPTModifier  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig  # noqa: E402

from surgeon import PruneConfig, prune, save_model  # noqa: E402
from surgeon.app import quantize  # noqa: E402
from surgeon.app.cli import main  # noqa: E402
from surgeon.app.settings import QuantizeConfig  # noqa: E402
from surgeon.errors import SurgeonError  # noqa: E402
from surgeon.integrations.llmcompressor import (  # noqa: E402
    SurgeonModifier,
    SurgeonSparseGPTModifier,
    calibration_ids,
)
from surgeon.models.adapter import prunable_layers  # noqa: E402

WINDOWS, SEQLEN = 4, 32
ONESHOT = dict(num_calibration_samples=WINDOWS, max_seq_length=SEQLEN, shuffle_calibration_samples=False)


@pytest.fixture
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(3, 1000, (WINDOWS, SEQLEN), generator=torch.Generator().manual_seed(0))


def dataset(ids: torch.Tensor) -> Dataset:
    return Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})


def weights(model) -> dict[str, torch.Tensor]:
    return {name: module.weight.detach().clone() for block in prunable_layers(model) for name, module in block}


def test_calibration_ids_stack_equal_samples_and_pack_padded_ones():
    equal = [{"input_ids": torch.arange(8).view(2, 4), "attention_mask": torch.ones(2, 4)}]
    assert torch.equal(calibration_ids(equal), torch.arange(8).view(2, 4))
    padded = [{"input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]]), "attention_mask": torch.tensor(
        [[1, 1, 1, 0], [1, 1, 1, 1]])}, {"input_ids": torch.tensor([8, 9, 10])}]
    assert torch.equal(calibration_ids(padded), torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]]))
    with pytest.raises(ValueError, match="no samples"):
        calibration_ids([])


@pytest.mark.parametrize("structure", ["unstructured", "2:4", "structured"])
def test_surgeon_modifier_equals_surgeon_prune(model, ids, structure):
    reference = copy.deepcopy(model)
    sparsity = None if structure == "2:4" else 0.5
    modifier = SurgeonModifier(sparsity=sparsity, structure=structure, shots=2, options={"damp_g": 0.2})
    oneshot(model=model, dataset=dataset(ids), recipe=[modifier], **ONESHOT)
    config = PruneConfig(structure=structure, target_size=None if sparsity is None else 0.5, shots=2, damp_g=0.2)
    report = prune(reference, ids, config, progress=False)
    assert modifier.report is not None and modifier.report.sparsity == pytest.approx(report.sparsity)
    ours, theirs = weights(model), weights(reference)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6, msg=name)
    assert 0.45 <= report.sparsity <= 0.55


def sparsity_of(model) -> float:
    layers = weights(model).values()
    return sum(int((w == 0).sum()) for w in layers) / sum(w.numel() for w in layers)


@pytest.mark.parametrize("name", ["SurgeonModifier", "SurgeonSparseGPTModifier"])
def test_yaml_recipes_name_the_registered_modifiers(model, ids, name):
    recipe = f"""
    pruning_stage:
      pruning_modifiers:
        {name}:
          sparsity: 0.5
          {"ignore: ['re:.*lm_head']" if name == "SurgeonSparseGPTModifier" else "shots: 2"}
    """
    oneshot(model=model, dataset=dataset(ids), recipe=recipe, **ONESHOT)
    assert sparsity_of(model) == pytest.approx(0.5, abs=0.01)


def block0_inputs(model, ids: torch.Tensor) -> torch.Tensor:
    """The inputs of block 0's q, k and v projections, which are the same in any sequential pipeline."""
    seen: list[torch.Tensor] = []
    projection = model.model.layers[0].self_attn.q_proj
    handle = projection.register_forward_hook(lambda module, args, out: seen.append(args[0].flatten(0, -2)))
    with torch.no_grad():
        model(ids)
    handle.remove()
    return torch.cat(seen).double()


@pytest.mark.parametrize("update", ["refine", "exact"])
@pytest.mark.parametrize("mask_structure", ["0:0", "2:4"])
def test_surgeon_sparsegpt_keeps_sparsegpts_mask_with_lower_error(model, ids, mask_structure, update):
    dense = weights(model)
    X = block0_inputs(model, ids)
    theirs = copy.deepcopy(model)
    settings = dict(sparsity=0.5, mask_structure=mask_structure, ignore=["re:.*lm_head"])
    oneshot(model=model, dataset=dataset(ids), recipe=[SurgeonSparseGPTModifier(**settings, update=update)],
            **ONESHOT)
    oneshot(model=theirs, dataset=dataset(ids), recipe=[SparseGPTModifier(**settings)], **ONESHOT)
    ours_w, theirs_w = weights(model), weights(theirs)
    for name in ours_w:
        if mask_structure == "2:4":
            assert int((ours_w[name].view(-1, 4) == 0).sum(1).min()) >= 2, name
        else:
            assert (ours_w[name] == 0).float().mean() == pytest.approx(0.5, abs=1 / ours_w[name].shape[1]), name
    for projection in ("q_proj", "k_proj", "v_proj"):
        name = f"model.layers.0.self_attn.{projection}"
        if mask_structure == "2:4":  # unstructured, llm-compressor removes one weight more per block (≤ threshold)
            assert torch.equal(ours_w[name] == 0, theirs_w[name] == 0), name
        error = [float((X @ (dense[name].double() - w[name].double()).T).square().sum()) for w in (ours_w, theirs_w)]
        assert error[0] < error[1], (name, error)  # refined or exact for the mask; ≤ 0.95× on LLM-like inputs
        # is tested on the drop-in class (tests/test_sparsegpt_dropin.py); these inputs are nearly isotropic


def test_surgeon_sparsegpt_names_a_module_whose_weights_hold_nan(model, ids):
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[1, 2] = float("nan")
    with pytest.raises(SurgeonError, match=r"^model\.layers\.0\.self_attn\.k_proj: NaN or infinity in the weights W;"):
        oneshot(model=model, dataset=dataset(ids), recipe=[SurgeonSparseGPTModifier(sparsity=0.5)], **ONESHOT)


@pytest.mark.parametrize("make, message", [
    (lambda: SurgeonModifier(sparsity=1.5), "sparsity"),
    (lambda: SurgeonModifier(sparsity=0.5, structure="3:2"), "N:M"),
    (lambda: SurgeonModifier(sparsity=0.5, options={"not_a_field": 1}), "not_a_field"),
    (lambda: SurgeonModifier(sparsity=0.5, options={"shots": 3}), "shots"),
    (lambda: SurgeonModifier(structure="2:4", sparsity=0.3), "keeps 0.5"),
    (lambda: SurgeonSparseGPTModifier(sparsity=0.5, preserve_sparsity_mask=True), "preserve_sparsity_mask"),
    (lambda: SurgeonSparseGPTModifier(sparsity=0.5, shots=0), "shots"),
    (lambda: SurgeonSparseGPTModifier(sparsity=0.5, shots=2), "need update='exact'"),
    (lambda: SurgeonSparseGPTModifier(sparsity=0.5, iterations=-1), "iterations"),
    (lambda: SurgeonSparseGPTModifier(sparsity=0.5, update="fast"), "update"),
])
def test_bad_arguments_fail_when_the_recipe_is_built(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def pruned_run(path: Path, tokenizer_dir: Path, structure: str) -> Path:
    """A tiny Llama 128 wide (W4A16's groups of 128 inputs fit) pruned with `structure` (unstructured and structured
    keep 60%), saved to `path` as a `surgeon prune` run."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(3, 1000, (WINDOWS, SEQLEN), generator=torch.Generator().manual_seed(0))
    report = prune(model, ids, PruneConfig(structure=structure, target_size=None if ":" in structure else 0.6,
                                           shots=1), progress=False)
    save_model(path, model, AutoTokenizer.from_pretrained(tokenizer_dir), report.to_dict())
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, smollm2_tokenizer_dir):
    """`runs(structure)`: the tiny pruned run of that structure, made once per module."""
    made: dict[str, Path] = {}

    def get(structure: str) -> Path:
        if structure not in made:
            made[structure] = pruned_run(tmp_path_factory.mktemp("run"), smollm2_tokenizer_dir, structure)
        return made[structure]

    return get


def source_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint's decoder linear layers, by module name."""
    tensors = load_file(path / "model.safetensors")
    return {key.removesuffix(".weight"): value for key, value in tensors.items()
            if key.startswith("model.layers.") and key.endswith("_proj.weight")}


@pytest.mark.parametrize("structure,scheme", [("2:4", "W8A8"), ("unstructured", "W8A8"), ("structured", "W8A8"),
                                              ("2:4", "FP8_DYNAMIC"), ("2:4", "W4A16")])
def test_quantize_keeps_every_pruned_weight_exactly_zero(runs, structure, scheme, tmp_path):
    run, out = runs(structure), tmp_path / "quantized"
    assert main(["--quiet", "quantize", str(run), "--output", str(out), "--scheme", scheme]) == 0
    before = source_weights(run)
    zeros = sum(int((w == 0).sum()) for w in before.values())
    report = json.loads((out / "report.json").read_text())
    assert report["sparsity"] == json.loads((run / "report.json").read_text())["sparsity"]  # the run's report kept
    assert report["quantize"] == {
        "scheme": scheme, "source": str(run), "ignore": ["lm_head"], "layers": 14, "zeros_kept": zeros,
        "format": {"W8A8": "int-quantized", "FP8_DYNAMIC": "float-quantized", "W4A16": "pack-quantized"}[scheme],
        "bytes_before": (run / "model.safetensors").stat().st_size,
        "bytes_after": (out / "model.safetensors").stat().st_size, "llmcompressor": llmcompressor.__version__}
    assert report["quantize"]["bytes_after"] < report["quantize"]["bytes_before"]
    assert json.loads((out / "config.json").read_text())["quantization_config"]["ignore"] == ["lm_head"]
    assert AutoTokenizer.from_pretrained(out)("a test").input_ids == AutoTokenizer.from_pretrained(run)(
        "a test").input_ids
    stored = load_file(out / "model.safetensors")
    if scheme == "W8A8":  # int8 per output channel: zero stays the integer 0, the rest within half a step
        for name, weight in before.items():
            q, scale = stored[f"{name}.weight"], stored[f"{name}.weight_scale"]
            assert q.dtype == torch.int8 and torch.equal(q[weight == 0], torch.zeros_like(q[weight == 0])), name
            assert float(((q.float() * scale - weight).abs() / scale).max()) <= 0.5 + 1e-4, name
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))  # transformers dequantizes the weights before the first forward pass
    for name, weight in before.items():
        dequantized = model.get_submodule(name).weight
        assert dequantized.dtype == torch.float32 and not dequantized[weight == 0].any(), name


def test_quantize_refuses_a_zero_that_came_back_and_writes_nothing(runs, tmp_path, monkeypatch):
    run, out = runs("2:4"), tmp_path / "quantized"
    original = quantize.quantize_model

    def filling(model, scheme: str) -> None:
        """The quantizer, then one pruned weight of block 1's down projection filled."""
        original(model, scheme)
        weight = model.model.layers[1].mlp.down_proj.weight
        with torch.no_grad():
            weight[tuple((weight == 0).nonzero()[0].tolist())] = weight.abs().max()

    monkeypatch.setattr(quantize, "quantize_model", filling)
    zeros = int((source_weights(run)["model.layers.1.mlp.down_proj"] == 0).sum())
    with pytest.raises(SurgeonError, match=rf"^quantize: model\.layers\.1\.mlp\.down_proj: 1 of its {zeros} zero "
                       "weights are not zero after quantization; nothing was written$"):
        quantize.run_quantize(QuantizeConfig(run=str(run), output=str(out)))
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy


def test_quantize_refuses_groups_that_do_not_divide_a_layer(tiny_model_dir, tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "quantized"
    shutil.copytree(tiny_model_dir, run)
    (run / "report.json").write_text("{}")
    assert main(["quantize", str(run), "--output", str(out), "--scheme", "W4A16"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (  # after the loading bar
        "surgeon: error: quantize: W4A16 quantizes groups of 128 inputs, but model.layers.0.self_attn.q_proj has 16 "
        "inputs; choose W8A8 or FP8_DYNAMIC")
    assert not out.exists()


def test_quantize_without_llmcompressor_says_how_to_install_it(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llmcompressor", None)  # import llmcompressor raises ImportError
    run, out = runs("2:4"), tmp_path / "quantized"
    capsys.readouterr()
    assert main(["quantize", str(run), "--output", str(out)]) == 2
    assert capsys.readouterr().err == ("surgeon: error: surgeon quantize needs llm-compressor, which is not "
                                       "installed: pip install 'llm-surgeon[llmcompressor]' (or make "
                                       "install-llmcompressor)\n")
    assert not out.exists()
