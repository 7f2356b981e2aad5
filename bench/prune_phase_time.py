"""Seconds of one structured shot's prune phase (costs, threshold, update) on SmolLM2, CPU.

    python bench/prune_phase_time.py [--windows 2] [--profile]

Estimates the curvature over `--windows` calibration windows of 512 tokens (packaged WikiText-2
validation), then runs the first shot of the CPU protocol (structured, 80% in 4 shots: 5% of the
weights) and prints the seconds of its three phases; `--profile` prints the `torch.profiler` table
of the phase instead. Run it from the tree to time (it imports `surgeon` from the working directory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))

from surgeon.app.data import calibration_text, calibration_windows, tokenize  # noqa: E402
from surgeon.config import PruneConfig  # noqa: E402
from surgeon.models import channels  # noqa: E402
from surgeon.models.adapter import load_model, prunable_layers  # noqa: E402
from surgeon.models.layer import Layer  # noqa: E402
from surgeon.pruning import curvature
from surgeon.pruning.structured import structured_shot  # noqa: E402
from surgeon.scale.distributed import Ranks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2-135m", None, "float32", "cpu")
    windows = calibration_windows(tokenize(tokenizer, calibration_text("wikitext2-valid")), args.windows, 512, 0)
    named = [pair for block in prunable_layers(model) for pair in block]
    config = PruneConfig(structure="structured", target_size=0.8, shots=4)
    layers = [Layer.unpruned(name, module) for name, module in named]
    coupled = channels.couplings(model, [name for name, _ in named])
    target_zeros = round((1 - config.shot_target(1)) * sum(layer.module.weight.numel() for layer in layers))
    raw = curvature.estimate(model, named, windows)
    ranks = Ranks(None, [[name for name, _ in named]])
    with torch.no_grad():
        if not args.profile:
            phases, _ = structured_shot(layers, raw, target_zeros, config, coupled, ranks)
            print(" · ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items()),
                  f"· total {sum(phases.values()):.2f} s")
            return
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            structured_shot(layers, raw, target_zeros, config, coupled, ranks)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


if __name__ == "__main__":
    main()
