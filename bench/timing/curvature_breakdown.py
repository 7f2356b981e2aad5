r"""Where a curvature pass's time goes on a model of a paper's shape with random weights.

    python -m bench.timing.curvature_breakdown --config bench/configs/llama-2-7b.json --layers 8 --device cuda \
        --output out/curvature-breakdown.json

Times, after one warm-up pass (which compiles and autotunes the kernels), three passes over the same
calibration windows: the forward and input-gradient backward alone (no hooks: what any Fisher pass
costs), `surgeon.pruning.curvature.estimate` as pruning runs it, and `estimate` with its factor
accumulation (`ops.kfac_accumulate_group`) left out, which leaves the hooks' other work (squared sums
for the structured costs, queueing). On CUDA it also counts the pass's host-device synchronisations
(`torch.cuda.set_sync_debug_mode`) by where they come from, and writes torch.profiler's costliest ops of one
steady-state pass.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

from bench.timing.shot_time import build
from surgeon.io import write_json
from surgeon.models.adapter import DTYPES, prunable_layers
from surgeon.pruning import curvature
from surgeon.pruning.report import clock


def _timed(device: torch.device, run) -> float:
    """Seconds `run()` takes, its queued device work included."""
    start = clock(device)
    run()
    return clock(device) - start


@contextmanager
def _sync_sites(device: torch.device, counts: collections.Counter):
    """Count each host-device synchronisation inside by the innermost Python frames that caused it."""
    if device.type != "cuda":
        yield
        return

    def record(message, category, filename, lineno, file=None, line=None):
        frames = traceback.extract_stack()[:-1]
        counts[" <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-4:]))] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=8, help="keep only the first N decoder blocks")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--nsamples", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    model, config = build(args.config, args.layers, DTYPES[args.dtype], args.device)
    layers = [layer for block in prunable_layers(model) for layer in block]
    windows = torch.randint(0, config.vocab_size, (args.nsamples, args.seqlen),
                            generator=torch.Generator().manual_seed(0)).to(device)

    def estimate(windows: torch.Tensor = windows) -> None:
        curvature.estimate(model, layers, windows, batch_size=args.batch_size, progress=False)

    def plain() -> None:
        with curvature.frozen(model):
            for batch in windows.split(args.batch_size):
                curvature.backward(model, batch)

    estimate(windows[: 2 * args.batch_size])  # compiles and autotunes
    seconds = {"forward and backward": _timed(device, plain), "estimate": _timed(device, estimate)}
    with mock.patch.object(curvature.ops, "kfac_accumulate_group", lambda *args: None):
        seconds["estimate without factor accumulation"] = _timed(device, estimate)
    sites: collections.Counter = collections.Counter()
    with _sync_sites(device, sites):
        estimate(windows[: 4 * args.batch_size])
    result = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", torch=torch.__version__,
        command=" ".join(sys.argv), blocks=config.num_hidden_layers, tokens=windows.numel(), seconds=seconds,
        syncs_per_4_batches=dict(sites.most_common()),
    )
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
            estimate()
        averages = trace.key_averages()
        result["profile"] = (averages.table(sort_by="self_cuda_time_total", row_limit=30)
                             + averages.table(sort_by="self_cpu_time_total", row_limit=15))
    write_json(args.output, result)
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}, indent=1))


if __name__ == "__main__":
    main()
