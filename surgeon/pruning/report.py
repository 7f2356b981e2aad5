"""The pruning report: per-shot timings, per-layer sparsity, final sparsity; serialises to JSON."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm

T = TypeVar("T")


@dataclass
class ShotReport:
    """One shot.

    target_size: fraction of prunable weights to keep after it (α_t); sparsity: fraction removed
    after it; freed: weights removed this shot only because the chosen structures left them dead
    (channel ends, `surgeon.models.channels`), included in `sparsity`; seconds: per phase; peak_memory_gb:
    peak GPU allocation on CUDA, else the process's peak resident memory, in GiB; ppl: perplexity
    after the shot when the run evaluates every shot (`--eval-every-shot`), else None.
    """

    shot: int
    target_size: float
    sparsity: float
    freed: int
    seconds: dict[str, float]
    peak_memory_gb: float
    ppl: float | None = None


@dataclass
class PruneReport:
    """The whole run.

    config: the `PruneConfig` as a dict; shots: one `ShotReport` each; layers: fraction of each
    layer's weights removed, by qualified module name; removed: prunable weights removed (biases
    not counted); sparsity: removed / all prunable weights, which the target counts; block_sparsity:
    removed / all parameters of the decoder blocks (weights left out, biases and norms included);
    zero_fraction: fraction of prunable weights that are zero now, those that were zero before
    pruning included; seconds: wall time; choice: where the run was weighed against one shot of its method's
    alternative (`PruneConfig.held_out_choice`), the method kept, each one's held-out loss and the seconds of that
    shot, else None; warnings: what the run could not do as set (a held-out choice skipped), one line each.
    """

    config: dict[str, Any]
    shots: list[ShotReport] = field(default_factory=list)
    layers: dict[str, float] = field(default_factory=dict)
    removed: int = 0
    sparsity: float = 0.0
    block_sparsity: float = 0.0
    zero_fraction: float = 0.0
    seconds: float = 0.0
    choice: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return asdict(self)


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory so far: GPU allocations on CUDA, the process's peak RSS otherwise."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kilobytes / (2**30 if sys.platform == "darwin" else 2**20)


def removed_fractions(masks: Iterable[tuple[str, torch.Tensor]]) -> tuple[dict[str, float], int, float]:
    """Per layer the fraction removed (mask True), the number removed and that fraction overall; the masks are read
    one at a time (a structured run builds each when it is read)."""
    per_layer, removed, total = {}, 0, 0
    for name, mask in masks:
        count = int(mask.sum())
        per_layer[name], removed, total = count / mask.numel(), removed + count, total + mask.numel()
    return per_layer, removed, removed / total


def _zeros(weight: torch.Tensor) -> int:
    """Zero entries of `weight`; of all its shards when FSDP2 shards it (every rank must call)."""
    if not isinstance(weight, DTensor):
        return int((weight == 0).sum())
    local = weight.to_local()
    count = (local == 0).sum().reshape(1)
    dist.all_reduce(count, group=weight.device_mesh.get_group())
    return int(count)


def zero_fraction(layers: list[tuple[str, nn.Linear]]) -> float:
    """Fraction of zero weights over all `layers` (biases not counted)."""
    return sum(_zeros(m.weight) for _, m in layers) / sum(m.weight.numel() for _, m in layers)


def clock(device: torch.device) -> float:
    """`time.perf_counter()` after the device's queued work has finished (GPU work is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def bar(items: Iterable[T] | None, desc: str | None, shown: bool, total: int | None = None) -> tqdm[T]:
    """A progress bar over `items` (None: one updated by hand) named `desc`, left behind by none; hidden unless
    `shown`."""
    return tqdm(items, desc=desc, total=total, leave=False, disable=not shown)


def ticker(progress: tqdm[Any], label: str, every: float = 1.0) -> Callable[[int], None]:
    """A callback that shows `label` and the count it is given beside `progress`, redrawn at most every `every`
    seconds: a bar that moves while one long step (a layer's conjugate gradients) runs."""
    last = [time.monotonic()]

    def tick(count: int) -> None:
        if time.monotonic() - last[0] >= every:
            progress.set_postfix_str(f"{label} {count}")
            last[0] = time.monotonic()

    return tick


def phases(times: list[float]) -> dict[str, float]:
    """Seconds of costs, threshold and updates from the four clock readings around them."""
    return {name: end - start for name, start, end in zip(("costs", "threshold", "update"), times, times[1:])}
