"""LLM Surgeon's unstructured and N:M runs weighed against one SparseGPT-refine shot by held-out evidence
(`PruneConfig.held_out_choice`): both prune the same dense model, and the one with the lower loss on calibration
windows neither saw stays (docs/DESIGN.md, "An early stop, not a better minimiser")."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import nn

from surgeon.models.layer import Layer
from surgeon.pruning.elements import per_layer_shot
from surgeon.pruning.phases import PerLayer
from surgeon.pruning.report import bar
from surgeon.scale.distributed import Ranks

logger = logging.getLogger(__name__)

State = list[tuple[list[torch.Tensor], torch.Tensor]]


@torch.no_grad()
def held_out_loss(model: nn.Module, ids: torch.Tensor, batch_size: int, progress: bool = False) -> float:
    """The model's mean next-token loss over the windows `ids` [n, seqlen]."""
    device = next(model.parameters()).device
    total = 0.0
    for batch in bar(ids.split(batch_size), "held-out loss", progress):
        batch = batch.to(device)
        total += float(model(input_ids=batch, labels=batch).loss) * batch.shape[0]
    return total / ids.shape[0]


def _state(layers: list[Layer]) -> State:
    """Every layer's weights (and bias) and mask, copied to host memory."""
    return [([t.to("cpu", copy=True) for t in layer.whole()], layer.mask.to("cpu", copy=True)) for layer in layers]


def _restore(layers: list[Layer], state: State) -> None:
    for layer, (whole, mask) in zip(layers, state):
        device = layer.mask.device
        layer.assign([t.to(device) for t in whole])
        layer.mask = mask.to(device)


@dataclass
class Alternative:
    """The alternative shot's method (`Method.alternative`), pruned weights and masks (in host memory), held-out
    loss and seconds."""

    method: str
    state: State
    loss: float
    seconds: float


def alternative(model: nn.Module, layers: list[Layer], calibration: torch.Tensor, held_out: torch.Tensor,
                method: str, shot: PerLayer, target: float, ranks: Ranks, progress: bool) -> Alternative:
    """Prune the layers to `target` in one shot of the per-layer `method` (the run's `Method.alternative`), block by
    block, score the model on `held_out` and keep its weights aside; the layers are left as they were."""
    start, t0 = _state(layers), time.perf_counter()
    per_layer_shot(model, layers, calibration, target, shot, ranks, progress)
    loss = held_out_loss(model, held_out, shot.blocks.batch_size, progress)
    pruned = _state(layers)
    _restore(layers, start)
    return Alternative(method, pruned, loss, time.perf_counter() - t0)


def keep_lower(model: nn.Module, layers: list[Layer], method: str, other: Alternative, held_out: torch.Tensor,
               batch_size: int, progress: bool = False) -> dict[str, object]:
    """Score the run's pruned model (`method`'s) on `held_out` and put `other`'s weights in its place where their
    loss is lower (the run's stay on a tie); the method kept, the held-out loss of each and the other shot's seconds
    (`PruneReport.choice`)."""
    losses = {method: held_out_loss(model, held_out, batch_size, progress), other.method: other.loss}
    stays = losses[method] <= other.loss
    kept = method if stays else other.method
    if not stays:
        _restore(layers, other.state)
    logger.info("kept %s (held-out loss: %s %.4f, %s %.4f)", kept, method, losses[method], other.method, other.loss)
    return {"kept": kept, "held_out_loss": losses, "seconds": other.seconds}
