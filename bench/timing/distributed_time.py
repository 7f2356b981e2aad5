"""Seconds and perplexity of `surgeon prune` in one process and split over torchrun ranks (gloo), SmolLM2 on the CPU.

    python -m bench.timing.distributed_time [--ranks 1 2] [--only structured] [--split blocks]

Runs the CPU protocol (8 calibration windows of 512 tokens, 4 shots, perplexity on the first 8
test windows of 2048 tokens) through the CLI: one process with every core, then
`torchrun --standalone --nproc-per-node N -m surgeon prune …` with one thread per rank, split by
batches, or with `--split blocks` by blocks (torchrun runs only). Writes
bench/results/cpu/ranks-smollm2-<structure>[-by-blocks]@<commit>.json (skipped when it exists) with
each run's per-shot seconds, the time in collectives and the perplexity; `python -m bench.results_md`
puts them into RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import provenance as pv
from bench.machine import cpu_machine
from bench.section import Section, link

ROOT = Path(__file__).resolve().parents[1]  # bench/

STRUCTURES = {"structured-0.8": ("structured", 0.8), "unstructured-0.5": ("unstructured", 0.5), "2of4": ("2:4", 0.5)}


def head_commit() -> str:
    """The short hash of the checked-out commit, which names the result files."""
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def prune_args(structure: str, size: float, output: str) -> list[str]:
    return ["-m", "surgeon", "--quiet", "prune", "--model", "smollm2-135m", "--structure", structure,
            "--target-size", str(size), "--shots", "4", "--nsamples", "8", "--seqlen", "512", "--eval-seqlen",
            "2048", "--eval-windows", "8", "--calibration", "wikitext2-valid", "--output", output]


def run(structure: str, size: float, ranks: int, split: str) -> dict:
    """One `surgeon prune` run on `ranks` processes: its command and report.json."""
    with tempfile.TemporaryDirectory() as folder:
        args = prune_args(structure, size, folder) + (["--curvature-split", split] if ranks > 1 else [])
        env = dict(os.environ)
        if ranks > 1:
            args = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] + args
            env["OMP_NUM_THREADS"] = "1"
        subprocess.run([sys.executable, *args], check=True, cwd=ROOT.parent, env=env)
        report = json.loads((Path(folder) / "report.json").read_text())
    command = " ".join(["python", *args] if ranks == 1 else ["torchrun", *args[2:]]).replace(folder, "DIR")
    shots = report["shots"]
    return {"ranks": ranks, "split": split if ranks > 1 else None, "command": command, "ppl": report["ppl_after"],
            "sparsity": report["sparsity"],
            "prune_seconds": sum(s["seconds"]["curvature"] + s["seconds"]["prune"] for s in shots),
            "collective_seconds": sum(s["seconds"].get("collectives", 0.0) for s in shots),
            "shots": shots, "seconds": report["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--only", default="", help="structures whose id contains this text")
    parser.add_argument("--split", default="batches", choices=["batches", "blocks"])
    args = parser.parse_args()
    commit = head_commit()
    for key, (structure, size) in STRUCTURES.items():
        suffix = "-by-blocks" if args.split == "blocks" else ""
        path = ROOT / "results" / "cpu" / f"ranks-smollm2-{key}{suffix}@{commit}.json"
        if args.only not in key or path.exists():
            continue
        runs = [run(structure, size, ranks, args.split) for ranks in args.ranks
                if ranks > 1 or args.split == "batches"]
        result = {"structure": structure, "target_size": size, "commit": commit,
                  "machine": cpu_machine(os.cpu_count() or 1),
                  "runs": runs}
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(key, " · ".join(f"{r['ranks']} rank(s): {r['prune_seconds']:.1f} s, ppl {r['ppl']:.3f}" for r in runs))


SECTIONS = {"ranks": Section(
    "cpu/ranks-smollm2-*.json", "structure | ranks | split | prune s | in collectives s | perplexity | command",
    lambda path, result: [
        (link(path, f"{result['structure']} {result['target_size']}"), run["ranks"], run.get("split") or "-",
         f"{run['prune_seconds']:.1f}", f"{run['collective_seconds']:.1f}", f"{run['ppl']:.3f}",
         f"`{run['command']}`") for run in result["runs"]], pv.CPU_PRUNING)}


if __name__ == "__main__":
    main()
