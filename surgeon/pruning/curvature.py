"""Kronecker factors G ⊗ A of every prunable layer from one pass over the calibration data (eq. 6).

Forward pre-hooks add each layer's inputs to A, and tensor hooks on the layer outputs add the
output gradients to G during the backward pass; A = (1/√N) Σ a aᵀ and G = (1/√N) Σ g gᵀ over the N
calibration tokens. Only input gradients are computed (weights do not require grad). Layers that
read the same input tensor (q/k/v, gate/up) share one A: the pass returns them as one input group
(`InputGroup`). A layer with a bias gets an extra constant-1 input column in A. Factors are
accumulated in packed symmetric form
(`surgeon_kernels.symmetric.PackedSymmetric`: upper-triangle tiles, about half the memory).
On CUDA the hooks queue their tensors and add them in grouped launches (`ops.kfac_accumulate_group`,
about a block's layers at a time, `group_bytes`), so narrow factors share the GPU instead of each
filling a small grid; on the CPU each tensor is added at once (grouping measured no faster there,
bench/RESULTS.md, and holding activations costs memory).

The same pass gives the numerators of the structured costs (eq. 7) without a GEMM: for a row,
w_rᵀ A w_r = (1/√N) Σ_n y_nr² (the layer's squared outputs, bias included); for a column,
w_cᵀ G w_c = (1/√N) Σ_n (g_n W)_c² (the squared gradient the layer passes to its input, which
the backward pass computes anyway).

Two ways to hold less during the pass (docs/DESIGN.md, "Memory design"): activation checkpointing
of the decoder blocks (`checkpoint_blocks`: a block keeps only its inputs and runs again in the
backward pass, where the hooks skip it), and factors kept in host memory (`PruneConfig.offload`,
`InputGroup.to`), filled by one pass per group of blocks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from surgeon.errors import SurgeonError
from surgeon.method.factors import InputGroup, LayerFactors, by_layer, input_owner
from surgeon_kernels import ops
from surgeon_kernels.ops import PackedSymmetric

# Bytes of queued activations/gradients after which the hooks launch one grouped accumulation, per
# device type when `group_bytes` is not given (0: add each tensor at once). 512 MiB holds about one
# Llama-2-7B block at 4096 tokens.
DEFAULT_GROUP_BYTES: Mapping[str, int] = MappingProxyType({"cuda": 1 << 29})


def _group_bytes(device: torch.device, group_bytes: int | None) -> int:
    return DEFAULT_GROUP_BYTES.get(device.type, 0) if group_bytes is None else group_bytes


def _square_sums(t: torch.Tensor) -> torch.Tensor:
    """Σ over all tokens of t² per feature (last dimension), in float32 at least."""
    flat = t.detach().reshape(-1, t.shape[-1])
    return flat.to(torch.promote_types(t.dtype, torch.float32)).square().sum(0)  # 4-7x vector_norm(dim=0) on the CPU


def _accumulate(total: torch.Tensor | None, term: torch.Tensor) -> torch.Tensor:
    """total + term, where a missing total counts as zero."""
    return term if total is None else total.add_(term)


@contextmanager
def _layer_hooks(layers: list[tuple[str, nn.Linear]],
                 before: Callable[[str, nn.Linear, tuple[Any, ...]], tuple[Any, ...] | None],
                 after: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """`before(name, module, args)` as each layer's forward pre-hook (its return value replaces the
    args when not None) and `after(name, output)` as its forward hook, removed on exit."""
    handles = []
    for name, module in layers:
        handles.append(module.register_forward_pre_hook(lambda mod, args, name=name: before(name, mod, args)))
        handles.append(module.register_forward_hook(lambda mod, args, out, name=name: after(name, out)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _check_finite(name: str, entry: LayerFactors) -> None:
    """Raise naming the layer and factor if any factor of `entry` holds a NaN or an infinity."""
    for label in ("A", "G"):
        factor = getattr(entry, label)
        if factor is not None and not factor.isfinite():
            raise SurgeonError(f"non-finite curvature ({label}) in layer {name}: check the model dtype and data")


class _Collector:
    """Hooks that accumulate A (before each layer runs) and G (backward) for a list of linear layers.

    With G, each layer reads its own alias of its input (`x.view_as(x)`): the gradient reaching the
    alias is what this layer alone passes back (g W), even where siblings read the same x. While
    `recomputing` (a checkpointed block run again in the backward pass) the hooks add nothing: its
    inputs were counted when it first ran, and its outputs' gradients reach the first run's tensors.
    """

    def __init__(self, layers: list[tuple[str, nn.Linear]], tokens: int, need_g: bool, backend: str,
                 group_bytes: int = 0):
        self.layers, self.need_g, self.backend, self.group_bytes = layers, need_g, backend, group_bytes
        self.scale = 1.0 / math.sqrt(tokens)
        self.factors: dict[str, LayerFactors] = {}
        self.groups: dict[str, InputGroup] = {}  # by the layer that holds the group's A, in the order they ran
        self.owner: dict[str, str] = {}
        self._last: tuple[str, torch.Tensor, bool] | None = None  # the layer run last: name, input, bias
        self._queue: list[tuple[str, PackedSymmetric, torch.Tensor, bool, int]] = []
        self._queued_bytes = 0
        self.recomputing = False

    @contextmanager
    def recompute(self) -> Iterator[None]:
        """The hooks pass over the layers run inside (a checkpointed block's second forward)."""
        self.recomputing = True
        try:
            yield
        finally:
            self.recomputing = False

    def _add(self, name: str, out: PackedSymmetric, x: torch.Tensor, bias: bool) -> None:
        """Queue `x` for accumulation into `out`; launch the queue once it holds `group_bytes`."""
        self._queue.append((name, out, x, bias, x._version))
        self._queued_bytes += x.numel() * x.element_size()
        if self._queued_bytes >= self.group_bytes:
            self.flush()

    def flush(self) -> None:
        """Accumulate every queued tensor in one grouped launch (eq. 6)."""
        if not self._queue:
            return
        for name, _, x, _, version in self._queue:
            if x._version != version:
                raise SurgeonError(f"the input or output gradient of layer {name} was modified in place before its "
                                   "curvature was accumulated; pass group_bytes=0 to curvature.estimate for this model")
        _, outs, xs, biases, _ = zip(*self._queue)
        self._queue, self._queued_bytes = [], 0
        ops.kfac_accumulate_group(outs, xs, self.scale, biases, self.backend)

    def _before(self, name: str, module: nn.Linear, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0]
        if self.recomputing:  # the same alias as the first run, so that the block saves the same tensors
            return (x.view_as(x), *args[1:]) if self.need_g and x.requires_grad else None
        bias = module.bias is not None
        if name not in self.owner:
            self.owner[name] = owner = input_owner(self.owner, self._last, name, x, bias)
            if owner == name:
                self.groups[name] = InputGroup(PackedSymmetric.zeros(module.in_features + int(bias), x.device), {})
            group = self.groups[owner]
            group.layers[name] = self.factors[name] = LayerFactors(group.A, None)
        self._last = (name, x, bias)
        if self.owner[name] == name:
            self._add(name, self.factors[name].A, x.detach().reshape(-1, x.shape[-1]), bias)
        if not (self.need_g and x.requires_grad):
            return None
        alias = x.view_as(x)
        alias.register_hook(lambda g, name=name: self._passed(name, g))
        return (alias, *args[1:])

    def _after(self, name: str, output: torch.Tensor) -> None:
        if self.need_g and output.requires_grad and not self.recomputing:
            entry = self.factors[name]
            entry.row_quadratic = _accumulate(entry.row_quadratic, self.scale * _square_sums(output))
            output.register_hook(lambda g, name=name: self._backward(name, g))

    def _backward(self, name: str, grad: torch.Tensor) -> None:
        entry = self.factors[name]
        if entry.G is None:
            entry.G = PackedSymmetric.zeros(grad.shape[-1], grad.device)
        self._add(name, entry.G, grad.reshape(-1, grad.shape[-1]), False)

    def _passed(self, name: str, grad: torch.Tensor) -> None:
        entry = self.factors[name]
        entry.col_quadratic = _accumulate(entry.col_quadratic, self.scale * _square_sums(grad))

    @contextmanager
    def hooks(self) -> Iterator[_Collector]:
        try:
            with _layer_hooks(self.layers, self._before, self._after):
                yield self
        finally:
            self._last = None


@contextmanager
def _checkpointed(blocks: Sequence[nn.Module],
                  recomputing: Callable[[], AbstractContextManager[None]]) -> Iterator[None]:
    """Each of `blocks` run under activation checkpointing (`torch.utils.checkpoint`, non-reentrant): the forward
    keeps only the block's inputs, and the backward runs the block again inside `recomputing()`."""
    from torch.utils.checkpoint import checkpoint

    def contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        return nullcontext(), recomputing()

    own = [block.__dict__.get("forward") for block in blocks]  # a forward set on the instance, kept
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False, context_fn=contexts)
    try:
        yield
    finally:
        for block, forward in zip(blocks, own):
            if forward is None:
                del block.forward
            else:
                block.forward = forward


@contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """Weights do not require grad inside the block (only input gradients are computed)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def sampled_labels(probs: torch.Tensor, windows: Sequence[int], seed: int) -> torch.Tensor:
    """A next token per position drawn from the model's own predictions `probs` [B, L, V]: one uniform per position
    from a CPU generator seeded by (`seed`, the window's index in the calibration set), inverted through the
    cumulative distribution, so that the labels depend on neither the batch size, the ranks nor the device."""
    draws = [torch.rand(probs.shape[1], generator=torch.Generator().manual_seed(seed * 1_000_003 + window),
                        dtype=torch.float64) for window in windows]
    uniform = torch.stack(draws).to(device=probs.device, dtype=probs.dtype)
    cumulative = probs.cumsum(-1)
    labels = torch.searchsorted(cumulative, (uniform * cumulative[..., -1]).unsqueeze(-1)).squeeze(-1)
    return labels.clamp_(max=probs.shape[-1] - 1)


def _logit_gradient(logits: torch.Tensor, batch: torch.Tensor, sampled: tuple[Sequence[int], int] | None = None
                    ) -> torch.Tensor:
    """∂/∂z of the summed next-token loss −Σ_n log softmax(z_n)[y_n]: softmax(z_n) − e_{y_n}, zero at the last
    position (it has no next token).

    Labels y are the data's next tokens (the empirical Fisher, as the paper uses), or with `sampled` (the windows'
    indices and the seed) tokens drawn from the model's own predictions (`sampled_labels`: the Fisher of eq. 6 as
    an expectation over the model's distribution, one sample per position). Written out rather than by autograd
    through `F.cross_entropy`, whose log-softmax output, zero-filled NLL gradient and log-softmax backward are three
    more [L, vocabulary] passes (their cost: bench/RESULTS.md).
    """
    probs = torch.softmax(logits.detach(), dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    labels = batch[:, 1:] if sampled is None else sampled_labels(probs[:, :-1], *sampled)
    probs[:, -1] = 0
    probs[:, :-1].scatter_add_(-1, labels.unsqueeze(-1), probs.new_full(labels.shape, -1.0).unsqueeze(-1))
    return probs.to(logits.dtype)


def backward(model: nn.Module, batch: torch.Tensor, sampled: tuple[Sequence[int], int] | None = None) -> None:
    """One forward and input-gradient backward pass of the loss summed over the batch's tokens, its labels the
    data's or, with `sampled` (the windows' indices, the seed), drawn from the model (`_logit_gradient`).

    The gradient starts at the embeddings' output, made a leaf that requires grad by a hook inside
    the model's own forward (so a model sharded by FSDP2 gathers its embedding weights as usual).
    """
    embedding: nn.Module = model.get_input_embeddings()  # type: ignore[operator]  # a transformers model
    handle = embedding.register_forward_hook(lambda module, args, out: out.detach().requires_grad_(True))
    try:
        logits = model(batch, use_cache=False).logits
    finally:
        handle.remove()
    logits.backward(_logit_gradient(logits, batch, sampled))


def _collect(
    layers: list[tuple[str, nn.Linear]], passes: Iterable[Callable[[], object]], tokens: int, need_g: bool,
    backend: str, group_bytes: int | None, checkpoint_blocks: Sequence[nn.Module] = (),
) -> list[InputGroup]:
    """The factors (eq. 6) that the hooks on `layers` accumulate while each of `passes` runs, checked finite, by
    input group; `checkpoint_blocks` run under activation checkpointing."""
    device = layers[0][1].weight.device
    collector = _Collector(layers, tokens, need_g, backend, _group_bytes(device, group_bytes))
    with collector.hooks(), _checkpointed(checkpoint_blocks, collector.recompute):
        for run in passes:
            run()
            collector.flush()
    unreached = [name for name, _ in layers if name not in collector.factors]
    if unreached:  # a Mixture-of-Experts expert that the router never chose for a calibration token
        raise SurgeonError(f"no calibration token reached {len(unreached)} layers ({', '.join(unreached[:3])}"
                           f"{', …' if len(unreached) > 3 else ''}): calibrate on more windows (--nsamples) or "
                           "leave them out (--leave-out)")
    for name, entry in collector.factors.items():
        _check_finite(name, entry)
    return list(collector.groups.values())


@torch.no_grad()
def _forward(model: nn.Module, batch: torch.Tensor) -> None:
    model(batch)


def estimate(
    model: nn.Module,
    layers: list[tuple[str, nn.Linear]],
    windows: torch.Tensor,
    need_g: bool = True,
    batch_size: int = 1,
    backend: str = "auto",
    desc: str = "curvature",
    progress: bool = True,
    group_bytes: int | None = None,
    batches: Sequence[int] | None = None,
    checkpoint_blocks: Sequence[nn.Module] = (),
    sampled_seed: int | None = None,
) -> list[InputGroup]:
    """Kronecker factors (A, and G when `need_g`) of `layers` over calibration `windows` [n, L] (eq. 6), by input
    group: the layers that read one input share its A (`InputGroup`).

    `group_bytes`: queued bytes per grouped accumulation (None: `DEFAULT_GROUP_BYTES` of the device).
    `batches`: the indices of the batches of `batch_size` windows to run (None: all), each scaled as
    part of all the windows, so that the factors of all shares sum to those of all the windows.
    `checkpoint_blocks`: modules (the decoder blocks) run under activation checkpointing, the same
    factors for less activation memory and one more forward.
    `sampled_seed`: G from labels drawn from the model with this seed (`sampled_labels`), not the data's.
    """
    device = next(model.parameters()).device
    split = windows.to(device).split(batch_size)  # one copy: a copy from pageable memory waits for the device
    chosen = range(len(split)) if batches is None else batches
    sampled = {i: (range(i * batch_size, i * batch_size + len(split[i])), sampled_seed) for i in chosen} \
        if sampled_seed is not None else {}
    passes = (functools.partial(backward, model, split[i], sampled.get(i)) if need_g else
              functools.partial(_forward, model, split[i]) for i in tqdm(chosen, desc=desc, leave=False,
                                                                          disable=not progress))
    with frozen(model):
        factors = _collect(layers, passes, windows.numel(), need_g, backend, group_bytes,
                           checkpoint_blocks if need_g else ())
    for name, entry in by_layer(factors).items():
        if need_g and entry.G is None:
            raise SurgeonError(f"layer {name} received no gradient: it does not affect the loss")
        if need_g and entry.col_quadratic is None:
            raise SurgeonError(f"layer {name} passed no gradient to its input: it does not depend on the embeddings")
    return factors


def estimate_inputs(
    layers: list[tuple[str, nn.Linear]], forwards: Iterable[Callable[[], object]], tokens: int,
    backend: str = "auto", group_bytes: int | None = None,
) -> list[InputGroup]:
    """The input factors A of `layers` (eq. 6) over `tokens` tokens, by input group, from calling each of
    `forwards`.

    Each callable runs one batch through the layers (e.g. one decoder block on its cached inputs,
    as SparseGPT and Wanda prune block by block); no gradients are computed.
    """
    with torch.no_grad():
        return _collect(layers, forwards, tokens, False, backend, group_bytes)
