"""One sum of two Kronecker factors against G ⊗ A, judged by the per-token Fisher itself (CPU).

    python bench/kronecker_sum_quality.py [--block 10] [--windows 2] [--iterations 4]

SmolLM2-135M, calibration windows of 512 tokens from the packaged WikiText-2 validation split. For
every prunable layer of one block: G ⊗ A (`curvature.estimate`, eq. 6) and the nearest sum of two
Kronecker factors (`kronecker_sum.estimate_sum`, paper appendix), damped as the prune loop damps them.
Both prune the same 50% of the weights (the cheapest under G ⊗ A) with the joint update, and each
update ΔW is scored by the quadratic loss under the per-token Fisher the factors approximate,
½ Σ_n (g_nᵀ ΔW a_n)² (inputs a_n and output gradients g_n recorded by hooks). Also printed: the
norms of the terms and the fraction of the sum's spectrum floored at `kronecker_sum.SUM_FLOOR`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from surgeon import costs, curvature, kronecker_sum, updates  # noqa: E402
from surgeon.config import PruneConfig  # noqa: E402
from surgeon.damping import damp  # noqa: E402
from surgeon.data import calibration_text, calibration_windows, tokenize  # noqa: E402
from surgeon.inverses import KroneckerInverse  # noqa: E402
from surgeon.model import load_model, prunable_layers  # noqa: E402


def per_token(model, layers, windows) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's inputs and output gradients per token (float64), from one more pass."""
    store: dict[str, tuple[list, list]] = {name: ([], []) for name, _ in layers}
    handles = []
    for name, module in layers:
        def record(mod, args, out, name=name):
            store[name][0].append(args[0].detach().reshape(-1, args[0].shape[-1]).double())
            out.register_hook(lambda g, name=name: store[name][1].append(g.reshape(-1, g.shape[-1]).double()))
        handles.append(module.register_forward_hook(record))
    with curvature._frozen(model):
        for batch in windows.split(1):
            curvature._backward(model, batch, "empirical", torch.Generator())
    for handle in handles:
        handle.remove()
    return {name: (torch.cat(a), torch.cat(g)) for name, (a, g) in store.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4)
    args = parser.parse_args()
    config = PruneConfig()
    model, tokenizer = load_model("smollm2-135m", None, "float32", "cpu")
    windows = calibration_windows(tokenize(tokenizer, calibration_text("wikitext2-valid")), args.windows, 512, 0)
    layers = prunable_layers(model)[args.block]
    kfac = curvature.estimate(model, layers, windows)
    summed = kronecker_sum.estimate_sum(model, layers, windows, {}, args.iterations)
    recorded = per_token(model, layers, windows)
    print("layer | ‖G⊗A‖ | ‖G1⊗A1‖ | ‖G2⊗A2‖ | floored | loss no update | loss G⊗A | loss sum")
    for name, module in layers:
        a, g = recorded[name]
        W = module.weight.detach().double()
        k, s = kfac[name], summed[name]
        single = KroneckerInverse.of(damp(k.G.dense().double(), config.damp_g),
                                   damp(k.A.dense().double(), config.damp_a))
        pair = kronecker_sum.KroneckerSum.of(damp(s.G.dense().double(), config.damp_g),
                                      damp(s.A.dense().double(), config.damp_a),
                                      s.G2.dense().double(), s.A2.dense().double(), "torch")
        element = costs.element_costs(W, single)
        mask = element <= element.flatten().kthvalue(W.numel() // 2).values

        def loss(delta: torch.Tensor) -> float:
            return 0.5 * float(((g @ delta) * a).sum(1).square().sum())

        scores = [loss(updates.unstructured(W, f, mask, None, tol=1e-8, max_iter=300) - W)
                  for f in (single, pair)]
        norms = [float(x.dense().norm() * y.dense().norm()) for x, y in ((k.G, k.A), (s.G, s.A), (s.G2, s.A2))]
        floored = float((pair.D >= 1 / kronecker_sum.SUM_FLOOR * (1 - 1e-6)).double().mean())
        print(f"{name} | {norms[0]:.4g} | {norms[1]:.4g} | {norms[2]:.4g} | {floored:.3f} | "
              f"{loss(-W * mask):.4g} | {scores[0]:.4g} | {scores[1]:.4g}", flush=True)


if __name__ == "__main__":
    main()
