r"""End-to-end time and memory of pruning shots on a model of a paper's shape with random weights.

    python -m bench.timing.shot_time --config bench/configs/llama-2-7b.json --device cuda --dtype bfloat16 \
        --nsamples 128 --seqlen 2048 --shots 4 --target-size 0.8 --output bench/results/shot-llama2-7b.json

The model is built from a Hugging Face config (bench/configs/: the paper's OPT and Llama-2 shapes)
with random weights, the calibration windows are random tokens: the numbers say how long a shot
takes and how much memory it needs, nothing about quality. `--layers N` keeps the first N decoder
blocks (for a quick check of a shape). Unstructured and N:M runs are weighed against one
sparsegpt-refine shot on held-out windows of random tokens, max(2, nsamples // 4) of them as
`surgeon prune` draws (with `--held-out 0`, and under torchrun, LLM Surgeon's run stays alone).
Writes the prune report (seconds per phase and peak memory per shot, the other shot's seconds
under `choice`) with the device, shapes and settings.

Under torchrun (`torchrun --nproc-per-node N -m bench.timing.shot_time … --device cuda`) the ranks prune
together, one GPU each (`--curvature-split`, `--fsdp`: as `surgeon prune`); rank 0 writes the report,
its peak memory being its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

import torch

from bench import provenance as pv
from bench.section import Section, link
from surgeon import PruneConfig, prune
from surgeon.io import write_json
from surgeon.models.adapter import DTYPES
from surgeon.pruning import curvature
from surgeon.scale import distributed
from surgeon.scale.time_model import held_out_windows


def build(config_path: Path, layers: int | None, dtype: torch.dtype, device: str):
    """A causal LM of the config's shape with random weights, on `device`, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = json.loads(config_path.read_text())
    values.pop("torch_dtype", None)
    if layers:
        values["num_hidden_layers"] = layers
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval(), config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=None, help="keep only the first N decoder blocks")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    parser.add_argument("--nsamples", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--structure", default="structured")
    parser.add_argument("--target-size", type=float, default=None, help="default: 0.8; N:M keeps N/M")
    parser.add_argument("--shots", type=int, default=None, help="default: PruneConfig's for the structure")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--curvature-split", default="batches", choices=["batches", "blocks"])
    parser.add_argument("--fsdp", action="store_true", help="under torchrun: shard the weights with FSDP2")
    parser.add_argument("--activation-checkpointing", action="store_true", help="as `surgeon prune`")
    parser.add_argument("--offload", action="store_true", help="as `surgeon prune` (structured, coupled)")
    parser.add_argument("--block-groups", type=int, default=1, help="as `surgeon prune` (with --offload)")
    parser.add_argument("--held-out", type=int, default=None,
                        help="held-out windows for the held-out choice (default: max(2, nsamples // 4), as surgeon "
                             "prune; 0: LLM Surgeon's run alone)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="also write torch.profiler's table of the run's costliest ops to this file")
    args = parser.parse_args()
    if args.held_out is not None and args.held_out < 0:
        parser.error(f"--held-out {args.held_out}: give a number of windows, 0 or more")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    group = distributed.init(args.device) if distributed.launched() else None
    device = distributed.local_device(args.device) if group is not None else args.device
    start = time.perf_counter()
    model, config = build(args.config, args.layers, DTYPES[args.dtype], "cpu" if args.fsdp else device)
    if args.fsdp:
        distributed.shard_model(model, device)
    built = time.perf_counter() - start
    held_out = held_out_windows(args.nsamples) if args.held_out is None else args.held_out
    windows = torch.randint(0, config.vocab_size, (args.nsamples + held_out, args.seqlen),
                            generator=torch.Generator().manual_seed(0))
    windows, held_out_ids = windows[: args.nsamples], windows[args.nsamples:] if held_out else None
    prune_config = PruneConfig(structure=args.structure, target_size=args.target_size, shots=args.shots,
                               batch_size=args.batch_size, backend=args.backend,
                               curvature_split=args.curvature_split,
                               activation_checkpointing=args.activation_checkpointing, offload=args.offload,
                               block_groups=args.block_groups)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as trace:
            report = prune(model, windows, prune_config, group=group, held_out_ids=held_out_ids)
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        args.profile.write_text(trace.key_averages().table(sort_by=sort, row_limit=40)
                                + trace.key_averages().table(sort_by="cpu_time_total", row_limit=40))
    else:
        report = prune(model, windows, prune_config, group=group, held_out_ids=held_out_ids)
    if group is not None and torch.distributed.get_rank(group) != 0:
        return
    device = torch.device(device)
    result = dict(
        device=(torch.cuda.get_device_name(device) if device.type == "cuda"
                else platform.processor() or platform.machine()),
        torch=torch.__version__, model_config=str(args.config), blocks=config.num_hidden_layers,
        hidden=config.hidden_size, dtype=args.dtype, nsamples=args.nsamples, seqlen=args.seqlen,
        build_seconds=built, command=" ".join(sys.argv), ranks=1 if group is None else group.size(),
        group_bytes=curvature.DEFAULT_GROUP_BYTES.get(device.type, 0),
        **report.to_dict(),
    )
    result.pop("layers")  # per-layer sparsity of random weights says nothing
    write_json(args.output, result)
    for shot in report.shots:
        print(json.dumps(dict(shot=shot.shot, seconds=shot.seconds, peak_memory_gb=shot.peak_memory_gb)))


SECTIONS = {"gpu-time": Section(
    "gpu/shot-*.json", "run | device | shots | s per shot | total s | peak GiB", lambda path, run: [
        (link(path, pv.row_of(path)), run["device"], len(run["shots"]), f"{min(seconds):.1f}–{max(seconds):.1f}",
         f"{run['seconds']:.0f}", f"{max(s['peak_memory_gb'] for s in run['shots']):.1f}")  # curvature and prune
        for seconds in [[s["seconds"].get("curvature", 0) + s["seconds"].get("prune", 0) for s in run["shots"]]]],
    pv.PRUNING, command=lambda path, run: (pv.row_of(path), "python " + run["command"]))}


if __name__ == "__main__":
    main()
