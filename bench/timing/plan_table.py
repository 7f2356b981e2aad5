"""`surgeon plan` for the paper's model shapes: per-GPU peak, chosen strategy and projected time per shot.

    python -m bench.timing.plan_table

Counts OPT-125m … Llama-2-70B, Mixtral-8x7B and Qwen3-30B-A3B (bench/configs) in bfloat16, 128 × 2048
calibration tokens, structured (batch 2; the last three batch 1) and unstructured 50%, on 1, 2 and 8 GPUs
of 80 GB, from the configuration alone (no weights), with the floor of a shot's counted work on one
H100 and the projected time of the held-out choice's sparsegpt-refine shot where one process runs it.
Writes bench/results/plan/plan-table@<commit>.json; `python -m bench.results_md` puts the table into
RESULTS.md.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.section import Section
from surgeon.config import PruneConfig
from surgeon.scale.plan import make_plan
from surgeon.scale.plan_config import PlanConfig

ROOT = Path(__file__).resolve().parents[1]  # bench/
MODELS = ("opt-125m", "opt-1.3b", "opt-2.7b", "opt-6.7b", "llama-2-7b", "llama-2-13b", "llama-2-70b", "mixtral-8x7b",
          "qwen3-30b-a3b")
BATCH_1 = ("llama-2-70b", "mixtral-8x7b", "qwen3-30b-a3b")
STRUCTURES = {"structured": PruneConfig(structure="structured", shots=40),
              "unstructured": PruneConfig(structure="unstructured", target_size=0.5, shots=5)}


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def main() -> None:
    rows = []
    for model in MODELS:
        for structure, config in STRUCTURES.items():
            batch = 1 if model in BATCH_1 else 2
            config = PruneConfig(**{**config.__dict__, "batch_size": batch})
            for gpus in (1, 2, 8):
                plan = make_plan(PlanConfig(model=str(ROOT / "configs" / f"{model}.json"), dtype="bfloat16",
                                            nsamples=128, seqlen=2048, gpu_memory="80GB", gpus=gpus), config)
                lowest = min(plan["strategies"], key=lambda s: s["peak_gpu_bytes"])
                chosen = next((s for s in plan["strategies"] if s["name"] == plan["strategy"]), lowest)
                rows.append({"model": model, "structure": structure, "gpus": gpus, "batch_size": batch,
                             "fits": plan["fits"], "strategy": chosen["name"],
                             "peak_gpu_bytes": chosen["peak_gpu_bytes"], "host_bytes": chosen["host_bytes"],
                             "launch": chosen["launch"],
                             "seconds_per_shot": chosen["seconds_per_shot"], "shots": config.shot_count,
                             "floor_seconds_per_shot_h100": plan["floor_seconds_per_shot_h100"],
                             # the sparsegpt-refine shot an unstructured run weighs itself against in one process
                             "held_out_seconds_h100": plan["held_out_seconds_h100"] if chosen["gpus"] == 1 else {},
                             "phases": plan["phases"]})
    commit = head_commit()
    path = ROOT / "results" / "plan" / f"plan-table@{commit}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commit": commit, "machine": "counted from the configuration (no device)",
                                "command": "python -m bench.timing.plan_table", "rows": rows}, indent=1) + "\n")
    print(path)


SECTIONS = {"plan": Section(
    "plan/plan-table@*.json",
    "model | structure | GPUs | fits | strategy | peak GiB per GPU | host GiB per GPU | projected s per shot "
    "(curvature + prune) | floor s on one H100 (curvature + prune) | held-out shot s", lambda path, result: [
        (row["model"], row["structure"], row["gpus"], "yes" if row["fits"] else "no", row["strategy"],
         f"{row['peak_gpu_bytes'] / 2**30:.1f}",
         f"{row['host_bytes'] / 2**30:.1f}" if row.get("host_bytes") else "-",
         *(f"{s['curvature']:.1f} + {s['prune']:.1f}" if s else "-"
           for s in (row["seconds_per_shot"], row.get("floor_seconds_per_shot_h100"))),
         f"{sum(row['held_out_seconds_h100'].values()):.0f}" if row.get("held_out_seconds_h100") else "-")
        for row in result["rows"]], newest="file")}


if __name__ == "__main__":
    main()
