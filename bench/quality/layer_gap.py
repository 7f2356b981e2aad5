r"""Where two pruned models part: each layer's relative output error on calibration and on held-out tokens.

    python -m bench.quality.layer_gap --model gemma3-270m --pruned surgeon=OUT/a sparsegpt=OUT/b \
        --nsamples 8 --seqlen 256 --output bench/results/findings/NAME.json

For every prunable layer of the dense model, its input factor A = Σ [x, 1][x, 1]ᵀ over the dense model's
own inputs to that layer is accumulated twice: over the calibration windows a pruning run used
(`--calibration`, `--nsamples`, `--seqlen`, `--seed`, as `surgeon prune` draws them) and over held-out
windows of the evaluation text (`--heldout-windows` of `--heldout-seqlen`). Each pruned checkpoint's
layer then scores tr(ΔW A ΔWᵀ) / tr(W A Wᵀ), ΔW its weights (and bias) minus the dense ones: the part of
the layer's output that pruning changed, on the tokens it was fit to and on tokens it never saw. A
solution that fits its calibration tokens closer but held-out tokens worse has over-fitted them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from surgeon.app.data import calibration_text, calibration_windows, evaluation_text, tokenize
from surgeon.io import write_json
from surgeon.models.adapter import load_model, prunable_layers
from surgeon.pruning import curvature


def _input_factors(model, layers, windows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The dense A = Σ [x, 1][x, 1]ᵀ / √N of every layer over `windows` (one window at a time), in float64."""
    forwards = [lambda w=w: model(w.unsqueeze(0)) for w in windows]
    groups = curvature.estimate_inputs(layers, forwards, windows.numel())
    return {name: group.A.dense().double() for group in groups for name in group.layers}


def _relative_error(dense: torch.Tensor, pruned: torch.Tensor, A: torch.Tensor) -> float:
    """tr(ΔW A ΔWᵀ) / tr(W A Wᵀ) with W = [weight, bias]."""
    delta = pruned - dense
    return float(((delta @ A) * delta).sum() / ((dense @ A) * dense).sum())


def _with_bias(module: torch.nn.Linear) -> torch.Tensor:
    W = module.weight.detach().double()
    if module.bias is None:
        return W
    return torch.cat([W, module.bias.detach().double().unsqueeze(1)], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--pruned", nargs="+", required=True, help="LABEL=DIR of checkpoints `surgeon prune` saved")
    parser.add_argument("--calibration", default="wikitext2-valid")
    parser.add_argument("--nsamples", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", default="wikitext2")
    parser.add_argument("--heldout-windows", type=int, default=8)
    parser.add_argument("--heldout-seqlen", type=int, default=256)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model, tokenizer = load_model(args.model)
    layers = [layer for block in prunable_layers(model) for layer in block]
    calibration = calibration_windows(tokenize(tokenizer, calibration_text(args.calibration)), args.nsamples,
                                      args.seqlen, args.seed)
    test = tokenize(tokenizer, evaluation_text(args.dataset)).reshape(-1)
    heldout = test[: args.heldout_windows * args.heldout_seqlen].reshape(args.heldout_windows, args.heldout_seqlen)
    factors = {"calibration": _input_factors(model, layers, calibration),
               "heldout": _input_factors(model, layers, heldout)}
    dense = {name: _with_bias(module) for name, module in layers}
    del model
    rows: dict[str, dict[str, dict[str, float]]] = {name: {} for name in dense}
    for spec in args.pruned:
        label, directory = spec.split("=", 1)
        pruned, _ = load_model(directory)
        modules = dict(pruned.named_modules())
        for name in dense:
            W = _with_bias(modules[name])
            rows[name][label] = {split: _relative_error(dense[name], W, A[name])
                                 for split, A in factors.items()}
        del pruned
    result = dict(model=args.model, command=" ".join(sys.argv), calibration_tokens=calibration.numel(),
                  heldout_tokens=heldout.numel(), layers=rows)
    write_json(args.output, result)
    labels = [spec.split("=", 1)[0] for spec in args.pruned]
    print("layer | " + " | ".join(f"{label} cal / held-out" for label in labels))
    for name, row in rows.items():
        print(name, " | ".join(f"{row[label]['calibration']:.4f} / {row[label]['heldout']:.4f}" for label in labels))


if __name__ == "__main__":
    main()
