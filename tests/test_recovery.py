"""Recovery by distillation: what pruning removed stays removed, the student approaches the teacher, and the command
writes a checkpoint that exports as small as the pruned one, trained on text the evaluation never reads."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from surgeon.errors import SurgeonError
from surgeon.models.adapter import decoder_blocks
from surgeon.recovery.distill import (
    Distill,
    Distillation,
    distill,
    hidden_loss,
    kl_loss,
    pruned_masks,
    teacher_targets,
    top_k_kl,
    top_k_targets,
)
from tests._helpers import pruned_pair, tiny_model

TRAIN = torch.randint(0, 96, (24, 24), generator=torch.Generator().manual_seed(1))


def kl(student: torch.nn.Module, teacher: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(kl_loss(student(input_ids=ids).logits, teacher(input_ids=ids).logits))


@pytest.mark.parametrize("arch, settings", [
    ("llama", dict(structure="structured", target_size=0.6, shots=1)),
    ("opt", dict(structure="structured", target_size=0.6, shots=1)),
    ("llama", dict(structure="2:4", method="magnitude")),
    ("llama", dict(structure="unstructured", target_size=0.5, shots=1)),
])
def test_distillation_keeps_every_pruned_zero_and_moves_the_student_toward_the_teacher(arch, settings):
    teacher, student = pruned_pair(arch, settings)
    zeros = {name: mask.clone() for name, mask in pruned_masks(student).items()}
    weights = {name: param.detach().clone() for name, param in student.named_parameters()}
    before = kl(student, teacher, TRAIN[:4])
    report = distill(student, teacher, TRAIN, Distill(lr=1e-3, batch_size=2), progress=False)
    params = dict(student.named_parameters())
    assert zeros and report.masked == len(zeros) and len(report.losses) == 12 and report.tokens == TRAIN.numel()
    for name, kept in zeros.items():
        assert torch.equal(params[name].detach() == 0, ~kept), name  # the same zeros, no new ones
    assert any(not torch.equal(params[name], weights[name]) for name in zeros)  # the kept weights trained
    if settings["structure"] == "2:4":
        for name, kept in zeros.items():
            if params[name].dim() == 2:
                assert int(kept.reshape(kept.shape[0], -1, 4).sum(-1).max()) <= 2, name
    assert kl(student, teacher, TRAIN[:4]) < 0.8 * before
    outside = [name for name in params if ".layers." not in name]
    assert outside and all(torch.equal(params[name], weights[name]) for name in outside)  # embeddings, head: kept
    assert all(param.requires_grad for param in student.parameters())  # as before


@pytest.mark.parametrize("settings", [dict(structure="2:4", method="magnitude"),
                                      dict(structure="structured", target_size=0.6, shots=1)])
def test_merged_lora_adapters_are_re_masked_so_no_pruned_weight_comes_back(settings):
    teacher, student = pruned_pair("llama", settings)
    zeros = {name: param.detach() == 0 for name, param in student.named_parameters()}
    weights = {name: param.detach().clone() for name, param in student.named_parameters()}
    before = kl(student, teacher, TRAIN[:4])
    report = distill(student, teacher, TRAIN, Distill(lr=1e-2, batch_size=2, lora_rank=4), progress=False)
    params = dict(student.named_parameters())
    assert list(params) == list(weights)  # the adapters merged away: the model's own parameters only
    assert all(torch.equal(params[name].detach() == 0, zero) for name, zero in zeros.items())
    trained = [name for name in params if not torch.equal(params[name], weights[name])]
    assert trained and all(".layers." in name for name in trained)  # only the decoder blocks' linear layers
    assert all(param.requires_grad for param in student.parameters())  # as before the adapters
    assert report.masked > 0 and kl(student, teacher, TRAIN[:4]) < before


def test_lora_adapters_of_a_layer_add_nothing_to_its_removed_rows_and_columns():
    teacher, student = pruned_pair("llama", dict(structure="structured", target_size=0.6, shots=1))
    distillation = Distillation(student, teacher, TRAIN, Distill(lr=1e-2, batch_size=2, lora_rank=4))
    checked = []

    def products(report):  # while training: BA of every adapted layer, beside its base weight
        for module in distillation.trained.modules():
            if hasattr(module, "lora_A") and "default" in module.lora_A:
                weight = module.base_layer.weight.detach()
                product = module.lora_B["default"].weight @ module.lora_A["default"].weight
                rows, columns = (weight == 0).all(dim=1), (weight == 0).all(dim=0)
                assert bool((product[rows] == 0).all()) and bool((product[:, columns] == 0).all())
                checked.append((int(rows.sum() + columns.sum()), bool((product[~rows][:, ~columns] != 0).any())))

    distillation.run(progress=False, after_step=products)
    assert sum(removed for removed, _ in checked) > 0  # some layers had whole rows or columns removed
    assert any(trained for _, trained in checked)  # and the adapters trained


def test_next_token_loss_needs_no_teacher_and_keeps_every_zero():
    _, student = pruned_pair("llama", dict(structure="2:4", method="magnitude"))
    zeros = {name: mask.clone() for name, mask in pruned_masks(student).items()}
    report = distill(student, None, TRAIN[:8], Distill(lr=1e-3, batch_size=2, loss="next-token"), progress=False)
    params = dict(student.named_parameters())
    assert len(report.losses) == 4 and all(loss > 0 for loss in report.losses)
    assert all(torch.equal(params[name].detach() == 0, ~kept) for name, kept in zeros.items())


def test_mixed_precision_runs_both_passes_in_bfloat16_and_keeps_float32_weights_and_every_zero():
    teacher, student = pruned_pair("llama", dict(structure="2:4", method="magnitude"))
    plain = copy.deepcopy(student)
    zeros = {name: mask.clone() for name, mask in pruned_masks(student).items()}
    before = kl(student, teacher, TRAIN[:4])
    seen: dict[str, set[torch.dtype]] = {"student": set(), "teacher": set()}
    for role, model in (("student", student), ("teacher", teacher)):
        decoder_blocks(model)[0].mlp.down_proj.register_forward_hook(
            lambda module, args, out, role=role: seen[role].add(out.dtype))
    mixed = distill(student, teacher, TRAIN, Distill(lr=1e-3, batch_size=2, mixed_precision="bf16"), progress=False)
    assert seen == {"student": {torch.bfloat16}, "teacher": {torch.bfloat16}}
    teacher_targets(teacher, TRAIN[:2], Distill(lr=1e-3, teacher_top_k=8, mixed_precision="bf16"), progress=False)
    assert seen["teacher"] == {torch.bfloat16}  # the teacher's top-k targets too
    reference = distill(plain, teacher, TRAIN, Distill(lr=1e-3, batch_size=2), progress=False)
    params = dict(student.named_parameters())
    assert all(param.dtype == torch.float32 for param in params.values())  # the weights AdamW steps stay float32
    assert all(torch.equal(params[name].detach() == 0, ~kept) for name, kept in zeros.items())
    # the first step's loss is float32's to bfloat16's precision, not bit for bit
    assert mixed.losses[0] != reference.losses[0] and mixed.losses[0] == pytest.approx(reference.losses[0], rel=0.05)
    assert kl(student, teacher, TRAIN[:4]) < 0.8 * before


def test_kl_needs_a_teacher_and_settings_are_checked():
    _, student = pruned_pair("llama", dict(structure="2:4", method="magnitude"))
    with pytest.raises(SurgeonError, match="teacher"):
        Distillation(student, None, TRAIN, Distill(lr=1e-3))
    with pytest.raises(SurgeonError, match="loss='mse'"):
        Distill(lr=1e-3, loss="mse")
    with pytest.raises(SurgeonError, match="hidden_weight"):
        Distill(lr=1e-3, loss="next-token", hidden_weight=1.0)
    with pytest.raises(SurgeonError, match="lr=0: must be positive"):
        Distill(lr=0)
    from surgeon.app.settings import RecoverConfig

    assert RecoverConfig(run="run", lr=3e-4, lora_rank=4).distill() == Distill(lr=3e-4, lora_rank=4)
    assert RecoverConfig(run="run").distill().lr == 1e-4  # each mode's own default learning rate
    assert RecoverConfig(run="run", lora_rank=4).distill().lr == 1e-3
    from surgeon.app.recover import recover_fingerprint

    # --resume continues a run whether its default learning rate was written out, and no other rate's
    assert recover_fingerprint(RecoverConfig(run="run")) == recover_fingerprint(RecoverConfig(run="run", lr=1e-4))
    assert recover_fingerprint(RecoverConfig(run="run")) != recover_fingerprint(RecoverConfig(run="run", lr=1e-3))
    for bad, message in ((dict(lr=-1.0), "lr=-1.0"), (dict(lora_rank=-1), "lora_rank=-1"),
                         (dict(loss="next-token", hidden_weight=0.5), "hidden_weight=0.5"),
                         (dict(mixed_precision="fp16"), "mixed_precision='fp16'"),
                         (dict(dtype="bfloat16", mixed_precision="bf16"), "mixed_precision=bf16")):
        with pytest.raises(ValueError, match=message):  # the command's settings refuse what the training would
            RecoverConfig(run="run", **bad)


def test_the_top_k_kl_is_the_kl_over_the_teachers_top_k_and_the_rest_as_one_outcome():
    """Over the whole vocabulary it is the KL; over fewer tokens, the KL of the two distributions with every other
    token merged into one outcome, which is never more; zero where the student is the teacher."""
    generator = torch.Generator().manual_seed(0)
    teacher, student = (torch.randn(2, 5, 40, generator=generator, dtype=torch.float64) * 3 for _ in range(2))
    full = kl_loss(student, teacher)
    torch.testing.assert_close(top_k_kl(student, *top_k_targets(teacher, 40)), full)
    values, indices, rest = top_k_targets(teacher, 6)
    assert values.shape == (2, 5, 6) and indices.dtype == torch.int32 and rest.shape == (2, 5)
    p, q = teacher.softmax(-1), student.softmax(-1)
    top = indices.long()
    merged = [torch.cat([d.gather(-1, top), 1 - d.gather(-1, top).sum(-1, keepdim=True)], -1) for d in (p, q)]
    by_hand = (merged[0] * (merged[0].log() - merged[1].log())).sum(-1).mean()
    torch.testing.assert_close(top_k_kl(student, values, indices, rest), by_hand)
    assert 0 < float(top_k_kl(student, values, indices, rest)) < float(full)
    assert float(top_k_kl(teacher, values, indices, rest)) == pytest.approx(0, abs=1e-12)


def test_a_student_trained_on_the_teachers_top_k_over_the_vocabulary_trains_as_beside_it():
    """With K the vocabulary the cached targets give the KL itself, so the run is the one beside the teacher, whose
    targets are computed once, before training, for every batch in its order."""
    runs = []
    for top_k in (0, 96):
        teacher, student = pruned_pair("llama", dict(structure="2:4", method="magnitude"))
        settings = Distill(lr=1e-3, batch_size=2, teacher_top_k=top_k)
        if top_k:
            targets = teacher_targets(teacher, TRAIN, settings, progress=False)
            assert len(targets) == 12 and targets[0][0].shape == (2, 24, 96)
            run = Distillation(student, None, TRAIN, settings, targets=targets)
        else:
            run = Distillation(student, teacher, TRAIN, settings)
        report = run.run(progress=False)
        runs.append((report.losses, {name: param.detach().clone() for name, param in student.named_parameters()}))
    (losses, weights), (cached, cached_weights) = runs
    assert cached == pytest.approx(losses, rel=1e-4)
    assert all(torch.allclose(cached_weights[name], weights[name], atol=1e-5) for name in weights)
    with pytest.raises(SurgeonError, match="teacher_top_k=8: .* without the hidden-state term"):
        Distill(lr=1e-3, teacher_top_k=8, hidden_weight=0.5)
    with pytest.raises(SurgeonError, match="teacher_top_k=8"):
        Distill(lr=1e-3, teacher_top_k=8, loss="next-token")


def block_error(student: torch.nn.Module, teacher: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        states = [model(input_ids=ids, output_hidden_states=True).hidden_states[1:] for model in (student, teacher)]
    return float(hidden_loss(*states))


def test_the_hidden_state_term_pulls_the_blocks_outputs_toward_the_teacher_and_the_report_keeps_the_kl():
    teacher, student = pruned_pair("llama", dict(structure="structured", target_size=0.6, shots=1))
    states = teacher(input_ids=TRAIN[:2], output_hidden_states=True).hidden_states
    assert len(states) == len(decoder_blocks(teacher)) + 1 and float(hidden_loss(states, states)) == 0
    zeros = {name: mask.clone() for name, mask in pruned_masks(student).items()}
    runs = {weight: copy.deepcopy(student) for weight in (0.0, 10.0)}
    reports = {weight: distill(model, teacher, TRAIN, Distill(lr=1e-3, batch_size=2, hidden_weight=weight),
                               progress=False) for weight, model in runs.items()}
    assert reports[0.0].losses[0] == reports[10.0].losses[0]  # the same first batch: its KL, not the objective
    errors = {weight: block_error(model, teacher, TRAIN[:4]) for weight, model in runs.items()}
    assert errors[10.0] < 0.97 * errors[0.0] and errors[10.0] < 0.8 * block_error(student, teacher, TRAIN[:4])
    params = dict(runs[10.0].named_parameters())
    assert all(torch.equal(params[name].detach() == 0, ~kept) for name, kept in zeros.items())


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_recovery_continued_from_its_state_after_a_step_ends_as_the_uninterrupted_one(lora_rank):
    teacher, pruned = pruned_pair("llama", dict(structure="2:4", method="magnitude"))
    settings = Distill(lr=1e-3, batch_size=2, lora_rank=lora_rank)
    whole = copy.deepcopy(pruned)
    distill(whole, teacher, TRAIN, settings, progress=False)
    first = copy.deepcopy(pruned)
    saved = {}

    class Stop(Exception):
        pass

    def stop(report):
        if len(report.losses) == 5:
            saved.update(copy.deepcopy(interrupted.state()))
            raise Stop

    interrupted = Distillation(first, teacher, TRAIN, settings)
    with pytest.raises(Stop):
        interrupted.run(progress=False, after_step=stop)
    second = copy.deepcopy(pruned)
    continued = Distillation(second, teacher, TRAIN, settings)
    continued.restore(saved)
    report = continued.run(progress=False)
    assert len(report.losses) == 12 and report.tokens == TRAIN.numel()
    for (name, got), expected in zip(second.named_parameters(), whole.parameters(), strict=True):
        assert torch.equal(got, expected), name


def test_a_dense_parameter_is_not_masked_and_the_teacher_does_not_train():
    teacher, student = tiny_model("llama"), tiny_model("llama")
    with torch.no_grad():
        decoder_blocks(student)[0].mlp.down_proj.weight[:, :3] = 0
    frozen = {name: param.detach().clone() for name, param in teacher.named_parameters()}
    assert list(pruned_masks(student)) == ["model.layers.0.mlp.down_proj.weight"]
    seen = []
    distill(student, teacher, TRAIN[:4], Distill(lr=1e-4, batch_size=3), progress=False,
            after_step=lambda report: seen.append((report.tokens, len(report.losses))))
    assert seen == [(3 * 24, 1), (4 * 24, 2)]  # after each step, the report so far
    assert all(torch.equal(param, frozen[name]) for name, param in teacher.named_parameters())
    assert bool((decoder_blocks(student)[0].mlp.down_proj.weight[:, :3] == 0).all())


def test_recover_trains_a_pruned_run_and_its_compact_export_is_as_small(tiny_model_dir, tmp_path, capsys):
    from surgeon.app.cli import main

    pruned, recovered = tmp_path / "pruned", tmp_path / "recovered"
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "coupled", "--layout", "uniform",
                 "--target-size", "0.7", "--shots", "1", "--nsamples", "2", "--seqlen", "32", "--calibration",
                 "wikitext2-valid", "--eval-windows", "1", "--output", str(pruned)]) == 0
    assert main(["--quiet", "recover", str(pruned), "--output", str(recovered), "--tokens", "256", "--seqlen", "32",
                 "--lr", "1e-3"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    report = json.loads((recovered / "report.json").read_text())
    assert last.startswith(f"perplexity {report['ppl_before']:.4f} -> {report['ppl_after']:.4f}")
    assert report["tokens"] == 256 and len(report["losses"]) == 8 and report["kept_zeros"] > 0
    assert report["ppl_before"] == pytest.approx(json.loads((pruned / "report.json").read_text())["ppl_after"])
    exports = []
    for folder in (pruned, recovered):
        compact = tmp_path / f"{folder.name}-compact"
        assert main(["--quiet", "export", str(folder), "--compact", "--output", str(compact)]) == 0
        exports.append(json.loads((compact / "report.json").read_text())["export"])
    assert exports[0]["parameters"] == exports[1]["parameters"] < exports[0]["parameters_before"]


def recover_recorded(tiny_model_dir, tmp_path, monkeypatch, *options: str) -> tuple[list[tuple], dict]:
    """`surgeon recover` of a tiny 2:4 run with `options`: the (student, teacher, settings, targets) each Distillation
    was made with, and the recovery's report."""
    from surgeon.app import recover
    from surgeon.app.cli import main

    made = []
    distillation = recover.Distillation

    def recorded(student, teacher, windows, settings, group, targets):
        made.append((student, teacher, settings, targets))
        return distillation(student, teacher, windows, settings, group, targets)

    monkeypatch.setattr(recover, "Distillation", recorded)
    pruned, recovered = tmp_path / "pruned", tmp_path / "recovered"
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "2:4", "--method", "magnitude",
                 "--nsamples", "2", "--seqlen", "32", "--calibration", "wikitext2-valid", "--eval-windows", "1",
                 "--output", str(pruned)]) == 0
    assert main(["--quiet", "recover", str(pruned), "--output", str(recovered), "--seqlen", "32", *options]) == 0
    return made, json.loads((recovered / "report.json").read_text())


def test_recover_on_the_teachers_top_k_trains_without_the_teacher(tiny_model_dir, tmp_path, monkeypatch):
    made, report = recover_recorded(tiny_model_dir, tmp_path, monkeypatch, "--tokens", "128", "--teacher-top-k", "8")
    # the teacher's targets for the 4 steps, and no teacher beside the student
    assert [(teacher, len(targets)) for _, teacher, _, targets in made] == [(None, 4)]
    assert report["recover"]["teacher_top_k"] == 8 and len(report["losses"]) == 4 and report["kept_zeros"] > 0
    assert report["recover"]["lr"] == 1e-4  # the rate it trained at, its default written out


def test_recover_in_bf16_mixed_precision_holds_the_teacher_in_bfloat16_and_trains_float32_weights(
        tiny_model_dir, tmp_path, monkeypatch):
    made, report = recover_recorded(tiny_model_dir, tmp_path, monkeypatch, "--tokens", "64",
                                    "--mixed-precision", "bf16")
    [(student, teacher, settings, _)] = made
    assert settings.mixed_precision == "bf16" and next(teacher.parameters()).dtype == torch.bfloat16
    assert {param.dtype for param in student.parameters()} == {torch.float32}
    assert report["recover"]["mixed_precision"] == "bf16"


def test_recover_refuses_training_text_that_the_evaluation_reads(tiny_model_dir, tmp_path, capsys):
    from surgeon.app.cli import main
    from surgeon.app.data import evaluation_text

    pruned = tmp_path / "pruned"
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "unstructured", "--target-size",
                 "0.5", "--shots", "1", "--nsamples", "1", "--seqlen", "32", "--calibration", "wikitext2-valid",
                 "--eval-windows", "1", "--output", str(pruned)]) == 0
    copied = tmp_path / "test.txt"
    copied.write_text(evaluation_text("wikitext2").text[:100_000])
    assert main(["recover", str(pruned), "--output", str(tmp_path / "out"), "--text", str(copied)]) == 2
    assert "shares" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_recover_resumes_after_its_last_checkpoint_and_ends_as_an_uninterrupted_run(tiny_model_dir, tmp_path,
                                                                                      monkeypatch, capsys):
    from safetensors.torch import load_file

    from surgeon.app import recover
    from surgeon.app.cli import EXIT_SIGINT, main

    pruned = tmp_path / "pruned"
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "2:4", "--shots", "1",
                 "--nsamples", "1", "--seqlen", "32", "--calibration", "wikitext2-valid", "--eval-windows", "1",
                 "--output", str(pruned)]) == 0
    options = ["--tokens", "192", "--seqlen", "32", "--lr", "1e-3", "--checkpoint-steps", "2"]
    assert main(["--quiet", "recover", str(pruned), "--output", str(tmp_path / "whole"), *options]) == 0
    assert not (tmp_path / "whole" / "checkpoint.json").exists()  # removed once the run finished
    save = recover._save

    def save_then_stop(*args):
        save(*args)
        raise KeyboardInterrupt

    monkeypatch.setattr(recover, "_save", save_then_stop)
    assert main(["--quiet", "recover", str(pruned), "--output", str(tmp_path / "cut"), *options]) == EXIT_SIGINT
    monkeypatch.setattr(recover, "_save", save)
    assert json.loads((tmp_path / "cut" / "checkpoint.json").read_text())["step"] == 2
    assert not (tmp_path / "cut" / "report.json").exists()
    assert main(["recover", str(pruned), "--output", str(tmp_path / "cut"), *options]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["recover", str(pruned), "--output", str(tmp_path / "cut"), *options, "--lr", "2e-3",
                 "--resume"]) == 2
    assert "lr: 0.001 → 0.002" in capsys.readouterr().err
    assert main(["--quiet", "recover", str(pruned), "--output", str(tmp_path / "cut"), *options, "--resume"]) == 0
    whole, cut = (load_file(tmp_path / name / "model.safetensors") for name in ("whole", "cut"))
    assert whole.keys() == cut.keys() and all(torch.equal(whole[key], cut[key]) for key in whole)
    reports = [json.loads((tmp_path / name / "report.json").read_text()) for name in ("whole", "cut")]
    assert reports[0]["losses"] == reports[1]["losses"] and len(reports[0]["losses"]) == 6
    assert not (tmp_path / "cut" / "checkpoint.json").exists() and not (tmp_path / "cut" / recover.TENSORS).exists()


def test_prune_recovers_in_one_flag_into_its_output(tiny_model_dir, tmp_path, capsys):
    from surgeon.app.cli import main

    out = tmp_path / "pruned"
    assert main(["prune", "--model", str(tiny_model_dir), "--structure", "2:4", "--shots", "1", "--nsamples", "1",
                 "--seqlen", "32", "--calibration", "wikitext2-valid", "--eval-windows", "1", "--output", str(out),
                 "--recover-tokens", "100"]) == 2
    assert "--recover-tokens" in capsys.readouterr().err and not out.exists()  # less than a window: refused first
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "2:4", "--shots", "1",
                 "--nsamples", "1", "--seqlen", "32", "--calibration", "wikitext2-valid", "--eval-windows", "1",
                 "--output", str(out), "--recover-tokens", "1024"]) == 0
    report = json.loads((out / "recovered" / "report.json").read_text())
    assert report["tokens"] == 1024 and report["pruned_from"] == str(out)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("recovered: perplexity")


def test_the_recovery_benchmark_scores_each_point_on_the_test_and_on_the_tuning_articles(tiny_model_dir, tmp_path,
                                                                                          monkeypatch):
    """Each point of a recovery curve has the test perplexity and the tuning articles' (which settings are chosen
    by, and no training window reads), both moved by the training."""
    from bench.quality import recovery

    output = tmp_path / "curve.json"
    monkeypatch.setattr(sys, "argv", ["recovery", "--model", str(tiny_model_dir), "--structure", "unstructured",
                                      "--target-size", "0.5", "--tokens", "256", "--every", "128", "--seqlen", "64",
                                      "--lr", "1e-2", "--eval-windows", "1", "--eval-seqlen", "64",
                                      "--calib-windows", "2", "--calib-seqlen", "64", "--output", str(output)])
    recovery.main()
    curve = json.loads(output.read_text())["curve"]
    assert [point["tokens"] for point in curve] == [0, 128, 256]
    assert all(math.isfinite(point["ppl"]) and math.isfinite(point["tuning_ppl"]) for point in curve)
    assert curve[-1]["tuning_ppl"] != curve[0]["tuning_ppl"] and curve[0]["tuning_ppl"] != curve[0]["ppl"]


def test_the_recovery_benchmark_starts_a_later_run_from_the_saved_prune(tiny_model_dir, tmp_path, monkeypatch):
    """With `--pruned`, the first run saves its pruned model and a later run of the same prune loads it instead of
    pruning again, so both start from the same perplexity and name the same method's model."""
    from bench.quality import recovery

    def run(output: Path, *seed: str) -> dict:
        monkeypatch.setattr(sys, "argv", ["recovery", "--model", str(tiny_model_dir), "--structure", "2:4",
                                          "--tokens", "64", "--every", "64", "--seqlen", "64", "--eval-windows", "1",
                                          "--eval-seqlen", "64", "--calib-windows", "2", "--calib-seqlen", "64",
                                          "--pruned", str(tmp_path / "pruned"), "--output", str(output), *seed])
        recovery.main()
        return json.loads(output.read_text())

    first = run(tmp_path / "first.json")
    assert [path.name for path in (tmp_path / "pruned").iterdir()] == [f"{tiny_model_dir.name}-2of4-0.5-2x64.pt"]

    def pruned_again(*args, **kwargs):
        raise AssertionError("pruned again")

    monkeypatch.setattr(recovery, "prune", pruned_again)
    second = run(tmp_path / "second.json")
    assert second["curve"][0]["ppl"] == first["curve"][0]["ppl"] != first["ppl_dense"]
    assert second["prune_seconds"] == first["prune_seconds"]
    assert second["kept"] == first["kept"] in ("surgeon", "sparsegpt-refine")  # whose model recovery starts from
    assert second["losses"] == first["losses"] and first["seed"] == 0
    seeded = run(tmp_path / "seeded.json", "--seed", "1")  # other training windows, from the same pruned model
    assert seeded["curve"][0]["ppl"] == first["curve"][0]["ppl"] and seeded["losses"] != first["losses"]
    assert seeded["seed"] == 1


def test_a_recovery_run_is_named_by_its_prune_schedule_settings_and_seed():
    """Runs that differ in the calibration budget, the schedule, a setting or the seed are saved apart (an existing
    file is skipped), and the protocol's own values add nothing to the name."""
    import argparse

    from bench.quality import recovery
    from surgeon import PruneConfig

    def named(**changes) -> str:
        args = argparse.Namespace(**{"model": "smollm2-135m", "structure": "2:4", "calib_windows": None,
                                     "calib_seqlen": None, "tokens": recovery.TOKENS, "seed": 0, **changes})
        variant = {**recovery.DEFAULTS, **{key: value for key, value in changes.items() if key in recovery.DEFAULTS}}
        return recovery.name(args, PruneConfig(structure="2:4"), variant)

    assert named() == "2of4-0.5"
    assert named(calib_windows=128, calib_seqlen=2048, tokens=147456, seed=1) == "2of4-0.5-128x2048-147456tokens-seed1"
    assert named(lr=1e-3, lora_rank=16) == "2of4-0.5-lr0.001-lora16"
