"""Decoder models whose layers have their own widths: the modeling code of a heterogeneous compact checkpoint.

A heterogeneous checkpoint's config.json holds the widest widths as the architecture's own fields and
each layer's widths under `per_layer_config` (`{"<layer>": {"intermediate_size": …,
"num_attention_heads": …, "num_key_value_heads": …, "skip": ["attention", "mlp"]}}`; OPT: `ffn_dim`),
the schema of transformers' per-layer configs, whose Llama and OPT modeling code still builds every
layer at one width. The classes here build the standard model at the widest widths and give each layer
its own (`resize_layers`): its linear layers take their sizes, attention its heads per KV head (the
modeling code infers the head count from the projections), and a part named in `skip` becomes a no-op
without weights, its norm included. This file depends only on torch and transformers: it is copied into
each heterogeneous checkpoint, where `trust_remote_code=True` loads it, and `surgeon.load_compact`
uses it without remote code.

A "decilm" checkpoint is a Llama with the block schema of DeciLM / nemotron-nas (`model_type`
"nemotron-nas", architecture `DeciLMForCausalLM`), which vLLM serves natively: per layer,
`{"attention": {"no_op", "replace_with_linear", "n_heads_in_group"}, "ffn": {"no_op",
"replace_with_linear", "ffn_mult"}}`; the MLP width is `ffn_width(ffn_mult)`, the KV heads
`num_attention_heads // n_heads_in_group`, and a no-op part has no weights (`DeciLMForCausalLM`).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
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


def resize_layers(model: nn.Module, per_layer: dict[str, dict[str, Any]]) -> None:
    """Give decoder layer i the widths in `per_layer[str(i)]` (layers not named keep the config's), and make the
    parts its `skip` names ("attention", "mlp"; gated families) no-ops."""
    config: Any = model.config
    layers = decoder_layers(model)
    for key, widths in per_layer.items():
        layer: Any = layers[int(key)]
        skip = set(widths.get("skip", ()))
        if "attention" in skip:
            layer.self_attn, layer.input_layernorm = _NoAttention(int(key), layer.self_attn.head_dim), nn.Identity()
        if "mlp" in skip:
            layer.mlp, layer.post_attention_layernorm = _NoMLP(), nn.Identity()
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


FFN_MULTIPLE = 256  # DeciLM rounds every MLP width up to a multiple of this


def ffn_width(ffn_mult: float, hidden_size: int) -> int:
    """DeciLM's MLP width for `ffn_mult`: int(2·ffn_mult·hidden/3), rounded up to a multiple of 256."""
    return math.ceil(int(2 * ffn_mult * hidden_size / 3) / FFN_MULTIPLE) * FFN_MULTIPLE


def ffn_mult(width: int, hidden_size: int) -> float:
    """The `ffn_mult` (6 decimals, as DeciLM configs hold it) whose `ffn_width` is `width`, a multiple of 256."""
    return round(1.5 * width / hidden_size, 6)


class _NoAttention(nn.Module):
    """A no-op attention: it adds nothing and holds no weights. It gives the KV cache an entry of one zero head for
    the tokens, so that the cache's length is right whichever layer it is read from (an entry without heads reads
    as empty)."""

    def __init__(self, layer_idx: int, head_dim: int) -> None:
        super().__init__()
        self.layer_idx, self.head_dim = layer_idx, head_dim

    def forward(self, hidden_states: torch.Tensor, *args: Any, cache: Any = None, past_key_values: Any = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        cache = cache if cache is not None else past_key_values  # newer transformers name it `cache`
        if cache is not None:
            zero = hidden_states.new_zeros(hidden_states.shape[0], 1, hidden_states.shape[1], self.head_dim)
            cache.update(zero, zero, self.layer_idx)
        return torch.zeros_like(hidden_states), None


class _NoMLP(nn.Module):
    """A no-op MLP: it adds nothing and holds no weights."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


def _section(value: Any) -> SimpleNamespace:
    """A block config's `attention` or `ffn` part with attribute access, as DeciLM readers use it."""
    return value if isinstance(value, SimpleNamespace) else SimpleNamespace(**dict(value))


class DeciLMConfig(transformers.LlamaConfig):
    """LlamaConfig with DeciLM's per-layer `block_configs` (attention and ffn of each layer)."""

    model_type = "nemotron-nas"

    def __init__(self, block_configs: list[dict[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.block_configs = [SimpleNamespace(attention=_section(block["attention"]), ffn=_section(block["ffn"]))
                              for block in block_configs or []]

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["block_configs"] = [{"attention": vars(block.attention), "ffn": vars(block.ffn)}
                                for block in self.block_configs]
        return out


class DeciLMForCausalLM(transformers.LlamaForCausalLM):
    """A Llama whose layers take their widths, and no-op parts, from `block_configs`."""

    config_class = DeciLMConfig

    def __init__(self, config: DeciLMConfig) -> None:
        linear = [index for index, block in enumerate(config.block_configs)
                  if getattr(block.attention, "replace_with_linear", False)
                  or getattr(block.ffn, "replace_with_linear", False)]
        if linear:
            raise ValueError(f"DeciLM layers {linear} replace a part with a linear layer (replace_with_linear), which "
                             "this modeling code does not build")
        super().__init__(config)
        widths: dict[str, dict[str, Any]] = {}
        for index, block in enumerate(config.block_configs):
            layer_widths: dict[str, Any] = {"skip": [part for part, section in (("attention", block.attention),
                                                                                 ("mlp", block.ffn)) if section.no_op]}
            if not block.attention.no_op:
                layer_widths["num_key_value_heads"] = config.num_attention_heads // block.attention.n_heads_in_group
            if not block.ffn.no_op:
                layer_widths["intermediate_size"] = ffn_width(block.ffn.ffn_mult, config.hidden_size)
            widths[str(index)] = layer_widths
        resize_layers(self, widths)


transformers.AutoConfig.register(DeciLMConfig.model_type, DeciLMConfig, exist_ok=True)
transformers.AutoModelForCausalLM.register(DeciLMConfig, DeciLMForCausalLM, exist_ok=True)


def classes(family: str) -> tuple[Any, Any]:
    """The compact config and causal-LM classes over `family`'s (a key of BASES)."""
    name = BASES[family]
    return globals()[f"Compact{name}Config"], globals()[f"Compact{name}ForCausalLM"]
