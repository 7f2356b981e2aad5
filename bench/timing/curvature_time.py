"""Seconds of one curvature pass (forward, input-gradient backward, factor accumulation) on SmolLM2.

    python -m bench.timing.curvature_time --windows 4 --seqlen 512 --repeats 3 [--dtype float32 bfloat16]

Loads the embedded SmolLM2-135M, takes calibration windows from the packaged WikiText-2 validation
split, runs one warm-up window, then times `surgeon.pruning.curvature.estimate` over `--windows` windows once
per repeat and dtype, interleaved (a shared machine's speed drifts: compare the best of several). A dtype
other than the model's runs the pass on a copy of the model in that dtype (factors stay float32).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from surgeon.app.data import calibration_text, calibration_windows, tokenize
from surgeon.models.adapter import DTYPES, load_model, prunable_layers
from surgeon.pruning import curvature


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=sorted(DTYPES))
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2-135m", None, "float32", "cpu")
    windows = calibration_windows(tokenize(tokenizer, calibration_text("wikitext2-valid")), args.windows + 1,
                                  args.seqlen, 0)
    models = {name: model if DTYPES[name] == torch.float32 else copy.deepcopy(model).to(DTYPES[name])
              for name in args.dtype}
    best = {}
    for m in models.values():
        curvature.estimate(m, [p for b in prunable_layers(m) for p in b], windows[:1])  # warm-up
    for repeat in range(args.repeats):
        for name, m in models.items():
            start = time.perf_counter()
            curvature.estimate(m, [p for b in prunable_layers(m) for p in b], windows[1:])
            seconds = time.perf_counter() - start
            best[name] = min(best.get(name, seconds), seconds)
            print(f"repeat {repeat + 1} {name}: {seconds:.2f} s for {args.windows} windows of {args.seqlen}",
                  flush=True)
    for name, seconds in best.items():
        print(f"best {name}: {seconds:.2f} s ({seconds / args.windows:.2f} s per window)")


if __name__ == "__main__":
    main()
