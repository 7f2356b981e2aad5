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
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.models.adapter import block_weights, decoder_blocks
from surgeon.models.experts import expert_outputs, fused_weights, keep_experts, routing, sparse_blocks
from surgeon.models.families import family_of, supporting
from surgeon.pruning import curvature
from surgeon.pruning.report import PruneReport, ShotReport, clock, peak_memory_gb
from surgeon.pruning.resume import Checkpoint

logger = logging.getLogger(__name__)


def _output(moe: Any, hidden: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor:
    """The routed part of a sparse block's output for the tokens `hidden` [T, H], without the experts `dropped`."""
    weights, chosen = routing(moe.gate, hidden, dropped)
    return moe.experts(hidden, chosen, weights)


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


def expert_costs(model: nn.Module, moes: list[Any], calibration_ids: torch.Tensor, config: PruneConfig,
                 progress: bool) -> list[torch.Tensor]:
    """Each sparse block's cost of removing each of its routed experts [E], by `config.method` (surgeon: the
    rerouting price over a forward and backward pass; reap: REAP's score over a forward pass)."""
    hidden_size = moes[0].gate.weight.shape[1]
    costs = [torch.zeros(moe.gate.weight.shape[0], dtype=torch.float64) for moe in moes]
    tokens = [torch.zeros_like(cost) for cost in costs]

    def hook(index: int, moe: Any, args: tuple, output: torch.Tensor) -> None:
        hidden = args[0].detach().reshape(-1, hidden_size)
        if config.method == "reap":
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
            for batch in tqdm(calibration_ids.to(device).split(config.batch_size), desc="expert costs", leave=False,
                              disable=not progress):
                if config.method == "reap":
                    with torch.no_grad():
                        model(batch, use_cache=False)
                else:
                    curvature.backward(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    if config.method == "reap":
        return [sums / counts.clamp(min=1) for sums, counts in zip(costs, tokens)]
    return costs


def _weights(moe: Any) -> int:
    """The routed experts' weights of a sparse block's MLP."""
    return sum(weight.numel() for weight in fused_weights(moe.experts))


def prune_experts(model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig, progress: bool = True,
                  after_shot: Callable[[ShotReport], None] | None = None, checkpoint: Checkpoint | None = None,
                  group: dist.ProcessGroup | None = None) -> PruneReport:
    """Remove whole routed experts until every sparse block keeps round(target · E) of its E, in `shot_count`
    shots (the linear schedule), the cheapest of each block first; the model's config holds the new count.

    The target counts the routed experts' weights; the report's `sparsity` is the fraction of them removed and
    `layers` that fraction per block (`model.layers.3.mlp.experts`).
    """
    config_of: Any = model.config
    count_key = family_of(config_of).expert_count
    if count_key is None:
        raise SurgeonError(f"structure experts removes whole routed experts of {', '.join(supporting('expert_count'))} "
                           f"models; the model is {config_of.model_type!r}")
    if group is not None:
        raise SurgeonError("structure experts runs in one process; launch without torchrun")
    if checkpoint is not None and checkpoint.state is not None:
        raise SurgeonError("structure experts changes the expert count and keeps no shot checkpoints: run it again "
                           "without --resume")
    moes = [moe for _, moe in sparse_blocks(decoder_blocks(model))]
    if not moes:
        raise SurgeonError("structure experts: the model has no block whose MLP routes to experts")
    qualified = {id(module): name for name, module in model.named_modules()}
    names = [qualified[id(moe.experts)] for moe in moes]
    start_count, top_k = moes[0].gate.weight.shape[0], moes[0].gate.top_k
    keep = round(config.target * start_count)
    if keep < top_k:
        raise SurgeonError(f"target_size {config.target:g} keeps {keep} of {start_count} experts per block, fewer than "
                           f"the {top_k} the router chooses for every token")
    total = [_weights(moe) for moe in moes]
    block_total = sum(param.numel() for _, param in block_weights(model))
    report = PruneReport(config=config.resolved())
    device = next(model.parameters()).device
    start = time.perf_counter()
    last = config.shot_count
    for shot in tqdm(range(1, last + 1), desc="shots", total=last, disable=not progress):
        t0 = clock(device)
        costs = expert_costs(model, moes, calibration_ids, config, progress)
        t1 = clock(device)
        count = round(start_count - (start_count - keep) * shot / last)
        for moe, cost in zip(moes, costs):
            keep_experts(moe, cost.argsort(descending=True, stable=True)[:count].sort().values.to(device))
        setattr(config_of, count_key, count)
        sparsity = 1 - sum(_weights(moe) for moe in moes) / sum(total)
        shot_report = ShotReport(shot, config.shot_target(shot), sparsity, 0,
                                 {"costs": t1 - t0, "prune": clock(device) - t1}, peak_memory_gb(device))
        report.shots.append(shot_report)
        logger.info("shot %d/%d · %d of %d experts kept per block · sparsity %.4f · costs %.2fs · peak %.2f GB", shot,
                    last, count, start_count, sparsity, t1 - t0, shot_report.peak_memory_gb)
        if after_shot is not None:
            after_shot(shot_report)
    report.layers = {name: 1 - _weights(moe) / weights for name, moe, weights in zip(names, moes, total)}
    report.removed = sum(total) - sum(_weights(moe) for moe in moes)
    report.sparsity = report.zero_fraction = report.removed / sum(total)
    report.block_sparsity = report.removed / block_total
    report.seconds = time.perf_counter() - start
    return report
