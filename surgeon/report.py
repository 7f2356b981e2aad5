"""The pruning report: per-shot timings, per-layer sparsity, final sparsity; serialises to JSON."""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field

import torch
from torch import nn


@dataclass
class ShotReport:
    """One shot: its target size, the sparsity reached, and seconds per phase."""

    shot: int
    target_size: float
    sparsity: float
    seconds: dict[str, float]
    peak_memory_gb: float


@dataclass
class PruneReport:
    """The whole run: configuration, shots, per-layer and overall sparsity."""

    config: dict
    shots: list[ShotReport] = field(default_factory=list)
    layers: dict[str, float] = field(default_factory=dict)
    sparsity: float = 0.0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready dictionary."""
        return asdict(self)


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory so far: GPU allocations on CUDA, the process's peak RSS otherwise."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kilobytes / (2**30 if sys.platform == "darwin" else 2**20)


def layer_sparsity(layers: list[tuple[str, nn.Linear]]) -> tuple[dict[str, float], float]:
    """Fraction of zero weights per layer and over all prunable weights (biases not counted)."""
    per_layer, zeros, total = {}, 0, 0
    for name, module in layers:
        z = int((module.weight == 0).sum())
        per_layer[name] = z / module.weight.numel()
        zeros += z
        total += module.weight.numel()
    return per_layer, zeros / total
