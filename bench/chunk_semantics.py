"""Chunked vs joint element updates on real curvature: quadratic-model loss and time per layer.

Estimates the Kronecker factors of one SmolLM2 block (8 × 512 calibration tokens from
`wiki.valid.tokens`, seed 0), prunes each layer to 50% by element costs (eq. 7), and reports the
quadratic-model loss ½ tr(ΔWᵀ G ΔW A) (raw, undamped factors) of: no update, chunks of m solved
independently or sequentially, and all pruned weights jointly (conjugate gradients), in float64.

    python bench/chunk_semantics.py [--block 10] [--damp-g 0.01 0.1] [--chunks 64 576 2000]
"""

from __future__ import annotations

import argparse
import time

from surgeon import costs, curvature, solver, updates
from surgeon.damping import damp
from surgeon.data import calibration_text, calibration_windows, tokenize
from surgeon.inverses import KroneckerInverse
from surgeon.model import load_model, prunable_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--damp-g", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--chunks", type=int, nargs="+", default=[64, 576, 2000])
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2-135m")
    windows = calibration_windows(tokenize(tokenizer, calibration_text("wikitext2-valid")), 8, 512, seed=0)
    layers = prunable_layers(model)[args.block]
    raw = curvature.estimate(model, layers, windows)
    print("| layer | λ_G | update | loss | seconds |\n| --- | --- | --- | --- | --- |")
    for name, module in layers:
        W, G, A = module.weight.detach().double(), raw[name].G.dense().double(), raw[name].A.dense().double()
        for damp_g in args.damp_g:
            f = KroneckerInverse.of(damp(G, damp_g), damp(A, 0.01))
            element = costs.element_costs(W, f)
            mask = element <= element.flatten().kthvalue(W.numel() // 2).values
            variants = {"none": lambda: W.masked_fill(mask, 0.0)}
            for m in args.chunks:
                for semantics in ("independent", "sequential"):
                    variants[f"{semantics} m={m}"] = (
                        lambda m=m, s=semantics: updates.unstructured(W, f, mask, m, s))
            variants["joint (CG)"] = lambda: updates.unstructured(W, f, mask, None, tol=1e-6, max_iter=400)
            for label, fn in variants.items():
                start = time.perf_counter()
                new = fn()
                seconds = time.perf_counter() - start
                loss = solver.quadratic_loss(new - W, G, A).item()
                print(f"| {name.split('.', 3)[-1]} | {damp_g} | {label} | {loss:.4g} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
