"""Fill bench/RESULTS.md's tables (each between `<!-- generated: NAME -->` and `<!-- end: NAME -->`; the rest is
written by hand) and the README's results table from bench/results/: `python -m bench.results_md` (`make results`),
or with `--check` exit 1 where the README's table differs. A row is its run at the newest commit of this history
(the `@<commit>` of its file name), marked stale where the code it measures changed since (`bench.provenance`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench import provenance as pv

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


def seeded(name: str) -> tuple[str, int] | None:
    """(row, seed) of a row run with another calibration seed (`<row>-seed<s>`), else None."""
    row, _, seed = name.rpartition("-seed")
    return (row, int(seed)) if row and seed.isdigit() else None


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

    def ppl(run: pv.Run) -> tuple[str, ...]:  # on the test windows, and on the tuning articles where measured
        return (f"{run['ppl']:.3f}", *([f"{run['tuning_ppl']:.3f}" if "tuning_ppl" in run else "-"] if tuned else []))

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


def seed_spread(runs: pv.Runs) -> list[str]:
    """Per row also run with other calibration seeds at its commit: each seed's perplexity, their mean and range, on
    the test and, where measured, on the tuning windows."""
    spread: dict[str, dict[int, pv.Run]] = {}
    for name, run in runs.items():
        if (found := seeded(name)) is not None and found[0] in runs and run["commit"] == runs[found[0]]["commit"]:
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


def quality_block(folder: str) -> list[str]:
    """A quality folder's table under the model and budget it was measured at, then its spread over seeds."""
    if "dense" not in (runs := pv.newest_runs(folder)):
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
                 "loss | perplexity | seconds | commit", [
                     (name, c["structure"], c["shots"], f"{c['cg_tol']:g}", f"{c['damp_g']:g}",
                      "yes" if c.get("propagate") else "no", c["lora_steps"],
                      (run.get("choice") or {}).get("kept", "–"), f"{run['ppl']:.3f}", f"{run['seconds']:.0f}",
                      pv.mark(run["commit"], pv.CPU_PRUNING))
                     for name, run in found for c in [run["config"]]])


def oneshot_rows(path: Path, run: pv.Run) -> list[Row]:
    """An llm-compressor `oneshot` run's row: its modifier at its structure, timed against SparseGPTModifier's run at
    the same commit."""
    structure, _, modifier = pv.row_of(path).partition("-0.5-llmc-")
    peer = path.with_name(f"{structure}-0.5-llmc-sparsegpt@{pv.commit_of(path)}.json")
    return [(structure.replace("of", ":") + " 0.5", MODIFIERS[modifier], f"{run['ppl']:.3f}", f"{run['seconds']:.0f}",
             f"{run['seconds'] / pv.load(peer)['seconds']:.2f}×" if peer.exists() else "–")]


def layer_rows(path: Path, run: pv.Run) -> list[Row]:
    """A drop-in file's rows: per structure and mode, the layer error ratios and the seconds against SparseGPT's."""
    return [(structure, mode, f"{values['geomean_ratio']:.3f}", f"{values['worst_ratio']:.3f}",
             f"{values['seconds']:.2f}", f"{summary['sparsegpt_seconds']:.2f}",
             f"{values['seconds'] / summary['sparsegpt_seconds']:.2f}×")
            for structure, summary in run["summary"].items() for mode, values in summary["modes"].items()]


def kernel_rows(path: Path, data: pv.Run) -> list[Row]:
    """A kernel microbenchmark file's rows: pytest-benchmark's on the CPU (`micro-cpu.json`), or a GPU file's."""

    def rate(values: pv.Run, *templates: tuple[str, str]) -> str:  # the first of the figures `values` holds
        return next((template.format(values[key]) for key, template in templates if key in values), "-")

    def share(fraction: float | None) -> str:
        return "-" if fraction is None else f"{fraction:.0%}"

    if "benchmarks" not in data:
        return [(row["op"], row["provider"], row["shape"], row["dtype"].removeprefix("torch."), f"{row['ms']:.3f} ms",
                 f"p20–p80 {row['ms_20']:.3f}–{row['ms_80']:.3f} ms",
                 rate(row, ("tflops", "{:.1f} TFLOP/s"), ("gbytes_per_s", "{:.0f} GB/s")),
                 share(row.get("fraction_of_bf16_gemm", row.get("fraction_of_copy"))), data["device"],
                 pv.mark(pv.commit_of(path), pv.kernel_code(row["op"]))) for row in data["rows"]]
    return [(op, params.get("backend") or params.get("method") or "torch",
             ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("backend", "method", "dtype")) or "-",
             re.sub(r"UNSERIALIZABLE\[torch\.(\w+)\]", r"\1", str(params.get("dtype", "float32"))),
             f"{bench['stats']['median'] * 1e3:.2f} ms", f"IQR {bench['stats']['iqr'] * 1e3:.2f} ms",
             rate(info, ("gflops", "{:.0f} GFLOP/s"), ("gbytes_per_s", "{:.1f} GB/s")),
             share(info.get("gemm_fraction", info.get("bandwidth_fraction"))), info.get("machine", "CPU"),
             pv.mark(data["commit_info"]["id"][:7], pv.kernel_code(op)))
            for bench in data["benchmarks"]
            for op, params, info in [(bench["name"].split("[")[0].removeprefix("test_"), bench["params"],
                                      bench["extra_info"])]]


def pipeline_cells(run: pv.Run, stage: str) -> tuple[str, str]:
    """A stage's size on disk and vLLM decode rate: the run folder's on its last stage, the export's, quantized's."""
    last = "recovered" if "recovered" in run["ppl"] else "pruned"
    timed = {"export": "export", "quantized": "quantized", last: "run"}
    if stage not in timed:
        return "", ""
    size = f"{run['bytes'][timed[stage]] / 1e6:.0f}" + (f" ({run['scheme']})" if stage == "quantized" else "")
    return size, per_batch(run["speed"][timed[stage]]["decode_tokens_per_s"])


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
        if self.command is not None:
            out += ["", "Commands, as recorded in each file and run from the repository root:", "",
                    *(f"- {label}: `{command}`" for label, command in (self.command(*f) for f in found))]
        return out


def recorded(path: Path, run: pv.Run) -> tuple[str, str]:
    """A file's label and the command it records."""
    return run.get("label", pv.row_of(path)), run["command"]


LAYERS = ("structure | drop-in mode | error ratio, geometric mean | worst layer | drop-in s | SparseGPT s | "
          "time against SparseGPT")
# Each generated block of RESULTS.md but the quality tables (`quality_block`), by name
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
    "progress": Section(
        "cpu/progress-gaps@*.json",
        "run | longest without a moving bar or a log line, s | the bar that ended it | seconds | command",
        lambda path, result: [
            (row["run"], f"{row['longest_gap_s']:.1f}", row["ended_by"].split(":")[0], f"{row['seconds']:.0f}",
             f"`{row['command']}`") for row in result["rows"]], pv.CPU_PRUNING, newest="file",
        intro=lambda result: f"The model: {result['model']}."),
    "gpu-time": Section(
        "gpu/shot-*.json", "run | device | shots | s per shot | total s | peak GiB", lambda path, run: [
            (link(path, pv.row_of(path)), run["device"], len(run["shots"]), f"{min(seconds):.1f}–{max(seconds):.1f}",
             f"{run['seconds']:.0f}", f"{max(s['peak_memory_gb'] for s in run['shots']):.1f}")  # curvature and prune
            for seconds in [[s["seconds"].get("curvature", 0) + s["seconds"].get("prune", 0) for s in run["shots"]]]],
        pv.PRUNING, command=lambda path, run: (pv.row_of(path), "python " + run["command"])),
    "ranks": Section(
        "cpu/ranks-smollm2-*.json", "structure | ranks | split | prune s | in collectives s | perplexity | command",
        lambda path, result: [
            (link(path, f"{result['structure']} {result['target_size']}"), run["ranks"], run.get("split") or "-",
             f"{run['prune_seconds']:.1f}", f"{run['collective_seconds']:.1f}", f"{run['ppl']:.3f}",
             f"`{run['command']}`") for run in result["runs"]], pv.CPU_PRUNING),
    "memory-options": Section(
        "cpu/memory-options-smollm2@*.json", "options | curvature s | prune s | peak GiB | same weights | command",
        lambda path, result: [
            (row["options"], f"{row['curvature_seconds']:.1f}", f"{row['prune_seconds']:.1f}",
             f"{row['peak_memory_gb']:.2f}", "yes" if row["same_weights"] else "no", f"`{row['command']}`")
            for row in result["rows"]], pv.CPU_PRUNING, newest="file"),
    "plan": Section(
        "plan/plan-table@*.json",
        "model | structure | GPUs | fits | strategy | peak GiB per GPU | host GiB per GPU | projected s per shot "
        "(curvature + prune) | floor s on one H100 (curvature + prune) | held-out shot s", lambda path, result: [
            (row["model"], row["structure"], row["gpus"], "yes" if row["fits"] else "no", row["strategy"],
             f"{row['peak_gpu_bytes'] / 2**30:.1f}",
             f"{row['host_bytes'] / 2**30:.1f}" if row.get("host_bytes") else "-",
             *(f"{s['curvature']:.1f} + {s['prune']:.1f}" if s else "-"
               for s in (row["seconds_per_shot"], row.get("floor_seconds_per_shot_h100"))),
             f"{sum(row['held_out_seconds_h100'].values()):.0f}" if row.get("held_out_seconds_h100") else "-")
            for row in result["rows"]], newest="file"),
    "generation": Section(
        "cpu/generation-*.json gpu/generation-*.json",
        "model | machine | parameters | prunable zeros | safetensors MB | prefill tokens/s | "
        "decode tokens/s (context) | KV cache | rounds | peak GiB", lambda path, run: [
            (link(path, run["label"]), run["machine"], f"{run['parameters'] / 1e6:.1f} M",
             f"{run['prunable_zero_fraction']:.3f}",
             "-" if run["safetensors_bytes"] is None else f"{run['safetensors_bytes'] / 1e6:.0f}",
             per_batch(run["prefill_tokens_per_s"], ".0f", ""), f"{per_batch(run['decode_tokens_per_s'])} "
             f"({run['context']})", run.get("cache", "dynamic"), run.get("rounds", 1), f"{run['peak_memory_gb']:.2f}")],
        pv.CODE, command=recorded),
    "serve": Section(
        "cpu/serve-*.json gpu/serve-*.json",
        "model | machine | vLLM | parameters | decode tokens/s | end-to-end tokens/s | rounds", lambda path, run: [
            (link(path, run["label"]), run["machine"], run["vllm"],
             "-" if run["parameters"] is None else f"{run['parameters'] / 1e6:.1f} M",
             per_batch(run["decode_tokens_per_s"]), per_batch(run["end_to_end_tokens_per_s"]), run["rounds"])],
        pv.SERVING, command=recorded),
    "recovery": Section(
        "recovery/*.json", "run | dense | pruned | perplexity (tuning perplexity) at tokens (training seconds) | lr | "
        "batch | last-quarter loss | passes over the text", lambda path, run: [
            (link(path, pv.row_of(path)), f"{run['ppl_dense']:.2f}", f"{run['curve'][0]['ppl']:.2f}",
             ", ".join(f"{p['ppl']:.2f}" + (f" ({p['tuning_ppl']:.2f})" if "tuning_ppl" in p else "")
                       + f" at {p['tokens']} ({p['seconds']:.0f} s)" for p in run["curve"][1:]),
             f"{run['lr']:g}", run.get("batch_size", 1), f"{sum(tail) / len(tail):.4f}", f"{run['passes']:.2f}")
            for tail in [run["losses"][-max(1, len(run["losses"]) // 4):]]],  # the last quarter of the steps' losses
        pv.CPU_RECOVERED, command=recorded),
    "pipeline": Section(
        "pipeline/*.json", "run | stage | perplexity | weights MB | vLLM decode tokens/s", lambda path, run: [
            (link(path, run["label"]) if n == 0 else "", stage, f"{ppl:.2f}", *pipeline_cells(run, stage))
            for n, (stage, ppl) in enumerate(run["ppl"].items())], pv.CPU_RECOVERED, command=recorded),
    "coupled": Section(
        "coupled/*@*.json", "row | ppl | parameters (of dense) | format | decode tokens/s (batch 1, 2048 context) | "
        "prune s | machine", lambda path, run: [
            (pv.row_of(path), f"{run['ppl']:.3f}",
             f"{run['parameters'] / 1e6:.1f} M ({run['parameters'] / run['dense_parameters']:.3f})", run["format"],
             f"{run['decode_tokens_per_s']:.1f}", f"{run['seconds']:.0f}", run["machine"])], pv.CPU_EXPORTED,
        newest="row"),
    "drop-in": Section("cpu/sparsegpt-dropin@*.json", LAYERS, layer_rows, newest="file", command=recorded),
    "oneshot": Section("quality/*-llmc-*sparsegpt*@*.json",
                       "structure | modifier | ppl | seconds | time against SparseGPTModifier", oneshot_rows,
                       pv.CPU_PRUNING, newest="row"),
    "drop-in-gpu": Section("gpu/sparsegpt-dropin-llama2-7b@*.json", LAYERS, layer_rows, newest="file",
                           command=recorded),
    "kernels": Section("micro-cpu.json gpu/micro-*.json",
                       "op | provider | shape | dtype | median | spread | rate | of ceiling | machine | commit",
                       kernel_rows),
}


def blocks() -> dict[str, list[str]]:
    """The generated blocks of RESULTS.md by name: each replaces what stands between its markers."""
    folders = ["quality", *(path.name for path in sorted(pv.RESULTS.glob("quality-*")) if path.is_dir())]
    return {**{folder: quality_block(folder) for folder in folders},
            **{name: block() for name, block in SECTIONS.items()}}


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
