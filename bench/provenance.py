"""Which commit a result file measured, whether the code it measures has changed since, and the CLI's defaults a run
is compared with.

A result is saved as `bench/results/<folder>/<row>@<commit>.json`. It goes stale when the code it measures changed
between that commit and the working tree beyond Python comments and docstrings: `surgeon/`, `surgeon_kernels/` and
`csrc/`, less the export, planning and figure modules for pruning runs (and the Triton kernels for runs on a CPU), and
a kernel's own files for its microbenchmark. A table resumes a row saved at a commit that runs the same code.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
from collections.abc import Iterable
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
# Kernel microbenchmark → the code it measures, beyond its own folders (`surgeon_kernels/<op>`, `csrc/<op>`)
KERNEL_CODE = {"kfac_accumulate": ("surgeon_kernels/symmetric.py",), "kk_solve": ("surgeon_kernels/kk_gather",),
               "global_threshold": ("surgeon_kernels/kth_smallest",),
               "unstructured_update": ("surgeon/method/updates.py", "surgeon/method/inverses.py",
                                       "surgeon_kernels/kk_solve", "surgeon_kernels/kk_gather")}
Run = dict[str, Any]
Runs = dict[str, Run]
Paths = tuple[str, ...]


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
    return f"`{commit}`" + (" (stale)" if code_changed(commit, None, paths) else "")


@functools.cache
def commit_order() -> dict[str, int]:
    """Short hash → position in the history (0 = newest)."""
    return {h: i for i, h in enumerate(git("log", "--format=%h", "--abbrev=7").stdout.split())}


def newest(paths: Iterable[Path]) -> Path | None:
    """The result file saved at the newest commit of this history, if any."""
    order = commit_order()
    return min((p for p in paths if commit_of(p) in order), key=lambda p: order[commit_of(p)], default=None)


def newest_each_row(paths: Iterable[Path]) -> list[Path]:
    """Each row's result file at the newest commit of this history, by row."""
    order, found = commit_order(), {}
    for path in sorted(paths, key=lambda p: -order.get(commit_of(p), -1)):
        if commit_of(path) in order:  # oldest first: each row's newest stays
            found[row_of(path)] = path
    return [found[row] for row in sorted(found, key=lambda row: row + "@")]


def newest_runs(folder: str, pattern: str = "*@*.json") -> Runs:
    """Each row's run in `bench/results/<folder>` at the newest commit of this history, its `commit` that one."""
    return {row_of(path): {**load(path), "commit": commit_of(path)}
            for path in newest_each_row((RESULTS / folder).glob(pattern))}


def kernel_code(op: str) -> Paths:
    """The code a kernel microbenchmark measures: the op's folders and `KERNEL_CODE`'s, or where it has none, all."""
    own = tuple(name for name in (f"surgeon_kernels/{op}", f"csrc/{op}") if (ROOT / name).exists())
    return (*own, *KERNEL_CODE.get(op, ())) or CODE


def cli_defaults(structure: str, target_size: float) -> Any:
    """`surgeon prune`'s settings (a `PruneConfig`) at `structure` and `target_size`, all else its defaults (an N:M
    structure keeps N/M, its own target)."""
    from surgeon.config import PruneConfig
    from surgeon.methods import parse_nm

    return PruneConfig(structure=structure, target_size=None if parse_nm(structure) else target_size)
