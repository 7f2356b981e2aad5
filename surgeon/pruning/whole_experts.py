"""Whole routed experts leave a Mixture-of-Experts model (structure "experts"; docs/DESIGN.md, "Whole experts").

Every sparse block keeps the same number of routed experts, so that the pruned model is the same
architecture with a smaller expert count, which stock transformers and vLLM load. Each shot prices every
expert of every sparse block on the current model, then removes each block's cheapest, its router rows
with it:

- "surgeon": the loss its removal costs once the router sends its tokens to their next choices. For a
  token t, Δy_t is the exact change of the block's routed output when the expert's logit is −∞ (the
  tokens it served are rerouted and re-weighted; without renormalization every token's weights
  change), and g_t the loss gradient at the block's output; the cost is ½ Σ_t (g_tᵀ Δy_t)², the
  empirical Fisher's quadratic form per token, as G sums g gᵀ over tokens (eq. 6).
- "reap": REAP's criterion, the router-weighted norm of the expert's output averaged over the tokens
  routed to it, mean_{t ∈ T_e} w_te ‖f_e(x_t)‖ (forward passes only).

An expert that no calibration token reaches costs 0 by both and leaves first.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from surgeon.errors import SurgeonError
from surgeon.methods import ExpertPrice
from surgeon.models.adapter import block_weights, decoder_blocks
from surgeon.models.experts import expert_outputs, fused_weights, keep_experts, routing, sparse_blocks
from surgeon.models.families import family_of, supporting
from surgeon.pruning import curvature
from surgeon.pruning.phases import Experts
from surgeon.pruning.report import PruneReport, clock

logger = logging.getLogger(__name__)


def _output(moe: Any, hidden: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor:
    """The routed part of a sparse block's output for the tokens `hidden` [T, H], without the experts `dropped`."""
    weights, chosen = routing(moe.gate, hidden, dropped)
    routed: torch.Tensor = moe.experts(hidden, chosen, weights)
    return routed


@torch.no_grad()
def reroute_costs(moe: Any, hidden: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """½ Σ_t (g_tᵀ Δy_t)² for each routed expert of `moe` [E], float64: Δy_t the change of the routed output for
    token t (`hidden` [T, H]) when that expert leaves, g_t its loss gradient (`grad` [T, H])."""
    count = moe.gate.weight.shape[0]
    weights, chosen = routing(moe.gate, hidden)
    base = moe.experts(hidden, chosen, weights)
    renormalized = getattr(moe.gate, "norm_topk_prob", True)
    precision = torch.promote_types(grad.dtype, torch.float32)  # 16-bit models: the products summed in float32
    costs = torch.zeros(count, dtype=torch.float64, device=hidden.device)
    for expert in range(count):  # with renormalized weights only the tokens it served change
        tokens = (chosen == expert).any(-1).nonzero().squeeze(1) if renormalized else slice(None)
        dropped = torch.zeros(count, dtype=torch.bool, device=hidden.device)
        dropped[expert] = True
        delta = _output(moe, hidden[tokens], dropped) - base[tokens]
        costs[expert] = 0.5 * (grad[tokens].to(precision) * delta.to(precision)).sum(-1).double().square().sum()
    return costs


@torch.no_grad()
def reap_scores(moe: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_{t ∈ T_e} w_te ‖f_e(x_t)‖, |T_e|) for each routed expert e of `moe` over the tokens `hidden` [T, H]."""
    count = moe.gate.weight.shape[0]
    weights, chosen = routing(moe.gate, hidden)
    sums = torch.zeros(count, dtype=torch.float64, device=hidden.device)
    tokens = torch.zeros(count, dtype=torch.float64, device=hidden.device)
    for expert in range(count):
        token, slot = torch.where(chosen == expert)
        if token.numel():
            norms = expert_outputs(moe.experts, expert, hidden[token]).double().norm(dim=-1)
            sums[expert] = (weights[token, slot].double() * norms).sum()
            tokens[expert] = token.numel()
    return sums, tokens


def expert_costs(model: nn.Module, moes: list[Any], calibration_ids: torch.Tensor, price: ExpertPrice, batch_size: int,
                 progress: bool) -> list[torch.Tensor]:
    """Each sparse block's cost of removing each of its routed experts [E], by `price` (REROUTE: the
    rerouting price over a forward and backward pass; REAP: REAP's score over a forward pass)."""
    hidden_size = moes[0].gate.weight.shape[1]
    reap = price is ExpertPrice.REAP
    costs = [torch.zeros(moe.gate.weight.shape[0], dtype=torch.float64) for moe in moes]
    tokens = [torch.zeros_like(cost) for cost in costs]

    def hook(index: int, moe: Any, args: tuple[Any, ...], output: torch.Tensor) -> None:
        hidden = args[0].detach().reshape(-1, hidden_size)
        if reap:
            sums, counts = reap_scores(moe, hidden)
            costs[index] += sums.cpu()
            tokens[index] += counts.cpu()
        else:  # the gradient at the block's output arrives in the backward pass
            output.register_hook(lambda grad: add_costs(index, moe, hidden, grad))

    def add_costs(index: int, moe: Any, hidden: torch.Tensor, grad: torch.Tensor) -> None:
        costs[index] += reroute_costs(moe, hidden, grad.reshape(-1, hidden_size)).cpu()

    handles = [moe.register_forward_hook(lambda module, args, output, index=index: hook(index, module, args, output))
               for index, moe in enumerate(moes)]
    device = next(model.parameters()).device
    try:
        with curvature.frozen(model):
            for batch in tqdm(calibration_ids.to(device).split(batch_size), desc="expert costs", leave=False,
                              disable=not progress):
                if reap:
                    with torch.no_grad():
                        model(batch, use_cache=False)
                else:
                    curvature.backward(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    if reap:
        return [sums / counts.clamp(min=1) for sums, counts in zip(costs, tokens)]
    return costs


def _weights(moe: Any) -> int:
    """The routed experts' weights of a sparse block's MLP."""
    return sum(weight.numel() for weight in fused_weights(moe.experts))


class ExpertShots:
    """Whole-expert shots (`shots.Strategy`): every shot prices each routed expert of every sparse block on the
    current model and removes each block's cheapest, until every block keeps round(target · E) of its E, the
    model's config holding the count.

    The target counts the routed experts' weights; the report's `sparsity` is the fraction of them removed and
    `layers` that fraction per block (`model.layers.3.mlp.experts`). Nothing moves but whole experts, so a
    checkpoint holds each block's kept experts by their original index.
    """

    def __init__(self, model: nn.Module, calibration_ids: torch.Tensor, settings: Experts,
                 group: dist.ProcessGroup | None) -> None:
        config_of: Any = model.config
        count_key = family_of(config_of).expert_count
        if count_key is None:
            raise SurgeonError(f"structure experts removes whole routed experts of "
                               f"{', '.join(supporting('expert_count'))} models; the model is "
                               f"{config_of.model_type!r}")
        if group is not None:
            raise SurgeonError("structure experts runs in one process; launch without torchrun")
        self.moes = [moe for _, moe in sparse_blocks(decoder_blocks(model))]
        if not self.moes:
            raise SurgeonError("structure experts: the model has no block whose MLP routes to experts")
        qualified = {id(module): name for name, module in model.named_modules()}
        self.names = [qualified[id(moe.experts)] for moe in self.moes]
        self.start_count, top_k = self.moes[0].gate.weight.shape[0], self.moes[0].gate.top_k
        self.keep = round(settings.target * self.start_count)
        if self.keep < top_k:
            raise SurgeonError(f"target_size {settings.target:g} keeps {self.keep} of {self.start_count} experts per "
                               f"block, fewer than the {top_k} the router chooses for every token")
        self.model, self.calibration_ids, self.settings = model, calibration_ids, settings
        self.config_of, self.count_key = config_of, count_key
        self.total = [_weights(moe) for moe in self.moes]
        self.block_total = sum(param.numel() for _, param in block_weights(model))
        self.device = next(model.parameters()).device
        self.kept = [torch.arange(self.start_count) for _ in self.moes]  # each block's experts by original index

    def _keep(self, chosen: list[torch.Tensor]) -> None:
        """Keep each block's experts `chosen` (indices among its current ones, ascending), the count in the config."""
        for index, (moe, among) in enumerate(zip(self.moes, chosen)):
            keep_experts(moe, among.to(self.device))
            self.kept[index] = self.kept[index][among.cpu()]
        setattr(self.config_of, self.count_key, len(chosen[0]))

    def shot(self, shot: int, target_size: float, progress: bool) -> tuple[dict[str, float], int, float]:
        t0 = clock(self.device)
        price = self.settings.price
        assert price is not None  # PruneConfig: structure experts only with a method that prices whole experts
        costs = expert_costs(self.model, self.moes, self.calibration_ids, price, self.settings.batch_size, progress)
        t1 = clock(self.device)
        count = round(self.start_count - (self.start_count - self.keep) * shot / self.settings.shots)
        self._keep([cost.argsort(descending=True, stable=True)[:count].sort().values for cost in costs])
        logger.info("%d of %d experts kept per block", count, self.start_count)
        sparsity = 1 - sum(_weights(moe) for moe in self.moes) / sum(self.total)
        return {"costs": t1 - t0, "prune": clock(self.device) - t1}, 0, sparsity

    def state(self) -> dict[str, torch.Tensor]:
        return {f"{name}.kept": kept for name, kept in zip(self.names, self.kept)}

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        self._keep([tensors[f"{name}.kept"] for name in self.names])

    def finish(self, report: PruneReport, progress: bool) -> None:
        remaining = [_weights(moe) for moe in self.moes]
        report.layers = {name: 1 - left / weights for name, left, weights in zip(self.names, remaining, self.total)}
        report.removed = sum(self.total) - sum(remaining)
        report.sparsity = report.zero_fraction = report.removed / sum(self.total)
        report.block_sparsity = report.removed / self.block_total
