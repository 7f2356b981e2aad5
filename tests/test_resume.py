"""Resumable runs: a run stopped after any shot, or killed with SIGKILL, continues to the uninterrupted result."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from surgeon import PruneConfig, prune
from surgeon.app.cli import main
from surgeon.pruning.resume import STATE, Checkpoint, read_state
from tests._helpers import one_error_line, run_cli, tiny_model

pytestmark = pytest.mark.slow  # whole runs stopped and continued, some in subprocesses

WINDOWS = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(0))
HELD_OUT = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
FINGERPRINT = {"test": 1}


class Stop(Exception):
    """Stands for a run that dies after a shot."""


def weights(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("arch, settings", [
    ("llama", dict(structure="structured", target_size=0.6)),
    ("opt", dict(structure="structured", target_size=0.6)),
    ("llama", dict(structure="unstructured", target_size=0.5)),
    ("llama", dict(structure="2:4")),
    ("llama", dict(structure="unstructured", target_size=0.5, lora_steps=2)),
])
@pytest.mark.parametrize("stop_after", [1, 3])
def test_a_run_continued_after_any_shot_equals_the_uninterrupted_run(arch, settings, stop_after, tmp_path):
    """Unstructured and 2:4 are weighed against sparsegpt-refine on held-out windows: the continued run weighs the
    same two models."""
    config = PruneConfig(shots=4, **settings)
    uninterrupted = tiny_model(arch)
    expected = prune(uninterrupted, WINDOWS, config, progress=False, held_out_ids=HELD_OUT)
    assert (expected.choice is not None) == config.chooses

    def stop(shot):
        if shot.shot == stop_after + 1:  # the checkpoint of shot `stop_after` is on disk, this shot's is not
            raise Stop

    with pytest.raises(Stop):
        prune(tiny_model(arch), WINDOWS, config, progress=False, after_shot=stop,
              checkpoint=Checkpoint(tmp_path, FINGERPRINT), held_out_ids=HELD_OUT)
    assert json.loads((tmp_path / STATE).read_text())["shot"] == stop_after
    model = tiny_model(arch)
    continued = prune(model, WINDOWS, config, progress=False, held_out_ids=HELD_OUT,
                      checkpoint=Checkpoint(tmp_path, FINGERPRINT, state=read_state(tmp_path, FINGERPRINT)))
    for name, value in weights(uninterrupted).items():
        assert torch.equal(value, weights(model)[name]), name
    assert [s.sparsity for s in continued.shots] == [s.sparsity for s in expected.shots]
    assert continued.layers == expected.layers
    assert (continued.choice or {}).get("held_out_loss") == (expected.choice or {}).get("held_out_loss")
    assert len(list(tmp_path.glob("checkpoint-shot-*.safetensors"))) == 1


def test_checkpoints_every_n_shots_keep_only_the_newest(tmp_path):
    config = PruneConfig(structure="structured", target_size=0.6, shots=5)
    saved = []
    checkpoint = Checkpoint(tmp_path, FINGERPRINT, every=2)
    prune(tiny_model("llama"), WINDOWS, config, progress=False,
          after_shot=lambda shot: saved.append(json.loads((tmp_path / STATE).read_text())["shot"]
                                               if (tmp_path / STATE).exists() else None),
          checkpoint=checkpoint)
    assert saved == [None, None, 2, 2, 4]  # read before each shot's own save; the last shot (5) is saved too
    assert json.loads((tmp_path / STATE).read_text())["shot"] == 5
    assert [p.name for p in tmp_path.glob("checkpoint-shot-*")] == ["checkpoint-shot-0005.safetensors"]


PRUNE = ["--quiet", "prune", "--structure", "unstructured", "--target-size", "0.5", "--shots", "4",
         "--nsamples", "8", "--seqlen", "64", "--calibration", "wikitext2-valid", "--eval-windows", "1"]


def test_sigkill_in_a_shot_then_resume_equals_the_uninterrupted_run(tiny_model_dir, tmp_path):
    model = ["--model", str(tiny_model_dir)]
    assert main([*PRUNE, *model, "--output", str(tmp_path / "whole")]) == 0
    out = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, "-m", "surgeon", *PRUNE, *model, "--output", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if json.loads((out / STATE).read_text())["shot"] >= 2:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (out / "report.json").exists()  # a killed run never looks finished
    assert main(["export", str(out), "--compact", "--output", str(tmp_path / "x")]) == 2
    assert main([*PRUNE, *model, "--output", str(out), "--resume"]) == 0
    whole, resumed = load_file(tmp_path / "whole" / "model.safetensors"), load_file(out / "model.safetensors")
    assert whole.keys() == resumed.keys()
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
    report = json.loads((out / "report.json").read_text())
    assert report["ppl_before"] == json.loads((tmp_path / "whole" / "report.json").read_text())["ppl_before"]
    assert len(report["shots"]) == 4
    assert not list(out.glob("checkpoint*")) and not list(out.glob(".checkpoint*"))


def stopped_run(folder, fingerprint, config: PruneConfig) -> None:
    """An unfinished run in `folder`: its checkpoint after shot 1."""

    def stop(shot):
        if shot.shot == 2:
            raise Stop

    with pytest.raises(Stop):
        prune(tiny_model("llama"), WINDOWS, config, progress=False, after_shot=stop,
              checkpoint=Checkpoint(folder, fingerprint))


def test_resume_refuses_what_it_cannot_continue(tiny_model_dir, tmp_path):
    from surgeon.app.cli import _build, build_parser
    from surgeon.app.run import run_fingerprint
    from surgeon.app.settings import RunConfig

    options = [*PRUNE, "--model", str(tiny_model_dir)]

    def refusal(output, *extra: str) -> str:
        return one_error_line(run_cli(*options, "--output", str(output), *extra))

    assert "holds no run to resume" in refusal(tmp_path / "empty", "--resume")
    done = tmp_path / "done"
    assert main([*options, "--output", str(done)]) == 0
    assert "holds a finished run" in refusal(done, "--resume")
    stopped = tmp_path / "stopped"
    args = build_parser().parse_args([*options[1:], "--output", str(stopped)])
    config = _build(PruneConfig, args)
    stopped_run(stopped, run_fingerprint(_build(RunConfig, args), config), config)
    assert "holds an unfinished run: pass --resume" in refusal(stopped)
    changed = refusal(stopped, "--resume", "--damp-g", "0.2", "--nsamples", "4")
    assert "another configuration (prune.damp_g: 0.1 → 0.2; run.nsamples: 8 → 4)" in changed
    assert json.loads((stopped / STATE).read_text())["shot"] == 1  # refusals change nothing
    # memory options change no result: a run stopped for want of memory continues with them
    run = _build(RunConfig, args)
    lean = dataclasses.replace(config, activation_checkpointing=True, offload=True, block_groups=2,
                               structure="structured")
    plain = dataclasses.replace(lean, activation_checkpointing=False, offload=False, block_groups=1)
    assert run_fingerprint(run, lean) == run_fingerprint(run, plain)
    assert run_fingerprint(run, lean) != run_fingerprint(run, dataclasses.replace(lean, damp_a=0.02))
