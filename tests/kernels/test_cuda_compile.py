"""Every Triton kernel compiles for sm_90 (H100) with no GPU: what the interpreter cannot check.

Each test runs a fresh Python with `TRITON_INTERPRET` of its own (this suite imports the kernels under
the interpreter) and an empty Triton cache, so every kernel is really compiled, ptxas included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # each test compiles kernels for sm_90 in a fresh interpreter

ROOT = Path(__file__).resolve().parents[2]


def run_python(args: list[str], cache: Path, cwd: Path = ROOT, interpret: str = "0") -> subprocess.CompletedProcess:
    """`python *args` with `TRITON_INTERPRET=interpret` and a Triton cache of its own."""
    env = dict(os.environ, TRITON_INTERPRET=interpret, TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_every_dispatched_launch_compiles_for_sm90(tmp_path):
    """All specializations of every op, each autotune configuration, within the H100's limits (the CLI
    exits 1 on a compile failure or a launch with no configuration within the limit)."""
    run = run_python(["-m", "tools.cuda_compile", "--arch", "90"], tmp_path / "cache")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "FAILED" not in run.stderr, run.stderr[-3000:]
    rows = [line.split(" | ") for line in run.stdout.splitlines()
            if line.startswith("| ") and not line.startswith(("| launch ", "| ---"))]
    assert {row[1] for row in rows} == {"_kfac_accumulate_kernel", "_kk_gather_kernel", "_nm_select_kernel",
                                        "_byte_histogram_kernel", "_jacobi_kernel"}
    # Six kfac specializations (3 dtypes × bias or not) × 3 configurations, each its own kernel.
    assert sum(row[0].startswith("| kfac_accumulate") for row in rows) == 18


def test_a_kernel_the_interpreter_accepts_fails_here(tmp_path):
    """A non-constexpr global (the grouped kfac kernel's old bug) runs interpreted but must fail here,
    while a correct kernel of the same call compiles."""
    (tmp_path / "toy.py").write_text(textwrap.dedent('''
        import torch
        import triton
        import triton.language as tl

        FIELDS = 6
        CONST_FIELDS = tl.constexpr(6)

        @triton.jit
        def bad(x_ptr):
            tl.store(x_ptr + FIELDS, 1.0)

        @triton.jit
        def good(x_ptr):
            tl.store(x_ptr + CONST_FIELDS, 1.0)

        def launch(kernel):
            return lambda: kernel[(1,)](torch.zeros(8))
    '''))
    run = run_python(["-c", textwrap.dedent("""
        import toy
        from tools import cuda_compile
        done, failed = cuda_compile.compile_all(90, [("bad", toy.launch(toy.bad)), ("good", toy.launch(toy.good))])
        print([f.op for f in failed], [e.op for e in done], "FIELDS" in failed[0].error)
    """)], tmp_path / "cache", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "['bad'] ['good'] True"


def test_the_prepared_sparsegpt_sweep_compiles_for_sm90(tmp_path):
    """bench/kernels/sparsegpt_sweep.py's kernel, in the held-out shot's float64 and the drop-in's float32,
    unstructured and 2:4: every autotune configuration compiles within the H100's shared memory, and each launch
    has one that uses no stack (spills)."""
    run = run_python(["-c", textwrap.dedent("""
        import torch
        from bench.kernels.sparsegpt_sweep import sweep
        from tools import cuda_compile

        def launch(dtype, nm):
            return lambda: sweep(torch.zeros(40, 128, dtype=dtype), torch.eye(128, dtype=dtype),
                                 torch.zeros(40, 128, dtype=torch.bool), nm)

        done, failed = cuda_compile.compile_all(90, [(f"{dtype} {nm}", launch(dtype, nm))
                                                     for dtype in (torch.float32, torch.float64)
                                                     for nm in (None, (2, 4))])
        print(len(done), [f.error for f in failed], all(entry.fits for entry in done),
              all(any(entry.stack == 0 for entry in done if entry.op == op) for op in {e.op for e in done}))
    """)], tmp_path / "cache")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "12 [] True True"


def test_cli_refuses_the_interpreter(tmp_path):
    """Under TRITON_INTERPRET=1 there is nothing to compile: one clear error, exit status 2."""
    run = run_python(["-m", "tools.cuda_compile", "--arch", "90"], tmp_path / "cache", interpret="1")
    assert run.returncode == 2
    assert "TRITON_INTERPRET=0" in run.stderr
