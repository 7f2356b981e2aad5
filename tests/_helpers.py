"""Helpers the test modules share: tiny models, random SPD factors, closed forms and how to run the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests._tolerances import assert_within_reference_error


def random_spd(n: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """A random symmetric positive definite matrix with a spread of eigenvalues."""
    x = torch.randn(n, 2 * n + 3, generator=generator, dtype=dtype)
    return x @ x.T / x.shape[1] + 0.1 * torch.eye(n, dtype=dtype)


def problem(R: int, C: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random float64 layer W [R, C] with SPD Kronecker factors G [R, R] and A [C, C]."""
    return (torch.randn(R, C, generator=generator, dtype=torch.float64), random_spd(R, generator),
            random_spd(C, generator))


def pruned_pair(arch: str, settings: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny teacher with sharper next-token distributions than a random model's nearly uniform ones, and its copy
    pruned with `settings` on 4 random windows."""
    import copy

    from surgeon import PruneConfig, prune

    teacher = tiny_model(arch)
    with torch.no_grad():
        for param in teacher.parameters():
            if param.dim() == 2:
                param.mul_(4)
    student = copy.deepcopy(teacher)
    windows = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(0))
    prune(student, windows, PruneConfig(**settings), progress=False)
    return teacher, student


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


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m surgeon ARGS` in a subprocess, its output captured (`env` added to this environment)."""
    return subprocess.run([sys.executable, "-m", "surgeon", *args], capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env})


def one_error_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single `surgeon: error:` line that is all a failing command prints."""
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("surgeon: error:"), result.stderr
    return lines[0]


SHAPES = [pytest.param(5, 7, id="R5-C7"), pytest.param(8, 3, id="R8-C3"), pytest.param(1, 6, id="R1-C6")]


def closed_form(W, G, A, pruned: torch.Tensor):
    """Eq. (4)-(5) with F = G ⊗ A (`closed_form_of`)."""
    return closed_form_of(W, torch.kron(torch.linalg.inv(G), torch.linalg.inv(A)), pruned)


def closed_form_of(W, F_inv, pruned: torch.Tensor):
    """Eq. (4)-(5): Δθ = −F⁻¹Eᵀ(EF⁻¹Eᵀ)⁻¹Eθ and L = ½ θᵀEᵀ(EF⁻¹Eᵀ)⁻¹Eθ for a dense F⁻¹."""
    theta = W.reshape(-1)
    k = pruned.reshape(-1).nonzero().squeeze(1)
    inner = torch.linalg.inv(F_inv[k][:, k])
    delta = -F_inv[:, k] @ inner @ theta[k]
    cost = 0.5 * theta[k] @ inner @ theta[k]
    return W + delta.reshape(W.shape), cost


def per_token_inputs_and_gradients(model, named, windows):
    """Each layer's inputs (bias column included) and output gradients per token, by plain hooks."""
    inputs, grads, handles = {}, {}, []
    for name, module in named:
        def fwd(mod, inp, out, name=name):
            a = inp[0].detach().reshape(-1, inp[0].shape[-1])
            if mod.bias is not None:
                a = torch.cat([a, torch.ones(a.shape[0], 1, dtype=a.dtype)], 1)
            inputs.setdefault(name, []).append(a)
            out.register_hook(lambda g: grads.setdefault(name, []).append(g.reshape(-1, g.shape[-1])))
        handles.append(module.register_forward_hook(fwd))
    for window in windows.split(1):
        logits = model(window).logits[:, :-1]
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1), reduction="sum").backward()
    for h in handles:
        h.remove()
    return {name: (torch.cat(inputs[name]), torch.cat(grads[name])) for name, _ in named}


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The model's logits for `ids`, without gradients."""
    with torch.no_grad():
        return model(ids).logits


def assert_same_logits(masked: torch.nn.Module, compact: torch.nn.Module) -> None:
    """float32 compact logits within twice the masked model's own float32 error against float64 (the policy)."""
    ids = torch.randint(3, masked.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(5))
    exact = logits(masked.double(), ids)
    masked.float()
    assert_within_reference_error(logits(compact, ids), exact, logits(masked, ids))
