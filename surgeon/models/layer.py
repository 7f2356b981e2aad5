"""A prunable layer as the shots see it: its weights [W | b], what has been removed, its kept block."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from surgeon.errors import SurgeonError


@dataclass
class Layer:
    """A prunable layer and what has been removed from it so far.

    An element run (unstructured, N:M) holds a mask of single weights (`elements`, True = pruned); a structured run
    removes whole rows and columns (`rows`, `cols`), so its mask is their outer OR, built only when read: it holds
    no [R, C] mask beside the weights.
    """

    name: str
    module: nn.Linear
    rows: torch.Tensor
    cols: torch.Tensor
    elements: torch.Tensor | None = None
    held: list[torch.Tensor] | None = None  # weight (and bias) gathered whole from a sharded module (FSDP2)

    @classmethod
    def unpruned(cls, name: str, module: nn.Linear, elements: bool) -> Layer:
        """The layer before any shot: nothing removed; `elements`: it holds a mask of single weights."""
        R, C = module.weight.shape
        device = module.weight.device
        return cls(name, module, torch.zeros(R, dtype=torch.bool, device=device),
                   torch.zeros(C, dtype=torch.bool, device=device),
                   torch.zeros(R, C, dtype=torch.bool, device=device) if elements else None)

    @property
    def mask(self) -> torch.Tensor:
        """The pruned weights [R, C] (True = pruned): the elements' mask, or the removed rows' and columns'."""
        if self.elements is not None:
            return self.elements
        return self.rows.unsqueeze(1) | self.cols.unsqueeze(0)

    @mask.setter
    def mask(self, mask: torch.Tensor) -> None:
        if self.elements is None:
            raise SurgeonError(f"layer {self.name} removes rows and columns, not single weights")
        self.elements = mask

    @property
    def bias(self) -> bool:
        return self.module.bias is not None

    def parameters(self) -> list[torch.Tensor]:
        """The module's weight and, when it has one, bias."""
        return [self.module.weight] + ([self.module.bias] if self.module.bias is not None else [])

    def whole(self) -> list[torch.Tensor]:
        """The weight (and bias) as whole tensors: `held` for a sharded module, else the parameters' data."""
        if self.held is not None:
            return self.held
        return [p.data for p in self.parameters()]

    @torch.no_grad()
    def assign(self, whole: list[torch.Tensor]) -> None:
        """Write whole weight (and bias) tensors into the parameters; a sharded (FSDP2) parameter takes its shard."""
        for param, tensor in zip(self.parameters(), whole):
            if isinstance(param, DTensor):
                shard = distribute_tensor(tensor, param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())
            else:
                param.copy_(tensor)

    def weight(self) -> torch.Tensor:
        """[W | b] in float32: the bias is an extra input column (docs/DESIGN.md)."""
        W, *bias = (t.detach().float() for t in self.whole())
        return torch.cat([W, bias[0].unsqueeze(1)], 1) if bias else W.clone()

    def kept(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Indices of the kept rows, of the kept columns of [W | b] (the bias last) and of the kept columns of W."""
        keep_r = (~self.rows).nonzero().squeeze(1)
        real_c = (~self.cols).nonzero().squeeze(1)
        keep_c = torch.cat([real_c, real_c.new_tensor([self.module.in_features])]) if self.bias else real_c
        return keep_r, keep_c, real_c

    def with_bias_col(self, mask: torch.Tensor, value: bool) -> torch.Tensor:
        """An [R, C] mask extended with the bias column when the layer has a bias."""
        return torch.cat([mask, mask.new_full((mask.shape[0], 1), value)], 1) if self.bias else mask

    def store(self, W: torch.Tensor) -> None:
        """Write [W | b] back, after checking it is finite, zeroing pruned weights and pruned rows' bias."""
        if not torch.isfinite(W).all():
            raise SurgeonError(f"non-finite weights computed for layer {self.name}; increase damping")
        C = self.module.in_features
        W[:, :C][self.mask] = 0
        W[self.rows] = 0
        weight, *bias = self.whole()
        weight.copy_(W[:, :C])
        if bias:
            bias[0].copy_(W[:, C])
