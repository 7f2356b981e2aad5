"""Recovery by distillation: what pruning removed stays removed, the student approaches the teacher, and the command
writes a checkpoint that exports as small as the pruned one, trained on text the evaluation never reads."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from surgeon import PruneConfig, prune
from surgeon.models.adapter import decoder_blocks
from surgeon.recovery.distill import Distill, distill, kl_loss, pruned_masks
from tests._helpers import tiny_model

WINDOWS = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(0))
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
    teacher = tiny_model(arch)
    with torch.no_grad():  # sharper next-token distributions than a random model's nearly uniform ones
        for param in teacher.parameters():
            if param.dim() == 2:
                param.mul_(4)
    student = copy.deepcopy(teacher)
    prune(student, WINDOWS, PruneConfig(**settings), progress=False)
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


def test_a_dense_parameter_is_not_masked_and_the_teacher_does_not_train():
    teacher, student = tiny_model("llama"), tiny_model("llama")
    with torch.no_grad():
        decoder_blocks(student)[0].mlp.down_proj.weight[:, :3] = 0
    frozen = {name: param.detach().clone() for name, param in teacher.named_parameters()}
    assert list(pruned_masks(student)) == ["model.layers.0.mlp.down_proj.weight"]
    seen = []
    distill(student, teacher, TRAIN[:4], Distill(batch_size=3), progress=False,
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
