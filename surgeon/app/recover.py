"""`surgeon recover`: a pruned model distilled from its dense model (`surgeon.recovery`), evaluated before and
after, and written as a checkpoint with report.json that `surgeon export` reads as it reads a pruning run's."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

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
from surgeon.io import OutputDirectory, write_checkpoint
from surgeon.models.adapter import load_model
from surgeon.recovery.distill import Distill, distill

logger = logging.getLogger(__name__)


def run_recover(config: RecoverConfig, progress: bool = True) -> dict[str, Any]:
    """Distill `config.run`'s pruned model from the dense model it was pruned from, on `config.tokens` tokens of
    text that shares no passage with the evaluation text; write it with its report to `config.output`."""
    source, pruned, folder = pruning_run(config.run, config.output, "recover")
    run = pruned["run"]
    eval_seqlen = config.eval_seqlen or run.get("eval_seqlen") or run["seqlen"]
    eval_windows = config.eval_windows or run.get("eval_windows")
    test = evaluation_text(run["dataset"])
    text = calibration_text(config.text or run["calibration"])
    if shared := shared_passages(text, test):
        raise SurgeonError(f"the training text ({text.source}) shares {shared} passages with the evaluation text "
                           f"({test.source}): train on other text")
    with OutputDirectory(folder, config.overwrite) as output:
        start = time.perf_counter()
        student, tokenizer = load_pruned(source, config.dtype)
        student.to(config.device)
        teacher, _ = load_model(pruned["model"], run.get("tokenizer"), config.dtype, config.device)
        ids = tokenize(tokenizer, text)
        windows = calibration_windows(ids, -(-config.tokens // config.seqlen), config.seqlen, config.seed,
                                      leading_token(tokenizer))
        test_ids = tokenize(tokenizer, test)
        before = perplexity(student, test_ids, eval_seqlen, eval_windows, progress)
        logger.info("pruned perplexity %.4f; distilling on %d windows of %d tokens (%s, %.1f passes over it)",
                    before.ppl, windows.shape[0], config.seqlen, text.source, windows.numel() / ids.shape[1])
        trained = distill(student, teacher, windows, Distill(config.lr, batch_size=config.batch_size,
                                                             seed=config.seed), progress)
        del teacher
        student.eval()
        after = perplexity(student, test_ids, eval_seqlen, eval_windows, progress)
        report = {
            "model": pruned["model"],
            "pruned_from": str(source),
            "recover": dataclasses.asdict(config),
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
            "run": run,
            "config": pruned["config"],
            "sparsity": pruned["sparsity"],
            "layers": pruned["layers"],
        }
        with torch.no_grad():
            write_checkpoint(output.staging, student, tokenizer, report)
        output.commit()
    return report
