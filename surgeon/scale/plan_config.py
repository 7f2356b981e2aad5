"""The settings of `surgeon plan`, and the byte sizes it reads."""

from __future__ import annotations

import re
from dataclasses import dataclass

from surgeon.fields import check, opt


def parse_bytes(text: str) -> int:
    """'80GB', '80GiB', '79.6 GiB' or a number of bytes -> bytes (GB and GiB both read as 2³⁰, GPU memory's unit)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B?)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"gpu_memory={text!r}: give a size such as 80GB")
    unit = (match.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit])


@dataclass(frozen=True)
class PlanConfig:
    """Settings of `surgeon plan`: the run to count, and the GPUs to fit it on."""

    model: str = opt("smollm2-135m", "hub id, local directory, config.json, .gguf file, or a built-in model: "
                      "smollm2-135m, gemma3-270m; "
                      "only its configuration is read")
    dtype: str = opt("bfloat16", "model dtype", ("float32", "bfloat16", "float16"))
    nsamples: int = opt(128, "calibration windows", least=1)
    seqlen: int = opt(2048, "tokens per calibration window", least=2)
    gpu_memory: str = opt("80GB", "memory of one GPU, such as 80GB (GB and GiB both read as 2^30 bytes)")
    gpus: int = opt(1, "GPUs to share the work", least=1)
    output: str | None = opt(None, "also write the plan as JSON to this file", shown="print only")

    def __post_init__(self) -> None:
        check(self)
        parse_bytes(self.gpu_memory)
