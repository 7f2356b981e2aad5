"""SparseGPT's column sweep fused into one Triton launch per block of columns, against the sweep `surgeon` runs.

    python -m bench.kernels.sparsegpt_sweep --device cuda [--dtype float32] [--layers q_proj] [--output OUT.json]

SparseGPT (Frantar & Alistarh, 2023) prunes a layer in blocks of 128 columns. Inside a block, each column in
turn is pruned or kept and its error is spread over the block's later columns through the Cholesky factor of
H⁻¹; the published loop (`surgeon.method.baselines.sparsegpt_reference`) runs that as seven small kernels per
column and `baselines.sparsegpt` as two, so on a GPU its time follows the columns and not the rows (115-137 µs
per column for the published loop in float32 on an H100 at Llama-2-7B's shapes:
bench/results/gpu/sparsegpt-dropin-llama2-7b@7b562d5.json), and the held-out choice's sparsegpt-refine
shot is mostly these sweeps (`surgeon plan`). Here one program holds BLOCK_R rows of a block in registers and
runs the block's whole sweep, N:M groups chosen inside it; PyTorch keeps H⁻¹'s factor, the unstructured block's
mask (its smallest saliencies over all rows, chosen by `baselines.smallest` as there) and the lazy update of the
later columns (one GEMM per block).

`sparsegpt` is `baselines.sparsegpt` with the fused sweep, an alternative that `surgeon` does not use yet: the test
suite holds it to the same masks (where no tie inside an N:M group decides them: the kernel and `topk` may break
those in different orders) and weights under the Triton interpreter and compiles it for sm_90; this script times
both on Llama-2-7B's layer shapes (`sparsegpt_dropin.random_layers`) on a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.quality.sparsegpt_dropin import LLAMA2_7B_SHAPES, random_layers
from surgeon.method import baselines
from surgeon.methods import DEFAULT_DAMP_A
from surgeon_kernels._triton import autotune_configs

CONFIGS = autotune_configs([dict(BLOCK_R=16, num_warps=4), dict(BLOCK_R=32, num_warps=4),
                            dict(BLOCK_R=64, num_warps=8)], test=dict(BLOCK_R=16, num_warps=1))


@triton.jit
def _div(x, y, F32: tl.constexpr):
    """x / y rounded as IEEE prescribes, as PyTorch divides (the GPU's default float32 division is approximate)."""
    if F32:  # noqa: SIM108 (a constexpr branch: Triton compiles one side)
        result = tl.div_rn(x, y)
    else:
        result = x / y
    return result


@triton.autotune(configs=CONFIGS, key=["BLOCK_C", "N", "M", "F32"])
@triton.jit
def _sweep_kernel(w_ptr, hinv_ptr, given_ptr, out_ptr, err_ptr, pruned_ptr, R, width, N: tl.constexpr,
                  M: tl.constexpr, F32: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """One block's sweep for BLOCK_R rows: each column pruned (given, or N:M by saliency w²/[H⁻¹]²_cc) or kept."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < width
    ok = (rows < R)[:, None] & col_ok[None, :]
    offs = rows[:, None] * width + cols[None, :]
    W = tl.load(w_ptr + offs, mask=ok, other=0.0)
    given = tl.load(given_ptr + offs, mask=ok, other=0) != 0  # unstructured: the block's mask; N:M: pruned before
    diag = tl.load(hinv_ptr + cols * width + cols, mask=col_ok, other=1.0)
    E = tl.zeros_like(W)
    pruned = given & (M == 0)
    for i in range(0, width):
        here = (cols == i)[None, :]
        if M > 0:  # noqa: SIM102 (a constexpr branch: with M = 0 the inner test would divide by 0)
            if i % M == 0:  # the M−N of column i's group with the least (saliency, column)
                saliency = tl.where(given, float("-inf"), _div(W * W, (diag * diag)[None, :], F32))
                group = (tl.arange(0, BLOCK_C // M) == i // M)[None, :, None]
                mine = tl.sum(tl.where(group, tl.reshape(saliency, (BLOCK_R, BLOCK_C // M, M)), 0.0), axis=1)
                j = tl.arange(0, M)
                before = (mine[:, None, :] < mine[:, :, None]) | (
                    (mine[:, None, :] == mine[:, :, None]) & (j[None, :] < j[:, None])[None, :, :])
                chosen = tl.sum(before.to(tl.int32), axis=2) < M - N
                pruned = pruned | tl.reshape(group & chosen[:, None, :], (BLOCK_R, BLOCK_C))
        w = tl.sum(tl.where(here, W, 0.0), axis=1)
        drop = tl.max(tl.where(here & pruned, 1, 0), axis=1) != 0
        h = tl.load(hinv_ptr + i * width + cols, mask=col_ok & (cols >= i), other=0.0)
        q = tl.where(drop, 0.0, w)
        e = _div(w - q, tl.load(hinv_ptr + i * width + i), F32)
        W = tl.where(here, q[:, None], W - e[:, None] * h[None, :])
        E = tl.where(here, e[:, None], E)
    tl.store(out_ptr + offs, W, mask=ok)
    tl.store(err_ptr + offs, E, mask=ok)
    tl.store(pruned_ptr + offs, pruned.to(tl.int8), mask=ok)


def sweep(W1: torch.Tensor, Hinv1: torch.Tensor, given: torch.Tensor, nm: tuple[int, int] | None
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's sweep in one launch: (swept W1, the columns' errors, the mask applied)."""
    R, width = W1.shape
    if nm and nm[1] & (nm[1] - 1):
        raise ValueError(f"the fused sweep takes N:M groups of a power of two, not m={nm[1]}")
    out, err = torch.empty_like(W1), torch.empty_like(W1)
    pruned = torch.empty(R, width, dtype=torch.int8, device=W1.device)
    if R:
        grid = lambda meta: (triton.cdiv(R, meta["BLOCK_R"]),)  # noqa: E731
        _sweep_kernel[grid](W1.contiguous(), Hinv1.contiguous(), given.contiguous().view(torch.int8), out, err,
                            pruned, R, width, N=nm[0] if nm else 0, M=nm[1] if nm else 0,
                            F32=W1.dtype == torch.float32, BLOCK_C=triton.next_power_of_2(width))
    return out, err, pruned.view(torch.bool)


def sparsegpt(W: torch.Tensor, H: torch.Tensor, sparsity: float, previous: torch.Tensor,
              nm: tuple[int, int] | None = None, blocksize: int = 128, percdamp: float = DEFAULT_DAMP_A,
              dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """`baselines.sparsegpt` with each block's sweep fused (`sweep`): (new W, mask)."""
    W, Hinv = baselines.sweep_inputs(W, H, percdamp, dtype)
    mask = torch.zeros_like(previous)
    for i1 in range(0, W.shape[1], blocksize):
        i2 = min(i1 + blocksize, W.shape[1])
        Hinv1, given = Hinv[i1:i2, i1:i2], previous[:, i1:i2]
        if nm is None:  # the block's mask before its sweep, as SparseGPT chooses it
            saliency = W[:, i1:i2].square() / Hinv1.diagonal().square()
            given = baselines.smallest(saliency.t(), given.t(), round(sparsity * saliency.numel())).t()
        W[:, i1:i2], err, mask[:, i1:i2] = sweep(W[:, i1:i2], Hinv1, given, nm)
        W[:, i2:] -= err @ Hinv[i1:i2, i2:]
    return W.masked_fill(mask, 0.0), mask


def timed(fn, *args) -> tuple[float, tuple]:
    """Seconds of one call after a warm-up call (the autotuner's and the first launch's work), and its result."""
    fn(*args)
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    synchronize()
    start = time.perf_counter()
    result = fn(*args)
    synchronize()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"],
                        help="the sweep's precision (float64: the held-out shot's, float32: the drop-in's)")
    parser.add_argument("--layers", nargs="+", default=list(LLAMA2_7B_SHAPES), choices=list(LLAMA2_7B_SHAPES))
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for name, (W, H) in random_layers(args.layers, args.device).items():
        for structure, sparsity, nm in (("unstructured-0.5", 0.5, None), ("2:4", 0.5, (2, 4))):
            previous = torch.zeros_like(W, dtype=torch.bool)
            torch_s, (expected, expected_mask) = timed(baselines.sparsegpt, W, H, sparsity, previous, nm, 128,
                                                       DEFAULT_DAMP_A, dtype)
            fused_s, (got, got_mask) = timed(sparsegpt, W, H, sparsity, previous, nm, 128, DEFAULT_DAMP_A, dtype)
            rows.append({"layer": name, "shape": list(W.shape), "structure": structure, "torch_seconds": torch_s,
                         "fused_seconds": fused_s, "same_mask": float((got_mask == expected_mask).float().mean()),
                         "max_weight_difference": float((got - expected).abs().max())})
            print(json.dumps(rows[-1]))
    if args.output:
        command = "python -m bench.kernels.sparsegpt_sweep " + " ".join(sys.argv[1:])
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
        args.output.write_text(json.dumps({"device": device, "torch": torch.__version__,
                                           "triton": triton.__version__, "dtype": args.dtype, "command": command,
                                           "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
