r"""Peers on the quality table's protocol: llm-compressor's SparseGPTModifier and WandaPruningModifier.

Beside them run surgeon's own modifiers inside the same llm-compressor `oneshot`:
`SurgeonSparseGPTModifier` (SparseGPT's mask in llm-compressor's sequential pipeline, then its default
conjugate-gradient refinement, or with `-exact` the exact per-row solve) and
`SurgeonModifier` (LLM Surgeon with the table's shots: 4 unstructured, N:M's default of one shot
propagated block by block; it should reproduce bench/quality/table.py's surgeon rows).
Same model (SmolLM2-135M, float32; `--model gemma3-270m`: Gemma-3-270M on its protocol), the same calibration
windows as `bench/quality/table.py` (passed to `oneshot` as a dataset, in order; with `--seeds` as there, a seed
s > 0 drawing them with s and naming the row `<row>-seed<s>`), the same evaluation: the test windows and as many
windows of the tuning articles. Peer
settings: block size 128, dampening fraction 0.01, the sequential pipeline with pruned activations
propagated block by block, `lm_head` ignored. Times are whole `oneshot` calls.

Runs in the llm-compressor environment (llm-compressor 0.14 pins transformers 5.15-5.17), created by
one command, `make install-llmcompressor`:

    .venv-llmcompressor/bin/python -m bench.quality.peers [--only 2of4]   # --only: a regular expression
    .venv/bin/python -c "import surgeon; m, t = surgeon.load_model('gemma3-270m'); m.save_pretrained('G'); \
        t.save_pretrained('G')"
    .venv-llmcompressor/bin/python -m bench.quality.peers --model gemma3-270m --weights G --only 'llmc-(sparsegpt|wan)'
    .venv-llmcompressor/bin/python -m bench.quality.peers --only '^2of4-0.5-llmc-sparsegpt$' --seeds 0 1 2

Each run is saved beside bench/quality/table.py's rows (bench/results/quality/<row>@<commit>.json for SmolLM2)
and skipped when that file exists; `make results` puts them into RESULTS' quality tables.
"""

from __future__ import annotations

import itertools
import logging
import re
import tempfile
import time

import torch
from datasets import Dataset
from llmcompressor import __version__ as llmcompressor_version
from llmcompressor import oneshot
from llmcompressor.modifiers.pruning import SparseGPTModifier, WandaPruningModifier
from transformers import AutoModelForCausalLM

from bench.quality.table import folder, load_protocol, parse_protocol, protocol_of, protocol_parser
from bench.seeds import add_seeds_option, seed_row
from surgeon.integrations.llmcompressor import SurgeonModifier, SurgeonSparseGPTModifier
from surgeon.io import write_json
from surgeon.models.adapter import prunable_layers

# row suffix -> (modifier, its settings beyond sparsity, mask structure and ignore)
PEERS = {
    "llmc-sparsegpt": (SparseGPTModifier, {"block_size": 128, "dampening_frac": 0.01}),
    "llmc-wanda": (WandaPruningModifier, {}),
    "llmc-surgeon-sparsegpt": (SurgeonSparseGPTModifier, {"block_size": 128, "dampening_frac": 0.01}),
    "llmc-surgeon-sparsegpt-exact": (SurgeonSparseGPTModifier, {"block_size": 128, "dampening_frac": 0.01,
                                                                "update": "exact"}),
    "llmc-surgeon": (SurgeonModifier, {}),
}


def zero_fraction(model: torch.nn.Module) -> float:
    """Fraction of exact zeros over the prunable layers (the quality table's sparsity)."""
    weights = [module.weight for block in prunable_layers(model) for _, module in block]
    return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)


def main() -> None:
    parser = protocol_parser(__doc__)
    parser.add_argument("--weights", help="a folder holding the model, saved by `surgeon`'s own environment: "
                        "llm-compressor's transformers 5.17 converts Gemma-3's GGUF wrongly (dense perplexity 98.92 "
                        "against 19.88)")
    add_seeds_option(parser)
    args = parse_protocol(parser)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = folder(args.model, args.calib_windows, args.calib_seqlen)
    root.mkdir(parents=True, exist_ok=True)
    run = load_protocol(args.model, args.calib_windows, args.calib_seqlen, args.weights)
    protocol = protocol_of(args, run)
    commit = protocol["commit"]
    protocol["machine"] += f", llm-compressor {llmcompressor_version}"
    with tempfile.TemporaryDirectory() as saved:  # oneshot reads the model's config from its name_or_path
        run.model.save_pretrained(saved)
        run.tokenizer.save_pretrained(saved)
        for seed, structure in itertools.product(args.seeds, ("unstructured", "2:4", "4:8")):
            windows = run.with_seed(seed).windows
            calibration = Dataset.from_dict({"input_ids": windows.tolist(),
                                             "attention_mask": torch.ones_like(windows).tolist()})
            for suffix, (modifier, settings) in PEERS.items():
                row = f"{structure.replace(':', 'of')}-0.5-{suffix}"
                path = root / f"{seed_row(row, seed)}@{commit}.json"
                if path.exists() or not re.search(args.only, row):
                    continue
                model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
                if modifier is SurgeonModifier:  # prunes the decoder blocks' linear layers, never the LM head
                    nm = ":" in structure
                    recipe = modifier(sparsity=None if nm else 0.5, structure=structure, shots=None if nm else 4)
                else:
                    recipe = modifier(sparsity=0.5, mask_structure=structure if ":" in structure else "0:0",
                                      ignore=["re:.*lm_head"], **settings)
                start = time.perf_counter()
                oneshot(model=model, dataset=calibration, recipe=[recipe], num_calibration_samples=len(windows),
                        max_seq_length=windows.shape[1], shuffle_calibration_samples=False, pipeline="sequential")
                seconds = time.perf_counter() - start
                scores = run.perplexities(model, args.eval_windows)
                config = {"structure": structure, "target_size": 0.5, "method": f"llm-compressor {modifier.__name__}",
                          "shots": 1, "damp_g": "-",
                          "damp_a": settings.get("dampening_frac", "-")}
                if modifier is SurgeonSparseGPTModifier:
                    config.update(update=recipe.update,
                                  iterations=recipe.iterations if recipe.update == "refine" else "-")
                if modifier is SurgeonModifier:
                    resolved = recipe._config.resolved()
                    config.update({key: resolved[key] for key in ("shots", "damp_g", "damp_a", "propagate")})
                logging.info("%s: ppl %.3f, tuning ppl %.3f (%.0f s)", path.stem, scores["ppl"], scores["tuning_ppl"],
                             seconds)
                write_json(path, {**scores, "seconds": seconds, "sparsity": zero_fraction(model), "config": config,
                                  **protocol, "seed": seed})


if __name__ == "__main__":
    main()
