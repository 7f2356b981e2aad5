"""`PruneConfig`, the settings of one pruning run.

The CLI builds its options from the fields (`surgeon.fields.opt`: help, choices and least value in each field), so a
setting exists in exactly one place. `__post_init__` checks the fields' bounds, then what the settings ask of each
other; which method serves which structure comes from the method table (`surgeon.methods`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

from surgeon.fields import check, opt
from surgeon.methods import (
    DEFAULT_DAMP_A,
    DEFAULT_DAMP_G,
    DEFAULT_SHOTS,
    DEFAULT_TARGET_SIZE,
    GLOBAL_DEVIATION,
    METHODS,
    PROPAGATED_DAMP_G,
    SHOTS,
    Method,
    Shot,
    kind_of,
    method_help,
    parse_nm,
    serving,
)

# where the curvature pass and the prune phase keep their tensors: they change time and memory, never a result
MEMORY_OPTIONS = ("activation_checkpointing", "offload", "block_groups")
Correlation = Literal["joint", "within"]


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one pruning run (docs/DESIGN.md: schedule, damping, correlation)."""

    structure: str = opt(
        "structured", "structured (rows+columns), coupled (MLP neurons, attention heads and KV groups, across the "
        "layers each spans), unstructured, N:M such as 2:4 (N kept of every M), or experts (whole routed experts)")
    target_size: float | None = opt(
        None, "fraction of prunable weights kept (non-zero) at the end, in (0, 1]; 0.8 keeps 80%, removes 20% "
        "(experts: of each block's routed experts)", shown=f"{DEFAULT_TARGET_SIZE}; N:M structures keep N/M")
    shots: int | None = opt(None, "number of pruning shots (linear schedule)",
                             shown="4 structured and coupled, 2 unstructured, 1 N:M and experts", least=1)
    layout: str = opt(
        "per-block", "coupled: per-block (each block its own widths; query heads leave in rounds, one of every KV "
        "head at a time), uniform (as many neurons and heads in every block, as the standard export holds), or "
        "decilm (each block its MLP width, attention whole or gone, as vLLM holds)", ("per-block", "uniform", "decilm"))
    width_multiple: int = opt(
        1, "coupled: every block keeps a multiple of this many neurons, and heads whose width is one (64, 128, 256)",
        least=1)
    speed_context: int | None = opt(
        None, "coupled: rank units by cost per multiply-accumulate their removal saves a token decoded after this "
        "many tokens of context (a head or KV group also its attention)", shown="none: by cost alone", least=1)
    leave_out: str = opt(
        "router", "comma-separated parts of the decoder blocks not to prune: router (the MoE routers) or glob "
        "patterns over parameter names ('model.layers.*.mlp.experts.*'); a weight matrix the run cannot prune and "
        "does not leave out makes it refuse; the target and sparsity count what is pruned")
    method: str = opt("surgeon", f"pruning method ({method_help()})", tuple(METHODS))
    correlation: Correlation = opt("joint", "structured surgeon update: joint rows+columns, or within rows / columns",
                                   typing.get_args(Correlation))
    max_correlate: int | None = opt(
        0, "unstructured/N:M surgeon: at most this many weights solved jointly, the chunks' updates summed (the "
        "paper's m, sec. 3.4) (0 = all, exact, by CG)", least=0)
    cg_tol: float = opt(1e-3, "max-correlate 0: relative residual at which conjugate gradients stop", least=0)
    cg_max_iter: int = opt(40, "max-correlate 0: at most this many conjugate-gradient iterations per layer", least=1)
    cg_dtype: str | None = opt(None, "max-correlate 0: run the conjugate-gradient products G⁻¹ V A⁻¹ in this dtype",
                                ("bfloat16", "float16"), shown="the model's dtype")
    damp_a: float | None = opt(None, "relative damping of A: A + λ·mean(diag A)·I",
                                shown=f"{DEFAULT_DAMP_A}; " + "; ".join(
                                    f"{m.coupled_damp_a} for structure coupled with {name}" for name, m in
                                    METHODS.items() if m.coupled_damp_a != DEFAULT_DAMP_A), least=0)
    damp_g: float | None = opt(None, "relative damping of G: G + λ·mean(diag G)·I",
                                shown=f"{DEFAULT_DAMP_G}; {PROPAGATED_DAMP_G} for N:M with propagate", least=0)
    fisher: str = opt(
        "empirical", "G's labels: the data's next tokens (empirical, as the paper uses in practice) or tokens drawn "
        "from the model's own predictions (sampled: eq. 6's Fisher, one draw per position, seeded)",
        ("empirical", "sampled"))
    layer_deviation: float | None = opt(
        None, "unstructured: how far a layer's sparsity may stray from the shot's (1: one threshold over all layers' "
        "costs, sec. 3.3; 0: every layer alike)", shown=f"{METHODS['surgeon'].layer_deviation} for surgeon, else 1",
        least=0)
    nm_mask: str | None = opt(None, "N:M surgeon, propagated: each layer's mask by the OBS sweep over its columns "
                              "on A (sweep) or by eq. 7's costs at once (costs, the paper's)", ("sweep", "costs"),
                              shown="sweep where a correlated method's N:M shot propagates, else costs")
    batch_size: int = opt(1, "calibration windows per forward/backward pass", least=1)
    propagate: bool | None = opt(
        None, "N:M and unstructured: prune the last shot block by block, each block's A from the inputs of the blocks "
        "already pruned, as SparseGPT (G from the shot's pass; unstructured: as many weights per layer as the "
        "threshold takes)", shown="on for N:M with surgeon, kobd or lobd")
    held_out_choice: bool | None = opt(
        None, "unstructured and N:M surgeon: also prune the dense model in one sparsegpt-refine shot and keep the "
        "model with the lower loss on held-out calibration windows (none given, or several processes: LLM Surgeon's)",
        shown="on for unstructured and N:M with surgeon")
    curvature_split: str = opt(
        "batches", "under torchrun: each rank runs a share of the calibration batches and the factors are summed onto "
        "each block's owner (batches: fastest), or each runs every batch and accumulates only its own blocks' factors "
        "(blocks: 1/N of the factor memory, the one-process result)", ("batches", "blocks"))
    activation_checkpointing: bool = opt(
        False, "surgeon/kobd curvature pass: each decoder block keeps only its inputs and runs again in the backward "
        "pass (the same factors; one block's activations instead of all, for one more forward)")
    offload: bool = opt(
        False, "structured/coupled: hold the factors, and between costs and updates the packed inverses, in host "
        "memory; the device holds those of a layer and the one before it")
    block_groups: int = opt(
        1, "with offload: split the decoder blocks into N groups and run the curvature pass once per group, each "
        "accumulating its group's factors before they move to host memory (N passes, 1/N of the factors)", least=1)
    lora_steps: int = opt(0, "interleaved LoRA steps between shots (0 = off; paper 3.6)")
    lora_rank: int = opt(8, "rank of the interleaved LoRA adapters")
    lora_lr: float = opt(1e-4, "learning rate of the interleaved LoRA adapters")
    seed: int = opt(0, "random seed (calibration sampling, LoRA)")
    backend: str = opt(
        "auto", "kernels: auto (Triton on CUDA, the compiled op on the CPU when built, else PyTorch), or one of them",
        ("auto", "triton", "cpp", "torch"))

    def __post_init__(self) -> None:
        check(self)
        kind_of(self.structure)  # one the method table names, else a ValueError naming it
        if (nm := self.nm) and self.target_size is not None and abs(self.target_size - nm[0] / nm[1]) > 1e-9:
            raise ValueError(f"target_size={self.target_size}: structure {self.structure} keeps {nm[0] / nm[1]:g} of "
                             "the weights; leave target_size out")
        if self.target_size is not None and not 0.0 < self.target_size <= 1.0:
            raise ValueError(f"target_size={self.target_size}: must be in (0, 1]")
        if (self.layout != "per-block" or self.width_multiple > 1 or self.speed_context is not None) \
                and self.structure != "coupled":
            raise ValueError("layout, width_multiple and speed_context allocate coupled units: use structure coupled")
        if self.kind not in self.spec.structures:
            raise ValueError(f"method={self.method!r} prunes {', '.join(self.spec.structures)}, not {self.structure}: "
                             f"for {self.kind} use {' or '.join(serving(self.kind))}")
        if self.shot is Shot.EXPERTS and (self.activation_checkpointing or self.lora_steps
                                            or self.leave_out_parts != ("router",)):
            raise ValueError("structure experts runs its own pass and removes routed experts whole: without "
                             "activation_checkpointing, lora_steps and leave_out")
        if self.fisher == "sampled" and (not self.spec.needs_g or self.shot is Shot.EXPERTS):
            raise ValueError(f"fisher=sampled draws the labels of G: method {self.method!r} with structure "
                             f"{self.structure} uses no G from the curvature pass")
        if self.deviation < 1 and (self.structure != "unstructured" or self.spec.layer_rule is not None):
            raise ValueError("layer_deviation bounds the layers of an unstructured shot of a globally thresholded "
                             "method; N:M, structured and per-layer methods take no bounds")
        if self.propagate and (not self.elements or not self.spec.needs_a):
            raise ValueError("propagate prunes the last element shot of a method with a curvature pass block by block ("
                             f"{', '.join(n for n, m in METHODS.items() if m.needs_a)}): use unstructured or N:M")
        if self.nm_mask == "sweep" and not (self.nm and self.propagates and self.spec.correlated):
            raise ValueError("nm_mask=sweep: the propagated N:M shot of a correlated method sweeps its masks")
        if self.held_out_choice and not (self.spec.alternative is not None and self.elements):
            raise ValueError("held_out_choice weighs an unstructured or N:M run against its method's alternative ("
                             + ", ".join(f"{n} against {m.alternative}" for n, m in METHODS.items() if m.alternative)
                             + "): use such a method with structure unstructured or N:M")
        if self.cg_dtype is not None and self.max_correlate not in (0, None):
            raise ValueError("cg_dtype sets the precision of the joint conjugate-gradient solve: it needs "
                             "max_correlate 0")
        if self.block_groups > 1 and not self.offload:
            raise ValueError(f"block_groups={self.block_groups}: each group's factors move to host memory after its "
                             "pass; add offload")
        if self.offload and (self.shot is not Shot.STRUCTURED or not self.spec.needs_a):
            raise ValueError(f"offload holds the Kronecker factors of a structured or coupled run's curvature pass, "
                             f"not of {self.structure} with method {self.method}")
        if self.activation_checkpointing and not self.spec.needs_g:
            raise ValueError("activation_checkpointing recomputes the blocks in the backward pass of the curvature "
                             f"pass; method {self.method} runs none")

    @property
    def leave_out_parts(self) -> tuple[str, ...]:
        """`leave_out` as a tuple of its comma-separated parts."""
        return tuple(part.strip() for part in self.leave_out.split(",") if part.strip())

    @property
    def target(self) -> float:
        """α, the fraction of prunable weights kept at the end: `target_size`, N/M for N:M, else its default."""
        return nm[0] / nm[1] if (nm := self.nm) is not None else self.target_size or DEFAULT_TARGET_SIZE

    @property
    def shot_count(self) -> int:
        """T, the number of shots: `shots`, else the structure's default (`DEFAULT_SHOTS`)."""
        return self.shots if self.shots is not None else DEFAULT_SHOTS[self.kind]

    @property
    def elements(self) -> bool:
        """Whether the run removes single weights (unstructured, N:M), each layer holding a mask of them, not whole
        rows and columns (structured, coupled)."""
        return self.shot is Shot.ELEMENTS

    @property
    def propagates(self) -> bool:
        """Whether the last element shot runs block by block: `propagate`, else on for N:M with a curvature pass."""
        return self.propagate if self.propagate is not None else self.nm is not None and self.spec.needs_a

    @property
    def strengths(self) -> tuple[float, float]:
        """(λ_G, λ_A), the relative damping of G and A: `damp_g`, `damp_a`, else their defaults (docs/DESIGN.md)."""
        damp_g = self.damp_g if self.damp_g is not None else \
            PROPAGATED_DAMP_G if self.propagates and self.nm is not None else DEFAULT_DAMP_G
        damp_a = self.damp_a if self.damp_a is not None else self.spec.coupled_damp_a \
            if self.structure == "coupled" else DEFAULT_DAMP_A
        return damp_g, damp_a

    @property
    def deviation(self) -> float:
        """How far a layer's unstructured sparsity may stray from the shot's: `layer_deviation`, else the method's."""
        return self.layer_deviation if self.layer_deviation is not None else \
            self.spec.layer_deviation if self.structure == "unstructured" else GLOBAL_DEVIATION

    @property
    def chooses(self) -> bool:
        """Whether the run is weighed against its method's alternative by held-out loss: `held_out_choice`, else on for
        unstructured and N:M surgeon (a method with an alternative, `Method.alternative`, pruning elements)."""
        return self.held_out_choice if self.held_out_choice is not None else \
            self.spec.alternative is not None and self.elements

    @property
    def mask_rule(self) -> str:
        """`nm_mask`, else the OBS sweep where a correlated method's N:M shot propagates, else eq. 7's costs."""
        return self.nm_mask or ("sweep" if self.nm and self.propagates and self.spec.correlated else "costs")

    def resolved(self) -> dict[str, object]:
        """Every field, those left at None replaced by the value the run uses (what report.json records)."""
        damp_g, damp_a = self.strengths
        return {**dataclasses.asdict(self), "target_size": self.target, "shots": self.shot_count,
                "propagate": self.propagates, "damp_g": damp_g, "damp_a": damp_a,
                "held_out_choice": self.chooses, "layer_deviation": self.deviation, "nm_mask": self.mask_rule}

    @property
    def spec(self) -> Method:
        """The method's entry in the method table (`surgeon.methods.METHODS`)."""
        return METHODS[self.method]

    @property
    def kind(self) -> str:
        """The structure as the method table names it: N:M for any N:M structure (`surgeon.methods.STRUCTURES`)."""
        return kind_of(self.structure)

    @property
    def shot(self) -> Shot:
        """What each shot removes: structures, elements or experts (`surgeon.methods.SHOTS`)."""
        return SHOTS[self.kind]

    @property
    def nm(self) -> tuple[int, int] | None:
        """(N, M) for N:M structure, else None."""
        return parse_nm(self.structure)

    def shot_target(self, shot: int) -> float:
        """α_t = 1 − t(1−α)/T, the fraction that stays after shot t (1-based; docs/DESIGN.md)."""
        return 1.0 - shot * (1.0 - self.target) / self.shot_count
