"""`surgeon prune`: load, evaluate, prune, evaluate, and save model + report.json atomically."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from surgeon.config import PruneConfig, RunConfig
from surgeon.data import calibration_text, calibration_windows, evaluation_text, tokenize
from surgeon.errors import SurgeonError
from surgeon.evaluate import perplexity
from surgeon.io import write_directory, write_json
from surgeon.model import load_model, max_seqlen
from surgeon.prune import prune

logger = logging.getLogger(__name__)


def run_prune(run: RunConfig, config: PruneConfig) -> dict:
    """Prune `run.model` with `config`; write `run.output`/{report.json, model files}; return the report."""
    if run.output is None:
        raise SurgeonError("prune needs --output DIR for the pruned model and its report")
    output = Path(run.output)
    if output.exists() and not output.is_dir():
        raise SurgeonError(f"output {run.output!r} exists and is not a directory")
    start = time.perf_counter()
    test = evaluation_text(run.dataset)  # texts first: a bad path fails before the slow model load
    calibration = calibration_text(run.calibration)
    model, tokenizer = load_model(run.model, run.tokenizer, run.dtype, run.device)
    limit = max_seqlen(model)
    if limit is not None and max(run.seqlen, run.test_seqlen) > limit:
        raise SurgeonError(f"seqlen {max(run.seqlen, run.test_seqlen)} is longer than the model allows ({limit})")
    test_ids = tokenize(tokenizer, test)
    windows = calibration_windows(tokenize(tokenizer, calibration), run.nsamples, run.seqlen, config.seed)
    before = perplexity(model, test_ids, run.test_seqlen, run.eval_windows)
    logger.info("dense perplexity %.4f (%d windows)", before.ppl, before.windows)
    report = prune(model, windows, config)
    after = perplexity(model, test_ids, run.test_seqlen, run.eval_windows)
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

    def fill(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        write_json(directory / "report.json", result)

    write_directory(output, fill)
    return result
