"""Generation speed of dense, pruned and compact models: prefill and decode tokens/s, peak memory, size.

    python -m bench.timing.generation_speed smollm2-135m OUT/pruned [--label dense masked] [--device cpu]

Each model (a built-in name, a hub id or a saved directory such as a `surgeon prune` output) is
measured in a fresh process, so that its peak memory is its own: prefill tokens/s for one sequence of
each `--prefill` length, and decode tokens/s (greedy, one token per forward with the KV cache) at each
`--decode-batch` after a `--context`-token prompt, the median of `--repeats` timed runs after one
untimed warm-up. `--cache dynamic` is transformers' default cache, which concatenates every layer's
keys and values anew at each token; `--cache static` preallocates them (`StaticCache`, what
`generate(cache_implementation="static")` uses). `--rounds N` measures the models in turn N times and
keeps each figure's median, so that a drift in the machine's speed does not favour one model. Also
recorded: parameters (embeddings included, tied weights once), the zero
fraction of the prunable weights, the safetensors bytes of a saved directory, and the peak memory
(CUDA: allocated; CPU: the process's peak RSS). Results go to
bench/results/<cpu|gpu>/generation-<label>@<commit>.json; `make results` puts them in RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import StaticCache

from bench import provenance as pv
from bench.quality.table import head_commit
from bench.section import Section, link, per_batch, recorded
from bench.timing.in_turn import add_arguments, labels, median_of, run_in_turn
from surgeon.io import write_json
from surgeon.models.adapter import load_model, prunable_layers
from surgeon.pruning.report import peak_memory_gb

ROOT = Path(__file__).resolve().parents[2]


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _median_seconds(run, repeats: int) -> float:
    """Median wall time of `run()` over `repeats` calls after one untimed warm-up; `run` returns the seconds
    of its timed part."""
    run()
    return statistics.median(run() for _ in range(repeats))


def prefill_tokens_per_s(model, length: int, device: torch.device, repeats: int) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0)).to(device)

    def run() -> float:
        start = _clock(device)
        model(ids, use_cache=True)
        return _clock(device) - start

    return length / _median_seconds(run, repeats)


def decode_tokens_per_s(model, batch: int, context: int, new_tokens: int, device: torch.device, repeats: int,
                        cache: str = "dynamic") -> float:
    ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)

    def run() -> float:
        kv = StaticCache(config=model.config, max_cache_len=context + new_tokens) if cache == "static" else None
        out = model(ids, past_key_values=kv, use_cache=True)  # the prompt, untimed
        kv, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = _clock(device)
        for _ in range(new_tokens):
            out = model(token, past_key_values=kv, use_cache=True)
            kv, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return _clock(device) - start

    return batch * new_tokens / _median_seconds(run, repeats)


def measure(name: str, args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    model, _ = load_model(name, None, args.dtype, args.device)
    prunable = [module.weight for block in prunable_layers(model) for _, module in block]
    path = Path(name)
    result = {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "prunable_zero_fraction": sum(int((w == 0).sum()) for w in prunable) / sum(w.numel() for w in prunable),
        "safetensors_bytes": sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else None,
        "prefill_tokens_per_s": {},
        "decode_tokens_per_s": {},
    }
    with torch.inference_mode():
        for length in args.prefill:
            result["prefill_tokens_per_s"][str(length)] = prefill_tokens_per_s(model, length, device, args.repeats)
        for batch in args.decode_batch:
            result["decode_tokens_per_s"][str(batch)] = decode_tokens_per_s(
                model, batch, args.context, args.new_tokens, device, args.repeats, args.cache)
    result["peak_memory_gb"] = peak_memory_gb(device)
    return result


# the figures whose median over the rounds is kept
FIELDS = ("prefill_tokens_per_s", "decode_tokens_per_s", "peak_memory_gb")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, "built-in names, hub ids or saved directories", rounds=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prefill", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--decode-batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, default=2048, help="prompt tokens before decoding")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--cache", choices=("dynamic", "static"), default="dynamic", help="the decode KV cache")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.models[0], args)))
        return
    names = labels(parser, args.models, args.label)
    commit = head_commit()
    kind = "gpu" if args.device.startswith("cuda") else "cpu"
    machine = (torch.cuda.get_device_name(args.device) if kind == "gpu" else
               f"{platform.machine()} {torch.get_num_threads()} threads")
    settings = {k: v for k, v in vars(args).items() if k not in ("models", "label", "one")}
    rounds = run_in_turn("bench.timing.generation_speed", args.models, args.rounds, [
        "--device", args.device, "--dtype", args.dtype, "--prefill", *map(str, args.prefill),
        "--decode-batch", *map(str, args.decode_batch), "--context", str(args.context),
        "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats), "--cache", args.cache])
    for label, runs in zip(names, rounds):
        result = {**median_of(runs, FIELDS), "label": label, "machine": machine, "commit": commit,
                  "torch": torch.__version__,
                  "command": " ".join(["python -m bench.timing.generation_speed", *sys.argv[1:]]), **settings}
        write_json(ROOT / "bench" / "results" / kind / f"generation-{label}@{commit}.json", result)
        print(f"{label}: {result['parameters'] / 1e6:.1f} M parameters · prefill "
              + ", ".join(f"{k} tok {v:.0f}/s" for k, v in result["prefill_tokens_per_s"].items()) + " · decode "
              + ", ".join(f"batch {k} {v:.1f}/s" for k, v in result["decode_tokens_per_s"].items())
              + f" · peak {result['peak_memory_gb']:.2f} GiB")


SECTIONS = {"generation": Section(
    "cpu/generation-*.json gpu/generation-*.json",
    "model | machine | parameters | prunable zeros | safetensors MB | prefill tokens/s | "
    "decode tokens/s (context) | KV cache | rounds | peak GiB", lambda path, run: [
        (link(path, run["label"]), run["machine"], f"{run['parameters'] / 1e6:.1f} M",
         f"{run['prunable_zero_fraction']:.3f}",
         "-" if run["safetensors_bytes"] is None else f"{run['safetensors_bytes'] / 1e6:.0f}",
         per_batch(run["prefill_tokens_per_s"], ".0f", ""), f"{per_batch(run['decode_tokens_per_s'])} "
         f"({run['context']})", run.get("cache", "dynamic"), run.get("rounds", 1), f"{run['peak_memory_gb']:.2f}")],
    pv.CODE, command=recorded)}


if __name__ == "__main__":
    main()
