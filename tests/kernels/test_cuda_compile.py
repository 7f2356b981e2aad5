"""Every Triton kernel compiles for sm_90 (H100) with no GPU: what the interpreter cannot check.

Each test runs a fresh interpreter with `TRITON_INTERPRET=0` (this suite imports the kernels under
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
ROOT = Path(__file__).resolve().parents[2]


def compile_in_subprocess(code: str, cache: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `code` with the kernels compiled, not interpreted, and a Triton cache of its own."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_every_dispatched_launch_compiles_for_sm90(tmp_path):
    """All specializations of every op, each autotune configuration, within the H100's limits."""
    run = compile_in_subprocess(textwrap.dedent("""
        from surgeon_kernels import cuda_compile
        done, failed = cuda_compile.compile_all(90)
        for f in failed:
            print("FAILED", f.op, f.error)
        for e in done:
            print("OK", e.op, "|", e.kernel, "|", e.shared, e.registers, e.stack, e.fits)
        print("NO CONFIG FITS", cuda_compile.no_config_fits(done))
    """), tmp_path / "cache")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAILED")], run.stdout[-3000:]
    assert lines[-1] == "NO CONFIG FITS []"
    compiled = {line.split(" | ")[1] for line in lines if line.startswith("OK")}
    assert compiled == {"_kfac_accumulate_kernel", "_kk_gather_kernel", "_nm_select_kernel",
                        "_byte_histogram_kernel", "_jacobi_kernel"}
    # Six kfac specializations (3 dtypes × bias or not) × 3 configurations, each its own kernel.
    assert sum(line.startswith("OK kfac_accumulate") for line in lines) == 18


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
    run = compile_in_subprocess(textwrap.dedent("""
        import toy
        from surgeon_kernels import cuda_compile
        done, failed = cuda_compile.compile_all(90, [("bad", toy.launch(toy.bad)), ("good", toy.launch(toy.good))])
        print([f.op for f in failed], [e.op for e in done], "FIELDS" in failed[0].error)
    """), tmp_path / "cache", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "['bad'] ['good'] True"


def test_cli_refuses_the_interpreter():
    """Under TRITON_INTERPRET=1 there is nothing to compile: one clear error, exit status 2."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "surgeon_kernels.cuda_compile", "--arch", "90"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "TRITON_INTERPRET=0" in run.stderr
