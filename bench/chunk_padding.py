"""Padding of the batched K×K solves, and the padding-free alternatives (CPU).

    python bench/chunk_padding.py

One 576×1536 layer at 50% (the problem of `bench/bench_kk_solve.py`), pruned weights cut into row
chunks of at most 64 and 576: the fraction of padded matrix entries of the PyTorch path's batches
(`kk_solve.reference.PAD_RATIO` as shipped), against batches of equal-length chunks only (PAD_RATIO
= 1: no padding, more batches); and `updates.solve_chunks` seconds (best of 3, interleaved) for
those two and for the compiled op (each chunk gathered at its own size and solved, no padding).
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.bench_kk_solve import _problem  # noqa: E402
from surgeon.method import updates  # noqa: E402
from surgeon_kernels import available_backends  # noqa: E402
from surgeon_kernels.kk_solve import reference  # noqa: E402


def main() -> None:
    W, f, mask = _problem(576, 1536)
    r, c = mask.nonzero(as_tuple=True)
    shipped = reference.PAD_RATIO
    for max_correlate in (64, 576):
        chunks = updates.row_chunks(r, max_correlate)
        lengths = [chunk.stop - chunk.start for chunk in chunks]
        for ratio in (shipped, 1.0):
            batches = reference.chunk_batches(lengths, pad_ratio=ratio)
            padded = sum(len(b) * max(lengths[i] for i in b) ** 2 for b in batches)
            waste = 1 - sum(k * k for k in lengths) / padded
            print(f"chunks of <= {max_correlate}: {len(chunks)} chunks, PAD_RATIO {ratio}: {len(batches)} batches, "
                  f"{waste:.2%} of matrix entries are padding")
        offsets = torch.tensor([0] + [chunk.stop for chunk in chunks])
        variants = {f"torch, PAD_RATIO {ratio}": functools.partial(
            reference.kk_solve, f.G, f.A, r, c, W[r, c], offsets, pad_ratio=ratio) for ratio in (shipped, 1.0)}
        if "cpp" in available_backends("cpu", "kk_solve"):
            variants["cpp, each chunk at its size"] = functools.partial(
                updates.solve_chunks, f, r, c, W[r, c], chunks, backend="cpp")
        best: dict[str, float] = {}
        for _ in range(3):
            for label, run in variants.items():
                start = time.perf_counter()
                run()
                best[label] = min(best.get(label, float("inf")), time.perf_counter() - start)
        print("  K×K solve seconds (best of 3): " + ", ".join(f"{k}: {v:.3f}" for k, v in best.items()))


if __name__ == "__main__":
    main()
