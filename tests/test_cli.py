"""The command line: eval and prune on a tiny saved model, and one-line errors on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from surgeon.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "surgeon", *args], capture_output=True, text=True)


def test_eval_writes_json(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = main(["--quiet", "eval", "--model", str(tiny_model_dir), "--seqlen", "128", "--eval-windows", "2",
                 "--output", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["windows"] == 2 and data["tokens"] == 256 and data["ppl"] > 1000  # random weights
    assert "perplexity" in capsys.readouterr().out


def test_prune_writes_report_and_loadable_checkpoint(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "pruned"
    code = main(["--quiet", "prune", "--model", str(tiny_model_dir), "--structure", "structured",
                 "--target-size", "0.7", "--shots", "2", "--nsamples", "2", "--seqlen", "64",
                 "--calibration", "wikitext2-valid", "--eval-windows", "1", "--output", str(out)])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    for key in ("ppl_before", "ppl_after", "sparsity", "layers", "shots"):
        assert key in report
    assert abs(report["sparsity"] - 0.3) < 0.05 and len(report["shots"]) == 2
    model = AutoModelForCausalLM.from_pretrained(out)
    zeros = [(m.weight == 0).float().mean().item() for n, m in model.named_modules() if n in report["layers"]]
    assert zeros == pytest.approx(list(report["layers"].values()))
    assert not list(tmp_path.glob(".pruned.*"))  # no temporary leftovers


@pytest.mark.parametrize("args,message", [
    (["eval", "--model", "/no/such/model"], "does not exist"),
    (["eval", "--model", "missing.gguf"], "does not exist"),
    (["eval", "--model", "smollm2-135m", "--dataset", "/no/such/file.txt"], "does not exist"),
    (["prune", "--target-size", "1.5", "--output", "x"], "target_size"),
    (["prune", "--shots", "0", "--output", "x"], "shots"),
])
def test_bad_input_one_line_error(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("surgeon: error:")
    assert message in result.stderr


def test_seqlen_longer_than_model_allows(tiny_model_dir):
    result = run_cli("eval", "--model", str(tiny_model_dir), "--seqlen", "512")
    assert result.returncode == 2 and "longer than the model allows" in result.stderr


def test_help_documents_prune_options():
    result = run_cli("prune", "--help")
    for option in ("--structure", "--target-size", "--shots", "--method", "--max-correlate", "--correlation",
                   "--nsamples", "--seqlen", "--calibration", "--eval-windows", "--device", "--seed", "--output"):
        assert option in result.stdout


def test_write_directory_is_atomic(tmp_path):
    from surgeon.io import write_directory

    target = tmp_path / "out"
    write_directory(target, lambda d: (d / "a.txt").write_text("first"))
    assert (target / "a.txt").read_text() == "first"

    def broken(directory):
        (directory / "a.txt").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_directory(target, broken)
    assert (target / "a.txt").read_text() == "first"  # the old result is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary leftovers
    write_directory(target, lambda d: (d / "b.txt").write_text("second"))
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask
