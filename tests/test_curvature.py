"""Kronecker factors from hooks against a direct computation (eq. 6), sharing, and no weight grads."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from surgeon.method.factors import by_layer
from surgeon.models.adapter import decoder_blocks, prunable_layers
from surgeon.pruning import curvature
from tests._families import VOCAB, family_model
from tests._helpers import per_token_inputs_and_gradients, tiny_model
from tests._tolerances import FLOAT32, FLOAT64, assert_within_reference_error


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_factors_match_direct_computation(arch):
    model = tiny_model(arch).double()
    named = [pair for block in prunable_layers(model) for pair in block]
    windows = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    raw = by_layer(curvature.estimate(model, named, windows, backend="torch"))
    assert all(p.grad is None for p in model.parameters())  # no weight gradients were computed
    direct = per_token_inputs_and_gradients(model, named, windows)
    scale = 1 / math.sqrt(windows.numel())
    for name, _ in named:
        a, g = direct[name]
        for factor, x in ((raw[name].A, a), (raw[name].G, g)):  # float32 sums of float64 activations
            plain = scale * x.float().T @ x.float()  # the same sum by one float32 GEMM
            assert_within_reference_error(factor.dense(), scale * x.T @ x, plain)


def test_layers_reading_the_same_input_share_a():
    model = tiny_model("llama")
    named = [pair for block in prunable_layers(model) for pair in block]
    raw = by_layer(curvature.estimate(model, named, torch.randint(0, 96, (1, 8))))
    prefix = "model.layers.0."
    q, k, v, o = (raw[prefix + f"self_attn.{p}_proj"].A for p in "qkvo")
    gate, up, down = (raw[prefix + f"mlp.{p}_proj"].A for p in ("gate", "up", "down"))
    assert q is k is v and gate is up
    assert o is not q and down is not gate and gate is not q
    assert all(p.requires_grad for p in model.parameters())  # flags restored


@pytest.mark.parametrize("family", ["llama", "opt", "gpt_neox", "gemma2", "phi3"])
def test_block_inputs_give_each_blocks_factors_running_each_block_twice(family):
    from surgeon.pruning.block_inputs import BlockInputs

    model = family_model(family)
    blocks = decoder_blocks(model)
    windows = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    everything = [pair for block in prunable_layers(model) for pair in block]
    full = by_layer(curvature.estimate(model, everything, windows, need_g=False, batch_size=2))
    calls = [0] * len(blocks)
    handles = [block.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
               for i, block in enumerate(blocks)]
    inputs = BlockInputs(model, blocks, windows, batch_size=2)
    calls = [0] * len(blocks)  # the model's forward to catch the first block's inputs stops before it
    for named in prunable_layers(model):
        blockwise = by_layer(curvature.estimate_inputs(named, inputs.forwards(), windows.numel()))
        for name, _ in named:
            torch.testing.assert_close(blockwise[name].A.dense(), full[name].A.dense(), **FLOAT32)
        inputs.advance()
    for handle in handles:
        handle.remove()
    assert calls == [2 * 2] * len(blocks)  # two batches, each block run once for A and once to advance


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_cost_numerators_match_the_factors(arch):
    """row_quadratic = diag(W A Wᵀ) with the bias column, col_quadratic = diag(Wᵀ G W) (eq. 7 numerators)."""
    model = tiny_model(arch).double()
    named = [pair for block in prunable_layers(model) for pair in block]
    for _, module in named[:3]:  # removed rows and columns are zero in W, as in a pruned model
        module.weight.data[1] = 0
        module.weight.data[:, 2] = 0
    windows = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    raw = by_layer(curvature.estimate(model, named, windows, backend="torch"))
    for name, module in named:
        W = module.weight.detach()
        if module.bias is not None:
            W = torch.cat([W, module.bias.detach().unsqueeze(1)], 1)
        A, G = raw[name].A.dense().double(), raw[name].G.dense().double()
        torch.testing.assert_close(raw[name].row_quadratic.double(), ((W @ A) * W).sum(1), **FLOAT32)  # A is float32
        C = module.in_features
        torch.testing.assert_close(raw[name].col_quadratic.double(), ((G @ W[:, :C]) * W[:, :C]).sum(0), **FLOAT32)
        assert raw[name].row_quadratic.abs().sum() > 0 and raw[name].col_quadratic.abs().sum() > 0


def test_no_cost_numerators_without_g():
    model = tiny_model("llama")
    named = [pair for block in prunable_layers(model) for pair in block]
    raw = by_layer(curvature.estimate(model, named, torch.randint(0, 96, (1, 8)), need_g=False))
    assert all(f.row_quadratic is None and f.col_quadratic is None and f.G is None for f in raw.values())


@pytest.mark.parametrize("group_bytes", [1, 5000, 1 << 40], ids=["each", "few-layers", "whole-pass"])
@pytest.mark.parametrize("need_g", [True, False])
def test_grouped_launches_give_the_same_factors(monkeypatch, group_bytes, need_g):
    """Queued tensors accumulated in groups (as on CUDA) equal accumulating each at once."""
    model = tiny_model("opt")
    named = [pair for block in prunable_layers(model) for pair in block]
    windows = torch.randint(0, 96, (3, 8), generator=torch.Generator().manual_seed(2))
    each = by_layer(curvature.estimate(model, named, windows, need_g=need_g, group_bytes=0))
    calls = []
    group = curvature.ops.kfac_accumulate_group
    monkeypatch.setattr(curvature.ops, "kfac_accumulate_group",
                        lambda outs, *a: calls.append(len(outs)) or group(outs, *a))
    grouped = by_layer(curvature.estimate(model, named, windows, need_g=need_g, group_bytes=group_bytes))
    if group_bytes == 1:
        assert set(calls) == {1}
    else:
        assert max(calls) > 1
    if group_bytes == 1 << 40:
        assert len(calls) == len(windows)  # one launch per window: the flush at the end of each pass
    for name in each:
        for label in ("A", "G"):
            a, b = getattr(each[name], label), getattr(grouped[name], label)
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a.tiles, b.tiles), f"{name}.{label}"


def test_input_changed_in_place_before_a_grouped_launch_raises():
    model = tiny_model("llama")
    named = [pair for block in prunable_layers(model) for pair in block]
    down = dict(named)["model.layers.0.mlp.down_proj"]

    def scale_input(mod, args, out) -> None:
        args[0].mul_(2.0)

    down.register_forward_hook(scale_input)
    with pytest.raises(curvature.SurgeonError, match="model.layers.0.mlp.down_proj.*in place"):
        by_layer(curvature.estimate(model, named, torch.randint(0, 96, (1, 8)), need_g=False, group_bytes=1 << 40))


def test_nan_curvature_is_refused_with_the_layer_named():
    model = tiny_model("llama")
    named = [pair for block in prunable_layers(model) for pair in block]
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    windows = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(curvature.SurgeonError, match=r"non-finite curvature \(\w+\) in layer model\.layers\.\d"):
        by_layer(curvature.estimate(model, named, windows))


def test_logit_gradient_is_that_of_the_summed_next_token_loss():
    """softmax − one-hot of the next tokens, as autograd gives for the summed cross-entropy; the last
    position, which has no next token, gets none."""
    batch = torch.randint(0, 8, (2, 6), generator=torch.Generator().manual_seed(1))
    logits = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    grad = curvature._logit_gradient(logits, batch)
    labels = batch[:, 1:]
    z = logits.clone().requires_grad_(True)
    F.cross_entropy(z[:, :-1].reshape(-1, 8), labels.reshape(-1), reduction="sum").backward()
    assert grad.dtype == logits.dtype
    torch.testing.assert_close(grad, z.grad, **FLOAT64)
    assert (grad[:, -1] == 0).all()


def test_sampled_labels_follow_the_models_distribution_and_their_outer_product_is_the_fisher():
    """Drawn labels are as likely as the model says (a one-hot prediction always gives its token), so the mean of
    (p − e_y)(p − e_y)ᵀ over draws approaches the Fisher of the logits, diag(p) − ppᵀ (eq. 6's expectation)."""
    probs = torch.softmax(torch.randn(1, 20_000, 6, dtype=torch.float64,
                                      generator=torch.Generator().manual_seed(0)) / 2, -1)
    probs[0, :, :] = probs[0, :1, :]  # one distribution, drawn 20,000 times
    labels = curvature.sampled_labels(probs, [0], seed=3)
    residual = probs[0] - F.one_hot(labels[0], 6).double()
    fisher = torch.diag(probs[0, 0]) - torch.outer(probs[0, 0], probs[0, 0])
    torch.testing.assert_close(residual.T @ residual / 20_000, fisher, atol=0.01, rtol=0)
    certain = F.one_hot(torch.tensor([[2, 5, 0]]), 6).double()
    assert curvature.sampled_labels(certain, [7], seed=0).tolist() == [[2, 5, 0]]


def test_sampled_labels_depend_on_the_window_and_seed_not_on_the_batch():
    model = tiny_model("llama").double()
    named = [pair for block in prunable_layers(model) for pair in block]
    windows = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(0))
    one, two = (by_layer(curvature.estimate(model, named, windows, backend="torch", batch_size=size, sampled_seed=5))
                for size in (1, 2))
    empirical = by_layer(curvature.estimate(model, named, windows, backend="torch"))
    other_seed = by_layer(curvature.estimate(model, named, windows, backend="torch", sampled_seed=6))
    for name, _ in named:
        torch.testing.assert_close(one[name].G.dense(), two[name].G.dense(), **FLOAT32)
        torch.testing.assert_close(one[name].A.dense(), empirical[name].A.dense(), **FLOAT32)  # A needs no label
        assert not torch.allclose(one[name].G.dense(), empirical[name].G.dense(), rtol=1e-3, atol=0)
        assert not torch.allclose(one[name].G.dense(), other_seed[name].G.dense(), rtol=1e-3, atol=0)


@pytest.mark.parametrize("family", ["llama", "opt", "qwen3", "gpt_neox", "gemma2"])
def test_activation_checkpointing_gives_the_same_factors_running_each_block_again(family):
    model = family_model(family)
    blocks = decoder_blocks(model)
    named = [pair for block in prunable_layers(model) for pair in block]
    windows = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    plain = by_layer(curvature.estimate(model, named, windows, progress=False))
    runs = {name: 0 for name, _ in named}
    handles = [module.register_forward_hook(lambda *_, name=name: runs.__setitem__(name, runs[name] + 1))
               for name, module in named]
    checkpointed = by_layer(curvature.estimate(model, named, windows, progress=False, checkpoint_blocks=blocks))
    for handle in handles:
        handle.remove()
    # two batches: every block ran again from its first layer (the recomputation stops once it has every
    # tensor the backward pass reads, so a block's last layers may not run again)
    assert all(runs[block[0][0]] == 2 * 2 for block in prunable_layers(model))
    assert all(count in (2, 2 * 2) for count in runs.values())
    assert not any("forward" in vars(block) for block in blocks)  # the blocks' own forward restored
    for name, _ in named:
        ours, theirs = checkpointed[name], plain[name]
        for a, b in ((ours.A.tiles, theirs.A.tiles), (ours.G.tiles, theirs.G.tiles),
                     (ours.row_quadratic, theirs.row_quadratic), (ours.col_quadratic, theirs.col_quadratic)):
            assert torch.equal(a, b), name
        assert [n for n, _ in named if checkpointed[n].A is ours.A] == [n for n, _ in named if plain[n].A is theirs.A]


def test_an_input_group_moves_its_one_a_once():
    """The pass returns q/k/v as one group, gate/up as another; moved (to host memory and back), each group's layers
    still hold its one A, and every factor is on the device it was moved to."""
    model = tiny_model("llama")
    named = prunable_layers(model)[0]
    groups = curvature.estimate(model, named, torch.randint(0, 96, (1, 8)), progress=False)
    prefix = "model.layers.0."
    assert [list(group.layers) for group in groups] == [
        [prefix + f"self_attn.{p}_proj" for p in "qkv"], [prefix + "self_attn.o_proj"],
        [prefix + f"mlp.{p}_proj" for p in ("gate", "up")], [prefix + "mlp.down_proj"]]
    moved = [group.to(torch.device("meta")) for group in groups]  # a device other than the host's, observable here
    for group, before in zip(moved, groups):
        assert group.A.tiles.device.type == "meta" and group.A.tiles.shape == before.A.tiles.shape
        assert all(entry.A is group.A and entry.G.tiles.device.type == "meta" for entry in group.layers.values())
