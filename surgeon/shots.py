"""The multi-shot LLM Surgeon loop (paper Algorithm 1) and the baselines in the same loop.

Each shot t: estimate curvature on the current (pruned) model, compute costs, choose what to
remove with one global threshold for the shot's target size α_t, apply the (correlated) update,
keep every pruned weight exactly zero, and optionally run interleaved LoRA corrections.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from surgeon import baselines, channels, curvature, kronecker_sum, solver, threshold
from surgeon.block_inputs import BlockInputs
from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.model import decoder_blocks, max_seqlen, prunable_layers
from surgeon.report import PruneReport, ShotReport, peak_memory_gb, removed_fractions, zero_fraction
from surgeon_kernels.ops import Deferred, PackedSymmetric

logger = logging.getLogger(__name__)

NEEDS_G = ("surgeon", "kobd")
NEEDS_A = ("surgeon", "kobd", "lobd")  # from one whole-model pass per shot
PER_LAYER = ("sparsegpt", "wanda")  # estimate each block's inputs themselves, block by block


@dataclass
class Layer:
    """A prunable layer and what has been removed from it so far (True = pruned)."""

    name: str
    module: nn.Linear
    mask: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor

    @classmethod
    def unpruned(cls, name: str, module: nn.Linear) -> Layer:
        """The layer before any shot: nothing removed."""
        R, C = module.weight.shape
        device = module.weight.device
        return cls(name, module, torch.zeros(R, C, dtype=torch.bool, device=device),
                   torch.zeros(R, dtype=torch.bool, device=device), torch.zeros(C, dtype=torch.bool, device=device))

    @property
    def bias(self) -> bool:
        return self.module.bias is not None

    def weight(self) -> torch.Tensor:
        """[W | b] in float32: the bias is an extra input column (docs/DESIGN.md)."""
        W = self.module.weight.detach().float()
        return torch.cat([W, self.module.bias.detach().float().unsqueeze(1)], 1) if self.bias else W.clone()

    def store(self, W: torch.Tensor) -> None:
        """Write [W | b] back, after checking it is finite, zeroing pruned weights and pruned rows' bias."""
        if not torch.isfinite(W).all():
            raise SurgeonError(f"non-finite weights computed for layer {self.name}; increase damping")
        C = self.module.in_features
        W[:, :C][self.mask] = 0
        W[self.rows] = 0
        self.module.weight.data.copy_(W[:, :C])
        if self.bias:
            self.module.bias.data.copy_(W[:, C])


def _damped_diag(matrix: PackedSymmetric | None, size: int, strength: float, device) -> torch.Tensor:
    """diag(M) + λ·mean(diag M) (`solver.damping`), or ones when the factor is not used (I)."""
    if matrix is None:
        return torch.ones(size, device=device)
    d = matrix.diagonal()
    return d + solver.damping(d, strength)


def _damped_diagonals(entry: curvature.LayerFactors | None, shape: Sequence[int], device: torch.device,
                      config: PruneConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The method's diagonal curvature diag(g) ⊗ diag(a) of an R×C [W | b] (identity where not estimated), damped."""
    return (_damped_diag(entry.G if entry else None, shape[0], config.damp_g, device),
            _damped_diag(entry.A if entry else None, shape[1], config.damp_a, device))


def _element_costs(layer: Layer, weigh: Callable[[torch.Tensor], torch.Tensor],
                   dead: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Element costs `weigh(W)` (eq. 7) of the layer's weights as they are now: dead ones 0, pruned ones −inf."""
    e = weigh(layer.weight())[:, : layer.module.in_features]
    if dead is not None:
        e = e.masked_fill(dead[0].unsqueeze(1) | dead[1].unsqueeze(0), 0)
    return e.masked_fill(layer.mask, float("-inf"))


def _structure_costs(W: torch.Tensor, entry: curvature.LayerFactors, f: solver.Factors | solver.RootFactors,
                     keep_r: torch.Tensor, keep_c: torch.Tensor, real: int,
                     config: PruneConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Costs (eq. 7) of the kept rows and the first `real` kept columns of W, numerators from the curvature pass.

    Removed rows and columns of W are zero, so the pass's diag(W A Wᵀ) and diag(Wᵀ G W) are those
    of the kept block W[keep_r, keep_c]; damping adds δ‖w‖² (`solver.damped_quadratic`) with the
    δ of the damped factors in `f`. A bias column (last in `keep_c`) adds to row costs only.
    """
    assert entry.G is not None and entry.row_quadratic is not None and entry.col_quadratic is not None  # need_g pass
    sub = solver.submatrix(W, keep_r, keep_c)
    row_q = solver.damped_quadratic(entry.row_quadratic[keep_r], sub, entry.A.diagonal()[keep_c], config.damp_a, 1)
    col_q = solver.damped_quadratic(entry.col_quadratic[keep_c[:real]], sub[:, :real], entry.G.diagonal()[keep_r],
                                    config.damp_g, 0)
    return solver.structure_costs(row_q, f.G_inv_diagonal()), solver.structure_costs(col_q, f.A_inv_diagonal()[:real])


def _dead(entry: curvature.LayerFactors, rows, cols, R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of `rows` (of R) and `cols` have an exactly zero raw curvature diagonal.

    Such a row's output never reaches the loss (G_rr = 0: e.g. a gate row whose down-projection
    column was removed) or such a column's input is always zero (A_cc = 0: e.g. the down-projection
    column of a removed gate row). Removing it changes nothing, so its cost is exactly 0 — the
    damped factors alone would price it like a live structure. Rows are never dead without G.
    """
    dead_cols = entry.A.diagonal()[cols] == 0
    if entry.G is None:
        return torch.zeros(R, dtype=torch.bool, device=dead_cols.device)[rows], dead_cols
    return entry.G.diagonal()[rows] == 0, dead_cols


def _with_bias_col(mask: torch.Tensor, layer: Layer, value: bool) -> torch.Tensor:
    """Extend an [R, C] mask with the bias column when the layer has a bias."""
    return torch.cat([mask, mask.new_full((mask.shape[0], 1), value)], 1) if layer.bias else mask


@dataclass
class _Kept:
    """One layer's packed inverses (or inverse roots), kept from its costs to its update.

    Structured shots keep the upper-triangular roots U (U Uᵀ = G⁻¹, `solver.RootFactors`), element
    shots the full inverses; a root or inverse of A is shared by sibling layers.
    """

    G_inv: PackedSymmetric
    A_inv: PackedSymmetric
    roots: bool


class _Unpacker:
    """The dense roots or inverses of each layer's `_Kept`, all an update needs.

    Sibling layers (q/k/v, gate/up) are updated one after another and share one packed A: it is
    unpacked once for all of them.
    """

    def __init__(self) -> None:
        self._last: tuple[PackedSymmetric, torch.Tensor] | None = None

    def __call__(self, kept: _Kept) -> solver.Factors | solver.RootFactors:
        unpack = PackedSymmetric.upper if kept.roots else PackedSymmetric.dense
        if self._last is None or self._last[0] is not kept.A_inv:
            self._last = (kept.A_inv, unpack(kept.A_inv))
        kind = solver.RootFactors if kept.roots else solver.Factors
        return kind(None, None, unpack(kept.G_inv), self._last[1])


def _principal(packed: PackedSymmetric, index) -> torch.Tensor:
    """The principal submatrix M[index, index] of a packed factor (one gather; all of it for a slice)."""
    dense = packed.dense()
    return solver.submatrix(dense, index, index)


class _FactorInverter:
    """Damped G[rows, rows], A[cols, cols] of each layer, their inverses (or inverse roots), packed.

    `roots`: structured shots need only inverse diagonals and a few rows (`solver.RootFactors`:
    one triangular inverse per factor; bench/RESULTS.md: a SmolLM2 shot's prune phase on the
    2-core CPU 11.3-13.5 -> 9.0-11.6 s, a 7B shot's costs on an H100 15-17 -> 11-13 s), element shots the full inverses
    (`solver.Factors`).
    Layers reading the same input (q/k/v, gate/up) come one after another and share the raw A:
    the damped A and its inverse are reused while the same A is asked for with the same columns
    (the slot holds a reference, so an identity match cannot be a recycled object).
    """

    def __init__(self, config: PruneConfig, roots: bool):
        self.config, self.roots = config, roots
        self._invert = solver.inverse_root if roots else solver.spd_inverse
        self._slot: tuple | None = None

    def __call__(self, f: curvature.LayerFactors, rows, cols) -> tuple[solver.Factors | solver.RootFactors, _Kept]:
        assert f.G is not None  # surgeon's curvature pass estimates G
        G = solver.damp(_principal(f.G, rows), self.config.damp_g)
        key = None if isinstance(cols, slice) else cols.tolist()
        if self._slot is None or self._slot[0] is not f.A or self._slot[1] != key:
            A = solver.damp(_principal(f.A, cols), self.config.damp_a)
            A_inv = self._invert(A)
            self._slot = (f.A, key, A, A_inv, PackedSymmetric.pack(A_inv))
        _, _, A, A_inv, A_packed = self._slot
        G_inv = self._invert(G)
        kind = solver.RootFactors if self.roots else solver.Factors
        return kind(G, A, G_inv, A_inv), _Kept(PackedSymmetric.pack(G_inv), A_packed, self.roots)


RETRIES = 3


def _finite_update(name: str, f: solver.Factors | solver.RootFactors | kronecker_sum.KroneckerSum, update,
                   config: PruneConfig) -> torch.Tensor:
    """`update(f)`, retried with 10× stronger damping (up to RETRIES times) while it is not finite.

    The stronger damping is added to G and A recovered from their inverses (the raw factors are
    freed by then). If every retry fails, the non-finite result goes back and `Layer.store`
    refuses it with an error naming the layer, so no NaN weight is ever written.
    """
    W = update(f)
    if isinstance(f, kronecker_sum.KroneckerSum):
        return W  # no single G⁻¹, A⁻¹ to re-damp: a non-finite result is refused by `Layer.store`
    strength = max(config.damp_g, config.damp_a)
    for _ in range(RETRIES):
        if torch.isfinite(W).all():
            break
        strength *= 10
        logger.warning("layer %s: non-finite update; retrying with damping %g", name, strength)
        G_inv, A_inv = f.dense_inverses()
        f = solver.Factors.of(solver.damp(solver.spd_inverse(G_inv), strength),
                              solver.damp(solver.spd_inverse(A_inv), strength)).inverses_only()
        W = update(f)
    return W


def _structured_shot(layers: list[Layer], raw: dict, target_zeros: int, config: PruneConfig,
                     coupled: list[channels.Coupling]) -> tuple[dict[str, float], int]:
    """Rows and columns: costs (eq. 7), global threshold, joint or within update (sec. 3.4).

    The rows and columns that the chosen ones leave dead (`coupled` channels) are removed too and
    count toward the target; they take no part in the updates (their inputs or outputs are gone).

    Between costs and updates each layer keeps only its packed inverses (weights are read again),
    so a shot never holds more than the factors' packed size plus one layer's dense work.
    Returns the seconds spent on costs, threshold and updates, and the number of dead weights freed.
    """
    plans, row_costs, col_costs = [], [], []
    device = layers[0].mask.device
    factors = _FactorInverter(config, roots=True)
    times = [_clock(device)]
    for layer in layers:
        W, R, C = layer.weight(), layer.module.out_features, layer.module.in_features
        keep_r = (~layer.rows).nonzero().squeeze(1)
        real_c = (~layer.cols).nonzero().squeeze(1)  # kept columns that are structures (not the bias)
        keep_c = torch.cat([real_c, real_c.new_tensor([C])]) if layer.bias else real_c
        rows = torch.full((R,), float("-inf"), device=W.device)
        cols = torch.full((C,), float("-inf"), device=W.device)
        entry = raw.pop(layer.name, None)  # frees each raw factor after its last layer
        kept = None
        if config.method == "surgeon":
            f, kept = factors(entry, keep_r, keep_c)
            rc, cc = _structure_costs(W, entry, f, keep_r, keep_c, real_c.numel(), config)
        else:
            g, a = _damped_diagonals(entry, W.shape, W.device, config)
            e = baselines.diagonal_costs(solver.submatrix(W, keep_r, keep_c), g[keep_r], a[keep_c])
            rc, cc = e.sum(1), e.sum(0)[: real_c.numel()]
        if entry is not None:
            dead_r, dead_c = _dead(entry, keep_r, real_c, R)
            rc, cc = rc.masked_fill(dead_r, 0), cc.masked_fill(dead_c, 0)
        rows[keep_r] = rc
        cols[real_c] = cc
        plans.append((keep_r, keep_c, kept))
        row_costs.append(rows)
        col_costs.append(cols)
    times.append(_clock(device))
    with_dead = functools.partial(channels.with_dead, coupled)
    row_sel, col_sel = threshold.structured_selection(row_costs, col_costs, target_zeros, with_dead)
    removed_rows, removed_cols = with_dead(row_sel, col_sel)
    freed = _zeros(removed_rows, removed_cols) - _zeros(row_sel, col_sel)
    times.append(_clock(device))
    unpack = _Unpacker()
    for layer, (keep_r, keep_c, kept), new_rows, new_cols, rows_out, cols_out in zip(
            layers, plans, row_sel, col_sel, removed_rows, removed_cols):
        W = layer.weight()
        if kept is not None:
            p = new_rows[keep_r].nonzero().squeeze(1)
            q = torch.isin(keep_c, new_cols.nonzero().squeeze(1)).nonzero().squeeze(1)
            sub = solver.submatrix(W, keep_r, keep_c)
            solver.put_submatrix(W, keep_r, keep_c, _finite_update(
                layer.name, unpack(kept), lambda g: solver.structured_update_of(sub, g, p, q, config.correlation),
                config))
        layer.rows, layer.cols = rows_out, cols_out
        layer.mask = rows_out.unsqueeze(1) | cols_out.unsqueeze(0)
        layer.store(W)
    times.append(_clock(device))
    return _phases(times), freed


def _zeros(rows: list[torch.Tensor], cols: list[torch.Tensor]) -> int:
    """Weights removed by removing `rows` and `cols` of each layer: RC − (R − p)(C − q)."""
    return sum(r.numel() * c.numel() - int((~r).sum()) * int((~c).sum()) for r, c in zip(rows, cols))


def _element_shot(layers: list[Layer], raw: dict, target_zeros: int, config: PruneConfig) -> dict[str, float]:
    """Elements (unstructured or N:M): costs, global threshold, correlated update (eqs. 4-5).

    Costs are not held: each layer keeps what they are computed from (the inverse diagonals, or the
    diagonal curvature), and the threshold recomputes them when it reads them (`Deferred`). They read
    the layer's weights and mask as they are, so each layer's mask is made before its update.
    Returns the seconds spent on costs, threshold and updates.
    """
    plans, costs = [], []
    factors = _FactorInverter(config, roots=False)
    device = layers[0].mask.device
    times = [_clock(device)]
    for layer in layers:
        R, C = layer.module.out_features, layer.module.in_features
        entry = raw.pop(layer.name, None)  # frees each raw factor after its last layer
        kept: kronecker_sum.KroneckerSum | _Kept | None = None
        if config.method == "surgeon" and entry.G2 is not None:
            kept = kronecker_sum.KroneckerSum.of(solver.damp(entry.G.dense(), config.damp_g),
                                          solver.damp(entry.A.dense(), config.damp_a), entry.G2.dense(),
                                          entry.A2.dense(), config.backend)
            weigh = functools.partial(solver.element_costs_of, f=kept)
        elif config.method == "surgeon":
            f, kept = factors(entry, slice(None), slice(None))
            weigh = functools.partial(solver.element_costs_of, f=solver.InverseDiagonals.of(f))
        else:
            g, a = _damped_diagonals(entry, (R, C + layer.bias), layer.mask.device, config)
            weigh = functools.partial(baselines.diagonal_costs, g=g, a=a)
        dead = _dead(entry, slice(None), slice(0, C), R) if entry is not None else None
        plans.append(kept)
        costs.append(Deferred(R * C, layer.mask.device, functools.partial(_element_costs, layer, weigh, dead)))
    times.append(_clock(device))
    nm = config.nm
    masks = (threshold.nm_selection(costs, *nm, target_zeros, config.backend) if nm
             else threshold.smallest_k(costs, target_zeros, config.backend))
    times.append(_clock(device))
    unpack = _Unpacker()
    for layer, kept, mask in zip(layers, plans, masks):
        layer.mask = mask() | layer.mask  # computed from the layer's costs before its mask and weights change
        W = layer.weight()
        if kept is not None:
            pruned, original = _with_bias_col(layer.mask, layer, False), W
            inverse = kept if isinstance(kept, kronecker_sum.KroneckerSum) else unpack(kept)
            W = _finite_update(layer.name, inverse, lambda g: solver.unstructured_update_of(
                original, g, pruned, config.max_correlate or None, config.chunk_semantics, config.cg_tol,
                config.cg_max_iter, config.backend), config)
        layer.store(W)
    times.append(_clock(device))
    return _phases(times)


def _phases(times: list[float]) -> dict[str, float]:
    """Seconds of costs, threshold and updates from the four clock readings around them."""
    return {name: end - start for name, start, end in zip(("costs", "threshold", "update"), times, times[1:])}


def _per_layer_shot(model: nn.Module, layers: list[Layer], calibration: torch.Tensor, target_size: float,
                    config: PruneConfig, progress: bool) -> None:
    """SparseGPT or Wanda: each layer pruned to the same sparsity with its own algorithm.

    As published, block by block: each block's inputs come from the blocks before it, already
    pruned; the block runs once to estimate its layers' input factors and once, pruned, to give
    the next block's inputs (`BlockInputs`).
    """
    by_name = {layer.name: layer for layer in layers}
    blocks = decoder_blocks(model)
    inputs = BlockInputs(model, blocks, calibration, config.batch_size)
    for named in tqdm(prunable_layers(model), desc="blocks", leave=False, disable=not progress):
        raw = curvature.estimate_inputs(named, inputs.forwards(), calibration.numel(), config.backend,
                                        config.curvature_dtype, config.group_bytes)
        for name, _ in named:
            _prune_one_layer(by_name[name], raw[name].A.dense(), target_size, config)
        inputs.advance()


def _prune_one_layer(layer: Layer, A: torch.Tensor, target_size: float, config: PruneConfig) -> None:
    """SparseGPT's lazy-batch OBS or Wanda's |W|·‖a‖ per row on one layer, given its input factor A."""
    W, C = layer.weight(), layer.module.in_features
    A = A[:C, :C]
    if config.method == "wanda":
        layer.mask = layer.mask | baselines.per_row_mask(
            baselines.wanda_scores(W[:, :C], A.diagonal()), 1 - target_size, layer.mask, config.nm)
    else:
        pruned, mask = baselines.sparsegpt(W[:, :C], A, 1 - target_size, layer.mask, config.nm)
        W[:, :C] = pruned
        layer.mask = mask | layer.mask
    layer.store(W)


def _clock(device: torch.device) -> float:
    """`time.perf_counter()` after the device's queued work has finished (GPU work is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _check_inputs(model: nn.Module, calibration_ids: torch.Tensor) -> None:
    """Refuse a model or calibration batch that `prune` cannot use, naming the argument."""
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers causal LM (e.g. from surgeon.load_model or "
                        f"AutoModelForCausalLM.from_pretrained), not {type(model).__name__}")
    if not isinstance(calibration_ids, torch.Tensor):
        raise TypeError(f"calibration_ids must be a torch.LongTensor [n, seqlen] of token ids (see "
                        f"surgeon.calibration_windows), not {type(calibration_ids).__name__}")
    if calibration_ids.dim() != 2 or calibration_ids.shape[0] < 1 or calibration_ids.shape[1] < 2:
        raise ValueError(f"calibration_ids must have shape [n, seqlen] with n >= 1 and seqlen >= 2, not "
                         f"{list(calibration_ids.shape)} (a single sequence [seqlen] is ids.unsqueeze(0))")
    if calibration_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"calibration_ids must hold integer token ids (torch.long), not {calibration_ids.dtype}")
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and (int(calibration_ids.min()) < 0 or int(calibration_ids.max()) >= vocab):
        raise ValueError(f"calibration_ids holds ids outside the model's vocabulary [0, {vocab})")
    limit = max_seqlen(model)
    if limit is not None and calibration_ids.shape[1] > limit:
        raise ValueError(f"calibration_ids has seqlen {calibration_ids.shape[1]}, longer than the model allows "
                         f"({limit})")


def prune(model: nn.Module, calibration_ids: torch.Tensor, config: PruneConfig, progress: bool = True) -> PruneReport:
    """Prune `model` in place to `config.target_size` in `config.shots` shots (Algorithm 1).

    model: a transformers causal LM whose decoder blocks hold `nn.Linear` layers (embeddings and
        the LM head are never pruned); any dtype and device, its weights change in place.
    calibration_ids: `torch.LongTensor [n, seqlen]`, n windows of token ids (`calibration_windows`).
    config: what to prune and how (`PruneConfig`). progress: draw progress bars (False: silent).
    Returns a `PruneReport`: `sparsity` (fraction of zero prunable weights), `layers` (that fraction
    per layer, by qualified name), `shots` (per shot: target size, sparsity reached, seconds per
    phase, peak memory in GiB), `config` and `seconds`.
    """
    if not isinstance(config, PruneConfig):
        raise TypeError(f"config must be a surgeon.PruneConfig, not {type(config).__name__}")
    _check_inputs(model, calibration_ids)
    named = [pair for block in prunable_layers(model) for pair in block]
    layers = []
    for name, module in named:
        C = module.in_features
        if config.nm and C % config.nm[1]:
            raise SurgeonError(f"{config.structure}: M={config.nm[1]} does not divide the {C} columns of {name}")
        layers.append(Layer.unpruned(name, module))
    if config.method in PER_LAYER and config.nm and config.shots != 1:
        raise SurgeonError(f"{config.method} prunes N:M in one shot; use --shots 1")
    total = sum(layer.module.weight.numel() for layer in layers)
    coupled = channels.couplings(model, [name for name, _ in named])
    device = next(model.parameters()).device
    report = PruneReport(config=dataclasses.asdict(config))
    power_state: dict[str, list[kronecker_sum.PowerIterate]] = {}  # kronecker_terms=2: warm start across shots
    start = time.perf_counter()
    for shot in tqdm(range(1, config.shots + 1), desc="shots", disable=not progress):
        target_size = config.shot_target(shot)
        target_zeros = round((1.0 - target_size) * total)
        t0 = _clock(device)
        raw = {}
        if config.kronecker_terms == 2:
            raw = kronecker_sum.estimate_sum(model, named, calibration_ids, power_state,
                                         config.power_iterations if shot == 1 else 1, fisher=config.fisher,
                                         batch_size=config.batch_size, seed=config.seed + shot,
                                         desc=f"shot {shot}/{config.shots} · curvature", progress=progress)
        elif config.method in NEEDS_A:
            raw = curvature.estimate(model, named, calibration_ids, need_g=config.method in NEEDS_G,
                                     fisher=config.fisher,
                                     batch_size=config.batch_size, seed=config.seed + shot, backend=config.backend,
                                     autocast=config.curvature_dtype, desc=f"shot {shot}/{config.shots} · curvature",
                                     progress=progress, group_bytes=config.group_bytes)
        t1 = _clock(device)
        phases: dict[str, float] = {}
        freed = 0
        with torch.no_grad():
            if config.method in PER_LAYER:  # "prune" time includes their input estimation
                _per_layer_shot(model, layers, calibration_ids, target_size, config, progress)
            elif config.structure == "structured":
                phases, freed = _structured_shot(layers, raw, target_zeros, config, coupled)
            else:
                phases = _element_shot(layers, raw, target_zeros, config)
        t2 = _clock(device)
        seconds = {"curvature": t1 - t0, "prune": t2 - t1, **phases}
        if config.lora_steps:
            from surgeon.lora import lora_correction

            lora_correction(model, layers, calibration_ids, config)
            seconds["lora"] = time.perf_counter() - t2
        _, _, sparsity = removed_fractions([(layer.name, layer.mask) for layer in layers])
        shot_report = ShotReport(shot, target_size, sparsity, freed, seconds, peak_memory_gb(device))
        report.shots.append(shot_report)
        logger.info("shot %d/%d · target size %.3f · sparsity %.4f · %s · peak %.2f GB", shot, config.shots,
                    target_size, sparsity, " · ".join(f"{k} {v:.2f}s" for k, v in seconds.items()),
                    shot_report.peak_memory_gb)
    report.layers, report.removed, report.sparsity = removed_fractions([(layer.name, layer.mask) for layer in layers])
    report.zero_fraction = zero_fraction(named)
    report.seconds = time.perf_counter() - start
    return report
