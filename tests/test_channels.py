"""Dead channel ends: found by architecture, and removing them leaves the model's output unchanged."""

from __future__ import annotations

import pytest
import torch

from surgeon import PruneConfig, prune
from surgeon.models import channels
from surgeon.models.adapter import prunable_layers
from surgeon.models.families import family_of
from tests._families import FAMILIES, VOCAB, family_model
from tests._helpers import tiny_model
from tests._tolerances import assert_reaches_target


def layers_of(model):
    return [pair for block in prunable_layers(model) for pair in block]


def zero(layers, rows, cols):
    """Zero the given rows (with their bias) and columns of every layer, as a pruning shot stores them."""
    with torch.no_grad():
        for (_, module), r, c in zip(layers, rows, cols):
            module.weight[r] = 0
            module.weight[:, c] = 0
            if module.bias is not None:
                module.bias[r] = 0


def test_couplings_of_llama_with_grouped_query_attention():
    model = tiny_model("llama")
    names = [name for name, _ in layers_of(model)]
    found = channels.couplings(model, names)
    described = {(tuple(names[p] for p in c.producers), names[c.consumer], c.groups, c.repeat, c.dim) for c in found}
    for block in range(2):
        prefix = f"model.layers.{block}."
        assert ((prefix + "mlp.gate_proj", prefix + "mlp.up_proj"), prefix + "mlp.down_proj", 40, 1, 1) in described
        assert ((prefix + "self_attn.v_proj",), prefix + "self_attn.o_proj", 2, 2, 6) in described
    assert len(found) == 4


def test_couplings_of_opt_and_of_an_unknown_family():
    model = tiny_model("opt")
    found = channels.couplings(model, [name for name, _ in layers_of(model)])
    assert sorted((c.groups, c.repeat, c.dim) for c in found) == [(4, 1, 6)] * 2 + [(40, 1, 1)] * 2
    model.config.model_type = "unknown"
    assert channels.couplings(model, [name for name, _ in layers_of(model)]) == []


def test_dead_ends_follow_the_kv_head_layout():
    coupling = channels.Coupling((0,), 1, groups=2, repeat=2, dim=3)  # v rows (g, d), o columns (g, h, d)
    rows = [torch.zeros(6, dtype=torch.bool), torch.zeros(5, dtype=torch.bool)]
    cols = [torch.zeros(4, dtype=torch.bool), torch.zeros(12, dtype=torch.bool)]
    rows[0][1] = True  # v row (0, 1): o columns (0, 0, 1) and (0, 1, 1) are dead
    cols[1][[8, 11]] = True  # both query heads of kv head 1 drop dim 2: v row (1, 2) is dead
    cols[1][6] = True  # only one query head of kv head 1 drops dim 0: v row (1, 0) lives
    dead_rows, dead_cols = coupling.dead(rows, cols)
    assert dead_rows.nonzero().squeeze(1).tolist() == [1, 5]
    assert dead_cols.nonzero().squeeze(1).tolist() == [1, 4, 6, 8, 11]


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_removing_dead_ends_changes_nothing(arch):
    model = tiny_model(arch)
    layers = layers_of(model)
    found = channels.couplings(model, [name for name, _ in layers])
    generator = torch.Generator().manual_seed(0)
    rows = [torch.rand(m.out_features, generator=generator) < 0.3 for _, m in layers]
    cols = [torch.rand(m.in_features, generator=generator) < 0.3 for _, m in layers]
    zero(layers, rows, cols)
    tokens = torch.randint(0, 96, (2, 16), generator=generator)
    before = model(tokens).logits
    dead_rows, dead_cols = channels.with_dead(found, rows, cols)
    assert sum(int(d.sum() - r.sum()) for d, r in zip(dead_rows + dead_cols, rows + cols)) > 0
    zero(layers, dead_rows, dead_cols)
    assert torch.equal(model(tokens).logits, before)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_couples_its_unfused_channels_and_their_dead_ends_change_nothing(family):
    model = family_model(family)
    layers = layers_of(model)
    found = channels.couplings(model, [name for name, _ in layers])
    expected = len(family_of(model.config).channels) * model.config.num_hidden_layers
    assert len(found) == expected and (expected > 0) == (family != "phi3")  # phi3 fuses both producers
    generator = torch.Generator().manual_seed(0)
    rows = [torch.rand(m.out_features, generator=generator) < 0.3 for _, m in layers]
    cols = [torch.rand(m.in_features, generator=generator) < 0.3 for _, m in layers]
    zero(layers, rows, cols)
    tokens = torch.randint(0, VOCAB, (2, 16), generator=generator)
    dead_rows, dead_cols = channels.with_dead(found, rows, cols)
    freed = sum(int(d.sum() - r.sum()) for d, r in zip(dead_rows + dead_cols, rows + cols))
    assert (freed > 0) == (family != "phi3")  # the check below must see dead weights to mean anything
    with torch.no_grad():
        before = model(tokens).logits
        zero(layers, dead_rows, dead_cols)
        assert torch.equal(model(tokens).logits, before)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_structured_prune_leaves_no_dead_weights(arch):
    """Every shot removes the ends its choices leave dead, counted in the (exact) target."""
    model = tiny_model(arch)
    layers = layers_of(model)
    calibration = torch.randint(0, 96, (3, 24), generator=torch.Generator().manual_seed(0))
    report = prune(model, calibration, PruneConfig(structure="structured", target_size=0.6, shots=2), progress=False)
    rows = [(m.weight == 0).all(1) for _, m in layers]
    cols = [(m.weight == 0).all(0) for _, m in layers]
    dead_rows, dead_cols = channels.with_dead(channels.couplings(model, [n for n, _ in layers]), rows, cols)
    assert all(torch.equal(d, r) for d, r in zip(dead_rows + dead_cols, rows + cols))
    assert_reaches_target(report.removed, [tuple(m.weight.shape) for _, m in layers], 0.6, "structured",
                          freed=sum(shot.freed for shot in report.shots))
