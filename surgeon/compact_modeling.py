"""Decoder models whose layers have their own widths: the modeling code of a heterogeneous compact checkpoint.

A heterogeneous checkpoint's config.json holds the widest widths as the architecture's own fields and
each layer's widths under `per_layer_config` (`{"<layer>": {"intermediate_size": …,
"num_attention_heads": …, "num_key_value_heads": …}}`; OPT: `ffn_dim`), the schema of transformers'
per-layer configs, whose Llama and OPT modeling code still builds every layer at one width. The
classes here build the standard model at the widest widths and give each layer its own (`resize_layers`):
its linear layers take their sizes, and attention its heads per KV head (the modeling code infers the
head count from the projections). This file depends only on torch and transformers: it is copied into
each heterogeneous checkpoint, where `trust_remote_code=True` loads it, and `surgeon.load_compact`
uses it without remote code.
"""

from __future__ import annotations

from typing import Any

import transformers
from torch import nn

PREFIX = "surgeon_compact_"  # model_type of a compact family: PREFIX + the base family
BASES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3", "opt": "OPT"}


def _resized(linear: nn.Linear, out_features: int | None = None, in_features: int | None = None) -> nn.Linear:
    """A new linear layer like `linear` with other sizes (its weights are loaded afterwards)."""
    return nn.Linear(in_features or linear.in_features, out_features or linear.out_features,
                     bias=linear.bias is not None, device=linear.weight.device, dtype=linear.weight.dtype)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Llama-family or OPT causal LM."""
    inner: Any = model.model
    return inner.decoder.layers if hasattr(inner, "decoder") else inner.layers


def resize_layers(model: nn.Module, per_layer: dict[str, dict[str, int]]) -> None:
    """Give decoder layer i the widths in `per_layer[str(i)]` (layers not named keep the config's)."""
    config: Any = model.config
    layers = decoder_layers(model)
    for key, widths in per_layer.items():
        layer: Any = layers[int(key)]
        if "ffn_dim" in widths:
            layer.fc1 = _resized(layer.fc1, out_features=widths["ffn_dim"])
            layer.fc2 = _resized(layer.fc2, in_features=widths["ffn_dim"])
        if "intermediate_size" in widths:
            mlp, width = layer.mlp, widths["intermediate_size"]
            mlp.gate_proj = _resized(mlp.gate_proj, out_features=width)
            mlp.up_proj = _resized(mlp.up_proj, out_features=width)
            mlp.down_proj = _resized(mlp.down_proj, in_features=width)
        if "num_attention_heads" in widths or "num_key_value_heads" in widths:
            attn = layer.self_attn
            heads = widths.get("num_attention_heads", config.num_attention_heads)
            kv_heads = widths.get("num_key_value_heads", config.num_key_value_heads)
            attn.q_proj = _resized(attn.q_proj, out_features=heads * attn.head_dim)
            attn.k_proj = _resized(attn.k_proj, out_features=kv_heads * attn.head_dim)
            attn.v_proj = _resized(attn.v_proj, out_features=kv_heads * attn.head_dim)
            attn.o_proj = _resized(attn.o_proj, in_features=heads * attn.head_dim)
            attn.num_key_value_groups = heads // kv_heads


def _build(family: str) -> tuple[Any, Any]:
    """Compact config and causal-LM classes over `family`'s own, e.g. CompactLlamaConfig, CompactLlamaForCausalLM."""
    name = BASES[family]
    base_config = getattr(transformers, f"{name}Config")
    base_model = getattr(transformers, f"{name}ForCausalLM")

    def config_init(self: Any, **kwargs: Any) -> None:
        widths = kwargs.pop("per_layer_config", None) or {}
        base_config.__init__(self, **kwargs)
        self.layer_widths = {str(key): dict(value) for key, value in widths.items()}

    def to_dict(self: Any) -> dict[str, Any]:
        out = base_config.to_dict(self)
        out.pop("layer_widths", None)
        out["per_layer_config"] = self.layer_widths
        return out

    config = type(f"Compact{name}Config", (base_config,), {
        "model_type": f"{PREFIX}{family}", "__init__": config_init, "to_dict": to_dict,
        "__doc__": f"{name}Config with per-layer widths (`per_layer_config`)."})

    def model_init(self: Any, model_config: Any) -> None:
        base_model.__init__(self, model_config)
        resize_layers(self, model_config.layer_widths)

    model = type(f"Compact{name}ForCausalLM", (base_model,), {
        "config_class": config, "__init__": model_init,
        "__doc__": f"{name}ForCausalLM whose layers have their own widths (`resize_layers`)."})
    return config, model


CompactLlamaConfig, CompactLlamaForCausalLM = _build("llama")
CompactMistralConfig, CompactMistralForCausalLM = _build("mistral")
CompactQwen2Config, CompactQwen2ForCausalLM = _build("qwen2")
CompactQwen3Config, CompactQwen3ForCausalLM = _build("qwen3")
CompactOPTConfig, CompactOPTForCausalLM = _build("opt")


for _config_class, _model_class in ((CompactLlamaConfig, CompactLlamaForCausalLM),
                                    (CompactMistralConfig, CompactMistralForCausalLM),
                                    (CompactQwen2Config, CompactQwen2ForCausalLM),
                                    (CompactQwen3Config, CompactQwen3ForCausalLM),
                                    (CompactOPTConfig, CompactOPTForCausalLM)):
    # Known to the Auto classes from here on, so that AutoConfig and AutoTokenizer read these checkpoints
    # without remote code (a second copy of this file, loaded as remote code, registers the same names).
    transformers.AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    transformers.AutoModelForCausalLM.register(_config_class, _model_class, exist_ok=True)


def classes(family: str) -> tuple[Any, Any]:
    """The compact config and causal-LM classes over `family`'s (a key of BASES)."""
    name = BASES[family]
    return globals()[f"Compact{name}Config"], globals()[f"Compact{name}ForCausalLM"]
