"""Accuracy of the Triton factor accumulation on CUDA against float64, by input dtype and promotion period.

    python -m bench.kernels.kfac_accuracy --output bench/results/gpu/kfac-accuracy.json

For each input dtype (float16, bfloat16, float32) and shape (tokens × width), the largest absolute
error of `out = [x, 1]ᵀ[x, 1]` against the float64 product of the same rounded inputs, for: the
PyTorch reference on the CPU and on CUDA (cuBLAS), and the Triton kernel with each number of token
chunks per partial sum (`kernel.PROMOTE`; 1 sums every token in the tensor cores' accumulator, as the
compiler folds a one-chunk partial sum into it). The largest shape is also timed
(`triton.testing.do_bench`, median ms). Needs CUDA.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from surgeon.io import write_json
from surgeon_kernels import ops
from surgeon_kernels.kfac_accumulate import kernel, reference
from surgeon_kernels.symmetric import PackedSymmetric

SHAPES = [(1000, 577, True), (4096, 1536, False), (8192, 4096, False)]  # tokens, width, bias column
PROMOTIONS = (1, 2, 4, 8)


def max_error(out: PackedSymmetric, exact: torch.Tensor) -> float:
    return float((out.dense().cpu().double() - exact).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=Path("bench/results/gpu/kfac-accuracy.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    chosen = dict(kernel.PROMOTE)
    rows = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n, c, bias in SHAPES:
            x = torch.randn(n, c, generator=torch.Generator().manual_seed(n + c)).to(dtype)
            widened = torch.cat([x.double(), torch.ones(n, int(bias), dtype=torch.float64)], 1)
            exact = widened.T @ widened
            row = dict(dtype=str(dtype).removeprefix("torch."), tokens=n, width=c, bias=bias,
                       scale=float(exact.abs().max()), chosen_promote=chosen[dtype])
            cpu = PackedSymmetric.zeros(c + bias)
            reference.kfac_accumulate(cpu, x, 1.0, bias)
            row["error_cpu_reference"] = max_error(cpu, exact)
            on_device = x.to(device)
            cuda = PackedSymmetric.zeros(c + bias, device)
            ops.kfac_accumulate(cuda, on_device, 1.0, bias, backend="torch")
            row["error_cuda_torch"] = max_error(cuda, exact)
            try:
                for promote in PROMOTIONS:
                    kernel.PROMOTE[dtype] = promote
                    out = PackedSymmetric.zeros(c + bias, device)
                    ops.kfac_accumulate(out, on_device, 1.0, bias, backend="triton")
                    row[f"error_triton_promote{promote}"] = max_error(out, exact)
                    if (n, c) == SHAPES[-1][:2]:
                        row[f"ms_triton_promote{promote}"] = triton.testing.do_bench(
                            lambda: ops.kfac_accumulate(out, on_device, 1.0, bias, backend="triton"))
            finally:
                kernel.PROMOTE[dtype] = chosen[dtype]
            rows.append(row)
            print(row, flush=True)
    write_json(args.output, dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows))


if __name__ == "__main__":
    main()
