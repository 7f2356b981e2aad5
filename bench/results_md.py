"""Fill the generated tables of bench/RESULTS.md, and the README's results table, from bench/results/.

RESULTS.md is written by hand; each table stands between `<!-- generated: NAME -->` and
`<!-- end: NAME -->`, and this script rewrites only what is between them.

    python -m bench.results_md            # fill both (`make results`)
    python -m bench.results_md --check    # exit 1 if the README's table differs from the quality runs

Every figure names the commit it was measured at (the `@<commit>` of its file name, or the commit
recorded inside it). Rows are marked stale when the code they measure changed between that commit
and the working tree: `surgeon/`, `surgeon_kernels/` and `csrc/`, less the export, planning and
figure modules for pruning runs (and the Triton kernels for runs on a CPU), and a kernel's own files for
its microbenchmark.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import subprocess
import sys
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CODE = ("surgeon", "surgeon_kernels", "csrc")
# What a benchmark's pruning run executes: the code less the commands' own modules (the benchmarks call the library)
# and what only writes (the compact export), plans, draws, recovers or quantizes its results afterwards; with its
# compact export (EXPORTED): less only those; a recovery row (RECOVERED): the pruning run's and the recovery's
COMMANDS = ("app/cli", "app/settings", "app/run", "app/recover", "scale/plan", "scale/time_model", "app/figures",
            "*/quantize")
RECOVERY, EXPORT = ("recovery/distill", "recovery/__init__"), ("export/compact", "models/compact_modeling")
EXCLUDE = ":(exclude)surgeon/{}.py".format
PRUNING = (*CODE, *map(EXCLUDE, (*EXPORT, *COMMANDS, *RECOVERY)))
EXPORTED = (*CODE, *map(EXCLUDE, (*COMMANDS, *RECOVERY)))
# On a CPU `auto` never runs a Triton kernel (only under TRITON_INTERPRET=1, which the tests set): runs there leave
# them out as well
TRITON = ":(exclude,glob)surgeon_kernels/*/kernel.py"
CPU_PRUNING, CPU_EXPORTED = (*PRUNING, TRITON), (*EXPORTED, TRITON)
CPU_RECOVERED = (*CODE, TRITON, *map(EXCLUDE, (*EXPORT, *COMMANDS)))
SERVING = ("surgeon/export", "surgeon/models/compact_modeling.py")  # the export that wrote the checkpoint vLLM serves
# Kernel microbenchmark → the code it measures (anything else: all of CODE).
KERNEL_CODE = {
    "kfac_accumulate": ("surgeon_kernels/kfac_accumulate", "csrc/kfac_accumulate", "surgeon_kernels/symmetric.py"),
    "kk_gather": ("surgeon_kernels/kk_gather",), "nm_select": ("surgeon_kernels/nm_select", "csrc/nm_select"),
    "kk_solve": ("surgeon_kernels/kk_solve", "surgeon_kernels/kk_gather", "csrc/kk_solve"),
    "global_threshold": ("surgeon_kernels/kth_smallest",), "kth_smallest": ("surgeon_kernels/kth_smallest",),
    "batched_eigh": ("surgeon_kernels/batched_eigh",),
    "unstructured_update": ("surgeon/method/updates.py", "surgeon/method/inverses.py", "surgeon_kernels/kk_solve",
                            "surgeon_kernels/kk_gather")}
HEADLINE_START, HEADLINE_END = "<!-- results-table:start -->", "<!-- results-table:end -->"
# The README's headline: its rows (quality row prefix, label), and its models (quality folder, label, name in its note)
HEADLINE = (("structured-0.8", "structured 80%"), ("unstructured-0.5", "unstructured 50%"), ("2of4-0.5", "2:4"))
MODELS = (("quality", "SmolLM2-135M", "SmolLM2"), ("quality-gemma3-270m-8x256", "Gemma-3-270M", "Gemma-3-270M"))
NAMES = {"lobd": "L-OBD", "kobd": "K-OBD", "sparsegpt": "SparseGPT", "sparsegpt-refine": "sparsegpt-refine",
         "wanda": "Wanda", "llmc-sparsegpt": "llm-compressor SparseGPT", "llmc-wanda": "llm-compressor Wanda"}
# What sets a run's result apart from the CLI's defaults (`PruneConfig.resolved`); backends, batches, memory options
# and the like do not
SETTINGS = ("method", "shots", "correlation", "max_correlate", "cg_tol", "cg_dtype", "damp_a", "damp_g", "propagate",
            "held_out_choice", "lora_steps", "kronecker_terms", "fisher")
# The quality rows the time-to-quality table sets beside its points
TTQ_ROWS = ("structured-0.8-surgeon", "structured-0.8-surgeon-lora20", "unstructured-0.5-surgeon",
            "unstructured-0.5-surgeon-shots2", "2of4-0.5-surgeon", "2of4-0.5-surgeon-4shots", "4of8-0.5-surgeon",
            "4of8-0.5-surgeon-4shots")
Run = dict[str, Any]
Runs = dict[str, Run]
Paths = tuple[str, ...]
Row = tuple[Any, ...]


def load(path: Path) -> Run:
    """A result file's JSON."""
    return json.loads(path.read_text())


def commit_of(path: Path) -> str:
    """The commit in a result file's name (`name@commit.json`)."""
    return path.stem.rsplit("@", 1)[1] if "@" in path.stem else "unknown"


def row_of(path: Path) -> str:
    """The row in a result file's name (`name@commit.json`)."""
    return path.stem.rsplit("@", 1)[0]


def git(*args: str) -> subprocess.CompletedProcess[str]:
    """`git` run with `args` in the repository, its output captured as text."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@functools.cache
def code_of(source: str) -> str:
    """A Python module's syntax tree without its docstrings: what changes when its behaviour can."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


@functools.cache
def code_changed(first: str, second: str | None, paths: Paths) -> bool:
    """Whether `paths` differ between two commits (None: the working tree) beyond Python comments and docstrings."""

    def source(commit: str | None, name: str) -> str | None:  # None where the file does not exist
        if commit is None:
            return (ROOT / name).read_text() if (ROOT / name).exists() else None
        shown = git("show", f"{commit}:{name}")
        return shown.stdout if shown.returncode == 0 else None

    changed = git("diff", "--name-only", first, *([second] if second else []), "--", *paths)
    return changed.returncode != 0 or any(  # an unknown commit counts as changed
        not name.endswith(".py") or (then := source(first, name)) is None or (now := source(second, name)) is None
        or code_of(then) != code_of(now) for name in changed.stdout.split())


def same_code(first: str, second: str, paths: Paths = CPU_PRUNING) -> bool:
    """Whether `paths` are the same at two commits, beyond comments and docstrings of Python files."""
    return not code_changed(first, second, paths)


def mark(commit: str, paths: Paths = CODE) -> str:
    """A commit in backticks, marked stale where `paths` changed between it and the working tree."""
    return f"`{commit}`" + (" (stale: the code changed since)" if code_changed(commit, None, paths) else "")


@functools.cache
def commit_order() -> dict[str, int]:
    """Short hash → position in the history (0 = newest)."""
    return {h: i for i, h in enumerate(git("log", "--format=%h", "--abbrev=7").stdout.split())}


def newest(paths: Iterable[Path]) -> Path | None:
    """The result file saved at the newest commit of this history, if any."""
    order = commit_order()
    return min((p for p in paths if commit_of(p) in order), key=lambda p: order[commit_of(p)], default=None)


def runnable(command: str) -> str:
    """A recorded command as it runs now: bench scripts as modules (found by name where they moved), from the root."""

    def module(match: re.Match[str]) -> str:
        path = Path(match.group(1) + ".py")
        if not (ROOT / path).is_file():
            path = next((ROOT / "bench").rglob(path.name), ROOT / path).relative_to(ROOT)
        return "-m " + ".".join(path.with_suffix("").parts)

    return re.sub(r"\S*?(?<![\w.-])(bench/(?:\w+/)*\w+)\.py", module, command)


def table(header: str, rows: Iterable[Iterable[object]]) -> list[str]:
    """A Markdown table: the columns `header` names (parted by ' | '), its rule, and a line of cells per row."""
    return [f"| {header} |", "|" + " --- |" * len(header.split(" | ")),
            *(f"| {' | '.join(map(str, row))} |" for row in rows)]


def link(path: Path, label: str | None = None) -> str:
    """A link from RESULTS.md to a result file, labelled with the file's name unless `label` is given."""
    return f"[{label or path.name}](results/{path.parent.name}/{path.name})"


def per_batch(rates: dict[str, float], spec: str = ".1f", unit: str = "batch ") -> str:
    """Rates by batch size (or context): 'r at batch b, …'."""
    return ", ".join(f"{rate:{spec}} at {unit}{key}" for key, rate in rates.items())


def dagger(name: str, older: Container[str], rows: Iterable[str] = ()) -> str:
    """A row's name, marked † where it or one of `rows` (its other runs) is in `older`: measured at other code."""
    return f"{name} †" if any(row in older for row in (name, *rows)) else name


# A set of runs is a dense run with each row's newest run at a commit that runs the same code (measured over several
# commits, between which only the benchmarks or the documents changed). The tables show the newest set and the most
# complete one, each row from the newest set that has it, and mark † the rows measured at older code (`older_rows`).


def quality_runs(folder: str = "quality", paths: Paths = CPU_PRUNING) -> tuple[str, Runs]:
    """The newest set's commit in `bench/results/<folder>`, and the rows of that set and the most complete one."""
    sets = quality_sets(folder, paths)
    newest_set = min(sets, key=commit_order().__getitem__)
    return newest_set, merged(sets, newest_set, sets)


@functools.cache
def quality_sets(folder: str, paths: Paths) -> dict[str, Runs]:
    """Every set of runs in `bench/results/<folder>`, by its dense run's commit."""
    files = [p for p in (RESULTS / folder).glob("*@*.json") if commit_of(p) in commit_order()]
    if not (denses := {commit_of(p) for p in files if row_of(p) == "dense"}):
        raise SystemExit(f"no bench/results/{folder}/dense@<commit>.json: run `python -m bench.quality.table`")
    return {commit: runs_of(files, commit, paths) for commit in denses}


def merged(sets: dict[str, Runs], newest_set: str, sizes: dict[str, Runs]) -> Runs:
    """The rows of the sets at `newest_set` and at the largest of `sizes` (among equals the newest), by file name."""
    order = commit_order()
    complete = min(sizes, key=lambda c: (-len(sizes[c]), order[c]))
    rows, runs = set(sets.get(newest_set, {})) | set(sets[complete]), {}
    for commit in sorted(sets, key=order.__getitem__, reverse=True):  # oldest first: each row's newest stays
        runs.update({row: run for row, run in sets[commit].items() if row in rows})
    return dict(sorted(runs.items(), key=lambda item: item[0] + "@"))


def runs_of(files: list[Path], commit: str, paths: Paths = CPU_PRUNING) -> Runs:
    """Each row's newest run among `files` at a commit that runs the same code as `commit`, by row name."""
    order = commit_order()
    known = sorted((p for p in files if commit_of(p) in order), key=lambda p: -order[commit_of(p)])  # oldest first
    rows = {row_of(p): p for p in known if same_code(commit_of(p), commit, paths)}
    return {row: load(path) for row, path in sorted(rows.items(), key=lambda item: item[1].name)}


def ttq_points(commit: str) -> Runs:
    """The points of `bench/quality/time_to_quality.py` at `commit`'s code and beside the most complete quality set."""
    files, sets = list((RESULTS / "ttq").glob("*@*.json")), quality_sets("quality", CPU_PRUNING)
    return merged({c: runs_of(files, c) for c in {*sets, commit}}, commit, sets)


def older_rows(commit: str, runs: Runs, paths: Paths) -> set[str]:
    """The rows of `runs` measured at code other than `commit`'s."""
    return {row for row, run in runs.items() if not same_code(run.get("commit", commit), commit, paths)}


def commit_groups(commit: str, runs: Runs, paths: Paths) -> tuple[list[str], list[str]]:
    """The commits of a set's runs, oldest first: those that run `commit`'s code, and the others."""
    order = commit_order()
    commits = sorted({run.get("commit", commit) for run in runs.values()} | {commit}, key=lambda c: -order.get(c, 0))
    return [c for c in commits if same_code(c, commit, paths)], [c for c in commits if not same_code(c, commit, paths)]


def listing(commits: list[str], last: str | None = None) -> str:
    """Commits in backticks as prose, `a`, `b` and `c`, with `last` in place of the last one where given."""
    items = [f"`{c}`" for c in commits[:-1]] + [last or f"`{commits[-1]}`"]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def rows_at(commit: str, runs: Runs, paths: Paths) -> str:
    """Where a set of runs was measured: its commits that run the same code, then those of its rows marked †."""
    current, older = commit_groups(commit, runs, paths)
    where = (f"at {mark(commit, paths)}" if len(current) == 1 else
             f"at {listing(current, mark(current[-1], paths))}, which run the same code")
    if not older:
        return ("All rows " if len(current) == 1 else "Rows ") + where
    return f"Rows {where}; rows marked † not yet measured there, at {listing(older)} (stale: the code changed since)"


def seeded(name: str) -> tuple[str, int] | None:
    """(row, seed) of a row run with another calibration seed (`<row>-seed<s>`), else None."""
    row, _, seed = name.rpartition("-seed")
    return (row, int(seed)) if row and seed.isdigit() else None


def quality_table(runs: Runs, older: set[str]) -> str:
    """The quality table: the dense run, then each pruned row's settings, sparsity, perplexity and seconds."""

    def method(c: Run) -> str:  # as the table names it
        sampled = ", G of sampled labels" if c.get("fisher") == "sampled" else ""
        if c["method"] == "surgeon" and c["structure"] == "structured":
            return f"surgeon/{c['correlation']}{sampled}"
        name = c["method"] if c["method"] != "surgeon" else (
            f"surgeon/m={c['max_correlate']} {c.get('chunk_semantics', 'independent')}" if c["max_correlate"]
            else "surgeon/all jointly (CG)")
        return name + (", last shot propagated" if c.get("propagate") else "") + sampled

    tuned = any("tuning_ppl" in run for run in runs.values())  # a column where the set measured it

    def ppl(run: Run) -> tuple[str, ...]:  # on the test windows, and on the tuning articles where measured
        return (f"{run['ppl']:.3f}",) + ((f"{run['tuning_ppl']:.3f}" if "tuning_ppl" in run else "-",) if tuned
                                         else ())

    dense = runs["dense"]
    rows: list[Row] = [("dense", "-", "1.0", "-", "-", "-", 0, *ppl(dense), f"{dense['seconds']:.0f}")]
    rows += [(dagger(name, older), c["structure"], f"{c['target_size']:g}", method(c) + (
        f"; kept {run['choice']['kept']} by held-out loss" if run.get("choice") else ""), c["shots"],
              f"{c['damp_g']} / {c['damp_a']}", f"{run['sparsity']:.4f}", *ppl(run), f"{run['seconds']:.0f}")
             for name, run in runs.items() if name != "dense" and seeded(name) is None for c in [run["config"]]]
    return "\n".join(table("run | structure | kept | method | shots | λ_G / λ_A | sparsity | ppl | "
                           + ("tuning ppl | " if tuned else "") + "seconds", rows))


def headline_cells(runs: Runs, prefix: str, older: frozenset[str] = frozenset()) -> str:
    """The best baseline's and the CLI's default run's perplexity at one structure ('- | -' if either was not run)."""
    # The lower in bold, a second decimal where one would print them alike, † on a row of `older`, the method whose
    # model the default kept where the held-out choice kept another's ("sparsegpt-refine (kept)"). A run ran the
    # defaults where its SETTINGS are `PruneConfig.resolved`'s for its structure and target (those it predates count)
    from surgeon.config import PruneConfig

    def ran_defaults(c: Run) -> bool:
        nm = ":" in c["structure"]
        default = PruneConfig(structure=c["structure"], target_size=None if nm else c["target_size"]).resolved()
        return all(c[key] == default[key] for key in SETTINGS if key in c)

    rows = {name[len(prefix) + 1:]: run for name, run in runs.items() if name.startswith(prefix + "-")}
    baselines = {m: r["ppl"] for m, r in rows.items() if m in NAMES}
    surgeon = [name for name, run in sorted(rows.items()) if name.startswith("surgeon") and ran_defaults(run["config"])]
    if not baselines or not surgeon:
        return "- | -"
    best = min(baselines, key=baselines.__getitem__)
    choice = rows[surgeon[0]].get("choice") or {}
    whose = f"{choice['kept']} (kept) " if choice.get("kept", "surgeon") != "surgeon" else ""
    cells = [(NAMES[best] + " ", baselines[best], best), (whose, rows[surgeon[0]]["ppl"], surgeon[0])]
    lowest = min(value for _, value, _ in cells)
    digits = 2 if len({f"{value:.1f}" for _, value, _ in cells}) == 1 else 1
    return " | ".join((f"{label}**{value:.{digits}f}**" if value == lowest else f"{label}{value:.{digits}f}")
                      + (" †" if f"{prefix}-{row}" in older else "") for label, value, row in cells)


def seed_spread(runs: Runs, older: set[str]) -> list[str]:
    """Per row also run with other calibration seeds: each seed's perplexity, their mean and range, on the test and,
    where measured, on the tuning windows."""
    spread: dict[str, dict[int, Run]] = {}
    for name, run in runs.items():
        if (found := seeded(name)) is not None and found[0] in runs:
            spread.setdefault(found[0], {0: runs[found[0]]})[found[1]] = run

    def summary(values: list[float]) -> tuple[str, str]:  # mean, range
        if not values:
            return "-", "-"
        return f"{sum(values) / len(values):.3f}", f"{min(values):.3f}–{max(values):.3f}"

    tuned = any("tuning_ppl" in run for seeds in spread.values() for run in seeds.values())
    rows = [(dagger(row, older, (f"{row}-seed{s}" for s in seeds if s)), ", ".join(map(str, sorted(seeds))),
             ", ".join(f"{seeds[s]['ppl']:.3f}" for s in sorted(seeds)), *summary([r["ppl"] for r in seeds.values()]),
             *(summary([r["tuning_ppl"] for r in seeds.values() if "tuning_ppl" in r]) if tuned else ()))
            for row, seeds in sorted(spread.items())]
    return ["", "Over calibration seeds (the rows `<row>-seed<s>`: the calibration windows drawn with seed s, "
            "`--seeds`): a gap between two rows is a win only where it exceeds both rows' ranges.", "",
            *table("row | seeds | perplexity per seed | mean | range" + (" | tuning mean | tuning range" if tuned
                                                                         else ""), rows)] if rows else []


def quality_block(folder: str) -> list[str]:
    """A quality set's table under where, on which model and budget it was measured, then its spread over seeds."""
    commit, runs = quality_runs(folder)
    dense, older = runs["dense"], older_rows(commit, runs, CPU_PRUNING)
    return [f"{rows_at(commit, runs, CPU_PRUNING)}: {dense.get('model', 'smollm2-135m')}, {dense['calib_windows']} × "
            f"{dense['calib_seqlen']} calibration tokens, perplexity on the first {dense['eval_windows']} test "
            "windows of 2048.", "", quality_table(runs, older), *seed_spread(runs, older)]


def machines() -> list[str]:
    """The machines the rows were measured on: the CPUs, and each GPU with its torch."""
    gpus = {f"{run['device']}, torch {run.get('torch', '?')}" for run in map(load, RESULTS.glob("gpu/shot-*.json"))}
    return ["- CPU: 2-core x86_64 machines, torch 2.13.0+cpu: every CPU row. Their models differ in speed: rows name "
            "the CPU model since it was recorded, and seconds compare within the rows of one machine (the quality "
            f"table's: {quality_runs()[1]['dense'].get('machine', 'unknown')}).",
            *(f"- GPU: {gpu}." for gpu in sorted(gpus))]


def time_to_quality() -> list[str]:
    """Each structure's LLM Surgeon rows and time-to-quality points (`ttq_points`) by seconds, older ones marked †."""
    commit, runs = quality_runs()
    every = {**runs, **(points := ttq_points(commit))}
    older = older_rows(commit, every, CPU_PRUNING)
    found = sorted([(name, runs[name]) for name in TTQ_ROWS if name in runs] + list(points.items()),
                   key=lambda item: (item[0].split("-")[0], item[1]["seconds"]))
    peers = ", ".join(f"{dagger(name, older)} {run['ppl']:.3f} in {run['seconds']:.0f} s"
                      for name, run in runs.items() if name.endswith("-llmc-sparsegpt"))
    return [f"{rows_at(commit, every, CPU_PRUNING)}.", "", *table(
        "point | structure | shots | CG tolerance | damping G | propagated | LoRA steps | kept by held-out loss | "
        "perplexity | seconds", [
            (dagger(name, older), c["structure"], c["shots"], f"{c['cg_tol']:g}", f"{c['damp_g']:g}",
             "yes" if c.get("propagate") else "no", c["lora_steps"], (run.get("choice") or {}).get("kept", "–"),
             f"{run['ppl']:.3f}", f"{run['seconds']:.0f}") for name, run in found for c in [run["config"]]]),
            *(["", f"The peer on the same protocol, llm-compressor's SparseGPTModifier (`bench/quality/peers.py`): "
               f"{peers}."] if peers else [])]


def coupled() -> list[str]:
    """The coupled-unit rows: perplexity, exported size and format, decode rate and prune seconds."""
    if not list((RESULTS / "coupled").glob("dense@*.json")):
        return ["Not yet measured (`python -m bench.quality.coupled`)."]
    commit, runs = quality_runs("coupled", CPU_EXPORTED)
    older = older_rows(commit, runs, CPU_EXPORTED)
    return [f"{rows_at(commit, runs, CPU_EXPORTED)}, {runs['dense']['machine']}.", "", *table(
        "row | ppl | parameters (of dense) | format | decode tokens/s (batch 1, 2048 context) | prune s", [
            (dagger(row, older), f"{run['ppl']:.3f}",
             f"{run['parameters'] / 1e6:.1f} M ({run['parameters'] / run['dense_parameters']:.3f})", run["format"],
             f"{run['decode_tokens_per_s']:.1f}", f"{run['seconds']:.0f}") for row, run in runs.items()])]


def oneshot() -> list[str]:
    """Per structure: SparseGPTModifier, the drop-in's modifier and its newest exact run, each in one `oneshot`."""
    quality, order = RESULTS / "quality", commit_order()
    commits = {commit_of(p) for p in quality.glob("*-llmc-surgeon-sparsegpt@*.json")}
    commit = min((c for c in commits if list(quality.glob(f"*-llmc-sparsegpt@{c}.json"))),  # the newest where both ran
                 key=lambda c: order.get(c, len(order)), default=None)
    if commit is None:
        return []
    rows = []
    for structure in ("unstructured", "2of4"):
        peer = load(quality / f"{structure}-0.5-llmc-sparsegpt@{commit}.json")
        runs: list[tuple[str, Run, Run | None]] = [("SparseGPTModifier", peer, peer)]
        if (ours := quality / f"{structure}-0.5-llmc-surgeon-sparsegpt@{commit}.json").exists():
            run = load(ours)
            runs.append((f"SurgeonSparseGPTModifier (refine, {run['config'].get('iterations', '-')} steps)", run, peer))
        if (exact := newest(sorted(quality.glob(f"{structure}-0.5-llmc-surgeon-sparsegpt-exact@*.json")))) is not None:
            beside = quality / f"{structure}-0.5-llmc-sparsegpt@{commit_of(exact)}.json"  # the peer run in turn with it
            runs.append((f"SurgeonSparseGPTModifier (exact, {mark(commit_of(exact), CPU_PRUNING)})", load(exact),
                         load(beside) if beside.exists() else None))
        for label, run, against in runs:
            ratio = f"{run['seconds'] / against['seconds']:.2f}×" if against else "–"
            if against is not None and against is not peer:
                ratio += f" (SparseGPTModifier then: {against['ppl']:.3f} in {against['seconds']:.0f} s)"
            rows.append((f"{structure.replace('of', ':')} 0.5", label, f"{run['ppl']:.3f}", f"{run['seconds']:.0f}",
                         ratio))
    return ["Inside llm-compressor's `oneshot` (`bench/quality/peers.py`: the quality table's protocol, SmolLM2-135M, "
            "8 × 512 calibration tokens, perplexity on 8 test windows of 2048), "
            f"{mark(commit, CPU_PRUNING)}: `SurgeonSparseGPTModifier` with its defaults against `SparseGPTModifier`; "
            "seconds are whole `oneshot` calls, run in turn on the same machine. The exact mode's rows (`-exact`) are "
            "the newest measured, their times against SparseGPTModifier's at their own commit.", "",
            *table("structure | modifier | ppl | seconds | time against SparseGPTModifier", rows)]


def layer_rows(path: Path, run: Run) -> list[Row]:
    """A drop-in file's rows: per structure and mode, the layer error ratios and the seconds against SparseGPT's."""
    return [(structure, mode, f"{values['geomean_ratio']:.3f}", f"{values['worst_ratio']:.3f}",
             f"{values['seconds']:.2f}", f"{summary['sparsegpt_seconds']:.2f}",
             f"{values['seconds'] / summary['sparsegpt_seconds']:.2f}×")
            for structure, summary in run["summary"].items() for mode, values in summary["modes"].items()]


def kernel_rows(path: Path, data: Run) -> list[Row]:
    """A kernel microbenchmark file's rows: pytest-benchmark's on the CPU (`micro-cpu.json`), or a GPU file's."""

    def rate(values: Run, *templates: tuple[str, str]) -> str:  # the first of the figures `values` holds
        return next((template.format(values[key]) for key, template in templates if key in values), "-")

    def share(fraction: float | None) -> str:
        return "-" if fraction is None else f"{fraction:.0%}"

    if "benchmarks" not in data:
        return [(row["op"], row["provider"], row["shape"], row["dtype"].removeprefix("torch."), f"{row['ms']:.3f} ms",
                 f"p20–p80 {row['ms_20']:.3f}–{row['ms_80']:.3f} ms",
                 rate(row, ("tflops", "{:.1f} TFLOP/s"), ("gbytes_per_s", "{:.0f} GB/s")),
                 share(row.get("fraction_of_bf16_gemm", row.get("fraction_of_copy"))), data["device"],
                 mark(commit_of(path), KERNEL_CODE.get(row["op"], CODE))) for row in data["rows"]]
    rows = []
    for bench in data["benchmarks"]:
        op, params, info = bench["name"].split("[")[0].removeprefix("test_"), bench["params"], bench["extra_info"]
        rows.append((op, params.get("backend") or params.get("method") or "torch",
                     ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("backend", "method", "dtype"))
                     or "-", re.sub(r"UNSERIALIZABLE\[torch\.(\w+)\]", r"\1", str(params.get("dtype", "float32"))),
                     f"{bench['stats']['median'] * 1e3:.2f} ms", f"IQR {bench['stats']['iqr'] * 1e3:.2f} ms",
                     rate(info, ("gflops", "{:.0f} GFLOP/s"), ("gbytes_per_s", "{:.1f} GB/s")),
                     share(info.get("gemm_fraction", info.get("bandwidth_fraction"))), info.get("machine", "CPU"),
                     mark(data["commit_info"]["id"][:7], KERNEL_CODE.get(op, CODE))))
    return rows


def pipeline_cells(run: Run, stage: str) -> tuple[str, str]:
    """A stage's size on disk and vLLM decode rate: the run folder's on its last stage, the export's, quantized's."""
    last = "recovered" if "recovered" in run["ppl"] else "pruned"
    timed = {"export": "export", "quantized": "quantized", last: "run"}
    if stage not in timed:
        return "", ""
    size = f"{run['bytes'][timed[stage]] / 1e6:.0f}" + (f" ({run['scheme']})" if stage == "quantized" else "")
    return size, per_batch(run["speed"][timed[stage]]["decode_tokens_per_s"])


@dataclass(frozen=True)
class Section:
    """A block of the result files `patterns` match: text, a table of their rows (or the newest one's), commands."""

    patterns: str  # glob patterns under bench/results/, parted by spaces
    absent: str | None  # the text where no file is saved ("": none; None: the table without rows)
    header: str  # the table's columns, parted by ' | '
    rows: Callable[[Path, Run], list[Row]]  # a file's rows
    intro: Callable[[Path, Run], str] | None = None  # the text above the table (a function of the newest file's)
    newest: bool = False  # only the newest file (its intro and rows)
    command: Callable[[Path, Run], tuple[str, str]] | None = None  # each file's (label, command), listed below it
    then: tuple[Callable[[], list[str]], ...] = ()  # the blocks below it, each after a blank line where it has lines

    def __call__(self) -> list[str]:
        """The section's lines: its text, table, commands and the blocks below it."""
        paths = [path for pattern in self.patterns.split() for path in sorted(RESULTS.glob(pattern))]
        found = [(path, load(path)) for path in ([newest(paths)] if self.newest else paths) if path is not None]
        if not found and self.absent is not None:
            return [self.absent] if self.absent else []
        out = [self.intro(*found[0]), ""] if self.intro else []
        out += table(self.header, [row for path, run in found for row in self.rows(path, run)])
        if self.command is not None:
            out += ["", "Commands, as recorded in each file and run from the repository root:", "",
                    *(f"- {label}: `{runnable(command)}`" for label, command in (self.command(*f) for f in found))]
        for block in self.then:
            out += ["", *lines] if (lines := block()) else []
        return out


LAYERS = ("structure | drop-in mode | error ratio, geometric mean | worst layer | drop-in s | SparseGPT s | "
          "time against SparseGPT")
# Each generated block of RESULTS.md but the quality tables (`quality_block`), by name
SECTIONS: dict[str, Callable[[], list[str]]] = {
    "machines": machines,
    "time-to-quality": time_to_quality,
    "cpu-time": Section(
        "cpu/smollm2-structured80@*.json",
        "No CPU protocol run saved yet (`make demo`, then copy out/demo/report.json).",
        "shot | curvature s | costs s | threshold s | update s | peak RSS GiB", newest=True,
        intro=lambda path, run: (
            f"SmolLM2-135M structured to 80% kept, {run['config']['shots']} shots of {run['run']['nsamples']} × "
            f"{run['run']['seqlen']} calibration tokens, at {mark(commit_of(path), CPU_PRUNING)} ({link(path)}): "
            f"perplexity {run['ppl_before']:.4f} → {run['ppl_after']:.4f}, {run['seconds']:.1f} s in all, on the CPU "
            "of the Machines section:\n\n"
            f"    surgeon prune --model {run['run']['model']} --structure {run['config']['structure']} --target-size "
            f"{run['config']['target_size']} --shots {run['config']['shots']} --nsamples {run['run']['nsamples']} "
            f"--seqlen {run['run']['seqlen']} --eval-seqlen {run['run']['eval_seqlen']} --eval-windows "
            f"{run['run']['eval_windows']} --calibration {run['run']['calibration']} --output DIR"),
        rows=lambda path, run: [
            (shot["shot"], f"{shot['seconds']['curvature']:.1f}",
             *(f"{shot['seconds'].get(phase, 0):.2f}" for phase in ("costs", "threshold", "update")),
             f"{shot['peak_memory_gb']:.2f}") for shot in run["shots"]]),
    "gpu-time": Section(
        "gpu/shot-*.json", None, "run | device | commit | shots | s per shot | total s | peak GiB",
        rows=lambda path, run: [
            (link(path, row_of(path)), run["device"], mark(commit_of(path), PRUNING), len(run["shots"]),
             f"{min(seconds):.1f}–{max(seconds):.1f}", f"{run['seconds']:.0f}",
             f"{max(s['peak_memory_gb'] for s in run['shots']):.1f}")  # seconds: each shot's curvature and prune
            for seconds in [[s["seconds"].get("curvature", 0) + s["seconds"].get("prune", 0) for s in run["shots"]]]],
        command=lambda path, run: (row_of(path), "python " + run["command"])),
    "ranks": Section(
        "cpu/ranks-smollm2-*.json", "Not yet measured (`python -m bench.timing.distributed_time`).",
        "structure | commit | ranks | split | prune s | in collectives s | perplexity | command",
        rows=lambda path, result: [
            (link(path, f"{result['structure']} {result['target_size']}"), mark(commit_of(path), CPU_PRUNING),
             run["ranks"], run.get("split") or "-", f"{run['prune_seconds']:.1f}", f"{run['collective_seconds']:.1f}",
             f"{run['ppl']:.3f}", f"`{runnable(run['command'])}`") for run in result["runs"]]),
    "memory-options": Section(
        "cpu/memory-options-smollm2@*.json", "Not yet measured (`python -m bench.timing.memory_options`).",
        "options | curvature s | prune s | peak GiB | same weights | command", newest=True,
        intro=lambda path, result: (
            f"`python -m bench.timing.memory_options` at {mark(commit_of(path), CPU_PRUNING)} "
            f"({link(path)}, {result['machine']}): SmolLM2-135M structured to 80% in one "
            "shot, one calibration batch of 8 × 512 tokens, each option set in its own process. Peak is the "
            "process's resident memory; on the CPU host and device memory are one, so offload and block groups "
            "show only their time. \"same weights\": bit-identical to the run without options."),
        rows=lambda path, result: [
            (row["options"], f"{row['curvature_seconds']:.1f}", f"{row['prune_seconds']:.1f}",
             f"{row['peak_memory_gb']:.2f}", "yes" if row["same_weights"] else "no", f"`{runnable(row['command'])}`")
            for row in result["rows"]]),
    "plan": Section(
        "plan/plan-table@*.json", "Not yet counted (`python -m bench.timing.plan_table`).",
        "model | structure | GPUs | fits | strategy | peak GiB per GPU | host GiB per GPU | projected s per shot "
        "(curvature + prune) | floor s on one H100 (curvature + prune) | held-out shot s", newest=True,
        intro=lambda path, result: (
            f"`python -m bench.timing.plan_table` at {mark(commit_of(path))} ({link(path)}): "
            "`surgeon plan` for each shape in bfloat16, 128 × 2048 calibration tokens, 80 GB GPUs, counted from the "
            "configuration (docs/DESIGN.md, \"Planning\"). Peak is per GPU for the strategy chosen (the lowest where "
            "none fits), host memory per GPU what offload keeps there, or the held-out choice's two copies of the "
            "prunable weights and masks; a run fits when the peak plus 12% headroom does. A strategy's name lists "
            "the memory options it needs (its `launch` in the JSON). Time per shot is "
            "projected from the Llama-2-7B rates measured on one H100 for each kind of run "
            "(surgeon.scale.time_model.H100_PRUNE_S); moving factors to host memory and collectives are not counted. "
            "The floor is the least time the shot's counted FLOPs and bytes take on one H100 at its peak rates "
            "(docs/DESIGN.md, \"Work per shot and its floor\"). An unstructured run in one process adds, once, the "
            "sparsegpt-refine shot it is weighed against, projected from the measured rates of its parts "
            "(surgeon.scale.time_model.held_out_seconds)."),
        rows=lambda path, result: [
            (row["model"], row["structure"], row["gpus"], "yes" if row["fits"] else "no", row["strategy"],
             f"{row['peak_gpu_bytes'] / 2**30:.1f}",
             f"{row['host_bytes'] / 2**30:.1f}" if row.get("host_bytes") else "-",
             *(f"{s['curvature']:.1f} + {s['prune']:.1f}" if s else "-"
               for s in (row["seconds_per_shot"], row.get("floor_seconds_per_shot_h100"))),
             f"{sum(row['held_out_seconds_h100'].values()):.0f}" if row.get("held_out_seconds_h100") else "-")
            for row in result["rows"]]),
    "generation": Section(
        "cpu/generation-*.json gpu/generation-*.json",
        "Not yet measured (`python -m bench.timing.generation_speed MODEL …`).",
        "model | machine | commit | parameters | prunable zeros | safetensors MB | prefill tokens/s | "
        "decode tokens/s (context) | KV cache | rounds | peak GiB",
        rows=lambda path, run: [
            (link(path, run["label"]), run["machine"], mark(commit_of(path)), f"{run['parameters'] / 1e6:.1f} M",
             f"{run['prunable_zero_fraction']:.3f}",
             "-" if run["safetensors_bytes"] is None else f"{run['safetensors_bytes'] / 1e6:.0f}",
             per_batch(run["prefill_tokens_per_s"], ".0f", ""), f"{per_batch(run['decode_tokens_per_s'])} "
             f"({run['context']})", run.get("cache", "dynamic"), run.get("rounds", 1), f"{run['peak_memory_gb']:.2f}")],
        command=lambda path, run: (run["label"], run["command"])),
    "serve": Section(
        "cpu/serve-*.json gpu/serve-*.json",
        "Not yet measured (`python -m bench.timing.serve_speed MODEL …` in the vLLM environment).",
        "model | machine | commit | vLLM | parameters | decode tokens/s | end-to-end tokens/s | rounds",
        rows=lambda path, run: [
            (link(path, run["label"]), run["machine"], mark(commit_of(path), SERVING), run["vllm"],
             "-" if run["parameters"] is None else f"{run['parameters'] / 1e6:.1f} M",
             per_batch(run["decode_tokens_per_s"]), per_batch(run["end_to_end_tokens_per_s"]), run["rounds"])],
        command=lambda path, run: (run["label"], run["command"])),
    "recovery": Section(
        "recovery/*.json",
        "Not yet measured (`python -m bench.quality.recovery --structure coupled --target-size 0.8`, and the other "
        "structures).",
        "run | commit | dense | pruned | perplexity at tokens (training seconds) | lr | batch | last-quarter loss | "
        "passes over the text",
        rows=lambda path, run: [
            (link(path, row_of(path)), mark(commit_of(path), CPU_RECOVERED), f"{run['ppl_dense']:.2f}",
             f"{run['curve'][0]['ppl']:.2f}", ", ".join(f"{p['ppl']:.2f} at {p['tokens']} ({p['seconds']:.0f} s)"
                                                         for p in run["curve"][1:]), f"{run['lr']:g}",
             run.get("batch_size", 1), f"{sum(tail) / len(tail):.4f}", f"{run['passes']:.2f}")
            for tail in [run["losses"][-max(1, len(run["losses"]) // 4):]]],  # the last quarter of the steps' losses
        command=lambda path, run: (row_of(path), run["command"])),
    "pipeline": Section(
        "pipeline/*.json", "Not yet measured (`python -m bench.serving.pipeline RUN` in the vLLM environment).",
        "run | commit | stage | perplexity | weights MB | vLLM decode tokens/s",
        rows=lambda path, run: [
            (link(path, run["label"]) if n == 0 else "", mark(commit_of(path), CPU_RECOVERED) if n == 0 else "",
             stage, f"{ppl:.2f}", *pipeline_cells(run, stage)) for n, (stage, ppl) in enumerate(run["ppl"].items())],
        command=lambda path, run: (run["label"], run["command"])),
    "coupled": coupled,
    "drop-in": Section(
        "cpu/sparsegpt-dropin@*.json", "Not yet measured (`python -m bench.quality.sparsegpt_dropin`).", LAYERS,
        layer_rows, newest=True, intro=lambda path, run: (
            f"{run['layers']} linear layers of SmolLM2-135M (blocks {', '.join(map(str, run['blocks']))}), H from "
            "the CPU protocol's calibration windows; each method prunes the same layer on the same H. Ratio: the "
            "drop-in's layer output error ½ tr(ΔW H ΔWᵀ) over SparseGPT's (lower is better); SparseGPT's error and "
            "seconds are its published column loop's (`baselines.sparsegpt_reference`). "
            f"{mark(commit_of(path))}, {run['machine']}, `{runnable(run['command'])}`."),
        then=(oneshot, Section(
            "gpu/sparsegpt-dropin-llama2-7b@*.json", "", LAYERS, layer_rows, newest=True, intro=lambda path, run: (
                "Llama-2-7B's layer shapes (q_proj 4096×4096, up_proj 11008×4096, down_proj 4096×11008), random "
                "weights, H from 8192 correlated random inputs: the times say what a 7B layer costs, the errors "
                f"nothing about real models. {mark(commit_of(path))}, {run['machine']}, "
                f"`{runnable(run['command'])}`.")))),
    "kernels": Section("micro-cpu.json gpu/micro-*.json", None,
                       "op | provider | shape | dtype | median | spread | rate | of ceiling | machine | commit",
                       kernel_rows),
}


def blocks() -> dict[str, list[str]]:
    """The generated blocks of RESULTS.md by name: each replaces what stands between its markers."""
    folders = ["quality", *(path.name for path in sorted(RESULTS.glob("quality-*")) if path.is_dir())]
    return {**{folder: quality_block(folder) for folder in folders},
            **{name: block() for name, block in SECTIONS.items()}}


def between(text: str, start: str, end: str, lines: list[str], document: str) -> str:
    """`text` with `lines` between its markers `start` and `end`, which `document` must hold."""
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{document} has no {start} … {end} block")
    return pattern.sub(lambda _: "\n".join([start, *lines, end]), text)


def filled(text: str, generated: dict[str, list[str]]) -> str:
    """`text` with each `<!-- generated: NAME -->` … `<!-- end: NAME -->` block holding `generated[NAME]`."""
    for name, lines in generated.items():
        text = between(text, f"<!-- generated: {name} -->", f"<!-- end: {name} -->", lines, "bench/RESULTS.md")
    return text


def readme_with_headline(readme: str) -> str:
    """`readme` with its results table filled from the quality runs of both models (`quality_runs`)."""
    models, notes = [], []
    for folder, label, short in MODELS:
        if folder == "quality" or (RESULTS / folder).is_dir():
            commit, runs = quality_runs(folder)
            current, older = commit_groups(commit, runs, CPU_PRUNING)
            models.append((label, runs, frozenset(older_rows(commit, runs, CPU_PRUNING))))
            notes.append(f"{short} (dense {runs['dense']['ppl']:.2f}) at {listing(current)}"
                         + (" (stale)" if code_changed(current[-1], None, CPU_PRUNING) else "")
                         + (f", † at {listing(older)} (older code)" if older else ""))
    return between(readme, HEADLINE_START, HEADLINE_END, [
        *table("structure | " + " | ".join(f"{label}: best baseline | default run" for label, _, _ in models), [
            (label, *(headline_cells(runs, prefix, older) for _, runs, older in models))
            for prefix, label in HEADLINE]),
        "", f"Perplexity on WikiText-2: {'; '.join(notes)}; every row and method in `bench/RESULTS.md`."], "README.md")


def main() -> int:
    """Fill README.md's and RESULTS.md's tables, or with --check only compare README.md's (1: it differs)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that README.md's table is current")
    check = parser.parse_args().check
    readme_path, results = ROOT / "README.md", ROOT / "bench" / "RESULTS.md"
    readme = readme_path.read_text()
    updated = readme_with_headline(readme)
    if check:
        if updated != readme:
            print("README.md's results table differs from bench/results/quality: run `make results`", file=sys.stderr)
        return int(updated != readme)
    readme_path.write_text(updated)
    results.write_text(filled(results.read_text(), blocks()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
