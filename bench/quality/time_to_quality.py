"""The time-to-quality curves behind the CLI's default number of shots: perplexity against pruning seconds.

    python -m bench.quality.time_to_quality [--only unstructured]

The protocol of bench/quality/table.py (8 × 512 calibration tokens, perplexity on 8 test windows of 2048
tokens) and the CLI's defaults but the shots: structured 80% in 1, 2 and 8 shots, unstructured 50% in
1, 3 and 8 (the quality table holds 4 shots of both, 2 of unstructured, and N:M's one propagated shot and
4 shots). Each point is saved as bench/results/ttq/<point>@<commit>.json and skipped where one on the same
machine at a commit with the same pruning code exists; `make results` puts the curves into RESULTS.md,
`python -m bench.quality.time_to_quality --figure` draws them into docs/figures/time-to-quality.png. Run it
alone: the seconds are wall time.
"""

from __future__ import annotations

import logging
from pathlib import Path

from bench.quality.table import load_protocol, measure, measured, parse_protocol, protocol_of, protocol_parser
from surgeon import PruneConfig
from surgeon.io import write_json

ROOT = Path(__file__).resolve().parents[1] / "results" / "ttq"
POINTS = {f"{structure}-{size}-shots{shots}": PruneConfig(structure=structure, target_size=size, shots=shots)
          for structure, size, counts in (("structured", 0.8, (1, 2, 8)), ("unstructured", 0.5, (1, 3, 8)))
          for shots in counts}


FIGURE = Path(__file__).resolve().parents[2] / "docs" / "figures" / "time-to-quality.png"


def draw(path: Path = FIGURE) -> None:
    """Perplexity against pruning seconds, one panel per structure: the saved points and the quality table's
    LLM Surgeon rows (bench/results) within 1.6× the panel's best, the peer's SparseGPT for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.provenance import newest_runs

    runs = newest_runs("quality")
    points = list(newest_runs("ttq").items())
    table = [(name, run) for name, run in runs.items() if "-surgeon" in name and "llmc" not in name]
    peers = {name.split("-0.5")[0]: run for name, run in runs.items() if name.endswith("-llmc-sparsegpt")}
    panels = (("unstructured-0.5", "unstructured 50%"), ("2of4-0.5", "2:4"), ("4of8-0.5", "4:8"),
              ("structured-0.8", "structured 80%"))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for axis, (prefix, title) in zip(axes, panels):
        best = min(run["ppl"] for name, run in points + table if name.startswith(prefix))
        for label, runs, marker in (("time-to-quality points", points, "o"), ("quality table", table, "s")):
            chosen = [(name, run) for name, run in runs if name.startswith(prefix) and run["ppl"] <= 1.6 * best]
            axis.scatter([run["seconds"] for _, run in chosen], [run["ppl"] for _, run in chosen], marker=marker,
                         label=label)
            for name, run in chosen:
                axis.annotate(name[len(prefix) + 1:] or "default", (run["seconds"], run["ppl"]), fontsize=6)
        peer = peers.get(prefix.split("-")[0])
        if peer is not None:
            axis.scatter([peer["seconds"]], [peer["ppl"]], marker="x", color="black", label="llm-compressor SparseGPT")
        axis.set(title=title, xlabel="pruning seconds (2 CPU cores)", ylabel="perplexity (WikiText-2)")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = protocol_parser(__doc__, ("smollm2-135m",))
    parser.add_argument("--figure", action="store_true", help=f"only draw the saved points into {FIGURE.name}")
    args = parse_protocol(parser)
    if args.figure:
        draw()
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run = load_protocol(args.model, args.calib_windows, args.calib_seqlen)
    ROOT.mkdir(parents=True, exist_ok=True)
    for name, config in POINTS.items():
        protocol = protocol_of(args, run)
        path = ROOT / f"{name}@{protocol['commit']}.json"
        if args.only not in name or measured(path, protocol["machine"]):
            continue
        result = measure(run, config, args.eval_windows)
        logging.info("%s: ppl %.3f (%.0f s)", name, result["ppl"], result["seconds"])
        write_json(path, {**result, **protocol})


if __name__ == "__main__":
    main()
