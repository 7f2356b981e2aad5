"""The documented path measured: a pruned run's size on disk at each stage, and vLLM's decode speed before and after
quantizing its export.

    .venv-vllm/bin/python -m bench.serving.pipeline out/24 --label smollm2-24

RUN is a `surgeon prune` or `surgeon recover` output folder (for the recorded figures: `surgeon prune --model
smollm2-135m --structure 2:4 --nsamples 2 --seqlen 128 --calibration wikitext2-valid --eval-windows 1 --eval-seqlen
128 --output out/24`; the weights' values do not change the speed). Run it in the vLLM environment (`make
install-vllm`): it exports RUN (`surgeon export --compact`) and quantizes the export (`surgeon quantize --scheme
SCHEME` in llm-compressor's environment, `make install-llmcompressor`) into `--work`, then times both checkpoints
with `bench.timing.serve_speed`'s measurement (each in a fresh process, in turn over `--rounds`; decode tokens/s
leaves the prefill out). Sizes are those of the weight files (*.safetensors). The result goes to
bench/results/pipeline/<label>@<commit>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from bench.machine import cpu_machine  # noqa: E402
from bench.quality.table import head_commit  # noqa: E402
from bench.timing import serve_speed  # noqa: E402
from bench.timing.in_turn import median_of, run_in_turn  # noqa: E402
from surgeon.app.cli import main as surgeon  # noqa: E402
from surgeon.integrations.quantize import weight_bytes  # noqa: E402
from surgeon.io import write_json  # noqa: E402


def stages(run: Path, work: Path, scheme: str, python: Path) -> tuple[Path, Path]:
    """RUN's compact export and that export quantized with `scheme`, written afresh into `work`."""
    export, quantized = work / "export", work / scheme.lower()
    shutil.rmtree(work, ignore_errors=True)
    if surgeon(["--quiet", "export", str(run), "--compact", "--output", str(export)]) != 0:
        sys.exit(f"surgeon export {run} failed")
    subprocess.run([str(python), "-m", "surgeon", "--quiet", "quantize", str(export), "--output", str(quantized),
                    "--scheme", scheme], check=True)
    return export, quantized


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a `surgeon prune` or `surgeon recover` output folder")
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
    parser.add_argument("--rounds", type=int, default=2, help="measure both checkpoints this many times, in turn")
    args = parser.parse_args()
    if not args.llmcompressor_python.is_file():
        parser.error(f"{args.llmcompressor_python} is missing: make install-llmcompressor")
    export, quantized = stages(args.run, args.work, args.scheme, args.llmcompressor_python)
    report = json.loads((quantized / "report.json").read_text())["quantize"]
    # the timed processes run serve_speed.py as a script, which imports `bench` from the repository's root
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    rounds = run_in_turn(serve_speed.__file__, [str(export), str(quantized)], args.rounds, [
        "--batch", *map(str, args.batch), "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens),
        "--repeats", str(args.repeats)])
    speed = {name: median_of(runs, serve_speed.FIELDS) for name, runs in zip(("export", "quantized"), rounds)}
    commit = head_commit()
    label = args.label or args.run.name
    result = {"label": label, "run": str(args.run), "scheme": args.scheme, "format": report["format"],
              "bytes": {"run": weight_bytes(args.run), "export": weight_bytes(export),
                        "quantized": weight_bytes(quantized)},
              "speed": speed, "machine": cpu_machine(os.cpu_count() or 1), "commit": commit,
              "command": " ".join(["python -m bench.serving.pipeline", *sys.argv[1:]]),
              **{k: v for k, v in vars(args).items() if k in ("batch", "prompt", "new_tokens", "repeats", "rounds")}}
    write_json(ROOT / "bench" / "results" / "pipeline" / f"{label}@{commit}.json", result)
    sizes = ", ".join(f"{stage} {size / 1e6:.1f} MB" for stage, size in result["bytes"].items())
    print(f"{label}: {sizes}")
    for name, figures in speed.items():
        print(f"  {name}: decode " + ", ".join(f"batch {batch} {rate:.1f}/s"
                                              for batch, rate in figures["decode_tokens_per_s"].items()))


if __name__ == "__main__":
    main()
