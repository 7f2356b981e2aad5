"""Compact exports served by vLLM give the masked model's greedy tokens, and quantized ones the quantized model's
(runs in the pinned environment of `make test-vllm`, vLLM's CPU build; quantizing needs `make
install-llmcompressor`)."""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM environment: make test-vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: no spawned workers

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from surgeon import PruneConfig, evaluation_text, load_compact, prune, tokenize  # noqa: E402
from surgeon.app.cli import main  # noqa: E402
from surgeon.models.adapter import decoder_blocks  # noqa: E402

VOCAB, NEW_TOKENS = 49152, 16  # the SmolLM2 tokenizer's vocabulary
FORMATS = ["standard", "decilm", "decilm --ffn-mult"]
# `surgeon quantize` runs where llm-compressor is installed (it pins another transformers than vLLM)
LLMCOMPRESSOR_PYTHON = Path(__file__).resolve().parents[1] / ".venv-llmcompressor" / "bin" / "python"
CPUINFO = Path("/proc/cpuinfo")
CPU_FLAGS = CPUINFO.read_text() if CPUINFO.is_file() else ""
# vLLM's CPU int8 GEMM takes float32 activations, except on hosts with AMX: there only bfloat16 or half
AMX = " amx_int8" in CPU_FLAGS
QUANTIZED_DTYPE = "bfloat16" if AMX else "float32"
# On x86 hosts without VNNI, vLLM's int8 GEMM (oneDNN) multiplies as AVX2's vpmaddubsw does: the activations shifted
# to unsigned (+128) times the weights, each pair of adjacent inputs summed into a saturating int16, the shift's
# compensation subtracted after. Full-range int8 weights overflow those pairs, so its products are not exact;
# `saturated_product` reproduces them.
SATURATING = " avx2" in CPU_FLAGS and not any(f" {flag}" in CPU_FLAGS for flag in ("avx512_vnni", "avx_vnni"))


@contextlib.contextmanager
def engine(path: str, max_model_len: int = 256, dtype: str = "float32") -> Iterator[LLM]:
    """vLLM's engine in this process on the checkpoint at `path`, freed on the way out."""
    llm = LLM(model=path, trust_remote_code=True, dtype=dtype, enforce_eager=True, skip_tokenizer_init=True,
              max_model_len=max_model_len, kv_cache_memory_bytes=1 << 28, seed=0)
    try:
        yield llm
    finally:
        del llm
        gc.collect()


def served_tokens(path: str, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy tokens that vLLM generates for each prompt from the checkpoint at `path`."""
    with engine(path) as llm:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               SamplingParams(max_tokens=new_tokens, temperature=0.0, detokenize=False,
                                              ignore_eos=True), use_tqdm=False)
        return [list(output.outputs[0].token_ids) for output in outputs]


def served_log_likelihood(path: str, windows: list[list[int]], dtype: str = "float32") -> torch.Tensor:
    """vLLM's log-probability of every token of each window after the first, given the tokens before it."""
    with engine(path, max_model_len=2 * len(windows[0]), dtype=dtype) as llm:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=w) for w in windows],
                               SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, prompt_logprobs=0),
                               use_tqdm=False)
        return torch.tensor([[step[token].logprob for step, token in zip(output.prompt_logprobs[1:], window[1:])]
                             for output, window in zip(outputs, windows)], dtype=torch.float64)


def log_likelihood(model: torch.nn.Module, windows: list[list[int]]) -> torch.Tensor:
    """transformers' log-probability of every token of each window after the first, given the tokens before it."""
    ids = torch.tensor(windows)
    with torch.no_grad():
        logits = model(ids).logits[:, :-1].double()
    return torch.log_softmax(logits, -1).gather(2, ids[:, 1:, None])[..., 0]


def int8_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations rounded as vLLM's CPU kernel does, per token to the nearest multiple of max|x|/127
    (compressed-tensors' own grid is max|x|/127.5, which tips near-ties): the integers and each token's step."""
    step = x.abs().amax(-1, keepdim=True) / 127
    return torch.round(x / step).clamp(-128, 127), step


def saturated_product(activations: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """int8 `activations` (..., K) times int8 `weight` (N, K) transposed, as oneDNN computes it without VNNI
    (`SATURATING`): unsigned activations, adjacent products summed in pairs saturated to int16, less the shift."""
    weight = torch.nn.functional.pad(weight.to(torch.int64), (0, weight.shape[1] % 2))  # an odd input paired with 0
    shifted = torch.nn.functional.pad(activations.to(torch.int64) + 128, (0, activations.shape[-1] % 2))
    products = shifted[..., None, :] * weight
    pairs = (products[..., 0::2] + products[..., 1::2]).clamp(-(1 << 15), (1 << 15) - 1)
    return pairs.sum(-1) - 128 * weight.sum(-1)


def int8_rounded(model: torch.nn.Module) -> torch.nn.Module:
    """A W8A8 checkpoint loaded by transformers, made to compute its quantized layers as vLLM's CPU kernel does:
    activations rounded by `int8_activations`, and on `SATURATING` hosts products by `saturated_product`."""

    def rounded(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        activations, step = int8_activations(args[0])
        return (activations * step,)

    def saturated(module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
        activations, step = int8_activations(args[0])
        weight = torch.round(module.weight / module.weight_scale)
        product = saturated_product(activations, weight).double() * step.double() * module.weight_scale[:, 0].double()
        return (product if module.bias is None else product + module.bias.double()).to(output.dtype)

    with torch.no_grad():
        model(torch.zeros(1, 1, dtype=torch.long))  # transformers dequantizes the int8 weights on the first call
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            module.quantization_enabled = False  # compressed-tensors' own activation rounding off
            if SATURATING:
                module.register_forward_hook(saturated)
            else:
                module.register_forward_pre_hook(rounded)
    return model


def require_llmcompressor() -> None:
    """Skip unless llm-compressor's environment is there to run `surgeon quantize`."""
    if not LLMCOMPRESSOR_PYTHON.is_file():
        pytest.skip(f"`surgeon quantize` runs in llm-compressor's environment, and {LLMCOMPRESSOR_PYTHON} is "
                    "missing: make install-llmcompressor")


def quantized(source: Path, out: Path) -> dict:
    """`surgeon quantize SOURCE --output OUT` (W8A8) in llm-compressor's environment; the report it writes."""
    result = subprocess.run([str(LLMCOMPRESSOR_PYTHON), "-m", "surgeon", "--quiet", "quantize", str(source),
                             "--output", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report: dict = json.loads((out / "report.json").read_text())
    return report


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


@pytest.mark.parametrize("format", ["standard", "decilm"])
def test_vllm_serves_a_quantized_export_with_transformers_greedy_tokens(format, run, tmp_path):
    """The export quantized W8A8 by `surgeon quantize`: vLLM gives the greedy tokens of the quantized checkpoint in
    transformers, computed as vLLM's CPU kernel computes them on this host (`int8_rounded`)."""
    require_llmcompressor()
    if AMX:
        pytest.skip("exact greedy tokens need vLLM's int8 GEMM on float32 activations, which AMX hosts do not take")
    export, out = tmp_path / "export", tmp_path / "w8a8"
    assert main(["--quiet", "export", str(run[0]), "--compact", "--format", format, "--output", str(export)]) == 0
    report = quantized(export, out)["quantize"]
    assert (report["scheme"], report["format"], report["layers"]) == ("W8A8", "int-quantized", 21 if format ==
                                                                      "decilm" else 28)
    prompts = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(1)).tolist()
    expected = masked_tokens(int8_rounded(load_compact(out, dtype=torch.float32).eval()), prompts)
    assert served_tokens(str(out), prompts) == expected


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


@pytest.mark.slow
def test_smollm2_pruned_recovered_exported_and_quantized_is_served_by_vllm(tmp_path):
    """SmolLM2 through the documented path, on a small budget: prune (structured, 90% kept, one shot on 2 windows of
    128 tokens), recover (1024 tokens), export, quantize (W8A8, in llm-compressor's environment), serve in vLLM. The
    recovered export is served with the recovered masked model's greedy tokens, as a pruned one is.

    The quantized weights keep every zero of the export, as int8 zeros. vLLM and transformers are compared on the
    log-likelihood of held-out text, not on greedy tokens, which cannot agree exactly here: W8A8 rounds every linear
    layer's input to int8 per token at run time, and SmolLM2's activations make that rounding sensitive to the last
    bit. A relative change of 1e-6 in the layers' inputs moves single next-token log-probabilities by up to a nat,
    even on vLLM's grid (`int8_rounded`); with compressed-tensors' own grid, vLLM's and transformers' differ by up to
    5 nats on these 2,040 tokens and by 0.23 on average, and greedy continuations part after a few tokens. Their mean
    is the same model's: within 0.05 nats per token, perplexity within 5% (measured: 0.007; the unquantized export's
    agree within 1e-4). On hosts with AMX vLLM serves the quantized checkpoint in bfloat16 (`QUANTIZED_DTYPE`), and
    the same bound holds; so it does on hosts whose int8 products saturate (`SATURATING`)."""
    from safetensors.torch import load_file

    require_llmcompressor()
    run, recovered, export, out = (tmp_path / name for name in ("run", "recovered", "export", "w8a8"))
    assert main(["--quiet", "prune", "--model", "smollm2-135m", "--structure", "structured", "--target-size", "0.9",
                 "--shots", "1", "--nsamples", "2", "--seqlen", "128", "--calibration", "wikitext2-valid",
                 "--eval-windows", "1", "--eval-seqlen", "128", "--output", str(run)]) == 0
    assert main(["--quiet", "recover", str(run), "--output", str(recovered), "--tokens", "1024", "--seqlen",
                 "128"]) == 0
    assert main(["--quiet", "export", str(recovered), "--compact", "--output", str(export)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(export)
    prompts = [tokenizer(text).input_ids for text in ("The history of the city begins", "The film was released in")]
    trained = AutoModelForCausalLM.from_pretrained(recovered, dtype="float32").eval()
    assert served_tokens(str(export), prompts, 24) == masked_tokens(trained, prompts, 24)  # the recovered export
    report = quantized(export, out)["quantize"]
    before, after = load_file(export / "model.safetensors"), load_file(out / "model.safetensors")
    layers = [name for name, weight in after.items() if weight.dtype == torch.int8]
    zeros = sum(int((before[name] == 0).sum()) for name in layers)
    assert len(layers) == report["layers"] == 210 and report["zeros_kept"] == zeros > 0
    for name in layers:
        assert not after[name][before[name] == 0].any(), name
    assert report["bytes_after"] < 0.45 * report["bytes_before"]
    windows = tokenize(tokenizer, evaluation_text("wikitext2"))[0, : 8 * 256].view(8, 256).tolist()
    served = served_log_likelihood(str(out), windows, QUANTIZED_DTYPE)
    expected = log_likelihood(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval(), windows)
    assert abs(float(served.mean() - expected.mean())) < 0.05
