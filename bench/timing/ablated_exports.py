"""DeciLM exports of a dense model without its MLPs, or without its attention, to split a decode step.

    python bench/timing/ablated_exports.py smollm2-135m OUT

writes OUT/no-mlp and OUT/no-attention: the model with every MLP, or every attention, a no-op, in the
DeciLM format that vLLM serves. Served beside the dense model (`bench/timing/serve_speed.py`), their
step times give what a decode step spends in the MLPs and in attention, and so the most any pruning of
those parts can gain: removing a fraction f of the MLP weights saves at most f of the MLPs' time.
Their tokens mean nothing; only their speed is measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from surgeon import load_model  # noqa: E402
from surgeon.export.compact import compact_model  # noqa: E402
from surgeon.models.adapter import decoder_blocks  # noqa: E402

# the consumer of each part: zeroing it leaves the part's output exactly zero, which the export drops
PARTS = {"no-mlp": "mlp.down_proj", "no-attention": "self_attn.o_proj"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Llama-family model: hub id, folder, .gguf file or built-in name")
    parser.add_argument("output", help="a folder for the two exports")
    args = parser.parse_args()
    for name, consumer in PARTS.items():
        model, tokenizer = load_model(args.model, dtype="float32")
        with torch.no_grad():
            for block in decoder_blocks(model):
                block.get_submodule(consumer).weight.zero_()
        compact = compact_model(model, "decilm")
        compact.save_pretrained(Path(args.output) / name)
        tokenizer.save_pretrained(Path(args.output) / name)
        print(Path(args.output) / name)


if __name__ == "__main__":
    main()
