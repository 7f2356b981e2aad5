"""Command line: `surgeon eval|prune|recover|plan|export|quantize|report …` (also `python -m surgeon`).

Options are generated from the fields of the settings dataclasses (`surgeon.fields.opt`). Bad input, argparse's
own complaints included, ends with one line `surgeon: error: …` and exit status 2 (`--debug`
shows the traceback instead). Ctrl-C and SIGTERM end with `surgeon: interrupted` and exit status
130 or 143, leaving no half-written output. Heavy libraries are imported only by the commands,
so `--help` and `--version` answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from surgeon import __version__
from surgeon.app.settings import (
    SETTINGS_CLASSES,
    ExportConfig,
    QuantizeConfig,
    RecoverConfig,
    ReportConfig,
    RunConfig,
    field_type,
    read_settings,
)
from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.scale.plan_config import PlanConfig

EVAL_FIELDS = ("model", "tokenizer", "dataset", "seqlen", "eval_windows", "eval_seqlen", "eval_bos", "device", "dtype",
               "output", "tasks", "task_path", "task_limit")
OUTPUT_HELP = {
    "eval": "write the result as JSON to this file",
    "prune": "a new or empty folder for the pruned checkpoint and report.json",
    "export": "a new or empty folder for the exported checkpoint and report.json",
    "report": "a new or empty folder for the figures and summary.md",
    "recover": "a new or empty folder for the recovered checkpoint and report.json",
    "plan": "also write the plan as JSON to this file",
    "quantize": "a new or empty folder for the quantized checkpoint and report.json",
}
# Exit statuses of a process ended by a signal, as shells report them: 128 + the signal number.
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives, so that outputs are cleaned up on the way out."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose every complaint is one line and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"surgeon: error: {message} (see `{self.prog} --help`)\n")


def _add_fields(parser: argparse.ArgumentParser, cls: type, only: Sequence[str] | None = None,
                required: Sequence[str] = (), helps: dict[str, str] | None = None,
                groups: dict[str, Any] | None = None) -> None:
    """Add one `--option` per dataclass field: type, choices and help from the field, its default shown once;
    `groups` maps a field to the argument group that shows it (default: the parser's own list)."""
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        parser_or_group = (groups or {}).get(f.name, parser)
        base, choices = field_type(cls, f)
        text = (helps or {}).get(f.name, f.metadata["help"])
        option = "--" + f.name.replace("_", "-")
        if base is bool and f.default is None:  # resolved by the config: --X or --no-X overrides it
            shown = f.metadata["shown"]
            parser_or_group.add_argument(option, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                                         help=f"{text} (default: {shown})".replace("%", "%%"))
            continue
        if base is bool:
            parser_or_group.add_argument(option, dest=f.name, action="store_true", help=text)
            continue
        if f.name in required:
            text += " (required)"
        else:
            shown = f.metadata.get("shown") or f.default
            text += f" (default: {shown})"
        parser_or_group.add_argument(option, dest=f.name, type=base, default=f.default, choices=choices,
                                     required=f.name in required, help=text.replace("%", "%%"))


def _build(cls: type, args: argparse.Namespace, only: Sequence[str] | None = None) -> Any:
    """Instantiate a config dataclass from parsed arguments; invalid values become SurgeonError."""
    names = [f.name for f in dataclasses.fields(cls) if (only is None or f.name in only) and hasattr(args, f.name)]
    try:
        return cls(**{name: getattr(args, name) for name in names})
    except ValueError as error:
        raise SurgeonError(str(error)) from error


def _cmd_eval(args: argparse.Namespace) -> int:
    run = _build(RunConfig, args, EVAL_FIELDS)
    from surgeon.app.data import evaluation_text, leading_token, tokenize
    from surgeon.app.evaluate import perplexity
    from surgeon.app.tasks import load_tasks, zero_shot
    from surgeon.io import check_writable_file, write_json
    from surgeon.models.adapter import load_model

    if run.output:
        check_writable_file(run.output)  # before the slow model load
    text = evaluation_text(run.dataset)  # fail on a bad dataset or task before the slow model load
    tasks = load_tasks(run.task_list, run.task_path) if run.tasks else None
    model, tokenizer = load_model(run.model, run.tokenizer, run.dtype, run.device)
    ids = tokenize(tokenizer, text)
    result = perplexity(model, ids, run.test_seqlen, run.eval_windows, not args.quiet,
                        leading_token(tokenizer) if run.eval_bos else None)
    print(f"perplexity {result.ppl:.4f} on {result.windows} windows of {run.test_seqlen} tokens "
          f"({run.dataset}, {result.seconds:.1f} s)")
    output: dict[str, Any] = result.to_dict()
    if tasks:
        output["tasks"] = zero_shot(model, tokenizer, run.task_list, tasks, limit=run.task_limit)
        for name, metrics in output["tasks"].items():
            print(f"{name}: " + ", ".join(f"{key} {metrics[key]:.4f}" for key in ("acc", "acc_norm") if key in metrics))
    if run.output:
        write_json(run.output, output)
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    run = _build(RunConfig, args)
    config = _build(PruneConfig, args)
    recovery = _recovery(run)
    import torch.distributed as dist

    from surgeon.app.recover import run_recover
    from surgeon.app.run import run_prune
    from surgeon.scale import distributed

    if not distributed.launched():
        report = run_prune(run, config, progress=not args.quiet)
        recovered = None if recovery is None else run_recover(recovery, progress=not args.quiet)
    else:  # torchrun: every rank prunes its share; rank 0 logs, evaluates and writes
        group = distributed.init(run.device)
        lead = dist.get_rank(group) == 0
        if not lead:
            logging.getLogger().setLevel(logging.WARNING)
        try:
            report = run_prune(run, config, progress=lead and not args.quiet, group=group)
            recovered = None if recovery is None else run_recover(recovery, lead and not args.quiet, group)
        finally:
            dist.destroy_process_group()
    if report is None:  # a rank other than 0
        return 0
    choice = report.get("choice")
    kept = f"; kept {choice['kept']}'s model by held-out loss" if choice else ""
    print(f"perplexity {report['ppl_before']:.4f} -> {report['ppl_after']:.4f}, sparsity "
          f"{report['sparsity']:.4f}, {report['seconds']:.1f} s{kept}; saved to {run.output}")
    for warning in report.get("warnings", []):
        print(f"warning: {warning}")
    if recovered is not None:
        print(f"recovered: perplexity {recovered['ppl_before']:.4f} -> {recovered['ppl_after']:.4f}, "
              f"{recovered['tokens']} tokens in {recovered['training_seconds']:.1f} s; saved to "
              f"{Path(str(run.output)) / 'recovered'}")
    return 0


def _recovery(run: RunConfig) -> RecoverConfig | None:
    """What `surgeon prune --recover-tokens N` recovers afterwards: `surgeon recover OUTPUT --output
    OUTPUT/recovered --tokens N` on the prune's device and dtype, checked before the prune begins."""
    if not run.recover_tokens:
        return None
    if run.dtype == "float16":
        raise SurgeonError("--recover-tokens trains in float32 or bfloat16: prune with --dtype float32 or bfloat16")
    try:
        return RecoverConfig(run=str(run.output), output=str(Path(str(run.output)) / "recovered"),
                             tokens=run.recover_tokens, overwrite=run.overwrite, device=run.device, dtype=run.dtype)
    except ValueError as error:
        raise SurgeonError(f"--recover-tokens: {error}") from error


def _cmd_export(args: argparse.Namespace) -> int:
    config = _build(ExportConfig, args)
    from surgeon.app.run import run_export

    report = run_export(config)
    export = report["export"]
    print(f"{export['parameters'] / 1e6:.1f} M of {export['parameters_before'] / 1e6:.1f} M parameters "
          f"({export['fraction']:.3f}), {export['format']} format; saved to {config.output}")
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    config = _build(RecoverConfig, args)
    import torch.distributed as dist

    from surgeon.app.recover import run_recover
    from surgeon.scale import distributed

    if not distributed.launched():
        report = run_recover(config, progress=not args.quiet)
    else:  # torchrun: both models sharded with FSDP2, each rank trains on its share; rank 0 logs and writes
        group = distributed.init(config.device)
        lead = dist.get_rank(group) == 0
        if not lead:
            logging.getLogger().setLevel(logging.WARNING)
        try:
            report = run_recover(config, progress=lead and not args.quiet, group=group)
        finally:
            dist.destroy_process_group()
    if report is None:  # a rank other than 0
        return 0
    print(f"perplexity {report['ppl_before']:.4f} -> {report['ppl_after']:.4f} (dense {report['ppl_dense']:.4f}), "
          f"{report['tokens']} tokens in {report['training_seconds']:.1f} s; saved to {config.output}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    config = _build(ReportConfig, args)
    from surgeon.app.figures import write_report

    written = write_report(config)
    equivalence = written["mask_equivalence"]
    extra = "" if equivalence is None else f"; mask equivalence {equivalence['overall']:.4f}"
    print(f"{len(written['figures'])} figures and summary.md saved to {config.output}{extra}")
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    config = _build(QuantizeConfig, args)
    from surgeon.app.quantize import run_quantize

    done = run_quantize(config)["quantize"]
    print(f"{done['scheme']} ({done['format']}): {done['layers']} layers, their {done['zeros_kept']} pruned weights "
          f"still exactly zero; weights {done['bytes_before'] / 1e6:.1f} MB -> {done['bytes_after'] / 1e6:.1f} MB; "
          f"saved to {config.output}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    plan = _build(PlanConfig, args)
    config = _build(PruneConfig, args)
    from surgeon.io import check_writable_file, write_json
    from surgeon.scale.plan import GIB, make_plan

    if plan.output:
        check_writable_file(plan.output)
    result = make_plan(plan, config)
    print(f"{plan.model}: {result['parameters'] / 1e9:.2f} B parameters, {config.structure} ({config.method}), "
          f"{plan.nsamples} × {plan.seqlen} tokens, batch {config.batch_size}, {plan.dtype}")
    for name, parts in result["phases"].items():
        detail = ", ".join(f"{part} {value / GIB:.2f}" for part, value in parts.items() if part != "total")
        print(f"  {name:<10} {parts['total'] / GIB:7.2f} GiB  ({detail})")
    for strategy in result["strategies"]:
        host = f", host {strategy['host_bytes'] / GIB:.1f} GiB" if strategy["host_bytes"] else ""
        time = strategy["seconds_per_shot"]
        time = f", {time['curvature']:.0f} + {time['prune']:.0f} s per shot" if time else ""
        print(f"  {strategy['name']}: GPU {strategy['peak_gpu_bytes'] / GIB:.1f} GiB per GPU{host}{time}, "
              f"{'fits' if strategy['fits'] else 'does not fit'} ({strategy['launch']})")
    for note in result["notes"]:
        print(f"  {note}")
    seconds = result["seconds_per_shot_h100"]
    print("  per shot on one H100: " + (", ".join(f"{phase} {value:.0f} s" for phase, value in seconds.items())
                                        + " (scaled from the measured Llama-2-7B rate)" if seconds else
                                        "no measured rate for this kind of run"))
    verdict = (f"fits {plan.gpu_memory} with {result['strategy']}" if result["fits"] else
               f"does not fit {plan.gpu_memory}: short by {result['shortfall_bytes'] / GIB:.1f} GiB")
    print(f"{verdict} (counts plus {result['headroom']:.0%} headroom)")
    if plan.output:
        write_json(plan.output, result)
    return 0


def _add_run_command(sub: Any, name: str, cls: type, func: Any, help: str, description: str) -> None:
    """A subcommand on a `surgeon prune` output folder: RUN_DIR, then one option per other field of `cls`."""
    command = sub.add_parser(name, help=help, description=description)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    command.add_argument("run", metavar="RUN_DIR", help=fields.pop("run").metadata["help"])
    _add_fields(command, cls, list(fields), required=("output",),
                helps={"output": OUTPUT_HELP[name]})
    command.set_defaults(func=func)


# `surgeon prune --help` shows its options in these groups, in this order. Every other field of RunConfig
# and PruneConfig is set in a settings file (`--config`), which any option given on the command line overrides.
PRUNE_GROUPS = {
    "what to prune": ("model", "tokenizer", "structure", "target_size", "shots", "method", "leave_out", "layout",
                      "width_multiple", "speed_context"),
    "calibration": ("calibration", "nsamples", "seqlen"),
    "evaluation": ("dataset", "eval_windows", "eval_seqlen", "eval_every_shot", "tasks"),
    "output": ("output", "overwrite", "resume"),
    "recovery": ("recover_tokens",),
    "memory and scale": ("device", "dtype", "batch_size", "curvature_split", "fsdp", "activation_checkpointing",
                         "offload", "block_groups"),
    "the method": ("max_correlate", "damp_a", "damp_g", "propagate", "lora_steps"),
}
PRUNE_GROUP_HELP = {
    "the method": "the defaults are measured (docs/DESIGN.md); the paper's own settings are --max-correlate 64 "
    "--damp-g 0.01 (its unstructured updates), --no-propagate --shots 4 (N:M), --lora-steps N (sec. 3.6), and "
    "correlation: within in a --config file (its structured ablation)",
}
FILE_ONLY = tuple(f.name for cls in SETTINGS_CLASSES for f in dataclasses.fields(cls)
                  if not any(f.name in names for names in PRUNE_GROUPS.values()))


def build_parser(settings: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """The `surgeon` argument parser with its `eval`, `prune`, `plan`, `export` and `report` subcommands;
    `settings` (from a `--config` file) are the defaults of `surgeon prune`."""
    parser = _Parser(prog="surgeon", description="Prune large language models with LLM Surgeon "
                     "(structured, N:M semi-structured, unstructured) and measure their perplexity.")
    parser.add_argument("--version", action="version", version=f"surgeon {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    parser.add_argument("--quiet", action="store_true", help="no progress bars; only warnings and results")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{eval,prune,recover,plan,export,quantize,report}")
    evaluate = sub.add_parser("eval", help="perplexity of a model on a test text (and zero-shot tasks with --tasks)",
                              description="Perplexity of a model on consecutive windows of a test text; with "
                              "--tasks, its zero-shot accuracy on lm-eval tasks too.")
    _add_fields(evaluate, RunConfig, EVAL_FIELDS, helps={"output": OUTPUT_HELP["eval"]})
    evaluate.set_defaults(func=_cmd_eval)
    prune = sub.add_parser("prune", help="prune a model and save it with a JSON report",
                           description="Prune a model, evaluate it before and after, and save a Hugging Face "
                           "checkpoint with report.json into a new folder.")
    titled = {title: prune.add_argument_group(title, PRUNE_GROUP_HELP.get(title)) for title in PRUNE_GROUPS}
    groups = {name: titled[title] for title, names in PRUNE_GROUPS.items() for name in names}
    shown = list(groups)
    _add_fields(prune, RunConfig, shown, required=("output",), helps={"output": OUTPUT_HELP["prune"]}, groups=groups)
    titled["the method"].add_argument(
        "--config", metavar="FILE", help="a JSON or YAML file of settings, by field name: any option above, and "
        f"{', '.join(FILE_ONLY)} (docs/USAGE.md); options given here override it")
    _add_fields(prune, PruneConfig, shown, groups=groups)
    prune.set_defaults(func=_cmd_prune, config=None, **(settings or {}))
    plan = sub.add_parser("plan", help="count the memory and time of a pruning run from the model's config",
                          description="Count, from the model's configuration alone (no weights), the GPU memory of "
                          "every phase of a pruning shot, whether it fits, and the time per shot projected from "
                          "measured rates.")
    _add_fields(plan, PlanConfig, helps={"output": OUTPUT_HELP["plan"]})
    _add_fields(plan, PruneConfig, ("structure", "target_size", "shots", "method", "batch_size", "leave_out"))
    plan.set_defaults(func=_cmd_plan)
    _add_run_command(sub, "export", ExportConfig, _cmd_export, "write a pruned model without its removed neurons "
                     "and heads", "Write the model of a `surgeon prune` output folder with the MLP neurons and "
                     "attention heads whose output is exactly zero cut out, as a checkpoint that "
                     "AutoModelForCausalLM.from_pretrained loads.")
    _add_run_command(sub, "recover", RecoverConfig, _cmd_recover, "distill a pruned model from its dense model, "
                     "what pruning removed kept removed", "Train the model of a `surgeon prune` output folder to "
                     "match the dense model it was pruned from (KL divergence of the next-token distributions, no "
                     "labels), every weight pruning removed kept exactly zero, on text that shares no passage with "
                     "the evaluation text; evaluate it before and after and write it with report.json, which "
                     "`surgeon export` reads.")
    _add_run_command(sub, "report", ReportConfig, _cmd_report, "draw figures and a Markdown summary of a pruning "
                     "run", "Draw the kept fraction per layer, perplexity per shot and time per phase of a "
                     "`surgeon prune` output folder (PNG, matplotlib) with a Markdown summary; --compare adds the "
                     "mask equivalence with another run.")
    _add_run_command(sub, "quantize", QuantizeConfig, _cmd_quantize, "quantize a pruned model with llm-compressor "
                     "for vLLM", "Quantize the linear layers (not the LM head) of a `surgeon prune`, `recover` or "
                     "`export` folder with llm-compressor and write them in the compressed-tensors format that "
                     "`vllm serve` loads, with report.json; every weight pruning made zero is checked to stay exactly "
                     "zero, or nothing is written. Needs the llmcompressor extra.")
    return parser


def _on_signal(signum: int, frame: FrameType | None) -> None:
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)  # one clean-up, even if a signal comes again
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated


def _quiet_libraries(quiet: bool) -> None:
    """The hub libraries log only errors (their retry warnings would otherwise print once per handler).

    With `--quiet` their progress bars (loading, GGUF conversion, saving) are off too. Set before
    they are imported, which read these variables once; a user's own setting wins.
    """
    for variable in ("TRANSFORMERS_VERBOSITY", "DATASETS_VERBOSITY", "HF_HUB_VERBOSITY"):
        os.environ.setdefault(variable, "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if quiet:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TQDM_DISABLE", "1")  # bars drawn with tqdm directly (GGUF dequantization)


def _stop_behind(error: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM an exception is, or was raised from or during (its causes and contexts), or None."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (KeyboardInterrupt, Terminated)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _last_line(message: str) -> None:
    """Print the run's last line to stderr on a line of its own: progress bars still open (a stop or an error inside
    one, such as transformers' weight loading) are closed first, each ending its own line."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
    print(message, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `surgeon` console script; returns the exit status."""
    previous = {number: signal.signal(number, _on_signal) for number in (signal.SIGINT, signal.SIGTERM)}
    args = None
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "config", None):
            args = build_parser(read_settings(args.config)).parse_args(argv)
        logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
        _quiet_libraries(args.quiet)
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm():  # log lines print above the progress bars, not through them
            status: int = args.func(args)
            return status
    except SurgeonError as error:
        if args is not None and args.debug:
            raise
        _last_line(f"surgeon: error: {error}")
        return 2
    except BaseException as error:  # a stop, or one a library wrapped, as an extension module's import does
        stop = _stop_behind(error)
        if stop is None:
            raise
        _last_line("surgeon: interrupted")
        return EXIT_SIGINT if isinstance(stop, KeyboardInterrupt) else EXIT_SIGTERM
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
