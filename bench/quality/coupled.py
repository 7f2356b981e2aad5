"""Structured pruning at equal size on SmolLM2-135M: rows/columns against coupled units, one command.

Protocol: the quality table's (bench/quality/table.py: 8 calibration windows of 512 tokens of the packaged
WikiText-2 validation split, seed 0, 4 shots, perplexity on the first 8 windows of 2048 test
tokens), at 90, 80 and 70% of the prunable weights kept. Rows: the dense model; the paper's rows and columns
(exported compactly: what its dead channels free), coupled LLM Surgeon with global allocation, with
`--layout decilm --width-multiple 64` and with `--layout uniform`; coupled LLM Surgeon with λ_A = 0.01 and 1 on
either side of its default 0.3 (`coupled-damp-a-<λ>`, judged on the tuning articles); coupled K-OBD. Each pruned
model is exported compactly (`--layout uniform` in the standard format, the others in the per-layer DeciLM
one) and its parameters counted, embeddings included; its perplexity is measured on the test windows and on as
many windows of the tuning articles the protocol sets aside, and its decode speed, and the dense model's, at batch 1
after a 2048-token prompt (`generation_speed.py`).

Each run is saved as bench/results/coupled/<row>@<commit>.json and skipped when that file exists; with `--seeds`
a seed s > 0 draws the calibration windows with s and names the row `<row>-seed<s>`, the table below the rows
giving each row's spread over its seeds.

    python -m bench.quality.coupled                   # every row (1–2 h on 2 cores)
    python -m bench.quality.coupled --only 0.8        # rows whose id contains this text
    python -m bench.quality.coupled --only -0.8 --seeds 0 1 2   # the 80% rows over three calibration seeds
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from pathlib import Path

import torch

from bench import provenance as pv
from bench.machine import cpu_machine
from bench.quality.table import head_commit, load_protocol
from bench.section import Section
from bench.seeds import add_seeds_option, seed_row, seed_spread, seeded
from bench.timing.generation_speed import decode_tokens_per_s
from surgeon import PruneConfig, prune
from surgeon.export.compact import compact_model
from surgeon.io import write_json

ROOT = Path(__file__).resolve().parents[1] / "results" / "coupled"
# row id -> (PruneConfig settings, compact format: standard or decilm)
VARIANTS = {
    "rows-columns": (dict(structure="structured"), "decilm"),
    "coupled": (dict(structure="coupled"), "decilm"),
    "coupled-layout-decilm-multiple64": (dict(structure="coupled", layout="decilm", width_multiple=64), "decilm"),
    "coupled-uniform": (dict(structure="coupled", layout="uniform"), "standard"),
    **{f"coupled-damp-a-{damp:g}": (dict(structure="coupled", damp_a=damp), "decilm") for damp in (0.01, 1.0)},
    "coupled-kobd": (dict(structure="coupled", method="kobd"), "decilm"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="")
    parser.add_argument("--shots", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    add_seeds_option(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ROOT.mkdir(parents=True, exist_ok=True)
    run = load_protocol()
    model, dense_state = run.model, run.dense_state
    commit = head_commit()
    machine = cpu_machine(torch.get_num_threads())
    dense_parameters = sum(p.numel() for p in model.parameters())
    path = ROOT / f"dense@{commit}.json"
    if not path.exists() and args.only in "dense":
        scores = run.perplexities(model, 8)
        with torch.inference_mode():
            decode = decode_tokens_per_s(model, 1, 2048, args.new_tokens, torch.device("cpu"), 3)
        logging.info("dense: ppl %.3f, tuning ppl %.3f, decode %.1f tokens/s", scores["ppl"],
                     scores["tuning_ppl"], decode)
        write_json(path, {"row": "dense", **scores, "parameters": dense_parameters,
                          "dense_parameters": dense_parameters, "format": "-", "decode_tokens_per_s": decode,
                          "seconds": 0.0, "machine": machine, "commit": commit})
    for seed, variant, size in itertools.product(args.seeds, VARIANTS, (0.9, 0.8, 0.7)):
        settings, format = VARIANTS[variant]
        name = seed_row(f"{variant}-{size}", seed)
        path = ROOT / f"{name}@{commit}.json"
        if path.exists() or args.only not in name:
            continue
        windows = run.with_seed(seed).windows
        model.load_state_dict(dense_state)
        start = time.perf_counter()
        report = prune(model, windows, PruneConfig(**settings, target_size=size, shots=args.shots, seed=seed),
                       progress=False)
        seconds = time.perf_counter() - start
        scores = run.perplexities(model, 8)
        compact = compact_model(model, format)
        with torch.inference_mode():
            decode = decode_tokens_per_s(compact, 1, 2048, args.new_tokens, torch.device("cpu"), 3)
        parameters = sum(p.numel() for p in compact.parameters())
        logging.info("%s: ppl %.3f, tuning ppl %.3f, %.1f M parameters (%.3f), decode %.1f tokens/s, %.0f s",
                     name, scores["ppl"], scores["tuning_ppl"], parameters / 1e6, parameters / dense_parameters,
                     decode, seconds)
        write_json(path, {"row": name, **scores, "parameters": parameters,
                          "dense_parameters": dense_parameters, "format": format, "decode_tokens_per_s": decode,
                          "seconds": seconds, "machine": machine, "commit": commit, "seed": seed,
                          **report.to_dict()})


SECTIONS = {"coupled": Section(
    "coupled/*@*.json", "row | ppl | tuning ppl | parameters (of dense) | format | decode tokens/s (batch 1, 2048 "
    "context) | prune s | machine", lambda path, run: [] if seeded(pv.row_of(path)) else [
        (pv.row_of(path), f"{run['ppl']:.3f}", f"{run['tuning_ppl']:.3f}" if "tuning_ppl" in run else "-",
         f"{run['parameters'] / 1e6:.1f} M ({run['parameters'] / run['dense_parameters']:.3f})", run["format"],
         f"{run['decode_tokens_per_s']:.1f}", f"{run['seconds']:.0f}", run["machine"])], pv.CPU_EXPORTED,
    newest="row", below=seed_spread)}


if __name__ == "__main__":
    main()
