"""`surgeon prune` and `surgeon export`: check the output, do the work, save model + report.json atomically."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from typing import Any

from surgeon.config import ExportConfig, PruneConfig, RunConfig
from surgeon.data import calibration_text, calibration_windows, evaluation_text, tokenize
from surgeon.errors import SurgeonError, first_line
from surgeon.evaluate import perplexity
from surgeon.io import OutputDirectory, read_run, write_checkpoint
from surgeon.model import load_model, max_seqlen
from surgeon.report import ShotReport
from surgeon.shots import prune

logger = logging.getLogger(__name__)


def run_prune(run: RunConfig, config: PruneConfig, progress: bool = True) -> dict:
    """Prune `run.model` with `config`; write `run.output`/{report.json, model files}; return the report.

    The output folder is checked and staged first, so a folder that cannot be written, or one that
    holds other files (without `run.overwrite`), fails before any work, and an interrupted run
    leaves nothing behind.
    """
    if run.output is None:
        raise SurgeonError("prune needs --output DIR for the pruned model and its report")
    with OutputDirectory(run.output, run.overwrite) as output:
        result, model, tokenizer = _prune_and_evaluate(run, config, progress)
        write_checkpoint(output.staging, model, tokenizer, result)
        output.commit()
    return result


def _prune_and_evaluate(run: RunConfig, config: PruneConfig, progress: bool) -> tuple[dict, Any, Any]:
    """Load, evaluate, prune and evaluate again; the report, the pruned model and its tokenizer."""
    start = time.perf_counter()
    test = evaluation_text(run.dataset)  # texts first: a bad path fails before the slow model load
    calibration = calibration_text(run.calibration)
    model, tokenizer = load_model(run.model, run.tokenizer, run.dtype, run.device)
    limit = max_seqlen(model)
    if limit is not None and max(run.seqlen, run.test_seqlen) > limit:
        raise SurgeonError(f"seqlen {max(run.seqlen, run.test_seqlen)} is longer than the model allows ({limit})")
    test_ids = tokenize(tokenizer, test)
    windows = calibration_windows(tokenize(tokenizer, calibration), run.nsamples, run.seqlen, config.seed)
    before = perplexity(model, test_ids, run.test_seqlen, run.eval_windows, progress)
    logger.info("dense perplexity %.4f (%d windows)", before.ppl, before.windows)

    def evaluate_shot(shot: ShotReport) -> None:
        shot.ppl = perplexity(model, test_ids, run.test_seqlen, run.eval_windows, progress).ppl
        logger.info("perplexity after shot %d: %.4f", shot.shot, shot.ppl)

    report = prune(model, windows, config, progress, evaluate_shot if run.eval_every_shot else None)
    after = perplexity(model, test_ids, run.test_seqlen, run.eval_windows, progress)
    logger.info("pruned perplexity %.4f (%d windows)", after.ppl, after.windows)
    result = {
        "model": run.model,
        "run": dataclasses.asdict(run),
        "calibration_source": calibration.source,
        "ppl_before": before.ppl,
        "ppl_after": after.ppl,
        "eval": {"before": before.to_dict(), "after": after.to_dict()},
        **report.to_dict(),
        "seconds": time.perf_counter() - start,
    }
    return result, model, tokenizer


def run_export(config: ExportConfig) -> dict:
    """Write `config.run`'s pruned model without its removable units to `config.output`; return its report.

    The compact model's logits are checked against the pruned model's on one window of random tokens
    (float32: within twice the pruned model's own float32 error against float64, plus 1e-5 of their
    scale) before anything is written.
    """
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from surgeon import compact_modeling
    from surgeon.compact import compact_model, same_logits

    source = Path(config.run)
    report = read_run(source)
    if config.output is None:
        raise SurgeonError("export needs --output DIR for the exported checkpoint")
    if Path(config.output).resolve() == source.resolve():
        raise SurgeonError("--output must be another folder than the pruning run it exports")
    with OutputDirectory(config.output, config.overwrite) as output:
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype="auto").eval()
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as error:
            raise SurgeonError(f"cannot load the pruned model in {config.run!r}: {first_line(error)}") from error
        compact = compact_model(model, config.format)
        same_logits(model, compact)
        count = sum(p.numel() for p in model.parameters())
        kept = sum(p.numel() for p in compact.parameters())
        report["export"] = {"format": config.format, "source": str(source), "parameters_before": count,
                            "parameters": kept, "fraction": kept / count}
        write_checkpoint(output.staging, compact, tokenizer, report)
        if config.format == "heterogeneous":  # the modeling code that trust_remote_code=True loads
            shutil.copyfile(compact_modeling.__file__, output.staging / "compact_modeling.py")
        output.commit()
    logger.info("compact %s model: %d of %d parameters (%.3f)", config.format, kept, count, kept / count)
    return report
