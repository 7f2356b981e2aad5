"""What a CPU benchmark ran on, as its result files record it: CPUs of one architecture and core count still
differ in speed, so the model is named beside them."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows of the processor."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_machine(threads: int) -> str:
    """`<CPU model>, <architecture> <threads> threads, torch <version>`."""
    return f"{cpu_model()}, {platform.machine()} {threads} threads, torch {torch.__version__}"
