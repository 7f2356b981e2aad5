"""surgeon.integrations.sparsegpt.SparseGPT against the published SparseGPT algorithm
(`baselines.sparsegpt_reference`) and the sweep it runs (`baselines.sparsegpt`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from surgeon.errors import SurgeonError
from surgeon.integrations.sparsegpt import SparseGPT
from surgeon.method.baselines import sparsegpt, sparsegpt_reference
from tests._tolerances import assert_within_reference_error, removed_by_rule

R, C = 48, 256


def correlated_inputs(gen: torch.Generator, batches: int = 4, tokens: int = 96) -> list[torch.Tensor]:
    """Batches [1, tokens, C] of inputs with a decaying spectrum, an offset and mixed features, as LLM activations."""
    mixing = torch.randn(C, C, generator=gen) * torch.logspace(0, -2, C).unsqueeze(1)
    offset = torch.randn(C, generator=gen)
    return [(torch.randn(1, tokens, C, generator=gen) @ mixing + offset) for _ in range(batches)]


def calibrated(layer: nn.Module, inputs: list[torch.Tensor]) -> SparseGPT:
    gpt = SparseGPT(layer)
    for x in inputs:
        gpt.add_batch(x, layer(x))
    return gpt


def output_error(W: torch.Tensor, pruned: torch.Tensor, inputs: list[torch.Tensor]) -> float:
    X = torch.cat([x.reshape(-1, C) for x in inputs]).double()
    return float((X @ (W.double() - pruned.double()).T).square().sum())


@pytest.fixture
def layer(gen) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(C, R)


def test_h_is_sparsegpts_running_mean(layer, gen):
    inputs = [x[:, : 10 + 20 * i] for i, x in enumerate(correlated_inputs(gen))]
    gpt = calibrated(layer, inputs)
    X = torch.cat([x.reshape(-1, C) for x in inputs])
    exact, reference = (2 / len(inputs) * X.T @ X for X in (X.double(), X))
    assert_within_reference_error(gpt.H, exact, reference)


@pytest.mark.parametrize("nm", [None, (2, 4)], ids=["unstructured-0.5", "2:4"])
def test_output_error_is_below_sparsegpts(layer, nm, gen):
    inputs = correlated_inputs(gen)
    W = layer.weight.detach().clone()
    gpt = calibrated(layer, inputs)
    ours_nm = dict(prunen=nm[1] - nm[0], prunem=nm[1]) if nm else {}
    theirs, theirs_mask = sparsegpt_reference(W, gpt.H, 0.5, torch.zeros(R, C, dtype=torch.bool), nm)
    gpt.fasterprune(0.5, **ours_nm)
    pruned = layer.weight.detach()
    mask = pruned == 0
    if nm:
        assert (mask.reshape(R, C // 4, 4).sum(-1) == 2).all()
    else:
        for start in range(0, C, 128):
            assert int(mask[:, start : start + 128].sum()) == removed_by_rule([(R, 128)], 0.5)
    assert output_error(W, pruned, inputs) <= 0.95 * output_error(W, theirs, inputs)


def test_conv1d_is_pruned_in_its_own_orientation(layer, gen):
    inputs = correlated_inputs(gen)
    conv = Conv1D(R, C)
    conv.weight.data = layer.weight.detach().t().clone()
    conv.bias.data = layer.bias.detach().clone()
    linear, transposed = calibrated(layer, inputs), calibrated(conv, inputs)
    linear.fasterprune(0.5)
    transposed.fasterprune(0.5)
    assert torch.equal(conv.weight.t(), layer.weight)


def test_wanda_spellings_mean_the_same(gen):
    inputs = correlated_inputs(gen)
    torch.manual_seed(1)
    a, b = nn.Linear(C, R), nn.Linear(C, R)
    b.load_state_dict(a.state_dict())
    calibrated(a, inputs).fasterprune(0.5, prunen=2, prunem=4)
    calibrated(b, inputs).fasterprune(0.5, prune_n=2, prune_m=4)
    assert torch.equal(a.weight, b.weight)


def test_more_shots_keep_the_target(layer, gen):
    inputs = correlated_inputs(gen)
    gpt = calibrated(layer, inputs)
    gpt.fasterprune(0.5, update="exact", shots=3)
    assert int((layer.weight == 0).sum()) == removed_by_rule([(R, C)], 0.5, "sparsegpt")
    assert gpt.error is not None and gpt.error > 0


@pytest.mark.parametrize("nm", [None, (2, 4)], ids=["unstructured-0.5", "2:4"])
def test_refine_is_between_sparsegpt_and_the_exact_update(nm, gen):
    """The default update: SparseGPT's mask, an error below the sweep's and above the exact row solve's."""
    inputs = correlated_inputs(gen)
    ours_nm = dict(prunen=nm[1] - nm[0], prunem=nm[1]) if nm else {}
    errors = {}
    for update in ("refine", "exact"):
        torch.manual_seed(0)
        layer = nn.Linear(C, R)
        W = layer.weight.detach().clone()
        gpt = calibrated(layer, inputs)
        theirs, theirs_mask = sparsegpt(W, gpt.H, 0.5, torch.zeros(R, C, dtype=torch.bool), nm, dtype=torch.float32)
        gpt.fasterprune(0.5, update=update, **ours_nm)
        assert torch.equal(layer.weight == 0, theirs_mask)
        errors[update] = output_error(W, layer.weight.detach(), inputs)
    assert errors["exact"] <= errors["refine"] * (1 + 1e-5)
    assert errors["refine"] < 0.95 * output_error(W, theirs, inputs)


def test_several_sweeps_need_the_exact_update(layer, gen):
    gpt = calibrated(layer, correlated_inputs(gen))
    with pytest.raises(ValueError, match="need update='exact'"):
        gpt.fasterprune(0.5, shots=2)
    with pytest.raises(ValueError, match="use refine or exact"):
        gpt.fasterprune(0.5, update="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("args,kwargs,message", [
    ((1.0,), {}, r"sparsity must be in \[0, 1\)"),
    ((-0.1,), {}, r"sparsity must be in \[0, 1\)"),
    ((0,), dict(prunen=2, prunem=3), "multiple of m"),
    ((0,), dict(prunen=5, prunem=4), "0 < n ≤ m"),
    ((0,), dict(prunen=2, prunem=8, blocksize=12), "blocksize 12 must be a multiple of m=8"),
])
def test_bad_arguments_leave_the_layer_untouched(layer, gen, args, kwargs, message):
    gpt = calibrated(layer, correlated_inputs(gen))
    before = layer.weight.detach().clone()
    with pytest.raises(ValueError, match=message):
        gpt.fasterprune(*args, **kwargs)
    assert torch.equal(layer.weight, before)


def test_misuse_is_refused(layer, gen):
    with pytest.raises(TypeError, match="nn.Linear and transformers' Conv1D"):
        SparseGPT(nn.Conv2d(3, 3, 3))
    gpt = SparseGPT(layer)
    with pytest.raises(RuntimeError, match="before add_batch"):
        gpt.fasterprune(0.5)
    with pytest.raises(ValueError, match="inputs have 8 features; the layer takes 256"):
        gpt.add_batch(torch.randn(2, 8))
    gpt.free()
    with pytest.raises(RuntimeError, match="after free"):
        gpt.add_batch(torch.randn(2, C))


@pytest.mark.parametrize("update", ["refine", "exact"])
@pytest.mark.parametrize("where", ["weights W", "input factor A"])
def test_a_nan_weight_or_input_is_refused_not_pruned(layer, gen, update, where):
    inputs = correlated_inputs(gen)
    if where == "weights W":
        with torch.no_grad():
            layer.weight[3, 7] = float("nan")
    else:
        inputs[1][0, 5, 9] = float("inf")
    gpt = calibrated(layer, inputs)
    before = layer.weight.detach().clone()
    with pytest.raises(SurgeonError, match=f"NaN or infinity in the {where}"):
        gpt.fasterprune(0.5, update=update)
    torch.testing.assert_close(layer.weight, before, rtol=0, atol=0, equal_nan=True)
