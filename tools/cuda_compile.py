"""Compile every Triton kernel for a CUDA architecture without a GPU, and report its resources.

    TRITON_INTERPRET=0 python -m tools.cuda_compile [--arch 80 90]

The interpreter (`TRITON_INTERPRET=1`, how the CPU test suite runs the kernels) executes a kernel as
Python, so it misses what only the compiler checks: globals that are not `tl.constexpr`, operand types
of `tl.dot`, shared memory beyond the device's. Here each op's Triton wrapper runs on small CPU tensors
for every dtype and constexpr variant the dispatcher can launch (input dtypes, bias column, group size
M, radix shift, Jacobi width; Triton also specializes integer arguments on divisibility by 16, and one
value of each is compiled). A stand-in driver names the target architecture and every launch is turned
into Triton's own warm-up: the real binder, specialization and `triton.compile` (ptxas included) run for
each autotune configuration, and nothing is launched. Each compiled kernel is reported with its
registers, stack bytes (spills) from `cuobjdump`, and dynamic shared memory against the architecture's
limit (an autotune configuration over the limit is skipped on the device; a kernel with none within it
fails).

Import it with `TRITON_INTERPRET` unset or 0: under the interpreter nothing is compiled. The stand-in
device number is the architecture (80, 90, …), so what is compiled here never meets a real device's.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch

# Largest dynamic shared memory per block (bytes, opt-in) by compute capability (CUDA C++ Programming
# Guide, "Technical Specifications per Compute Capability").
SHARED_LIMIT = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}


@dataclass(frozen=True)
class Compiled:
    """One compiled kernel: the launch that made it, its constants and configuration, its resources."""

    op: str
    kernel: str
    constants: dict
    shared: int
    registers: int
    stack: int
    fits: bool


@dataclass(frozen=True)
class Failure:
    """A launch that did not compile: the op that made it and the compiler's message."""

    op: str
    error: str


class _TargetDriver:
    """The part of a Triton driver that compiling (with no launch) asks for: device, stream, target.

    The device number is the architecture, so the kernels' per-device caches (binder, target and
    compiled kernels) of one architecture are never reused for another.
    """

    def __init__(self, target) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return self.target.arch

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target


def _constants(kwargs: dict) -> dict:
    """The launch's constexprs and compile options, printable (dtypes by name)."""
    keep = {name: value for name, value in kwargs.items()
            if name.isupper() or name in ("num_warps", "num_stages")}
    return {name: str(value) if not isinstance(value, (int, float, bool)) else value for name, value in keep.items()}


def _resources(cubin: bytes, cuobjdump: Path) -> tuple[int, int]:
    """(registers, stack bytes) of the one function in `cubin`, from `cuobjdump -res-usage`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([str(cuobjdump), "-res-usage", handle.name], capture_output=True, text=True,
                              check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{text}")
    return int(found.group(1)), int(found.group(2))


@contextmanager
def compiling_for(arch: int) -> Iterator[list]:
    """Within the block, Triton launches compile for sm_`arch` (every autotune configuration) and
    launch nothing; yields the list that collects (kernel name, launch kwargs, compiled kernel)."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    compiled: list = []
    jit_run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = jit_run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kwargs, kernel))
        return kernel

    def every_config(self, *args, grid, warmup, **kwargs):
        return self.warmup(*args, grid=grid, **kwargs)

    before = driver._active  # not `driver.active`: that would create the CUDA driver, which fails without a GPU
    driver.set_active(_TargetDriver(GPUTarget("cuda", arch, 32)))
    try:
        with mock.patch.object(JITFunction, "run", compile_only), mock.patch.object(Autotuner, "run", every_config):
            yield compiled
    finally:
        driver.set_active(before)


def launches() -> list[tuple[str, Callable[[], object]]]:
    """(op, call) for every dtype and constexpr variant the dispatcher can launch, on small CPU tensors."""
    from surgeon_kernels.batched_eigh.kernel import batched_eigh
    from surgeon_kernels.kfac_accumulate.kernel import kfac_accumulate
    from surgeon_kernels.kk_gather.kernel import kk_gather
    from surgeon_kernels.kth_smallest.kernel import byte_histogram
    from surgeon_kernels.nm_select.kernel import nm_select
    from surgeon_kernels.symmetric import PackedSymmetric

    def kfac(dtype: torch.dtype, biases: list[bool]) -> Callable[[], None]:
        widths = [577, 192][: len(biases)]
        return lambda: kfac_accumulate([PackedSymmetric.zeros(c + b) for c, b in zip(widths, biases)],
                                       [torch.zeros(40, c, dtype=dtype) for c in widths], 1.0, biases)

    def gather() -> torch.Tensor:
        rows = torch.zeros(2, 70, dtype=torch.int64)
        return kk_gather(torch.eye(9), torch.eye(7), rows, rows, torch.ones(2, 70, dtype=torch.bool))

    def eigh(n: int, dtype: torch.dtype) -> Callable[[], object]:
        return lambda: batched_eigh(torch.eye(n, dtype=dtype).expand(2, n, n))

    calls = [(f"kfac_accumulate {dtype} bias {biases}", kfac(dtype, biases))
             for dtype in (torch.float32, torch.bfloat16, torch.float16) for biases in ([True, False], [False])]
    calls.append(("kk_gather float32", gather))
    calls += [(f"nm_select m={m}", lambda m=m: nm_select(torch.zeros(8, 32), m // 2, m)) for m in (4, 8, 16)]
    calls += [(f"kth_smallest shift {shift}", lambda shift=shift: byte_histogram(torch.zeros(100), 0, shift))
              for shift in (24, 16)]
    calls += [(f"batched_eigh n={n} {dtype}", eigh(n, dtype))
              for n, dtype in ((64, torch.float32), (128, torch.float32), (64, torch.float64))]
    return calls


def compile_all(arch: int, calls: list[tuple[str, Callable[[], object]]] | None = None
                ) -> tuple[list[Compiled], list[Failure]]:
    """Compile every launch of `calls` (default: `launches()`) for sm_`arch`; the compiled kernels
    and the failures."""
    from triton.backends.nvidia import compiler as nvidia

    cuobjdump = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    limit = SHARED_LIMIT.get(arch)
    done, failed = [], []
    ops = []
    with compiling_for(arch) as compiled:
        for op, call in launches() if calls is None else calls:
            start = len(compiled)
            try:
                call()
            except Exception as error:  # noqa: BLE001 - every compiler error is reported, then the next op
                failed.append(Failure(op, f"{type(error).__name__}: {error}"))
            ops += [op] * (len(compiled) - start)
    for op, (name, kwargs, kernel) in zip(ops, compiled):
        registers, stack = _resources(kernel.asm["cubin"], cuobjdump)
        shared = kernel.metadata.shared
        done.append(Compiled(op, name, _constants(kwargs), shared, registers, stack,
                             limit is None or shared <= limit))
    return done, failed


def no_config_fits(done: list[Compiled]) -> list[str]:
    """The launches none of whose autotune configurations is within the shared-memory limit."""
    groups: dict[str, bool] = {}
    for entry in done:
        groups[entry.op] = groups.get(entry.op, False) or entry.fits
    return [op for op, any_fits in groups.items() if not any_fits]


def main(argv: list[str] | None = None) -> int:
    """Compile for each architecture, print a table; exit status 1 when anything failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="compute capabilities, e.g. 80 90")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        parser.error("run with TRITON_INTERPRET=0: under the interpreter there is nothing to compile")
    bad = False
    for arch in args.arch:
        done, failed = compile_all(arch)
        print(f"sm_{arch} (shared-memory limit {SHARED_LIMIT.get(arch, 'unknown')} bytes)")
        print("| launch | kernel | constants | shared bytes | registers | stack bytes | fits |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for entry in done:
            print(f"| {entry.op} | {entry.kernel} | {entry.constants} | {entry.shared} | {entry.registers} | "
                  f"{entry.stack} | {'yes' if entry.fits else 'no'} |")
        for failure in failed:
            print(f"FAILED sm_{arch} {failure.op}: {failure.error}", file=sys.stderr)
        unfit = no_config_fits(done)
        for op in unfit:
            print(f"FAILED sm_{arch} {op}: no configuration within the shared-memory limit", file=sys.stderr)
        bad = bad or bool(failed) or bool(unfit)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
