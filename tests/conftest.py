"""Shared fixtures: a seeded generator, the SmolLM2 tokenizer and a tiny Llama saved as folders.

The helpers the test modules share are in tests/_helpers.py.
"""

from __future__ import annotations

import importlib.util
import os

# Triton kernels run under the interpreter on the CPU unless the caller chose otherwise
# (`TRITON_INTERPRET=0 pytest` on a GPU machine tests the compiled kernels on CUDA tensors).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Assemble and convert the built-in models once, before pytest-xdist's workers start: two workers assembling
    the same chunked file at once would each read the other's half-written copy, and two converting the same model
    would each spend the time."""
    if hasattr(config, "workerinput"):
        return
    from surgeon.models.builtin import EMBEDDED_MODELS

    for name, model in EMBEDDED_MODELS.items():  # one not installed is named by the tests that need it
        if importlib.util.find_spec(model.module) is not None:
            model.folder(name)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files that hold slow tests first: pytest-xdist hands out whole files in this order, so the suite
    ends on short files and no worker waits long for the other."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory):
    """The SmolLM2 tokenizer (from the embedded GGUF file) saved as a directory, once per session."""
    from surgeon.models.adapter import load_tokenizer

    path = tmp_path_factory.mktemp("smollm2-tokenizer")
    load_tokenizer("smollm2-135m").save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer_dir):
    """A tiny random-init Llama saved with save_pretrained, vocabulary of the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(smollm2_tokenizer_dir).save_pretrained(path)
    return path
