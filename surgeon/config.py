"""Configuration dataclasses: `PruneConfig` (the algorithm) and `RunConfig` (a CLI run).

The CLI builds its options from these fields (help text in each field's metadata), so a
setting exists in exactly one place. Both validate themselves in `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Literal

METHODS = ("surgeon", "magnitude", "lobd", "kobd", "sparsegpt", "sparsegpt-exact", "sparsegpt-refine", "wanda",
           "reap")
METHOD_HELP = (
    "surgeon: LLM Surgeon, Kronecker-factored curvature G ⊗ A with correlated weight updates; "
    "magnitude: |w|, no update; "
    "lobd: L-OBD, optimal brain damage with the layer's input curvature diag(A) only, no update; "
    "kobd: K-OBD, optimal brain damage with the Kronecker diagonal diag(G) ⊗ diag(A), no update; "
    "sparsegpt: SparseGPT's per-layer OBS with lazy batches; "
    "sparsegpt-exact: SparseGPT's mask, then every row's kept weights solved exactly (G = I, surgeon.solve); "
    "sparsegpt-refine: SparseGPT's mask and weights, then 8 conjugate-gradient steps toward that exact solve "
    "(the SparseGPT drop-in's update); "
    "wanda: |w|·‖x‖ per output row; "
    "reap (structure experts): REAP, the router-weighted norm of an expert's output over its tokens"
)
DEFAULT_TARGET_SIZE = 0.8
# shots by structure (N:M: 1): the least time within about 2% of the best perplexity measured on the
# time-to-quality curve (docs/DESIGN.md, "Defaults")
DEFAULT_SHOTS = {"structured": 4, "coupled": 4, "unstructured": 2, "experts": 1}
# The damping defaults, for every method and API (`solve`, the SparseGPT drop-in's `percdamp`, SparseGPT's own
# 0.01 of mean(diag H)): λ_G and λ_A of `M + λ·mean(diag M)·I` (docs/DESIGN.md, "Damping").
DEFAULT_DAMP_G, PROPAGATED_DAMP_G = 0.1, 1.0  # λ_G; N:M propagated measured best at 1 (bench/RESULTS.md)
DEFAULT_DAMP_A, COUPLED_DAMP_A = 0.01, 0.3  # λ_A; coupled LLM Surgeon measured best at 0.3 (bench/RESULTS.md)
# methods with one whole-model curvature pass per shot (and whose last N:M shot can run block by block)
NEEDS_A = ("surgeon", "kobd", "lobd")
NEEDS_G = ("surgeon", "kobd")  # those whose pass runs backward, for the output-side factor G
# methods that estimate each block's inputs themselves, block by block
PER_LAYER = ("sparsegpt", "sparsegpt-exact", "sparsegpt-refine", "wanda")
# where the curvature pass and the prune phase keep their tensors: they change time and memory, never a result
MEMORY_OPTIONS = ("activation_checkpointing", "offload", "block_groups")
EXPORT_FORMATS = ("standard", "decilm")
LAYOUTS = ("per-block", "uniform", "decilm")  # coupled: how units may leave, by the export format that holds them
# LLM Surgeon's unstructured and N:M runs are weighed against this method in one shot (`PruneConfig.held_out_choice`)
ALTERNATIVE = "sparsegpt-refine"
Correlation = Literal["joint", "within"]
_NM = re.compile(r"^(\d+):(\d+)$")


DEFAULT_TASKS = (  # the zero-shot tasks of the paper's appendix
    "boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")


def task_names(spec: str) -> tuple[str, ...]:
    """`"piqa,arc_easy"` -> ("piqa", "arc_easy"); `"default"` -> `DEFAULT_TASKS`."""
    names = tuple(name.strip() for name in spec.split(",") if name.strip())
    if not names:
        raise ValueError(f"tasks={spec!r}: name at least one lm-eval task, or default")
    return DEFAULT_TASKS if names == ("default",) else names


def parse_nm(structure: str) -> tuple[int, int] | None:
    """`"2:4"` -> (2, 4): keep at most N of every M consecutive weights of a row; else None."""
    match = _NM.match(structure)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_bytes(text: str) -> int:
    """'80GB', '80GiB', '79.6 GiB' or a number of bytes -> bytes (GB and GiB both read as 2³⁰, GPU memory's unit)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"gpu_memory={text!r}: give a size such as 80GB")
    unit = (match.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit])


def _opt(default, help: str, choices=None, shown: str | None = None):
    """A config field with its CLI help; `shown` describes the default that `None` stands for."""
    return field(default=default, metadata={"help": help, "choices": choices, "shown": shown})


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one pruning run (docs/DESIGN.md: schedule, damping, correlation)."""

    structure: str = _opt(
        "structured", "structured (rows+columns), coupled (MLP neurons, attention heads and KV groups, each across "
        "the layers it spans), unstructured, N:M such as 2:4 (N kept of every M), or experts (whole routed experts "
        "of a Mixture-of-Experts model, the same number kept in every block)"
    )
    target_size: float | None = _opt(
        None, "fraction of prunable weights kept (non-zero) at the end, in (0, 1]; 0.8 keeps 80%, removes 20% "
        "(experts: of each block's routed experts)",
        shown=f"{DEFAULT_TARGET_SIZE}; N:M structures keep N/M",
    )
    shots: int | None = _opt(None, "number of pruning shots (linear schedule)",
                             shown="4 structured and coupled, 2 unstructured, 1 N:M and experts")
    layout: str = _opt(
        "per-block", "coupled: per-block (each block its own widths; query heads leave in rounds, one of every KV "
        "head at a time), uniform (the same number of neurons and heads in every block, which the standard export "
        "holds exactly), or decilm (each block its own MLP width, its attention kept whole or removed, which the "
        "decilm export, and vLLM, hold exactly)", LAYOUTS,
    )
    width_multiple: int = _opt(
        1, "coupled: every block keeps a multiple of this many neurons, and heads whose width is one (64, 128, 256)"
    )
    speed_context: int | None = _opt(
        None, "coupled: rank units by cost per multiply-accumulate their removal saves a token decoded after this "
        "many tokens of context (a head or KV group also saves its attention over the context)",
        shown="none: by cost alone",
    )
    leave_out: str = _opt(
        "router", "comma-separated parts of the decoder blocks not to prune: router (the Mixture-of-Experts routers) "
        "or glob patterns over parameter names such as 'model.layers.*.mlp.experts.*'; a weight matrix the run "
        "cannot prune and does not leave out makes it refuse; the target and sparsity count what is pruned"
    )
    method: str = _opt("surgeon", f"pruning method ({METHOD_HELP})", METHODS)
    correlation: Correlation = _opt("joint", "structured surgeon update: joint rows+columns, or within rows / columns")
    max_correlate: int | None = _opt(
        0, "unstructured/N:M surgeon: at most this many weights solved jointly, the chunks' updates summed (the "
        "paper's m, sec. 3.4) (0 = all, exact, by CG)"
    )
    cg_tol: float = _opt(1e-3, "max-correlate 0: relative residual at which conjugate gradients stop")
    cg_max_iter: int = _opt(40, "max-correlate 0: at most this many conjugate-gradient iterations per layer")
    cg_dtype: str | None = _opt(None, "max-correlate 0: run the conjugate-gradient products G⁻¹ V A⁻¹ in this dtype",
                                ("bfloat16", "float16"), shown="the model's dtype")
    damp_a: float | None = _opt(None, "relative damping of A: A + λ·mean(diag A)·I",
                                shown=f"{DEFAULT_DAMP_A}; {COUPLED_DAMP_A} for structure coupled with surgeon")
    damp_g: float | None = _opt(None, "relative damping of G: G + λ·mean(diag G)·I",
                                shown=f"{DEFAULT_DAMP_G}; {PROPAGATED_DAMP_G} with propagate")
    batch_size: int = _opt(1, "calibration windows per forward/backward pass")
    propagate: bool | None = _opt(
        None, "N:M: prune the last shot block by block, each block's A from the inputs of the blocks already pruned "
        "(as SparseGPT; G from the shot's pass)", shown="on for N:M with surgeon, kobd or lobd"
    )
    held_out_choice: bool | None = _opt(
        None, "unstructured and N:M surgeon: also prune the dense model in one shot with sparsegpt-refine "
        "(SparseGPT's mask and weights, then 8 conjugate-gradient steps toward the exact row update) and keep "
        "whichever model has the lower loss on held-out calibration windows (LLM Surgeon's alone where none are "
        "given, or over several processes)", shown="on for unstructured and N:M with surgeon",
    )
    curvature_split: str = _opt(
        "batches", "under torchrun: each rank runs a share of the calibration batches and the factors are summed onto "
        "each block's owner (batches: fastest), or each runs every batch and accumulates only its own blocks' factors "
        "(blocks: 1/N of the factor memory, the one-process result)", ("batches", "blocks"),
    )
    activation_checkpointing: bool = _opt(
        False, "surgeon/kobd curvature pass: each decoder block keeps only its inputs and runs again in the backward "
        "pass (the same factors; one block's activations instead of all, for one more forward)"
    )
    offload: bool = _opt(
        False, "structured/coupled: hold the factors, and between costs and updates the packed inverses, in host "
        "memory; the device holds those of a layer and the one before it"
    )
    block_groups: int = _opt(
        1, "with offload: split the decoder blocks into N groups and run the curvature pass once per group, each "
        "accumulating only its group's factors before they move to host memory (N passes, 1/N of the factors)"
    )
    lora_steps: int = _opt(0, "interleaved LoRA steps between shots (0 = off; paper 3.6)")
    lora_rank: int = _opt(8, "rank of the interleaved LoRA adapters")
    lora_lr: float = _opt(1e-4, "learning rate of the interleaved LoRA adapters")
    seed: int = _opt(0, "random seed (calibration sampling, LoRA)")
    backend: str = _opt(
        "auto", "kernels: auto (Triton on CUDA, the compiled op on the CPU when built, else PyTorch), or one of them",
        ("auto", "triton", "cpp", "torch"),
    )

    def __post_init__(self) -> None:
        nm = parse_nm(self.structure)
        if self.structure not in DEFAULT_SHOTS and nm is None:
            raise ValueError(f"structure={self.structure!r}: use structured, coupled, unstructured, experts, or N:M "
                             "such as 2:4")
        if nm is not None and not 0 < nm[0] < nm[1]:
            raise ValueError(f"structure={self.structure!r}: N:M needs 0 < N < M")
        if nm is not None and self.target_size is not None and abs(self.target_size - nm[0] / nm[1]) > 1e-9:
            raise ValueError(f"target_size={self.target_size}: structure {self.structure} keeps {nm[0] / nm[1]:g} of "
                             "the weights; leave target_size out")
        if self.target_size is not None and not 0.0 < self.target_size <= 1.0:
            raise ValueError(f"target_size={self.target_size}: must be in (0, 1]")
        if self.width_multiple < 1:
            raise ValueError(f"width_multiple={self.width_multiple}: must be at least 1")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r}: choose one of {', '.join(LAYOUTS)}")
        if (self.layout != "per-block" or self.width_multiple > 1 or self.speed_context is not None) \
                and self.structure != "coupled":
            raise ValueError("layout, width_multiple and speed_context allocate coupled units: use structure coupled")
        if self.speed_context is not None and self.speed_context < 1:
            raise ValueError(f"speed_context={self.speed_context}: must be at least 1")
        if self.shots is not None and self.shots < 1:
            raise ValueError(f"shots={self.shots}: must be at least 1")
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r}: choose one of {', '.join(METHODS)}")
        if self.method in PER_LAYER and self.structure in ("structured", "coupled"):
            raise ValueError(f"method={self.method!r} prunes unstructured or N:M, not {self.structure}")
        if (self.structure == "experts") != (self.method == "reap") and self.method != "surgeon":
            raise ValueError(f"method={self.method!r} with structure {self.structure}: whole experts are priced by "
                             "surgeon or reap, and reap prices only whole experts")
        if self.structure == "experts" and (self.activation_checkpointing or self.lora_steps
                                            or self.leave_out_parts != ("router",)):
            raise ValueError("structure experts runs its own pass and removes routed experts whole: without "
                             "activation_checkpointing, lora_steps and leave_out")
        if self.max_correlate is not None and self.max_correlate < 0:
            raise ValueError(f"max_correlate={self.max_correlate}: must be >= 0 (0 = all)")
        if self.cg_tol < 0 or self.cg_max_iter < 1:
            raise ValueError(f"cg_tol={self.cg_tol}, cg_max_iter={self.cg_max_iter}: need tol >= 0, max_iter >= 1")
        for name in ("damp_a", "damp_g"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name}={value}: must be >= 0")
        if self.propagate and (self.nm is None or self.method not in NEEDS_A):
            raise ValueError("propagate prunes the last N:M shot of surgeon, kobd or lobd block by block: use an N:M "
                             "structure")
        if self.held_out_choice and not self._can_choose:
            raise ValueError("held_out_choice weighs an unstructured or N:M surgeon run against sparsegpt-refine: use "
                             "method surgeon with structure unstructured or N:M")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size}: must be at least 1")
        if self.cg_dtype not in (None, "bfloat16", "float16"):
            raise ValueError(f"cg_dtype={self.cg_dtype!r}: use bfloat16, float16, or None (the model's)")
        if self.cg_dtype is not None and self.max_correlate not in (0, None):
            raise ValueError("cg_dtype sets the precision of the joint conjugate-gradient solve: it needs "
                             "max_correlate 0")
        if self.block_groups < 1:
            raise ValueError(f"block_groups={self.block_groups}: must be at least 1")
        if self.block_groups > 1 and not self.offload:
            raise ValueError(f"block_groups={self.block_groups}: each group's factors move to host memory after its "
                             "pass; add offload")
        if self.offload and self.structure not in ("structured", "coupled"):
            raise ValueError(f"offload holds the factors of a structured or coupled run, not {self.structure} (its "
                             "element costs are read again and again while the threshold is selected)")
        if self.offload and self.method not in NEEDS_A:
            raise ValueError(f"offload holds the Kronecker factors of surgeon, kobd or lobd; method {self.method} "
                             "has none to hold")
        if self.activation_checkpointing and self.method not in NEEDS_G:
            raise ValueError(f"activation_checkpointing recomputes the blocks in the backward pass of surgeon or kobd; "
                             f"method {self.method} runs none")

    @property
    def leave_out_parts(self) -> tuple[str, ...]:
        """`leave_out` as a tuple of its comma-separated parts."""
        return tuple(part.strip() for part in self.leave_out.split(",") if part.strip())

    @property
    def target(self) -> float:
        """α, the fraction of prunable weights kept at the end: `target_size`, N/M for N:M, else its default."""
        nm = self.nm
        return nm[0] / nm[1] if nm is not None else DEFAULT_TARGET_SIZE if self.target_size is None \
            else self.target_size

    @property
    def shot_count(self) -> int:
        """T, the number of shots: `shots`, else the structure's default (`DEFAULT_SHOTS`; N:M: 1)."""
        if self.shots is not None:
            return self.shots
        return DEFAULT_SHOTS[self.structure] if self.nm is None else 1

    @property
    def elements(self) -> bool:
        """Whether the run removes single weights (unstructured, N:M), each layer holding a mask of them, not whole
        rows and columns (structured, coupled)."""
        return self.structure == "unstructured" or self.nm is not None

    @property
    def propagates(self) -> bool:
        """Whether the last N:M shot runs block by block: `propagate`, else on for N:M with a curvature pass."""
        return self.propagate if self.propagate is not None else self.nm is not None and self.method in NEEDS_A

    @property
    def strengths(self) -> tuple[float, float]:
        """(λ_G, λ_A), the relative damping of G and A: `damp_g`, `damp_a`, else their defaults (docs/DESIGN.md)."""
        damp_g = self.damp_g if self.damp_g is not None else PROPAGATED_DAMP_G if self.propagates \
            else DEFAULT_DAMP_G
        damp_a = self.damp_a if self.damp_a is not None else COUPLED_DAMP_A \
            if self.structure == "coupled" and self.method == "surgeon" else DEFAULT_DAMP_A
        return damp_g, damp_a

    @property
    def _can_choose(self) -> bool:
        """Whether the run prunes what `ALTERNATIVE` can: LLM Surgeon, unstructured or N:M."""
        return self.method == "surgeon" and (self.structure == "unstructured" or self.nm is not None)

    @property
    def chooses(self) -> bool:
        """Whether the run is weighed against `ALTERNATIVE` by held-out loss: `held_out_choice`, else on for
        unstructured and N:M surgeon."""
        return self.held_out_choice if self.held_out_choice is not None else self._can_choose

    def resolved(self) -> dict[str, object]:
        """Every field, those left at None replaced by the value the run uses (what report.json records)."""
        damp_g, damp_a = self.strengths
        return {**dataclasses.asdict(self), "target_size": self.target, "shots": self.shot_count,
                "propagate": self.propagates, "damp_g": damp_g, "damp_a": damp_a,
                "held_out_choice": self.chooses}

    @property
    def nm(self) -> tuple[int, int] | None:
        """(N, M) for N:M structure, else None."""
        return parse_nm(self.structure)

    def shot_target(self, shot: int) -> float:
        """α_t = 1 − t(1−α)/T, the fraction that stays after shot t (1-based; docs/DESIGN.md)."""
        return 1.0 - shot * (1.0 - self.target) / self.shot_count


@dataclass(frozen=True)
class RunConfig:
    """Settings of a CLI run: which model, which data, where the results go."""

    model: str = _opt("smollm2-135m", "hub id, local directory, .gguf file, or a built-in model: smollm2-135m, "
                      "gemma3-270m")
    tokenizer: str | None = _opt(None, "tokenizer to use instead of the model's own", shown="the model's")
    dataset: str = _opt("wikitext2", "evaluation text: wikitext2, c4, ptb, or a text file")
    calibration: str = _opt(
        "wikitext2",
        "calibration text: wikitext2 (hub train split, else packaged validation), wikitext2-valid, c4, ptb, "
        "or a text file",
    )
    nsamples: int = _opt(128, "calibration windows")
    seqlen: int = _opt(2048, "tokens per calibration and evaluation window")
    eval_windows: int | None = _opt(None, "evaluate only the first N test windows", shown="all")
    eval_seqlen: int | None = _opt(None, "tokens per evaluation window", shown="--seqlen")
    device: str = _opt("cpu", "cpu or cuda")
    dtype: str = _opt("float32", "model dtype", ("float32", "bfloat16", "float16"))
    output: str | None = _opt(
        None, "where results go: a JSON file for eval, a new or empty folder for prune", shown="print only",
    )
    overwrite: bool = _opt(
        False, "prune into an existing non-empty --output folder, replacing only the files the run writes"
    )
    eval_every_shot: bool = _opt(False, "also evaluate perplexity after every shot (per shot in report.json)")
    resume: bool = _opt(False, "continue the unfinished run in --output after its last checkpoint (same options)")
    checkpoint_shots: int = _opt(
        1, "write a checkpoint into --output after every N shots and the last, for --resume (0: never)"
    )
    tasks: str | None = _opt(
        None, "zero-shot lm-eval tasks, comma-separated, or default (boolq, piqa, hellaswag, winogrande, arc_easy, "
        "arc_challenge, openbookqa); accuracies go into the result (needs the tasks extra)", shown="none",
    )
    task_path: str | None = _opt(None, "a folder of lm-eval task YAML files added to lm-eval's own",
                                 shown="lm-eval's tasks only")
    task_limit: int | None = _opt(None, "score only the first N documents of each task", shown="all")
    fsdp: bool = _opt(False, "under torchrun, shard the weights over the ranks with FSDP2 (for a model larger than "
                      "one device; every rank evaluates)")

    @property
    def test_seqlen(self) -> int:
        """Tokens per evaluation window."""
        return self.eval_seqlen or self.seqlen

    def __post_init__(self) -> None:
        if self.nsamples < 1:
            raise ValueError(f"nsamples={self.nsamples}: must be at least 1")
        if self.seqlen < 2:
            raise ValueError(f"seqlen={self.seqlen}: must be at least 2")
        if self.eval_seqlen is not None and self.eval_seqlen < 2:
            raise ValueError(f"eval_seqlen={self.eval_seqlen}: must be at least 2")
        if self.eval_windows is not None and self.eval_windows < 1:
            raise ValueError(f"eval_windows={self.eval_windows}: must be at least 1")
        if self.checkpoint_shots < 0:
            raise ValueError(f"checkpoint_shots={self.checkpoint_shots}: must be at least 0 (0: never)")
        if self.tasks is not None:
            task_names(self.tasks)
        if self.task_limit is not None and self.task_limit < 1:
            raise ValueError(f"task_limit={self.task_limit}: must be at least 1")
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

    run: str = _opt("", "a folder written by `surgeon prune`")
    compact: bool = _opt(False, "cut out the MLP neurons and attention heads whose output is exactly zero")
    format: str = _opt(
        "standard", "standard: the original architecture and model_type, one width for every block (blocks that "
        "need fewer units keep zero ones, which add exactly 0); decilm (Llama): every layer its own MLP width and "
        "KV heads, a part left without units a no-op, in DeciLM's block_configs, which vLLM serves "
        "(`vllm serve OUT --trust-remote-code`; transformers loads it with trust_remote_code=True or "
        "surgeon.load_compact)", EXPORT_FORMATS,
    )
    ffn_mult: bool = _opt(False, "decilm: round every MLP width up to a multiple of 256 and write it as ffn_mult, "
                                 "and keep an MLP of zero neurons beside a live attention, for llama.cpp's "
                                 "converter and graph")
    output: str | None = _opt(None, "a new or empty folder for the exported checkpoint and report.json")
    overwrite: bool = _opt(False, "export into an existing non-empty --output folder, replacing only its files")

    def __post_init__(self) -> None:
        if not self.compact:
            raise ValueError("nothing to export: pass --compact to write the model without its removed units")
        if self.format not in EXPORT_FORMATS:
            raise ValueError(f"format {self.format!r} is not one of {', '.join(EXPORT_FORMATS)}")
        if self.ffn_mult and self.format != "decilm":
            raise ValueError("--ffn-mult is a setting of --format decilm")


@dataclass(frozen=True)
class ReportConfig:
    """Settings of `surgeon report`: which pruning run, what to compare it with, where the figures go."""

    run: str = _opt("", "a folder written by `surgeon prune`")
    compare: str | None = _opt(None, "another `surgeon prune` folder of the same model: adds the mask equivalence",
                               shown="no comparison")
    output: str | None = _opt(None, "a new or empty folder for the figures (PNG) and summary.md")
    overwrite: bool = _opt(False, "write into an existing non-empty --output folder, replacing only its files")


@dataclass(frozen=True)
class PlanConfig:
    """Settings of `surgeon plan`: the run to count, and the GPUs to fit it on."""

    model: str = _opt("smollm2-135m", "hub id, local directory, config.json, .gguf file, or a built-in model: "
                      "smollm2-135m, gemma3-270m; "
                      "only its configuration is read")
    dtype: str = _opt("bfloat16", "model dtype", ("float32", "bfloat16", "float16"))
    nsamples: int = _opt(128, "calibration windows")
    seqlen: int = _opt(2048, "tokens per calibration window")
    gpu_memory: str = _opt("80GB", "memory of one GPU, such as 80GB (GB and GiB both read as 2^30 bytes)")
    gpus: int = _opt(1, "GPUs to share the work")
    output: str | None = _opt(None, "also write the plan as JSON to this file", shown="print only")

    def __post_init__(self) -> None:
        if self.nsamples < 1 or self.seqlen < 2:
            raise ValueError(f"nsamples={self.nsamples}, seqlen={self.seqlen}: need nsamples >= 1, seqlen >= 2")
        if self.gpus < 1:
            raise ValueError(f"gpus={self.gpus}: must be at least 1")
        parse_bytes(self.gpu_memory)
