"""What a CPU benchmark ran on, as its result files record it: CPUs of one architecture and core count still
differ in speed, so the model is named beside them."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), with its family and model numbers where the name alone does
    not tell two generations apart ("AMD EPYC (family 25, model 17)"), else what `platform` knows of the processor."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        fields = dict(line.split(":", 1) for line in cpuinfo.read_text().split("\n\n")[0].splitlines() if ":" in line)
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        if "model name" in fields:
            numbers = f" (family {fields['cpu family']}, model {fields['model']})" if "cpu family" in fields else ""
            return fields["model name"] + numbers
    return platform.processor() or platform.machine()


def cpu_machine(threads: int) -> str:
    """`<CPU model>, <architecture> <threads> threads, torch <version>`."""
    return f"{cpu_model()}, {platform.machine()} {threads} threads, torch {torch.__version__}"
