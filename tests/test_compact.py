"""Compact export: removable neurons and heads leave, the logits stay, the checkpoint loads with from_pretrained."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from surgeon.app.cli import main
from surgeon.errors import SurgeonError
from surgeon.export.compact import compact_model, live_units, load_compact
from surgeon.models import compact_modeling
from surgeon.models.adapter import decoder_blocks, load_model
from tests._families import COMMON, VOCAB, family_model
from tests._helpers import assert_same_logits, logits, one_error_line, run_cli

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "opt"]


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def remove_units(model: torch.nn.Module, seed: int = 0) -> None:
    """Zero what makes units removable, differently per block: down columns, up rows, gate rows (MLP neurons),
    o columns (one query head per block) and v rows with their bias (a whole KV head in block 1)."""
    generator = torch.Generator().manual_seed(seed)
    d = head_dim(model.config)
    with torch.no_grad():
        for index, block in enumerate(decoder_blocks(model)):
            if model.config.model_type == "opt":
                block.fc2.weight[:, torch.rand(block.fc2.in_features, generator=generator) < 0.3 + 0.2 * index] = 0
                dead = torch.rand(block.fc1.out_features, generator=generator) < 0.2
                block.fc1.weight[dead], block.fc1.bias[dead] = 0, 0
                continue
            mlp, attn = block.mlp, block.self_attn
            mlp.down_proj.weight[:, torch.rand(mlp.down_proj.in_features, generator=generator) < 0.2 + 0.2 * index] = 0
            mlp.up_proj.weight[torch.rand(mlp.up_proj.out_features, generator=generator) < 0.1] = 0
            mlp.gate_proj.weight[torch.rand(mlp.gate_proj.out_features, generator=generator) < 0.1] = 0
            attn.o_proj.weight[:, index * d:(index + 1) * d] = 0
            if index == 1:
                attn.v_proj.weight[:d] = 0
                if attn.v_proj.bias is not None:
                    attn.v_proj.bias[:d] = 0


@pytest.mark.parametrize("family", FAMILIES)
def test_compact_model_drops_removable_units_and_keeps_the_logits(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model = family_model(family)
    remove_units(model)
    units = live_units(model)
    compact = compact_model(model)
    config = compact.config
    assert config.model_type == model.config.model_type
    width = "ffn_dim" if family == "opt" else "intermediate_size"
    widest = max(int(u.neurons.sum()) for u in units)
    assert getattr(config, width) == widest < getattr(model.config, width)
    assert sum(p.numel() for p in compact.parameters()) < sum(p.numel() for p in model.parameters())
    assert_same_logits(model, compact)
    compact.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()  # no remote code: the standard architecture
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    assert torch.equal(logits(loaded, ids), logits(compact, ids))


def test_llama_head_count_is_padded_to_a_divisor_of_the_hidden_size():
    """8 heads in 4 KV groups of 2 (hidden 112, head_dim 14): 3 live groups of 1 head would be 3 heads, which
    LlamaConfig refuses for hidden 112; the export keeps 4 (a padding group of zero output) and the same logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=112, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=8, num_key_value_heads=4, head_dim=14)).eval()
    with torch.no_grad():
        for block in decoder_blocks(model):
            o = block.self_attn.o_proj.weight.view(112, 4, 2, 14)
            o[:, :, 1] = 0  # the second query head of every group
            o[:, 3] = 0  # all of group 3
    compact = compact_model(model)
    config = compact.config
    assert (config.num_key_value_heads, config.num_attention_heads, config.head_dim) == (4, 4, 14)
    assert_same_logits(model, compact)


def test_attention_heads_leave_where_the_layout_allows():
    """With one live query head per KV group in every block, the llama export halves its query heads."""
    model = family_model("mistral")
    d = head_dim(model.config)
    with torch.no_grad():
        for block in decoder_blocks(model):
            block.self_attn.o_proj.weight.view(-1, 2, 2, d)[:, :, 0] = 0
    compact = compact_model(model)
    assert compact.config.num_attention_heads == model.config.num_attention_heads // 2
    assert compact.model.layers[0].self_attn.q_proj.out_features == 2 * d
    assert_same_logits(model, compact)


@pytest.mark.parametrize("ffn_mult", [False, True])
def test_decilm_compact_model_writes_block_configs_that_vllm_reads(ffn_mult, tmp_path):
    """Llama in DeciLM's schema: each layer's exact MLP width as `intermediate_size` (with `ffn_mult`: padded with
    zero neurons to a multiple of 256 and written as ffn_mult), each layer its KV heads (block 1 lost a KV group),
    the query heads global, an attention or MLP without live units a no-op with no weights; the same logits (also
    when generating with the KV cache, whose length layer 0, a no-op, keeps), and it loads with trust_remote_code
    and with load_compact."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**COMMON, "num_hidden_layers": 3})).eval()
    remove_units(model)
    with torch.no_grad():  # block 0: attention a no-op; the last block: attention and MLP no-ops
        model.model.layers[0].self_attn.o_proj.weight.zero_()
        last = model.model.layers[-1]
        last.self_attn.o_proj.weight.zero_()
        last.mlp.down_proj.weight.zero_()
    units = live_units(model)
    compact = compact_model(model, "decilm", ffn_mult)
    blocks = compact.config.block_configs
    assert compact.config.model_type == "nemotron-nas" and compact.config.architectures == ["DeciLMForCausalLM"]
    heads = model.config.num_attention_heads
    d = head_dim(model.config)
    assert compact.config.num_attention_heads == heads and compact.config.head_dim == d
    for block, unit, layer in zip(blocks[:-1], units, compact.model.layers):
        assert not block.ffn.no_op
        width, live = layer.mlp.up_proj.out_features, int(unit.neurons.sum())
        if ffn_mult:
            assert width % 256 == 0 and width - 256 < live <= width and not hasattr(block.ffn, "intermediate_size")
            assert compact_modeling.ffn_width(block.ffn.ffn_mult, model.config.hidden_size) == width
        else:  # vLLM reads ffn_mult whenever the key is there
            assert width == live == block.ffn.intermediate_size and not hasattr(block.ffn, "ffn_mult")
        if block is not blocks[0]:
            kv = heads // block.attention.n_heads_in_group
            assert layer.self_attn.k_proj.out_features == kv * d >= int(unit.heads.any(1).sum()) * d
    assert heads // blocks[1].attention.n_heads_in_group < model.config.num_key_value_heads  # v of a group zero
    assert blocks[0].attention.no_op and blocks[-1].attention.no_op and blocks[-1].ffn.no_op
    names = [name for name, _ in compact.named_parameters()]
    assert not [name for name in names if name.startswith(f"model.layers.{len(blocks) - 1}.")]
    assert not [name for name in names if name.startswith("model.layers.0.") and "mlp" not in name
                and "post_attention" not in name]
    assert_same_logits(model, compact)
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert torch.equal(compact.generate(ids, **kwargs), model.generate(ids, **kwargs))
        cache = compact(ids[:, :4], use_cache=True).past_key_values  # positions from the cache's length
        torch.testing.assert_close(compact(ids[:, 4:], past_key_values=cache).logits, model(ids).logits[:, 4:])
    compact.save_pretrained(tmp_path)
    shutil.copyfile(compact_modeling.__file__, tmp_path / "compact_modeling.py")
    written = json.loads((tmp_path / "config.json").read_text())["block_configs"]
    key, kind = ("ffn_mult", float) if ffn_mult else ("intermediate_size", int)
    assert written[-1] == {"attention": {"no_op": True, "replace_with_linear": False, "n_heads_in_group": None},
                           "ffn": {"no_op": True, "replace_with_linear": False, key: None}}
    assert all(isinstance(block["ffn"][key], kind) for block in written[:-1])
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    remote = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert torch.equal(logits(remote, ids), logits(compact, ids))
    assert torch.equal(logits(load_compact(tmp_path), ids), logits(compact, ids))


def test_decilm_keeps_biases_and_pads_with_dead_kv_groups():
    """A part with no live unit but an output bias stays (its bias is output); a KV group whose v is zero pads a
    layer that needs more groups than it has live (8 heads: 3 live groups of 4 need 4)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**COMMON, "hidden_size": 64, "num_attention_heads": 8, "head_dim": 8,
                                            "num_key_value_heads": 4, "attention_bias": True,
                                            "mlp_bias": True})).eval()
    first, second = model.model.layers
    with torch.no_grad():
        for linear in (first.self_attn.o_proj, second.mlp.down_proj):
            linear.bias.normal_()  # initialised to zero
        first.self_attn.o_proj.weight.zero_()  # no live head, o's bias left
        second.self_attn.v_proj.weight[24:] = 0  # KV group 3's values
        second.self_attn.v_proj.bias[24:] = 0
        second.mlp.down_proj.weight.zero_()  # no live neuron, down's bias left
    compact = compact_model(model, "decilm")
    blocks = compact.config.block_configs
    assert not blocks[0].attention.no_op and blocks[0].attention.n_heads_in_group == 8
    assert blocks[1].attention.n_heads_in_group == 2 and not blocks[1].ffn.no_op
    assert compact.model.layers[1].mlp.up_proj.out_features == 1  # one zero neuron, so that the bias is output
    assert_same_logits(model, compact)


def test_ffn_mult_keeps_an_mlp_of_zero_neurons_beside_a_live_attention():
    """llama.cpp's DeciLM graph drops the attention output of a layer whose MLP is a no-op (measured,
    bench/quality/llamacpp_roundtrip.py): with ffn_mult such a layer keeps 256 zero neurons instead, its output
    unchanged; the exact-width export makes it a no-op."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**COMMON)).eval()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.zero_()
    exact, padded = compact_model(model, "decilm"), compact_model(model, "decilm", ffn_mult=True)
    assert exact.config.block_configs[1].ffn.no_op and not exact.config.block_configs[1].attention.no_op
    assert not padded.config.block_configs[1].ffn.no_op
    assert padded.model.layers[1].mlp.up_proj.out_features == 256
    assert_same_logits(model, padded)


def test_decilm_layers_replaced_by_linear_ones_are_refused():
    block = {"attention": {"no_op": False, "replace_with_linear": True, "n_heads_in_group": None},
             "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": 3.0}}
    config = compact_modeling.DeciLMConfig(**{**COMMON, "block_configs": [block] * COMMON["num_hidden_layers"]})
    with pytest.raises(ValueError, match=r"DeciLM layers \[0, 1\] replace a part with a linear layer"):
        compact_modeling.DeciLMForCausalLM(config)


def test_decilm_format_is_refused_for_other_families():
    with pytest.raises(SurgeonError, match="format decilm writes llama models; the model is 'qwen2'"):
        compact_model(family_model("qwen2"), "decilm")


def test_unsupported_family_is_refused_by_name():
    with pytest.raises(SurgeonError, match="compact export supports .*'gemma'"):
        compact_model(family_model("gemma"))


@pytest.mark.parametrize("format", ["standard", "decilm", "decilm --ffn-mult"])
def test_export_command_writes_a_compact_checkpoint(format, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "coupled", "--target-size",
                 "0.6", "--shots", "1", "--nsamples", "2", "--seqlen", "64", "--calibration", "wikitext2-valid",
                 "--eval-windows", "1", "--output", str(run)]) == 0
    out = tmp_path / "compact"
    assert main(["--quiet", "export", str(run), "--compact", "--format", *format.split(), "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    compact = (AutoModelForCausalLM.from_pretrained(out) if format == "standard" else
               AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True))
    assert report["export"]["parameters"] == sum(p.numel() for p in compact.parameters())
    assert report["export"]["ffn_mult"] == format.endswith("--ffn-mult")
    if format != "decilm --ffn-mult":  # ffn_mult pads this tiny model's MLP (64 wide) to 256
        assert report["export"]["parameters"] < report["export"]["parameters_before"]
    assert report["sparsity"] == json.loads((run / "report.json").read_text())["sparsity"]
    assert_same_logits(AutoModelForCausalLM.from_pretrained(run), compact)
    loaded, _ = load_model(str(out))  # what `surgeon eval --model OUT` loads, without remote code
    assert type(loaded).__name__ == type(compact).__name__


@pytest.mark.parametrize("case,message", [
    ("not-a-run", "is not a `surgeon prune` output folder"),
    ("no-compact", "nothing to export: pass --compact"),
    ("same-folder", "--output must be another folder"),
    ("ffn-mult-standard", "--ffn-mult is a setting of --format decilm"),
    ("output-not-empty", "is not empty"),
])
def test_export_bad_input_is_one_line_and_writes_nothing(case, message, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text("{}")
    out = tmp_path / "out"
    args = [str(run), "--compact", "--output", str(out)]
    if case == "not-a-run":
        args[0] = str(tiny_model_dir)
    elif case == "no-compact":
        args.remove("--compact")
    elif case == "same-folder":
        args[-1] = str(run)
    elif case == "ffn-mult-standard":
        args.append("--ffn-mult")
    else:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    line = one_error_line(run_cli("export", *args))
    assert message in line
    if case == "output-not-empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()
    assert not list(tmp_path.glob(".out.*"))
