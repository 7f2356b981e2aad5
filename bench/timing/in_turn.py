"""Speed measured in fresh processes, the models in turn over several rounds: the driver of the speed benchmarks.

Each model runs in a process of its own, so that its peak memory and its runtime's state are its own, and the
models alternate round by round, so that a drift in the machine's speed favours none of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser, models: str, rounds: int) -> None:
    """The arguments every speed benchmark takes: the models (`models` says which kinds), one label each, the
    timed runs per figure, the rounds, and `--one` (the fresh process: measure one model, print JSON)."""
    parser.add_argument("models", nargs="+", help=models)
    parser.add_argument("--label", nargs="+", help="one name per model for the result files (default: folder names)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure, after one untimed warm-up")
    parser.add_argument("--rounds", type=int, default=rounds, help="measure every model this many times, in turn")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)


def labels(parser: argparse.ArgumentParser, models: list[str], given: list[str] | None) -> list[str]:
    """One name per model for the result files: `given`, else each model's folder name."""
    names = given or [Path(model).name for model in models]
    if len(names) != len(models):
        parser.error("give one --label per model")
    return names


def run_in_turn(module: str, models: list[str], rounds: int, flags: list[str]) -> list[list[dict]]:
    """Each model's results over `rounds` rounds: `python -m MODULE MODEL --one FLAGS` from the repository root in a
    fresh process, every model once per round, the JSON on the last line it prints."""
    results: list[list[dict]] = [[] for _ in models]
    for _ in range(rounds):
        for model, runs in zip(models, results):
            where = str(Path(model).resolve()) if Path(model).exists() else model  # a folder, or a hub id
            output = subprocess.run([sys.executable, "-m", module, where, "--one", *flags], capture_output=True,
                                    text=True, check=True, cwd=ROOT).stdout
            runs.append(json.loads(output.strip().splitlines()[-1]))
    return results


def median_of(runs: list[dict], fields: tuple[str, ...]) -> dict:
    """The first run's result with each of `fields` the median over the runs (per key where it is a dict), and
    `rounds`."""
    merged = dict(runs[0], rounds=len(runs))
    for field in fields:
        first = runs[0][field]
        merged[field] = ({key: statistics.median(run[field][key] for run in runs) for key in first}
                         if isinstance(first, dict) else statistics.median(run[field] for run in runs))
    return merged
