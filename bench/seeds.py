"""Rows run over calibration seeds: a row `<row>-seed<s>` is `<row>` with its calibration windows drawn with seed s
(`--seeds` of `bench.quality.table`, `bench.quality.coupled` and `bench.quality.peers`), and the seed spread is the
table of each row's perplexity per seed, mean and range, the measure against which a gap between two rows is called
a win."""

from __future__ import annotations

import argparse

from bench import provenance as pv
from bench.section import table


def add_seeds_option(parser: argparse.ArgumentParser) -> None:
    """`--seeds`: each row runs once per calibration seed, a seed s > 0 as the row `seed_row(row, s)`."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="calibration seeds: each row runs once per seed, a seed s > 0 as the row <id>-seed<s>")


def seed_row(row: str, seed: int) -> str:
    """The name of `row` run with its calibration windows drawn with `seed` (seed 0: the row itself)."""
    return f"{row}-seed{seed}" if seed else row


def seeded(name: str) -> tuple[str, int] | None:
    """(row, seed) of a row run with another calibration seed (`<row>-seed<s>`), else None."""
    row, _, seed = name.rpartition("-seed")
    return (row, int(seed)) if row and seed.isdigit() else None


def alike(run: pv.Run, base: pv.Run) -> bool:
    """Whether two runs differ only by what they measure: one commit, or the same pruning code on the same machine."""
    return run["commit"] == base["commit"] or (run.get("machine") is not None and run.get("machine") == base.get(
        "machine") and pv.same_code(run["commit"], base["commit"]))


def seed_spread(runs: pv.Runs) -> list[str]:
    """Per row also run with other calibration seeds alike to it (`alike`): each seed's perplexity, their mean and
    range, on the test and, where measured, on the tuning windows."""
    spread: dict[str, dict[int, pv.Run]] = {}
    for name, run in runs.items():
        if (found := seeded(name)) is not None and found[0] in runs and alike(run, runs[found[0]]):
            spread.setdefault(found[0], {0: runs[found[0]]})[found[1]] = run

    def summary(values: list[float]) -> tuple[str, str]:  # mean, range
        return (f"{sum(values) / len(values):.3f}", f"{min(values):.3f}–{max(values):.3f}") if values else ("-", "-")

    tuned = any("tuning_ppl" in run for seeds in spread.values() for run in seeds.values())
    rows = [(row, ", ".join(map(str, sorted(seeds))), ", ".join(f"{seeds[s]['ppl']:.3f}" for s in sorted(seeds)),
             *summary([r["ppl"] for r in seeds.values()]),
             *(summary([r["tuning_ppl"] for r in seeds.values() if "tuning_ppl" in r]) if tuned else ()))
            for row, seeds in sorted(spread.items())]
    return ["", "Over calibration seeds (the rows `<row>-seed<s>`: the calibration windows drawn with seed s, "
            "`--seeds`): a gap between two rows is a win only where it exceeds both rows' ranges.", "",
            *table("row | seeds | perplexity per seed | mean | range" + (" | tuning mean | tuning range" if tuned
                                                                         else ""), rows)] if rows else []
