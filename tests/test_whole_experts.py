"""Whole routed experts leave a Mixture-of-Experts model (structure experts): the routing, the rerouting price
against its closed form, REAP's score, and the smaller model that loads as its family."""

from __future__ import annotations

import copy

import pytest
import torch

from surgeon import PruneConfig, prune
from surgeon.errors import SurgeonError
from surgeon.export.compact import compact_model, same_logits
from surgeon.models.adapter import decoder_blocks
from surgeon.models.experts import fused_weights, keep_experts, routing, sparse_blocks
from surgeon.models.families import FAMILIES as KNOWN
from surgeon.models.families import supporting
from surgeon.pruning.resume import Checkpoint, read_state
from surgeon.pruning.whole_experts import reap_scores, reroute_costs
from tests._families import VOCAB, family_model
from tests._helpers import logits

FAMILIES = sorted(supporting("expert_count"))


def calibration() -> torch.Tensor:
    return torch.randint(3, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))


def first_moe(model: torch.nn.Module) -> torch.nn.Module:
    return sparse_blocks(decoder_blocks(model))[0][1]


def renormalizing(family: str, renormalize: bool) -> torch.nn.Module:
    """The tiny model of `family` in float64 (its experts run by their loop), its routers renormalizing the top-k
    weights or not (Mixtral's always do), sharp enough that the choices differ between tokens."""
    model = family_model(family).double()
    model.config._experts_implementation = "eager"  # the routed loop: torch's grouped GEMM has no float64
    for _, moe in sparse_blocks(decoder_blocks(model)):
        if hasattr(moe.gate, "norm_topk_prob"):
            moe.gate.norm_topk_prob = renormalize
        with torch.no_grad():
            moe.gate.weight.normal_(std=1.0)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_routing_is_the_routers_own_and_a_dropped_expert_routes_as_if_it_were_gone(family):
    moe = first_moe(renormalizing(family, False))
    hidden = torch.randn(64, moe.gate.weight.shape[1], dtype=torch.float64)
    _, weights, chosen = moe.gate(hidden)
    mine, mine_chosen = routing(moe.gate, hidden)
    assert torch.equal(mine_chosen, chosen) and torch.equal(mine, weights)
    dropped = torch.tensor([False, True, False, False])
    masked, masked_chosen = routing(moe.gate, hidden, dropped)
    smaller = copy.deepcopy(moe)
    keep_experts(smaller, torch.tensor([0, 2, 3]))
    _, weights, chosen = smaller.gate(hidden)
    assert torch.equal(torch.tensor([0, 2, 3])[chosen], masked_chosen)
    torch.testing.assert_close(weights.double(), masked.double(), rtol=1e-6, atol=0)  # float32 softmax


@pytest.mark.parametrize("family,renormalize", [("mixtral", True), ("qwen3_moe", True), ("qwen3_moe", False),
                                                ("qwen2_moe", False)])
def test_the_rerouting_price_is_the_fisher_form_of_the_exact_output_change(family, renormalize):
    """½ Σ_t (g_tᵀ Δy_t)² with Δy_t from the block with that expert removed (`keep_experts`), computed by brute
    force in float64; without renormalization the tokens it did not serve change too."""
    moe = first_moe(renormalizing(family, renormalize))
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(48, moe.gate.weight.shape[1], generator=generator, dtype=torch.float64)
    grad = torch.randn(hidden.shape, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        before = moe(hidden.unsqueeze(0)).squeeze(0)  # the whole block: a shared expert cancels in Δy
        expected = []
        for expert in range(4):
            smaller = copy.deepcopy(moe)
            keep_experts(smaller, torch.tensor([e for e in range(4) if e != expert]))
            delta = smaller(hidden.unsqueeze(0)).squeeze(0) - before
            expected.append(0.5 * float(((grad * delta).sum(-1) ** 2).sum()))
    costs = reroute_costs(moe, hidden, grad)
    torch.testing.assert_close(costs, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    assert bool((costs > 0).all())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_reap_score_is_the_router_weighted_output_norm_over_the_experts_tokens(family):
    moe = first_moe(renormalizing(family, True))
    hidden = torch.randn(40, moe.gate.weight.shape[1], generator=torch.Generator().manual_seed(2),
                         dtype=torch.float64)
    _, weights, chosen = moe.gate(hidden)
    sums, counts = reap_scores(moe, hidden)
    with torch.no_grad():
        for expert in range(4):
            token, slot = torch.where(chosen == expert)
            alone = moe.experts(hidden[token], torch.full((token.numel(), 1), expert),
                                torch.ones(token.numel(), 1, dtype=torch.float64))  # f_e(x_t), weight 1
            assert int(counts[expert]) == token.numel()
            torch.testing.assert_close(sums[expert], (weights[token, slot] * alone.norm(dim=-1)).sum(),
                                       rtol=1e-12, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["surgeon", "reap"])
def test_whole_experts_leave_with_their_router_rows_and_the_model_loads_as_its_family(family, method, tmp_path):
    """Half of every block's experts leave, the same count everywhere; the kept ones are original experts untouched,
    the config holds the count, and the saved model loads in transformers with the same logits and exports."""
    from transformers import AutoModelForCausalLM

    model = family_model(family)
    original = [(moe.gate.weight.detach().clone(), *(w.detach().clone() for w in fused_weights(moe.experts)))
                for _, moe in sparse_blocks(decoder_blocks(model))]
    report = prune(model, calibration(), PruneConfig(structure="experts", target_size=0.5, method=method),
                   progress=False)
    assert getattr(model.config, KNOWN[family].expert_count) == 2
    assert report.sparsity == 0.5 and set(report.layers.values()) == {0.5} and len(report.shots) == 1
    for (_, moe), (router, gate_up, down) in zip(sparse_blocks(decoder_blocks(model)), original):
        kept = [next(e for e in range(4) if torch.equal(row, router[e])) for row in moe.gate.weight]
        assert kept == sorted(kept) and len(kept) == 2
        assert torch.equal(moe.experts.gate_up_proj, gate_up[kept]) and torch.equal(moe.experts.down_proj, down[kept])
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert getattr(loaded.config, KNOWN[family].expert_count) == 2
    ids = calibration()[:2, :16]
    assert torch.equal(logits(loaded, ids), logits(model, ids))
    same_logits(model, compact_model(model))


def test_shots_remove_experts_on_the_linear_schedule():
    model = family_model("mixtral")
    counts = []
    prune(model, calibration(), PruneConfig(structure="experts", target_size=0.5, shots=2), progress=False,
          after_shot=lambda shot: counts.append(model.config.num_local_experts))
    assert counts == [3, 2]


@pytest.mark.parametrize("method", ["surgeon", "reap"])
def test_a_whole_expert_run_continued_after_a_shot_equals_the_uninterrupted_run(method, tmp_path):
    """The one shot loop checkpoints whole-expert runs as any other: each block's kept experts, by original index."""
    config = PruneConfig(structure="experts", target_size=0.5, shots=2, method=method)
    uninterrupted = family_model("mixtral")
    expected = prune(uninterrupted, calibration(), config, progress=False)

    def stop(shot):
        if shot.shot == 2:  # the checkpoint of shot 1 is on disk, shot 2's is not
            raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        prune(family_model("mixtral"), calibration(), config, progress=False, after_shot=stop,
              checkpoint=Checkpoint(tmp_path, {"test": 1}))
    assert read_state(tmp_path, {"test": 1})["shot"] == 1
    model = family_model("mixtral")
    continued = prune(model, calibration(), config, progress=False,
                      checkpoint=Checkpoint(tmp_path, {"test": 1}, state=read_state(tmp_path, {"test": 1})))
    assert model.config.num_local_experts == uninterrupted.config.num_local_experts == 2
    assert model.state_dict().keys() == uninterrupted.state_dict().keys()
    assert all(torch.equal(value, uninterrupted.state_dict()[name]) for name, value in model.state_dict().items())
    assert [s.sparsity for s in continued.shots] == [s.sparsity for s in expected.shots] == [0.25, 0.5]
    assert continued.layers == expected.layers


@pytest.mark.parametrize("family,config,message", [
    ("llama", PruneConfig(structure="experts"), "structure experts removes whole routed experts of mixtral, "
                                                "olmoe, qwen2_moe, qwen3_moe models; the model is 'llama'"),
    ("mixtral", PruneConfig(structure="experts", target_size=0.25), "keeps 1 of 4 experts per block, fewer than the 2"),
    ("deepseek_v3", PruneConfig(structure="experts"), "the model is 'deepseek_v3'"),
])
def test_what_whole_experts_cannot_do_is_refused_in_one_line(family, config, message):
    model = family_model(family)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(SurgeonError, match=message):
        prune(model, calibration(), config, progress=False)
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


@pytest.mark.parametrize("settings,message", [
    (dict(structure="experts", method="kobd"), "for experts use surgeon or reap"),
    (dict(structure="2:4", method="reap"), "method=.reap. prunes experts, not 2:4"),
    (dict(structure="experts", lora_steps=2), "without activation_checkpointing, lora_steps and leave_out"),
    (dict(structure="experts", leave_out="router,*.self_attn.*"), "without activation_checkpointing, lora_steps"),
])
def test_settings_whole_experts_cannot_use_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        PruneConfig(**settings)


def test_the_prune_and_export_commands_remove_whole_experts(smollm2_tokenizer_dir, tmp_path):
    """`surgeon prune --structure experts` writes the smaller model and a report counting the experts' weights;
    `surgeon export --compact` writes it in the standard format."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer, MixtralConfig

    from surgeon.app.cli import main

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=256)
    source, run, out = tmp_path / "mixtral", tmp_path / "run", tmp_path / "compact"
    AutoModelForCausalLM.from_config(config).save_pretrained(source)
    AutoTokenizer.from_pretrained(smollm2_tokenizer_dir).save_pretrained(source)
    assert main(["--quiet", "prune", "--model", str(source), "--structure", "experts", "--target-size", "0.5",
                 "--method", "reap", "--nsamples", "2", "--seqlen", "64", "--calibration", "wikitext2-valid",
                 "--eval-windows", "1", "--eval-seqlen", "64", "--output", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["sparsity"] == 0.5 and report["config"]["structure"] == "experts"
    assert 0 < report["block_sparsity"] < 0.5 and report["ppl_after"] > 0
    assert json.loads((run / "config.json").read_text())["num_local_experts"] == 2
    assert main(["--quiet", "export", str(run), "--compact", "--output", str(out)]) == 0
    assert AutoModelForCausalLM.from_pretrained(out).config.num_local_experts == 2
