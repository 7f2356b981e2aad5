"""`surgeon prune` and `surgeon export`: check the output, do the work, save model + report.json atomically."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from surgeon import __version__
from surgeon.app.data import (
    calibration_text,
    calibration_windows,
    evaluation_text,
    held_out_count,
    held_out_windows,
    leading_token,
    set_aside,
    shared_passages,
    tokenize,
)
from surgeon.app.evaluate import perplexity
from surgeon.app.settings import ExportConfig, RunConfig
from surgeon.app.tasks import load_tasks, zero_shot
from surgeon.config import MEMORY_OPTIONS, PruneConfig
from surgeon.errors import SurgeonError, first_line
from surgeon.io import OutputDirectory, read_run, write_checkpoint
from surgeon.models.adapter import DTYPES, load_model, max_seqlen
from surgeon.pruning.report import ShotReport
from surgeon.pruning.resume import Checkpoint, has_state, read_state
from surgeon.pruning.shots import prune
from surgeon.scale.distributed import local_device, shard_model, whole_state_dict
from surgeon.scale.plan import fit_to_gpu, meta_model
from surgeon.scale.settings import check_skeleton

logger = logging.getLogger(__name__)


def run_prune(run: RunConfig, config: PruneConfig, progress: bool = True,
              group: dist.ProcessGroup | None = None) -> dict[str, Any] | None:
    """Prune `run.model` with `config`; write `run.output`/{report.json, model files}; return the report.

    The output folder is checked and staged first, so a folder that cannot be written, or one that
    holds other files (without `run.overwrite`), fails before any work. After every
    `run.checkpoint_shots`-th shot a checkpoint is written into the folder (`surgeon.pruning.resume`);
    `run.resume` continues from it. report.json, which marks a finished run, is written last.
    With a process `group` (torchrun) every rank prunes its share (`surgeon.scale.distributed`); rank 0
    alone evaluates and writes, and the other ranks return None.
    """
    if run.output is None:
        raise SurgeonError("prune needs --output DIR for the pruned model and its report")
    folder = Path(run.output)
    fingerprint = run_fingerprint(run, config)
    state = read_state(folder, fingerprint) if run.resume else None
    if state is None and not run.overwrite and has_state(folder):
        raise SurgeonError(f"{run.output!r} holds an unfinished run: pass --resume to continue it (the same "
                           "options), or --overwrite to start again")
    if run.fsdp and group is None:
        raise SurgeonError("--fsdp shards the weights over torchrun ranks: launch with torchrun --nproc-per-node N "
                           "-m surgeon prune …")
    if group is not None and dist.get_rank(group) != 0:  # its checkpoint only restores; rank 0's writes
        checkpoint = Checkpoint(folder, fingerprint, every=run.checkpoint_shots, state=state)
        _, model, _ = _prune_and_evaluate(run, config, False, checkpoint, group)
        if run.fsdp:
            whole_state_dict(model)  # rank 0 gathers the weights to write
        return None
    with OutputDirectory(run.output, run.overwrite or run.resume) as output:
        checkpoint = Checkpoint(folder, fingerprint, every=run.checkpoint_shots, state=state)
        if state is None:
            checkpoint.remove()  # an earlier run's, replaced with --overwrite
        result, model, tokenizer = _prune_and_evaluate(run, config, progress, checkpoint, group)
        write_checkpoint(output.staging, model, tokenizer, result, whole_state_dict(model) if run.fsdp else None)
        output.commit()
    checkpoint.remove()
    return result


def gpu_memory(device: str) -> int | None:
    """Bytes of memory of the CUDA device `device` ("cuda", "cuda:1"); None for the CPU."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def run_fingerprint(run: RunConfig, config: PruneConfig) -> dict[str, Any]:
    """The settings a continued run must share with the run it continues: not where its output goes, nor
    where the pass keeps its tensors (`MEMORY_OPTIONS`, which change no result), so that a run stopped
    for want of memory continues with them."""
    own = {key: value for key, value in dataclasses.asdict(run).items()
           if key not in ("output", "overwrite", "resume", "checkpoint_shots", "recover_tokens")}
    prune = {key: value for key, value in config.resolved().items() if key not in MEMORY_OPTIONS}
    return {"surgeon": __version__, "prune": prune, "run": own}


def _skeleton(run: RunConfig) -> nn.Module | None:
    """The model built on the meta device from its configuration alone (no weights); None where transformers
    cannot build it so (a DeciLM compact checkpoint, say): `prune` then checks the settings once it is loaded."""
    try:
        return meta_model(run.model, run.dtype)
    except SurgeonError:
        return None


def _prune_and_evaluate(run: RunConfig, config: PruneConfig, progress: bool,
                        checkpoint: Checkpoint | None = None,
                        group: dist.ProcessGroup | None = None) -> tuple[dict[str, Any], Any, Any]:
    """Load, evaluate, prune and evaluate again; the report, the pruned model and its tokenizer.

    A `checkpoint` holding a saved state continues that run: what was measured before pruning comes
    from it, and the shots after its last one run. With a process `group`, ranks other than 0 only
    prune (their share) and return an empty report; with `run.fsdp` the weights are sharded over the
    ranks (FSDP2), and every rank evaluates (a sharded forward pass needs them all).
    """
    lead = group is None or dist.get_rank(group) == 0
    evaluates = lead or run.fsdp
    start = time.perf_counter()
    test = evaluation_text(run.dataset)  # texts and tasks first: bad input fails before the slow model load
    calibration = calibration_text(run.calibration)
    if shared := shared_passages(calibration, test):  # calibration and held-out windows never see the test text
        raise SurgeonError(f"the calibration text ({calibration.source}) shares {shared} passages with the evaluation "
                           f"text ({test.source}): calibrate on other text, or evaluate on another --dataset")
    tasks = load_tasks(run.task_list, run.task_path) if run.tasks else None
    device = run.device if group is None else local_device(run.device)
    world = 1 if group is None else dist.get_world_size(group)
    skeleton = _skeleton(run)
    if skeleton is not None:  # what the run cannot prune is refused before the slow model load
        check_skeleton(skeleton, config, world)
    budget = gpu_memory(device)
    if budget is not None:  # a run that cannot fit the GPU stops before any weight loads, or takes memory options
        config = fit_to_gpu(run.model, run.dtype, run.nsamples, run.seqlen, config, budget, world, run.fsdp)
    model, tokenizer = load_model(run.model, run.tokenizer, run.dtype, "cpu" if run.fsdp else device)
    if run.fsdp:
        shard_model(model, device)
    limit = max_seqlen(model)
    if limit is not None and max(run.seqlen, run.test_seqlen) > limit:
        raise SurgeonError(f"seqlen {max(run.seqlen, run.test_seqlen)} is longer than the model allows ({limit})")
    test_ids = tokenize(tokenizer, test)
    # the last articles are set aside whether or not the run weighs, so that every method calibrates on one text
    drawn, aside = set_aside(tokenizer, calibration, held_out_count(run.nsamples) * run.seqlen)
    bos = leading_token(tokenizer)
    eval_bos = bos if run.eval_bos else None
    windows = calibration_windows(tokenize(tokenizer, drawn), run.nsamples, run.seqlen, config.seed, bos)
    held_out = held_out_windows(tokenize(tokenizer, aside), run.nsamples, run.seqlen, bos) \
        if config.chooses and aside is not None else None  # the held-out choice scores both models on them
    if checkpoint is not None and checkpoint.state is not None:
        before = checkpoint.state["before"]
    elif not evaluates:
        before = {}
    else:
        dense = perplexity(model, test_ids, run.test_seqlen, run.eval_windows, progress, eval_bos)
        logger.info("dense perplexity %.4f (%d windows)", dense.ppl, dense.windows)
        before = {"eval": dense.to_dict()}
        if tasks:
            before["tasks"] = zero_shot(model, tokenizer, run.task_list, tasks, limit=run.task_limit)
        if checkpoint is not None:
            checkpoint.before = before

    def evaluate_shot(shot: ShotReport) -> None:
        shot.ppl = perplexity(model, test_ids, run.test_seqlen, run.eval_windows, progress, eval_bos).ppl
        logger.info("perplexity after shot %d: %.4f", shot.shot, shot.ppl)

    report = prune(model, windows, config, progress, evaluate_shot if run.eval_every_shot and evaluates else None,
                   checkpoint, group, held_out)
    after = perplexity(model, test_ids, run.test_seqlen, run.eval_windows, progress, eval_bos) if evaluates else None
    if after is None or not lead:
        return {}, model, tokenizer
    logger.info("pruned perplexity %.4f (%d windows)", after.ppl, after.windows)
    result = {
        "model": run.model,
        "run": dataclasses.asdict(run),
        "calibration_source": drawn.source,
        "held_out_source": None if aside is None else aside.source,
        "ppl_before": before["eval"]["ppl"],
        "ppl_after": after.ppl,
        "eval": {"before": before["eval"], "after": after.to_dict()},
        **report.to_dict(),
        "seconds": time.perf_counter() - start,
    }
    if tasks:
        after_tasks = zero_shot(model, tokenizer, run.task_list, tasks, limit=run.task_limit)
        result["tasks"] = {"before": before["tasks"], "after": after_tasks}
    return result, model, tokenizer


def pruning_run(run: str, output: str | None, command: str) -> tuple[Path, dict[str, Any], str]:
    """The folder and report of the finished `surgeon prune` run `run` that `command` (export, recover) reads, and
    the folder it writes, `output`, checked to be given and another."""
    source = Path(run)
    report = read_run(source)
    if output is None:
        raise SurgeonError(f"{command} needs --output DIR for the checkpoint it writes")
    if Path(output).resolve() == source.resolve():
        raise SurgeonError(f"--output must be another folder than the pruning run it {command}s")
    return source, report, output


def load_pruned(source: Path, dtype: str = "auto") -> tuple[nn.Module, Any]:
    """The model (in eval mode, in `dtype`: the checkpoint's own with auto) and tokenizer of a pruning run's folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model: nn.Module = AutoModelForCausalLM.from_pretrained(source, dtype=dtype if dtype == "auto"
                                                                else DTYPES[dtype]).eval()
        return model, AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise SurgeonError(f"cannot load the pruned model in {str(source)!r}: {first_line(error)}") from error


def run_export(config: ExportConfig) -> dict[str, Any]:
    """Write `config.run`'s pruned model without its removable units to `config.output`; return its report.

    The compact model's logits are checked against the pruned model's on one window of random tokens
    (float32: within twice the pruned model's own float32 error against float64, plus 1e-5 of their
    scale) before anything is written.
    """


    from surgeon.export.compact import compact_model, same_logits
    from surgeon.models import compact_modeling

    source, report, folder = pruning_run(config.run, config.output, "export")
    with OutputDirectory(folder, config.overwrite) as output:
        model, tokenizer = load_pruned(source)
        compact = compact_model(model, config.format, config.ffn_mult)
        same_logits(model, compact)
        count = sum(p.numel() for p in model.parameters())
        kept = sum(p.numel() for p in compact.parameters())
        report["export"] = {"format": config.format, "ffn_mult": config.ffn_mult, "source": str(source),
                            "parameters_before": count,
                            "parameters": kept, "fraction": kept / count}
        write_checkpoint(output.staging, compact, tokenizer, report)
        if config.format != "standard":  # the modeling code that trust_remote_code=True loads
            shutil.copyfile(compact_modeling.__file__, output.staging / "compact_modeling.py")
        output.commit()
    logger.info("compact %s model: %d of %d parameters (%.3f)", config.format, kept, count, kept / count)
    return report
