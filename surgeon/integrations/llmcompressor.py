"""llm-compressor modifiers backed by surgeon (optional extra `llmcompressor`; README, "llm-compressor").

Importing this module registers both with llm-compressor's modifier factory, so YAML recipes can
name them::

    import surgeon.integrations.llmcompressor  # registers SurgeonModifier, SurgeonSparseGPTModifier
    from llmcompressor import oneshot

    oneshot(model=model, dataset=dataset, recipe=[SurgeonModifier(sparsity=0.5, structure="unstructured")])

- `SurgeonModifier` runs LLM Surgeon (`surgeon.prune`): its own gradient pass over the calibration
  data for the Kronecker factors, one global threshold and the multi-shot loop (Algorithm 1). It
  prunes every linear layer of the decoder blocks, never the embeddings or the LM head.
- `SurgeonSparseGPTModifier` is `SparseGPTModifier` with only the per-layer solve replaced: the same
  Hessians from llm-compressor's sequential pipeline and SparseGPT's mask, then every row's kept
  weights moved toward the exact solution by a few conjugate-gradient steps (`update="refine"`), or
  solved exactly (`update="exact"`, `surgeon.solve` with G = I). A recipe switches by changing the
  class name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from compressed_tensors.utils import align_module_device, update_offload_parameter
from llmcompressor.core import Event, State
from llmcompressor.modifiers import Modifier, ModifierFactory
from llmcompressor.modifiers.pruning.sparsegpt import SparseGPTModifier
from llmcompressor.utils.metric_logging import CompressionLogger
from loguru import logger
from pydantic import Field, PrivateAttr, model_validator

from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.integrations.sparsegpt import Update, is_conv1d, sparsegpt_solve
from surgeon.method.solver import REFINE_ITERATIONS
from surgeon.pruning.report import PruneReport
from surgeon.pruning.shots import prune

__all__ = ["SurgeonModifier", "SurgeonSparseGPTModifier", "calibration_ids"]


def calibration_ids(dataloader: Iterable[Mapping[str, Any]]) -> torch.Tensor:
    """The calibration batches as `surgeon.prune`'s windows [n, seqlen], padding removed.

    Samples of equal length are stacked as they are. Samples of different lengths are joined into
    one token stream and cut into as many windows of equal length, so that every token is used.
    """
    samples: list[torch.Tensor] = []
    for batch in dataloader:
        ids = torch.as_tensor(batch["input_ids"])
        ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
        keep = batch.get("attention_mask")
        keep = torch.ones_like(ids, dtype=torch.bool) if keep is None else torch.as_tensor(keep).reshape(ids.shape)
        samples += [row[mask.bool()].long().cpu() for row, mask in zip(ids, keep)]
    if not samples:
        raise ValueError("the calibration dataloader yielded no samples")
    if len({len(sample) for sample in samples}) == 1:
        return torch.stack(samples)
    stream = torch.cat(samples)
    seqlen = stream.numel() // len(samples)
    if seqlen < 2:
        raise ValueError(f"{len(samples)} calibration samples hold only {stream.numel()} tokens")
    return stream[: seqlen * len(samples)].view(len(samples), seqlen)


class SurgeonModifier(Modifier):
    """LLM Surgeon as an llm-compressor modifier: the model pruned in place when calibration starts.

    `sparsity`: fraction of the prunable weights removed (N:M structures set it themselves);
    `structure`: structured, coupled, unstructured or N:M such as "2:4" (as `surgeon prune
    --structure`); `shots`: pruning shots (None: surgeon's default for the structure); `options`:
    any other `surgeon.PruneConfig` field by name, e.g. {"damp_g": 0.1, "max_correlate": 0}.
    `report` holds the `surgeon.PruneReport` afterwards.
    """

    requires_calibration_data: bool = True

    sparsity: float | None = None
    structure: str = "unstructured"
    shots: int | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    _config: PruneConfig = PrivateAttr()
    _calibration: Any = PrivateAttr(default=None)
    _report: PruneReport | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _validate(self) -> SurgeonModifier:
        """Build the `PruneConfig` now, so that a bad recipe fails when it is read."""
        unknown = set(self.options) - set(PruneConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"options {sorted(unknown)} are not surgeon.PruneConfig fields")
        taken = {"structure", "target_size", "shots"} & set(self.options)
        if taken:
            raise ValueError(f"set {sorted(taken)} as the modifier's own arguments (sparsity, structure, shots)")
        if self.sparsity is not None and not 0.0 <= self.sparsity < 1.0:
            raise ValueError(f"sparsity={self.sparsity}: the fraction removed must be in [0, 1)")
        target = None if self.sparsity is None else 1.0 - self.sparsity
        self._config = PruneConfig(structure=self.structure, target_size=target, shots=self.shots, **self.options)
        return self

    @property
    def report(self) -> PruneReport | None:
        """The `surgeon.PruneReport` of the run, once calibration has started."""
        return self._report

    def on_initialize(self, state: State, **kwargs: Any) -> bool:
        if state.data.calib is None:
            raise ValueError("SurgeonModifier needs calibration data: pass dataset=… to oneshot")
        self._calibration = state.data.calib
        return True

    def on_calibration_start(self, state: State, event: Event, **kwargs: Any) -> None:
        model = state.model
        if any(parameter.device.type == "meta" for parameter in model.parameters()):
            raise ValueError("SurgeonModifier needs every weight in memory for its gradient pass; "
                             "load the model without disk or meta-device offloading")
        ids = calibration_ids(self._calibration)
        logger.info(f"SurgeonModifier: {self._config.structure}, target size {self._config.target:.4f}, "
                    f"{self._config.shot_count} shots on {ids.shape[0]} windows of {ids.shape[1]} tokens")
        with torch.enable_grad():
            self._report = prune(model, ids.to(next(model.parameters()).device), self._config)
        logger.info(f"SurgeonModifier: sparsity {self._report.sparsity:.4f} in {self._report.seconds:.1f} s")

    def on_finalize(self, state: State, **kwargs: Any) -> bool:
        self._calibration = None
        return True


class SurgeonSparseGPTModifier(SparseGPTModifier):
    """`SparseGPTModifier` whose per-layer solve is surgeon's: SparseGPT's mask, then a better row update.

    Arguments are SparseGPTModifier's, and `update`: "refine" (`iterations` conjugate-gradient steps
    toward the exact row update after SparseGPT's sweep) or "exact" (every row solved exactly;
    `shots` > 1 reaches each layer's sparsity in that many sweeps of growing sparsity, each followed
    by the exact update). `preserve_sparsity_mask` is not supported.
    """

    update: Update = "refine"
    iterations: int = REFINE_ITERATIONS
    shots: int = 1

    @model_validator(mode="after")
    def _validate_surgeon(self) -> SurgeonSparseGPTModifier:
        if self.preserve_sparsity_mask:
            raise ValueError("SurgeonSparseGPTModifier does not extend an existing mask: "
                             "use preserve_sparsity_mask=False")
        if self.shots < 1:
            raise ValueError(f"shots={self.shots}: must be at least 1")
        if self.shots > 1 and self.update != "exact":
            raise ValueError(f"shots={self.shots}: several sweeps of growing sparsity need update='exact'")
        if self.iterations < 0:
            raise ValueError(f"iterations={self.iterations}: must be at least 0")
        return self

    def compress_modules(self) -> None:
        for module in list(self._num_samples):
            name = self._module_names[module]
            H = self._hessians.pop(module)
            logger.info(f"Sparsifying {name} using {self._num_samples[module]} samples")
            with torch.no_grad(), align_module_device(module), CompressionLogger(module) as log:
                weight = module.weight
                W = weight.flatten(1) if weight.dim() > 2 else weight  # Conv2d: [out, in·kh·kw]
                W = W.t() if is_conv1d(module) else W
                try:
                    solution = sparsegpt_solve(W.float(), H.to(W.device), float(self._module_sparsities[module]),
                                               self._prune_n or 0, self._prune_m or 0, self.block_size,
                                               self.dampening_frac or 0.0, self.shots, self.update, self.iterations)
                except SurgeonError as error:  # a layer matched as itself is named '<layer>.'
                    raise SurgeonError(f"{name.rstrip('.')}: {error}") from None
                new = solution.weight.t() if is_conv1d(module) else solution.weight
                log.set_results(name="SurgeonSGPT", loss=solution.loss)
            update_offload_parameter(module, "weight", new.reshape(weight.shape).to(weight.dtype))
            del self._num_samples[module]


ModifierFactory.register("SurgeonModifier", SurgeonModifier)
ModifierFactory.register("SurgeonSparseGPTModifier", SurgeonSparseGPTModifier)
