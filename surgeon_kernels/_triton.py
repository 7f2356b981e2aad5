"""Shared Triton plumbing: whether Triton is usable, and autotune lists that collapse in tests.

Under the interpreter (`TRITON_INTERPRET=1`, how the CPU test suite runs the kernels) every
autotune list is replaced by its small test configuration: the interpreter is slow, and
benchmarking configurations there means nothing.
"""

from __future__ import annotations

import os

try:
    import triton

    HAS_TRITON = True
except ImportError:  # the package works without Triton (PyTorch and compiled ops)
    triton = None
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def autotune_configs(configs: list[dict[str, int]], test: dict[str, int]) -> list[triton.Config]:
    """`triton.Config`s from dicts (block sizes plus num_warps/num_stages); only `test` when interpreting."""
    chosen = [test] if INTERPRET else configs
    out = []
    for entry in chosen:
        entry = dict(entry)
        warps, stages = entry.pop("num_warps", 4), entry.pop("num_stages", 2)
        out.append(triton.Config(entry, num_warps=warps, num_stages=stages))
    return out
