r"""Recovery curves: perplexity against distillation tokens and seconds, after pruning with the CLI's defaults.

Protocol: the quality table's model and pruning (bench/quality/table.py: SmolLM2-135M, 8 calibration windows of 512
tokens of the packaged WikiText-2 validation split, the structure's default method and shots), then `surgeon
recover`'s distillation (`surgeon.recovery.distill`: KL to the dense model, pruned zeros kept) on windows of
`--seqlen` tokens drawn with seed 1 + `--seed` from the same validation split, which shares no passage with the test
split, and trained on in the order drawn with `--seed` (default 0).
Perplexity on the first 4 test windows of 2048 tokens, and on as many windows of the validation split's tuning
articles (which no window trains on: settings are chosen by them), before recovery and every `--every` tokens of one
run scheduled for `--tokens` (the points of one cosine schedule, not separate runs); seconds count the training
alone.

One prune, then one run with the first value of each of --lr, --batch-size, --loss, --hidden-weight, --lora-rank
and --mixed-precision, and one more for each further value of one of them, the others at their first. Each is saved
as bench/results/recovery/[<model>-]<structure>-<target>[-<calibration budget>][-<settings>][-seed<s>]@<commit>.json,
and skipped when it exists. With `--pruned DIR` the pruned model is kept in DIR, and a later run of the same prune and
pruning code starts from it: a prune at the CLI's 128 × 2048 budget takes most of an hour on 2 cores.

    python -m bench.quality.recovery --structure coupled --target-size 0.8 --tokens 131072 --every 16384
    python -m bench.quality.recovery --structure coupled --target-size 0.8 --tokens 32768 --every 16384 \
        --lr 1e-4 3e-4 --loss kl next-token --lora-rank 0 16 --hidden-weight 0 1      # five runs, one prune
    python -m bench.quality.recovery --structure 2:4 --calib-windows 128 --calib-seqlen 2048 --tokens 131072 \
        --every 16384 --pruned /tmp/pruned                  # from the CLI's own prune, the prune kept for more runs
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import provenance as pv
from bench.machine import cpu_machine
from bench.quality.table import PROTOCOLS, head_commit, load_protocol
from bench.section import Section, link, recorded
from surgeon import PruneConfig, prune
from surgeon.app.data import calibration_windows
from surgeon.app.evaluate import perplexity
from surgeon.io import write_json
from surgeon.recovery import LOSSES, MIXED_PRECISION
from surgeon.recovery.distill import Distill, DistillReport, distill

ROOT = Path(__file__).resolve().parents[1] / "results" / "recovery"
# Distill's settings the runs compare
VARIED = ("lr", "batch_size", "loss", "hidden_weight", "lora_rank", "mixed_precision")
DEFAULTS = {"lr": 1e-4, "batch_size": 1, "loss": "kl", "hidden_weight": 0.0, "lora_rank": 0, "mixed_precision": "no"}
TOKENS = 262_144  # the schedule's length unless --tokens says otherwise; other lengths are named in the file name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a built-in model or a folder (tests: a tiny one)")
    parser.add_argument("--structure", default="structured")
    parser.add_argument("--target-size", type=float, default=None, help="default: the CLI's for the structure")
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--every", type=int, default=32_768, help="evaluate after every this many tokens")
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-4])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1])
    parser.add_argument("--loss", nargs="+", default=["kl"], choices=LOSSES)
    parser.add_argument("--hidden-weight", type=float, nargs="+", default=[0.0], help="0: the KL alone")
    parser.add_argument("--lora-rank", type=int, nargs="+", default=[0], help="0: the weights train")
    parser.add_argument("--mixed-precision", nargs="+", default=["no"], choices=MIXED_PRECISION)
    parser.add_argument("--seed", type=int, default=0, help="draws and orders the training windows (the prune's "
                        "calibration stays the protocol's)")
    parser.add_argument("--eval-windows", type=int, default=4)
    parser.add_argument("--eval-seqlen", type=int, default=2048)
    parser.add_argument("--calib-windows", type=int, default=None, help="default: the model's protocol")
    parser.add_argument("--calib-seqlen", type=int, default=None, help="default: the model's protocol")
    parser.add_argument("--output", type=Path, default=None, help="default: bench/results/recovery/<run>@<commit>")
    parser.add_argument("--pruned", type=Path, default=None,
                        help="a folder that keeps the pruned model: a later run of the same prune starts from it")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = PruneConfig(structure=args.structure, target_size=args.target_size)
    first = {setting: getattr(args, setting)[0] for setting in VARIED}
    variants = [first, *({**first, setting: value} for setting in VARIED for value in getattr(args, setting)[1:])]
    settings = [Distill(**variant, seed=args.seed) for variant in variants]  # a bad combination stops before the prune
    runs = {index: (args.output if args.output and len(variants) == 1 else
                    ROOT / f"{name(args, config, variant)}@{head_commit()}.json")
            for index, variant in enumerate(variants)}
    runs = {key: path for key, path in runs.items() if not path.exists()}
    if not runs:
        logging.info("every run exists")
        return
    run = load_protocol(args.model, args.calib_windows, args.calib_seqlen, None if args.model == "smollm2-135m"
                        else args.model)
    teacher = copy.deepcopy(run.model)
    saved = args.pruned / f"{pruned_name(args, config)}.pt" if args.pruned else None
    prune_seconds, kept = pruned_model(run, config, saved)
    dense = perplexity(teacher, run.test_ids, args.eval_seqlen, args.eval_windows, progress=False, bos=run.bos).ppl
    pruned = run.model
    for index, path in runs.items():
        student = copy.deepcopy(pruned)
        mixed = settings[index].mixed_precision == "bf16"  # the teacher held in bfloat16, as `surgeon recover` holds it
        curve, losses, passes = train(args, run, student, copy.deepcopy(teacher).to(torch.bfloat16) if mixed
                                      else teacher, settings[index])
        write_json(path, {"model": args.model, "config": config.resolved(), "ppl_dense": dense, **variants[index],
                          "seed": args.seed, "prune_seconds": prune_seconds, "kept": kept, "curve": curve,
                          "losses": losses, "seqlen": args.seqlen, "eval_windows": args.eval_windows,
                          "eval_seqlen": args.eval_seqlen, "passes": passes,
                          "machine": cpu_machine(torch.get_num_threads()),
                          "commit": head_commit(), "command": " ".join(["python -m bench.quality.recovery",
                                                                        *sys.argv[1:]])})


def pruned_model(run: Any, config: PruneConfig, saved: Path | None) -> tuple[float, str]:
    """Prune `run.model` as `surgeon prune` does, or load it from `saved` where a run of the same pruning code saved
    it; the seconds the prune took and the method whose model it is (the held-out choice's, where one was made). A
    new prune is saved there."""
    if saved is not None and saved.exists():
        state = torch.load(saved, weights_only=True)
        if pv.same_code(state["commit"], head_commit()):
            run.model.load_state_dict(state["model"])
            logging.info("the pruned model of %s (%s)", state["commit"], saved)
            return state["prune_seconds"], state["kept"]
    start = time.perf_counter()
    report = prune(run.model, run.windows, config, progress=False, held_out_ids=run.held_out)
    seconds, kept = time.perf_counter() - start, report.choice["kept"] if report.choice else config.method
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": run.model.state_dict(), "prune_seconds": seconds, "kept": kept, "commit": head_commit()},
                   saved)
    return seconds, kept


def pruned_name(args: argparse.Namespace, config: PruneConfig) -> str:
    """The prune's part of a run's name: the model unless SmolLM2, structure, target, and the calibration budget
    where it is not the model's protocol."""
    parts = [Path(args.model).name] if args.model != "smollm2-135m" else []  # a built-in name, or a folder's
    parts += [args.structure.replace(":", "of"), f"{config.target:g}"]
    protocol = PROTOCOLS.get(args.model, PROTOCOLS["smollm2-135m"])[:2]
    budget = (args.calib_windows or protocol[0], args.calib_seqlen or protocol[1])
    return "-".join(parts + ([f"{budget[0]}x{budget[1]}"] if budget != protocol else []))


def name(args: argparse.Namespace, config: PruneConfig, variant: dict[str, Any]) -> str:
    """The run's file name before @commit: the prune's name, the schedule's length, the settings that differ from
    the bench's defaults (`DEFAULTS`) and the seed unless 0."""
    differ = {key: value for key, value in variant.items() if value != DEFAULTS[key]}
    parts = [pruned_name(args, config)] + ([f"{args.tokens}tokens"] if args.tokens != TOKENS else [])
    parts += [f"lr{differ['lr']:g}"] if "lr" in differ else []
    parts += [f"batch{differ['batch_size']}"] if "batch_size" in differ else []
    parts += [differ["loss"]] if "loss" in differ else []
    parts += [f"hidden{differ['hidden_weight']:g}"] if "hidden_weight" in differ else []
    parts += [f"lora{differ['lora_rank']}"] if "lora_rank" in differ else []
    parts += [differ["mixed_precision"]] if "mixed_precision" in differ else []
    return "-".join(parts + ([f"seed{args.seed}"] if args.seed else []))


def train(args: argparse.Namespace, run: Any, student: torch.nn.Module, teacher: torch.nn.Module,
          settings: Distill) -> tuple[list[dict[str, float]], list[float], float]:
    """Distill `student` on `args.tokens` tokens; the perplexity curve, the loss per step (each on windows not yet
    trained on: the validation measure the settings are chosen by) and the passes over the text."""

    def evaluate() -> dict[str, float]:  # on the test windows, and on the tuning articles settings are chosen by
        return run.perplexities(student, args.eval_windows, args.eval_seqlen)

    curve = [{"tokens": 0, "seconds": 0.0, **evaluate()}]
    evaluation = [0.0]  # seconds spent evaluating inside the training run, left out of its seconds

    def after_step(report: DistillReport) -> None:
        if report.tokens // args.every > curve[-1]["tokens"] // args.every or report.tokens >= args.tokens:
            began = time.perf_counter()
            student.eval()
            measured = evaluate()
            student.train()
            evaluation[0] += time.perf_counter() - began
            curve.append({"tokens": report.tokens, "seconds": time.perf_counter() - trained - evaluation[0],
                          **measured, "loss": report.losses[-1]})
            logging.info("%s: %d tokens, %.0f s: ppl %.3f, tuning ppl %.3f", settings, report.tokens,
                         curve[-1]["seconds"], measured["ppl"], measured["tuning_ppl"])

    windows = calibration_windows(run.ids, -(-args.tokens // args.seqlen), args.seqlen, 1 + args.seed, run.bos)
    trained = time.perf_counter()
    report = distill(student, teacher, windows, settings, progress=False, after_step=after_step)
    return curve, report.losses, windows.numel() / run.ids.shape[1]


SECTIONS = {"recovery": Section(
    "recovery/*.json", "run | dense | pruned | perplexity (tuning perplexity) at tokens (training seconds) | lr | "
    "batch | last-quarter loss | passes over the text", lambda path, run: [
        (link(path, pv.row_of(path)), f"{run['ppl_dense']:.2f}", f"{run['curve'][0]['ppl']:.2f}",
         ", ".join(f"{p['ppl']:.2f}" + (f" ({p['tuning_ppl']:.2f})" if "tuning_ppl" in p else "")
                   + f" at {p['tokens']} ({p['seconds']:.0f} s)" for p in run["curve"][1:]),
         f"{run['lr']:g}", run.get("batch_size", 1), f"{sum(tail) / len(tail):.4f}", f"{run['passes']:.2f}")
        for tail in [run["losses"][-max(1, len(run["losses"]) // 4):]]],  # the last quarter of the steps' losses
    pv.CPU_RECOVERED, command=recorded)}


if __name__ == "__main__":
    main()
