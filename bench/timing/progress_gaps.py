"""The longest time a `surgeon prune` run shows nothing moving, on a random Llama 4× as wide as SmolLM2-135M.

    python -m bench.timing.progress_gaps [--layers 2]

Saves a random Llama with SmolLM2-135M's vocabulary and tokenizer but 4× its widths (hidden 2304, MLP 6144, 36
heads of 64 over 12 KV heads) and a few decoder blocks, then runs the CLI's defaults on it, structured 80% and
unstructured 50% (with its held-out choice), 8 × 512 calibration tokens. Every write to the terminal (a progress bar
moving, a log line) is timed as it arrives; a run's gap is the longest stretch without one, and the phase it ended
in is the text that ended it. Writes bench/results/cpu/progress-gaps@<commit>.json; `python -m bench.results_md` puts
it into RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import provenance as pv
from bench.machine import cpu_machine
from bench.provenance import RESULTS, git
from bench.section import Section
from surgeon.io import write_json

RUNS = {"structured-0.8": ["--structure", "structured", "--target-size", "0.8"],
        "unstructured-0.5": ["--structure", "unstructured", "--target-size", "0.5"]}


def wide_model(folder: Path, layers: int) -> None:
    """A random Llama 4× as wide as SmolLM2-135M with `layers` blocks, and SmolLM2's tokenizer, saved in `folder`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from surgeon.models.adapter import load_model

    _, tokenizer = load_model("smollm2-135m")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=2304, intermediate_size=6144, num_hidden_layers=layers,
                         num_attention_heads=36, num_key_value_heads=12, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def timed_run(command: list[str]) -> tuple[float, str, float]:
    """Run `command`, timing each write to its terminal: the longest gap, the text that ended it, the total."""
    start = last = time.perf_counter()
    gap, after, line = 0.0, "", b""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    while chunk := process.stdout.read1(4096):  # type: ignore[attr-defined]
        now = time.perf_counter()
        line = (line + chunk)[-400:]
        if now - last > gap:
            gap, after = now - last, line.decode(errors="replace").replace("\r", "\n").strip().rpartition("\n")[2]
        last = now
    if process.wait():
        raise SystemExit(f"{' '.join(command)} failed:\n{line.decode(errors='replace')}")
    return gap, after, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    commit = git("rev-parse", "--short=7", "HEAD").stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        wide_model(Path(folder) / "model", args.layers)
        for name, options in RUNS.items():
            command = [sys.executable, "-m", "surgeon", "prune", "--model", str(Path(folder) / "model"), *options,
                       "--nsamples", "8", "--seqlen", "512", "--eval-windows", "1", "--eval-seqlen", "512",
                       "--calibration", "wikitext2-valid", "--output", str(Path(folder) / name)]
            gap, after, seconds = timed_run(command)
            rows.append({"run": name, "longest_gap_s": gap, "ended_by": after, "seconds": seconds,
                         "command": " ".join(["surgeon", *command[3:]]).replace(folder, "TMP")})
            print(f"{name}: longest gap {gap:.1f} s (ended by {after!r}), {seconds:.0f} s in all", flush=True)
    write_json(RESULTS / "cpu" / f"progress-gaps@{commit}.json",
               {"model": f"random Llama, hidden 2304, MLP 6144, {args.layers} blocks, SmolLM2's vocabulary",
                "machine": cpu_machine(torch.get_num_threads()), "rows": rows})


SECTIONS = {"progress": Section(
    "cpu/progress-gaps@*.json",
    "run | longest without a moving bar or a log line, s | the bar that ended it | seconds | command",
    lambda path, result: [
        (row["run"], f"{row['longest_gap_s']:.1f}", row["ended_by"].split(":")[0], f"{row['seconds']:.0f}",
         f"`{row['command']}`") for row in result["rows"]], pv.CPU_PRUNING, newest="file",
    intro=lambda result: f"The model: {result['model']}.")}


if __name__ == "__main__":
    main()
