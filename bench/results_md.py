"""Fill bench/RESULTS.md's tables (each between `<!-- generated: NAME -->` and `<!-- end: NAME -->`; the rest is
written by hand) and the README's results table from bench/results/: `python -m bench.results_md` (`make results`),
or with `--check` exit 1 where the README's table differs. A row is its run at the newest commit of this history
(the `@<commit>` of its file name), marked stale where the code it measures changed since (`bench.provenance`).
Each benchmark states the blocks of the files it writes (`bench.section`); this module fills those and its own: the
quality tables, the README's headline, the machines, time to quality, the CPU's shot phases and llm-compressor's runs.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from bench import provenance as pv
from bench.section import Row, Section, table
from bench.seeds import seed_spread, seeded

HEADLINE_START, HEADLINE_END = "<!-- results-table:start -->", "<!-- results-table:end -->"
# The README's headline: its rows (quality row prefix, label), and its models (quality folder, label, name in its note)
HEADLINE = (("structured-0.8", "structured 80%"), ("unstructured-0.5", "unstructured 50%"), ("2of4-0.5", "2:4"))
MODELS = (("quality", "SmolLM2-135M", "SmolLM2"), ("quality-gemma3-270m-8x256", "Gemma-3-270M", "Gemma-3-270M"))
NAMES = {"lobd": "L-OBD", "kobd": "K-OBD", "sparsegpt": "SparseGPT", "sparsegpt-refine": "sparsegpt-refine",
         "wanda": "Wanda", "llmc-sparsegpt": "llm-compressor SparseGPT", "llmc-wanda": "llm-compressor Wanda"}
MODIFIERS = {"sparsegpt": "SparseGPTModifier", "surgeon-sparsegpt": "SurgeonSparseGPTModifier (refine)",
             "surgeon-sparsegpt-exact": "SurgeonSparseGPTModifier (exact)"}
# What sets a run's result apart from the CLI's defaults (`PruneConfig.resolved`); backends, batches, memory options
# and the like do not
SETTINGS = ("method", "shots", "correlation", "max_correlate", "cg_tol", "cg_dtype", "damp_a", "damp_g", "propagate",
            "held_out_choice", "lora_steps", "kronecker_terms", "fisher", "layer_deviation", "nm_mask")
# The quality rows the time-to-quality table sets beside its points
TTQ_ROWS = ("structured-0.8-surgeon", "structured-0.8-surgeon-lora20", "unstructured-0.5-surgeon",
            "unstructured-0.5-surgeon-shots2", "2of4-0.5-surgeon", "2of4-0.5-surgeon-4shots", "4of8-0.5-surgeon",
            "4of8-0.5-surgeon-4shots")


def perplexities(run: pv.Run) -> tuple[str, str]:
    """A run's perplexity on the test windows and on the tuning articles ("-" where it was not measured)."""
    return f"{run['ppl']:.3f}", f"{run['tuning_ppl']:.3f}" if "tuning_ppl" in run else "-"


def quality_table(runs: pv.Runs) -> str:
    """The quality table: the dense run, then each pruned row's settings, sparsity, perplexity, seconds and commit."""

    def bounded(c: pv.Run) -> str:  # the layers' deviation, recorded before as an allocation: global or per-layer
        deviation = c.get("layer_deviation", 0.0 if c.get("allocation") == "per-layer" else 1.0)
        return "" if deviation >= 1 else ", per-layer allocation" if not deviation else f", layers ±{deviation:g}"

    def method(c: pv.Run) -> str:  # as the table names it
        sampled = ", G of sampled labels" if c.get("fisher") == "sampled" else ""
        if c["method"] == "surgeon" and c["structure"] == "structured":
            return f"surgeon/{c['correlation']}{sampled}"
        name = c["method"] if c["method"] != "surgeon" else (
            f"surgeon/m={c['max_correlate']} {c.get('chunk_semantics', 'independent')}" if c["max_correlate"]
            else "surgeon/all jointly (CG)")
        mask = f", masks by {c['nm_mask']}" if c.get("nm_mask", "costs") != "costs" else ""
        return name + (", last shot propagated" if c.get("propagate") else "") + sampled + bounded(c) + mask

    tuned = any("tuning_ppl" in run for run in runs.values())  # a column where the set measured it

    def ppl(run: pv.Run) -> tuple[str, ...]:
        return perplexities(run)[:2 if tuned else 1]

    dense = runs["dense"]
    rows: list[Row] = [("dense", "-", "1.0", "-", "-", "-", 0, *ppl(dense), f"{dense['seconds']:.0f}",
                        pv.mark(dense["commit"], pv.CPU_PRUNING))]
    rows += [(name, c["structure"], f"{c['target_size']:g}", method(c) + (
        f"; kept {run['choice']['kept']} by held-out loss" + (" of the rows run apart" if run["choice"].get(
            "from_rows_apart") else "") if run.get("choice") else ""), c["shots"],
              f"{c['damp_g']} / {c['damp_a']}", f"{run['sparsity']:.4f}", *ppl(run), f"{run['seconds']:.0f}",
              pv.mark(run["commit"], pv.CPU_PRUNING))
             for name, run in runs.items() if name != "dense" and seeded(name) is None for c in [run["config"]]]
    return "\n".join(table("run | structure | kept | method | shots | λ_G / λ_A | sparsity | ppl | "
                           + ("tuning ppl | " if tuned else "") + "seconds | commit", rows))


def headline_cells(runs: pv.Runs, prefix: str) -> tuple[str, list[str]]:
    """The best baseline's and the CLI's default run's perplexity at one structure ('- | -' if either was not run),
    and the rows they quote."""
    # The lower in bold, a second decimal where one would print them alike, the method whose model the default kept
    # where the held-out choice kept another's ("sparsegpt-refine (kept)"). A run ran the defaults where its SETTINGS
    # are `PruneConfig.resolved`'s for its structure and target (those it predates count)
    def ran_defaults(c: pv.Run) -> bool:
        default = pv.cli_defaults(c["structure"], c["target_size"]).resolved()
        return c.get("allocation", "global") == "global" and all(c[key] == default[key] for key in SETTINGS if key in c)

    rows = {name[len(prefix) + 1:]: run for name, run in runs.items() if name.startswith(prefix + "-")}
    baselines = {m: r["ppl"] for m, r in rows.items() if m in NAMES}
    surgeon = [name for name, run in sorted(rows.items()) if name.startswith("surgeon") and ran_defaults(run["config"])]
    if not baselines or not surgeon:
        return "- | -", []
    best = min(baselines, key=baselines.__getitem__)
    choice = rows[surgeon[0]].get("choice") or {}
    whose = f"{choice['kept']} (kept) " if choice.get("kept", "surgeon") != "surgeon" else ""
    cells = [(NAMES[best] + " ", baselines[best]), (whose, rows[surgeon[0]]["ppl"])]
    digits = 2 if len({f"{value:.1f}" for _, value in cells}) == 1 else 1
    return " | ".join(f"{label}**{value:.{digits}f}**" if value == min(v for _, v in cells) else
                      f"{label}{value:.{digits}f}" for label, value in cells), [f"{prefix}-{best}",
                                                                                  f"{prefix}-{surgeon[0]}"]


def runnable(runs: pv.Runs) -> pv.Runs:
    """The runs of rows a command still runs: `bench.quality.table`'s by id (also with another seed) and
    `bench.quality.peers`' (`-llmc-`). A row measured once under settings no command names any more is shown by the
    finding that cites its file, not in a table that would mark it stale for good."""
    from bench.quality.table import runnable_rows  # on demand: it imports torch

    named = runnable_rows(shots_structured=4, shots_element=4)
    return {name: run for name, run in runs.items()
            if name == "dense" or "-llmc-" in name or (seeded(name) or (name, 0))[0] in named}


def quality_block(folder: str) -> list[str]:
    """A quality folder's table under the model and budget it was measured at, then its spread over seeds."""
    if "dense" not in (runs := runnable(pv.newest_runs(folder))):
        raise SystemExit(f"no bench/results/{folder}/dense@<commit>.json: run `python -m bench.quality.table`")
    dense = runs["dense"]
    return [f"{dense.get('model', 'smollm2-135m')}, {dense['calib_windows']} × {dense['calib_seqlen']} calibration "
            f"tokens, perplexity on the first {dense['eval_windows']} test windows of 2048"
            + (", each begun with the tokenizer's BOS." if dense.get("eval_bos") else "."), "", quality_table(runs),
            *seed_spread(runs)]


def machines() -> list[str]:
    """The machines the rows were measured on: the CPUs, and each GPU with its torch."""
    gpus = {f"{run['device']}, torch {run.get('torch', '?')}"
            for run in map(pv.load, pv.RESULTS.glob("gpu/shot-*.json"))}
    return [f"- CPU: the quality table's, {pv.newest_runs('quality')['dense'].get('machine', 'unknown')}.",
            *(f"- GPU: {gpu}." for gpu in sorted(gpus))]


def time_to_quality() -> list[str]:
    """Each structure's LLM Surgeon rows and time-to-quality points by seconds."""
    runs = pv.newest_runs("quality")
    found = sorted([(name, runs[name]) for name in TTQ_ROWS if name in runs] + list(pv.newest_runs("ttq").items()),
                   key=lambda item: (item[0].split("-")[0], item[1]["seconds"]))
    return table("point | structure | shots | CG tolerance | damping G | propagated | LoRA steps | kept by held-out "
                 "loss | perplexity | tuning perplexity | seconds | commit", [
                     (name, c["structure"], c["shots"], f"{c['cg_tol']:g}", f"{c['damp_g']:g}",
                      "yes" if c.get("propagate") else "no", c["lora_steps"],
                      (run.get("choice") or {}).get("kept", "–"), *perplexities(run), f"{run['seconds']:.0f}",
                      pv.mark(run["commit"], pv.CPU_PRUNING))
                     for name, run in found for c in [run["config"]]])


def oneshot_rows(path: Path, run: pv.Run) -> list[Row]:
    """An llm-compressor `oneshot` run's row: its modifier at its structure, timed against SparseGPTModifier's run at
    the same commit (none for a run with another calibration seed, whose row is in the seed spread)."""
    if seeded(pv.row_of(path)) is not None:
        return []
    structure, _, modifier = pv.row_of(path).partition("-0.5-llmc-")
    peer = path.with_name(f"{structure}-0.5-llmc-sparsegpt@{pv.commit_of(path)}.json")
    return [(structure.replace("of", ":") + " 0.5", MODIFIERS[modifier], f"{run['ppl']:.3f}", f"{run['seconds']:.0f}",
             f"{run['seconds'] / pv.load(peer)['seconds']:.2f}×" if peer.exists() else "–")]


# The generated blocks of RESULTS.md that only this module fills: the quality tables (`quality_block`) and these
SECTIONS: dict[str, Callable[[], list[str]]] = {
    "machines": machines,
    "time-to-quality": time_to_quality,
    "cpu-time": Section(
        "cpu/smollm2-structured80@*.json", "shot | curvature s | costs s | threshold s | update s | peak RSS GiB",
        lambda path, run: [(shot["shot"], f"{shot['seconds']['curvature']:.1f}",
                            *(f"{shot['seconds'].get(phase, 0):.2f}" for phase in ("costs", "threshold", "update")),
                            f"{shot['peak_memory_gb']:.2f}") for shot in run["shots"]], pv.CPU_PRUNING, newest="file",
        intro=lambda run: (
            f"Perplexity {run['ppl_before']:.4f} → {run['ppl_after']:.4f}, {run['seconds']:.1f} s in all:\n\n"
            f"    surgeon prune --model {run['run']['model']} --structure {run['config']['structure']} --target-size "
            f"{run['config']['target_size']} --shots {run['config']['shots']} --nsamples {run['run']['nsamples']} "
            f"--seqlen {run['run']['seqlen']} --eval-seqlen {run['run']['eval_seqlen']} --eval-windows "
            f"{run['run']['eval_windows']} --calibration {run['run']['calibration']} --output DIR")),
    "oneshot": Section("quality/*-llmc-*sparsegpt*@*.json",
                       "structure | modifier | ppl | seconds | time against SparseGPTModifier", oneshot_rows,
                       pv.CPU_PRUNING, newest="row"),
}
# The benchmarks that state the blocks of the files they write (their `SECTIONS`)
WRITERS = ("bench.timing.progress_gaps", "bench.timing.shot_time", "bench.timing.distributed_time",
           "bench.timing.memory_options", "bench.timing.plan_table", "bench.timing.generation_speed",
           "bench.timing.serve_speed", "bench.quality.recovery", "bench.serving.pipeline", "bench.quality.coupled",
           "bench.quality.sparsegpt_dropin", "bench.kernels.gpu_kernels")


def blocks() -> dict[str, list[str]]:
    """The generated blocks of RESULTS.md by name: each replaces what stands between its markers."""
    folders = ["quality", *(path.name for path in sorted(pv.RESULTS.glob("quality-*")) if path.is_dir())]
    writers = [importlib.import_module(module).SECTIONS for module in WRITERS]  # on demand: they import torch
    return {**{folder: quality_block(folder) for folder in folders},
            **{name: block() for sections in (SECTIONS, *writers) for name, block in sections.items()}}


def between(text: str, start: str, end: str, lines: list[str], document: str) -> str:
    """`text` with `lines` between its markers `start` and `end`, which `document` must hold."""
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{document} has no {start} … {end} block")
    return pattern.sub(lambda _: "\n".join([start, *lines, end]), text)


def readme_with_headline(readme: str) -> str:
    """`readme` with its results table filled from each model's newest quality runs."""
    labels, columns, notes = [], [], []
    for folder, label, short in MODELS:
        if (pv.RESULTS / folder).is_dir():
            labels.append(label)
            runs = pv.newest_runs(folder)
            cells = [headline_cells(runs, prefix) for prefix, _ in HEADLINE]
            commits = sorted({runs[row]["commit"] for _, rows in cells for row in [*rows, "dense"]},
                             key=pv.commit_order().__getitem__, reverse=True)
            columns.append([text for text, _ in cells])
            stale = any(pv.code_changed(commit, None, pv.CPU_PRUNING) for commit in commits)
            bos = ", every window begun with BOS" if runs["dense"].get("eval_bos") else ""
            notes.append(f"{short} (dense {runs['dense']['ppl']:.2f}{bos}) at " + ", ".join(f"`{c}`" for c in commits)
                         + (" (stale)" if stale else ""))
    return between(readme, HEADLINE_START, HEADLINE_END, [
        *table("structure | " + " | ".join(f"{label}: best baseline | default run" for label in labels),
               [(label, *(cells[n] for cells in columns)) for n, (_, label) in enumerate(HEADLINE)]),
        "", f"Perplexity on WikiText-2: {'; '.join(notes)}; every row and method in `bench/RESULTS.md`."], "README.md")


def main() -> int:
    """Fill README.md's and RESULTS.md's tables, or with --check only compare README.md's (1: it differs)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that README.md's table is current")
    check = parser.parse_args().check
    readme_path, results_path = pv.ROOT / "README.md", pv.ROOT / "bench" / "RESULTS.md"
    readme = readme_path.read_text()
    updated = readme_with_headline(readme)
    if check:
        if updated != readme:
            print("README.md's results table differs from bench/results/quality: run `make results`", file=sys.stderr)
        return int(updated != readme)
    results = results_path.read_text()
    for name, lines in blocks().items():
        results = between(results, f"<!-- generated: {name} -->", f"<!-- end: {name} -->", lines, "bench/RESULTS.md")
    readme_path.write_text(updated)
    results_path.write_text(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
