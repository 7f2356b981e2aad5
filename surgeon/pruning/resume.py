"""Resumable runs: after every shot, an atomic checkpoint of all that the next shot reads (docs/DESIGN.md, "Resume").

A shot reads what the shots before it removed (the prunable layers' weights and masks, or each sparse block's
kept experts: the shot strategy's state, `shots.Strategy.state`) and the shots so far; calibration windows and
per-shot seeds are derived from the configuration. The checkpoint holds exactly these, the torch RNG state, the
results of the run measured before pruning (the dense perplexity cannot be re-measured from a
pruned model) and the configuration with its hash. A continued run therefore ends with the model
an uninterrupted run ends with (bit-identical on the CPU).

Files in the output folder: `checkpoint-shot-NNNN.safetensors` (tensors) is written first, under a
temporary name renamed into place; `checkpoint.json` (which names it) is replaced second; older
tensor files are deleted last. A kill at any moment leaves the previous or the new checkpoint
complete, and never `report.json`, which marks a finished run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from surgeon.errors import SurgeonError
from surgeon.io import COMPLETE_MARKER, write_json
from surgeon.pruning.report import ShotReport

logger = logging.getLogger(__name__)

STATE = "checkpoint.json"
TENSORS = "checkpoint-shot-{:04d}.safetensors"


def config_hash(fingerprint: dict[str, Any]) -> str:
    """SHA-256 of the configuration's canonical JSON."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()


def _differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """'section.field: saved → current' for every setting that differs."""
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} → {b!r}")
    return out


def read_state(folder: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint of the run in `folder`, after checking it continues a run of this configuration."""
    if (folder / COMPLETE_MARKER).is_file():
        raise SurgeonError(f"{str(folder)!r} holds a finished run: nothing to resume")
    if not (folder / STATE).is_file():
        raise SurgeonError(f"{str(folder)!r} holds no run to resume (no {STATE}): start it without --resume")
    try:
        state: dict[str, Any] = json.loads((folder / STATE).read_text())
    except (OSError, ValueError) as error:
        raise SurgeonError(f"cannot read {STATE} in {str(folder)!r}: {error}") from error
    if state.get("config_hash") != config_hash(fingerprint):
        changed = _differences(state.get("config", {}), fingerprint)
        raise SurgeonError(f"the run in {str(folder)!r} was started with another configuration ("
                           f"{'; '.join(changed) or 'another surgeon version'}): resume it with the same options, or "
                           "start again with --overwrite")
    return state


def has_state(folder: Path) -> bool:
    """Whether `folder` holds an unfinished run's checkpoint."""
    return (folder / STATE).is_file() and not (folder / COMPLETE_MARKER).is_file()


@dataclass
class Checkpoint:
    """Writes a run's checkpoint into `folder` after every `every`-th shot and the last (0: never); restores it.

    fingerprint: the configuration that makes a continuation exact (its hash is checked on resume);
    before: the run's results measured before pruning; state: a `read_state` to continue from.
    """

    folder: Path
    fingerprint: dict[str, Any]
    before: dict[str, Any] = field(default_factory=dict)
    every: int = 1
    state: dict[str, Any] | None = None

    def restore(self) -> tuple[dict[str, torch.Tensor], list[ShotReport], float]:
        """The saved state's tensors, with the RNG put back into place; the shots done and their seconds (nothing
        without a saved state)."""
        if self.state is None:
            return {}, [], 0.0
        from safetensors.torch import load_file

        tensors = load_file(self.folder / self.state["tensors"])
        torch.set_rng_state(tensors.pop("rng"))
        shots = [ShotReport(**shot) for shot in self.state["shots"]]
        logger.info("resuming %s after shot %d", self.folder, len(shots))
        return tensors, shots, self.state["seconds"]

    def due(self, shot: int, last: bool) -> bool:
        """Whether a checkpoint is written after `shot` (`last`: the run's final shot)."""
        return self.every != 0 and (shot % self.every == 0 or last)

    def save(self, state: dict[str, torch.Tensor], shots: list[ShotReport], seconds: float, last: bool) -> None:
        """Write the checkpoint of the run's `state` after the newest of `shots` (every `every`-th shot, and the
        last)."""
        shot = shots[-1].shot
        if not self.due(shot, last):
            return
        from safetensors.torch import save_file

        tensors = {**state, "rng": torch.get_rng_state()}
        self.folder.mkdir(parents=True, exist_ok=True)
        name = TENSORS.format(shot)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        try:
            save_file({key: value.contiguous().cpu() for key, value in tensors.items()}, tmp)
            os.replace(tmp, self.folder / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        write_json(self.folder / STATE, {
            "shot": shot, "tensors": name, "config_hash": config_hash(self.fingerprint), "config": self.fingerprint,
            "before": self.before, "shots": [dataclasses.asdict(s) for s in shots], "seconds": seconds,
        })
        self._remove_tensors(keep=name)

    def _remove_tensors(self, keep: str | None = None) -> None:
        for path in self.folder.glob(TENSORS.replace("{:04d}", "*")):
            if path.name != keep:
                path.unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the checkpoint: the run is finished, or starts again."""
        (self.folder / STATE).unlink(missing_ok=True)
        if self.folder.is_dir():
            self._remove_tensors()
