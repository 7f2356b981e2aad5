"""Coupled structures: set costs against the closed form, whole units removed, targets met, compact export exact."""

from __future__ import annotations

import pytest
import torch

from surgeon import PruneConfig, prune
from surgeon.errors import SurgeonError
from surgeon.export.compact import compact_model
from surgeon.method import costs
from surgeon.method.inverses import KroneckerInverse
from surgeon.models.adapter import decoder_blocks, prunable_layers
from surgeon.models.units import coupled_units, decode_macs
from tests._families import VOCAB, family_model
from tests._helpers import assert_same_logits, problem
from tests._tolerances import FLOAT64, assert_reaches_target


def closed_form_set_cost(W: torch.Tensor, G: torch.Tensor, A: torch.Tensor, pruned: torch.Tensor) -> torch.Tensor:
    """½ w_Sᵀ ([F⁻¹]_SS)⁻¹ w_S with F⁻¹ = kron(G⁻¹, A⁻¹) formed explicitly (eq. 7 for a set S)."""
    F_inv = torch.kron(torch.linalg.inv(G), torch.linalg.inv(A))
    k = pruned.reshape(-1).nonzero().squeeze(1)
    w = W.reshape(-1)[k]
    return 0.5 * w @ torch.linalg.solve(F_inv[k][:, k], w)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_set_costs_equal_the_closed_form_for_rows_and_columns(size, gen):
    W, G, A = problem(6, 12, gen)
    f = KroneckerInverse.of(G, A, roots=True)
    rows = costs.set_costs(W, f.G, A, size)
    for index, cost in enumerate(rows):
        pruned = torch.zeros(6, 12, dtype=torch.bool)
        pruned[index * size:(index + 1) * size] = True
        torch.testing.assert_close(cost, closed_form_set_cost(W, G, A, pruned), **FLOAT64)
    cols = costs.set_costs(W.T, f.A, G, size)
    for index, cost in enumerate(cols):
        pruned = torch.zeros(6, 12, dtype=torch.bool)
        pruned[:, index * size:(index + 1) * size] = True
        torch.testing.assert_close(cost, closed_form_set_cost(W, G, A, pruned), **FLOAT64)
    if size == 1:  # a single row or column is eq. 7's own cost
        from surgeon.method import solver

        torch.testing.assert_close(rows, solver.row_costs(W, G, A), **FLOAT64)
        torch.testing.assert_close(cols, solver.col_costs(W, G, A), **FLOAT64)


def calibration() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(0))


def shapes(model) -> list[tuple[int, int]]:
    return [tuple(m.weight.shape) for block in prunable_layers(model) for _, m in block]


def largest_unit(model) -> int:
    """Weights of the largest group the threshold takes at once: a query head (its q rows and o columns; OPT: q, k,
    v rows and out columns), under grouped-query attention a round of one head per KV head."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    round_ = kv if config.num_attention_heads > kv else 1
    return (4 if config.model_type == "opt" else 2) * head_dim * config.hidden_size * round_


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "opt"])
@pytest.mark.parametrize("method", ["surgeon", "kobd", "magnitude"])
def test_coupled_prune_removes_whole_units_to_the_target(family, method):
    model = family_model(family)
    report = prune(model, calibration(), PruneConfig(structure="coupled", target_size=0.6, shots=2, method=method),
                   progress=False)
    assert_reaches_target(report.removed, shapes(model), 0.6, "coupled", freed=sum(s.freed for s in report.shots),
                          largest=largest_unit(model))
    config = model.config
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    removed_neurons = 0
    for block in decoder_blocks(model):
        if family == "opt":
            producers, consumer = [block.fc1], block.fc2
            q, o = block.self_attn.q_proj, block.self_attn.out_proj
        else:
            producers, consumer = [block.mlp.gate_proj, block.mlp.up_proj], block.mlp.down_proj
            q, o = block.self_attn.q_proj, block.self_attn.o_proj
        gone = (consumer.weight == 0).all(0)
        for producer in producers:  # a neuron leaves whole: its producer rows go with its consumer column
            assert torch.equal((producer.weight == 0).all(1), gone)
        removed_neurons += int(gone.sum())
        heads_q = (q.weight == 0).all(1).reshape(-1, d).all(1)
        heads_o = (o.weight == 0).all(0).reshape(-1, d).all(1)
        assert torch.equal(heads_q, heads_o)
        assert torch.equal((q.weight == 0).all(1), heads_q.repeat_interleave(d))  # whole heads only
    assert removed_neurons > 0
    compact = compact_model(model)
    assert sum(p.numel() for p in compact.parameters()) < sum(p.numel() for p in model.parameters())
    assert_same_logits(model, compact)


def test_a_kv_head_without_query_heads_is_freed():
    """Every query head of KV head 0 removed: its k and v rows are read by nobody and leave as freed weights."""
    from surgeon.models.units import masks_of

    model = family_model("llama")
    names = [name for block in prunable_layers(model) for name, _ in block]
    kinds = coupled_units(model, names)
    head_kind = kinds[1]
    chosen = [torch.zeros(kind.count, dtype=torch.bool) for kind in kinds]
    per_kv = head_kind.kv[1]
    chosen[1][:per_kv] = True  # the query heads of KV head 0 in block 0
    layers = [m for block in prunable_layers(model) for _, m in block]
    rows = [torch.zeros(m.out_features, dtype=torch.bool) for m in layers]
    cols = [torch.zeros(m.in_features, dtype=torch.bool) for m in layers]
    (k_layer, v_layer), _, d = head_kind.kv
    kept_rows, _ = masks_of(kinds, chosen, rows, cols, free_kv=False)
    freed_rows, _ = masks_of(kinds, chosen, rows, cols, free_kv=True)
    assert not kept_rows[k_layer].any() and not kept_rows[v_layer].any()
    expected = torch.zeros_like(rows[k_layer])
    expected[:d] = True
    assert torch.equal(freed_rows[k_layer], expected) and torch.equal(freed_rows[v_layer], expected)


def test_coupled_structure_refuses_other_families_and_per_layer_methods():
    with pytest.raises(SurgeonError, match="structure coupled supports .*'gemma'"):
        prune(family_model("gemma"), calibration(), PruneConfig(structure="coupled", shots=1), progress=False)
    with pytest.raises(ValueError, match="not coupled"):
        PruneConfig(structure="coupled", method="wanda")


@pytest.mark.parametrize("uniform,multiple", [(True, 1), (False, 16), (True, 16)])
def test_uniform_and_width_multiple_allocations_hold_in_every_block(uniform, multiple):
    model = family_model("llama")  # intermediate 64, head_dim 8: 16 neurons or 2 heads per chunk
    config = PruneConfig(structure="coupled", target_size=0.6, shots=2, layout="uniform" if uniform else "per-block",
                         width_multiple=multiple)
    report = prune(model, calibration(), config, progress=False)
    d = model.config.head_dim
    neurons = [int((~(block.mlp.down_proj.weight == 0).all(0)).sum()) for block in decoder_blocks(model)]
    heads = [int((~(block.self_attn.o_proj.weight == 0).all(0)).sum()) // d for block in decoder_blocks(model)]
    if uniform:
        assert len(set(neurons)) == 1 and len(set(heads)) == 1, (neurons, heads)
    assert all(n % multiple == 0 for n in neurons), neurons
    assert all(h % max(1, multiple // d) == 0 for h in heads), heads
    blocks = 1 + uniform * (model.config.num_hidden_layers - 1)
    group = blocks * max(multiple * 3 * model.config.hidden_size, max(1, multiple // d) * largest_unit(model))
    assert_reaches_target(report.removed, shapes(model), 0.6, "coupled", freed=sum(s.freed for s in report.shots),
                          largest=group)


def test_allocation_options_need_the_coupled_structure():
    with pytest.raises(ValueError, match="use structure coupled"):
        PruneConfig(structure="structured", layout="uniform")
    with pytest.raises(ValueError, match="layout='rows': choose one of per-block, uniform, decilm"):
        PruneConfig(structure="coupled", layout="rows")
    with pytest.raises(ValueError, match="use structure coupled"):
        PruneConfig(structure="unstructured", speed_context=2048)
    with pytest.raises(ValueError, match="width_multiple=0"):
        PruneConfig(structure="coupled", width_multiple=0)
    with pytest.raises(ValueError, match="speed_context=0"):
        PruneConfig(structure="coupled", speed_context=0)


def test_a_unit_saves_its_weights_and_a_head_its_attention_over_the_context():
    model = family_model("llama")
    names = [name for block in prunable_layers(model) for name, _ in block]
    shapes = [(m.out_features, m.in_features) for block in prunable_layers(model) for _, m in block]
    neuron, head = coupled_units(model, names)[:2]
    hidden, d = model.config.hidden_size, model.config.head_dim
    assert decode_macs(neuron, shapes, 100) == 3 * hidden  # gate and up rows, down column
    assert decode_macs(head, shapes, 100) == 2 * d * hidden + 2 * 100 * d  # q rows, o columns; scores, values


def test_coupled_refuses_a_layer_no_unit_holds():
    """Leaving out the down projections leaves gate and up in no neuron: refused by name, not left unpruned."""
    config = PruneConfig(structure="coupled", shots=1, leave_out="router,model.layers.*.mlp.down_proj.weight")
    with pytest.raises(SurgeonError, match=r"no neuron or head unit holds model\.layers\.0\.mlp\.gate_proj"):
        prune(family_model("llama"), calibration(), config, progress=False)


def test_a_routed_expert_neuron_saves_its_weights_on_the_tokens_routed_to_it():
    from surgeon.models.experts import experts_as_layers

    model = family_model("mixtral")  # 4 experts, 2 per token
    with experts_as_layers(decoder_blocks(model)):
        names = [name for block in prunable_layers(model) for name, _ in block]
        shapes = [(m.out_features, m.in_features) for block in prunable_layers(model) for _, m in block]
        kinds = coupled_units(model, names)
    experts = [kind for kind in kinds if kind.name == "expert neuron"]
    assert len(experts) == 4 * model.config.num_hidden_layers
    assert decode_macs(experts[0], shapes, 100) == 3 * model.config.hidden_size * 2 / 4


def test_a_speed_context_ranks_heads_by_what_they_save_per_token():
    """At a long context a head saves far more per weight than a neuron: the same target removes more heads,
    in rounds over the KV heads, so that every KV head keeps as many query heads."""
    def pruned(speed_context: int | None) -> torch.nn.Module:
        model = family_model("llama")
        config = PruneConfig(structure="coupled", target_size=0.6, shots=2, speed_context=speed_context,
                             damp_a=0.01)  # the costs the expected choices below were read off
        report = prune(model, calibration(), config, progress=False)
        assert_reaches_target(report.removed, shapes(model), 0.6, "coupled", freed=sum(s.freed for s in report.shots),
                              largest=largest_unit(model))
        return model

    def live_heads(model: torch.nn.Module) -> list[torch.Tensor]:
        """Per block, the live query heads of each KV head."""
        config = model.config
        return [(block.self_attn.o_proj.weight != 0).any(0).reshape(config.num_attention_heads, -1).any(1)
                .reshape(config.num_key_value_heads, -1).sum(1) for block in decoder_blocks(model)]

    model = pruned(256)  # head: 2·8·32 weights + 2·256·8 over the context; neuron: 3·32
    live = live_heads(model)
    assert [n.tolist() for n in live] == [[1, 1], [2, 2]]  # a round left block 0; nothing did without the context
    assert [n.tolist() for n in live_heads(pruned(None))] == [[2, 2], [2, 2]]


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_units_are_priced_and_updated_by_their_consumer_columns(family):
    """A unit costs its consumer columns; its producer rows are dead, freed without an update, so the kept
    producer rows keep their weights exactly while the consumer's kept columns are corrected."""
    model = family_model(family)
    before = {name: m.weight.detach().clone() for block in prunable_layers(model) for name, m in block}
    report = prune(model, calibration(), PruneConfig(structure="coupled", target_size=0.7, shots=1), progress=False)
    assert report.shots[0].freed > 0  # the producer rows of every removed unit
    assert_reaches_target(report.removed, shapes(model), 0.7, "coupled", freed=report.shots[0].freed,
                          largest=largest_unit(model))
    producers = ("fc1",) if family == "opt" else ("mlp.gate_proj", "mlp.up_proj")
    consumer = "fc2" if family == "opt" else "mlp.down_proj"
    for block in prunable_layers(model):
        down_name, down = next((name, m) for name, m in block if name.endswith(consumer))
        kept = ~(down.weight == 0).all(0)
        for name, module in block:
            if name.endswith(producers):
                assert torch.equal(module.weight[kept], before[name][kept]), name
        assert not torch.equal(down.weight[:, kept], before[down_name][:, kept])


def test_column_sets_cost_their_kept_columns_jointly(gen):
    """A set of columns partly removed (a KV group after query-head rounds) costs the joint removal of the
    columns it keeps; a set removed whole costs −inf; the OBD price sums its kept columns' costs."""
    from surgeon.pruning.structured import _column_set_costs

    W, G, A = problem(6, 12, gen)
    real_c = torch.tensor([0, 1, 8, 9])  # sets of 4: set 0 keeps 2, set 1 is gone, set 2 keeps 2
    sub, A_sub = W[:, real_c], A[real_c][:, real_c]
    root = KroneckerInverse.of(G, A_sub, roots=True).A
    cols = torch.full((12,), float("-inf"), dtype=W.dtype)
    cols[real_c] = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=W.dtype)

    def joint(m: int) -> torch.Tensor:
        return costs.set_costs(sub.T, root, G, m)

    got = _column_set_costs(cols, real_c, 4, joint)
    for index, kept in ((0, [0, 1]), (2, [2, 3])):
        pruned = torch.zeros(6, 4, dtype=torch.bool)
        pruned[:, kept] = True
        torch.testing.assert_close(got[index], closed_form_set_cost(sub, G, A_sub, pruned), **FLOAT64)
    assert torch.isneginf(got[1])
    obd = _column_set_costs(cols, real_c, 4, None)
    assert obd[0] == 3.0 and torch.isneginf(obd[1]) and obd[2] == 7.0


def test_a_round_costs_only_the_live_kv_groups():
    """A KV group removed whole (its heads cost −inf) takes no part in the rounds of the others: the round
    of each live group's cheapest head costs their sum, not −inf."""
    from surgeon.models.units import allocation

    model = family_model("llama")  # 2 KV heads of 2 query heads each
    names = [name for block in prunable_layers(model) for name, _ in block]
    head = coupled_units(model, names)[1]
    inf = float("-inf")
    group_costs, chosen_units = allocation([head], [torch.tensor([inf, inf, 5.0, 2.0])], False, 1)
    assert group_costs[0].tolist() == [2.0, 5.0]
    assert chosen_units([torch.tensor([True, False])])[0].tolist() == [True, False, False, True]
    group_costs, _ = allocation([head], [torch.tensor([inf, inf, inf, inf])], False, 1)
    assert group_costs[0].tolist() == [inf, inf]  # every group gone: the rounds stay removed


def test_a_kv_group_unit_owns_its_kv_rows_and_its_query_heads():
    from surgeon.models.units import masks_of

    model = family_model("llama")
    names = [name for block in prunable_layers(model) for name, _ in block]
    kinds = coupled_units(model, names)
    assert [kind.name for kind in kinds] == ["neuron", "head", "group"] * model.config.num_hidden_layers
    assert [kind.name for kind in coupled_units(model, names, width_multiple=16)] == ["neuron", "head"] * 2
    group = kinds[2]
    chosen = [torch.zeros(kind.count, dtype=torch.bool) for kind in kinds]
    chosen[2][1] = True  # KV group 1 of block 0: query heads 2 and 3
    layers = [m for block in prunable_layers(model) for _, m in block]
    rows, cols = masks_of(kinds, chosen, [torch.zeros(m.out_features, dtype=torch.bool) for m in layers],
                          [torch.zeros(m.in_features, dtype=torch.bool) for m in layers], free_kv=True)
    d = model.config.head_dim
    q, k, v, o = (member.layer for member in group.members)
    assert rows[q].nonzero().squeeze(1).tolist() == list(range(2 * d, 4 * d))
    assert rows[k].nonzero().squeeze(1).tolist() == list(range(d, 2 * d)) == rows[v].nonzero().squeeze(1).tolist()
    assert cols[o].nonzero().squeeze(1).tolist() == list(range(2 * d, 4 * d))
    assert decode_macs(group, [(m.out_features, m.in_features) for m in layers], 100) == \
        2 * (2 * d) * model.config.hidden_size + 2 * d * model.config.hidden_size + 2 * 100 * 2 * d


def test_a_long_speed_context_removes_kv_groups_whole_and_the_export_keeps_the_logits():
    """At a long context some KV groups leave whole (k and v rows with their query heads) while the others keep
    equally many query heads; the DeciLM export gives each layer as few KV heads as hold its live groups and
    computes the pruned model's logits."""
    import transformers

    from tests._families import COMMON

    torch.manual_seed(0)  # 4 KV groups of 2 query heads: a group can leave while others stay
    settings = {**COMMON, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8}
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**settings)).eval()
    config = PruneConfig(structure="coupled", target_size=0.8, shots=2, speed_context=4096, damp_a=0.01)
    report = prune(model, calibration(), config, progress=False)
    hidden, d = model.config.hidden_size, model.config.head_dim
    assert_reaches_target(report.removed, shapes(model), 0.8, "coupled", freed=sum(s.freed for s in report.shots),
                          largest=largest_unit(model) + 2 * 2 * d * hidden)  # a round and a group at once
    live_groups = []
    for block in decoder_blocks(model):
        attention = block.self_attn
        kv_live = ~(attention.k_proj.weight == 0).all(1).reshape(4, d).all(1)
        assert torch.equal(kv_live, ~(attention.v_proj.weight == 0).all(1).reshape(4, d).all(1))
        heads_live = ~(attention.o_proj.weight == 0).all(0).reshape(4, 2, d).all(2)
        assert torch.equal(heads_live.any(1), kv_live)  # a group's rows go with its last query head
        assert len(set(heads_live.sum(1)[kv_live].tolist())) == 1  # every live group keeps as many heads
        live_groups.append(int(kv_live.sum()))
    assert 0 < min(live_groups) < 4  # a group left whole, others stayed
    compact = compact_model(model, "decilm")
    kept = [8 // block.attention.n_heads_in_group for block in compact.config.block_configs]
    assert [b.self_attn.k_proj.out_features for b in decoder_blocks(compact)] == [n * d for n in kept]
    assert [min(g for g in (1, 2, 4) if g >= n) for n in live_groups] == kept  # 8 query heads: g divides 8
    assert_same_logits(model, compact)


@pytest.mark.parametrize("width_multiple", [1, 16])
def test_decilm_layout_keeps_each_attention_whole_or_removes_it_and_exports_without_padding(width_multiple):
    """Under layout decilm a block's query heads leave together, so the decilm export holds the masked model
    exactly: its parameters are the masked model's non-zero ones (plus the embeddings), its logits the same."""
    import transformers

    from tests._families import COMMON

    torch.manual_seed(0)
    settings = {**COMMON, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8, "num_hidden_layers": 4}
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**settings)).eval()
    config = PruneConfig(structure="coupled", target_size=0.4, shots=2, layout="decilm",
                         width_multiple=width_multiple, speed_context=4096)
    report = prune(model, calibration(), config, progress=False)
    d, hidden = model.config.head_dim, model.config.hidden_size
    attention_live = []
    for block in decoder_blocks(model):
        heads_live = ~(block.self_attn.o_proj.weight == 0).all(0).reshape(8, d).all(1)
        assert heads_live.all() or not heads_live.any(), heads_live  # whole, or gone
        for part in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj):
            assert bool((part.weight == 0).all()) != bool(heads_live.any())
        attention_live.append(bool(heads_live.any()))
        neurons = int((~(block.mlp.down_proj.weight == 0).all(0)).sum())
        assert neurons % width_multiple == 0, neurons
    assert not all(attention_live), "no attention left: the test needs one removed"
    whole_attention = 2 * 8 * d * hidden + 2 * 4 * d * hidden
    assert_reaches_target(report.removed, shapes(model), 0.4, "coupled", freed=sum(s.freed for s in report.shots),
                          largest=max(whole_attention, width_multiple * 3 * hidden))
    compact = compact_model(model, "decilm")
    masked_nonzero = sum(int((p != 0).sum()) for n, p in model.named_parameters() if "layers." in n and p.dim() == 2)
    compact_weights = sum(p.numel() for n, p in compact.named_parameters() if "layers." in n and p.dim() == 2)
    assert compact_weights == masked_nonzero
    assert_same_logits(model, compact)
