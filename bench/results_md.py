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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CODE = ("surgeon", "surgeon_kernels", "csrc")
# What a benchmark's pruning run executes: the code less the commands' own modules (the benchmarks call the library)
# and what only writes (the compact export), plans, draws, recovers or quantizes its results afterwards; with its
# compact export (EXPORTED): less only those; a recovery row (RECOVERED): the pruning run's and the recovery's
COMMANDS = ("app/cli", "app/settings", "app/run", "app/recover", "scale/plan", "scale/time_model", "app/figures",
            "integrations/quantize")
RECOVERY = ("recovery/distill", "recovery/__init__")
PRUNING = (*CODE, *(f":(exclude)surgeon/{name}.py"
                    for name in ("export/compact", "models/compact_modeling", *COMMANDS, *RECOVERY)))
EXPORTED = (*CODE, *(f":(exclude)surgeon/{name}.py" for name in (*COMMANDS, *RECOVERY)))
# On a CPU `auto` never runs a Triton kernel (only under TRITON_INTERPRET=1, which the tests set): runs there leave
# them out as well
TRITON = ":(exclude,glob)surgeon_kernels/*/kernel.py"
CPU_PRUNING, CPU_EXPORTED = (*PRUNING, TRITON), (*EXPORTED, TRITON)
CPU_RECOVERED = (*CODE, TRITON, *(f":(exclude)surgeon/{name}.py"
                                  for name in ("export/compact", "models/compact_modeling", *COMMANDS)))
# What a serving row depends on: the export that wrote the checkpoint vLLM serves
SERVING = ("surgeon/export", "surgeon/models/compact_modeling.py")
# Kernel microbenchmark → the code it measures (anything else: all of CODE).
KERNEL_CODE = {
    "kfac_accumulate": ("surgeon_kernels/kfac_accumulate", "csrc/kfac_accumulate", "surgeon_kernels/symmetric.py"),
    "kk_gather": ("surgeon_kernels/kk_gather",), "nm_select": ("surgeon_kernels/nm_select", "csrc/nm_select"),
    "kk_solve": ("surgeon_kernels/kk_solve", "surgeon_kernels/kk_gather", "csrc/kk_solve"),
    "global_threshold": ("surgeon_kernels/kth_smallest",), "kth_smallest": ("surgeon_kernels/kth_smallest",),
    "batched_eigh": ("surgeon_kernels/batched_eigh",),
    "unstructured_update": ("surgeon/method/updates.py", "surgeon/method/inverses.py", "surgeon_kernels/kk_solve",
                            "surgeon_kernels/kk_gather"),
}
HEADLINE_START, HEADLINE_END = "<!-- results-table:start -->", "<!-- results-table:end -->"
# The README's headline: its rows (quality row prefix, label), and its models (quality folder, label, name in its note)
HEADLINE = (("structured-0.8", "structured 80%"), ("unstructured-0.5", "unstructured 50%"), ("2of4-0.5", "2:4"))
MODELS = (("quality", "SmolLM2-135M", "SmolLM2"), ("quality-gemma3-270m-8x256", "Gemma-3-270M", "Gemma-3-270M"))
NAMES = {"lobd": "L-OBD", "kobd": "K-OBD", "sparsegpt": "SparseGPT", "sparsegpt-refine": "sparsegpt-refine",
         "wanda": "Wanda", "llmc-sparsegpt": "llm-compressor SparseGPT", "llmc-wanda": "llm-compressor Wanda"}
# What sets a run's result apart from the CLI's defaults (`PruneConfig.resolved`); backends, batches, memory options
# and the like do not
SETTINGS = ("method", "shots", "correlation", "max_correlate", "cg_tol", "cg_dtype", "damp_a", "damp_g", "propagate",
            "held_out_choice", "lora_steps", "kronecker_terms")
Run = dict[str, Any]
Runs = dict[str, Run]


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
def code_changed(first: str, second: str | None, paths: tuple[str, ...]) -> bool:
    """Whether `paths` differ between two commits (None: the working tree) beyond Python comments and docstrings."""

    def source(commit: str | None, name: str) -> str | None:  # None where the file does not exist
        if commit is None:
            return (ROOT / name).read_text() if (ROOT / name).exists() else None
        shown = git("show", f"{commit}:{name}")
        return shown.stdout if shown.returncode == 0 else None

    changed = git("diff", "--name-only", first, *([second] if second else []), "--", *paths)
    if changed.returncode != 0:  # an unknown commit counts as changed
        return True
    for name in changed.stdout.split():
        then, now = source(first, name), source(second, name)
        if not name.endswith(".py") or then is None or now is None or code_of(then) != code_of(now):
            return True
    return False


def same_code(first: str, second: str, paths: tuple[str, ...] = CPU_PRUNING) -> bool:
    """Whether `paths` are the same at two commits, beyond comments and docstrings of Python files."""
    return not code_changed(first, second, paths)


def mark(commit: str, paths: tuple[str, ...] = CODE) -> str:
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


def shot_seconds(run: Run) -> list[float]:
    """Each shot's seconds in its curvature and prune phases."""
    return [sum(v for k, v in shot["seconds"].items() if k in ("curvature", "prune")) for shot in run["shots"]]


def per_batch(rates: dict[str, float], spec: str = ".1f", unit: str = "batch ") -> str:
    """Rates by batch size (or context): 'r at batch b, …'."""
    return ", ".join(f"{rate:{spec}} at {unit}{key}" for key, rate in rates.items())


# ---------------------------------------------------------------- quality
# A set of runs is a dense run with each row's newest run at a commit that runs the same code (measured over several
# commits, between which only the benchmarks or the documents changed). The tables show the newest set and the most
# complete one, each row from the newest set that has it, and mark † the rows measured at older code (`older_rows`).


def quality_runs(folder: str = "quality", paths: tuple[str, ...] = CPU_PRUNING) -> tuple[str, Runs]:
    """The newest set's commit in `bench/results/<folder>`, and the rows of that set and the most complete one."""
    sets = quality_sets(folder, paths)
    newest_set = min(sets, key=commit_order().__getitem__)
    return newest_set, merged(sets, newest_set, sets)


@functools.cache
def quality_sets(folder: str, paths: tuple[str, ...]) -> dict[str, Runs]:
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


def runs_of(files: list[Path], commit: str, paths: tuple[str, ...] = CPU_PRUNING) -> Runs:
    """Each row's newest run among `files` at a commit that runs the same code as `commit`, by row name."""
    order = commit_order()
    known = sorted((p for p in files if commit_of(p) in order), key=lambda p: -order[commit_of(p)])  # oldest first
    rows = {row_of(p): p for p in known if same_code(commit_of(p), commit, paths)}
    return {row: load(path) for row, path in sorted(rows.items(), key=lambda item: item[1].name)}


def ttq_points(commit: str) -> Runs:
    """The points of `bench/quality/time_to_quality.py` at `commit`'s code and beside the most complete quality set."""
    files, sets = list((RESULTS / "ttq").glob("*@*.json")), quality_sets("quality", CPU_PRUNING)
    return merged({c: runs_of(files, c) for c in {*sets, commit}}, commit, sets)


def older_rows(commit: str, runs: Runs, paths: tuple[str, ...]) -> set[str]:
    """The rows of `runs` measured at code other than `commit`'s."""
    return {row for row, run in runs.items() if not same_code(run.get("commit", commit), commit, paths)}


def commit_groups(commit: str, runs: Runs, paths: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The commits of a set's runs, oldest first: those that run `commit`'s code, and the others."""
    order = commit_order()
    commits = sorted({run.get("commit", commit) for run in runs.values()} | {commit}, key=lambda c: -order.get(c, 0))
    return [c for c in commits if same_code(c, commit, paths)], [c for c in commits if not same_code(c, commit, paths)]


def listing(commits: list[str], last: str | None = None) -> str:
    """Commits in backticks as prose, `a`, `b` and `c`, with `last` in place of the last one where given."""
    items = [f"`{c}`" for c in commits[:-1]] + [last or f"`{commits[-1]}`"]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def rows_at(commit: str, runs: Runs, paths: tuple[str, ...]) -> str:
    """Where a set of runs was measured: its commits that run the same code, then those of its rows marked †."""
    current, older = commit_groups(commit, runs, paths)
    where = (f"at {mark(commit, paths)}" if len(current) == 1 else
             f"at {listing(current, mark(current[-1], paths))}, which run the same code")
    if not older:
        return ("All rows " if len(current) == 1 else "Rows ") + where
    return f"Rows {where}; rows marked † not yet measured there, at {listing(older)} (stale: the code changed since)"


def method_label(config: Run) -> str:
    """A run's method as the quality table names it."""
    method = config["method"]
    if method == "surgeon" and config["structure"] == "structured":
        return f"surgeon/{config['correlation']}"
    if method == "surgeon":
        method = (f"surgeon/m={config['max_correlate']} {config.get('chunk_semantics', 'independent')}"
                  if config["max_correlate"] else "surgeon/all jointly (CG)")
    return method + (", last shot propagated" if config.get("propagate") else "")


def quality_table(runs: Runs, older: set[str]) -> str:
    """The quality table: the dense run, then each pruned row's settings, sparsity, perplexity and seconds."""
    rows = [("dense", "-", "1.0", "-", "-", "-", 0, f"{runs['dense']['ppl']:.3f}", f"{runs['dense']['seconds']:.0f}")]
    for name, run in runs.items():
        if name != "dense" and seeded(name) is None:
            c, kept = run["config"], f"; kept {run['choice']['kept']} by held-out loss" if run.get("choice") else ""
            rows.append((f"{name} †" if name in older else name, c["structure"], f"{c['target_size']:g}",
                         method_label(c) + kept, c["shots"], f"{c['damp_g']} / {c['damp_a']}",
                         f"{run['sparsity']:.4f}", f"{run['ppl']:.3f}", f"{run['seconds']:.0f}"))
    return "\n".join(table("run | structure | kept | method | shots | λ_G / λ_A | sparsity | ppl | seconds", rows))


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


def seeded(name: str) -> tuple[str, int] | None:
    """(row, seed) of a row run with another calibration seed (`<row>-seed<s>`), else None."""
    row, _, seed = name.rpartition("-seed")
    return (row, int(seed)) if row and seed.isdigit() else None


def seed_spread(runs: Runs, older: set[str]) -> list[str]:
    """Per row also run with other calibration seeds: each seed's perplexity, their mean and their range."""
    spread: dict[str, dict[int, float]] = {}
    for name, run in runs.items():
        if (found := seeded(name)) is not None and found[0] in runs:
            spread.setdefault(found[0], {0: runs[found[0]]["ppl"]})[found[1]] = run["ppl"]
    rows = [(f"{row} †" if any(name in older for name in (row, *(f"{row}-seed{s}" for s in ppl if s))) else row,
             ", ".join(map(str, sorted(ppl))), ", ".join(f"{ppl[s]:.3f}" for s in sorted(ppl)),
             f"{sum(ppl.values()) / len(ppl):.3f}", f"{min(ppl.values()):.3f}–{max(ppl.values()):.3f}")
            for row, ppl in sorted(spread.items())]
    return ["", "Over calibration seeds (the rows `<row>-seed<s>`: the calibration and held-out windows drawn with "
            "seed s, `--seeds`): a gap between two rows is a win only where it exceeds both rows' ranges.", "",
            *table("row | seeds | perplexity per seed | mean | range", rows)] if rows else []


def quality_block(commit: str, runs: Runs) -> list[str]:
    """A quality table under where, on which model and calibration budget its rows were measured, then the spread
    of the rows run with several calibration seeds."""
    dense, older = runs["dense"], older_rows(commit, runs, CPU_PRUNING)
    return [f"{rows_at(commit, runs, CPU_PRUNING)}: {dense.get('model', 'smollm2-135m')}, {dense['calib_windows']} × "
            f"{dense['calib_seqlen']} calibration tokens, perplexity on the first {dense['eval_windows']} test "
            "windows of 2048.", "", quality_table(runs, older), *seed_spread(runs, older)]


# ---------------------------------------------------------------- time, memory, serving, kernels


def time_to_quality_section(runs: Runs, commit: str) -> list[str]:
    """Each structure's LLM Surgeon rows and time-to-quality points (`ttq_points`) by seconds, older ones marked †."""
    reference = [(name, runs[name]) for name in (
        "structured-0.8-surgeon", "structured-0.8-surgeon-lora20", "unstructured-0.5-surgeon",
        "unstructured-0.5-surgeon-shots2", "2of4-0.5-surgeon", "2of4-0.5-surgeon-4shots", "4of8-0.5-surgeon",
        "4of8-0.5-surgeon-4shots") if name in runs]
    points = ttq_points(commit)
    older = older_rows(commit, {**runs, **points}, CPU_PRUNING)
    rows = []
    for name, run in sorted(reference + list(points.items()), key=lambda item: (item[0].split("-")[0],
                                                                                item[1]["seconds"])):
        c = run["config"]
        rows.append((f"{name} †" if name in older else name, c["structure"], c["shots"], f"{c['cg_tol']:g}",
                     f"{c['damp_g']:g}", "yes" if c.get("propagate") else "no", c["lora_steps"],
                     run["choice"]["kept"] if run.get("choice") else "–", f"{run['ppl']:.3f}", f"{run['seconds']:.0f}"))
    out = [f"{rows_at(commit, {**runs, **points}, CPU_PRUNING)}.", "", *table(
        "point | structure | shots | CG tolerance | damping G | propagated | LoRA steps | kept by held-out loss | "
        "perplexity | seconds", rows)]
    if peers := [(name, run) for name, run in runs.items() if name.endswith("-llmc-sparsegpt")]:
        out += ["", "The peer on the same protocol, llm-compressor's SparseGPTModifier (`bench/quality/peers.py`): "
                + ", ".join(f"{f'{name} †' if name in older else name} {run['ppl']:.3f} in {run['seconds']:.0f} s"
                            for name, run in peers) + "."]
    return out


def coupled_section() -> list[str]:
    """The coupled-unit rows: perplexity, exported size and format, decode rate and prune seconds."""
    commit, runs = quality_runs("coupled", CPU_EXPORTED)
    older = older_rows(commit, runs, CPU_EXPORTED)
    return [f"{rows_at(commit, runs, CPU_EXPORTED)}, {runs['dense']['machine']}.", "", *table(
        "row | ppl | parameters (of dense) | format | decode tokens/s (batch 1, 2048 context) | prune s", [
            (f"{row} †" if row in older else row, f"{run['ppl']:.3f}",
             f"{run['parameters'] / 1e6:.1f} M ({run['parameters'] / run['dense_parameters']:.3f})", run["format"],
             f"{run['decode_tokens_per_s']:.1f}", f"{run['seconds']:.0f}") for row, run in runs.items()])]


def dropin_section() -> list[str]:
    """The SparseGPT drop-in against SparseGPT per layer, inside llm-compressor's `oneshot`, and at 7B shapes."""
    quality, order = RESULTS / "quality", commit_order()
    if (path := newest(sorted(RESULTS.glob("cpu/sparsegpt-dropin@*.json")))) is None:
        return ["Not yet measured (`python -m bench.quality.sparsegpt_dropin`)."]

    def layers(run: Run) -> list[str]:
        return table("structure | drop-in mode | error ratio, geometric mean | worst layer | drop-in s | SparseGPT s | "
                     "time against SparseGPT", [
                         (structure, mode, f"{values['geomean_ratio']:.3f}", f"{values['worst_ratio']:.3f}",
                          f"{values['seconds']:.2f}", f"{summary['sparsegpt_seconds']:.2f}",
                          f"{values['seconds'] / summary['sparsegpt_seconds']:.2f}×")
                         for structure, summary in run["summary"].items() for mode, values in summary["modes"].items()])

    run = load(path)
    out = [f"{run['layers']} linear layers of SmolLM2-135M (blocks {', '.join(map(str, run['blocks']))}), H from "
           "the CPU protocol's calibration windows; each method prunes the same layer on the same H. Ratio: the "
           "drop-in's layer output error ½ tr(ΔW H ΔWᵀ) over SparseGPT's (lower is better); SparseGPT's error and "
           "seconds are its published column loop's (`baselines.sparsegpt_reference`). "
           f"{mark(commit_of(path))}, {run['machine']}, `{runnable(run['command'])}`.", "", *layers(run)]
    # The drop-in's modifier against SparseGPTModifier in one `oneshot` each, at the newest commit where both ran
    commits = {commit_of(p) for p in quality.glob("*-llmc-surgeon-sparsegpt@*.json")}
    commit = min((c for c in commits if list(quality.glob(f"*-llmc-sparsegpt@{c}.json"))),
                 key=lambda c: order.get(c, len(order)), default=None)
    if commit is not None:
        out += ["", "Inside llm-compressor's `oneshot` (`bench/quality/peers.py`: the quality table's protocol, "
                "SmolLM2-135M, 8 × 512 calibration tokens, perplexity on 8 test windows of 2048), "
                f"{mark(commit, CPU_PRUNING)}: "
                "`SurgeonSparseGPTModifier` with its defaults against `SparseGPTModifier`; seconds are whole `oneshot` "
                "calls, run in turn on the same machine. The exact mode's rows (`-exact`) are the newest measured, "
                "their times against SparseGPTModifier's at their own commit.", "",
                *table("structure | modifier | ppl | seconds | time against SparseGPTModifier", oneshot_rows(commit))]
    if (gpu := newest(sorted(RESULTS.glob("gpu/sparsegpt-dropin-llama2-7b@*.json")))) is not None:
        run = load(gpu)
        out += ["", "Llama-2-7B's layer shapes (q_proj 4096×4096, up_proj 11008×4096, down_proj 4096×11008), random "
                "weights, H from 8192 correlated random inputs: the times say what a 7B layer costs, the errors "
                f"nothing about real models. {mark(commit_of(gpu))}, {run['machine']}, "
                f"`{runnable(run['command'])}`.", "", *layers(run)]
    return out


def oneshot_rows(commit: str) -> list[tuple[str, ...]]:
    """Per structure: SparseGPTModifier, the drop-in's modifier at `commit`, and its newest exact run, in `oneshot`."""
    rows, quality = [], RESULTS / "quality"
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
    return rows


def kernel_section() -> list[str]:
    """Each kernel microbenchmark: pytest-benchmark's rows on the CPU, then each GPU file's."""

    def rate(values: Run, *templates: tuple[str, str]) -> str:  # the first of the figures `values` holds
        return next((template.format(values[key]) for key, template in templates if key in values), "-")

    def share(fraction: float | None) -> str:
        return "-" if fraction is None else f"{fraction:.0%}"

    rows = []
    if (RESULTS / "micro-cpu.json").exists():
        data = load(RESULTS / "micro-cpu.json")
        for bench in data["benchmarks"]:
            op, params, info, stats = (bench["name"].split("[")[0].removeprefix("test_"), bench["params"],
                                       bench["extra_info"], bench["stats"])
            rows.append((op, params.get("backend") or params.get("method") or "torch",
                         ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("backend", "method", "dtype"))
                         or "-", re.sub(r"UNSERIALIZABLE\[torch\.(\w+)\]", r"\1", str(params.get("dtype", "float32"))),
                         f"{stats['median'] * 1e3:.2f} ms", f"IQR {stats['iqr'] * 1e3:.2f} ms",
                         rate(info, ("gflops", "{:.0f} GFLOP/s"), ("gbytes_per_s", "{:.1f} GB/s")),
                         share(info.get("gemm_fraction", info.get("bandwidth_fraction"))), info.get("machine", "CPU"),
                         mark(data["commit_info"]["id"][:7], KERNEL_CODE.get(op, CODE))))
    for path in sorted((RESULTS / "gpu").glob("micro-*.json")):
        data = load(path)
        rows += [(row["op"], row["provider"], row["shape"], row["dtype"].removeprefix("torch."), f"{row['ms']:.3f} ms",
                  f"p20–p80 {row['ms_20']:.3f}–{row['ms_80']:.3f} ms",
                  rate(row, ("tflops", "{:.1f} TFLOP/s"), ("gbytes_per_s", "{:.0f} GB/s")),
                  share(row.get("fraction_of_bf16_gemm", row.get("fraction_of_copy"))), data["device"],
                  mark(commit_of(path), KERNEL_CODE.get(row["op"], CODE))) for row in data["rows"]]
    return table("op | provider | shape | dtype | median | spread | rate | of ceiling | machine | commit", rows)


class Section(NamedTuple):
    """A table of the result files `patterns` (under `bench/results/`) match: the newest only, or each one's rows."""

    patterns: str  # glob patterns, parted by spaces
    absent: str | None  # the text where no file is saved (None: the table without rows)
    header: str  # the table's columns, parted by ' | '
    rows: Callable[[Path, Run], list[tuple[Any, ...]]]  # a file's rows
    intro: str | Callable[[Path, Run], str] = ""  # the text above the table (a function of the newest file's)
    newest: bool = False  # only the newest file (its intro and rows)
    command: Callable[[Path, Run], tuple[str, str]] | None = None  # each file's (label, command), listed below it

    def lines(self) -> list[str]:
        """The section's text, table and commands."""
        paths = [path for pattern in self.patterns.split() for path in sorted(RESULTS.glob(pattern))]
        found = [(path, load(path)) for path in ([newest(paths)] if self.newest else paths) if path is not None]
        if not found and self.absent is not None:
            return [self.absent]
        intro = self.intro(*found[0]) if callable(self.intro) else self.intro
        out = [intro, ""] if intro else []
        out += table(self.header, [row for path, run in found for row in self.rows(path, run)])
        if self.command is not None:
            out += ["", "Commands, as recorded in each file and run from the repository root:", "",
                    *(f"- {label}: `{runnable(command)}`" for label, command in (self.command(*f) for f in found))]
        return out


SECTIONS = {
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
             "–".join(f"{pick(shot_seconds(run)):.1f}" for pick in (min, max)), f"{run['seconds']:.0f}",
             f"{max(s['peak_memory_gb'] for s in run['shots']):.1f}")],
        command=lambda path, run: (row_of(path), "python " + run["command"])),
    "ranks": Section(
        "cpu/ranks-smollm2-*.json", "Not yet measured (`python -m bench.timing.distributed_time`).",
        "structure | commit | ranks | split | prune s | in collectives s | perplexity | command",
        intro="`python -m bench.timing.distributed_time`: the CPU protocol (SmolLM2-135M, 8 × 512 calibration "
              "tokens, 4 shots) through `surgeon prune`, in one process with both cores and under `torchrun "
              "--nproc-per-node 2` with one thread per rank (gloo). \"prune s\" is the shots' curvature and prune "
              "phases; evaluation is not counted.",
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
        "run | commit | dense | pruned | perplexity at tokens (training seconds) | lr | batch | last-quarter KL | "
        "passes over the text",
        rows=lambda path, run: [
            (link(path, path.stem.rsplit("@", 1)[0]), mark(commit_of(path), CPU_RECOVERED), f"{run['ppl_dense']:.2f}",
             f"{run['curve'][0]['ppl']:.2f}", ", ".join(f"{p['ppl']:.2f} at {p['tokens']} ({p['seconds']:.0f} s)"
                                                         for p in run["curve"][1:]), f"{run['lr']:g}",
             run.get("batch_size", 1), f"{last_quarter(run['losses']):.4f}", f"{run['passes']:.2f}")],
        command=lambda path, run: (path.stem.rsplit("@", 1)[0], run["command"])),
    "pipeline": Section(
        "pipeline/*.json", "Not yet measured (`python -m bench.serving.pipeline RUN` in the vLLM environment).",
        "run | commit | stage | perplexity | weights MB | vLLM decode tokens/s",
        rows=lambda path, run: [
            (link(path, run["label"]) if n == 0 else "", mark(commit_of(path), CPU_RECOVERED) if n == 0 else "",
             stage, f"{ppl:.2f}", *pipeline_cells(run, stage)) for n, (stage, ppl) in enumerate(run["ppl"].items())],
        command=lambda path, run: (run["label"], run["command"])),
}


def pipeline_cells(run: Run, stage: str) -> tuple[str, str]:
    """A pipeline stage's size on disk and vLLM decode speed: the run folder's (the pruned or recovered model at the
    dense model's shapes) on its last transformers stage, the export's and the quantized checkpoint's on theirs."""
    last = "recovered" if "recovered" in run["ppl"] else "pruned"
    timed = {"export": "export", "quantized": "quantized", last: "run"}
    if stage not in timed:
        return "", ""
    size = f"{run['bytes'][timed[stage]] / 1e6:.0f}" + (f" ({run['scheme']})" if stage == "quantized" else "")
    return size, per_batch(run["speed"][timed[stage]]["decode_tokens_per_s"])


def last_quarter(losses: list[float]) -> float:
    """The mean of the last quarter of a recovery's per-step losses (at least one)."""
    tail = losses[-max(1, len(losses) // 4):]
    return sum(tail) / len(tail)


def blocks() -> dict[str, list[str]]:
    """The generated blocks of RESULTS.md by name: each replaces what stands between its markers."""
    commit, runs = quality_runs()
    gpus = sorted({f"{run['device']}, torch {run.get('torch', '?')}"
                   for run in map(load, RESULTS.glob("gpu/shot-*.json"))})
    return {
        "machines": [
            "- CPU: 2-core x86_64 machines, torch 2.13.0+cpu: every CPU row. Their models differ in speed: rows name "
            "the CPU model since it was recorded, and seconds compare within the rows of one machine (the quality "
            f"table's: {runs['dense'].get('machine', 'unknown')}).", *(f"- GPU: {gpu}." for gpu in gpus)],
        "quality": quality_block(commit, runs),
        **{path.name: quality_block(*quality_runs(path.name)) for path in sorted(RESULTS.glob("quality-*"))
           if path.is_dir()},
        "time-to-quality": time_to_quality_section(runs, commit),
        **{name: section.lines() for name, section in SECTIONS.items()},
        "coupled": coupled_section() if list((RESULTS / "coupled").glob("dense@*.json")) else
        ["Not yet measured (`python -m bench.quality.coupled`)."],
        "drop-in": dropin_section(),
        "kernels": kernel_section(),
    }


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
