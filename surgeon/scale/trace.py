"""What one forward pass saves for the backward pass, read off a meta-device forward (`surgeon plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from surgeon.method.factors import input_owner
from surgeon.models.adapter import decoder_blocks


@dataclass
class Trace:
    """What one meta-device forward shows: which layers read one input, and what autograd saves."""

    owners: dict[str, str]  # layer -> the layer whose A it shares: it and those run between read the same tensor
    saved_bytes: int
    checkpointed_bytes: int  # saved with each decoder block checkpointed (`PruneConfig.activation_checkpointing`)


def trace_forward(model: nn.Module, layers: list[tuple[str, nn.Linear]], batch: int, seqlen: int) -> Trace:
    """Run one forward of `batch × seqlen` tokens on the meta device, as the curvature pass runs it.

    Attention is counted as the fused kernels (flash, memory-efficient, cuDNN) keep it for the
    backward pass: query, key, value, output and one float32 statistic per query row, no scores.
    Each saved tensor is put down to the decoder block that saved it: checkpointed, a block keeps
    only its input hidden states, and the backward pass holds one block's own tensors again.
    """
    import torch.nn.functional as F

    params = {id(p) for p in model.parameters()}
    inputs: dict[str, torch.Tensor] = {}
    saved: dict[int, torch.Tensor] = {}  # by id, the tensors themselves held so that no id is reused
    where: dict[int, int | None] = {}  # saved tensor -> the block that saved it (None: outside the blocks)
    statistics: dict[int | None, int] = {}
    blocks = decoder_blocks(model)
    current: list[int | None] = [None]
    block_input = [0]  # bytes of the largest hidden states a block reads: what a checkpointed block keeps

    def enter(index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        current[0] = index
        hidden = args[0] if args else kwargs["hidden_states"]
        block_input[0] = max(block_input[0], hidden.numel() * hidden.element_size())

    def keep(t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if id(base) not in params and id(t) not in params and id(base) not in saved:
            saved[id(base)] = base
            where[id(base)] = current[0]
        return t

    def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any,
                        **kwargs: Any) -> torch.Tensor:
        out = (query[..., :1] * 0).expand(*query.shape[:-1], value.shape[-1]).clone()  # keeps nothing itself
        for t in (query, key, value, out):
            keep(t)
        statistics[current[0]] = statistics.get(current[0], 0) + query.shape[:-1].numel() * 4  # log-sum-exp, fp32
        return out

    order: list[str] = []  # the layers in the order they first run

    def read(name: str, x: torch.Tensor) -> None:
        if name not in inputs:
            inputs[name] = x
            order.append(name)

    handles = [module.register_forward_pre_hook(lambda m, args, name=name: read(name, args[0]))
               for name, module in layers]
    for index, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(lambda m, args, kwargs, index=index: enter(index, args, kwargs),
                                                       with_kwargs=True))
        handles.append(block.register_forward_hook(lambda m, args, out: current.__setitem__(0, None)))
    flags = [(p, p.requires_grad) for p in model.parameters()]
    sdpa = F.scaled_dot_product_attention
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        F.scaled_dot_product_attention = fused_attention
        ids = torch.zeros(batch, seqlen, dtype=torch.long, device="meta")
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            lm: Any = model  # a transformers causal LM
            embeds = lm.get_input_embeddings()(ids).detach().requires_grad_(True)
            lm(inputs_embeds=embeds)
    finally:
        F.scaled_dot_product_attention = sdpa
        for handle in handles:
            handle.remove()
        for p, flag in flags:
            p.requires_grad_(flag)
    owners: dict[str, str] = {}
    bias = {name: module.bias is not None for name, module in layers}
    for before, name in zip([None, *order], order):
        owners[name] = input_owner(owners, None if before is None else (before, inputs[before], bias[before]),
                                   name, inputs[name], bias[name])
    by_block = dict(statistics)
    for key, tensor in saved.items():
        by_block[where[key]] = by_block.get(where[key], 0) + tensor.numel() * tensor.element_size()
    outside = by_block.pop(None, 0)
    return Trace(owners, outside + sum(by_block.values()),
                  outside + len(blocks) * block_input[0] + max(by_block.values(), default=0))
