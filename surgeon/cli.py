"""Command line: `surgeon eval …` and `surgeon prune …` (also `python -m surgeon`).

Options are generated from the fields of `RunConfig` and `PruneConfig`. Bad input ends with one
line `surgeon: error: …` and exit status 2 (`--debug` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import typing
from typing import Optional, Sequence

from surgeon.config import PruneConfig, RunConfig
from surgeon.errors import SurgeonError

EVAL_FIELDS = ("model", "tokenizer", "dataset", "seqlen", "eval_windows", "eval_seqlen", "device", "dtype", "output")


def _add_fields(parser: argparse.ArgumentParser, cls, only: Optional[Sequence[str]] = None) -> None:
    """Add one `--option` per dataclass field (type, default, choices and help from the field)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        kind = hints[f.name]
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=base,
            default=f.default,
            choices=f.metadata.get("choices"),
            help=f"{f.metadata['help']} (default: {f.default})",
        )


def _build(cls, args: argparse.Namespace, only: Optional[Sequence[str]] = None):
    """Instantiate a config dataclass from parsed arguments; invalid values become SurgeonError."""
    names = [f.name for f in dataclasses.fields(cls) if only is None or f.name in only]
    try:
        return cls(**{name: getattr(args, name) for name in names})
    except ValueError as error:
        raise SurgeonError(str(error)) from error


def _cmd_eval(args: argparse.Namespace) -> int:
    from surgeon.data import evaluation_text, tokenize
    from surgeon.evaluate import perplexity
    from surgeon.io import write_json
    from surgeon.model import load_model

    run = _build(RunConfig, args, EVAL_FIELDS)
    text = evaluation_text(run.dataset)  # fail on a bad dataset before the slow model load
    model, tokenizer = load_model(run.model, run.tokenizer, run.dtype, run.device)
    ids = tokenize(tokenizer, text)
    result = perplexity(model, ids, run.test_seqlen, run.eval_windows)
    print(f"perplexity {result.ppl:.4f} on {result.windows} windows of {run.test_seqlen} tokens "
          f"({run.dataset}, {result.seconds:.1f} s)")
    if run.output:
        write_json(run.output, result.to_dict())
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from surgeon.run import run_prune

    run = _build(RunConfig, args)
    config = _build(PruneConfig, args)
    report = run_prune(run, config)
    print(f"perplexity {report['ppl_before']:.4f} -> {report['ppl_after']:.4f}, sparsity "
          f"{report['sparsity']:.4f}, {report['seconds']:.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `surgeon` argument parser with its `eval` and `prune` subcommands."""
    parser = argparse.ArgumentParser(prog="surgeon", description="Prune LLMs with LLM Surgeon.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--quiet", action="store_true", help="only warnings and results")
    sub = parser.add_subparsers(dest="command", required=True)
    evaluate = sub.add_parser("eval", help="perplexity of a model on a test text")
    _add_fields(evaluate, RunConfig, EVAL_FIELDS)
    evaluate.set_defaults(func=_cmd_eval)
    prune = sub.add_parser("prune", help="prune a model and save it with a JSON report")
    _add_fields(prune, RunConfig)
    _add_fields(prune, PruneConfig)
    prune.set_defaults(func=_cmd_prune)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `surgeon` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        return args.func(args)
    except SurgeonError as error:
        if args.debug:
            raise
        print(f"surgeon: error: {error}", file=sys.stderr)
        return 2
