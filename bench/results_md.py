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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CODE = ("surgeon", "surgeon_kernels", "csrc")
# What a pruning run executes: the code less what only writes, plans or draws its results afterwards.
PRUNING = (*CODE, *(f":(exclude)surgeon/{name}.py" for name in ("export/compact", "models/compact_modeling",
                                                                  "scale/plan", "scale/time_model", "app/figures")))
# What a pruning run and its compact export execute: the code less what only plans or draws afterwards
EXPORTED = (*CODE, *(f":(exclude)surgeon/{name}.py" for name in ("scale/plan", "scale/time_model", "app/figures")))
# On a CPU `auto` never runs a Triton kernel (only under TRITON_INTERPRET=1, which the tests set): runs there leave
# them out as well
TRITON = ":(exclude,glob)surgeon_kernels/*/kernel.py"
CPU_PRUNING, CPU_EXPORTED = (*PRUNING, TRITON), (*EXPORTED, TRITON)
# What a serving row depends on: the export that wrote the checkpoint vLLM serves
SERVING = ("surgeon/export", "surgeon/models/compact_modeling.py")
HEADLINE_START, HEADLINE_END = "<!-- results-table:start -->", "<!-- results-table:end -->"
# The README's headline rows: (quality row prefix, label).
HEADLINE = (("structured-0.8", "structured 80%"), ("unstructured-0.5", "unstructured 50%"), ("2of4-0.5", "2:4"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def commit_of(path: Path) -> str:
    """The commit in a result file's name (`name@commit.json`)."""
    return path.stem.rsplit("@", 1)[1] if "@" in path.stem else "unknown"


def row_of(path: Path) -> str:
    """The row in a result file's name (`name@commit.json`)."""
    return path.stem.rsplit("@", 1)[0]


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


# Kernel microbenchmark → the code it measures (anything else: all of CODE).
KERNEL_CODE = {
    "kfac_accumulate": ("surgeon_kernels/kfac_accumulate", "csrc/kfac_accumulate", "surgeon_kernels/symmetric.py"),
    "kk_gather": ("surgeon_kernels/kk_gather",),
    "kk_solve": ("surgeon_kernels/kk_solve", "surgeon_kernels/kk_gather", "csrc/kk_solve"),
    "nm_select": ("surgeon_kernels/nm_select", "csrc/nm_select"),
    "global_threshold": ("surgeon_kernels/kth_smallest",),
    "kth_smallest": ("surgeon_kernels/kth_smallest",),
    "batched_eigh": ("surgeon_kernels/batched_eigh",),
    "unstructured_update": ("surgeon/method/updates.py", "surgeon/method/inverses.py", "surgeon_kernels/kk_solve",
                            "surgeon_kernels/kk_gather"),
}


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


def source_at(commit: str | None, name: str) -> str | None:
    """A file's text at `commit` (None: the working tree), or None where it does not exist."""
    if commit is None:
        return (ROOT / name).read_text() if (ROOT / name).exists() else None
    shown = git("show", f"{commit}:{name}")
    return shown.stdout if shown.returncode == 0 else None


@functools.cache
def code_changed(first: str, second: str | None, paths: tuple[str, ...]) -> bool:
    """Whether `paths` differ between `first` and `second` (None: the working tree) beyond comments and docstrings
    of Python files (unknown commits count as changed)."""
    changed = git("diff", "--name-only", first, *([second] if second else []), "--", *paths)
    if changed.returncode != 0:
        return True
    for name in changed.stdout.split():
        then, now = source_at(first, name), source_at(second, name)
        if not name.endswith(".py") or then is None or now is None or code_of(then) != code_of(now):
            return True
    return False


def stale(commit: str, paths: tuple[str, ...] = CODE) -> bool:
    """Whether `paths` changed between `commit` and the working tree (see `code_changed`)."""
    return code_changed(commit, None, paths)


@functools.cache
def commit_order() -> dict[str, int]:
    """Short hash → position in the history (0 = newest)."""
    hashes = git("log", "--format=%h", "--abbrev=7").stdout.split()
    return {h: i for i, h in enumerate(hashes)}


def newest(paths: list[Path]) -> Path | None:
    order = commit_order()
    known = [p for p in paths if commit_of(p) in order]
    return min(known, key=lambda p: order[commit_of(p)]) if known else None


def runnable(command: str) -> str:
    """A recorded command as it runs now: a bench script's path as its module (`python -m bench.quality.table`), the
    repository's absolute path dropped, a script since moved into a folder of `bench/` found there by its name."""

    def module(match: re.Match[str]) -> str:
        path = Path(match.group(1) + ".py")
        if not (ROOT / path).is_file():
            path = next((ROOT / "bench").rglob(path.name), ROOT / path).relative_to(ROOT)
        return "-m " + ".".join(path.with_suffix("").parts)

    return re.sub(r"\S*?(?<![\w.-])(bench/(?:\w+/)*\w+)\.py", module, command)


def mark(commit: str, paths: tuple[str, ...] = CODE) -> str:
    return f"`{commit}`" + (" (stale: the code changed since)" if stale(commit, paths) else "")


# ---------------------------------------------------------------- quality


def same_code(first: str, second: str, paths: tuple[str, ...] = CPU_PRUNING) -> bool:
    """Whether `paths` are the same at two commits, beyond comments and docstrings of Python files."""
    return not code_changed(first, second, paths)


def quality_runs(folder: str = "quality",
                 paths: tuple[str, ...] = CPU_PRUNING) -> tuple[str, dict[str, dict[str, Any]]]:
    """The newest set of runs in `bench/results/<folder>`: the newest dense run's commit, and by row the runs of
    that set and of the most complete set (`merged`), each from the newest set that has it. A set is a dense
    run with each row's newest run at a commit that runs the same code (measured over several commits, between
    which only the benchmarks or the documents changed); rows from older sets are marked in the tables
    (`older_rows`), so that a table measured again in part shows every row."""
    sets = quality_sets(folder, paths)
    newest = min(sets, key=commit_order().__getitem__)
    return newest, merged(sets, newest, complete_set(sets))


@functools.cache
def quality_sets(folder: str, paths: tuple[str, ...]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every set of runs in `bench/results/<folder>` by its dense run's commit (see `quality_runs`)."""
    files = result_files(folder)
    denses = {commit_of(p) for p in files if row_of(p) == "dense"}
    if not denses:
        raise SystemExit(f"no bench/results/{folder}/dense@<commit>.json: run `python -m bench.quality.table`")
    return {commit: runs_of(files, commit, paths) for commit in denses}


def result_files(folder: str) -> list[Path]:
    """The result files in `bench/results/<folder>` saved at commits of this history."""
    order = commit_order()
    return [p for p in (RESULTS / folder).glob("*@*.json") if commit_of(p) in order]


def complete_set(sets: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The commit of the set with the most rows, among equals the newest."""
    order = commit_order()
    return min(sets, key=lambda c: (-len(sets[c]), order[c]))


def merged(sets: dict[str, dict[str, dict[str, Any]]], newest: str, complete: str) -> dict[str, dict[str, Any]]:
    """The rows of the sets at `newest` and `complete`, each from the newest set that has it, in the order of their
    file names."""
    order = commit_order()
    rows = set(sets.get(newest, {})) | set(sets[complete])
    runs: dict[str, dict[str, Any]] = {}
    for commit in sorted(sets, key=order.__getitem__):
        for row, run in sets[commit].items():
            if row in rows:
                runs.setdefault(row, run)
    return dict(sorted(runs.items(), key=lambda item: item[0] + "@"))


def older_rows(commit: str, runs: dict[str, dict[str, Any]], paths: tuple[str, ...]) -> set[str]:
    """The rows of `runs` measured at code other than `commit`'s."""
    return {row for row, run in runs.items() if not same_code(run.get("commit", commit), commit, paths)}


def row_label(row: str, older: set[str]) -> str:
    """A row's name as the tables print it: marked † where it was measured at older code."""
    return f"{row} †" if row in older else row


def runs_of(files: list[Path], commit: str, paths: tuple[str, ...] = CPU_PRUNING) -> dict[str, dict[str, Any]]:
    """Each row's newest run among `files` (`<row>@<commit>.json`) at a commit that runs the same code as `commit`,
    by row name."""
    order, rows = commit_order(), {}
    known = [path for path in files if commit_of(path) in order]
    for path in sorted(known, key=lambda p: -order[commit_of(p)]):  # oldest first: the newest stays
        if same_code(commit_of(path), commit, paths):
            rows[row_of(path)] = path
    return {row: load(path) for row, path in sorted(rows.items(), key=lambda item: item[1].name)}


def ttq_points(commit: str) -> dict[str, dict[str, Any]]:
    """The points of `bench/quality/time_to_quality.py` beside the quality sets (`quality_sets`), merged as their rows
    are (`merged`): those at `commit`'s code and those beside the most complete quality set."""
    files, sets = result_files("ttq"), quality_sets("quality", CPU_PRUNING)
    return merged({c: runs_of(files, c) for c in {*sets, commit}}, commit, complete_set(sets))


def commits_of(commit: str, runs: dict[str, dict[str, Any]]) -> list[str]:
    """The commits a set of runs was measured at, oldest first."""
    order = commit_order()
    return sorted({run.get("commit", commit) for run in runs.values()} | {commit}, key=lambda c: -order.get(c, 0))


def rows_at(commit: str, runs: dict[str, dict[str, Any]], paths: tuple[str, ...]) -> str:
    """Where a set of runs was measured: its commit, or its commits that run the same code, marked if stale; then
    the commits of the rows marked † (`older_rows`), measured at older code."""
    current, older = commit_groups(commit, runs, paths)
    where = (f"at {mark(commit, paths)}" if len(current) == 1 else
             f"at {listing([f'`{c}`' for c in current[:-1]] + [mark(current[-1], paths)])}, which run the same code")
    if not older:
        return ("All rows " if len(current) == 1 else "Rows ") + where
    return (f"Rows {where}; rows marked † not yet measured there, at {listing([f'`{c}`' for c in older])} "
            "(stale: the code changed since)")


def commit_groups(commit: str, runs: dict[str, dict[str, Any]], paths: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The commits of a set's runs, oldest first: those that run `commit`'s code, and the others."""
    commits = commits_of(commit, runs)
    current = [c for c in commits if same_code(c, commit, paths)]
    return current, [c for c in commits if c not in current]


def listing(items: list[str]) -> str:
    """Items as prose: a, b and c."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def second_models() -> list[str]:
    """The folders of the quality rows on other models and calibration budgets (`quality-<model>-<n>x<seqlen>`)."""
    return sorted(path.name for path in RESULTS.glob("quality-*") if path.is_dir())


def method_label(config: dict[str, Any]) -> str:
    method = config["method"]
    if method == "surgeon" and config["structure"] == "structured":
        return f"surgeon/{config['correlation']}"
    label = method
    if method == "surgeon":
        semantics = config.get('chunk_semantics', 'independent')
        label = f"surgeon/m={config['max_correlate']} {semantics}" if config["max_correlate"] \
            else "surgeon/all jointly (CG)"
    return label + (", last shot propagated" if config.get("propagate") else "")


def quality_table(runs: dict[str, dict[str, Any]], older: set[str]) -> str:
    lines = ["| run | structure | kept | method | shots | λ_G / λ_A | sparsity | ppl | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    dense = runs["dense"]
    lines.append(f"| dense | - | 1.0 | - | - | - | 0 | {dense['ppl']:.3f} | {dense['seconds']:.0f} |")
    for name, run in runs.items():
        if name == "dense":
            continue
        c = run["config"]
        method = method_label(c) + (f"; kept {run['choice']['kept']} by held-out loss" if run.get("choice") else "")
        lines.append(f"| {row_label(name, older)} | {c['structure']} | {c['target_size']:g} | {method} | "
                     f"{c['shots']} | {c['damp_g']} / {c['damp_a']} | {run['sparsity']:.4f} | {run['ppl']:.3f} | "
                     f"{run['seconds']:.0f} |")
    return "\n".join(lines)


NAMES = {"lobd": "L-OBD", "kobd": "K-OBD", "sparsegpt": "SparseGPT", "sparsegpt-refine": "sparsegpt-refine",
         "wanda": "Wanda", "llmc-sparsegpt": "llm-compressor SparseGPT", "llmc-wanda": "llm-compressor Wanda"}


# What sets a run's result apart from the CLI's defaults (`PruneConfig.resolved`); backends, batches, memory options
# and the like do not
SETTINGS = ("method", "shots", "correlation", "max_correlate", "cg_tol", "cg_dtype", "damp_a", "damp_g", "propagate",
            "held_out_choice", "lora_steps", "kronecker_terms")


def ran_defaults(config: dict[str, Any]) -> bool:
    """Whether a run's recorded config is the CLI's defaults for its structure and target (settings it predates
    count as the defaults)."""
    from surgeon.config import PruneConfig

    nm = ":" in config["structure"]
    default = PruneConfig(structure=config["structure"], target_size=None if nm else config["target_size"]).resolved()
    return all(config[key] == default[key] for key in SETTINGS if key in config)


def headline_cells(runs: dict[str, dict[str, Any]], prefix: str, older: frozenset[str] = frozenset()) -> str:
    """The best baseline's perplexity at one structure and the CLI's default run's, the lower in bold, with a second
    decimal where one would print them alike, † on a row of `older`, and the method whose model the default kept
    where the held-out choice kept another's ("sparsegpt-refine (kept)"); '- | -' if either was not run."""
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


def headline_table(models: list[tuple[str, dict[str, dict[str, Any]], frozenset[str]]]) -> str:
    """Per structure and model: the best baseline and the default run, the lower perplexity in bold, † on a row measured
    at older code (the README's)."""
    lines = ["| structure | " + " | ".join(f"{label}: best baseline | default run" for label, _, _ in models) + " |",
             "| --- |" + " --- | --- |" * len(models)]
    for prefix, label in HEADLINE:
        lines.append(f"| {label} | " + " | ".join(headline_cells(runs, prefix, older) for _, runs, older in models)
                     + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- time and memory


def cpu_time_section() -> list[str]:
    path = newest(sorted((RESULTS / "cpu").glob("smollm2-structured80@*.json")))
    if path is None:
        return ["No CPU protocol run saved yet (`make demo`, then copy out/demo/report.json)."]
    run, commit = load(path), commit_of(path)
    out = [f"SmolLM2-135M structured to 80% kept, {run['config']['shots']} shots of {run['run']['nsamples']} × "
           f"{run['run']['seqlen']} calibration tokens, at {mark(commit, CPU_PRUNING)} "
           f"([{path.name}](results/cpu/{path.name})): "
           f"perplexity {run['ppl_before']:.4f} → {run['ppl_after']:.4f}, {run['seconds']:.1f} s in all, on the CPU "
           "of the Machines section:", "",
           f"    surgeon prune --model {run['run']['model']} --structure {run['config']['structure']} --target-size "
           f"{run['config']['target_size']} --shots {run['config']['shots']} --nsamples {run['run']['nsamples']} "
           f"--seqlen {run['run']['seqlen']} --eval-seqlen {run['run']['eval_seqlen']} --eval-windows "
           f"{run['run']['eval_windows']} --calibration {run['run']['calibration']} --output DIR", "",
           "| shot | curvature s | costs s | threshold s | update s | peak RSS GiB |",
           "| --- | --- | --- | --- | --- | --- |"]
    for shot in run["shots"]:
        s = shot["seconds"]
        out.append(f"| {shot['shot']} | {s['curvature']:.1f} | {s.get('costs', 0):.2f} | {s.get('threshold', 0):.2f} | "
                   f"{s.get('update', 0):.2f} | {shot['peak_memory_gb']:.2f} |")
    return out


def gpu_time_section() -> list[str]:
    out = ["| run | device | commit | shots | s per shot | total s | peak GiB |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted((RESULTS / "gpu").glob("shot-*.json")):
        run = load(path)
        per_shot = [sum(v for k, v in s["seconds"].items() if k in ("curvature", "prune")) for s in run["shots"]]
        peak = max(s["peak_memory_gb"] for s in run["shots"])
        out.append(f"| [{path.stem.rsplit('@', 1)[0]}](results/gpu/{path.name}) | {run['device']} | "
                   f"{mark(commit_of(path), PRUNING)} | {len(run['shots'])} | "
                   f"{min(per_shot):.1f}–{max(per_shot):.1f} | "
                   f"{run['seconds']:.0f} | {peak:.1f} |")
    out += ["", "Commands, as recorded in each file and run from the repository root:", ""]
    out += [f"- {path.stem.rsplit('@', 1)[0]}: `{runnable('python ' + load(path)['command'])}`"
            for path in sorted((RESULTS / "gpu").glob("shot-*.json"))]
    return out


def time_to_quality_section(runs: dict[str, dict[str, Any]], commit: str) -> list[str]:
    """The time-to-quality curve of each structure at the quality table's commit: its LLM Surgeon rows and the
    points of `bench/quality/time_to_quality.py` (`ttq_points`), those measured at older code marked †."""
    reference = [(name, runs[name]) for name in (
        "structured-0.8-surgeon", "structured-0.8-surgeon-lora20", "unstructured-0.5-surgeon",
        "unstructured-0.5-surgeon-shots2", "2of4-0.5-surgeon", "2of4-0.5-surgeon-4shots", "4of8-0.5-surgeon",
        "4of8-0.5-surgeon-4shots") if name in runs]
    points = list(ttq_points(commit).items())
    older = older_rows(commit, {**runs, **dict(points)}, CPU_PRUNING)
    out = [f"{rows_at(commit, {**runs, **dict(points)}, CPU_PRUNING)}.", "",
           "| point | structure | shots | CG tolerance | damping G | propagated | LoRA steps | kept by held-out loss | "
           "perplexity | seconds |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, run in sorted(reference + points, key=lambda item: (item[0].split("-")[0], item[1]["seconds"])):
        config, choice = run["config"], run.get("choice")
        out.append(f"| {row_label(name, older)} | {config['structure']} | {config['shots']} | {config['cg_tol']:g} | "
                   f"{config['damp_g']:g} | {'yes' if config.get('propagate') else 'no'} | {config['lora_steps']} | "
                   f"{choice['kept'] if choice else '–'} | {run['ppl']:.3f} | {run['seconds']:.0f} |")
    peers = [(name, run) for name, run in runs.items() if name.endswith("-llmc-sparsegpt")]
    if peers:
        shown = ", ".join(f"{row_label(name, older)} {run['ppl']:.3f} in {run['seconds']:.0f} s" for name, run in peers)
        out += ["", f"The peer on the same protocol, llm-compressor's SparseGPTModifier "
                f"(`bench/quality/peers.py`): {shown}."]
    return out


def ranks_section() -> list[str]:
    paths = sorted((RESULTS / "cpu").glob("ranks-smollm2-*.json"))
    if not paths:
        return ["Not yet measured (`python -m bench.timing.distributed_time`)."]
    out = ["`python -m bench.timing.distributed_time`: the CPU protocol (SmolLM2-135M, 8 × 512 calibration tokens, "
           "4 shots) through `surgeon prune`, in one process with both cores and under `torchrun --nproc-per-node 2` "
           "with one thread per rank (gloo). \"prune s\" is the shots' curvature and prune phases; evaluation is not "
           "counted.", "",
           "| structure | commit | ranks | split | prune s | in collectives s | perplexity | command |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in paths:
        result = load(path)
        for run in result["runs"]:
            out.append(f"| [{result['structure']} {result['target_size']}](results/cpu/{path.name}) | "
                       f"{mark(commit_of(path), CPU_PRUNING)} | {run['ranks']} | {run.get('split') or '-'} | "
                       f"{run['prune_seconds']:.1f} | "
                       f"{run['collective_seconds']:.1f} | {run['ppl']:.3f} | `{runnable(run['command'])}` |")
    return out


def memory_options_section() -> list[str]:
    path = newest(sorted((RESULTS / "cpu").glob("memory-options-smollm2@*.json")))
    if path is None:
        return ["Not yet measured (`python -m bench.timing.memory_options`)."]
    result = load(path)
    out = [f"`python -m bench.timing.memory_options` at {mark(commit_of(path), CPU_PRUNING)} "
           f"([{path.name}](results/cpu/{path.name}), {result['machine']}): SmolLM2-135M structured to 80% in one "
           "shot, one calibration batch of 8 × 512 tokens, each option set in its own process. Peak is the "
           "process's resident memory; on the CPU host and device memory are one, so offload and block groups "
           "show only their time. \"same weights\": bit-identical to the run without options.", "",
           "| options | curvature s | prune s | peak GiB | same weights | command |",
           "| --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        out.append(f"| {row['options']} | {row['curvature_seconds']:.1f} | {row['prune_seconds']:.1f} | "
                   f"{row['peak_memory_gb']:.2f} | {'yes' if row['same_weights'] else 'no'} | "
                   f"`{runnable(row['command'])}` |")
    return out


def plan_section() -> list[str]:
    path = newest(sorted((RESULTS / "plan").glob("plan-table@*.json")))
    if path is None:
        return ["Not yet counted (`python -m bench.timing.plan_table`)."]
    result = load(path)
    out = [f"`python -m bench.timing.plan_table` at {mark(commit_of(path))} ([{path.name}](results/plan/{path.name})): "
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
           "(surgeon.scale.time_model.held_out_seconds).", "",
           "| model | structure | GPUs | fits | strategy | peak GiB per GPU | host GiB per GPU | projected s per shot "
           "(curvature + prune) | floor s on one H100 (curvature + prune) | held-out shot s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        time = row["seconds_per_shot"]
        time = f"{time['curvature']:.1f} + {time['prune']:.1f}" if time else "-"
        host = f"{row['host_bytes'] / 2**30:.1f}" if row.get("host_bytes") else "-"
        floor = row.get("floor_seconds_per_shot_h100")
        floor = f"{floor['curvature']:.1f} + {floor['prune']:.1f}" if floor else "-"
        held_out = row.get("held_out_seconds_h100")
        held_out = f"{sum(held_out.values()):.0f}" if held_out else "-"
        out.append(f"| {row['model']} | {row['structure']} | {row['gpus']} | {'yes' if row['fits'] else 'no'} | "
                   f"{row['strategy']} | {row['peak_gpu_bytes'] / 2**30:.1f} | {host} | {time} | {floor} | "
                   f"{held_out} |")
    return out


def generation_section() -> list[str]:
    paths = sorted((RESULTS / "cpu").glob("generation-*.json")) + sorted((RESULTS / "gpu").glob("generation-*.json"))
    if not paths:
        return ["Not yet measured (`python -m bench.timing.generation_speed MODEL …`)."]
    out = ["| model | machine | commit | parameters | prunable zeros | safetensors MB | prefill tokens/s | "
           "decode tokens/s (context) | KV cache | rounds | peak GiB |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    runs = [load(path) for path in paths]
    for path, run in zip(paths, runs):
        size = "-" if run["safetensors_bytes"] is None else f"{run['safetensors_bytes'] / 1e6:.0f}"
        prefill = ", ".join(f"{v:.0f} at {k}" for k, v in run["prefill_tokens_per_s"].items())
        decode = ", ".join(f"{v:.1f} at batch {k}" for k, v in run["decode_tokens_per_s"].items())
        link = f"[{run['label']}](results/{path.parent.name}/{path.name})"
        out.append(f"| {link} | {run['machine']} | {mark(commit_of(path))} | {run['parameters'] / 1e6:.1f} M | "
                   f"{run['prunable_zero_fraction']:.3f} | {size} | {prefill} | {decode} ({run['context']}) | "
                   f"{run.get('cache', 'dynamic')} | {run.get('rounds', 1)} | {run['peak_memory_gb']:.2f} |")
    out += ["", "Commands, as recorded in each file and run from the repository root:", ""]
    out += [f"- {run['label']}: `{runnable(run['command'])}`" for run in runs]
    return out


def serve_section() -> list[str]:
    paths = sorted((RESULTS / "cpu").glob("serve-*.json")) + sorted((RESULTS / "gpu").glob("serve-*.json"))
    if not paths:
        return ["Not yet measured (`python -m bench.timing.serve_speed MODEL …` in the vLLM environment)."]
    out = ["| model | machine | commit | vLLM | parameters | decode tokens/s | end-to-end tokens/s | rounds |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    runs = [load(path) for path in paths]
    for path, run in zip(paths, runs):
        decode = ", ".join(f"{v:.1f} at batch {k}" for k, v in run["decode_tokens_per_s"].items())
        whole = ", ".join(f"{v:.1f} at batch {k}" for k, v in run["end_to_end_tokens_per_s"].items())
        size = "-" if run["parameters"] is None else f"{run['parameters'] / 1e6:.1f} M"
        link = f"[{run['label']}](results/{path.parent.name}/{path.name})"
        out.append(f"| {link} | {run['machine']} | {mark(commit_of(path), SERVING)} | {run['vllm']} | {size} | "
                   f"{decode} | {whole} | {run['rounds']} |")
    out += ["", "Commands, as recorded in each file and run from the repository root:", ""]
    out += [f"- {run['label']}: `{runnable(run['command'])}`" for run in runs]
    return out


def coupled_section() -> list[str]:
    if not list((RESULTS / "coupled").glob("dense@*.json")):
        return ["Not yet measured (`python -m bench.quality.coupled`)."]
    commit, runs = quality_runs("coupled", CPU_EXPORTED)
    older = older_rows(commit, runs, CPU_EXPORTED)
    out = [f"{rows_at(commit, runs, CPU_EXPORTED)}, {runs['dense']['machine']}.", "",
           "| row | ppl | parameters (of dense) | format | decode tokens/s (batch 1, 2048 context) | prune s |",
           "| --- | --- | --- | --- | --- | --- |"]
    for row, run in runs.items():
        size = f"{run['parameters'] / 1e6:.1f} M ({run['parameters'] / run['dense_parameters']:.3f})"
        out.append(f"| {row_label(row, older)} | {run['ppl']:.3f} | {size} | {run['format']} | "
                   f"{run['decode_tokens_per_s']:.1f} | {run['seconds']:.0f} |")
    return out


def dropin_section() -> list[str]:
    path = newest(sorted((RESULTS / "cpu").glob("sparsegpt-dropin@*.json")))
    if path is None:
        return ["Not yet measured (`python -m bench.quality.sparsegpt_dropin`)."]
    run = load(path)
    out = [f"{run['layers']} linear layers of SmolLM2-135M (blocks {', '.join(map(str, run['blocks']))}), H from "
           "the CPU protocol's calibration windows; each method prunes the same layer on the same H. Ratio: the "
           "drop-in's layer output error ½ tr(ΔW H ΔWᵀ) over SparseGPT's (lower is better); SparseGPT's error and "
           "seconds are its published column loop's (`baselines.sparsegpt_reference`). "
           f"{mark(commit_of(path))}, {run['machine']}, `{runnable(run['command'])}`.", ""]
    out += dropin_rows(run)
    out += dropin_oneshot_rows()
    gpu = newest(sorted((RESULTS / "gpu").glob("sparsegpt-dropin-llama2-7b@*.json")))
    if gpu is not None:
        run = load(gpu)
        out += ["", "Llama-2-7B's layer shapes (q_proj 4096×4096, up_proj 11008×4096, down_proj 4096×11008), random "
                "weights, H from 8192 correlated random inputs: the times say what a 7B layer costs, the errors "
                f"nothing about real models. {mark(commit_of(gpu))}, {run['machine']}, "
                f"`{runnable(run['command'])}`.", "",
                *dropin_rows(run)]
    return out


def dropin_oneshot_rows() -> list[str]:
    """The drop-in's modifier against llm-compressor's SparseGPTModifier in one `oneshot` each, at the newest commit
    where both ran (`bench/quality/peers.py`)."""
    quality = RESULTS / "quality"
    commits = {commit_of(p) for p in quality.glob("*-llmc-surgeon-sparsegpt@*.json")}
    commits = {c for c in commits if list(quality.glob(f"*-llmc-sparsegpt@{c}.json"))}
    order = commit_order()
    newest_commit = min(commits, key=lambda c: order.get(c, len(order)), default=None)
    if newest_commit is None:
        return []
    out = ["", "Inside llm-compressor's `oneshot` (`bench/quality/peers.py`: the quality table's protocol, "
           "SmolLM2-135M, 8 × 512 calibration tokens, perplexity on 8 test windows of 2048), "
           f"{mark(newest_commit, CPU_PRUNING)}: "
           "`SurgeonSparseGPTModifier` with its defaults against `SparseGPTModifier`; seconds are whole `oneshot` "
           "calls, run in turn on the same machine. The exact mode's rows (`-exact`) are the newest measured, "
           "their times against SparseGPTModifier's at their own commit.", "",
           "| structure | modifier | ppl | seconds | time against SparseGPTModifier |",
           "| --- | --- | --- | --- | --- |"]
    for structure in ("unstructured", "2of4"):
        peer = load(quality / f"{structure}-0.5-llmc-sparsegpt@{newest_commit}.json")
        rows = [("SparseGPTModifier", peer, peer)]
        ours = quality / f"{structure}-0.5-llmc-surgeon-sparsegpt@{newest_commit}.json"
        if ours.exists():
            run = load(ours)
            rows.append((f"SurgeonSparseGPTModifier (refine, {run['config'].get('iterations', '-')} steps)", run, peer))
        exact = newest(sorted(quality.glob(f"{structure}-0.5-llmc-surgeon-sparsegpt-exact@*.json")))
        if exact is not None:  # against the SparseGPTModifier run in turn with it
            beside = quality / f"{structure}-0.5-llmc-sparsegpt@{commit_of(exact)}.json"
            rows.append((f"SurgeonSparseGPTModifier (exact, {mark(commit_of(exact), CPU_PRUNING)})", load(exact),
                         load(beside) if beside.exists() else None))
        for label, run, against in rows:
            ratio = f"{run['seconds'] / against['seconds']:.2f}×" if against else "–"
            if against is not None and against is not peer:
                ratio += f" (SparseGPTModifier then: {against['ppl']:.3f} in {against['seconds']:.0f} s)"
            out.append(f"| {structure.replace('of', ':')} 0.5 | {label} | {run['ppl']:.3f} | {run['seconds']:.0f} | "
                       f"{ratio} |")
    return out


def dropin_rows(run: dict[str, Any]) -> list[str]:
    out = ["| structure | drop-in mode | error ratio, geometric mean | worst layer | drop-in s | SparseGPT s | "
           "time against SparseGPT |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for structure, summary in run["summary"].items():
        for mode, values in summary["modes"].items():
            out.append(f"| {structure} | {mode} | {values['geomean_ratio']:.3f} | {values['worst_ratio']:.3f} | "
                       f"{values['seconds']:.2f} | {summary['sparsegpt_seconds']:.2f} | "
                       f"{values['seconds'] / summary['sparsegpt_seconds']:.2f}× |")
    return out


# ---------------------------------------------------------------- kernels


def kernel_section() -> list[str]:
    out = ["| op | provider | shape | dtype | median | spread | rate | of ceiling | machine | commit |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    cpu = RESULTS / "micro-cpu.json"
    if cpu.exists():
        data = load(cpu)
        commit = data["commit_info"]["id"][:7]
        for bench in data["benchmarks"]:
            op = bench["name"].split("[")[0].removeprefix("test_")
            params = bench["params"]
            provider = params.get("backend") or params.get("method") or "torch"
            shape = ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("backend", "method", "dtype")) or "-"
            dtype = re.sub(r"UNSERIALIZABLE\[torch\.(\w+)\]", r"\1", str(params.get("dtype", "float32")))
            info, stats = bench["extra_info"], bench["stats"]
            rate = f"{info['gflops']:.0f} GFLOP/s" if "gflops" in info else (
                f"{info['gbytes_per_s']:.1f} GB/s" if "gbytes_per_s" in info else "-")
            fraction = info.get("gemm_fraction", info.get("bandwidth_fraction"))
            out.append(f"| {op} | {provider} | {shape} | {dtype} | {stats['median'] * 1e3:.2f} ms | "
                       f"IQR {stats['iqr'] * 1e3:.2f} ms | {rate} | {'-' if fraction is None else f'{fraction:.0%}'} | "
                       f"{info.get('machine', 'CPU')} | {mark(commit, KERNEL_CODE.get(op, CODE))} |")
    for path in sorted((RESULTS / "gpu").glob("micro-*.json")):
        data = load(path)
        for row in data["rows"]:
            rate = f"{row['tflops']:.1f} TFLOP/s" if "tflops" in row else (
                f"{row['gbytes_per_s']:.0f} GB/s" if "gbytes_per_s" in row else "-")
            fraction = row.get("fraction_of_bf16_gemm", row.get("fraction_of_copy"))
            dtype = row["dtype"].removeprefix("torch.")
            out.append(f"| {row['op']} | {row['provider']} | {row['shape']} | {dtype} | "
                       f"{row['ms']:.3f} ms | p20–p80 {row['ms_20']:.3f}–{row['ms_80']:.3f} ms | {rate} | "
                       f"{'-' if fraction is None else f'{fraction:.0%}'} | {data['device']} | "
                       f"{mark(commit_of(path), KERNEL_CODE.get(row['op'], CODE))} |")
    return out


# ---------------------------------------------------------------- blocks


def machines(runs: dict[str, dict[str, Any]]) -> list[str]:
    """The machines every result names, described once: the one CPU kind, and each GPU with its torch."""
    lines = [f"- CPU: 2-core x86_64 machines, torch 2.13.0+cpu: every CPU row. Their models differ in speed: rows "
             "name the CPU model since it was recorded, and seconds compare within the rows of one machine (the "
             f"quality table's: {runs['dense'].get('machine', 'unknown')})."]
    devices = sorted({f"{load(p)['device']}, torch {load(p).get('torch', '?')}"
                      for p in (RESULTS / "gpu").glob("shot-*.json")})
    lines += [f"- GPU: {device}." for device in devices]
    return lines


def quality_block(commit: str, runs: dict[str, dict[str, Any]]) -> list[str]:
    dense = runs["dense"]
    budget = f"{dense['calib_windows']} × {dense['calib_seqlen']} calibration tokens, "
    return [f"{rows_at(commit, runs, CPU_PRUNING)}: {dense.get('model', 'smollm2-135m')}, {budget}perplexity on the "
            f"first {dense['eval_windows']} test windows of 2048.", "",
            quality_table(runs, older_rows(commit, runs, CPU_PRUNING))]


def blocks() -> dict[str, list[str]]:
    """The generated blocks of RESULTS.md by name: each replaces what stands between its markers."""
    commit, runs = quality_runs()
    return {
        "machines": machines(runs),
        "quality": quality_block(commit, runs),
        **{folder: quality_block(*quality_runs(folder)) for folder in second_models()},
        "time-to-quality": time_to_quality_section(runs, commit),
        "cpu-time": cpu_time_section(),
        "gpu-time": gpu_time_section(),
        "ranks": ranks_section(),
        "memory-options": memory_options_section(),
        "plan": plan_section(),
        "generation": generation_section(),
        "serve": serve_section(),
        "coupled": coupled_section(),
        "drop-in": dropin_section(),
        "kernels": kernel_section(),
    }


def filled(text: str, generated: dict[str, list[str]]) -> str:
    """`text` with each `<!-- generated: NAME -->` … `<!-- end: NAME -->` block holding `generated[NAME]`."""
    for name, lines in generated.items():
        start, end = f"<!-- generated: {name} -->", f"<!-- end: {name} -->"
        pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise SystemExit(f"bench/RESULTS.md has no {start} … {end} block")
        block = "\n".join([start, *lines, end])
        text = pattern.sub(lambda _, block=block: block, text)
    return text


# The README's second model: the quality folder of its rows, and its label.
SECOND = ("quality-gemma3-270m-8x256", "Gemma-3-270M")


def readme_with_headline(readme: str) -> str:
    """`readme` with its results table filled from the quality runs of both models (`quality_runs`)."""
    def at(commit: str, runs: dict[str, dict[str, Any]]) -> str:
        current, older = commit_groups(commit, runs, CPU_PRUNING)
        text = listing([f"`{c}`" for c in current]) + (" (stale)" if stale(current[-1], CPU_PRUNING) else "")
        return text + (f", † at {listing([f'`{c}`' for c in older])} (older code)" if older else "")

    commit, runs = quality_runs()
    models = [("SmolLM2-135M", runs, frozenset(older_rows(commit, runs, CPU_PRUNING)))]
    note = f"SmolLM2 (dense {runs['dense']['ppl']:.2f}) at {at(commit, runs)}"
    if (RESULTS / SECOND[0]).is_dir():
        second_commit, second = quality_runs(SECOND[0])
        models.append((SECOND[1], second, frozenset(older_rows(second_commit, second, CPU_PRUNING))))
        note += f"; {SECOND[1]} (dense {second['dense']['ppl']:.2f}) at {at(second_commit, second)}"
    note = f"Perplexity on WikiText-2: {note}; every row and method in `bench/RESULTS.md`."
    table = f"{HEADLINE_START}\n{headline_table(models)}\n\n{note}\n{HEADLINE_END}"
    pattern = re.compile(re.escape(HEADLINE_START) + ".*?" + re.escape(HEADLINE_END), re.S)
    if not pattern.search(readme):
        raise SystemExit(f"README.md has no {HEADLINE_START} … {HEADLINE_END} block")
    return pattern.sub(lambda _: table, readme)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that README.md's table is current")
    args = parser.parse_args()
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    updated = readme_with_headline(readme)
    if args.check:
        if updated != readme:
            print("README.md's results table differs from bench/results/quality: run `make results`", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(updated)
    results = ROOT / "bench" / "RESULTS.md"
    results.write_text(filled(results.read_text(), blocks()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
