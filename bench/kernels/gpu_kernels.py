"""GPU microbenchmarks of every op, torch vs Triton, with `triton.testing.do_bench` (needs CUDA).

    python -m bench.kernels.gpu_kernels --output bench/results/micro-gpu.json

Shapes: SmolLM2 (576/1536) and Llama-2-7B (4096/11008), K = 2000; batched eigh from 32 to 1536
rows (Jacobi up to 256) (the Jacobi/eigh crossover; its flop count is the nominal 9n³). Each row: op, provider, shape,
dtype, median and 20/80% quantiles in ms, achieved TFLOP/s or GB/s, and the fraction of the
measured bf16 GEMM rate or copy bandwidth (bench/kernels/_roofline.py) on the named device.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from bench import provenance as pv
from bench.kernels import _roofline
from bench.section import Row, Section
from surgeon.io import write_json
from surgeon_kernels import ops
from surgeon_kernels.symmetric import PackedSymmetric

WIDTHS = {"smollm2-576": 576, "smollm2-1536": 1536, "llama2-7b-4096": 4096, "llama2-7b-11008": 11008}


def cases():
    """(op, shape label, dtype, flops, bytes, {provider: thunk}) for every benchmark row."""
    dev = "cuda"
    for label, width in WIDTHS.items():
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(8192, width, device=dev).to(dtype)
            out = PackedSymmetric.zeros(width, dev)
            yield ("kfac_accumulate", f"{label} N=8192", dtype, 2 * 8192 * width**2, 0,
                   {p: (lambda p=p: ops.kfac_accumulate(out, x, 1.0, False, p)) for p in ("torch", "triton")})
    # A block's factors: A of q/k/v, o, gate/up, down; G of q, k, v, o, gate, up, down.
    for label, widths, tokens in (("smollm2 block", [576, 576, 576, 1536, 576, 192, 192, 576, 1536, 1536, 576], 8192),
                                  ("llama2-7b block", [4096] * 8 + [11008] * 3, 4096)):
        xs = [torch.randn(tokens, w, device=dev).to(torch.bfloat16) for w in widths]
        outs = [PackedSymmetric.zeros(w, dev) for w in widths]

        def separate(xs=xs, outs=outs) -> None:
            for out, x in zip(outs, xs):
                ops.kfac_accumulate(out, x, 1.0, False, "triton")

        yield ("kfac_accumulate_group", f"{label} N={tokens} ({len(widths)} factors)", torch.bfloat16,
               sum(2 * tokens * w**2 for w in widths), 0,
               {"triton one call per factor": separate,
                "triton grouped": lambda xs=xs, outs=outs: ops.kfac_accumulate_group(
                    outs, xs, 1.0, [False] * len(xs), "triton")})
    costs = torch.rand(11008, 4096, device=dev)
    yield ("nm_select", "llama2-7b-mlp 2:4", torch.float32, 0, costs.numel() * 5 + costs.numel(),
           {p: (lambda p=p: ops.nm_select(costs, 2, 4, p)) for p in ("torch", "triton")})
    many = [torch.rand(11008, 4096, device=dev) for _ in range(8)]
    k = sum(c.numel() for c in many) // 2
    yield ("kth_smallest", "8 × llama2-7b-mlp", torch.float32, 0, 4 * 4 * sum(c.numel() for c in many),
           {"triton": lambda: ops.kth_smallest(many, k, "triton"), "torch": lambda: ops.kth_smallest(many, k, "torch")})
    for n in (32, 64, 128, 256, 576, 1536):
        x = torch.randn(16, n, n, device=dev)
        sym = x + x.mT
        providers = ("torch", "triton") if n <= 256 else ("torch",)  # Jacobi: 1.2 s at 256 (H100), far slower above
        yield ("batched_eigh", f"B=16 n={n}", torch.float32, 16 * 9 * n**3, 0,
               {p: (lambda p=p, sym=sym: ops.batched_eigh(sym, backend=p)) for p in providers})
    G_inv, A_inv = torch.randn(4096, 4096, device=dev), torch.randn(11008, 11008, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = torch.randint(0, 4096, (8, 2000), device=dev, generator=gen)
    cols = torch.randint(0, 11008, (8, 2000), device=dev, generator=gen)
    valid = torch.ones(8, 2000, dtype=torch.bool, device=dev)
    yield ("kk_gather", "llama2-7b B=8 K=2000", torch.float32, 0, 3 * 4 * 8 * 2000 * 2000,
           {p: (lambda p=p: ops.kk_gather(G_inv, A_inv, rows, cols, valid, p)) for p in ("torch", "triton")})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="bench/results/micro-gpu.json")
    args = parser.parse_args()
    import triton.testing  # here, not at the top: `make results` reads this module's SECTIONS without Triton

    device = torch.cuda.get_device_name()
    ceiling_flops = _roofline.gemm_flops("cuda", torch.bfloat16)
    ceiling_bytes = _roofline.copy_bandwidth("cuda")
    rows = []
    for op, shape, dtype, flops, nbytes, providers in cases():
        for provider, fn in providers.items():
            median, low, high = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8])
            seconds = median / 1e3
            row = dict(op=op, provider=provider, shape=shape, dtype=str(dtype), ms=median, ms_20=low, ms_80=high,
                       device=device)
            if flops:
                row.update(tflops=flops / seconds / 1e12, fraction_of_bf16_gemm=flops / seconds / ceiling_flops)
            if nbytes:
                row.update(gbytes_per_s=nbytes / seconds / 1e9, fraction_of_copy=nbytes / seconds / ceiling_bytes)
            rows.append(row)
            print(json.dumps(row))
            # rewritten after every row: a run stopped at a time limit keeps what it measured
            write_json(Path(args.output), dict(device=device, bf16_gemm_tflops=ceiling_flops / 1e12,
                                               copy_gbytes_per_s=ceiling_bytes / 1e9, rows=rows))


def kernel_rows(path: Path, data: pv.Run) -> list[Row]:
    """A kernel microbenchmark file's rows: this benchmark's on a GPU, or pytest-benchmark's on the CPU
    (`micro-cpu.json`, from the `bench_*.py` files)."""

    def rate(values: pv.Run, *templates: tuple[str, str]) -> str:  # the first of the figures `values` holds
        return next((template.format(values[key]) for key, template in templates if key in values), "-")

    def share(fraction: float | None) -> str:
        return "-" if fraction is None else f"{fraction:.0%}"

    if "benchmarks" not in data:
        return [(row["op"], row["provider"], row["shape"], row["dtype"].removeprefix("torch."), f"{row['ms']:.3f} ms",
                 f"p20–p80 {row['ms_20']:.3f}–{row['ms_80']:.3f} ms",
                 rate(row, ("tflops", "{:.1f} TFLOP/s"), ("gbytes_per_s", "{:.0f} GB/s")),
                 share(row.get("fraction_of_bf16_gemm", row.get("fraction_of_copy"))), data["device"],
                 pv.mark(pv.commit_of(path), pv.kernel_code(row["op"]))) for row in data["rows"]]
    return [(op, params.get("backend") or params.get("method") or "torch",
             ", ".join(f"{k}={v}" for k, v in params.items() if k not in ("backend", "method", "dtype")) or "-",
             re.sub(r"UNSERIALIZABLE\[torch\.(\w+)\]", r"\1", str(params.get("dtype", "float32"))),
             f"{bench['stats']['median'] * 1e3:.2f} ms", f"IQR {bench['stats']['iqr'] * 1e3:.2f} ms",
             rate(info, ("gflops", "{:.0f} GFLOP/s"), ("gbytes_per_s", "{:.1f} GB/s")),
             share(info.get("gemm_fraction", info.get("bandwidth_fraction"))), info.get("machine", "CPU"),
             pv.mark(data["commit_info"]["id"][:7], pv.kernel_code(op)))
            for bench in data["benchmarks"]
            for op, params, info in [(bench["name"].split("[")[0].removeprefix("test_"), bench["params"],
                                      bench["extra_info"])]]


SECTIONS = {"kernels": Section("micro-cpu.json gpu/micro-*.json",
                               "op | provider | shape | dtype | median | spread | rate | of ceiling | machine | commit",
                               kernel_rows)}


if __name__ == "__main__":
    main()
