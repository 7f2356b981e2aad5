"""Shared fixtures: tiny random-init models (no download) and random SPD factors."""

from __future__ import annotations

import os

# Triton kernels run under the interpreter on the CPU unless the caller chose otherwise
# (`TRITON_INTERPRET=0 pytest` on a GPU machine tests the compiled kernels on CUDA tensors).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def random_spd(n: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """A random symmetric positive definite matrix with a spread of eigenvalues."""
    x = torch.randn(n, 2 * n + 3, generator=generator, dtype=dtype)
    return x @ x.T / x.shape[1] + 0.1 * torch.eye(n, dtype=dtype)


def problem(R: int, C: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random float64 layer W [R, C] with SPD Kronecker factors G [R, R] and A [C, C]."""
    return (torch.randn(R, C, generator=generator, dtype=torch.float64), random_spd(R, generator),
            random_spd(C, generator))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def tiny_model(arch: str, seed: int = 0):
    """A tiny randomly initialised causal LM of the given architecture ("llama" or "opt")."""
    from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(vocab_size=96, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return LlamaForCausalLM(config).eval()
    if arch == "opt":
        config = OPTConfig(vocab_size=96, hidden_size=24, ffn_dim=40, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=24)
        return OPTForCausalLM(config).eval()
    raise ValueError(arch)


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory):
    """The SmolLM2 tokenizer (from the embedded GGUF file) saved as a directory, once per session."""
    from surgeon.model import load_tokenizer

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
