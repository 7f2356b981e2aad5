"""The documented path measured: from a recovered run to a quantized model served by vLLM, with the perplexity,
the size on disk and vLLM's decode speed at each stage.

    .venv-vllm/bin/python -m bench.serving.pipeline out/s80/recovered --label smollm2-structured80

RUN is a `surgeon recover` output folder (or a `surgeon prune` one, which has no recovered stage), for the recorded
figures written by `surgeon prune … --recover-tokens N` (the command is in RUN's report.json, and in RESULTS). Run it
in the vLLM environment (`make install-vllm`): it exports RUN (`surgeon export --compact`) and quantizes the export
(`surgeon quantize --scheme SCHEME` in llm-compressor's environment, `make install-llmcompressor`) into `--work`.
Perplexity: dense, pruned and recovered as RUN's report measured them in transformers; the export and the quantized
checkpoint served by vLLM (in `--dtype`, float32 unless given; prompt log-probabilities) on the same test windows.
Speed: RUN's masked model (the dense model's shapes, so the dense model's speed), the export and the quantized
checkpoint timed with `bench.timing.serve_speed`'s measurement, in the same dtype, each in a fresh process, in turn
over `--rounds` (decode tokens/s leaves the prefill out). Sizes are those of the weight files (*.safetensors); RUN's
masked model has the dense model's shapes and size. The result goes to bench/results/pipeline/<label>@<commit>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench import provenance as pv
from bench.machine import cpu_machine
from bench.quality.table import head_commit
from bench.section import Section, link, per_batch, recorded
from bench.timing import serve_speed
from bench.timing.in_turn import median_of, run_in_turn
from surgeon import evaluation_text, tokenize
from surgeon.app.cli import main as surgeon
from surgeon.app.data import leading_token, windows_of
from surgeon.app.quantize import weight_bytes
from surgeon.io import write_json

ROOT = Path(__file__).resolve().parents[2]


def stages(run: Path, work: Path, scheme: str, python: Path) -> tuple[Path, Path]:
    """RUN's compact export and that export quantized with `scheme`, written afresh into `work`."""
    export, quantized = work / "export", work / scheme.lower()
    shutil.rmtree(work, ignore_errors=True)
    if surgeon(["--quiet", "export", str(run), "--compact", "--output", str(export)]) != 0:
        sys.exit(f"surgeon export {run} failed")
    subprocess.run([str(python), "-m", "surgeon", "--quiet", "quantize", str(export), "--output", str(quantized),
                    "--scheme", scheme], check=True)
    return export, quantized


def evaluation_windows(folder: Path, report: dict) -> list[list[int]]:
    """The test windows `report`'s evaluation used, tokenized by the checkpoint in `folder`."""
    from transformers import AutoTokenizer

    windows = report["eval"]["after"]["windows"]
    seqlen = report["eval"]["after"]["tokens"] // windows
    tokenizer = AutoTokenizer.from_pretrained(folder)
    bos = leading_token(tokenizer) if report["run"].get("eval_bos") else None
    return windows_of(tokenize(tokenizer, evaluation_text(report["run"]["dataset"])), seqlen, windows, bos).tolist()


def served_perplexity(folder: Path, windows: list[list[int]], dtype: str) -> float:
    """Perplexity of the checkpoint in `folder` served by vLLM on `windows` (as `surgeon.app.evaluate.perplexity`:
    the mean over windows of each window's mean negative log-likelihood)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    seqlen = len(windows[0])
    llm = LLM(model=str(folder), trust_remote_code=True, dtype=dtype, enforce_eager=True, max_model_len=seqlen + 1,
              kv_cache_memory_bytes=1 << 30, seed=0)
    try:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=window) for window in windows],
                               SamplingParams(max_tokens=1, detokenize=False, prompt_logprobs=0), use_tqdm=False)
    finally:
        del llm
        gc.collect()
    nll = [-sum(step[token].logprob for step, token in zip(out.prompt_logprobs[1:], window[1:])) / (seqlen - 1)
           for out, window in zip(outputs, windows)]
    return math.exp(sum(nll) / len(nll))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a `surgeon recover` (or `surgeon prune`) output folder")
    parser.add_argument("--label", help="the result file's name (default: the run's folder name)")
    parser.add_argument("--scheme", default="W8A8", help="surgeon quantize --scheme")
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "pipeline", help="where the export and the "
                        "quantized checkpoint are written (replaced)")
    parser.add_argument("--llmcompressor-python", type=Path, default=ROOT / ".venv-llmcompressor" / "bin" / "python",
                        help="the python of llm-compressor's environment, which runs `surgeon quantize`")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure, after one untimed warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="measure the checkpoints this many times, in turn")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="vLLM's, for every "
                        "stage (bfloat16 on hosts with AMX, whose int8 GEMM takes no float32 activations)")
    args = parser.parse_args()
    if not args.llmcompressor_python.is_file():
        parser.error(f"{args.llmcompressor_python} is missing: make install-llmcompressor")
    export, quantized = stages(args.run, args.work, args.scheme, args.llmcompressor_python)
    report = json.loads((quantized / "report.json").read_text())
    recovered = "ppl_dense" in report  # a recover run's report; a prune run's holds dense and pruned only
    ppl = ({"dense": report["ppl_dense"], "pruned": report["ppl_before"], "recovered": report["ppl_after"]}
           if recovered else {"dense": report["ppl_before"], "pruned": report["ppl_after"]})
    windows = evaluation_windows(export, report)
    ppl |= {"export": served_perplexity(export, windows, args.dtype),
            "quantized": served_perplexity(quantized, windows, args.dtype)}
    timed = {"run": args.run, "export": export, "quantized": quantized}
    rounds = run_in_turn("bench.timing.serve_speed", list(map(str, timed.values())), args.rounds, [
        "--batch", *map(str, args.batch), "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens),
        "--repeats", str(args.repeats), "--dtype", args.dtype])
    speed = {name: median_of(runs, serve_speed.FIELDS) for name, runs in zip(timed, rounds)}
    commit = head_commit()
    label = args.label or args.run.name
    result = {"label": label, "run": str(args.run), "scheme": args.scheme,
              "format": report["quantize"]["format"], "ppl": ppl, "eval": report["eval"]["after"],
              "pruned_with": {"run": report["run"], "config": report["config"]},
              "recovered_with": report.get("recover"),
              "bytes": {"run": weight_bytes(args.run), "export": weight_bytes(export),
                        "quantized": weight_bytes(quantized)},
              "speed": speed, "machine": cpu_machine(os.cpu_count() or 1), "commit": commit,
              "command": " ".join(["python -m bench.serving.pipeline", *sys.argv[1:]]),
              **{k: v for k, v in vars(args).items()
                 if k in ("batch", "prompt", "new_tokens", "repeats", "rounds", "dtype")}}
    write_json(ROOT / "bench" / "results" / "pipeline" / f"{label}@{commit}.json", result)
    sizes = ", ".join(f"{stage} {size / 1e6:.1f} MB" for stage, size in result["bytes"].items())
    print(f"{label}: {sizes}; perplexity " + ", ".join(f"{stage} {value:.2f}" for stage, value in ppl.items()))
    for name, figures in speed.items():
        print(f"  {name}: decode " + ", ".join(f"batch {batch} {rate:.1f}/s"
                                              for batch, rate in figures["decode_tokens_per_s"].items()))


def stage_cells(run: pv.Run, stage: str) -> tuple[str, str]:
    """A stage's size on disk and vLLM decode rate: the run folder's on its last stage, the export's, quantized's."""
    last = "recovered" if "recovered" in run["ppl"] else "pruned"
    timed = {"export": "export", "quantized": "quantized", last: "run"}
    if stage not in timed:
        return "", ""
    size = f"{run['bytes'][timed[stage]] / 1e6:.0f}" + (f" ({run['scheme']})" if stage == "quantized" else "")
    return size, per_batch(run["speed"][timed[stage]]["decode_tokens_per_s"])


SECTIONS = {"pipeline": Section(
    "pipeline/*.json", "run | stage | perplexity | weights MB | vLLM decode tokens/s", lambda path, run: [
        (link(path, run["label"]) if n == 0 else "", stage, f"{ppl:.2f}", *stage_cells(run, stage))
        for n, (stage, ppl) in enumerate(run["ppl"].items())], pv.CPU_RECOVERED, command=recorded)}


if __name__ == "__main__":
    main()
