"""Mixture-of-Experts experts as prunable layers: fused 3-D expert weights split into one nn.Linear each.

transformers stores the experts of mixtral, qwen2_moe, qwen3_moe, olmoe and deepseek_v3 fused:
`gate_up_proj` [E, 2I, H] (gate rows, then up rows) and `down_proj` [E, H, I], run by a loop over the
experts that the router chose. While a run prunes, `experts_as_layers` puts in their place an
`ExpertLayers` module: the same routing and arithmetic, with each expert's gate, up and down
projections as `nn.Linear` layers. Every hook, factor, cost and update of the dense layers then
applies to each expert as it is: its A comes from the tokens routed to it alone, its G from its
output gradients, which carry the router weight (docs/DESIGN.md, "Experts"). On leaving, the
pruned weights go back into the fused parameters, so the model saves and loads as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def is_fused_experts(module: Any) -> bool:
    """A fused experts module of the layout above: 3-D `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I], no biases."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter)) or gate_up.dim() != 3:
        return False
    experts, rows, hidden = gate_up.shape
    own = {name for name, _ in module.named_parameters(recurse=False)}
    return (own == {"gate_up_proj", "down_proj"} and rows % 2 == 0 and hasattr(module, "act_fn")
            and tuple(down.shape) == (experts, hidden, rows // 2))


def fused_weights(module: nn.Module) -> tuple[nn.Parameter, nn.Parameter]:
    """(`gate_up_proj`, `down_proj`) of a fused experts module."""
    gate_up, down = module.gate_up_proj, module.down_proj
    assert isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter)  # `is_fused_experts` checked it
    return gate_up, down


def kept_neurons(module: nn.Module, kept: torch.Tensor) -> dict[str, torch.Tensor]:
    """A fused experts module's `gate_up_proj` and `down_proj` keeping the neurons `kept` [experts, width] of each
    expert: their gate and up rows and their down columns."""
    gate_up, down = (weight.detach() for weight in fused_weights(module))
    rows = torch.cat([kept, kept + down.shape[2]], 1)
    return {"gate_up_proj": gate_up.gather(1, rows.unsqueeze(2).expand(-1, -1, gate_up.shape[2])),
            "down_proj": down.gather(2, kept.unsqueeze(1).expand(-1, down.shape[1], -1))}


def routed_share(config: Any) -> float:
    """The fraction of tokens a routed expert runs on average: experts per token over experts."""
    experts = getattr(config, "num_local_experts", None) or config.num_experts
    share: float = config.num_experts_per_tok / experts
    return share


def sparse_blocks(blocks: Any) -> list[tuple[int, Any]]:
    """(index, MLP) of the decoder blocks whose MLP routes: a router `gate` (`weight` [E, H], `top_k`) before fused
    `experts`."""
    return [(index, block.mlp) for index, block in enumerate(blocks)
            if is_fused_experts(getattr(block.mlp, "experts", None)) and hasattr(block.mlp, "gate")]


def routing(router: Any, hidden: torch.Tensor, dropped: torch.Tensor | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k weights, top-k experts) that `router` gives the tokens `hidden` [T, H], as in the model without the
    experts `dropped` ([E] bool): a softmax over the others' logits, its top k, renormalized where the router
    renormalizes (`norm_topk_prob`; Mixtral always)."""
    logits = F.linear(hidden, router.weight)
    if dropped is not None:
        logits = logits.masked_fill(dropped, float("-inf"))
    weights, experts = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float), router.top_k, dim=-1)
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), experts


def expert_outputs(experts: Any, index: int, hidden: torch.Tensor) -> torch.Tensor:
    """Routed expert `index`'s output for the tokens `hidden` [T, H], before its router weight."""
    gate_up, down = fused_weights(experts)
    gate, up = F.linear(hidden, gate_up[index]).chunk(2, dim=-1)
    return F.linear(experts.act_fn(gate) * up, down[index])


def keep_experts(moe: Any, kept: torch.Tensor) -> None:
    """Leave only the routed experts `kept` (ascending indices) in a sparse block's MLP: their router rows and
    fused weights. The router then chooses among them as the whole model chose with the others' logits at −∞."""
    gate_up, down = fused_weights(moe.experts)
    for owner, name, weight in ((moe.gate, "weight", moe.gate.weight), (moe.experts, "gate_up_proj", gate_up),
                                (moe.experts, "down_proj", down)):
        setattr(owner, name, nn.Parameter(weight.detach()[kept].clone(), requires_grad=weight.requires_grad))
    moe.gate.num_experts = moe.experts.num_experts = kept.numel()


class ExpertMLP(nn.Module):
    """One expert: `down_proj(act(gate_proj(x)) * up_proj(x))`."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (_linear(w) for w in (gate, up, down))


class ExpertLayers(nn.ModuleList):
    """A fused experts module's experts as a list of `ExpertMLP`s (`experts.0.gate_proj`, …), computing what its
    routed loop computes."""

    act_fn: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, fused: nn.Module):
        gate_ups, downs = fused_weights(fused)
        inner = gate_ups.shape[1] // 2
        super().__init__(ExpertMLP(gate_up[:inner], gate_up[inner:], down)
                         for gate_up, down in zip(gate_ups.detach(), downs.detach()))
        self.__dict__["act_fn"] = fused.act_fn  # not a child: the list holds the experts alone
        self.requires_grad_(gate_ups.requires_grad)

    def __iter__(self) -> Iterator[ExpertMLP]:
        return (expert for expert in self._modules.values() if isinstance(expert, ExpertMLP))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted outputs. On the meta device, where routing has no values, every expert
        takes an equal share of the token slots: the balanced load that `surgeon plan` counts."""
        out = torch.zeros_like(hidden_states)
        share = -(-top_k_index.numel() // len(self))
        for index, expert in enumerate(self):
            if hidden_states.is_meta:
                token = slot = torch.zeros(share, dtype=torch.long, device="meta")
            else:
                token, slot = torch.where(top_k_index == index)
            if token.numel() == 0:
                continue
            x = hidden_states[token]
            y = expert.down_proj(self.act_fn(expert.gate_proj(x)) * expert.up_proj(x))
            out.index_add_(0, token, (y * top_k_weights[token, slot, None]).to(out.dtype))
        return out

    def fuse_into(self, fused: nn.Module) -> None:
        """Write the experts' weights back into `fused`'s 3-D parameters."""
        gate_ups, downs = fused_weights(fused)
        with torch.no_grad():
            gate_ups.data = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in self])
            downs.data = torch.stack([e.down_proj.weight for e in self])


@contextmanager
def experts_as_layers(blocks: nn.ModuleList) -> Iterator[None]:
    """Within: every fused experts module of `blocks` is an `ExpertLayers`; after: fused again, with its weights."""
    swapped: list[tuple[nn.Module, str, nn.Module, ExpertLayers]] = []
    try:
        for block in blocks:
            for parent in list(block.modules()):
                for name, child in list(parent.named_children()):
                    if is_fused_experts(child):
                        layers = ExpertLayers(child)
                        for param in fused_weights(child):  # the layers hold the weights meanwhile
                            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
                        setattr(parent, name, layers)
                        swapped.append((parent, name, child, layers))
        yield
    finally:
        for parent, name, fused, layers in reversed(swapped):
            layers.fuse_into(fused)
            setattr(parent, name, fused)


def _linear(weight: torch.Tensor) -> nn.Linear:
    """An `nn.Linear` without bias holding a copy of `weight` [out, in], on its device and in its dtype."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = nn.Parameter(weight.clone(), requires_grad=weight.requires_grad)
    return layer
