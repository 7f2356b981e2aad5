"""`surgeon report`: figures, summary and mask equivalence of real (tiny) pruning runs; bad input in one line."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from surgeon.app.cli import main
from surgeon.app.figures import KEPT, PPL, TIME, kept_by_type, mask_equivalence, time_stack
from tests._helpers import one_error_line, run_cli

COMMON = ["--nsamples", "2", "--seqlen", "64", "--calibration", "wikitext2-valid", "--eval-windows", "1"]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """A structured run evaluated after every shot, and an unstructured run of the same model."""
    root = tmp_path_factory.mktemp("runs")
    structured, unstructured = root / "structured", root / "unstructured"
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "structured", "--target-size",
                 "0.7", "--shots", "2", "--eval-every-shot", *COMMON, "--output", str(structured)]) == 0
    assert main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "unstructured", "--target-size",
                 "0.5", "--shots", "1", *COMMON, "--output", str(unstructured)]) == 0
    return structured, unstructured


def zero_masks(folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    names = json.loads((folder / "report.json").read_text())["layers"]
    return {name: model.get_submodule(name).weight == 0 for name in names}


def test_every_shot_is_evaluated(runs):
    report = json.loads((runs[0] / "report.json").read_text())
    assert [s["ppl"] is not None for s in report["shots"]] == [True, True]
    assert report["shots"][-1]["ppl"] == pytest.approx(report["ppl_after"], rel=1e-6)


def test_report_draws_the_figures_and_the_summary(runs, tmp_path):
    import matplotlib.image

    out = tmp_path / "report"
    assert main(["--quiet", "report", str(runs[0]), "--compare", str(runs[1]), "--output", str(out)]) == 0
    for name in (KEPT, PPL, TIME):
        height, width, _ = matplotlib.image.imread(out / name).shape
        assert height > 300 and width > 600
    summary = (out / "summary.md").read_text()
    report = json.loads((runs[0] / "report.json").read_text())
    assert f"{report['ppl_before']:.4f} → {report['ppl_after']:.4f}" in summary
    assert f"![{PPL}]({PPL})" in summary and "## Mask equivalence" in summary


def test_a_run_without_per_shot_perplexity_has_no_perplexity_figure(runs, tmp_path):
    out = tmp_path / "report"
    assert main(["--quiet", "report", str(runs[1]), "--output", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([KEPT, TIME, "summary.md"])
    assert "prune with `--eval-every-shot`" in (out / "summary.md").read_text()


def test_kept_fractions_are_the_reports(runs):
    report = json.loads((runs[0] / "report.json").read_text())
    kept = kept_by_type(report)
    assert sum(len(points) for points in kept.values()) == len(report["layers"])
    for name, removed in report["layers"].items():
        block, kind = int(name.split(".")[2]), name.rsplit(".", 1)[-1]
        assert (block, 1 - removed) in kept[kind]


def test_time_stack_counts_every_second_once(runs):
    for shot in json.loads((runs[0] / "report.json").read_text())["shots"]:
        seconds = shot["seconds"]
        assert {"costs", "threshold", "update"} <= set(seconds)  # timed inside "prune"
        stack = time_stack(seconds)
        assert "prune" not in stack and stack["prune, other"] >= 0
        assert sum(stack.values()) == pytest.approx(seconds["curvature"] + seconds["prune"])
    assert time_stack({"curvature": 2.0, "prune": 3.0}) == {"curvature": 2.0, "prune, other": 3.0}


def test_mask_equivalence_counts_weights_zero_in_both(runs):
    ours, theirs = zero_masks(runs[0]), zero_masks(runs[1])
    both = sum(int((ours[n] & theirs[n]).sum()) for n in ours)
    total = sum(m.numel() for m in ours.values())
    equivalence = mask_equivalence(*runs)
    assert equivalence["overall"] == pytest.approx(both / total, rel=1e-12)
    assert 0 < equivalence["overall"] < min(float(torch.cat([m.flatten() for m in ms.values()]).float().mean())
                                            for ms in (ours, theirs))
    own = json.loads((runs[1] / "report.json").read_text())["zero_fraction"]
    assert mask_equivalence(runs[1], runs[1])["overall"] == pytest.approx(own, rel=1e-12)


@pytest.mark.parametrize("case,message", [
    ("not-a-run", "is not a `surgeon prune` output folder"),
    ("other-model", "pruned different layers"),
    ("output-not-empty", "is not empty"),
])
def test_bad_input_is_one_line_and_writes_nothing(case, message, runs, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    args = [str(runs[0]), "--output", str(out)]
    if case == "not-a-run":
        args[0] = str(tiny_model_dir)
    elif case == "other-model":
        other = tmp_path / "other"
        other.mkdir()
        (other / "report.json").write_text(json.dumps({"layers": {"model.layers.0.mlp.up_proj": 0.5}, "shots": [{}]}))
        args += ["--compare", str(other)]
    else:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    assert message in one_error_line(run_cli("report", *args))
    assert [p.name for p in out.iterdir()] == ["keep.txt"] if case == "output-not-empty" else not out.exists()
    assert not list(tmp_path.glob(".out.*"))


def test_missing_matplotlib_is_named(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", str(runs[0]), "--output", str(tmp_path / "out")]) == 2
    assert "pip install 'llm-surgeon[report]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
