"""Compact exports served by vLLM give the masked model's greedy tokens (runs in the pinned environment of
`make test-vllm`, vLLM's CPU build)."""

from __future__ import annotations

import copy
import gc
import json
import os

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM environment: make test-vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: no spawned workers

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from surgeon import PruneConfig, prune  # noqa: E402
from surgeon.app.cli import main  # noqa: E402
from surgeon.models.adapter import decoder_blocks  # noqa: E402

VOCAB, NEW_TOKENS = 49152, 16  # the SmolLM2 tokenizer's vocabulary
FORMATS = ["standard", "decilm", "decilm --ffn-mult"]


def served_tokens(path: str, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens that vLLM generates for each prompt from the checkpoint at `path`."""
    llm = LLM(model=path, trust_remote_code=True, dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
              max_model_len=256, kv_cache_memory_bytes=1 << 28, seed=0)
    try:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               SamplingParams(max_tokens=new_tokens, temperature=0.0, detokenize=False,
                                              ignore_eos=True), use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]
    finally:
        del llm
        gc.collect()


def masked_tokens(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens that transformers' `generate` gives on the masked (pruned, not compacted) model."""
    with torch.no_grad():
        return [model.generate(torch.tensor([p]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=0)[0, len(p):].tolist() for p in prompts]


def pruned_llama(path, tokenizer_dir) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny Llama with grouped-query attention (8 query heads over 4 KV heads), pruned in coupled mode, then
    with block 1's attention and block 2's MLP removed whole and two of block 3's KV groups gone, saved to
    `path` with the tokenizer at `tokenizer_dir` as a `surgeon prune` run; the dense model and the pruned one."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=256,
                         initializer_range=0.1)  # peaked logits: no near-ties between the engines' roundings
    model = AutoModelForCausalLM.from_config(config).eval()
    dense = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (4, 64), generator=torch.Generator().manual_seed(0))
    prune(model, ids, PruneConfig(structure="coupled", target_size=0.7, shots=1), progress=False)
    blocks = decoder_blocks(model)
    with torch.no_grad():
        blocks[1].self_attn.o_proj.weight.zero_()
        blocks[2].mlp.down_proj.weight.zero_()
        blocks[3].self_attn.v_proj.weight[:64] = 0  # KV groups 0 and 1
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    (path / "report.json").write_text('{"sparsity": 0.3}')
    return dense, model


@pytest.fixture(scope="module")
def run(tmp_path_factory, smollm2_tokenizer_dir):
    path = tmp_path_factory.mktemp("run")
    return path, *pruned_llama(path, smollm2_tokenizer_dir)


@pytest.mark.parametrize("format", FORMATS)
def test_vllm_serves_the_export_with_the_masked_models_greedy_tokens(format, run, tmp_path):
    path, dense, model = run
    out = tmp_path / "export"
    assert main(["--quiet", "export", str(path), "--compact", "--format", *format.split(), "--output", str(out)]) == 0
    if format != "standard":  # the layouts vLLM must build: no-op parts and KV heads that differ per layer
        blocks = json.loads((out / "config.json").read_text())["block_configs"]
        assert blocks[1]["attention"]["no_op"]  # with ffn_mult, block 2's MLP keeps zero neurons (for llama.cpp)
        assert blocks[2]["ffn"]["no_op"] == (format == "decilm") and not blocks[2]["attention"]["no_op"]
        assert {b["attention"]["n_heads_in_group"] for b in blocks if not b["attention"]["no_op"]} == {2, 4}
    prompts = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(1)).tolist()
    expected = masked_tokens(model, prompts)
    assert served_tokens(str(out), prompts) == expected
    assert expected != masked_tokens(dense, prompts)  # the tokens tell the pruned model from the dense one


def pruned_moe(path, tokenizer_dir, family: str, settings: dict) -> torch.nn.Module:
    """A tiny Mixture-of-Experts model of `family` (8 experts, top 2) pruned with `settings`, saved to `path` with
    the tokenizer at `tokenizer_dir` as a `surgeon prune` run."""
    import transformers

    torch.manual_seed(0)
    name, count = {"mixtral": ("MixtralConfig", "num_local_experts"), "qwen3_moe": ("Qwen3MoeConfig", "num_experts")}[
        family]
    config = getattr(transformers, name)(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=128, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        num_experts_per_tok=2, initializer_range=0.1, **{count: 8})
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, VOCAB, (4, 64), generator=torch.Generator().manual_seed(0))
    prune(model, ids, PruneConfig(shots=1, **settings), progress=False)
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    (path / "report.json").write_text('{"sparsity": 0.5}')
    return model


@pytest.mark.parametrize("family,settings", [
    ("mixtral", dict(structure="experts", target_size=0.5)),
    ("qwen3_moe", dict(structure="coupled", target_size=0.7, layout="uniform")),
])
def test_vllm_serves_a_mixture_of_experts_export_with_the_masked_models_greedy_tokens(family, settings,
                                                                                      smollm2_tokenizer_dir, tmp_path):
    """Whole experts removed (4 of 8 left) or expert neurons (as many in every expert), in the standard format."""
    run, out = tmp_path / "run", tmp_path / "export"
    model = pruned_moe(run, smollm2_tokenizer_dir, family, settings)
    assert main(["--quiet", "export", str(run), "--compact", "--output", str(out)]) == 0
    prompts = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(1)).tolist()
    assert served_tokens(str(out), prompts) == masked_tokens(model, prompts)


@pytest.mark.slow
def test_vllm_serves_a_smollm2_decilm_export_with_the_masked_models_greedy_tokens(tmp_path):
    """SmolLM2 at 80% in coupled mode with the DeciLM layout (a short calibration), exported in the DeciLM format:
    the export holds exactly the weights of the units left, no padding, and vLLM serves it."""
    from safetensors.torch import load_file

    run, out = tmp_path / "run", tmp_path / "decilm"
    assert main(["--quiet", "prune", "--model", "smollm2-135m", "--structure", "coupled", "--target-size", "0.8",
                 "--layout", "decilm", "--shots", "1", "--nsamples", "4", "--seqlen", "256", "--calibration",
                 "wikitext2-valid", "--eval-windows", "1", "--eval-seqlen", "256", "--output", str(run)]) == 0
    assert main(["--quiet", "export", str(run), "--compact", "--format", "decilm", "--output", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(run)
    prompts = [tokenizer(text).input_ids for text in (
        "The history of the city begins", "In mathematics, a prime number is", "The film was released in",
        "Robert Boulter is an English film and television actor")]
    model = AutoModelForCausalLM.from_pretrained(run, dtype="float32").eval()
    live = 0  # the weights of the units left: every live neuron's gate, up and down; a live attention whole
    for block in decoder_blocks(model):
        mlp, attention = block.mlp, block.self_attn
        live += int((mlp.down_proj.weight != 0).any(0).sum()) * 3 * model.config.hidden_size
        if bool((attention.o_proj.weight != 0).any()):
            live += sum(attention.get_submodule(f"{part}_proj").weight.numel() for part in "qkvo")
    weights = load_file(out / "model.safetensors")
    assert sum(t.numel() for n, t in weights.items() if ".layers." in n and t.dim() == 2) == live
    assert served_tokens(str(out), prompts, 24) == masked_tokens(model, prompts, 24)
