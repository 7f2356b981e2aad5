"""Coupled structures: the units a model can physically lose, each spanning several layers (docs/DESIGN.md).

- MLP neuron j: row j of the gate and up projections (OPT: fc1 and its bias) and column j of the down
  projection (fc2).
- Attention query head h: its `head_dim` rows of q (OPT: of q, k and v, each head has its own) and its
  `head_dim` columns of o.
- KV group g (grouped-query attention): its `head_dim` rows of k and v, and the query heads that read
  it, their rows of q and their columns of o.

Each unit has one consumer part, the columns of the layer that reads it (down, o): once they are
gone, the unit's output reaches nothing and its producer rows are dead.

Removing a unit zeroes all of its weights. Under grouped-query attention a KV head whose query heads
are all gone is read by nobody: its k and v rows are freed with the last of them (`freed`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from surgeon.errors import SurgeonError
from surgeon.models.adapter import attention_layout
from surgeon.models.experts import routed_share
from surgeon.models.families import family_of, supporting

Axis = Literal["rows", "cols"]


@dataclass(frozen=True)
class Member:
    """Unit i owns indices [i·size, (i + 1)·size) of this layer's rows or columns."""

    layer: int
    axis: Axis
    size: int

    def owned(self, chosen: torch.Tensor) -> torch.Tensor:
        """The rows or columns of this layer that the `chosen` units [count] own."""
        return chosen.repeat_interleave(self.size)


@dataclass(frozen=True)
class UnitKind:
    """`count` units of one kind in one decoder block (neurons, query heads or KV groups) and the layer parts
    each owns.

    `kv`: for query heads under grouped-query attention, the k and v layers and the heads per KV head,
    whose rows are freed when every query head of a KV head is removed.
    """

    name: str
    count: int
    members: tuple[Member, ...]
    kv: tuple[tuple[int, int], int, int] | None = None  # ((k layer, v layer), heads per KV head, head_dim)
    share: float = 1.0  # the fraction of tokens that run these units: a routed expert's top-k over its experts

    @property
    def consumer(self) -> Member:
        """The columns of the layer that reads the unit (down, o): what a unit's removal costs."""
        return next(member for member in self.members if member.axis == "cols")



def coupled_units(model: nn.Module, names: list[str], width_multiple: int = 1, layout: str = "per-block",
                  ) -> list[UnitKind]:
    """The neuron, query-head and KV-group units of every decoder block of `model`, over its layers `names`.

    Every gated MLP (gate, up, down) among the layers is one kind of neuron unit: a block's dense MLP or
    shared expert ("neuron"), and each routed expert of a Mixture-of-Experts block, split into layers
    (`experts.ExpertLayers`), on its own ("expert neuron"), so that layout uniform keeps as many neurons in every
    expert as in the others. KV groups are units under grouped-query attention when query heads leave in
    rounds (`width_multiple` at most `head_dim`, see `allocation`): every KV group then keeps as many query
    heads as the others, so a group's kept columns of o are a set of the same size in every live group. olmoe's
    heads are no units (`Family.whole_qk_norm`): its attention is left out or the run refused. Under
    `layout` decilm a block's heads leave together (`allocation`), and so KV groups are no units of their own."""
    config: Any = model.config
    family = getattr(config, "model_type", "")
    if not family_of(config).coupled:
        raise SurgeonError(f"structure coupled supports {', '.join(supporting('coupled'))}; the model is {family!r}")
    whole_qk_norm = family_of(config).whole_qk_norm
    index = {name: i for i, name in enumerate(names)}
    heads, kv_heads, head_dim = attention_layout(config)
    mlp: tuple[str, ...]
    attention: tuple[str, ...]
    if family == "opt":
        mlp, attention = ("fc1", "fc2"), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.out_proj")
    else:
        mlp, attention = ("gate_proj", "up_proj", "down_proj"), ("self_attn.q_proj", "self_attn.o_proj")
    kinds: list[UnitKind] = []
    block_attention: list[UnitKind] = []  # a block's head and KV-group kinds, after its neurons
    for name in names:
        if name.endswith("." + mlp[-1]):  # one MLP: a block's own, its shared expert or one routed expert
            prefix = name[: -len(mlp[-1])]
            consumer = model.get_submodule(name)
            assert isinstance(consumer, nn.Linear)
            routed = ".experts." in name
            producers = tuple(Member(_member(index, prefix + part, name), "rows", 1) for part in mlp[:-1])
            kinds.append(UnitKind("expert neuron" if routed else "neuron", consumer.in_features,
                                  producers + (Member(index[name], "cols", 1),),
                                  share=routed_share(config) if routed else 1.0))
        if not name.endswith("." + attention[-1]) or whole_qk_norm:
            continue
        kinds += block_attention
        prefix = name[: -len(attention[-1])]
        needed = attention + ("self_attn.k_proj", "self_attn.v_proj")
        parts = {part: _member(index, prefix + part, name) for part in needed}
        head_members = tuple(Member(parts[p], "rows", head_dim) for p in attention[:-1]) + (
            Member(parts[attention[-1]], "cols", head_dim),)
        kv = None
        if family != "opt":
            kv = ((parts["self_attn.k_proj"], parts["self_attn.v_proj"]), heads // kv_heads, head_dim)
        block_attention = [UnitKind("head", heads, head_members, kv)]
        per = heads // kv_heads
        if family != "opt" and per > 1 and width_multiple <= head_dim and layout != "decilm":
            block_attention.append(UnitKind("group", kv_heads, (
                Member(parts["self_attn.q_proj"], "rows", per * head_dim),
                Member(parts["self_attn.k_proj"], "rows", head_dim),
                Member(parts["self_attn.v_proj"], "rows", head_dim),
                Member(parts["self_attn.o_proj"], "cols", per * head_dim))))
    kinds += block_attention
    covered = {member.layer for kind in kinds for member in kind.members} | {
        layer for kind in kinds if kind.kv is not None for layer in kind.kv[0]}  # k, v: freed with their query heads
    outside = [name for i, name in enumerate(names) if i not in covered]
    if outside and whole_qk_norm:
        raise SurgeonError(f"structure coupled: {family} normalises q and k over all heads at once, so its heads "
                           "cannot leave alone; leave its attention out (--leave-out "
                           "'router,model.layers.*.self_attn.*') to prune its neurons and expert neurons")
    if outside:
        raise SurgeonError(f"structure coupled: no neuron or head unit holds {', '.join(outside[:3])}"
                           f"{' …' if len(outside) > 3 else ''}; leave it out or use structure structured")
    return kinds


def _member(index: dict[str, int], layer: str, beside: str) -> int:
    """The index of `layer`, which a unit of `beside` needs; refused by name when it is not among the layers."""
    if layer not in index:
        raise SurgeonError(f"structure coupled: {beside} needs {layer} among the pruned layers")
    return index[layer]


def masks_of(kinds: list[UnitKind], chosen: list[torch.Tensor], rows: list[torch.Tensor], cols: list[torch.Tensor],
             free_kv: bool, consumers_only: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`rows`/`cols` of every layer (removed so far) plus what the `chosen` units of each kind remove
    (`consumers_only`: their consumer columns), and with `free_kv` the k and v rows of the KV heads left
    without query heads."""
    rows, cols = [r.clone() for r in rows], [c.clone() for c in cols]
    for kind, units in zip(kinds, chosen):
        for member in kind.members:
            if consumers_only and member is not kind.consumer:
                continue
            target = rows if member.axis == "rows" else cols
            target[member.layer] = target[member.layer] | member.owned(units).to(target[member.layer].device)
        if free_kv and kind.kv is not None:
            (k_layer, v_layer), per_kv, head_dim = kind.kv
            q = next(m for m in kind.members if m.axis == "rows")
            gone = rows[q.layer].reshape(-1, per_kv, head_dim).all(2).all(1)  # every query head of the KV head
            freed = gone.repeat_interleave(head_dim)
            rows[k_layer], rows[v_layer] = rows[k_layer] | freed, rows[v_layer] | freed
    return rows, cols


def decode_macs(kind: UnitKind, shapes: list[tuple[int, int]], context: int) -> float:
    """Multiply-accumulates one unit of `kind` costs a decoded token after `context` tokens, on average: its
    weights (`shapes`: each layer's out × in features) times the share of tokens that run it (a routed expert's),
    and for a head or KV group its query heads' scores and weighted values over the context."""
    weights = sum(member.size * shapes[member.layer][1 if member.axis == "rows" else 0] for member in kind.members)
    attention = 2 * context * kind.consumer.size if kind.name in ("head", "group") else 0
    return kind.share * weights + attention


def allocation(kinds: list[UnitKind], costs: list[torch.Tensor], layout: str, multiple: int,
               ) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], list[torch.Tensor]]]:
    """Groups of units that the global threshold takes or leaves together, their costs, and a map from chosen
    groups back to chosen units.

    Under grouped-query attention query heads leave in rounds, the r-th cheapest head of every KV head
    together, so that every KV head keeps as many query heads as the others: the layout attention kernels and
    the compact export need, which would otherwise keep the removed heads as zero padding. A round costs the
    sum over the KV heads still live; those removed whole (a KV-group unit, costs −inf) take no part.

    `multiple`: each block keeps a multiple of that many neurons (and of `multiple / head_dim` heads, so that
    heads × head_dim is a multiple too, chunked instead of in rounds): per block, units are sorted by cost and
    cut into chunks, the first of `count mod chunk` units (to reach a multiple), then whole chunks. `layout`
    uniform: every block keeps the same number of each kind, so the chunk at each position is taken in all
    blocks at once; decilm: a block's query heads are one chunk, its whole attention, since DeciLM's schema has
    one query-head count for every layer whose attention stays. A group costs the sum of its units' costs;
    sorted units make these sums non-decreasing within a block, so a prefix of the global order takes each
    block's chunks in order.
    """
    families: dict[object, list[int]] = {}
    for index, kind in enumerate(kinds):
        families.setdefault(kind.name if layout == "uniform" else index, []).append(index)
    group_costs, group_of = [], {}
    for indices in families.values():
        kind = kinds[indices[0]]
        chunk = max(1, multiple // math.gcd(multiple, kind.members[0].size))
        if layout == "decilm" and kind.name == "head":
            chunk = kind.count
        per = kind.kv[1] if kind.kv is not None else 1
        if chunk == 1 and per > 1:  # rounds: the r-th cheapest query head of every KV head leave together
            total = torch.zeros(per, dtype=costs[indices[0]].dtype)
            for i in indices:
                by_kv = costs[i].cpu().reshape(-1, per)
                ranks = torch.argsort(torch.argsort(by_kv, dim=1, stable=True), dim=1)
                group_of[i] = ranks.reshape(-1)
                live = ~torch.isneginf(by_kv).all(1)
                if live.any():
                    by_kv, ranks = by_kv[live], ranks[live]
                total.index_add_(0, ranks.reshape(-1), by_kv.reshape(-1))
            group_costs.append(total)
            continue
        first = kind.count % chunk  # a first, shorter chunk brings the kept count to a multiple
        position = torch.arange(kind.count)
        chunk_at = torch.where(position < first, 0, (position - first) // chunk + int(first > 0))
        total = torch.zeros(int(chunk_at[-1]) + 1, dtype=costs[indices[0]].dtype)
        for i in indices:
            order = torch.argsort(costs[i].cpu(), stable=True)
            group_of[i] = torch.empty_like(order).scatter_(0, order, chunk_at)
            total.index_add_(0, chunk_at, costs[i].cpu()[order])
        group_costs.append(total)
    family_of = [next(f for f, indices in enumerate(families.values()) if i in indices) for i in range(len(kinds))]

    def chosen_units(chosen_groups: list[torch.Tensor]) -> list[torch.Tensor]:
        return [chosen_groups[family_of[i]].cpu()[group_of[i]].to(costs[i].device) for i in range(len(kinds))]

    return group_costs, chosen_units
