"""Perplexity against pruning seconds for LLM Surgeon on SmolLM2, as the shots and the solve's settings vary.

    python bench/time_to_quality.py [--only unstructured]

The protocol of bench/quality.py (8 × 512 calibration tokens, perplexity on 8 test windows of 2048
tokens). Each point changes one setting of a fixed reference (4 shots, conjugate gradients to a
relative residual of 1e-4 or 40 iterations, λ_G = 0.1, nothing propagated), and pins the rest: fewer
shots, a looser tolerance or a lower iteration cap, and for N:M one shot, weaker damping of G, or
the last shot propagated block by block (with stronger damping of G), at 2:4 and 4:8; structured
80% with 8 shots or 20 interleaved LoRA steps per shot (sec. 3.6). Each point is saved as
bench/results/ttq/<point>@<commit>.json and skipped when that file exists;
`python bench/results_md.py` draws the table into RESULTS.md, `python bench/time_to_quality.py
--figure` the curves into docs/figures/time-to-quality.png. Run it alone: the seconds are wall time.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.quality import measure, protocol_of, protocol_parser, smollm2_protocol  # noqa: E402
from surgeon import PruneConfig  # noqa: E402
from surgeon.io import write_json  # noqa: E402

ROOT = Path(__file__).resolve().parent / "results" / "ttq"
UNSTRUCTURED = dict(structure="unstructured", target_size=0.5, cg_tol=1e-4)
POINTS = {
    "unstructured-0.5-shots1": PruneConfig(**UNSTRUCTURED, shots=1),
    "unstructured-0.5-shots2": PruneConfig(**UNSTRUCTURED, shots=2),
    "unstructured-0.5-shots3": PruneConfig(**UNSTRUCTURED, shots=3),
    "unstructured-0.5-cg-iter20": PruneConfig(**UNSTRUCTURED, shots=4, cg_max_iter=20),
    "unstructured-0.5-cg-tol1e-3": PruneConfig(**{**UNSTRUCTURED, "cg_tol": 1e-3}, shots=4),
    "unstructured-0.5-shots2-cg-iter20": PruneConfig(**UNSTRUCTURED, shots=2, cg_max_iter=20),
    **{name: PruneConfig(structure=structure, **settings) for name, structure, settings in (
        ("2of4-0.5-shots1", "2:4", dict(shots=1, propagate=False, damp_g=0.1)),
        ("2of4-0.5-damp-g0.01", "2:4", dict(shots=4, propagate=False, damp_g=0.01)),
        ("2of4-0.5-propagate", "2:4", dict(shots=4, propagate=True, damp_g=0.1)),
        ("2of4-0.5-shots1-propagate", "2:4", dict(shots=1, propagate=True, damp_g=0.1)),
        ("2of4-0.5-shots1-propagate-damp-g0.3", "2:4", dict(shots=1, propagate=True, damp_g=0.3)),
        ("2of4-0.5-shots1-propagate-damp-g1", "2:4", dict(shots=1, propagate=True, damp_g=1.0)),
        ("2of4-0.5-shots1-propagate-damp-g10", "2:4", dict(shots=1, propagate=True, damp_g=10.0)),
        ("4of8-0.5-shots1-propagate-damp-g1", "4:8", dict(shots=1, propagate=True, damp_g=1.0)),
        ("4of8-0.5-shots4", "4:8", dict(shots=4, propagate=False, damp_g=0.1)),
        ("4of8-0.5-shots1-propagate", "4:8", dict(shots=1, propagate=True, damp_g=0.1)))},
    "unstructured-0.5-cg-bfloat16": PruneConfig(structure="unstructured", target_size=0.5, shots=4,
                                                cg_dtype="bfloat16"),
    "structured-0.8-shots1": PruneConfig(structure="structured", target_size=0.8, shots=1),
    "structured-0.8-shots2": PruneConfig(structure="structured", target_size=0.8, shots=2),
    "structured-0.8-shots8": PruneConfig(structure="structured", target_size=0.8, shots=8),
    "unstructured-0.5-shots2-defaults": PruneConfig(structure="unstructured", target_size=0.5, shots=2),
    "structured-0.8-lora20": PruneConfig(structure="structured", target_size=0.8, shots=4, lora_steps=20),
}


# Points calibrated on more windows than the protocol's (the same sampler and seed).
CALIBRATION = {"unstructured-0.5-shots2-calib16": 16, "2of4-0.5-calib16": 16}
POINTS.update({"unstructured-0.5-shots2-calib16": PruneConfig(structure="unstructured", target_size=0.5, shots=2),
               "2of4-0.5-calib16": PruneConfig(structure="2:4")})


FIGURE = Path(__file__).resolve().parents[1] / "docs" / "figures" / "time-to-quality.png"


def draw(path: Path = FIGURE) -> None:
    """Perplexity against pruning seconds, one panel per structure: the saved points and the quality table's
    LLM Surgeon rows (bench/results) within 1.6× the panel's best, the peer's SparseGPT for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.results_md import load, quality_runs

    points = [(p.stem.rsplit("@", 1)[0], load(p)) for p in sorted(ROOT.glob("*.json"))]
    commit, runs = quality_runs()
    table = [(name, run) for name, run in runs.items() if "-surgeon" in name and "llmc" not in name]
    peers = {name.split("-0.5")[0]: run for name, run in runs.items() if name.endswith("-llmc-sparsegpt")}
    panels = (("unstructured-0.5", "unstructured 50%"), ("2of4-0.5", "2:4"), ("4of8-0.5", "4:8"),
              ("structured-0.8", "structured 80%"))
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for axis, (prefix, title) in zip(axes, panels):
        best = min(run["ppl"] for name, run in points + table if name.startswith(prefix))
        for label, runs, marker in (("time-to-quality points", points, "o"), (f"quality table @{commit}", table, "s")):
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
    parser = protocol_parser(__doc__)
    parser.add_argument("--figure", action="store_true", help=f"only draw the saved points into {FIGURE.name}")
    args = parser.parse_args()
    if args.figure:
        draw()
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model, dense_state, test_ids, protocol_windows = smollm2_protocol(args.calib_windows, args.calib_seqlen)
    windows = {args.calib_windows: protocol_windows}  # by count, drawn when a point first needs them
    ROOT.mkdir(parents=True, exist_ok=True)
    for name, config in POINTS.items():
        count = CALIBRATION.get(name, args.calib_windows)
        protocol = {**protocol_of(args), "calib_windows": count}
        path = ROOT / f"{name}@{protocol['commit']}.json"
        if path.exists() or args.only not in name:
            continue
        if count not in windows:
            windows[count] = smollm2_protocol(count, args.calib_seqlen)[3]
        result = measure(model, dense_state, windows[count], test_ids, config, args.eval_windows)
        logging.info("%s: ppl %.3f (%.0f s)", name, result["ppl"], result["seconds"])
        write_json(path, {**result, **protocol})


if __name__ == "__main__":
    main()
