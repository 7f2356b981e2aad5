"""Time and peak memory of the memory options (activation checkpointing, offload, block groups), SmolLM2 on the CPU.

    python -m bench.timing.memory_options

Prunes SmolLM2-135M structured to 80% in one shot through the CLI, once per option set: none;
`--activation-checkpointing`; and with `--offload --block-groups 3`. Calibration is one batch of
8 windows of 512 tokens (`--batch-size 8`), so that the pass's activations weigh. Each run is its
own process, so its peak resident memory (`report.json`'s `peak_memory_gb` on the CPU) is its own;
on the CPU, host and device are one memory, so offload and block groups change the time only,
while activation checkpointing lowers the peak. Each run's weights are compared with the first's
(the options must not change a bit). Writes bench/results/cpu/memory-options-smollm2@<commit>.json;
`python -m bench.results_md` puts it into RESULTS.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench import provenance as pv
from bench.machine import cpu_machine
from bench.section import Section

ROOT = Path(__file__).resolve().parents[1]  # bench/

OPTIONS = {"none": [], "activation-checkpointing": ["--activation-checkpointing"],
           "activation-checkpointing+offload+3-block-groups": ["--activation-checkpointing", "--offload",
                                                               "--block-groups", "3"]}


def head_commit() -> str:
    """The short hash of the checked-out commit, which names the result file."""
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def run(options: list[str], folder: Path) -> tuple[dict, dict[str, torch.Tensor], str]:
    """One `surgeon prune` run with `options`: its report, pruned weights and command."""
    args = ["-m", "surgeon", "--quiet", "prune", "--model", "smollm2-135m", "--structure", "structured",
            "--target-size", "0.8", "--shots", "1", "--nsamples", "8", "--seqlen", "512", "--batch-size", "8",
            "--eval-windows", "2", "--eval-seqlen", "512", "--calibration", "wikitext2-valid", *options,
            "--output", str(folder)]
    subprocess.run([sys.executable, *args], check=True, cwd=ROOT.parent)
    report = json.loads((folder / "report.json").read_text())
    weights = {}
    for path in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(path))
    return report, weights, " ".join(["python", *args]).replace(str(folder), "DIR")


def main() -> None:
    commit = head_commit()
    path = ROOT / "results" / "cpu" / f"memory-options-smollm2@{commit}.json"
    rows, first = [], None
    with tempfile.TemporaryDirectory() as folder:
        for name, options in OPTIONS.items():
            report, weights, command = run(options, Path(folder) / name)
            first = first or weights
            shot = report["shots"][0]
            rows.append({"options": name, "command": command, "curvature_seconds": shot["seconds"]["curvature"],
                         "prune_seconds": shot["seconds"]["prune"], "peak_memory_gb": shot["peak_memory_gb"],
                         "ppl": report["ppl_after"],
                         "same_weights": all(torch.equal(first[key], weights[key]) for key in first)})
            print(json.dumps(rows[-1]))
    path.write_text(json.dumps({"commit": commit, "machine": cpu_machine(torch.get_num_threads()),
                                "command": "python -m bench.timing.memory_options", "rows": rows}, indent=1) + "\n")
    print(path)


SECTIONS = {"memory-options": Section(
    "cpu/memory-options-smollm2@*.json", "options | curvature s | prune s | peak GiB | same weights | command",
    lambda path, result: [
        (row["options"], f"{row['curvature_seconds']:.1f}", f"{row['prune_seconds']:.1f}",
         f"{row['peak_memory_gb']:.2f}", "yes" if row["same_weights"] else "no", f"`{row['command']}`")
        for row in result["rows"]], pv.CPU_PRUNING, newest="file")}


if __name__ == "__main__":
    main()
