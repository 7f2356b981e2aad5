"""A drop-in for the SparseGPT reference class: the same calls, SparseGPT's mask and a better update.

Scripts of the SparseGPT and Wanda family build one object per layer, feed it the layer's inputs
and prune::

    from surgeon.integrations.sparsegpt import SparseGPT   # instead of: from sparsegpt import SparseGPT

    gpt = SparseGPT(layer)
    handle = layer.register_forward_hook(lambda m, inp, out: gpt.add_batch(inp[0].data, out.data))
    ...                                    # run the calibration batches
    gpt.fasterprune(0.5)                   # or fasterprune(0, prunen=2, prunem=4) for 2:4
    gpt.free()

The mask is chosen by SparseGPT's own column sweep, exactly as many weights per block of columns.
By default (`update="refine"`) a few conjugate-gradient steps then move every row's kept weights
from the sweep's one-directional updates toward the exact solution (`surgeon.method.solver.refine_rows`):
a lower layer output error for the same H, at little more than SparseGPT's time. `update="exact"`
solves each row exactly (`surgeon.method.solver.solve` with G = I): the lowest error, at several times
the time.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch
from torch import nn

from surgeon.method.solver import REFINE_ITERATIONS, Solution, refine, solve
from surgeon.methods import DEFAULT_DAMP_A

logger = logging.getLogger(__name__)

Update = Literal["refine", "exact"]


def is_conv1d(layer: nn.Module) -> bool:
    """transformers' Conv1D (GPT-2 style), whose weight is stored [in, out]."""
    return type(layer).__name__ == "Conv1D" and type(layer).__module__.startswith("transformers")


def sparsegpt_solve(W: torch.Tensor, H: torch.Tensor, sparsity: float, prunen: int, prunem: int, blocksize: int,
                    percdamp: float, shots: int = 1, update: Update = "refine",
                    iterations: int = REFINE_ITERATIONS) -> Solution:
    """One layer pruned with SparseGPT's arguments: `prunen` of every `prunem` weights removed (0, 0: `sparsity`).

    update "refine": `surgeon.method.solver.refine`, SparseGPT's sweep then `iterations` conjugate-gradient
    steps toward the exact row update; "exact": `surgeon.solve`, every row's kept weights solved
    exactly after each of `shots` sweeps of growing sparsity.
    """
    if prunen and not 0 < prunen <= prunem:
        raise ValueError(f"prunen={prunen}, prunem={prunem}: N:M prunes n of every m weights, 0 < n ≤ m")
    nm = (prunem - prunen, prunem) if prunen else None
    target: dict[str, Any] = dict(nm=nm) if nm else dict(sparsity=sparsity)
    if update == "exact":
        return solve(W, H, blocksize=blocksize, damp_a=percdamp, shots=shots, **target)
    if update != "refine":
        raise ValueError(f"update={update!r}: use refine or exact")
    if shots != 1:
        raise ValueError(f"shots={shots}: several sweeps of growing sparsity need update='exact'")
    return refine(W, H, iterations=iterations, damp_a=percdamp, blocksize=blocksize, **target)


class SparseGPT:
    """One layer's state: `add_batch` accumulates H = (2/n) Σ x xᵀ, `fasterprune` prunes the layer in place."""

    def __init__(self, layer: nn.Module):
        if not (isinstance(layer, nn.Linear) or is_conv1d(layer)):
            raise TypeError(f"SparseGPT prunes nn.Linear and transformers' Conv1D layers, not {type(layer).__name__}")
        self.layer = layer
        self.weight: torch.Tensor = layer.weight  # type: ignore[assignment]  # nn.Linear and Conv1D have one
        self.dev = self.weight.device
        self.rows, self.columns = self._weight().shape
        self.H: torch.Tensor | None = torch.zeros(self.columns, self.columns, device=self.dev)
        self.nsamples = 0
        self.error: float | None = None

    def _weight(self) -> torch.Tensor:
        W = self.weight.data
        return W.t() if is_conv1d(self.layer) else W

    def add_batch(self, inp: torch.Tensor, out: torch.Tensor | None = None, blocksize: int = 1024) -> None:
        """Add a batch of inputs [batch, tokens, C] or [tokens, C] to H, a running mean over batches as SparseGPT's."""
        if self.H is None:
            raise RuntimeError("add_batch after free(): build a new SparseGPT for the layer")
        if inp.shape[-1] != self.columns:
            raise ValueError(f"inputs have {inp.shape[-1]} features; the layer takes {self.columns}")
        if inp.dim() == 2:
            inp = inp.unsqueeze(0)
        batch = inp.shape[0]
        x = inp.reshape(-1, self.columns).t().float()
        self.H *= self.nsamples / (self.nsamples + batch)
        self.nsamples += batch
        x = (2 / self.nsamples) ** 0.5 * x
        self.H += x @ x.t()

    def fasterprune(
        self,
        sparsity: float,
        prunen: int = 0,
        prunem: int = 0,
        blocksize: int = 128,
        percdamp: float = DEFAULT_DAMP_A,
        *,
        prune_n: int | None = None,
        prune_m: int | None = None,
        update: Update = "refine",
        iterations: int = REFINE_ITERATIONS,
        shots: int = 1,
    ) -> None:
        """Prune in place: `sparsity` of each block of `blocksize` columns, or `prunen` of every `prunem` weights.

        Arguments mean what they mean in SparseGPT (`prune_n`/`prune_m` are the Wanda repository's
        spellings); `percdamp` is the damping λ·mean(diag H). `update`: "refine" (`iterations`
        conjugate-gradient steps after the sweep) or "exact" (every row solved exactly; `shots` > 1
        reaches the target in that many sweeps of growing sparsity, each followed by the exact
        update). The quadratic loss ½ tr(ΔW H ΔWᵀ) is kept in `self.error`.
        """
        if self.H is None:
            raise RuntimeError("fasterprune after free(): build a new SparseGPT for the layer")
        if self.nsamples == 0:
            raise RuntimeError("fasterprune before add_batch: H holds no calibration inputs")
        n, m = (prune_n, prune_m) if prune_n is not None or prune_m is not None else (prunen, prunem)
        solution = sparsegpt_solve(self._weight(), self.H, sparsity, n or 0, m or 0, blocksize, percdamp, shots,
                                   update, iterations)
        W = solution.weight.t() if is_conv1d(self.layer) else solution.weight
        self.weight.data = W.to(self.weight.dtype).contiguous()
        self.error = solution.loss
        logger.info("pruned %d×%d layer: %.4f of weights, error %.4g", self.rows, self.columns,
                    float(solution.mask.float().mean()), solution.loss)

    def free(self) -> None:
        """Release H."""
        self.H = None
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()
