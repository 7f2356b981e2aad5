"""`surgeon plan`: memory counted from the config alone, checked against the real pass and the H100 measurements."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from bench.quality.sparsegpt_dropin import LLAMA2_7B_SHAPES
from surgeon.app.cli import main
from surgeon.app.data import held_out_windows
from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.method.factors import by_layer
from surgeon.models.adapter import decoder_blocks, prunable_layers
from surgeon.models.experts import experts_as_layers
from surgeon.pruning import curvature
from surgeon.scale.plan import GIB, HEADROOM, count, fit_to_gpu, held, make_plan, meta_model, packed_bytes
from surgeon.scale.plan_config import PlanConfig, parse_bytes
from surgeon.scale.time_model import (
    CURVATURE_PARTS_SOURCE,
    H100_ACCUMULATION_FLOPS_PER_S,
    H100_PASS_FLOPS_PER_S,
    H100_SOURCES,
    H100_SWEEP_S_PER_COLUMN,
    SWEEP_SOURCE,
    part_seconds,
)
from surgeon.scale.time_model import held_out_windows as planned_held_out_windows
from tests._families import family_model

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "bench" / "results" / "gpu"
LLAMA_2_7B = "bench/configs/llama-2-7b.json"
# measured shots, batch 2 of 128 × 2048 tokens, bfloat16: (config, result file, structure)
MEASURED = {
    "llama-2-7b": (LLAMA_2_7B, "shot-llama2-7b-32blocks-1shots-batch2@7b5fd7c.json", "structured"),
    "llama-2-7b-unstructured": (LLAMA_2_7B, "shot-llama2-7b-32blocks-1shots-batch2-unstructured@513bded.json",
                                "unstructured"),
    "llama-2-7b-2:4": (LLAMA_2_7B, "shot-llama2-7b-32blocks-4shots-batch2-2of4@513bded.json", "2:4"),
    "opt-6.7b": ("bench/configs/opt-6.7b.json", "shot-opt-6.7b-structured-1shots@2918240.json", "structured"),
    "opt-1.3b": ("bench/configs/opt-1.3b.json", "shot-opt-1.3b-structured-4shots@2918240.json", "structured"),
}
STRUCTURED = PruneConfig(structure="structured", target_size=0.8, shots=4, batch_size=2)


def test_sizes():
    assert parse_bytes("80GB") == parse_bytes("80 GiB") == 80 * GIB
    assert parse_bytes("512M") == 512 * 2**20 and parse_bytes("1000") == 1000
    with pytest.raises(ValueError, match="80GB"):
        parse_bytes("lots")
    assert packed_bytes(128) == 128 * 128 * 4 and packed_bytes(129) == 3 * 128 * 128 * 4


def counted_peak(name: str, as_measured: bool = False) -> float:
    """The plan's peak for a measured run; `as_measured`: with every layer's [R, C] mask, which the code of these
    runs held in structured runs too, where removed rows and columns now stand for it."""
    config, _, structure = MEASURED[name]
    prune = PruneConfig(structure=structure, target_size=0.5 if structure == "unstructured" else
                        None if ":" in structure else 0.8, batch_size=2)
    plan = make_plan(PlanConfig(model=str(ROOT / config), dtype="bfloat16", nsamples=128, seqlen=2048), prune)
    masks = plan["prunable_parameters"] if as_measured and not prune.elements else 0
    return (plan["peak_gpu_bytes"] + masks) / GIB


def measured_peak(name: str) -> float:
    return max(shot["peak_memory_gb"] for shot in json.loads((GPU / MEASURED[name][1]).read_text())["shots"])


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_count_lands_at_most_5_percent_under_each_h100_measurement(name):
    """What the count leaves out (the kernels' and the backward pass's transient buffers) is a few percent; the
    plan's headroom covers it and what the allocator reserves beyond what it allocates, which no run measured."""
    assert 0.95 <= counted_peak(name, as_measured=True) / measured_peak(name) <= 1.0
    assert counted_peak(name) * (1 + HEADROOM) >= measured_peak(name)


@pytest.mark.parametrize("family", ["llama", "opt", "qwen2", "gpt_neox", "mixtral", "qwen2_moe", "qwen3_moe",
                                    "deepseek_v3"])
def test_counted_factors_are_the_bytes_the_curvature_pass_allocates(family):
    """Each routed expert's projections are layers with their own factors, as a run splits them; deepseek_v3's
    latent attention reads one input in two layers that do not run one after the other, so each has its A."""
    model = family_model(family)
    with experts_as_layers(decoder_blocks(model)):
        layers = [pair for block in prunable_layers(model) for pair in block]
        factors = by_layer(curvature.estimate(model, layers, torch.randint(0, 128, (2, 16)), progress=False))
    tensors = {id(f.A): f.A.tiles for f in factors.values()} | {id(f.G): f.G.tiles for f in factors.values()}
    allocated = sum(t.numel() * t.element_size() for t in tensors.values())
    config = PruneConfig(structure="structured", shots=1)
    meta = meta_model_of(family)
    assert count(meta, config, nsamples=2, seqlen=16, device="cpu")["phases"]["curvature"]["factors"] == allocated


def meta_model_of(family: str):
    """The tiny family model on the meta device, from its config."""
    from transformers import AutoModelForCausalLM

    config = family_model(family).config
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def test_a_run_takes_the_memory_options_it_needs_or_is_refused_before_its_weights_load(monkeypatch, tmp_path,
                                                                                       caplog):
    model = str(ROOT / MEASURED["llama-2-7b"][0])
    assert fit_to_gpu(model, "bfloat16", 128, 2048, STRUCTURED, 80 * GIB) is STRUCTURED  # fits as it is
    lean = fit_to_gpu(model, "bfloat16", 128, 2048, STRUCTURED, 40 * GIB)
    assert (lean.activation_checkpointing, lean.offload, lean.block_groups) == (True, True, 2)  # the least that fits
    assert dataclasses.replace(lean, activation_checkpointing=False, offload=False, block_groups=1) == STRUCTURED
    assert "runs with --activation-checkpointing --offload --block-groups 2" in caplog.text
    with pytest.raises(SurgeonError, match=r"does not fit the GPU: the curvature phase needs .* with "
                                           r"--activation-checkpointing --offload --block-groups 32\), .* short by"):
        fit_to_gpu(model, "bfloat16", 128, 2048, STRUCTURED, 16 * GIB)  # the weights alone take 12.6 GiB

    import surgeon.app.run

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(surgeon.app.run, "gpu_memory", lambda device: 2**20)
    monkeypatch.setattr(surgeon.app.run, "load_model", no_load)
    code = main(["prune", "--model", "smollm2-135m", "--structure", "2:4", "--output", str(tmp_path / "out")])
    assert code == 2 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("settings, problem", [({"structure": "2:7"}, "M=7 does not divide the 576 columns"),
                                               ({"structure": "structured", "offload": True, "block_groups": 31},
                                                "block_groups=31: more groups than the 30")])
def test_settings_the_model_cannot_run_are_refused_before_its_weights_load(monkeypatch, tmp_path, capsys, settings,
                                                                          problem):
    import surgeon.app.run

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    (tmp_path / "settings.json").write_text(json.dumps(settings))
    monkeypatch.setattr(surgeon.app.run, "load_model", no_load)
    options = ["--model", "smollm2-135m", "--config", str(tmp_path / "settings.json")]
    assert main(["prune", *options, "--output", str(tmp_path / "out")]) == 2
    assert problem in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_plan_counts_the_second_pruning_of_the_held_out_choice():
    """A run weighed against sparsegpt-refine holds that shot's block-by-block phase in one process, two copies of
    the prunable weights and their masks in host memory, and its projected seconds; a run alone holds none."""
    for structure in ("2:4", "unstructured"):
        plan = make_plan(PlanConfig(model="smollm2-135m", gpus=2), PruneConfig(structure=structure))
        assert any("sparsegpt-refine shot" in note for note in plan["notes"])
        assert set(plan["held_out_seconds_h100"]) == {"passes", "factors", "sweeps"}
        assert plan["phases"]["held-out"].keys() == {"weights", "masks", "block_inputs", "hessians", "layer", "total"}
        assert plan["phases"]["held-out"]["masks"] == plan["prunable_parameters"]  # a bool per weight
        assert plan["held_out_host_bytes"] == 2 * plan["prunable_parameters"] * (2 + 1)  # bfloat16 weights, bool masks
        assert [s["host_bytes"] for s in plan["strategies"]] == [plan["held_out_host_bytes"]] + [0] * 3  # one process
        one_rank = count(meta_model("smollm2-135m", "float32"), PruneConfig(structure=structure), 128, 2048, "cuda")
        assert "held-out" not in held(one_rank, PruneConfig(structure=structure), ranks=2)
    alone = make_plan(PlanConfig(model="smollm2-135m"), PruneConfig(structure="2:4", held_out_choice=False))
    assert not any("sparsegpt-refine" in note for note in alone["notes"])
    assert "held-out" not in alone["phases"] and alone["held_out_seconds_h100"] == {}
    assert alone["held_out_host_bytes"] == 0 == alone["strategies"][0]["host_bytes"]


def test_the_held_out_shot_of_llama_2_7b_by_hand():
    """Its forward passes, input factors and sweeps from Llama-2-7B's shape (128 × 2048 tokens), at the measured
    rates."""
    d, f, blocks, vocab, tokens, held_out = 4096, 11008, 32, 32000, 128 * 2048, 8 * 2048
    plan = make_plan(PlanConfig(model=str(ROOT / LLAMA_2_7B), dtype="bfloat16", nsamples=128, seqlen=2048),
                     PruneConfig(structure="2:4", batch_size=2))
    forward = blocks * (4 * d * d + 3 * d * f) + blocks * 2 * d * 2048 / 2  # the weights, attention's two matmuls
    expected = {
        "passes": 2 * (2 * tokens * forward + 2 * held_out * (forward + vocab * d)) / H100_PASS_FLOPS_PER_S,
        # the input factors of q/k/v, o, gate/up and down
        "factors": 2 * tokens * blocks * (3 * d * d + f * f) / 2 / H100_ACCUMULATION_FLOPS_PER_S,
        "sweeps": blocks * (6 * d + f) * H100_SWEEP_S_PER_COLUMN["N:M"],
    }
    assert plan["held_out_seconds_h100"] == pytest.approx(expected, rel=1e-12)
    assert sum(expected.values()) == pytest.approx(174, abs=1)


def test_the_held_out_windows_planned_are_those_a_run_draws():
    ids = torch.arange(200_000).unsqueeze(0)
    for nsamples in (1, 8, 9, 128):
        assert held_out_windows(ids, nsamples, 64).shape[0] == planned_held_out_windows(nsamples)


def test_the_rates_of_the_parts_are_the_measured_seconds_over_the_counted_work(llama_2_7b_shot):
    """The pass and the factor accumulation of 8 timed Llama-2-7B blocks (×4 for 32) over `work`'s FLOPs; the
    sweeps' seconds over their layers' input columns."""
    seconds = json.loads((ROOT / CURVATURE_PARTS_SOURCE).read_text())["seconds"]
    work = llama_2_7b_shot["work_per_shot"]["curvature"]
    accumulation = seconds["estimate"] - seconds["estimate without factor accumulation"]
    assert pytest.approx(work["pass"]["flops"] / (4 * seconds["forward and backward"]),
                                                  rel=0.01) == H100_PASS_FLOPS_PER_S
    assert pytest.approx(work["accumulation"]["flops"] / (4 * accumulation),
                                                          rel=0.01) == H100_ACCUMULATION_FLOPS_PER_S
    sweeps = json.loads((ROOT / SWEEP_SOURCE).read_text())
    columns = sum(LLAMA2_7B_SHAPES[row["layer"]][1] for row in sweeps["rows"] if row["structure"] == "2:4")
    for kind, structure in (("unstructured", "unstructured-0.5"), ("N:M", "2:4")):
        measured = sweeps["summary"][structure]["modes"]["refine-8"]["seconds"] / columns
        assert H100_SWEEP_S_PER_COLUMN[kind] == pytest.approx(measured, rel=0.01), kind


def test_the_plan_refuses_settings_the_model_cannot_run(capsys):
    assert main(["plan", "--model", "smollm2-135m", "--structure", "2:7"]) == 2
    assert "M=7 does not divide the 576 columns" in capsys.readouterr().err


def test_a_model_the_plan_cannot_build_is_not_refused(tmp_path, caplog):
    """The fit check is a guard, not a gate: a config transformers cannot build alone skips it with a warning."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not-a-transformers-family"}))
    assert fit_to_gpu(str(tmp_path), "bfloat16", 128, 2048, STRUCTURED, 1) is STRUCTURED
    assert "memory not checked before loading" in caplog.text
    with pytest.raises(SurgeonError, match="cannot build"):
        meta_model(str(tmp_path), "bfloat16")


def test_mixture_of_experts_plans_count_every_experts_factors_and_offer_no_fsdp():
    """Qwen3-30B-A3B fits one 80 GB GPU with its factors offloaded, and 8; Mixtral-8x7B's weights alone (87 GiB in
    bfloat16) fit none, and FSDP2, which would shard them, does not hold experts: the plan says so."""
    config = PruneConfig(structure="structured", target_size=0.8)
    qwen = make_plan(PlanConfig(model=str(ROOT / "bench/configs/qwen3-30b-a3b.json"), gpus=8), config)
    factors = qwen["phases"]["curvature"]["factors"]
    expert = 3 * packed_bytes(2048) + 3 * packed_bytes(768)  # A and G of gate, up and down, gate and up share A
    assert factors > 48 * 128 * (expert - packed_bytes(2048))  # every block's 128 experts
    one, *eight = qwen["strategies"]
    assert one["gpus"] == 1 and one["fits"] and "offload" in one["name"]
    assert qwen["fits"] and qwen["strategy"] in [s["name"] for s in eight] and all(s["gpus"] == 8 for s in eight)
    mixtral = make_plan(PlanConfig(model=str(ROOT / "bench/configs/mixtral-8x7b.json"), gpus=8), config)
    assert not mixtral["fits"] and mixtral["phases"]["curvature"]["weights"] > 80 * GIB
    assert not any("fsdp" in s["name"] for s in mixtral["strategies"]) and "no FSDP2" in mixtral["notes"][0]
    assert fit_to_gpu(str(ROOT / "bench/configs/mixtral-8x7b.json"), "bfloat16", 128, 2048, config, 160 * GIB).offload


def test_whole_expert_runs_are_refused_by_the_plan_and_not_checked_before_a_run(tmp_path, caplog):
    """Their own pass holds no factors: counted as layers, they would be refused for memory they never use."""
    family_model("mixtral").config.save_pretrained(tmp_path)
    experts = PruneConfig(structure="experts")
    with pytest.raises(SurgeonError, match=r"surgeon plan does not count whole-expert runs \(structure experts\)"):
        make_plan(PlanConfig(model=str(tmp_path)), experts)
    assert fit_to_gpu(str(tmp_path), "bfloat16", 128, 2048, experts, 1) is experts
    assert "does not count whole-expert runs" in caplog.text


def test_plan_command_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", str(ROOT / "bench/configs/llama-2-13b.json"), "--structure", "unstructured",
                 "--target-size", "0.5", "--batch-size", "2", "--gpus", "2", "--output", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert {"fits", "peak_gpu_bytes", "strategy", "phases"} <= set(plan)
    assert plan["fits"] and plan["strategy"] == "2-ranks-fsdp-split-by-blocks+activation-checkpointing"
    # offload holds structured factors only: unstructured, each launch tries activation checkpointing at most; every
    # rank holds every layer's mask whole (12.1 GiB)
    assert [s["name"] for s in plan["strategies"]] == [
        "packed-factors-on-device+activation-checkpointing", "2-ranks-split-by-batches+activation-checkpointing",
        "2-ranks-fsdp-split-by-batches+activation-checkpointing",
        "2-ranks-fsdp-split-by-blocks+activation-checkpointing"]
    assert "fits 80GB with 2-ranks-fsdp-split-by-blocks+activation-checkpointing" in capsys.readouterr().out
    assert main(["plan", "--model", str(ROOT / "bench/configs/opt-125m.json"), "--structure", "unstructured",
                 "--target-size", "0.5", "--gpu-memory", "1GB", "--output", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert not plan["fits"] and plan["strategy"] is None and plan["shortfall_bytes"] > 0
    assert "does not fit 1GB" in capsys.readouterr().out


def test_llama_2_70b_structured_fits_eight_gpus_with_checkpointing_offload_and_block_groups():
    plan = make_plan(PlanConfig(model=str(ROOT / "bench/configs/llama-2-70b.json"), dtype="bfloat16", nsamples=128,
                                seqlen=2048, gpus=8), PruneConfig(structure="structured", shots=40, batch_size=1))
    assert not plan["phases"]["curvature"]["total"] * (1 + HEADROOM) <= 80 * GIB  # as one process, plainly, far from it
    chosen = next(s for s in plan["strategies"] if s["name"] == plan["strategy"])
    assert plan["fits"] and chosen["gpus"] == 8
    assert chosen["launch"].startswith("torchrun --nproc-per-node 8 -m surgeon prune --fsdp")
    assert "--activation-checkpointing --offload --block-groups" in chosen["launch"]
    assert chosen["peak_gpu_bytes"] * (1 + HEADROOM) <= 80 * GIB and chosen["host_bytes"] > 50 * GIB
    fitting = {s["name"]: sum(s["seconds_per_shot"].values()) for s in plan["strategies"] if s["fits"]}
    assert len(fitting) >= 2 and min(fitting, key=fitting.__getitem__) == plan["strategy"]  # the fastest that fits
    launch = chosen["launch"].split()
    config = PruneConfig(structure="structured", batch_size=1, activation_checkpointing=True, offload=True,
                         block_groups=int(launch[-1]),
                         curvature_split="blocks" if "blocks" in launch else "batches")
    assert fit_to_gpu(str(ROOT / "bench/configs/llama-2-70b.json"), "bfloat16", 128, 2048, config, 80 * GIB, 8,
                      True) is config


def test_llama_2_13b_structured_fits_one_gpu_with_offload_and_block_groups():
    model = str(ROOT / "bench/configs/llama-2-13b.json")
    plan = make_plan(PlanConfig(model=model, dtype="bfloat16", nsamples=128, seqlen=2048), STRUCTURED)
    assert plan["fits"] and plan["strategy"].startswith("packed-factors-on-device+activation-checkpointing+offload")
    assert fit_to_gpu(model, "bfloat16", 128, 2048, STRUCTURED, 80 * GIB) == dataclasses.replace(
        STRUCTURED, activation_checkpointing=True, offload=True, block_groups=2)


def test_plan_reads_only_the_configuration():
    model = meta_model("smollm2-135m", "bfloat16")
    assert all(p.device.type == "meta" for p in model.parameters())


def test_a_rank_holds_its_share_of_what_it_owns():
    counts = count(meta_model(str(ROOT / MEASURED["llama-2-7b"][0]), "bfloat16"), STRUCTURED, 128, 2048, "cuda")
    one = counts["phases"]
    blocks_split = dataclasses.replace(STRUCTURED, curvature_split="blocks")
    by_blocks, by_batches = held(counts, blocks_split, 3, True), held(counts, STRUCTURED, 3, False)
    share = 11 / 32  # ⌈32 blocks / 3 ranks⌉
    assert by_blocks["curvature"]["factors"] == round(one["curvature"]["factors"] * share)
    assert by_blocks["prune"]["inverses"] == by_batches["prune"]["inverses"] == round(one["prune"]["inverses"] * share)
    assert by_blocks["prune"]["own_layers"] == math.ceil(counts["prunable_bytes"] * share)
    assert by_blocks["curvature"]["weights"] == \
        math.ceil(counts["weights_bytes"] / 3) + counts["root_bytes"] + 2 * counts["block_bytes"]
    assert by_batches["curvature"] == one["curvature"]  # every factor while the pass runs, every weight
    assert counts["root_bytes"] == 2 * 32000 * 4096 * 2 + 4096 * 2  # embeddings, head, final norm


def test_memory_options_hold_a_block_groups_factors_one_blocks_activations_and_two_layers_inverses():
    counts = count(meta_model(str(ROOT / LLAMA_2_7B), "bfloat16"), STRUCTURED, 128, 2048, "cuda")
    plain = counts["phases"]
    options = held(counts, dataclasses.replace(STRUCTURED, activation_checkpointing=True, offload=True,
                                               block_groups=3))
    assert options["curvature"]["factors"] == round(plain["curvature"]["factors"] * 11 / 32)  # 11, 10, 11 blocks
    hidden_states = 2 * 2048 * 4096 * 2  # one block's input, batch 2, bfloat16
    checkpointed = options["curvature"]["activations"]
    assert 32 * hidden_states < checkpointed < 32 * hidden_states + plain["curvature"]["activations"] / 16
    layer = packed_bytes(11008) + packed_bytes(4096)  # down_proj's A and G, the largest layer's
    # the factors and packed roots of a layer and of the one before it
    assert options["prune"]["inverses"] == 4 * layer and options["prune"]["layer"] == plain["prune"]["layer"]


def test_llama_2_13b_structured_fits_two_gpus_with_sharded_weights_and_factors():
    config = dataclasses.replace(STRUCTURED, curvature_split="blocks")
    plan = make_plan(PlanConfig(model=str(ROOT / "bench/configs/llama-2-13b.json"), dtype="bfloat16", nsamples=128,
                                seqlen=2048, gpus=2), config)
    fits = {s["name"]: s["fits"] for s in plan["strategies"]}
    options = "+activation-checkpointing+offload+block-groups-2"  # what the others need to fit
    assert fits == {"packed-factors-on-device" + options: True, "2-ranks-split-by-batches" + options: True,
                    "2-ranks-fsdp-split-by-batches+offload+block-groups-2": True,  # weights sharded: 2 passes
                    "2-ranks-fsdp-split-by-blocks": True}
    assert plan["fits"] and plan["strategy"] == "2-ranks-fsdp-split-by-blocks"  # the fastest: one pass per shot
    chosen = next(s for s in plan["strategies"] if s["name"] == plan["strategy"])
    assert chosen["launch"] == "torchrun --nproc-per-node 2 -m surgeon prune --fsdp --curvature-split blocks"
    model = str(ROOT / "bench/configs/llama-2-13b.json")
    assert fit_to_gpu(model, "bfloat16", 128, 2048, config, 80 * GIB).offload  # one GPU: only with offload
    assert fit_to_gpu(model, "bfloat16", 128, 2048, config, 80 * GIB, ranks=2, fsdp=True) is config


def test_the_propagated_nm_shot_counts_every_windows_block_inputs():
    meta = meta_model_of("llama")
    hidden, itemsize = meta.config.hidden_size, next(meta.parameters()).element_size()
    propagated = count(meta, PruneConfig(structure="2:4"), nsamples=8, seqlen=16, device="cpu")["phases"]["prune"]
    assert propagated["block_inputs"] == 2 * 8 * 16 * hidden * itemsize
    plain = count(meta, PruneConfig(structure="2:4", propagate=False), nsamples=8, seqlen=16, device="cpu")
    assert "block_inputs" not in plain["phases"]["prune"]


def test_time_is_projected_from_the_rate_measured_for_each_kind_of_run():
    """Llama-2-7B at the measured tokens projects the seconds its measured runs took (their N:M masks by eq. 7); masks
    by the sweep, the propagated N:M default, add one sweep per layer; a kind never measured projects none."""
    plan = PlanConfig(model=str(ROOT / LLAMA_2_7B), dtype="bfloat16", nsamples=128, seqlen=2048)
    measured = {name: json.loads((ROOT / name).read_text())["shots"] for name in H100_SOURCES}
    structured, unstructured, nm = (measured[name] for name in H100_SOURCES)
    expected = {  # (structure, propagate): (curvature s, prune s) of the first shot, or the last (propagated)
        ("structured", None): structured[0]["seconds"],
        ("unstructured", None): unstructured[0]["seconds"],
        ("2:4", None): nm[-1]["seconds"],
        ("2:4", False): {"prune": sum(shot["seconds"]["prune"] for shot in nm[:-1]) / (len(nm) - 1)},
    }
    for (structure, propagate), seconds in expected.items():
        config = PruneConfig(structure=structure, target_size=None if ":" in structure else 0.5, propagate=propagate,
                             nm_mask="costs" if ":" in structure else None)
        projected = make_plan(plan, config)["seconds_per_shot_h100"]
        assert projected["prune"] == pytest.approx(seconds["prune"], abs=0.06), (structure, propagate)
    swept = make_plan(plan, PruneConfig(structure="2:4"))["seconds_per_shot_h100"]["prune"]
    assert swept - nm[-1]["seconds"]["prune"] == pytest.approx(32 * (6 * 4096 + 11008) * H100_SWEEP_S_PER_COLUMN["N:M"],
                                                               abs=0.06)
    assert projected["curvature"] == pytest.approx(structured[0]["seconds"]["curvature"], abs=0.06)
    assert make_plan(plan, dataclasses.replace(STRUCTURED, method="kobd"))["seconds_per_shot_h100"] == {}


@pytest.fixture(scope="module")
def llama_2_7b_shot() -> dict:
    """The plan of one structured Llama-2-7B shot: 128 × 2048 tokens, bf16, batch 2."""
    return make_plan(PlanConfig(model=str(ROOT / LLAMA_2_7B), dtype="bfloat16", nsamples=128, seqlen=2048),
                     dataclasses.replace(STRUCTURED, shots=1))


def test_work_per_shot_is_llama_2_7bs_count_by_hand(llama_2_7b_shot):
    """FLOPs and bytes of a Llama-2-7B shot (128 × 2048 tokens, bf16, batch 2) from its shape alone."""
    d, f, blocks, vocab, tokens, batches = 4096, 11008, 32, 32000, 128 * 2048, 64
    plan = llama_2_7b_shot
    work = plan["work_per_shot"]
    active = blocks * (4 * d * d + 3 * d * f)
    attention = blocks * 6 * d * 2048 / 2  # query heads × head width = d; half of the 2048 keys on average
    factors = blocks * (8 * packed_bytes(d) + 3 * packed_bytes(f))  # A: q/k/v, o, gate/up, down; G: each layer
    expected = {
        "pass": (2 * tokens * (2 * active + 2 * vocab * d + attention),
                 2 * 2 * (blocks * (4 * d * d + 3 * d * f + 2 * d) + vocab * d) * batches),
        "accumulation": (2 * tokens * blocks * (8 * d * d + 3 * f * f) / 2,
                         2 * tokens * blocks * (8 * d + 3 * f) + 2 * factors),
        "inverses": (blocks * 2 / 3 * (8 * d**3 + 3 * f**3), 2 * factors),
    }
    got = {part: (value["flops"], value["bytes"]) for phase in work.values() for part, value in phase.items()}
    assert got.keys() == expected.keys()
    for part, (flops, read) in expected.items():
        assert got[part] == pytest.approx((flops, read), rel=1e-12), part
    floor = plan["floor_seconds_per_shot_h100"]
    assert floor["curvature"] == pytest.approx((expected["pass"][0] + expected["accumulation"][0]) / 989e12)
    assert floor["prune"] == pytest.approx(expected["inverses"][0] / 67e12)  # every part bound by its FLOPs
    assert any(note.startswith("floor per shot on one H100") for note in plan["notes"])
    assert make_plan(PlanConfig(model=str(ROOT / LLAMA_2_7B)), dataclasses.replace(STRUCTURED, method="kobd"))[
        "floor_seconds_per_shot_h100"] == {}


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-13b", "llama-2-70b", "opt-125m", "opt-1.3b", "opt-2.7b",
                                  "opt-6.7b", "mixtral-8x7b"])
def test_projected_time_is_never_below_the_floor_of_the_counted_work(name):
    """The time model scales measured rates; the counted FLOPs and bytes at the H100's peak rates bound it below."""
    plan = make_plan(PlanConfig(model=str(ROOT / f"bench/configs/{name}.json"), dtype="bfloat16", nsamples=128,
                                seqlen=2048), dataclasses.replace(STRUCTURED, shots=1))  # the least prune time
    floor, projected = plan["floor_seconds_per_shot_h100"], plan["seconds_per_shot_h100"]
    assert set(floor) == set(projected) == {"curvature", "prune"}
    for phase, seconds in floor.items():
        assert 0 < seconds <= projected[phase], phase


def test_design_quotes_the_counted_work_of_a_llama_2_7b_shot(llama_2_7b_shot):
    plan = llama_2_7b_shot
    design = (ROOT / "docs" / "DESIGN.md").read_text().splitlines()
    for phase in plan["work_per_shot"].values():
        for part, value in phase.items():
            row = next(line for line in design if line.startswith("|") and f"(`{part}`)" in line)
            cells = f"| {value['flops'] / 1e12:,.0f} | {value['bytes'] / 1e9:,.0f} | {part_seconds(value):.2f} |"
            assert cells in row, (row, cells)
    floor = sum(plan["floor_seconds_per_shot_h100"].values())
    assert f"{floor:.1f} s per structured shot by count" in "\n".join(design)
