"""N:M's last shot chosen by held-out evidence (`PruneConfig.nm_update` select): LLM Surgeon's exact update and
SparseGPT's early-stopped one run in turn from the same weights, and the one with the lower loss on calibration
windows neither saw stays (docs/DESIGN.md, "An early stop, not a better minimiser")."""

from __future__ import annotations

import logging

import torch
from torch import nn

from surgeon.config import PruneConfig
from surgeon.models.layer import Layer
from surgeon.pruning.elements import propagated_shot
from surgeon.scale.distributed import Ranks

logger = logging.getLogger(__name__)


@torch.no_grad()
def held_out_loss(model: nn.Module, ids: torch.Tensor, batch_size: int) -> float:
    """The model's mean next-token loss over the windows `ids` [n, seqlen]."""
    device = next(model.parameters()).device
    total = 0.0
    for batch in ids.split(batch_size):
        batch = batch.to(device)
        total += float(model(input_ids=batch, labels=batch).loss) * batch.shape[0]
    return total / ids.shape[0]


def _state(layers: list[Layer]) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """Every layer's weights (and bias) and mask, copied to host memory."""
    return [([t.to("cpu", copy=True) for t in layer.whole()], layer.mask.to("cpu", copy=True)) for layer in layers]


def _restore(layers: list[Layer], state: list[tuple[list[torch.Tensor], torch.Tensor]]) -> None:
    for layer, (whole, mask) in zip(layers, state):
        device = layer.mask.device
        layer.assign([t.to(device) for t in whole])
        layer.mask = mask.to(device)


def selected_shot(model: nn.Module, layers: list[Layer], raw: dict, calibration: torch.Tensor,
                  held_out: torch.Tensor, config: PruneConfig, ranks: Ranks, progress: bool) -> dict[str, float]:
    """`propagated_shot` with the exact update, then from the same weights with refine; the weights of the one
    with the lower `held_out_loss` stay (exact on a tie). The held-out loss of each."""
    start = _state(layers)  # the exact pass pops a copy of `raw`: every factor stays held until refine's pass
    propagated_shot(model, layers, dict(raw), calibration, config, ranks, progress, "exact")
    losses = {"exact": held_out_loss(model, held_out, config.batch_size)}
    exact = _state(layers)
    _restore(layers, start)
    del start
    propagated_shot(model, layers, raw, calibration, config, ranks, progress, "refine")
    losses["refine"] = held_out_loss(model, held_out, config.batch_size)
    chosen = "exact" if losses["exact"] <= losses["refine"] else "refine"
    if chosen == "exact":
        _restore(layers, exact)
    logger.info("N:M update: %s (held-out loss: exact %.4f, refine %.4f)", chosen, losses["exact"], losses["refine"])
    return losses
