r"""Quality table on SmolLM2-135M, and on Gemma-3-270M the rows that decide the defaults, one command each.

Protocol (runs on a 2-core CPU): the packaged WikiText-2 validation split (`wiki.valid.tokens`) less its last
articles, at least 8 × 2048 tokens set aside for tuning, is the calibration text: of it `surgeon prune` sets aside
its own last articles for the held-out windows and draws 8 calibration windows of 512 tokens from the rest (seed
0). 4 shots for structured and unstructured rows; perplexity on the first 8 windows of 2048 tokens of the
WikiText-2 test split, and on as many of the tuning articles, by which settings are chosen. Damping as
docs/DESIGN.md (λ_G = 0.1, λ_A = 0.01). Unstructured LLM Surgeon rows solve all pruned weights of a
layer jointly (the default `max_correlate=0`: eqs. 4-5 by conjugate gradients to a relative residual
of 1e-3, at most 40 iterations per layer); the row `unstructured-0.5-surgeon-m64` is the reference
code's form (chunks of 64 solved independently, λ_G = 0.01). N:M rows (2:4, 4:8) run N:M's defaults:
one shot, which LLM Surgeon, K-OBD and L-OBD prune block by block on propagated inputs with λ_G = 1;
`-4shots` rows are the paper's schedule (4 shots, λ_G = 0.1, nothing propagated). SparseGPT and Wanda
run in one shot, as published; so does `sparsegpt-exact` (SparseGPT's mask with the exact per-row
update). Structured 80% with 20 LoRA steps per shot and unstructured in 2 shots are the settings
that reached the goals in bench/quality/time_to_quality.py. LLM Surgeon's unstructured and N:M rows are
weighed against one sparsegpt-refine shot on the held-out calibration windows, as `surgeon prune` does
(`PruneConfig.held_out_choice`), except the paper's schedule and the reference code's form, which show those
methods alone; every window begins with the tokenizer's BOS where it puts one (Gemma's), but the calibration and
held-out windows of a row `<default row>-no-bos`, which keep the token each was drawn with (`NO_BOS`).

Gemma-3-270M (`--model gemma3-270m`, GGUF Q4_K_M, a second family): 8 calibration windows of 256 tokens, the
first 2 test windows of 2048; each structure's CLI defaults (LLM Surgeon) against its baselines: structured 80%
against K-OBD, unstructured 50% and 2:4 against SparseGPT, Wanda and sparsegpt-refine (one shot each). The same
rows run on SmolLM2 at any calibration budget but its table's (`--calib-windows 128 --calib-seqlen 2048`: the
CLI's own).

Each run is saved as bench/results/quality/<row>@<commit>.json (another model or calibration budget:
bench/results/quality-<model>-<n>x<seqlen>/) and skipped where a run of it on the same machine at a commit with the
same pruning code exists, so an interrupted table resumes; with `--checkpoints DIR` a row also writes a checkpoint
after every shot into DIR/<results folder>/<row> and continues from it, so that a row of several hours spreads over
several runs. `python -m bench.results_md` writes the tables into RESULTS.md.

    python -m bench.quality.table                        # every row (1.5-3 hours on 2 cores)
    python -m bench.quality.table --only structured-0.8  # rows whose id contains this text
    python -m bench.quality.table --model gemma3-270m    # Gemma-3-270M's rows (about 20 minutes)
    python -m bench.quality.table --model gemma3-270m --calib-windows 16 --calib-seqlen 512 --only 2of4
    python -m bench.quality.table --row 2of4-0.5-surgeon --row 2of4-0.5-sparsegpt --seeds 0 1 2  # seeds' spread
    python -m bench.quality.table --calib-windows 128 --calib-seqlen 2048 --weigh-apart --row 2of4-0.5-surgeon-alone \
        --row 2of4-0.5-sparsegpt-refine                  # the default row from its two parts, each run once
    python -m bench.quality.table --calib-windows 128 --calib-seqlen 2048 --checkpoints /tmp/rows \
        --row structured-0.8-surgeon                     # stopped, it continues after the row's last shot
    python -m bench.quality.table --calib-windows 32 --calib-seqlen 1024 --row 2of4-0.5-surgeon-alone-sampled
                                                         # a candidate setting (`CANDIDATES`), run where named
    python -m bench.quality.table --model gemma3-270m --row unstructured-0.5-surgeon-no-bos --seeds 0 1 2
                                                         # the default calibrated without BOS (`NO_BOS`)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.machine import cpu_machine
from bench.provenance import cli_defaults
from bench.seeds import add_seeds_option, seed_row
from surgeon import PruneConfig, prune
from surgeon.app.data import (
    calibration_text,
    calibration_windows,
    evaluation_text,
    held_out_count,
    held_out_windows,
    leading_token,
    set_aside,
    tokenize,
)
from surgeon.app.evaluate import perplexity
from surgeon.errors import SurgeonError
from surgeon.io import write_json
from surgeon.models.adapter import load_model
from surgeon.pruning.held_out import held_out_loss
from surgeon.pruning.resume import STATE, Checkpoint, has_state, read_state

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROOT = RESULTS / "quality"
# model -> (calibration windows, their tokens, evaluation windows of 2048): each model's protocol
PROTOCOLS = {"smollm2-135m": (8, 512, 8), "gemma3-270m": (8, 256, 2)}
STRUCTURED = ("magnitude", "lobd", "kobd", "surgeon-within", "surgeon")
ELEMENT = ("magnitude", "wanda", "sparsegpt", "sparsegpt-exact", "kobd", "surgeon")


def rows(shots_structured: int, shots_element: int) -> list[tuple[str, PruneConfig]]:
    """(id, config) for every row of the table."""
    out = []
    for size in (0.8, 0.9, 0.7):
        for method in STRUCTURED:
            correlation = "within" if method == "surgeon-within" else "joint"
            config = PruneConfig(structure="structured", target_size=size, shots=shots_structured,
                                 method=method.split("-")[0], correlation=correlation)
            out.append((f"structured-{size}-{method}", config))
    for structure, methods in (("unstructured", ELEMENT), ("2:4", ELEMENT), ("4:8", ("sparsegpt", "sparsegpt-exact",
                                                                                     "surgeon"))):
        for method in methods:
            shots = 1 if method in ("wanda", "sparsegpt", "sparsegpt-exact") or structure != "unstructured" \
                else shots_element
            config = PruneConfig(structure=structure, target_size=0.5, shots=shots, method=method)
            out.append((f"{structure.replace(':', 'of')}-0.5-{method}", config))
    for structure in ("2:4", "4:8"):
        out.append((f"{structure.replace(':', 'of')}-0.5-surgeon-4shots",
                    PruneConfig(structure=structure, shots=shots_element, propagate=False, held_out_choice=False)))
    ablation = PruneConfig(structure="unstructured", target_size=0.5, shots=shots_element, max_correlate=64,
                           damp_g=0.01, held_out_choice=False)
    out.append(("unstructured-0.5-surgeon-m64", ablation))
    # the settings that reach the goals of bench/RESULTS.md's time-to-quality section
    out += [("structured-0.8-surgeon-lora20", PruneConfig(structure="structured", target_size=0.8,
                                                          shots=shots_structured, lora_steps=20)),
            ("unstructured-0.5-surgeon-shots2", PruneConfig(structure="unstructured", target_size=0.5, shots=2))]
    return out


def defaults_rows() -> list[tuple[str, PruneConfig]]:
    """(id, config) of each structure's CLI defaults against its baselines, and LLM Surgeon's own unstructured and
    N:M models (not weighed against sparsegpt-refine's): the rows on a second model, or at another calibration
    budget than SmolLM2's table."""
    out = [(f"structured-0.8-{method}", PruneConfig(structure="structured", target_size=0.8, method=method))
           for method in ("kobd", "surgeon")]
    for structure in ("unstructured", "2:4"):
        for method in ("wanda", "sparsegpt", "sparsegpt-refine", "surgeon"):
            shots = None if method == "surgeon" else 1
            out.append((f"{structure.replace(':', 'of')}-0.5-{method}",
                        PruneConfig(structure=structure, target_size=0.5, shots=shots, method=method)))
        out.append((f"{structure.replace(':', 'of')}-0.5-surgeon-alone",
                    PruneConfig(structure=structure, target_size=0.5, held_out_choice=False)))
    return out


# Candidate settings for LLM Surgeon's own models, run only where named (`--row`), each beside its row of
# `defaults_rows` and judged on the tuning windows, with the structures each applies to: G from labels drawn from the
# model (eq. 6's Fisher), the update stopped early (as sparsegpt-refine stops its own, but with G), A shrunk more, and
# the last unstructured shot pruned block by block on propagated inputs (as N:M's is by default), each layer's
# sparsity kept within a deviation of the shot's (0: every layer alike, as SparseGPT's are) under the one threshold,
# N:M masks by eq. 7's costs at once, the paper's, where the default sweeps them (`PruneConfig.nm_mask`), and
# structured 80% in other numbers of shots than its default 4: the time-to-quality curve at any calibration budget
CANDIDATES = {"sampled": (dict(fisher="sampled"), ("structured", "unstructured", "2:4")),
              "cg8": (dict(cg_max_iter=8), ("unstructured", "2:4")),  # a structured update solves no CG
              "damp-a0.1": (dict(damp_a=0.1), ("structured", "unstructured", "2:4")),
              "propagated": (dict(propagate=True), ("unstructured",)),
              "propagated-g1": (dict(propagate=True, damp_g=1.0), ("unstructured",)),  # N:M's propagated λ_G
              "per-layer": (dict(layer_deviation=0.0), ("unstructured",)),
              **{f"deviation{d}": (dict(layer_deviation=d), ("unstructured",)) for d in (0.05, 0.1, 0.2, 0.3)},
              # λ_G a tenth and ten times each structure's default: 0.1 for structured and unstructured, 1 for N:M
              **{f"damp-g{g:g}": (dict(damp_g=g), ("structured", "unstructured")) for g in (0.01, 1.0)},
              **{f"damp-g{g:g}": (dict(damp_g=g), ("2:4",)) for g in (0.1, 10.0)},
              "mask-costs": (dict(nm_mask="costs"), ("2:4",)),
              **{f"shots{n}": (dict(shots=n), ("structured",)) for n in (1, 2, 8)}}


def candidate_rows() -> list[tuple[str, PruneConfig]]:
    """(id, config) of each candidate setting on LLM Surgeon's structured 80% and its own unstructured and 2:4."""
    out = []
    for name, (settings, structures) in CANDIDATES.items():
        out += [("structured-0.8-surgeon-" + name, PruneConfig(structure="structured", target_size=0.8, **settings))
                ] if "structured" in structures else []
        out += [(f"{structure.replace(':', 'of')}-0.5-surgeon-alone-{name}",
                 PruneConfig(structure=structure, target_size=0.5, held_out_choice=False, **settings))
                for structure in ("unstructured", "2:4") if structure in structures]
    return out


# The suffix of a default row or baseline calibrated, and weighed on held-out windows, without BOS: the candidate
# against the rule that every window begins with it (docs/DESIGN.md, "Defaults"); it changes nothing where the
# tokenizer puts no BOS (SmolLM2's).
NO_BOS = "-no-bos"


def runnable_rows(shots_structured: int, shots_element: int) -> dict[str, PruneConfig]:
    """Every row `--row` runs on any model and budget, by id: SmolLM2's table (its settings where an id is also a
    default row, as `unstructured-0.5-surgeon`'s 4 shots), the default rows and baselines (`sparsegpt-refine`, the
    `-surgeon-alone` models), each of those also without BOS (`NO_BOS`), and the candidates."""
    no_bos = [(row + NO_BOS, config) for row, config in defaults_rows()]
    return dict(defaults_rows() + no_bos + rows(shots_structured, shots_element) + candidate_rows())


def head_commit() -> str:
    """The short hash of the checked-out commit, which names the result files ($COMMIT where set: a copied tree)."""
    return os.environ.get("COMMIT") or subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True,
                                                      text=True, cwd=Path(__file__).parent).stdout.strip()


def measured(path: Path, machine: str) -> bool:
    """Whether the run `path` (`<row>@<commit>.json`) was saved, or the same row on `machine` at another commit that
    runs the same pruning code (between them only benchmarks or documents changed): an interrupted table resumes
    across commits, and its seconds stay those of one machine."""
    from bench.provenance import commit_of, load, row_of, same_code

    return path.exists() or any(load(other).get("machine") == machine and same_code(commit_of(other), commit_of(path))
                                for other in path.parent.glob(f"{row_of(path)}@*.json"))


def folder(model: str, calib_windows: int, calib_seqlen: int) -> Path:
    """Where the rows of `model` at this calibration budget are saved (SmolLM2's protocol: `ROOT`)."""
    if (model, calib_windows, calib_seqlen) == ("smollm2-135m", *PROTOCOLS["smollm2-135m"][:2]):
        return ROOT
    return RESULTS / f"quality-{model}-{calib_windows}x{calib_seqlen}"


# The protocol's texts: calibration, held-out and tuning windows come from the validation split, which shares no
# passage with the test split that every perplexity is reported on (tests/test_data.py). Its last articles, at least
# TUNING_TOKENS, are set aside for choosing settings; `surgeon prune` runs on the rest.
CALIBRATION, EVALUATION = "wikitext2-valid", "wikitext2"
TUNING_TOKENS = 8 * 2048


@dataclass
class Protocol:
    """What every run of a model's protocol starts from: the model, a copy of its dense weights, its tokenizer, the
    WikiText-2 test ids, the tuning ids, the ids and BOS of the text the calibration windows are drawn from, the
    calibration windows and the held-out windows `surgeon prune` takes beside them with `seed`, and the ids of the
    articles set aside for the held-out windows."""

    model: Any
    dense_state: dict[str, torch.Tensor]
    tokenizer: Any
    test_ids: torch.Tensor
    tuning_ids: torch.Tensor
    ids: torch.Tensor
    bos: int | None
    windows: torch.Tensor
    held_out: torch.Tensor | None
    seed: int = 0
    aside: torch.Tensor | None = None

    def perplexities(self, model: Any, eval_windows: int, seqlen: int = 2048) -> dict[str, float]:
        """Perplexity of `model` on the first `eval_windows` test windows ("ppl") and on as many windows of the
        tuning articles, which settings are chosen by ("tuning_ppl")."""
        return {key: perplexity(model, ids, seqlen, eval_windows, progress=False, bos=self.bos).ppl
                for key, ids in (("ppl", self.test_ids), ("tuning_ppl", self.tuning_ids))}

    def with_seed(self, seed: int) -> Protocol:
        """The same protocol with its calibration windows drawn with `seed` (itself where they already are)."""
        if seed == self.seed:
            return self
        count, seqlen = self.windows.shape
        return dataclasses.replace(self, windows=calibration_windows(self.ids, count, seqlen, seed, self.bos),
                                   seed=seed)

    def without_bos(self) -> Protocol:
        """The same protocol with its calibration and held-out windows as drawn, each beginning with the token at its
        start instead of BOS (the test and tuning windows keep it): the rows `NO_BOS` names."""
        count, seqlen = self.windows.shape
        held_out = None if self.held_out is None else held_out_windows(self.aside, count, seqlen)
        return dataclasses.replace(self, windows=calibration_windows(self.ids, count, seqlen, self.seed),
                                   held_out=held_out)


def load_protocol(model_name: str = "smollm2-135m", calib_windows: int | None = None, calib_seqlen: int | None = None,
                  source: str | None = None) -> Protocol:
    """The protocol of `model_name` (loaded from `source`, a folder holding it, where given): the validation split's
    last articles set aside for tuning, and of the rest what `surgeon prune` makes of a calibration text: its last
    articles set aside for the held-out windows (`set_aside`), and calibration windows drawn from the others with
    seed 0, by default as many and as long as the model's protocol, each begun with the tokenizer's BOS where it puts
    one."""
    calib_windows = calib_windows or PROTOCOLS[model_name][0]
    calib_seqlen = calib_seqlen or PROTOCOLS[model_name][1]
    model, tokenizer = load_model(source or model_name)
    dense_state = {k: v.clone() for k, v in model.state_dict().items()}
    test_ids = tokenize(tokenizer, evaluation_text(EVALUATION))
    rest, tuning = set_aside(tokenizer, calibration_text(CALIBRATION), TUNING_TOKENS)
    drawn, aside = set_aside(tokenizer, rest, held_out_count(calib_windows) * calib_seqlen)
    if tuning is None or aside is None:
        raise SystemExit(f"{calib_windows} × {calib_seqlen} calibration tokens leave no room in the validation split "
                         "for the held-out and tuning articles: draw fewer")
    ids, bos, aside_ids = tokenize(tokenizer, drawn), leading_token(tokenizer), tokenize(tokenizer, aside)
    windows = calibration_windows(ids, calib_windows, calib_seqlen, 0, bos)
    return Protocol(model, dense_state, tokenizer, test_ids, tokenize(tokenizer, tuning), ids, bos, windows,
                    held_out_windows(aside_ids, calib_windows, calib_seqlen, bos), aside=aside_ids)


def row_checkpoint(folder: Path | None, run: Protocol, config: PruneConfig) -> Checkpoint | None:
    """The checkpoint of a row in `folder` (None: none), holding the saved state of an unfinished run of the same
    configuration, model and windows at a commit with the same pruning code where one is there (`measured`'s rule);
    any other, or one whose tensors are gone, is removed and the row starts again."""
    from bench.provenance import same_code

    if folder is None:
        return None
    fingerprint = {"config": config.resolved(), "model": run.model.config.name_or_path,
                   "windows": hashlib.sha256(run.windows.numpy().tobytes()).hexdigest(), "commit": head_commit()}
    state = None
    if has_state(folder):
        saved = json.loads((folder / STATE).read_text()).get("config", {}).get("commit", "")
        if saved and same_code(saved, fingerprint["commit"]):
            fingerprint["commit"] = saved
        try:
            state = read_state(folder, fingerprint)
        except SurgeonError as error:
            logging.warning("%s: the row starts again", error)
        if state is not None and not (folder / state["tensors"]).is_file():
            logging.warning("%s lacks its checkpoint's tensors: the row starts again", folder)
            state = None
    checkpoint = Checkpoint(folder, fingerprint, state=state)
    if state is None:
        checkpoint.remove()
    return checkpoint


def measure(run: Protocol, config: PruneConfig, eval_windows: int, checkpoints: Path | None = None) -> dict[str, Any]:
    """Prune the dense model with `config` (weighed against sparsegpt-refine on the held-out windows, as `surgeon
    prune` does) and evaluate it: perplexity on the test windows and on as many tuning windows, the loss on the
    held-out windows by which `surgeon prune` weighs models, seconds of the pruning, and the report. With `checkpoints`
    (a row's folder), a checkpoint after every shot, continued from: the seconds are then those of the shots it kept
    and of each run's start (a held-out alternative is pruned again in each)."""
    run.model.load_state_dict(run.dense_state)
    checkpoint = row_checkpoint(checkpoints, run, config)
    report = prune(run.model, run.windows, config, progress=False, held_out_ids=run.held_out, checkpoint=checkpoint)
    scores = run.perplexities(run.model, eval_windows)
    held = {} if run.held_out is None else {"held_out_loss": held_out_loss(run.model, run.held_out, config.batch_size)}
    if checkpoint is not None:
        checkpoint.remove()
    return {**scores, **held, **report.to_dict()}


def weighed(alone: dict[str, Any], refine: dict[str, Any]) -> dict[str, Any]:
    """The CLI's unstructured or N:M default from its two parts measured apart: LLM Surgeon's model alone and one
    sparsegpt-refine shot, the one with the lower held-out loss kept (LLM Surgeon's on a tie), as `prune` keeps it
    bit for bit (tests/test_prune.py); its seconds are both runs'."""
    losses = {"surgeon": alone["held_out_loss"], "sparsegpt-refine": refine["held_out_loss"]}
    kept = alone if losses["surgeon"] <= losses["sparsegpt-refine"] else refine
    config = cli_defaults(alone["config"]["structure"], alone["config"]["target_size"])
    return {**kept, "config": config.resolved(), "seconds": alone["seconds"] + refine["seconds"],
            "choice": {"kept": min(losses, key=losses.__getitem__), "held_out_loss": losses,
                       "seconds": refine["seconds"], "from_rows_apart": True}}


def protocol_parser(description: str, models: tuple[str, ...] = tuple(PROTOCOLS)) -> argparse.ArgumentParser:
    """A parser with the protocol's options (one of `models`, calibration and evaluation windows) and `--only`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=models[0], choices=models)
    parser.add_argument("--calib-windows", type=int, help="default: the model's protocol")
    parser.add_argument("--calib-seqlen", type=int, help="default: the model's protocol")
    parser.add_argument("--eval-windows", type=int, help="default: the model's protocol")
    parser.add_argument("--only", default="", help="rows whose id contains this text")
    return parser


def parse_protocol(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed arguments, the model's protocol filling what was not given."""
    args = parser.parse_args()
    for name, value in zip(("calib_windows", "calib_seqlen", "eval_windows"), PROTOCOLS[args.model]):
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def protocol_of(args: argparse.Namespace, run: Protocol) -> dict[str, Any]:
    """The protocol settings, machine and commit every result file records; `eval_bos`: whether every evaluation
    window begins with the tokenizer's BOS (where it puts one)."""
    import transformers

    machine = (f"{cpu_machine(torch.get_num_threads())}, Python {platform.python_version()}, "
               f"transformers {transformers.__version__}")
    return {"model": args.model, "calib_windows": args.calib_windows, "calib_seqlen": args.calib_seqlen,
            "eval_windows": args.eval_windows, "eval_seqlen": 2048, "eval_bos": run.bos is not None,
            "machine": machine, "commit": head_commit()}


def main() -> None:
    parser = protocol_parser(__doc__)
    parser.add_argument("--shots-structured", type=int, default=4, help="SmolLM2's table")
    parser.add_argument("--shots-element", type=int, default=4, help="SmolLM2's table")
    add_seeds_option(parser)
    parser.add_argument("--row", action="append", default=[],
                        help="run this row (its whole id; repeatable): any row of SmolLM2's table, a default row "
                             "or baseline of the other budgets, or a candidate, on any model")
    parser.add_argument("--checkpoints", type=Path, help="write each row's checkpoint after every shot into "
                        "DIR/<results folder>/<row> and continue an unfinished row from it")
    parser.add_argument("--weigh-apart", action="store_true",
                        help="write each unstructured and N:M default row from its -surgeon-alone and "
                             "-sparsegpt-refine rows (`weighed`) instead of running it")
    args = parse_protocol(parser)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = folder(args.model, args.calib_windows, args.calib_seqlen)
    table = rows(args.shots_structured, args.shots_element) if root == ROOT else defaults_rows()
    known, named = dict(table), runnable_rows(args.shots_structured, args.shots_element)
    unknown = [row for row in args.row if row not in named]  # every table's own rows are named too
    if unknown:
        parser.error(f"no row named {', '.join(unknown)}")
    table += [(row, named[row]) for row in dict.fromkeys(args.row) if row not in known]
    root.mkdir(parents=True, exist_ok=True)
    run = load_protocol(args.model, args.calib_windows, args.calib_seqlen)
    protocol = protocol_of(args, run)
    commit = protocol["commit"]
    dense_path = root / f"dense@{commit}.json"
    if not measured(dense_path, protocol["machine"]):
        result = perplexity(run.model, run.test_ids, 2048, args.eval_windows, progress=False, bos=run.bos)
        tuning = perplexity(run.model, run.tuning_ids, 2048, args.eval_windows, progress=False, bos=run.bos)
        write_json(dense_path, {"ppl": result.ppl, "tuning_ppl": tuning.ppl, "seconds": result.seconds, **protocol})
    for seed in args.seeds:
        seeded = run.with_seed(seed)
        for row, config in table:
            name = seed_row(row, seed)
            path = root / f"{name}@{commit}.json"
            if args.only not in row or (args.row and row not in args.row) or measured(path, protocol["machine"]):
                continue
            row_run = seeded.without_bos() if row.endswith(NO_BOS) else seeded
            result = measure(row_run, dataclasses.replace(config, seed=seed), args.eval_windows,
                             args.checkpoints / root.name / name if args.checkpoints else None)
            logging.info("%s: ppl %.3f sparsity %.4f (%.0f s)", name, result["ppl"], result["sparsity"],
                         result["seconds"])
            write_json(path, {**result, **protocol, "seed": seed})
    if args.weigh_apart:
        for structure in ("unstructured", "2of4"):
            parts = [root / f"{structure}-0.5-{row}@{commit}.json" for row in ("surgeon-alone", "sparsegpt-refine")]
            default = root / f"{structure}-0.5-surgeon@{commit}.json"
            if all(part.exists() for part in parts) and not measured(default, protocol["machine"]):
                write_json(default, weighed(*(json.loads(part.read_text()) for part in parts)))


if __name__ == "__main__":
    main()
