"""The multi-shot LLM Surgeon loop (paper Algorithm 1), one loop for every method and structure.

Each shot t: estimate curvature on the current (pruned) model, compute costs, choose what to
remove with one global threshold for the shot's target size α_t, apply the (correlated) update,
keep every pruned weight exactly zero, and optionally run interleaved LoRA corrections. What a shot
removes (structures, elements or whole experts, `surgeon.methods.Shot`) is its strategy's; the loop
around it (schedule, progress, reports, `after_shot`, checkpoints) is the same for all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm

from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.method.factors import InputGroup
from surgeon.methods import Shot
from surgeon.models import channels, units
from surgeon.models.adapter import block_weights, check_prunable, decoder_blocks, max_seqlen
from surgeon.models.experts import experts_as_layers, is_fused_experts
from surgeon.models.layer import Layer
from surgeon.pruning import curvature, held_out, phases
from surgeon.pruning.elements import (
    counted_selection,
    element_shot,
    element_zeros,
    nm_selection,
    per_layer_shot,
    propagated_shot,
)
from surgeon.pruning.report import PruneReport, ShotReport, clock, peak_memory_gb, removed_fractions, zero_fraction
from surgeon.pruning.resume import Checkpoint
from surgeon.pruning.structured import structured_shot
from surgeon.pruning.whole_experts import ExpertShots
from surgeon.scale.block_groups import group_edges
from surgeon.scale.distributed import Ranks, sharded
from surgeon.scale.settings import check_settings

logger = logging.getLogger(__name__)


def _block_groups(blocks: list[list[tuple[str, nn.Linear]]], count: int) -> list[list[tuple[str, nn.Linear]]]:
    """The layers of `blocks` in `count` groups (`group_edges`), for one curvature pass each
    (`PruneConfig.block_groups`)."""
    edges = group_edges(len(blocks), count)
    return [[pair for block in blocks[start:end] for pair in block] for start, end in zip(edges, edges[1:])]


def _check_inputs(model: nn.Module, ids: torch.Tensor, name: str = "calibration_ids") -> None:
    """Refuse a model, or token ids `ids` (the argument `name`), that `prune` cannot use, naming the argument."""
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers causal LM (e.g. from surgeon.load_model or "
                        f"AutoModelForCausalLM.from_pretrained), not {type(model).__name__}")
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.LongTensor [n, seqlen] of token ids (see "
                        f"surgeon.calibration_windows), not {type(ids).__name__}")
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 2:
        raise ValueError(f"{name} must have shape [n, seqlen] with n >= 1 and seqlen >= 2, not "
                         f"{list(ids.shape)} (a single sequence [seqlen] is ids.unsqueeze(0))")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (torch.long), not {ids.dtype}")
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"{name} holds ids outside the model's vocabulary [0, {vocab})")
    limit = max_seqlen(model)
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(f"{name} has seqlen {ids.shape[1]}, longer than the model allows "
                         f"({limit})")


def prune(model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig, progress: bool = True,
          after_shot: Callable[[ShotReport], None] | None = None, checkpoint: Checkpoint | None = None,
          group: dist.ProcessGroup | None = None, held_out_ids: torch.Tensor | None = None) -> PruneReport:
    """Prune `model` in place to `config.target` in `config.shot_count` shots (Algorithm 1).

    model: a transformers causal LM whose decoder blocks hold `nn.Linear` layers (embeddings and
        the LM head are never pruned); any dtype and device, its weights change in place.
    calibration_ids: `torch.LongTensor [n, seqlen]`, n windows of token ids (`calibration_windows`).
    config: what to prune and how (`PruneConfig`). progress: draw progress bars (False: silent).
    after_shot: called with each shot's `ShotReport` once the shot is done (e.g. to evaluate it).
    checkpoint: a `surgeon.pruning.resume.Checkpoint` written after the shots (and `after_shot`); one holding a
        saved state continues that run after its last saved shot. Split over ranks, only rank 0 writes it.
    group: a torch.distributed process group whose ranks all call `prune` with the same model and
        arguments and share the work (`surgeon.scale.distributed`); each ends with the same pruned model.
    held_out_ids: `torch.LongTensor [h, seqlen]`, windows of the calibration text not in `calibration_ids`, on
        which unstructured and N:M runs are weighed against one shot of their method's alternative
        (`PruneConfig.held_out_choice`, `surgeon.held_out_windows`); without them, or over several ranks, the
        run's own model stays.
    Returns a `PruneReport`: `sparsity` (fraction of zero prunable weights), `layers` (that fraction
    per layer, by qualified name), `shots` (per shot: target size, sparsity reached, seconds per
    phase, peak memory in GiB), `config`, `seconds` and `choice` (the held-out choice's losses).
    """
    if not isinstance(config, PruneConfig):
        raise TypeError(f"config must be a surgeon.PruneConfig, not {type(config).__name__}")
    _check_inputs(model, calibration_ids)
    if held_out_ids is not None:
        _check_inputs(model, held_out_ids, "held_out_ids")
    check_prunable(model, config.leave_out_parts)
    experts = [module for module in decoder_blocks(model).modules() if is_fused_experts(module)]
    if any(isinstance(module.gate_up_proj, DTensor) for module in experts):
        raise SurgeonError("Mixture-of-Experts experts are pruned with their weights whole: launch without --fsdp")
    begun = time.perf_counter()
    settings = phases.of(config)
    if config.shot is Shot.EXPERTS:
        return _loop(ExpertShots(model, calibration_ids, settings.experts, group), model, config, begun, progress,
                     after_shot, checkpoint)
    with experts_as_layers(decoder_blocks(model)):
        shots = _LayerShots(model, calibration_ids, config, settings,
                            _resolve(model, calibration_ids, config, group))
        shots.weigh_against_alternative(held_out_ids, progress)
        return _loop(shots, model, config, begun, progress, after_shot, checkpoint)


class Strategy(Protocol):
    """What one kind of shot (`surgeon.methods.Shot`) does to the model, for `prune`'s one shot loop."""

    def shot(self, shot: int, target_size: float, progress: bool) -> tuple[dict[str, float], int, float]:
        """Run shot `shot` (1-based) down to `target_size`: its seconds per phase, the dead weights it freed and the
        sparsity reached."""

    def state(self) -> dict[str, torch.Tensor] | None:
        """What the next shot reads of what the shots so far removed, for a checkpoint; None on a rank that writes
        none (every rank calls it)."""

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        """Put a checkpoint's `state` back into the model."""

    def finish(self, report: PruneReport, progress: bool) -> None:
        """Fill the report's totals once the last shot is done."""


def _loop(strategy: Strategy, model: nn.Module, config: PruneConfig, begun: float, progress: bool,
          after_shot: Callable[[ShotReport], None] | None, checkpoint: Checkpoint | None) -> PruneReport:
    """The shots of the linear schedule, from the checkpoint's last one, each reported, logged and checkpointed."""
    device = next(model.parameters()).device
    report = PruneReport(config=config.resolved())
    tensors, done, elapsed = checkpoint.restore() if checkpoint is not None else ({}, [], 0.0)
    if done:
        strategy.restore(tensors)
    report.shots.extend(done)
    start = begun - elapsed
    last = config.shot_count
    for shot in tqdm(range(len(done) + 1, last + 1), desc="shots", initial=len(done), total=last,
                     disable=not progress):
        target_size = config.shot_target(shot)
        seconds, freed, sparsity = strategy.shot(shot, target_size, progress)
        shot_report = ShotReport(shot, target_size, sparsity, freed, seconds, peak_memory_gb(device))
        report.shots.append(shot_report)
        logger.info("shot %d/%d · target size %.3f · sparsity %.4f · %s · peak %.2f GB", shot, last,
                    target_size, sparsity, " · ".join(f"{k} {v:.2f}s" for k, v in seconds.items()),
                    shot_report.peak_memory_gb)
        if after_shot is not None:
            after_shot(shot_report)
        if checkpoint is not None and checkpoint.due(shot, shot == last):
            state = strategy.state()
            if state is not None:
                checkpoint.save(state, report.shots, time.perf_counter() - start, shot == last)
    strategy.finish(report, progress)
    report.seconds = time.perf_counter() - start
    return report


class _LayerShots:
    """Structured and element shots: the prunable layers of the decoder blocks (any fused experts split into
    layers), priced on each shot's curvature and removed under one global threshold (`Strategy`)."""

    def __init__(self, model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig,
                 settings: phases.Phases, run: _Run) -> None:
        self.model, self.calibration_ids, self.config, self.run = model, calibration_ids, config, run
        self.total = sum(layer.module.weight.numel() for layer in run.layers)
        self.device = next(model.parameters()).device
        self.update, self.units, self.per_layer = settings.update, settings.units, settings.per_layer
        self.blocks, self.lora, self.alternative = settings.blocks, settings.lora, settings.alternative
        self.other: held_out.Alternative | None = None
        self.held_out_ids: torch.Tensor | None = None
        self.warnings: list[str] = []

    def weigh_against_alternative(self, held_out_ids: torch.Tensor | None, progress: bool) -> None:
        """Prune the dense model in one shot of the method's alternative, to weigh the run against once its shots
        are done (`PruneConfig.held_out_choice`); nothing where the run is not weighed, or cannot be (no held-out
        windows, several ranks: said in the log)."""
        config = self.config
        if not config.chooses:
            return
        alternative = config.spec.alternative
        assert alternative is not None and self.alternative is not None  # `chooses` only where the method has one
        if held_out_ids is None or self.run.ranks.world > 1:
            why = "several processes" if self.run.ranks.world > 1 else "no held-out windows (`surgeon prune` sets " \
                "aside the calibration text's last articles for them, where they are at most a quarter of it)"
            self.warnings.append(f"held-out choice skipped: {why}; the model is {config.method}'s, not weighed "
                                 f"against {alternative}'s")
            logger.warning(self.warnings[-1])
            return
        self.held_out_ids = held_out_ids
        self.other = held_out.alternative(self.model, self.run.layers, self.calibration_ids, held_out_ids,
                                          alternative, self.alternative, config.target, self.run.ranks, progress)

    def shot(self, shot: int, target_size: float, progress: bool) -> tuple[dict[str, float], int, float]:
        config, run, layers = self.config, self.run, self.run.layers
        t0 = clock(self.device)
        collective_seconds = run.ranks.seconds
        raw = _curvature(self.model, self.calibration_ids, config, run,
                         f"shot {shot}/{config.shot_count} · curvature", progress)
        t1 = clock(self.device)
        with torch.no_grad():
            parts, freed = self._remove(raw, shot, target_size, progress)
        t2 = clock(self.device)
        seconds = {"curvature": t1 - t0, "prune": t2 - t1, **parts}
        if run.ranks.world > 1:
            seconds["collectives"] = run.ranks.seconds - collective_seconds
        if config.lora_steps:
            from surgeon.pruning.lora import lora_correction

            lora_correction(self.model, layers, self.calibration_ids, self.lora,
                            f"shot {shot}/{config.shot_count} · LoRA" if progress else None)
            seconds["lora"] = time.perf_counter() - t2
        _, _, sparsity = removed_fractions((layer.name, layer.mask) for layer in layers)
        return seconds, freed, sparsity

    def _remove(self, raw: list[InputGroup], shot: int, target_size: float,
                progress: bool) -> tuple[dict[str, float], int]:
        """The shot's costs, threshold and updates, by the kind of shot and the method's entry; the seconds of each
        phase where they are apart, and the dead weights freed."""
        config, run, layers, ranks = self.config, self.run, self.run.layers, self.run.ranks
        desc = f"shot {shot}/{config.shot_count}" if progress else None
        if self.per_layer is not None:  # "prune" time includes their input estimation
            per_layer_shot(self.model, layers, self.calibration_ids, target_size, self.per_layer, ranks, progress)
            return {}, 0
        target_zeros = round((1.0 - target_size) * self.total)
        if config.shot is Shot.STRUCTURED:
            return structured_shot(layers, raw, target_zeros, self.update, self.units, config.offload, run.coupled,
                                   run.kinds, ranks, desc)
        if config.propagates and shot == config.shot_count:
            update = self.update
            select = nm_selection(config.nm, update.backend, update.nm_mask, update.strengths[1]) \
                if config.nm is not None else counted_selection(
                    element_zeros(layers, raw, target_zeros, update, ranks, desc), update.backend)
            propagated_shot(self.model, layers, raw, self.calibration_ids, self.update, select, self.blocks, ranks,
                            progress)
            return {}, 0
        return element_shot(layers, raw, target_zeros, self.update, config.nm, ranks, desc), 0

    def state(self) -> dict[str, torch.Tensor] | None:
        """Every layer's weight (and bias), removed rows and columns, and an element run's mask; gathered whole onto
        rank 0, which alone returns them."""
        layers, ranks = self.run.layers, self.run.ranks
        ranks.gather_layers(layers, onto=0)  # sharded weights, whole on the rank that writes
        tensors: dict[str, torch.Tensor] = {}
        if ranks.rank == 0:
            for layer in layers:
                for part, tensor in zip(("weight", "bias"), layer.whole()):
                    tensors[f"{layer.name}.{part}"] = tensor.detach()
                for part in _removed(layer):
                    tensors[f"{layer.name}.{part}"] = getattr(layer, part)
        for layer in layers:
            layer.held = None
        return tensors if ranks.rank == 0 else None

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        for layer in self.run.layers:
            layer.assign([tensors[f"{layer.name}.{part}"] for part in ("weight", "bias")[:len(layer.parameters())]])
            for part in _removed(layer):
                getattr(layer, part).copy_(tensors[f"{layer.name}.{part}"])

    def finish(self, report: PruneReport, progress: bool) -> None:
        layers = self.run.layers
        if self.other is not None:
            assert self.held_out_ids is not None
            report.choice = held_out.keep_lower(self.model, layers, self.config.method, self.other,
                                                self.held_out_ids, self.config.batch_size, progress)
        report.warnings.extend(self.warnings)
        report.layers, report.removed, report.sparsity = removed_fractions(
            (layer.name, layer.mask) for layer in layers)
        report.zero_fraction = zero_fraction([(layer.name, layer.module) for layer in layers])
        report.block_sparsity = report.removed / sum(param.numel() for _, param in block_weights(self.model))


def _removed(layer: Layer) -> tuple[str, ...]:
    """What a layer's removed weights are saved as: its removed rows and columns, and an element run's mask."""
    return ("rows", "cols") + ("mask",) * (layer.elements is not None)


@dataclass
class _Run:
    """A run's settings resolved against the model and the ranks: what every shot reads."""

    layers: list[Layer]
    ranks: Ranks
    batches: list[int]  # the calibration batches this rank's curvature passes run
    groups: list[list[tuple[str, nn.Linear]]]  # the layers each curvature pass hooks, one pass per block group
    checkpointed: list[nn.Module]  # the decoder blocks run under activation checkpointing
    coupled: list[channels.Coupling]
    kinds: list[units.UnitKind] | None  # structure coupled: the unit kinds


def _resolve(model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig,
             group: dist.ProcessGroup | None) -> _Run:
    """The layers `config` prunes, the ranks that share them, and the passes each shot runs; what the model or
    the number of ranks cannot run is refused here, before the first shot."""
    world = 1 if group is None else dist.get_world_size(group)
    blocks = check_settings(model, config, world)
    named = [pair for block in blocks for pair in block]
    layers = [Layer.unpruned(name, module, config.elements) for name, module in named]
    ranks = Ranks(group, [[name for name, _ in block] for block in blocks])
    count = -(-calibration_ids.shape[0] // config.batch_size)
    batches = ranks.batches(count, even=any(sharded(module) for _, module in named)) \
        if config.curvature_split == "batches" else list(range(count))
    hooked = [[(name, module) for name, module in block if config.curvature_split == "batches" or ranks.mine(name)]
              for block in blocks]
    names = [name for name, _ in named]
    return _Run(layers, ranks, batches, _block_groups([block for block in hooked if block], config.block_groups),
                list(decoder_blocks(model)) if config.activation_checkpointing else [],
                channels.couplings(model, names),
                units.coupled_units(model, names, config.width_multiple, config.layout)
                if config.structure == "coupled" else None)


def _curvature(model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig, run: _Run, desc: str,
               progress: bool) -> list[InputGroup]:
    """The shot's Kronecker factors (eq. 6) by input group, one pass per block group, summed onto each group's
    owner; in host memory with `offload`; none for the methods without a curvature pass."""
    raw: list[InputGroup] = []
    if not config.spec.needs_a:
        return raw
    for part, group_layers in enumerate(run.groups, 1):
        groups = curvature.estimate(
            model, group_layers, calibration_ids, need_g=config.spec.needs_g, batch_size=config.batch_size,
            backend=config.backend, progress=progress, batches=run.batches, checkpoint_blocks=run.checkpointed,
            sampled_seed=config.seed if config.fisher == "sampled" else None,
            desc=desc + (f" {part}/{len(run.groups)}" if len(run.groups) > 1 else ""))
        if config.curvature_split == "batches":
            run.ranks.reduce_factors(groups)
        raw += [group.to("cpu") for group in groups] if config.offload else groups
        del groups
    return raw
