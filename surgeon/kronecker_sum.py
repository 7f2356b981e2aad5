"""The sum of two Kronecker factors F̃ = G ⊗ A + G₂ ⊗ A₂ (paper appendix, "Extending curvature").

`estimate_sum` fits the nearest such sum to each layer's F = Σ_n (g_n g_nᵀ) ⊗ (a_n a_nᵀ) by the
Kronecker power method with deflation (one pass over the data per iteration, warm-started across
shots); `KroneckerSum` is F̃⁻¹ through a simultaneous diagonalisation of (G, G₂) and (A, A₂), with
the same `element_diagonal` and `apply` that element costs and the joint update read of
`inverses.KroneckerInverse`. Off by default (`--kronecker-terms 2`): measured far worse than G ⊗ A on
SmolLM2 (bench/RESULTS.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from surgeon.curvature import LayerFactors, _backward, _check_finite, _frozen, _layer_hooks
from surgeon.errors import SurgeonError
from surgeon.inverses import inverse_root
from surgeon_kernels import ops
from surgeon_kernels.ops import PackedSymmetric

SUM_FLOOR = 1e-2  # KroneckerSum: 1 + s_G s_A floored here, so F̃ keeps ≥ 1% of its first term in every direction


def simultaneous_diagonalisation(M1: torch.Tensor, M2: torch.Tensor,
                                 backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """K and s with Kᵀ M1 K = I and Kᵀ M2 K = diag(s), for SPD M1 and symmetric M2.

    K = L⁻ᵀ E with M1 = L Lᵀ and L⁻¹ M2 L⁻ᵀ = E diag(s) Eᵀ (`ops.batched_eigh`).
    """
    root = inverse_root(M1)  # U = L⁻ᵀ
    inner = root.T @ M2 @ root
    values, vectors = ops.batched_eigh(((inner + inner.T) / 2).unsqueeze(0), backend=backend)
    return root @ vectors.squeeze(0), values.squeeze(0)


@dataclass(frozen=True)
class KroneckerSum:
    """F̃⁻¹ for the sum of two Kronecker factors F̃ = G₁ ⊗ A₁ + G₂ ⊗ A₂ (paper app. "Extending curvature").

    With K_G, s_G from `simultaneous_diagonalisation(G₁, G₂)` (K_A, s_A likewise),
    F̃ = (K_G ⊗ K_A)⁻ᵀ (I ⊗ I + S_G ⊗ S_A) (K_G ⊗ K_A)⁻¹, so
    F̃⁻¹ vec(V) = vec(K_G [(K_Gᵀ V K_A) ⊙ D] K_Aᵀ) with D = 1 / (1 + s_G s_Aᵀ) [R, C], and
    [F̃⁻¹]_(rc),(rc) = [(K_G ∘ K_G) D (K_A ∘ K_A)ᵀ]_rc. G₁, A₁ are damped (SPD); 1 + s_G s_A is
    floored at `SUM_FLOOR` where the second term would cancel the first.
    """

    K_G: torch.Tensor
    K_A: torch.Tensor
    D: torch.Tensor

    @classmethod
    def of(cls, G1: torch.Tensor, A1: torch.Tensor, G2: torch.Tensor, A2: torch.Tensor,
           backend: str = "auto") -> KroneckerSum:
        """Diagonalise both pairs once for all costs and updates of a layer."""
        K_G, s_G = simultaneous_diagonalisation(G1, G2, backend)
        K_A, s_A = simultaneous_diagonalisation(A1, A2, backend)
        return cls(K_G, K_A, 1.0 / (1.0 + torch.outer(s_G, s_A)).clamp_min(SUM_FLOOR))

    def element_diagonal(self) -> torch.Tensor:
        """[F̃⁻¹]_(rc),(rc) as an [R, C] matrix."""
        return self.K_G.square() @ self.D @ self.K_A.square().T

    def apply(self, V: torch.Tensor) -> torch.Tensor:
        """F̃⁻¹ vec(V) as a matrix (four GEMMs)."""
        return self.K_G @ ((self.K_G.T @ V @ self.K_A) * self.D) @ self.K_A.T


@dataclass
class PowerIterate:
    """One Kronecker term σ Ĝ ⊗ Â of a layer: unit-Frobenius Ĝ [R, R], Â [C, C] and its scale σ."""

    G: torch.Tensor
    A: torch.Tensor
    sigma: float

    @classmethod
    def identity(cls, R: int, C: int, device) -> PowerIterate:
        """The start of the power method: Ĝ = I/√R, Â = I/√C, no scale yet."""
        return cls(torch.eye(R, device=device) / math.sqrt(R), torch.eye(C, device=device) / math.sqrt(C), 0.0)


def _quadratic(x: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    """x_nᵀ M x_n for every row n of x."""
    return ((x @ M) * x).sum(1)


class _PowerCollector:
    """Hooks of one pass of the Kronecker power method (paper appendix, "Power method and deflation").

    With F = Σ_n (g_n g_nᵀ) ⊗ (a_n a_nᵀ) over the calibration tokens (what G ⊗ A approximates),
    R(F) vec(Â) = Σ_n (a_nᵀ Â a_n) g_n g_nᵀ and R(F)ᵀ vec(Ĝ) = Σ_n (g_nᵀ Ĝ g_n) a_n a_nᵀ. The forward
    hook keeps each layer's a_n (bias column included) and a_nᵀ Â_t a_n for every term t; the
    backward hook adds both sums. Both use the previous iterates, so one pass is one iteration.
    """

    def __init__(self, layers: list[tuple[str, nn.Linear]], state: dict[str, list[PowerIterate]]):
        self.layers, self.state = layers, state
        self.sums: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._inputs: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}

    def _before(self, name: str, module: nn.Linear, args: tuple) -> None:
        a = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        if module.bias is not None:
            a = torch.cat([a, a.new_ones(a.shape[0], 1)], 1)
        self._inputs[name] = (a, [_quadratic(a, term.A) for term in self.state[name]])

    def _after(self, name: str, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(lambda g, name=name: self._backward(name, g))

    def _backward(self, name: str, grad: torch.Tensor) -> None:
        g = grad.reshape(-1, grad.shape[-1]).float()
        a, weights = self._inputs.pop(name)
        terms = self.state[name]
        if name not in self.sums:
            self.sums[name] = [(g.new_zeros(g.shape[1], g.shape[1]), a.new_zeros(a.shape[1], a.shape[1]))
                               for _ in terms]
        for (G_sum, A_sum), w, term in zip(self.sums[name], weights, terms):
            G_sum.addmm_((g * w.unsqueeze(1)).T, g)
            A_sum.addmm_((a * _quadratic(g, term.G).unsqueeze(1)).T, a)

    @contextmanager
    def hooks(self) -> Iterator[_PowerCollector]:
        with _layer_hooks(self.layers, self._before, self._after):
            yield self


def power_step(terms: list[PowerIterate], sums: list[tuple[torch.Tensor, torch.Tensor]]) -> list[PowerIterate]:
    """The next iterates from one pass's sums R(F) vec(Â_t), R(F)ᵀ vec(Ĝ_t) (paper appendix, power method).

    Term 2 is deflated by term 1: R(F − σ₁ Ĝ₁ ⊗ Â₁) vec(Â₂) = R(F) vec(Â₂) − σ₁ Ĝ₁ ⟨Â₁, Â₂⟩ (and
    likewise for Ĝ₂). Ĝ' = R Â/‖R Â‖; Â' = ±Rᵀ Ĝ/‖Rᵀ Ĝ‖, its sign kept along the previous Â (so the
    term's sign follows R Â = σ Ĝ'); σ' = (‖R Â‖ ‖Rᵀ Ĝ‖)^½.
    """
    new = []
    for index, (term, (G_sum, A_sum)) in enumerate(zip(terms, sums)):
        if index == 1:
            first = terms[0]
            G_sum = G_sum - first.sigma * (first.A * term.A).sum() * first.G
            A_sum = A_sum - first.sigma * (first.G * term.G).sum() * first.A
        G_sum, A_sum = (G_sum + G_sum.T) / 2, (A_sum + A_sum.T) / 2
        g_norm, a_norm = float(torch.linalg.matrix_norm(G_sum)), float(torch.linalg.matrix_norm(A_sum))
        if g_norm == 0 or a_norm == 0:  # the layer does not reach the loss: no term
            new.append(PowerIterate(term.G, term.A, 0.0))
            continue
        A_new = A_sum / a_norm
        if (A_new * term.A).sum() < 0:
            A_new = -A_new
        new.append(PowerIterate(G_sum / g_norm, A_new, math.sqrt(g_norm * a_norm)))
    return new


def estimate_sum(
    model: nn.Module,
    layers: list[tuple[str, nn.Linear]],
    windows: torch.Tensor,
    state: dict[str, list[PowerIterate]],
    iterations: int,
    fisher: str = "empirical",
    batch_size: int = 1,
    seed: int = 0,
    desc: str = "curvature",
    progress: bool = True,
) -> dict[str, LayerFactors]:
    """The nearest sum of two Kronecker factors G ⊗ A + G2 ⊗ A2 of each layer's F (paper appendix).

    `iterations` passes of the power method over `windows`, warm-started from `state` (name →
    iterates, updated in place: pass it again at the next shot, where one pass suffices). A layer's
    first pass starts term 1 from the identity; term 2 (deflated) joins once term 1 has a scale.
    Returns raw (undamped) factors: G, A = √σ₁ Ĝ₁, √σ₁ Â₁ and G2, A2 = √σ₂ Ĝ₂, √σ₂ Â₂.
    """
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    for iteration in range(iterations):
        for name, module in layers:
            if name not in state:
                state[name] = [PowerIterate.identity(module.out_features,
                                                     module.in_features + int(module.bias is not None), device)]
            terms = state[name]
            if len(terms) == 1 and terms[0].sigma > 0:
                terms.append(PowerIterate.identity(terms[0].G.shape[0], terms[0].A.shape[0], device))
        collector = _PowerCollector(layers, state)
        with collector.hooks(), _frozen(model):
            for batch in tqdm(windows.split(batch_size), desc=f"{desc} (power {iteration + 1}/{iterations})",
                              leave=False, disable=not progress):
                _backward(model, batch.to(device), fisher, generator)
        for name, _ in layers:
            if name not in collector.sums:
                raise SurgeonError(f"layer {name} received no gradient: it does not affect the loss")
            state[name] = power_step(state[name], collector.sums[name])
    factors = {}
    for name, _ in layers:
        root = [math.sqrt(term.sigma) for term in state[name]]
        first = state[name][0]
        entry = LayerFactors(PackedSymmetric.pack(root[0] * first.A), PackedSymmetric.pack(root[0] * first.G))
        if len(root) == 2 and root[1] > 0:
            entry.G2 = PackedSymmetric.pack(root[1] * state[name][1].G)
            entry.A2 = PackedSymmetric.pack(root[1] * state[name][1].A)
        _check_finite(name, entry)
        factors[name] = entry
    return factors
