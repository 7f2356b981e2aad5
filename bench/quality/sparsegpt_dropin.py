"""Layer output error and time of the SparseGPT drop-in against SparseGPT's own algorithm, on the same H.

    python -m bench.quality.sparsegpt_dropin                 # blocks 0, 10, 20 and 29 of SmolLM2-135M
    python -m bench.quality.sparsegpt_dropin --blocks 0 5
    python -m bench.quality.sparsegpt_dropin --shapes llama2-7b --device cuda --output OUT.json

For every linear layer of the chosen blocks of the dense SmolLM2-135M, H = (2/n) Σ x xᵀ is
accumulated from the CPU protocol's calibration windows (8 × 512 tokens of WikiText-2 validation,
seed 0) exactly as SparseGPT's `add_batch` does. On that H each method prunes the layer to
unstructured 50% and 2:4: SparseGPT as published (its column loop, `surgeon.method.baselines.sparsegpt_reference`
in float32, block size 128, percdamp 0.01) and the drop-in (`sparsegpt_solve`) in its refine mode for each
`--iterations` and its exact mode for each `--exact-shots`. The error is ‖X(W − Ŵ)ᵀ‖² / n =
½ tr(ΔW H ΔWᵀ) with the undamped H; the times are each method's solve alone. Result:
bench/results/cpu/sparsegpt-dropin@<commit>.json; `make results` puts the summary in RESULTS.md.

`--shapes llama2-7b` times the same comparison on Llama-2-7B's three layer shapes (4096×4096,
11008×4096, 4096×11008) with random weights and H from 8192 random correlated inputs: the time on
the device says what a 7B layer costs; the errors say nothing about real models.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench import provenance as pv
from bench.machine import cpu_machine
from bench.quality.table import head_commit, load_protocol
from bench.section import Row, Section, recorded
from surgeon.integrations.sparsegpt import REFINE_ITERATIONS, SparseGPT, sparsegpt_solve
from surgeon.io import write_json
from surgeon.method.baselines import sparsegpt_reference
from surgeon.models.adapter import prunable_layers

ROOT = Path(__file__).resolve().parents[2]

STRUCTURES = {"unstructured-0.5": None, "2:4": (2, 4)}
LLAMA2_7B_SHAPES = {"q_proj": (4096, 4096), "up_proj": (11008, 4096), "down_proj": (4096, 11008)}


def layer_hessians(model: torch.nn.Module, windows: torch.Tensor, blocks: list[int]) -> dict[str, tuple]:
    """(W, H) of every linear layer in `blocks`, H accumulated by the drop-in's own `add_batch`."""
    layers = [pair for b in blocks for pair in prunable_layers(model)[b]]
    gpts = {name: SparseGPT(module) for name, module in layers}
    handles = [module.register_forward_hook(lambda m, inp, out, name=name: gpts[name].add_batch(inp[0].data, out.data))
               for name, module in layers]
    with torch.no_grad():
        for window in windows:
            model(window.unsqueeze(0))
    for handle in handles:
        handle.remove()
    return {name: (module.weight.detach().clone(), gpts[name].H) for name, module in layers}


def random_layers(names: list[str], device: str, tokens: int = 8192) -> dict[str, tuple]:
    """(W, H) for the named Llama-2-7B layer shapes: random W, H = (2/n) XᵀX of correlated random inputs X."""
    generator = torch.Generator(device).manual_seed(0)
    layers = {}
    for name in names:
        rows, cols = LLAMA2_7B_SHAPES[name]
        mixing = torch.randn(cols, cols, device=device, generator=generator) / cols**0.5
        X = torch.randn(tokens, cols, device=device, generator=generator) @ mixing
        X += 0.1 * torch.randn(tokens, cols, device=device, generator=generator)
        W = torch.randn(rows, cols, device=device, generator=generator) / cols**0.5
        layers[name] = (W, (2 / tokens) * X.t() @ X)
    return layers


def error(W: torch.Tensor, pruned: torch.Tensor, H: torch.Tensor) -> float:
    delta = (W - pruned).double()
    return float(0.5 * (delta @ H.double() * delta).sum())


def timed(run):
    synchronize()
    start = time.perf_counter()
    out = run()
    synchronize()
    return out, time.perf_counter() - start


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, nargs="+", default=[0, 10, 20, 29])
    parser.add_argument("--iterations", type=int, nargs="*", default=[REFINE_ITERATIONS],
                        help="the refine mode's conjugate-gradient steps, one row each")
    parser.add_argument("--exact-shots", type=int, nargs="*", default=[1],
                        help="the exact mode's sweeps of growing sparsity, one row each")
    parser.add_argument("--shapes", default="smollm2", choices=["smollm2", "llama2-7b"],
                        help="SmolLM2-135M's layers on WikiText-2, or Llama-2-7B's shapes with random weights")
    parser.add_argument("--layers", nargs="+", default=list(LLAMA2_7B_SHAPES), choices=list(LLAMA2_7B_SHAPES),
                        help="with --shapes llama2-7b: the layer shapes to time")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", type=Path, default=None,
                        help="default: bench/results/cpu/sparsegpt-dropin@<commit>.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.shapes == "smollm2":
        run = load_protocol()
        layers = layer_hessians(run.model.to(args.device), run.windows.to(args.device), args.blocks)
    else:
        layers = random_layers(args.layers, args.device)
    modes = {**{f"refine-{k}": dict(update="refine", iterations=k) for k in args.iterations},
             **{"exact" if shots == 1 else f"exact-{shots}shots": dict(update="exact", shots=shots)
                for shots in args.exact_shots}}
    rows = []
    for name, (W, H) in layers.items():
        for structure, nm in STRUCTURES.items():
            none = torch.zeros_like(W, dtype=torch.bool)
            (theirs, _), seconds = timed(lambda: sparsegpt_reference(W.float(), H, 0.5, none, nm, dtype=torch.float32))
            row = dict(layer=name, structure=structure, shape=list(W.shape), sparsegpt_error=error(W, theirs, H),
                       sparsegpt_seconds=seconds, dropin={})
            n, m = (nm[1] - nm[0], nm[1]) if nm else (0, 0)
            for mode, options in modes.items():
                solution, seconds = timed(lambda: sparsegpt_solve(W, H, 0.5, n, m, 128, 0.01, **options))
                row["dropin"][mode] = dict(error=error(W, solution.weight, H), seconds=seconds,
                                           ratio=error(W, solution.weight, H) / row["sparsegpt_error"])
            print(name, structure, f"sparsegpt {row['sparsegpt_seconds']:.2f} s;", "; ".join(
                f"{k}: {v['seconds']:.2f} s, error ratio {v['ratio']:.3f}" for k, v in row["dropin"].items()),
                flush=True)
            rows.append(row)
    summary = {}
    for structure in STRUCTURES:
        chosen = [row for row in rows if row["structure"] == structure]
        summary[structure] = dict(
            sparsegpt_seconds=sum(row["sparsegpt_seconds"] for row in chosen),
            modes={mode: dict(
                worst_ratio=max(row["dropin"][mode]["ratio"] for row in chosen),
                geomean_ratio=float(torch.tensor([row["dropin"][mode]["ratio"] for row in chosen]).log()
                                    .mean().exp()),
                seconds=sum(row["dropin"][mode]["seconds"] for row in chosen)) for mode in modes})
    commit = head_commit()
    machine = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if args.device.startswith("cuda")
               else cpu_machine(torch.get_num_threads()))
    write_json(args.output or ROOT / "bench" / "results" / "cpu" / f"sparsegpt-dropin@{commit}.json", dict(
        commit=commit, machine=machine,
        command=" ".join(["python -m bench.quality.sparsegpt_dropin", *sys.argv[1:]]), shapes=args.shapes,
        blocks=args.blocks if args.shapes == "smollm2" else None, layers=len(layers), summary=summary, rows=rows))


def layer_rows(path: Path, run: pv.Run) -> list[Row]:
    """A result file's rows: per structure and mode, the layer error ratios and the seconds against SparseGPT's."""
    return [(structure, mode, f"{values['geomean_ratio']:.3f}", f"{values['worst_ratio']:.3f}",
             f"{values['seconds']:.2f}", f"{summary['sparsegpt_seconds']:.2f}",
             f"{values['seconds'] / summary['sparsegpt_seconds']:.2f}×")
            for structure, summary in run["summary"].items() for mode, values in summary["modes"].items()]


LAYERS = ("structure | drop-in mode | error ratio, geometric mean | worst layer | drop-in s | SparseGPT s | "
          "time against SparseGPT")
SECTIONS = {"drop-in": Section("cpu/sparsegpt-dropin@*.json", LAYERS, layer_rows, newest="file", command=recorded),
            "drop-in-gpu": Section("gpu/sparsegpt-dropin-llama2-7b@*.json", LAYERS, layer_rows, newest="file",
                                   command=recorded)}


if __name__ == "__main__":
    main()
