"""`surgeon recover`: a pruned model distilled from its dense model (`surgeon.recovery`), evaluated before and
after, and written as a checkpoint with report.json that `surgeon export` reads as it reads a pruning run's.

Every `checkpoint_steps` steps the training state (weights, AdamW's moments, the schedule, the report so far) is
written into the output folder, `recovery-state-rank0.pt` (one file per rank under torchrun, each its shards) under a
temporary name renamed into place and then `checkpoint.json` naming the step with the settings' hash; `--resume`
continues from it with the same settings on as many ranks and ends with the model an uninterrupted run ends with.
report.json, which marks a finished run, is written last.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from surgeon import __version__
from surgeon.app.data import (
    calibration_text,
    calibration_windows,
    evaluation_text,
    leading_token,
    shared_passages,
    tokenize,
)
from surgeon.app.evaluate import perplexity
from surgeon.app.run import load_pruned, pruning_run
from surgeon.app.settings import RecoverConfig
from surgeon.errors import SurgeonError
from surgeon.io import OutputDirectory, write_checkpoint, write_json
from surgeon.models.adapter import load_model
from surgeon.pruning.resume import STATE, config_hash, has_state, read_state
from surgeon.recovery.distill import Distillation, DistillReport, teacher_targets
from surgeon.scale.distributed import local_device, shard_model, whole_state_dict

logger = logging.getLogger(__name__)

TENSORS = "recovery-state-rank{}.pt"


def recover_fingerprint(config: RecoverConfig) -> dict[str, Any]:
    """The settings a continued recovery must share with the one it continues: all but where its output goes and
    how often it is saved, the learning rate as resolved (the same run whether its default was written out)."""
    own = {key: value for key, value in dataclasses.asdict(config).items()
           if key not in ("output", "overwrite", "resume", "checkpoint_steps")}
    return {"surgeon": __version__, "recover": {**own, "lr": config.distill().lr}}


def _save(folder: Path, fingerprint: dict[str, Any], state: dict[str, Any], group: dist.ProcessGroup | None
          ) -> None:
    """Write each rank's training `state`, atomically, and then (rank 0) checkpoint.json naming its step."""
    rank = 0 if group is None else dist.get_rank(group)
    name = TENSORS.format(rank)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if group is not None:
        dist.barrier(group)
    if rank == 0:
        write_json(folder / STATE, {"step": state["step"], "config_hash": config_hash(fingerprint),
                                    "config": fingerprint})


def _remove_state(folder: Path) -> None:
    """Delete the checkpoint: the recovery is finished, or starts again."""
    (folder / STATE).unlink(missing_ok=True)
    for path in folder.glob(TENSORS.format("*")):
        path.unlink(missing_ok=True)


def run_recover(config: RecoverConfig, progress: bool = True, group: dist.ProcessGroup | None = None
                ) -> dict[str, Any] | None:
    """Distill `config.run`'s pruned model from the dense model it was pruned from, on `config.tokens` tokens of
    text that shares no passage with the evaluation text; write it with its report to `config.output`.

    With a process `group` (torchrun) both models are sharded over the ranks with FSDP2 and each rank trains on its
    share of every batch; rank 0 writes, and the other ranks return None.
    """
    source, pruned, folder = pruning_run(config.run, config.output, "recover")
    fingerprint = {**recover_fingerprint(config), "ranks": 1 if group is None else dist.get_world_size(group)}
    state = read_state(Path(folder), fingerprint) if config.resume else None
    if state is None and not config.overwrite and has_state(Path(folder)):
        raise SurgeonError(f"{folder!r} holds an unfinished recovery: pass --resume to continue it (the same "
                           "options), or --overwrite to start again")
    lead = group is None or dist.get_rank(group) == 0
    if not lead:
        _recover(config, source, pruned, Path(folder), fingerprint, state, False, group)
        return None
    with OutputDirectory(folder, config.overwrite or config.resume) as output:
        if state is None:
            _remove_state(Path(folder))  # an earlier run's, replaced with --overwrite
        report = _recover(config, source, pruned, Path(folder), fingerprint, state, progress, group, output.staging)
        output.commit()
    _remove_state(Path(folder))
    return report


def _recover(config: RecoverConfig, source: Path, pruned: dict[str, Any], folder: Path, fingerprint: dict[str, Any],
             state: dict[str, Any] | None, progress: bool, group: dist.ProcessGroup | None,
             staging: Path | None = None) -> dict[str, Any]:
    """Load, evaluate, distill (from `state`'s step, when given) and evaluate again; write into `staging` (rank 0)."""
    run = pruned["run"]
    eval_seqlen = config.eval_seqlen or run.get("eval_seqlen") or run["seqlen"]
    eval_windows = config.eval_windows or run.get("eval_windows")
    eval_bos = config.eval_bos if config.eval_bos is not None else run.get("eval_bos", False)
    test = evaluation_text(run["dataset"])
    text = calibration_text(config.text or run["calibration"])
    if shared := shared_passages(text, test):
        raise SurgeonError(f"the training text ({text.source}) shares {shared} passages with the evaluation text "
                           f"({test.source}): train on other text")
    settings = config.distill()
    start = time.perf_counter()
    device = config.device if group is None else local_device(config.device)
    student, tokenizer = load_pruned(source, config.dtype)
    ids, bos = tokenize(tokenizer, text), leading_token(tokenizer)
    windows = calibration_windows(ids, -(-config.tokens // config.seqlen), config.seqlen, config.seed, bos)
    bos = bos if eval_bos else None  # the evaluation's
    teacher, targets = None, None
    if settings.loss == "kl":
        # with bf16 mixed precision the teacher, which only runs forward passes, is held in bfloat16
        teacher, _ = load_model(pruned["model"], run.get("tokenizer"),
                                "bfloat16" if settings.mixed_precision == "bf16" else config.dtype,
                                "cpu" if group is not None else device)
        if group is not None:
            shard_model(teacher, device)
        if settings.teacher_top_k:  # the teacher's targets first, so that it is not held beside the student
            targets = teacher_targets(teacher, windows, settings, group, progress)
            teacher = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if group is None:
        student.to(device)
    else:
        shard_model(student, device)
    test_ids = tokenize(tokenizer, test)
    before = perplexity(student, test_ids, eval_seqlen, eval_windows, progress, bos)
    logger.info("pruned perplexity %.4f; distilling on %d windows of %d tokens (%s, %.1f passes over it)",
                before.ppl, windows.shape[0], config.seqlen, text.source, windows.numel() / ids.shape[1])
    distillation = Distillation(student, teacher, windows, settings, group, targets)
    if state is not None:
        rank = 0 if group is None else dist.get_rank(group)  # sharded tensors (DTensor) are not plain weights
        distillation.restore(torch.load(folder / TENSORS.format(rank), weights_only=group is None))
        logger.info("resuming %s after step %d of %d", folder, distillation.step, len(distillation.batches))

    def checkpoint(report: DistillReport) -> None:
        step = distillation.step
        if config.checkpoint_steps and step % config.checkpoint_steps == 0 and step < len(distillation.batches):
            _save(folder, fingerprint, distillation.state(), group)

    trained = distillation.run(progress, checkpoint)
    del teacher
    student.eval()
    after = perplexity(student, test_ids, eval_seqlen, eval_windows, progress, bos)
    weights = whole_state_dict(student) if group is not None else None
    report = {
        "model": pruned["model"],
        "pruned_from": str(source),
        "recover": {**dataclasses.asdict(config), "lr": settings.lr},
        "training_source": text.source,
        "passes": windows.numel() / ids.shape[1],
        "ppl_dense": pruned["ppl_before"],
        "ppl_before": before.ppl,
        "ppl_after": after.ppl,
        "eval": {"before": before.to_dict(), "after": after.to_dict()},
        "losses": trained.losses,
        "tokens": trained.tokens,
        "masked_parameters": trained.masked,
        "kept_zeros": trained.kept_zeros,
        "training_seconds": trained.seconds,
        "seconds": time.perf_counter() - start,
        "ranks": 1 if group is None else dist.get_world_size(group),
        "run": run,
        "config": pruned["config"],
        "sparsity": pruned["sparsity"],
        "layers": pruned["layers"],
    }
    if staging is not None:
        with torch.no_grad():
            write_checkpoint(staging, student, tokenizer, report, weights)
    return report
