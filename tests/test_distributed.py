"""Pruning split over two torchrun processes (gloo on the CPU) equals the one-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from surgeon import PruneConfig, prune
from surgeon.method.threshold import smallest_k
from surgeon.pruning.report import PruneReport
from surgeon.recovery.distill import distill
from tests import distributed_worker
from tests._helpers import one_error_line, pruned_pair, run_cli, tiny_model

pytestmark = pytest.mark.slow  # torchrun launches processes

ROOT = Path(__file__).resolve().parent.parent


def torchrun(*args: str, ranks: int = 2) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node ranks ARGS` from the repository root, one thread per rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                           "--standalone", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """The same weights up to the order in which the ranks' factor sums are added: 1e-4 of their norm (measured
    at most 3e-5 on these models)."""
    return float((got - expected).norm()) <= 1e-4 * float(expected.norm())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """What `tests/distributed_worker.py` produced on two ranks."""
    out = tmp_path_factory.mktemp("distributed") / "results.pt"
    result = torchrun("-m", "tests.distributed_worker", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out)


def one_process(case: str) -> tuple[torch.nn.Module, PruneReport]:
    """A case of `distributed_worker` pruned in this process alone, on one thread as each rank runs (a matmul's
    summation order may depend on its threads)."""
    arch, settings = distributed_worker.CASES[case]
    model = tiny_model(arch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return model, prune(model, distributed_worker.WINDOWS, PruneConfig(**{"shots": 3, **settings}), progress=False)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("case", list(distributed_worker.CASES))
def test_two_ranks_prune_as_one_process(two_ranks, case):
    model, report = one_process(case)
    got = two_ranks[case]
    for name, value in model.named_parameters():
        assert torch.equal(got["params"][name] == 0, value == 0), name  # the same structures removed
        assert close(got["params"][name], value.detach()), name
    assert got["sparsity"] == [shot.sparsity for shot in report.shots]
    assert all(seconds > 0 for seconds in got["collectives"])
    assert all("collectives" not in shot.seconds for shot in report.shots)  # one process: no collectives
    if case in distributed_worker.BLOCKS:  # every rank ran every batch: one process's factors, bit for bit
        for name, value in model.named_parameters():
            assert torch.equal(got["params"][name], value.detach()), name


@pytest.mark.parametrize("case", distributed_worker.FSDP)
def test_two_ranks_with_weights_sharded_by_fsdp2_prune_as_one_process(two_ranks, case):
    model, report = one_process(case)
    got = two_ranks["fsdp"][case]
    for name, value in model.named_parameters():
        assert torch.equal(got["params"][name] == 0, value == 0), name
        assert close(got["params"][name], value.detach()), name
    assert got["sparsity"] == [shot.sparsity for shot in report.shots]
    assert got["zero_fraction"] == report.zero_fraction
    assert all(seconds > 0 for seconds in got["collectives"])


@pytest.mark.parametrize("fsdp", [False, True])
def test_two_ranks_stopped_after_a_shot_resume_to_the_same_model(two_ranks, fsdp):
    model, _ = one_process("llama-unstructured")
    for name, value in model.named_parameters():
        assert close(two_ranks["resumed"][fsdp][name], value.detach()), name


@pytest.mark.parametrize("k", [3, 5, 7])
def test_the_distributed_threshold_takes_ties_in_layer_order(two_ranks, k):
    expected = [mask() for mask in smallest_k(distributed_worker.TIED, k)]
    assert [m.tolist() for m in two_ranks["tied"][k]] == [m.tolist() for m in expected]
    assert sum(int(m.sum()) for m in expected) == k


def test_what_a_group_cannot_run_is_refused(two_ranks):
    lora, batches, uneven = two_ranks["refusals"]
    assert lora == "lora_steps run in one process; launch without torchrun"
    assert batches == "1 calibration batches cannot be shared by 2 ranks: the batches (--nsamples / --batch-size) " \
                      "must be at least the ranks"
    assert uneven == "3 calibration batches cannot be shared by 2 ranks: the batches (--nsamples / --batch-size) " \
                     "must be a multiple of the ranks"


@pytest.mark.parametrize("stop", [None, 2])
def test_two_ranks_recover_as_one_process_and_continue_from_a_saved_state(two_ranks, stop):
    teacher, student = pruned_pair("llama", distributed_worker.RECOVERY_PRUNE)
    zeros = sum(int((p == 0).sum()) for p in student.model.layers.parameters())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = distill(student, teacher, distributed_worker.RECOVERY_TRAIN, distributed_worker.RECOVERY,
                         progress=False)
    finally:
        torch.set_num_threads(threads)
    got = two_ranks["recovery"][stop]
    assert got["kept_zeros"] == report.kept_zeros == zeros and got["masked"] == report.masked
    assert got["losses"] == pytest.approx(report.losses, rel=1e-5)
    for name, value in student.named_parameters():
        assert torch.equal(got["params"][name] == 0, value == 0), name  # every pruned zero kept on both
        assert close(got["params"][name], value.detach()), name


def test_fsdp_without_torchrun_or_with_tasks_is_refused(tiny_model_dir, tmp_path):
    args = ["prune", "--model", str(tiny_model_dir), "--nsamples", "2", "--seqlen", "32", "--fsdp"]
    assert "launch with torchrun" in one_error_line(run_cli(*args, "--output", str(tmp_path / "a")))
    assert "fsdp: zero-shot tasks" in one_error_line(run_cli(*args, "--tasks", "piqa", "--output", str(tmp_path)))
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("sharding", [[], ["--fsdp"]])
def test_torchrun_prune_writes_what_one_process_writes(tiny_model_dir, tmp_path, sharding):
    args = ["prune", "--model", str(tiny_model_dir), "--structure", "unstructured", "--target-size", "0.5",
            "--shots", "2", "--nsamples", "4", "--seqlen", "32", "--calibration", "wikitext2-valid",
            "--eval-windows", "1", "--config", str(tmp_path / "exact.json")]
    (tmp_path / "exact.json").write_text('{"cg_tol": 1e-10, "cg_max_iter": 1000, "checkpoint_shots": 2}')
    one = run_cli("--quiet", *args, "--output", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    two = torchrun("-m", "surgeon", *args, *sharding, "--output", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("saved to") == 1  # rank 0 alone reports and writes
    expected, report = json.loads((tmp_path / "one" / "report.json").read_text()), \
        json.loads((tmp_path / "two" / "report.json").read_text())
    assert report["ppl_before"] == expected["ppl_before"]
    assert report["ppl_after"] == pytest.approx(expected["ppl_after"], rel=1e-4)
    assert [shot["sparsity"] for shot in report["shots"]] == [shot["sparsity"] for shot in expected["shots"]]
    assert all(shot["seconds"]["collectives"] > 0 for shot in report["shots"])
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    for name, value in a.items():
        assert torch.equal(b[name] == 0, value == 0), name
        assert close(b[name], value), name
    assert not list((tmp_path / "two").glob("checkpoint*"))


def test_torchrun_recover_writes_what_one_process_writes(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sharp, pruned = tmp_path / "sharp", tmp_path / "pruned"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():  # next-token distributions far from uniform: a KL whose gradients are not rounding noise
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(8)
    model.save_pretrained(sharp)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(sharp)
    result = run_cli("--quiet", "prune", "--model", str(sharp), "--structure", "2:4", "--shots", "1",
                     "--nsamples", "2", "--seqlen", "32", "--calibration", "wikitext2-valid", "--eval-windows", "1",
                     "--output", str(pruned))
    assert result.returncode == 0, result.stderr
    args = ["recover", str(pruned), "--tokens", "256", "--seqlen", "32", "--batch-size", "2", "--lr", "1e-3",
            "--checkpoint-steps", "2"]
    one = run_cli("--quiet", *args, "--output", str(tmp_path / "one"), env={"OMP_NUM_THREADS": "1"})  # as each rank
    assert one.returncode == 0, one.stderr
    two = torchrun("-m", "surgeon", *args, "--output", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("saved to") == 1  # rank 0 alone reports and writes
    expected, report = (json.loads((tmp_path / name / "report.json").read_text()) for name in ("one", "two"))
    assert report["ranks"] == 2 and report["kept_zeros"] == expected["kept_zeros"] > 0
    assert report["ppl_after"] == pytest.approx(expected["ppl_after"], rel=1e-4)
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    for name, value in a.items():
        assert torch.equal(b[name] == 0, value == 0), name
        assert close(b[name], value), name
    assert not list((tmp_path / "two").glob("checkpoint*")) and not list((tmp_path / "two").glob("recovery-*"))
