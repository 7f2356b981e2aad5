"""Tiny random models of every decoder family, dense and Mixture-of-Experts, from transformers' config classes."""

from __future__ import annotations

import torch

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, LAYERS, VOCAB = 32, 64, 4, 2, 2, 128
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
# family -> (config class in transformers, its settings beyond COMMON)
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 8}),
    "gemma": ("GemmaConfig", {"head_dim": 8}),
    "gemma2": ("Gemma2Config", {"head_dim": 8}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 8}),
    "phi3": ("Phi3Config", {}),
    "olmo2": ("Olmo2Config", {}),
    "granite": ("GraniteConfig", {}),
    "gpt_neox": ("GPTNeoXConfig", {"num_key_value_heads": None}),
    "opt": ("OPTConfig", {"ffn_dim": INTERMEDIATE, "word_embed_proj_dim": HIDDEN, "num_key_value_heads": None}),
    "stablelm": ("StableLmConfig", {}),
    "starcoder2": ("Starcoder2Config", {}),
    "smollm3": ("SmolLM3Config", {}),
}


# Mixture-of-Experts families: 4 experts, top-2, their expert weights fused into 3-D parameters.
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
MOE_FAMILIES = {
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": ("Qwen2MoeConfig", {**MOE, "num_experts": 4, "shared_expert_intermediate_size": 64}),
    "qwen3_moe": ("Qwen3MoeConfig", {**MOE, "num_experts": 4, "head_dim": 8}),
    "olmoe": ("OlmoeConfig", {"num_experts": 4, "num_experts_per_tok": 2}),
    "deepseek_v3": ("DeepseekV3Config", {**MOE, "n_routed_experts": 4, "first_k_dense_replace": 0, "n_group": 1,
                                         "topk_group": 1, "q_lora_rank": 16, "kv_lora_rank": 16,
                                         "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
                                         "num_key_value_heads": HEADS}),
    "gpt_oss": ("GptOssConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 8}),
}


def family_model(family: str) -> torch.nn.Module:
    import transformers

    name, extra = FAMILIES[family] if family in FAMILIES else MOE_FAMILIES[family]
    settings = {key: value for key, value in {**COMMON, **extra}.items() if value is not None}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, name)(**settings))
    return model.eval()
