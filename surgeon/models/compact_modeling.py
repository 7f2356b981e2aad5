"""The modeling code of a per-layer compact checkpoint: a Llama in the block schema of DeciLM / nemotron-nas.

A "decilm" checkpoint (`model_type` "nemotron-nas", architecture `DeciLMForCausalLM`), which vLLM serves
natively, holds per layer `{"attention": {"no_op", "replace_with_linear", "n_heads_in_group"}, "ffn":
{"no_op", "replace_with_linear", "intermediate_size" or "ffn_mult"}}`: the MLP width is the
`intermediate_size` written, or `ffn_width(ffn_mult)` where the section has that key (as vLLM reads it),
the KV heads `num_attention_heads // n_heads_in_group`, and a no-op part has no weights. transformers
has no DeciLM model of its own: `DeciLMForCausalLM` here builds the Llama model at the widest widths
and gives each layer its own (`resize_layers`). This file depends only on torch and transformers: it is
copied into each checkpoint, where `trust_remote_code=True` loads it, and `surgeon.load_compact` uses
it without remote code.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch
import transformers
from torch import nn


def _resized(linear: nn.Linear, out_features: int | None = None, in_features: int | None = None) -> nn.Linear:
    """A new linear layer like `linear` with other sizes (its weights are loaded afterwards)."""
    return nn.Linear(in_features or linear.in_features, out_features or linear.out_features,
                     bias=linear.bias is not None, device=linear.weight.device, dtype=linear.weight.dtype)


def resize_layers(model: nn.Module, per_layer: dict[str, dict[str, Any]]) -> None:
    """Give decoder layer i the widths in `per_layer[str(i)]` (layers not named keep the config's), and make the
    parts its `skip` names ("attention", "mlp") no-ops."""
    config: Any = model.config
    inner: Any = model.model
    layers = inner.layers
    for key, widths in per_layer.items():
        layer: Any = layers[int(key)]
        skip = set(widths.get("skip", ()))
        if "attention" in skip:
            layer.self_attn, layer.input_layernorm = _NoAttention(int(key), layer.self_attn.head_dim), nn.Identity()
        if "mlp" in skip:
            layer.mlp, layer.post_attention_layernorm = _NoMLP(), nn.Identity()
        if "intermediate_size" in widths:
            mlp, width = layer.mlp, widths["intermediate_size"]
            mlp.gate_proj = _resized(mlp.gate_proj, out_features=width)
            mlp.up_proj = _resized(mlp.up_proj, out_features=width)
            mlp.down_proj = _resized(mlp.down_proj, in_features=width)
        if "num_key_value_heads" in widths:
            attn, heads, kv_heads = layer.self_attn, config.num_attention_heads, widths["num_key_value_heads"]
            attn.q_proj = _resized(attn.q_proj, out_features=heads * attn.head_dim)
            attn.k_proj = _resized(attn.k_proj, out_features=kv_heads * attn.head_dim)
            attn.v_proj = _resized(attn.v_proj, out_features=kv_heads * attn.head_dim)
            attn.o_proj = _resized(attn.o_proj, in_features=heads * attn.head_dim)
            attn.num_key_value_groups = heads // kv_heads


FFN_MULTIPLE = 256  # DeciLM rounds every MLP width up to a multiple of this


def ffn_width(ffn_mult: float, hidden_size: int) -> int:
    """DeciLM's MLP width for `ffn_mult`: int(2·ffn_mult·hidden/3), rounded up to a multiple of 256."""
    return math.ceil(int(2 * ffn_mult * hidden_size / 3) / FFN_MULTIPLE) * FFN_MULTIPLE


def mlp_width(ffn: Any, hidden_size: int) -> int:
    """A DeciLM layer's MLP width: `ffn_width(ffn_mult)` where its `ffn` section has that key (as vLLM reads it),
    else its `intermediate_size`."""
    section = vars(ffn) if isinstance(ffn, SimpleNamespace) else ffn
    return ffn_width(section["ffn_mult"], hidden_size) if "ffn_mult" in section else section["intermediate_size"]


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
                layer_widths["intermediate_size"] = mlp_width(block.ffn, config.hidden_size)
            widths[str(index)] = layer_widths
        resize_layers(self, widths)


transformers.AutoConfig.register(DeciLMConfig.model_type, DeciLMConfig, exist_ok=True)
transformers.AutoModelForCausalLM.register(DeciLMConfig, DeciLMForCausalLM, exist_ok=True)

