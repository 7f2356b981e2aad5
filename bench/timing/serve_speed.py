"""Serving speed in vLLM: offline greedy generation of a dense model and of its compact exports.

    python -m bench.timing.serve_speed DENSE OUT/decilm --label smollm2-dense smollm2-coupled80-decilm

Run it in the vLLM environment (`make install-vllm`; `.venv-vllm/bin/python …`). Each model (a hub id
or a saved directory: a dense checkpoint, a `surgeon export` output) is served by its own vLLM engine
(`LLM(model, trust_remote_code=True)`; on the CPU float32 and eager mode) in a fresh process. Per
`--batch`, the engine generates `--new-tokens` tokens and, separately, 1 token greedily (`ignore_eos`)
from the same `--prompt`-token random prompts, each the median of `--repeats` timed runs after one
untimed warm-up: decode tokens/s = batch · (new tokens − 1) / (the difference of the two times), which
leaves the prefill out; end-to-end tokens/s = batch · new tokens / the first time. `--rounds N`
measures the models in turn N times and keeps each figure's median, so that a drift in the machine's
speed favours no model. Results go to bench/results/<cpu|gpu>/serve-<label>@<commit>.json; `make
results` puts them in RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from bench import provenance as pv
from bench.quality.table import head_commit
from bench.section import Section, link, per_batch, recorded
from bench.timing.in_turn import add_arguments, labels, median_of, run_in_turn
from surgeon.io import write_json

ROOT = Path(__file__).resolve().parents[2]


def parameters(folder: str) -> int | None:
    """The number of weights in a saved directory's safetensors files (None for a hub id)."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    count = 0
    for file in files:
        with safe_open(file, "pt") as handle:
            count += sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())  # noqa: SIM118 (a safetensors handle, not a dict)
    return count


def measure(name: str, args: argparse.Namespace) -> dict:
    """One model in this process: its engine, then per batch the medians of the timed generations."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    cpu = args.device == "cpu"
    settings = dict(dtype=args.dtype, enforce_eager=True, kv_cache_memory_bytes=4 << 30) if cpu else {}
    llm = LLM(model=name, trust_remote_code=True, max_model_len=args.prompt + args.new_tokens,
              max_num_seqs=max(args.batch), seed=0, **settings)
    vocab = llm.llm_engine.model_config.get_vocab_size()

    def seconds(batch: int, tokens: int) -> float:
        ids = torch.randint(0, vocab, (batch, args.prompt), generator=torch.Generator().manual_seed(batch)).tolist()
        prompts = [TokensPrompt(prompt_token_ids=p) for p in ids]
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    out: dict = {"decode_tokens_per_s": {}, "end_to_end_tokens_per_s": {}, "parameters": parameters(name),
                 "vllm": vllm.__version__}
    for batch in args.batch:
        seconds(batch, args.new_tokens)  # warm-up
        full = statistics.median(seconds(batch, args.new_tokens) for _ in range(args.repeats))
        first = statistics.median(seconds(batch, 1) for _ in range(args.repeats))
        out["decode_tokens_per_s"][str(batch)] = batch * (args.new_tokens - 1) / (full - first)
        out["end_to_end_tokens_per_s"][str(batch)] = batch * args.new_tokens / full
    return out


FIELDS = ("decode_tokens_per_s", "end_to_end_tokens_per_s")  # the figures whose median over the rounds is kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, "hub ids or saved directories", rounds=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="on the CPU (bfloat16 "
                        "for int8 checkpoints on hosts with AMX, whose int8 GEMM takes no float32 activations)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.models[0], args)))
        return
    names = labels(parser, args.models, args.label)
    commit = head_commit()
    machine = f"{platform.machine()} {os.cpu_count()} cores" if args.device == "cpu" else "cuda"
    settings = {k: v for k, v in vars(args).items() if k not in ("models", "label", "one")}
    rounds = run_in_turn("bench.timing.serve_speed", args.models, args.rounds, [
        "--device", args.device, "--batch", *map(str, args.batch), "--prompt", str(args.prompt),
        "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)])
    kind = "cpu" if args.device == "cpu" else "gpu"
    for label, runs in zip(names, rounds):
        result = {**median_of(runs, FIELDS), "label": label, "machine": machine, "commit": commit,
                  "command": " ".join(["python -m bench.timing.serve_speed", *sys.argv[1:]]), **settings}
        write_json(ROOT / "bench" / "results" / kind / f"serve-{label}@{commit}.json", result)
        print(f"{label}: decode " + ", ".join(f"batch {k} {v:.1f}/s" for k, v in result["decode_tokens_per_s"].items())
              + " · end to end " + ", ".join(f"batch {k} {v:.1f}/s"
                                            for k, v in result["end_to_end_tokens_per_s"].items()))


SECTIONS = {"serve": Section(
    "cpu/serve-*.json gpu/serve-*.json",
    "model | machine | vLLM | parameters | decode tokens/s | end-to-end tokens/s | rounds", lambda path, run: [
        (link(path, run["label"]), run["machine"], run["vllm"],
         "-" if run["parameters"] is None else f"{run['parameters'] / 1e6:.1f} M",
         per_batch(run["decode_tokens_per_s"]), per_batch(run["end_to_end_tokens_per_s"]), run["rounds"])],
    pv.SERVING, command=recorded)}


if __name__ == "__main__":
    main()
