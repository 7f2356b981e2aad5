"""Hidden channels shared by layers: once one end of a channel is removed, the rest of it is dead.

An MLP channel j is produced by row j of gate_proj and up_proj (or fc1) and consumed by column j
of down_proj (or fc2); an attention value channel (kv head g, dim d) is produced by row (g, d) of
v_proj and consumed by column (h, d) of o_proj for every query head h that reads kv head g. The
activation maps 0 to 0 and a removed row loses its bias too, so when any producer row is removed
the channel carries exactly zero: its consumer columns (and the other producers' rows) no longer
change the output. When every consumer column is removed, the producer rows no longer reach the
loss. Removing such dead weights changes nothing, so a shot removes them along with the structures
it chose (paper sec. 3.3 counts weights; these are removed at no cost). Couplings are found by module
name for the known families; any other architecture gets none (nothing is removed beyond the costs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN

from surgeon.models.adapter import attention_layout
from surgeon.models.families import family_of


@dataclass(frozen=True)
class Coupling:
    """Producer layers' rows [groups, dim] feed the consumer's columns [groups, repeat, dim] (layer indices)."""

    producers: tuple[int, ...]
    consumer: int
    groups: int
    repeat: int
    dim: int

    def dead(self, rows: list[torch.Tensor], cols: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(producer rows, consumer columns) that are dead given the removed `rows`/`cols` of every layer."""
        source = torch.stack([rows[p].reshape(self.groups, self.dim) for p in self.producers]).any(0)
        dead_cols = cols[self.consumer].reshape(self.groups, self.repeat, self.dim) | source.unsqueeze(1)
        return (source | dead_cols.all(1)).reshape(-1), dead_cols.reshape(-1)


def maps_zero_to_zero(config: Any) -> bool:
    """Whether the config's MLP activation gives exactly 0 at 0 (then a zero producer row carries nothing)."""
    act = next((getattr(config, key) for key in ("hidden_activation", "hidden_act", "activation_function")
                if getattr(config, key, None)), None)
    return act in ACT2FN and bool((ACT2FN[act](torch.zeros(1)) == 0).all())


def couplings(model: nn.Module, names: list[str]) -> list[Coupling]:
    """The channel couplings between the layers `names` (qualified module names) of `model`.

    MLP channels need an activation with f(0) = 0; attention channels are (kv head, dim), each
    read by `heads / kv_heads` query heads. Layers whose sizes do not fit that layout are skipped.
    """
    config = model.config
    index = {name: i for i, name in enumerate(names)}
    zero_act = maps_zero_to_zero(config)
    heads, kv_heads, head_dim = attention_layout(config)
    found = []
    for name in names:
        for (producers, consumer), attention in zip(family_of(config).channels, (False, True)):
            if not name.endswith("." + consumer):
                continue
            prefix = name[: -len(consumer)]
            members = [prefix + p for p in producers]
            if any(m not in index for m in members):
                continue
            producer, reader = model.get_submodule(members[0]), model.get_submodule(name)
            if not (isinstance(producer, nn.Linear) and isinstance(reader, nn.Linear)):
                continue
            rows, cols = producer.out_features, reader.in_features
            if attention:
                grouped = heads > 0 and kv_heads > 0 and head_dim > 0 and heads % kv_heads == 0
                shape = (kv_heads, heads // kv_heads, head_dim) if grouped else None
            else:
                shape = (cols, 1, 1) if zero_act else None
            if shape is None or rows != shape[0] * shape[2] or cols != shape[0] * shape[1] * shape[2]:
                continue
            found.append(Coupling(tuple(index[m] for m in members), index[name], *shape))
    return found


def with_dead(found: list[Coupling], rows: list[torch.Tensor], cols: list[torch.Tensor]
              ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The removed rows and columns of every layer plus the channel ends they leave dead (new lists)."""
    rows, cols = list(rows), list(cols)
    for coupling in found:
        dead_rows, dead_cols = coupling.dead(rows, cols)
        for p in coupling.producers:
            rows[p] = rows[p] | dead_rows
        cols[coupling.consumer] = cols[coupling.consumer] | dead_cols
    return rows, cols
