"""What each phase of a shot reads of the run's settings: one small frozen dataclass per concern, made once from
the `PruneConfig` by the shot loop, so that no phase below it reads the whole configuration."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from surgeon.config import Correlation, PruneConfig
from surgeon.methods import METHODS, ExpertPrice, LayerRule


@dataclass(frozen=True)
class Update:
    """How a shot prices weights and moves the kept ones (eqs. 4-7).

    correlated: costs from F⁻¹ (eq. 7) and the correlated update (eqs. 4-5), else the diagonal costs and no update;
    strengths: (λ_G, λ_A); correlation: the structured update's (joint, within); max_correlate, cg_tol,
    cg_max_iter, cg_dtype: the element update's chunks and conjugate gradients; backend: the kernels'; deviation:
    how far each layer's unstructured sparsity may stray from the shot's (1: one global threshold, sec. 3.3);
    nm_mask: how the propagated N:M shot chooses each layer's mask (`PruneConfig.mask_rule`).
    """

    correlated: bool
    strengths: tuple[float, float]
    correlation: Correlation = "joint"
    max_correlate: int | None = None
    cg_tol: float = 1e-3
    cg_max_iter: int = 40
    cg_dtype: torch.dtype | None = None
    backend: str = "auto"
    deviation: float = 1.0
    nm_mask: str = "costs"


@dataclass(frozen=True)
class Blocks:
    """The passes that run the decoder blocks one after another on the inputs of the blocks before them (per-layer
    methods, propagated N:M): the calibration batches, how ranks split them, what is left out, the kernels."""

    batch_size: int = 1
    curvature_split: str = "batches"
    leave_out: tuple[str, ...] = ("router",)
    backend: str = "auto"


@dataclass(frozen=True)
class PerLayer:
    """A per-layer method's shot: its rule (`Method.layer_rule`) and N:M, with the block passes it runs."""

    rule: LayerRule
    nm: tuple[int, int] | None
    blocks: Blocks


@dataclass(frozen=True)
class Units:
    """How coupled units are allocated (`PruneConfig.layout`, `width_multiple`, `speed_context`)."""

    layout: str = "per-block"
    width_multiple: int = 1
    speed_context: int | None = None


@dataclass(frozen=True)
class Lora:
    """The interleaved LoRA corrections between shots (sec. 3.6)."""

    steps: int
    rank: int = 8
    lr: float = 1e-4
    seed: int = 0
    batch_size: int = 1


@dataclass(frozen=True)
class Experts:
    """A whole-expert run: the fraction of each block's routed experts kept, in how many shots, how an expert is
    priced (`Method.expert_price`) and the calibration batches."""

    target: float
    shots: int
    price: ExpertPrice | None
    batch_size: int = 1


@dataclass(frozen=True)
class Phases:
    """Every phase's settings of one run, made once by the shot loop: the update, coupled units, block passes and
    LoRA, the per-layer shot of the method and of its held-out alternative (None where it has none), whole experts."""

    update: Update
    units: Units
    blocks: Blocks
    lora: Lora
    per_layer: PerLayer | None
    alternative: PerLayer | None
    experts: Experts


def of(config: PruneConfig) -> Phases:
    """The settings of each phase of a run with `config`."""
    alternative = config.spec.alternative
    return Phases(update_of(config), units_of(config), blocks_of(config), lora_of(config),
                  per_layer_of(config) if config.spec.layer_rule is not None else None,
                  per_layer_of(config, alternative) if alternative is not None else None,
                  Experts(config.target, config.shot_count, config.spec.expert_price, config.batch_size))


def update_of(config: PruneConfig) -> Update:
    """The update settings of `config`."""
    cg_dtype = None if config.cg_dtype is None else getattr(torch, config.cg_dtype)
    return Update(config.spec.correlated, config.strengths, config.correlation, config.max_correlate or None,
                  config.cg_tol, config.cg_max_iter, cg_dtype, config.backend, config.deviation, config.mask_rule)


def blocks_of(config: PruneConfig) -> Blocks:
    """The block-pass settings of `config`."""
    return Blocks(config.batch_size, config.curvature_split, config.leave_out_parts, config.backend)


def per_layer_of(config: PruneConfig, method: str | None = None) -> PerLayer:
    """The per-layer shot of `method` (default: the run's own) with `config`'s N:M and block passes."""
    rule = METHODS[method or config.method].layer_rule
    assert rule is not None  # a per-layer method (`Method.layer_rule`)
    return PerLayer(rule, config.nm, blocks_of(config))


def units_of(config: PruneConfig) -> Units:
    """The coupled units' allocation settings of `config`."""
    return Units(config.layout, config.width_multiple, config.speed_context)


def lora_of(config: PruneConfig) -> Lora:
    """The interleaved LoRA settings of `config`."""
    return Lora(config.lora_steps, config.lora_rank, config.lora_lr, config.seed, config.batch_size)
