"""`Section`, a generated block of bench/RESULTS.md: the rows of the result files a benchmark writes, as a Markdown
table with each row's commit and the commands that wrote them. A benchmark states the blocks of the files it writes
(`SECTIONS`, by the name of their markers) beside the code that writes them; `bench.results_md` fills those and its
own (the quality tables, llm-compressor's runs, which its environment writes, and the blocks no benchmark writes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench import provenance as pv

Row = tuple[Any, ...]


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


def recorded(path: Path, run: pv.Run) -> tuple[str, str]:
    """A file's label and the command it records."""
    return run.get("label", pv.row_of(path)), run["command"]


@dataclass(frozen=True)
class Section:
    """A block of the result files `patterns` match: a table of their rows (or the newest one's, under where it was
    measured), then the commands that wrote them."""

    patterns: str  # glob patterns under bench/results/, parted by spaces
    header: str  # the table's columns, parted by ' | '
    rows: Callable[[Path, pv.Run], list[Row]]  # a file's rows
    paths: pv.Paths | None = None  # the code its rows measure: a commit column, marked stale where it changed
    # "file": only the newest file, under its commit, file, machine and `intro`; "row": each row's newest file
    newest: Literal["file", "row"] | None = None
    intro: Callable[[pv.Run], str] = lambda run: ""  # what the newest file says above its table
    command: Callable[[Path, pv.Run], tuple[str, str]] | None = None  # each file's (label, command), listed below it
    below: Callable[[pv.Runs], list[str]] | None = None  # lines under the table from its runs by row

    def __call__(self) -> list[str]:
        """The section's lines: its table and commands, or where no file is saved yet a line that says so."""
        paths = [path for pattern in self.patterns.split() for path in sorted(pv.RESULTS.glob(pattern))]
        chosen = [pv.newest(paths)] if self.newest == "file" else pv.newest_each_row(paths) if self.newest else paths
        found = [(path, pv.load(path)) for path in chosen if path is not None]
        if not found:
            return ["Not yet measured."]
        path, run = found[0]
        out = [f"At {pv.mark(pv.commit_of(path), self.paths or pv.CODE)} ({link(path)}"
               f"{', ' + run['machine'] if 'machine' in run else ''}). {self.intro(run)}".rstrip(), ""] \
            if self.newest == "file" else []
        out += table(self.header + (" | commit" if self.paths else ""), [
            (*row, *([pv.mark(pv.commit_of(path), self.paths)] if self.paths else [])) for path, run in found
            for row in self.rows(path, run)])
        if self.below is not None:
            out += self.below({pv.row_of(path): run for path, run in found})
        if self.command is not None:
            out += ["", "Commands, as recorded in each file and run from the repository root:", "",
                    *(f"- {label}: `{command}`" for label, command in (self.command(*f) for f in found))]
        return out
