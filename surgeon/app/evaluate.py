"""Perplexity with the standard LLM-pruning protocol (SparseGPT, LLM Surgeon).

The test text is tokenized whole and cut into consecutive non-overlapping windows of `seqlen`
tokens; PPL = exp(mean over windows of the mean next-token NLL inside each window). Only the first window begins
with the tokenizer's BOS, as the published tables measure. With `bos` (`eval_bos`) every window begins with it in
place of its first token, the scored tokens unchanged, as the calibration windows and the model's inputs in use do:
Gemma-3 scores windows cut from mid-text without it far worse than its first (bench/RESULTS.md).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from surgeon.app.data import windows_of
from surgeon.errors import SurgeonError
from surgeon.models.adapter import max_seqlen

# Positions per cross-entropy call: its float32 log-softmax temporary is NLL_CHUNK × vocabulary, not
# seqlen × vocabulary (SmolLM2 at 2048 tokens: 100 MB instead of 400 MB; bench/RESULTS.md).
NLL_CHUNK = 512


@dataclass(frozen=True)
class EvalResult:
    """The outcome of one perplexity evaluation."""

    ppl: float
    windows: int
    tokens: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return asdict(self)


def window_count(total_tokens: int, seqlen: int, windows: int | None) -> int:
    """How many whole windows of `seqlen` to evaluate (the first `windows`, or all)."""
    available = total_tokens // seqlen
    if available == 0:
        raise SurgeonError(f"test text has {total_tokens} tokens, fewer than one window of {seqlen}")
    return available if windows is None else min(windows, available)


@torch.no_grad()  # not inference mode: an FSDP2 model's gathered weights must stay usable for autograd later
def perplexity(model: nn.Module, ids: torch.Tensor, seqlen: int, windows: int | None = None, progress: bool = True,
               bos: int | None = None) -> EvalResult:
    """Perplexity of `model` on the first `windows` consecutive windows of `ids` [1, T], each begun with `bos`
    where given (`windows_of`)."""
    limit = max_seqlen(model)
    if limit is not None and seqlen > limit:
        raise SurgeonError(f"seqlen {seqlen} is longer than the model allows ({limit})")
    count = window_count(ids.shape[1], seqlen, windows)
    device = next(model.parameters()).device
    start = time.perf_counter()
    nll_sum = 0.0
    for window in tqdm(windows_of(ids, seqlen, count, bos), desc="eval", disable=not progress, leave=False):
        window = window.unsqueeze(0).to(device)
        logits, targets = model(window).logits[0, :-1], window[0, 1:]
        chunks = [F.cross_entropy(logits[s:s + NLL_CHUNK].float(), targets[s:s + NLL_CHUNK], reduction="sum")
                  for s in range(0, targets.numel(), NLL_CHUNK)]
        nll_sum += torch.stack(chunks).double().sum().item() / targets.numel()  # one host sync per window
    ppl = math.exp(nll_sum / count)
    return EvalResult(ppl=ppl, windows=count, tokens=count * seqlen, seconds=time.perf_counter() - start)
