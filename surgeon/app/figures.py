"""`surgeon report`: figures and a Markdown summary of a pruning run, and the mask equivalence of two runs.

Figures (PNG, matplotlib): the kept fraction of every layer by depth and by layer type (the
paper's Figure 5), perplexity per shot (runs pruned with `--eval-every-shot`), and seconds per
phase per shot. The mask equivalence of two runs is the paper's (app. "Mask equivalence"): the
fraction of prunable weights that are zero in both models.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from surgeon.app.settings import ReportConfig
from surgeon.errors import SurgeonError
from surgeon.io import COMPLETE_MARKER, OutputDirectory, read_run

KEPT, PPL, TIME = "kept-by-layer.png", "perplexity-per-shot.png", "time-per-phase.png"
PRUNE_PARTS = ("costs", "threshold", "update")  # timed inside a shot's "prune" phase (surgeon.pruning.shots)


def load_run(folder: str | Path) -> dict[str, Any]:
    """The report.json of a `surgeon prune` output folder, or a SurgeonError naming what is missing."""
    report = read_run(folder)
    if not report.get("layers") or not report.get("shots"):
        raise SurgeonError(f"{str(Path(folder) / COMPLETE_MARKER)!r} is not a pruning report "
                           "(no per-layer or per-shot results)")
    return report


def layer_position(name: str) -> tuple[int, str]:
    """(decoder block index, layer type) of a qualified name such as model.layers.3.self_attn.q_proj."""
    match = re.search(r"\.(\d+)\.", name)
    if match is None:
        raise SurgeonError(f"layer {name!r} has no block index")
    return int(match.group(1)), name.rsplit(".", 1)[-1]


def kept_by_type(report: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """For each layer type, (block, kept fraction) in block order."""
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for name, removed in report["layers"].items():
        block, kind = layer_position(name)
        out[kind].append((block, 1.0 - removed))
    return {kind: sorted(points) for kind, points in out.items()}


def _prunable_weights(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The weights of the named layers, read from the folder's safetensors files."""
    from safetensors import safe_open

    wanted, found = {f"{name}.weight" for name in names}, {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in wanted & set(handle.keys()):
                found[key] = handle.get_tensor(key)
    missing = wanted - set(found)
    if missing:
        raise SurgeonError(f"{str(folder)!r} has no weights for {len(missing)} pruned layers "
                           f"(e.g. {sorted(missing)[0]}); is it the model the report describes?")
    return found


def mask_equivalence(run: str | Path, other: str | Path) -> dict[str, Any]:
    """Fraction of prunable weights zero in both runs' models, overall and per layer type (paper app.)."""
    names = list(load_run(run)["layers"])
    if sorted(names) != sorted(load_run(other)["layers"]):
        raise SurgeonError(f"{str(run)!r} and {str(other)!r} pruned different layers: not the same model")
    ours, theirs = _prunable_weights(Path(run), names), _prunable_weights(Path(other), names)
    both: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for key, weight in ours.items():
        if weight.shape != theirs[key].shape:
            raise SurgeonError(f"{key} is {list(weight.shape)} in one run and {list(theirs[key].shape)} in the other")
        kind = layer_position(key[: -len(".weight")])[1]
        both[kind] += int(((weight == 0) & (theirs[key] == 0)).sum())
        total[kind] += weight.numel()
    return {"overall": sum(both.values()) / sum(total.values()),
            "by_type": {kind: both[kind] / total[kind] for kind in sorted(total)}}


def _title(report: dict[str, Any]) -> str:
    config = report["config"]
    return f"{report.get('model', '')} · {config['method']} · {config['structure']} · kept {config['target_size']}"


def draw_kept(report: dict[str, Any], path: Path) -> None:
    """Kept fraction by depth, one line per layer type (left), and by layer type over all blocks (right)."""
    import matplotlib.pyplot as plt

    kinds = kept_by_type(report)
    figure, (depth, types) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2.2, 1]})
    for kind, points in kinds.items():
        depth.plot([b for b, _ in points], [k for _, k in points], marker="o", markersize=3, label=kind)
    depth.set(xlabel="decoder block", ylabel="fraction of weights kept", ylim=(0, 1.02), title="by depth")
    depth.legend(fontsize=8, ncol=2)
    means = {kind: sum(k for _, k in points) / len(points) for kind, points in kinds.items()}
    types.bar(list(means), list(means.values()), color="tab:blue")
    types.set(ylim=(0, 1.02), title="by layer type (mean over blocks)")
    types.tick_params(axis="x", labelrotation=45)
    figure.suptitle(_title(report))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def draw_perplexity(report: dict[str, Any], path: Path) -> None:
    """Perplexity after every shot, from the dense model (shot 0), log scale."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    shots = [0] + [s["shot"] for s in report["shots"]]
    ppl = [report["ppl_before"]] + [s["ppl"] for s in report["shots"]]
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot(shots, ppl, marker="o")
    for shot, value, size in zip(shots, ppl, [1.0] + [s["target_size"] for s in report["shots"]]):
        axis.annotate(f"{value:.1f}\n(kept {size:.2f})", (shot, value), textcoords="offset points", xytext=(0, 6),
                      ha="center", fontsize=7)
    axis.set(xlabel="shot (0: dense)", ylabel="perplexity", yscale="log", xticks=shots, title=_title(report))
    axis.yaxis.set_major_formatter(ScalarFormatter())
    axis.yaxis.set_minor_formatter(ScalarFormatter())
    axis.margins(y=0.15)  # room for the labels above the points
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def time_stack(seconds: dict[str, float]) -> dict[str, float]:
    """A shot's seconds as disjoint phases: "prune" less the costs, threshold and update it contains, when timed."""
    parts = {name: value for name, value in seconds.items() if name != "prune"}
    if "prune" in seconds:
        inside = sum(seconds.get(name, 0.0) for name in PRUNE_PARTS)
        parts["prune, other"] = max(seconds["prune"] - inside, 0.0)
    return parts


def draw_time(report: dict[str, Any], path: Path) -> None:
    """Seconds per phase per shot, stacked."""
    import matplotlib.pyplot as plt

    shots = [s["shot"] for s in report["shots"]]
    stacks = [time_stack(s["seconds"]) for s in report["shots"]]
    phases = list(dict.fromkeys(p for stack in stacks for p in stack))
    figure, axis = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(shots)
    for phase in phases:
        values = [stack.get(phase, 0.0) for stack in stacks]
        axis.bar(shots, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    axis.set(xlabel="shot", ylabel="seconds", xticks=shots, title=_title(report))
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars, never over them
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def summary(report: dict[str, Any], figures: list[str], equivalence: dict[str, Any] | None,
            compare: str | None) -> str:
    """The Markdown summary of a run, linking its figures."""
    config = report["config"]
    lines = [f"# Pruning report: {report.get('model', '')}", "",
             "| | |", "| --- | --- |",
             f"| method | {config['method']} |", f"| structure | {config['structure']} |",
             f"| target size (kept) | {config['target_size']} |", f"| shots | {config['shots']} |",
             f"| perplexity | {report['ppl_before']:.4f} → {report['ppl_after']:.4f} |",
             f"| sparsity of prunable weights | {report['sparsity']:.4f} |",
             f"| wall time | {report['seconds']:.1f} s |", ""]
    lines += ["## Kept fraction by layer type", "", "| layer type | mean kept | least kept | most kept |",
              "| --- | --- | --- | --- |"]
    for kind, points in kept_by_type(report).items():
        kept = [k for _, k in points]
        lines.append(f"| {kind} | {sum(kept) / len(kept):.3f} | {min(kept):.3f} | {max(kept):.3f} |")
    lines.append("")
    if any(s.get("ppl") is None for s in report["shots"]):
        lines += ["Perplexity per shot: not recorded (prune with `--eval-every-shot`).", ""]
    lines += ["## Figures", ""] + [f"![{name}]({name})" for name in figures] + [""]
    if equivalence is not None:
        lines += [f"## Mask equivalence with `{compare}`", "",
                  "Fraction of prunable weights zero in both models (the paper's mask equivalence).", "",
                  "| layers | equivalence |", "| --- | --- |", f"| all | {equivalence['overall']:.4f} |"]
        lines += [f"| {kind} | {value:.4f} |" for kind, value in equivalence["by_type"].items()] + [""]
    return "\n".join(lines)


def write_report(config: ReportConfig) -> dict[str, Any]:
    """Write the figures and summary.md of `config.run` into `config.output`; return what was written."""
    try:
        import matplotlib
    except ImportError as error:
        raise SurgeonError("surgeon report draws with matplotlib, which is not installed: "
                           "pip install 'llm-surgeon[report]'") from error
    matplotlib.use("Agg")
    report = load_run(config.run)
    if config.output is None:
        raise SurgeonError("report needs --output DIR for the figures and summary.md")
    equivalence = mask_equivalence(config.run, config.compare) if config.compare else None
    with OutputDirectory(config.output, config.overwrite) as output:
        figures = [KEPT]
        draw_kept(report, output.staging / KEPT)
        if all(s.get("ppl") is not None for s in report["shots"]):
            figures.append(PPL)
            draw_perplexity(report, output.staging / PPL)
        figures.append(TIME)
        draw_time(report, output.staging / TIME)
        (output.staging / "summary.md").write_text(summary(report, figures, equivalence, config.compare))
        output.commit()
    return {"figures": figures, "mask_equivalence": equivalence}
