"""Recovery curves: perplexity against distillation tokens and seconds, after pruning with the CLI's defaults.

Protocol: the quality table's model and pruning (bench/quality/table.py: SmolLM2-135M, 8 calibration windows of 512
tokens of the packaged WikiText-2 validation split, the structure's default method and shots), then `surgeon
recover`'s distillation (`surgeon.recovery.distill`: KL to the dense model, pruned zeros kept) on windows of
`--seqlen` tokens drawn with seed 1 from the same validation split, which shares no passage with the test split.
Perplexity on the first 4 test windows of 2048 tokens before recovery and every `--every` tokens of one run
scheduled for `--tokens` (the points of one cosine schedule, not separate runs); seconds count the training alone.

Saved as bench/results/recovery/<structure>-<target>[-<settings>]@<commit>.json, skipped when it exists.

    python -m bench.quality.recovery --structure coupled --target-size 0.8          # about 20 minutes on 2 cores
    python -m bench.quality.recovery --structure 2:4 --tokens 131072 --every 16384
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import time
from pathlib import Path

import torch

from bench.machine import cpu_machine
from bench.quality.table import head_commit, load_protocol
from surgeon import PruneConfig, prune
from surgeon.app.data import calibration_windows
from surgeon.app.evaluate import perplexity
from surgeon.io import write_json
from surgeon.recovery.distill import Distill, DistillReport, distill

ROOT = Path(__file__).resolve().parents[1] / "results" / "recovery"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a built-in model or a folder (tests: a tiny one)")
    parser.add_argument("--structure", default="structured")
    parser.add_argument("--target-size", type=float, default=None, help="default: the CLI's for the structure")
    parser.add_argument("--tokens", type=int, default=262_144)
    parser.add_argument("--every", type=int, default=32_768, help="evaluate after every this many tokens")
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-windows", type=int, default=4)
    parser.add_argument("--eval-seqlen", type=int, default=2048)
    parser.add_argument("--calib-windows", type=int, default=None, help="default: the model's protocol")
    parser.add_argument("--calib-seqlen", type=int, default=None, help="default: the model's protocol")
    parser.add_argument("--output", type=Path, default=None, help="default: bench/results/recovery/<run>@<commit>")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = PruneConfig(structure=args.structure, target_size=args.target_size)
    name = f"{args.structure.replace(':', 'of')}-{config.target:g}" + (f"-lr{args.lr:g}" if args.lr != 1e-4 else "")
    path = args.output or ROOT / f"{name}@{head_commit()}.json"
    if path.exists():
        logging.info("%s exists", path)
        return
    run = load_protocol(args.model, args.calib_windows, args.calib_seqlen, None if args.model == "smollm2-135m"
                        else args.model)
    teacher = copy.deepcopy(run.model)
    start = time.perf_counter()
    prune(run.model, run.windows, config, progress=False, held_out_ids=run.held_out)
    prune_seconds = time.perf_counter() - start

    def evaluate() -> float:
        return perplexity(run.model, run.test_ids, args.eval_seqlen, args.eval_windows, progress=False).ppl

    dense = perplexity(teacher, run.test_ids, args.eval_seqlen, args.eval_windows, progress=False).ppl
    curve = [{"tokens": 0, "seconds": 0.0, "ppl": evaluate()}]
    evaluation = [0.0]  # seconds spent evaluating inside the training run, left out of its seconds

    def after_step(report: DistillReport) -> None:
        if report.tokens // args.every > curve[-1]["tokens"] // args.every or report.tokens >= args.tokens:
            began = time.perf_counter()
            run.model.eval()
            ppl = evaluate()
            run.model.train()
            evaluation[0] += time.perf_counter() - began
            curve.append({"tokens": report.tokens, "seconds": time.perf_counter() - trained - evaluation[0],
                          "ppl": ppl, "loss": report.losses[-1]})
            logging.info("%d tokens, %.0f s: ppl %.3f", report.tokens, curve[-1]["seconds"], ppl)

    windows = calibration_windows(run.ids, -(-args.tokens // args.seqlen), args.seqlen, 1, run.bos)
    trained = time.perf_counter()
    report = distill(run.model, teacher, windows, Distill(lr=args.lr), progress=False, after_step=after_step)
    write_json(path, {"model": args.model, "config": config.resolved(), "ppl_dense": dense,
                      "prune_seconds": prune_seconds, "curve": curve, "losses": report.losses, "lr": args.lr,
                      "seqlen": args.seqlen, "eval_windows": args.eval_windows, "eval_seqlen": args.eval_seqlen,
                      "passes": windows.numel() /
                      run.ids.shape[1], "machine": cpu_machine(torch.get_num_threads()), "commit": head_commit(),
                      "command": " ".join(["python -m bench.quality.recovery", *sys.argv[1:]])})


if __name__ == "__main__":
    main()
