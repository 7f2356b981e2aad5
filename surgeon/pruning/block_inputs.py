"""The inputs of one decoder block at a time, cached: each block runs once per pass, as SparseGPT does.

The first block's inputs (hidden states and the keyword arguments the model passes every block:
attention mask, position embeddings, …) are caught once per calibration batch; after a block is
done with, running it on its cached inputs gives the next block's. A pass over L blocks is L
block forwards per batch instead of the L(L+1)/2 of a forward from the embeddings for each block.
Holds one block's inputs for all calibration windows (n × seqlen × hidden in the model's dtype).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class _Caught(Exception):
    """Ends a forward pass at the first block, once its inputs are caught."""


class BlockInputs:
    """Per calibration batch, the positional and keyword arguments of the current decoder block."""

    def __init__(self, model: nn.Module, blocks: nn.ModuleList, windows: torch.Tensor, batch_size: int):
        self.blocks = blocks
        self.index = 0
        self.batches: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        device = next(model.parameters()).device

        def catch(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.batches.append((args, kwargs))
            raise _Caught

        handle = blocks[0].register_forward_pre_hook(catch, with_kwargs=True)
        try:
            with torch.no_grad():
                for batch in windows.split(batch_size):
                    with contextlib.suppress(_Caught):
                        model(batch.to(device), use_cache=False)
        finally:
            handle.remove()

    def forwards(self, done: Callable[[], object] = lambda: None) -> list[Callable[[], object]]:
        """One callable per batch that runs the current block on its cached inputs, then calls `done` (a progress
        bar's update)."""
        block = self.blocks[self.index]

        def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
            output = block(*args, **kwargs)
            done()
            return output

        return [functools.partial(run, args, kwargs) for args, kwargs in self.batches]

    @torch.no_grad()
    def advance(self, done: Callable[[], object] = lambda: None) -> None:
        """Run the current block (as it is now, e.g. pruned) on its inputs, calling `done` after each batch: they
        become the next block's."""
        block = self.blocks[self.index]
        advanced = []
        for args, kwargs in self.batches:
            output = block(*args, **kwargs)
            done()
            hidden = output[0] if isinstance(output, (tuple, list)) else output
            if args:
                advanced.append(((hidden, *args[1:]), kwargs))
            else:
                advanced.append(((), {**kwargs, "hidden_states": hidden}))
        self.batches = advanced
        self.index += 1
