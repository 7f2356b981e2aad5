"""The settings of the commands that load a model and write a folder: `RunConfig` (eval and prune), `ExportConfig`,
`QuantizeConfig` and `ReportConfig`; the CLI builds their options from the fields. `read_settings` reads a
`--config` file of RunConfig and PruneConfig fields."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from surgeon.app.tasks import task_names
from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.export import EXPORT_FORMATS
from surgeon.fields import check, opt
from surgeon.recovery import LOSSES, MIXED_PRECISION, Distill


@dataclass(frozen=True)
class RunConfig:
    """Settings of a CLI run: which model, which data, where the results go."""

    model: str = opt("smollm2-135m", "hub id, local directory, .gguf file, or a built-in model: smollm2-135m, "
                      "gemma3-270m")
    tokenizer: str | None = opt(None, "tokenizer to use instead of the model's own", shown="the model's")
    dataset: str = opt("wikitext2", "evaluation text: wikitext2, c4, ptb, or a text file")
    calibration: str = opt(
        "wikitext2",
        "calibration text: wikitext2 (hub train split, else packaged validation), wikitext2-valid, c4, ptb, "
        "or a text file",
    )
    nsamples: int = opt(128, "calibration windows", least=1)
    seqlen: int = opt(2048, "tokens per calibration and evaluation window", least=2)
    eval_windows: int | None = opt(None, "evaluate only the first N test windows", shown="all", least=1)
    eval_seqlen: int | None = opt(None, "tokens per evaluation window", shown="--seqlen", least=2)
    eval_bos: bool = opt(False, "begin every evaluation window with the tokenizer's BOS where it puts one, as the "
                         "model's inputs begin (Gemma), not only the first (the published tables' protocol)")
    device: str = opt("cpu", "cpu or cuda")
    dtype: str = opt("float32", "model dtype", ("float32", "bfloat16", "float16"))
    output: str | None = opt(
        None, "where results go: a JSON file for eval, a new or empty folder for prune", shown="print only",
    )
    overwrite: bool = opt(
        False, "prune into an existing non-empty --output folder, replacing only the files the run writes"
    )
    eval_every_shot: bool = opt(False, "also evaluate perplexity after every shot (per shot in report.json)")
    resume: bool = opt(False, "continue the unfinished run in --output after its last checkpoint (same options)")
    checkpoint_shots: int = opt(
        1, "write a checkpoint into --output after every N shots and the last, for --resume (0: never)", least=0,
    )
    recover_tokens: int = opt(0, "then distill the pruned model from the dense one on N tokens into "
                              "OUTPUT/recovered, as surgeon recover does with its defaults (0: no recovery)", least=0)
    tasks: str | None = opt(
        None, "zero-shot lm-eval tasks, comma-separated, or default (boolq, piqa, hellaswag, winogrande, arc_easy, "
        "arc_challenge, openbookqa); accuracies go into the result (needs the tasks extra)", shown="none",
    )
    task_path: str | None = opt(None, "a folder of lm-eval task YAML files added to lm-eval's own",
                                 shown="lm-eval's tasks only")
    task_limit: int | None = opt(None, "score only the first N documents of each task", shown="all", least=1)
    fsdp: bool = opt(False, "under torchrun, shard the weights over the ranks with FSDP2 (for a model larger than "
                      "one device; every rank evaluates)")

    @property
    def test_seqlen(self) -> int:
        """Tokens per evaluation window."""
        return self.eval_seqlen or self.seqlen

    def __post_init__(self) -> None:
        check(self)
        if self.tasks is not None:
            task_names(self.tasks)
        if (self.task_path is not None or self.task_limit is not None) and self.tasks is None:
            raise ValueError("task_path and task_limit need tasks")
        if self.fsdp and self.tasks is not None:
            raise ValueError("fsdp: zero-shot tasks are scored without it (a model that fits one device)")

    @property
    def task_list(self) -> tuple[str, ...]:
        """The zero-shot tasks to score, none without `tasks`."""
        return () if self.tasks is None else task_names(self.tasks)


@dataclass(frozen=True)
class ExportConfig:
    """Settings of `surgeon export`: which pruning run, how to export it, where to."""

    run: str = opt("", "a folder written by `surgeon prune`")
    compact: bool = opt(False, "cut out the MLP neurons and attention heads whose output is exactly zero")
    format: str = opt(
        "standard", "standard: the original architecture and model_type, one width for every block (blocks that "
        "need fewer units keep zero ones, which add exactly 0); decilm (Llama): every layer its own MLP width and "
        "KV heads, a part left without units a no-op, in DeciLM's block_configs, which vLLM serves "
        "(`vllm serve OUT --trust-remote-code`; transformers loads it with trust_remote_code=True or "
        "surgeon.load_compact)", EXPORT_FORMATS,
    )
    ffn_mult: bool = opt(False, "decilm: round every MLP width up to a multiple of 256 and write it as ffn_mult, "
                                 "and keep an MLP of zero neurons beside a live attention, for llama.cpp's "
                                 "converter and graph")
    output: str | None = opt(None, "a new or empty folder for the exported checkpoint and report.json")
    overwrite: bool = opt(False, "export into an existing non-empty --output folder, replacing only its files")

    def __post_init__(self) -> None:
        check(self)
        if not self.compact:
            raise ValueError("nothing to export: pass --compact to write the model without its removed units")
        if self.ffn_mult and self.format != "decilm":
            raise ValueError("--ffn-mult is a setting of --format decilm")


QUANTIZE_SCHEMES = ("W8A8", "FP8_DYNAMIC", "W4A16")


@dataclass(frozen=True)
class QuantizeConfig:
    """Settings of `surgeon quantize`: which checkpoint, which llm-compressor scheme, where to."""

    run: str = opt("", "a folder written by `surgeon prune`, `surgeon recover` or `surgeon export`")
    scheme: str = opt(
        "W8A8", "llm-compressor's scheme, none needing calibration data: W8A8 (int8 weights per output channel, int8 "
        "activations per token at run time), FP8_DYNAMIC (the same in fp8) or W4A16 (int4 weights in groups of 128; "
        "vLLM's CPU build serves it in bfloat16, not float32)", QUANTIZE_SCHEMES,
    )
    output: str | None = opt(None, "a new or empty folder for the quantized checkpoint and report.json")
    overwrite: bool = opt(False, "write into an existing non-empty --output folder, replacing only its files")

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class ReportConfig:
    """Settings of `surgeon report`: which pruning run, what to compare it with, where the figures go."""

    run: str = opt("", "a folder written by `surgeon prune`")
    compare: str | None = opt(None, "another `surgeon prune` folder of the same model: adds the mask equivalence",
                               shown="no comparison")
    output: str | None = opt(None, "a new or empty folder for the figures (PNG) and summary.md")
    overwrite: bool = opt(False, "write into an existing non-empty --output folder, replacing only its files")


# `surgeon recover`'s peak learning rate where none is given: for the weights, and for LoRA adapters, which start
# from zero and move only through their low rank (chosen on the tuning articles: bench/RESULTS.md, "Recovery")
WEIGHTS_LR, LORA_LR = 1e-4, 1e-3


@dataclass(frozen=True)
class RecoverConfig:
    """Settings of `surgeon recover`: which pruning run, how much text to distill it on, how to evaluate it."""

    run: str = opt("", "a folder written by `surgeon prune`")
    output: str | None = opt(None, "a new or empty folder for the recovered checkpoint and report.json")
    overwrite: bool = opt(False, "write into an existing non-empty --output folder, replacing only its files")
    tokens: int = opt(262_144, "tokens to train on: windows of --seqlen drawn from --text, one pass")
    text: str | None = opt(None, "training text: wikitext2 (hub train split, else packaged validation), "
                           "wikitext2-valid, c4, ptb, or a text file; never the evaluation text",
                           shown="the pruning run's calibration text")
    seqlen: int = opt(512, "tokens per training window", least=2)
    batch_size: int = opt(1, "training windows per step", least=1)
    lr: float | None = opt(None, "AdamW's peak learning rate (linear warm-up over a tenth of the steps, then a cosine "
                           "to 0)", shown=f"{WEIGHTS_LR:g} for the weights, {LORA_LR:g} with --lora-rank")
    seed: int = opt(0, "random seed (training windows, their order, the adapters)")
    loss: str = opt("kl", "kl: match the dense model's next-token distributions; next-token: the text's tokens",
                    LOSSES)
    hidden_weight: float = opt(0.0, "with --loss kl, add this times the decoder blocks' output error relative to "
                               "the dense model's (0: the KL alone)")
    lora_rank: int = opt(0, "train peft LoRA adapters of this rank, merged and re-masked at the end, instead of the "
                         "weights (0: the weights)")
    teacher_top_k: int = opt(0, "with --loss kl, run the dense model first and keep its K most likely next tokens per "
                             "position (about 8·K bytes a token in host memory), so that it is not held while the "
                             "student trains; the KL is then over those K and the rest as one (0: the dense model "
                             "runs beside the student)")
    resume: bool = opt(False, "continue the unfinished recovery in --output after its last checkpoint (same options)")
    checkpoint_steps: int = opt(100, "write a checkpoint into --output after every N steps, for --resume (0: never)",
                                least=0)
    eval_windows: int | None = opt(None, "evaluate only the first N test windows", shown="the pruning run's", least=1)
    eval_seqlen: int | None = opt(None, "tokens per evaluation window", shown="the pruning run's", least=2)
    eval_bos: bool | None = opt(None, "begin every evaluation window with the tokenizer's BOS where it puts one",
                                shown="the pruning run's")
    device: str = opt("cpu", "cpu or cuda")
    dtype: str = opt("float32", "dtype of the student and the teacher", ("float32", "bfloat16"))
    mixed_precision: str = opt("no", "bf16: the forward passes in bfloat16 under torch.autocast, the weights and AdamW "
                               "in float32, the dense model held in bfloat16 (faster where bfloat16 products are: "
                               "GPUs, CPUs with AMX)", MIXED_PRECISION)

    def __post_init__(self) -> None:
        check(self)
        if self.mixed_precision != "no" and self.dtype != "float32":
            raise ValueError(f"mixed_precision={self.mixed_precision}: keeps float32 weights beside bfloat16 passes; "
                             f"with dtype={self.dtype} give mixed_precision=no")
        if self.tokens < self.seqlen * self.batch_size:
            raise ValueError(f"tokens={self.tokens}: fewer than one step of {self.batch_size} windows of "
                             f"{self.seqlen}")
        try:
            self.distill()  # the training settings check themselves
        except SurgeonError as error:
            raise ValueError(str(error)) from error

    def distill(self) -> Distill:
        """The recovery's training settings."""
        lr = self.lr if self.lr is not None else LORA_LR if self.lora_rank else WEIGHTS_LR
        return Distill(lr, batch_size=self.batch_size, seed=self.seed, loss=self.loss,
                       hidden_weight=self.hidden_weight, lora_rank=self.lora_rank, teacher_top_k=self.teacher_top_k,
                       mixed_precision=self.mixed_precision)


def field_type(cls: type, f: dataclasses.Field[Any]) -> tuple[type, tuple[Any, ...] | None]:
    """The type a field's option or settings-file value takes (X for `X | None`, str for a Literal), and its choices."""
    base = typing.get_type_hints(cls)[f.name]
    if typing.get_origin(base) in (typing.Union, types.UnionType):  # X | None: the option takes an X
        base = next(t for t in typing.get_args(base) if t is not type(None))
    if typing.get_origin(base) is typing.Literal:
        return str, typing.get_args(base)
    return base, f.metadata.get("choices")


SETTINGS_CLASSES = (RunConfig, PruneConfig)


def read_settings(path: str) -> dict[str, Any]:
    """The settings of a `--config` file (JSON, or YAML by its suffix): field names of RunConfig and PruneConfig
    with values of the field's type; a bad file, name or value is a SurgeonError naming it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith((".yaml", ".yml")):
            import yaml

            values = yaml.safe_load(text)
        else:
            values = json.loads(text)
    except (OSError, ValueError) as error:
        raise SurgeonError(f"--config {path}: {error}") from error
    if not isinstance(values, dict):
        raise SurgeonError(f"--config {path}: expected a mapping of setting names to values")
    fields = {f.name: (cls, f) for cls in SETTINGS_CLASSES for f in dataclasses.fields(cls)}
    settings = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in fields or name == "output":
            raise SurgeonError(f"--config {path}: {key!r} is not a setting of surgeon prune"
                               + (" (give --output on the command line)" if name == "output" else ""))
        cls, f = fields[name]
        base, choices = field_type(cls, f)
        if value is None and type(None) not in typing.get_args(typing.get_type_hints(cls)[name]):
            raise SurgeonError(f"--config {path}: {key} = null is not a valid {base.__name__}")
        fits = value is None or (isinstance(value, base) and not (base is int and isinstance(value, bool))
                                 or base is float and isinstance(value, int) and not isinstance(value, bool))
        if not fits or (choices and value is not None and value not in choices):
            raise SurgeonError(f"--config {path}: {key} = {value!r} is not a valid {base.__name__}"
                               + (f" (one of {', '.join(map(str, choices))})" if choices else ""))
        settings[name] = value
    return settings
