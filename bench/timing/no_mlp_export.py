"""A DeciLM export of a dense model without its MLPs, to split a decode step into its parts.

    python -m bench.timing.no_mlp_export smollm2-135m OUT/no-mlp

writes the model with every MLP a no-op, in the DeciLM format that vLLM serves. Served beside the
dense model (`bench/timing/serve_speed.py`), its step time is what a decode step spends outside the
MLPs (attention, embeddings, LM head, the engine); the dense model's step less it is the MLPs' time,
and so the most any pruning of the MLPs can gain: removing a fraction f of their weights saves at most
f of that time. (Without any attention vLLM refuses the model, so attention is not split off alone.)
Its tokens mean nothing; only its speed is measured.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from surgeon import load_model
from surgeon.export.compact import compact_model
from surgeon.models import compact_modeling
from surgeon.models.adapter import decoder_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Llama-family model: hub id, folder, .gguf file or built-in name")
    parser.add_argument("output", help="a folder for the export")
    args = parser.parse_args()
    model, tokenizer = load_model(args.model, dtype="float32")
    with torch.no_grad():
        for block in decoder_blocks(model):
            block.mlp.down_proj.weight.zero_()  # every neuron's output is then exactly zero: the export drops it
    folder = Path(args.output)
    compact_model(model, "decilm").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    shutil.copyfile(compact_modeling.__file__, folder / "compact_modeling.py")  # for trust_remote_code=True
    print(folder)


if __name__ == "__main__":
    main()
