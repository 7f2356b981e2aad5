"""One pruning run split over processes with torch.distributed (launched by torchrun; NCCL on GPUs, gloo on CPU).

- **Curvature** (eq. 6), split by batches: calibration batches are dealt to the ranks in turn; each
  rank runs the pass on its batches, and every factor is then summed onto the rank that owns its
  decoder block (`dist.reduce` per factor: a reduce-scatter over blocks, as kfac-pytorch/KAISA place
  second-order work). Blocks are owned in turn (block b by rank b mod world), so the layers of an input
  group (one input factor) have one owner. Split by blocks: every rank runs every batch and
  accumulates only its own blocks' factors (1/world of the factor memory, one process's factors).
- **Costs and updates**: a rank computes the inverses, costs (eq. 7) and updates (eqs. 4-5) of its
  own blocks only; each updated layer is then broadcast from its owner (weights, and for element
  structures the mask, which only the owner's costs decide).
- **Threshold** (sec. 3.3): element costs are never gathered. The byte histograms of the radix
  selection are summed over ranks (four all-reduces of 256 counts), and so are the per-layer
  counts of costs at τ that place ties in layer order. Row and column costs, one per row and
  column (R + C per layer), are summed whole, and every rank makes the same structured choice.

Weights sharded by FSDP2 (`shard_model`) are gathered whole layer by layer for the costs and
updates, kept by their owner only (`Layer.held`), and written back shard by shard after the
broadcast. One process is the same code with every collective the identity. Results equal a
one-process run's up to the order in which the factors' sums are added (bit-identical split by
blocks). Time inside collectives (waiting included) is counted in `Ranks.seconds`, reported per
shot as `collectives`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from surgeon.errors import SurgeonError
from surgeon.method.factors import InputGroup
from surgeon.models.adapter import decoder_blocks
from surgeon.models.layer import Layer


def launched() -> bool:
    """Whether this process is one of several started by torchrun (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def sharded(module: nn.Module) -> bool:
    """Whether `module`'s weight is sharded over ranks (a DTensor: FSDP2's `fully_shard`)."""
    return isinstance(getattr(module, "weight", None), DTensor)


def local_device(device: str) -> str:
    """This rank's device: "cuda" becomes "cuda:LOCAL_RANK", one GPU per process as torchrun starts them."""
    if device == "cuda":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def init(device: str) -> dist.ProcessGroup:
    """Join torchrun's process group (NCCL for a CUDA device, gloo otherwise) and return it."""
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        local = local_device(device)
        if backend == "nccl":
            torch.cuda.set_device(torch.device(local))
        try:
            dist.init_process_group(backend, device_id=torch.device(local) if backend == "nccl" else None)
        except (RuntimeError, ValueError) as error:
            raise SurgeonError(f"cannot join the torchrun process group ({backend}): {error}") from error
    group = dist.group.WORLD
    assert group is not None
    return group


def shard_model(model: nn.Module, device: str) -> None:
    """Shard `model`'s weights over all ranks with FSDP2: each decoder block, then the rest (`fully_shard`).

    The shards move to `device` (this rank's); a forward or backward pass gathers one block at a time.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    for block in decoder_blocks(model):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def whole_state_dict(model: nn.Module) -> dict[str, Any]:
    """The model's whole state dict on rank 0 in host memory (every rank must call; the others get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


class Ranks:
    """The processes pruning one model together: who owns each prunable layer, and the collectives between them.

    group: the process group (None: this process alone). blocks: the names of the prunable layers of each
    decoder block, in order; block b is owned by rank b mod world.
    """

    def __init__(self, group: dist.ProcessGroup | None, blocks: Sequence[Sequence[str]]):
        self.group = group
        self.world = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        if self.world > len(blocks):
            raise SurgeonError(f"{self.world} ranks for {len(blocks)} decoder blocks: each rank must own a block")
        self.owners = {name: b % self.world for b, names in enumerate(blocks) for name in names}
        self.seconds = 0.0

    def mine(self, name: str) -> bool:
        """Whether this rank owns prunable layer `name` (its factors, costs and update)."""
        return self.owners[name] == self.rank

    @contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def batches(self, count: int, even: bool = False) -> list[int]:
        """The indices of this rank's share of `count` calibration batches (dealt in turn).

        even: every rank must run as many batches (a sharded model's passes are collectives).
        """
        if count < self.world or (even and count % self.world):
            need = "a multiple of" if even else "at least"
            raise SurgeonError(f"{count} calibration batches cannot be shared by {self.world} ranks: the batches "
                               f"(--nsamples / --batch-size) must be {need} the ranks")
        return list(range(self.rank, count, self.world))

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over all ranks, in place (every rank gets the sum)."""
        if self.world > 1:
            with self._timed():
                dist.all_reduce(tensor, group=self.group)
        return tensor

    def sum_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """`sum` of a small CPU tensor (counts): through the collective's device and back."""
        if self.world == 1 or dist.get_backend(self.group) != "nccl":
            return self.sum(counts)
        return self.sum(counts.to(torch.device("cuda", torch.cuda.current_device()))).cpu()

    def reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """`sum_counts` where there are other ranks to sum with, else None (selection stays local)."""
        return self.sum_counts if self.world > 1 else None

    def reduce_factors(self, groups: list[InputGroup]) -> None:
        """Sum each input group's factors (its A once, each layer's G and quadratics) onto its owner, and drop the
        groups this rank does not own from `groups`.

        Every rank holds the same groups in the same order (the hooks'); a group's layers are of one block, so they
        have one owner.
        """
        if self.world == 1:
            return
        owned = []
        for group in groups:
            owner = self.owners[next(iter(group.layers))]
            tensors = [group.A.tiles] + [t for entry in group.layers.values() for t in (
                None if entry.G is None else entry.G.tiles, entry.row_quadratic, entry.col_quadratic)]
            for tensor in tensors:
                if tensor is not None:
                    with self._timed():
                        dist.reduce(tensor, group_dst=owner, group=self.group)
            if owner == self.rank:
                owned.append(group)
        groups[:] = owned

    def gather_layers(self, layers: Sequence[Layer], onto: int | None = None) -> None:
        """Gather the weights of layers sharded by FSDP2 whole: each owner keeps its layers' (`Layer.held`).

        Every rank takes part in every layer's all-gather; the others drop theirs at once, so a rank
        holds its own layers whole (a 1/N share) on top of its shards. `onto`: that rank keeps every
        layer, in host memory (to write a checkpoint).
        """
        for layer in layers:
            if isinstance(layer.module.weight, DTensor):
                with self._timed():
                    whole = [p.full_tensor() for p in layer.parameters() if isinstance(p, DTensor)]
                if onto is not None and onto == self.rank:
                    layer.held = [t.cpu() for t in whole]
                elif onto is None and self.mine(layer.name):
                    layer.held = whole

    def broadcast_layers(self, layers: Sequence[Layer], masks: bool) -> None:
        """Copy each of `layers` from its owner to every rank: weight, bias and, with `masks`, the mask of pruned
        weights. A sharded (FSDP2) layer's owner sends its `held` tensors, and every rank keeps its shard."""
        for layer in layers:
            owner = self.owners[layer.name]
            shards = [p for p in layer.parameters() if isinstance(p, DTensor)]
            if self.world == 1 and not shards:
                continue
            whole = layer.whole() if not shards or owner == self.rank else \
                [torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device) for p in shards]
            if self.world > 1:
                with self._timed():
                    for tensor in whole + ([layer.mask.view(torch.uint8)] if masks else []):
                        dist.broadcast(tensor, group_src=owner, group=self.group)
            if shards:
                layer.assign(whole)
                layer.held = None
