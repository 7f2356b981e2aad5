"""The pruning methods `surgeon` runs and what each needs, serves and defaults to: one table, as
`models.families` is one table of families.

The shot loop, the checks and the CLI read a method's entry and never its name: a new method is one entry
here plus its mathematics in `surgeon.method`. Imports nothing heavy, so `surgeon --help` reads it at once.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# The damping defaults, for every method and API (`solve`, the SparseGPT drop-in's `percdamp`, SparseGPT's own
# 0.01 of mean(diag H)): λ_G and λ_A of `M + λ·mean(diag M)·I` (docs/DESIGN.md, "Damping").
DEFAULT_DAMP_G, PROPAGATED_DAMP_G = 0.1, 1.0  # λ_G; N:M propagated measured best at 1 (bench/RESULTS.md)
DEFAULT_DAMP_A, COUPLED_DAMP_A = 0.01, 0.3  # λ_A; coupled LLM Surgeon measured best at 0.3 (bench/RESULTS.md)
# How far a layer's unstructured sparsity may stray from the shot's under the one threshold (1: none bounded, sec.
# 3.3); LLM Surgeon's, chosen on the tuning articles of two models (docs/DESIGN.md, "Defaults")
GLOBAL_DEVIATION, SURGEON_DEVIATION = 1.0, 0.1



class Shot(enum.Enum):
    """What one shot removes, and so how it prices and removes it (`surgeon.pruning.shots`)."""

    STRUCTURED = "structured"  # whole rows and columns, or coupled units, under one global threshold (sec. 3.4)
    ELEMENTS = "elements"  # single weights, under one global threshold or N of every M (sec. 3.3)
    EXPERTS = "experts"  # whole routed experts, the same number in every sparse block


# What a run prunes, by `PruneConfig.structure` (N:M: any "N:M" such as 2:4), and the shot that prunes it.
SHOTS = {"structured": Shot.STRUCTURED, "coupled": Shot.STRUCTURED, "unstructured": Shot.ELEMENTS,
         "N:M": Shot.ELEMENTS, "experts": Shot.EXPERTS}
STRUCTURES = tuple(SHOTS)
DEFAULT_TARGET_SIZE = 0.8
# shots by structure: the least time within about 2% of the best perplexity measured on the time-to-quality curve
# (docs/DESIGN.md, "Defaults")
DEFAULT_SHOTS = {"structured": 4, "coupled": 4, "unstructured": 2, "N:M": 1, "experts": 1}
_NM = re.compile(r"^(\d+):(\d+)$")


def parse_nm(structure: str) -> tuple[int, int] | None:
    """`"2:4"` -> (2, 4): keep at most N of every M consecutive weights of a row; else None."""
    match = _NM.match(structure)
    return (int(match.group(1)), int(match.group(2))) if match else None


def kind_of(structure: str) -> str:
    """The structure as the table names it (one of `STRUCTURES`: N:M for any N:M such as 2:4); ValueError naming it
    where it is none."""
    nm = parse_nm(structure)
    if nm is None and structure not in STRUCTURES or structure == "N:M":
        raise ValueError(f"structure={structure!r}: use structured, coupled, unstructured, experts, or N:M such as 2:4")
    if nm is not None and not 0 < nm[0] < nm[1]:
        raise ValueError(f"structure={structure!r}: N:M needs 0 < N < M")
    return "N:M" if nm is not None else structure


class Pass(enum.Enum):
    """The whole-model curvature pass each shot runs (eq. 6)."""

    NONE = "none"  # no pass: the weights alone, or each block's inputs estimated block by block
    INPUTS = "inputs"  # forward passes: the input factors A
    KRONECKER = "kronecker"  # forward and backward passes: A and the output-side factors G


class LayerRule(enum.Enum):
    """How a per-layer method prunes one layer, block by block on the inputs of the blocks already pruned."""

    WANDA = "wanda"  # |w|·‖x‖ per output row
    SWEEP = "sweep"  # SparseGPT's mask and lazy-batch OBS weights
    EXACT = "exact"  # SparseGPT's mask, every row's kept weights solved exactly (G = I)
    REFINE = "refine"  # SparseGPT's mask and weights, then conjugate-gradient steps toward the exact solve


class ExpertPrice(enum.Enum):
    """How a whole routed expert is priced (`pruning.whole_experts`)."""

    REROUTE = "reroute"  # the loss its removal costs once the router sends its tokens elsewhere (eq. 6's Fisher)
    REAP = "reap"  # REAP: the router-weighted norm of its output over its tokens


@dataclass(frozen=True)
class Method:
    """One pruning method.

    help: one line for `surgeon prune --help`; structures: what it prunes (`STRUCTURES`); curvature: its
    whole-model pass; correlated: its costs read F⁻¹ (eq. 7) and its removals move the other weights (eqs. 4-5),
    else its costs read the curvature's diagonal (the weights' squares without a pass) and nothing moves;
    layer_rule: a per-layer method's rule, which prunes block by block and estimates each block's inputs itself;
    expert_price: how it prices a whole expert; coupled_damp_a: λ_A's default for structure coupled;
    layer_deviation: the default for unstructured (`PruneConfig.layer_deviation`); alternative: the method its
    unstructured and N:M runs are weighed against by held-out loss.
    """

    help: str
    structures: tuple[str, ...]
    curvature: Pass = Pass.NONE
    correlated: bool = False
    layer_rule: LayerRule | None = None
    expert_price: ExpertPrice | None = None
    coupled_damp_a: float = DEFAULT_DAMP_A
    layer_deviation: float = GLOBAL_DEVIATION
    alternative: str | None = None

    @property
    def needs_a(self) -> bool:
        """Whether its shots run the whole-model pass for the input factors A."""
        return self.curvature is not Pass.NONE

    @property
    def needs_g(self) -> bool:
        """Whether its pass runs backward, for the output-side factors G."""
        return self.curvature is Pass.KRONECKER


_ELEMENTS = ("unstructured", "N:M")
_WEIGHTS = ("structured", "coupled", "unstructured", "N:M")

METHODS: dict[str, Method] = {
    "surgeon": Method("LLM Surgeon, Kronecker-factored curvature G ⊗ A with correlated weight updates",
                      (*_WEIGHTS, "experts"), Pass.KRONECKER, correlated=True, expert_price=ExpertPrice.REROUTE,
                      coupled_damp_a=COUPLED_DAMP_A, layer_deviation=SURGEON_DEVIATION,
                      alternative="sparsegpt-refine"),
    "magnitude": Method("|w|, no update", _WEIGHTS),
    "lobd": Method("L-OBD, optimal brain damage with the layer's input curvature diag(A) only, no update", _WEIGHTS,
                   Pass.INPUTS),
    "kobd": Method("K-OBD, optimal brain damage with the Kronecker diagonal diag(G) ⊗ diag(A), no update",
                   _WEIGHTS, Pass.KRONECKER),
    "sparsegpt": Method("SparseGPT's per-layer OBS with lazy batches", _ELEMENTS, layer_rule=LayerRule.SWEEP),
    "sparsegpt-exact": Method("SparseGPT's mask, then every row's kept weights solved exactly (G = I, surgeon.solve)",
                              _ELEMENTS, layer_rule=LayerRule.EXACT),
    "sparsegpt-refine": Method("SparseGPT's mask and weights, then 8 conjugate-gradient steps toward that exact "
                               "solve (the SparseGPT drop-in's update)", _ELEMENTS, layer_rule=LayerRule.REFINE),
    "wanda": Method("|w|·‖x‖ per output row", _ELEMENTS, layer_rule=LayerRule.WANDA),
    "reap": Method("REAP, the router-weighted norm of an expert's output over its tokens", ("experts",),
                   expert_price=ExpertPrice.REAP),
}


def method_help() -> str:
    """Every method's name and help line, for `--method`'s help."""
    return "; ".join(f"{name}: {method.help} ({', '.join(method.structures)})" for name, method in METHODS.items())


def serving(structure: str) -> tuple[str, ...]:
    """The methods that prune `structure` (one of `STRUCTURES`), in the table's order."""
    return tuple(name for name, method in METHODS.items() if structure in method.structures)
