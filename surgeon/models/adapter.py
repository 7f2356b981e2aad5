"""Load causal LMs (hub id, local directory, GGUF file, built-in model) and find prunable layers.

Prunable layers are the `nn.Linear` modules inside the decoder blocks; embeddings and the LM
head are never touched. Decoder blocks are discovered by structure (the `nn.ModuleList` of
`config.num_hidden_layers` modules holding linear layers), which covers every family in
`families.FAMILIES` and serves as the fallback for other causal LMs. Every other weight matrix in the
blocks (a Mixture-of-Experts model's fused 3-D expert weights, say) is either left out by name
(`leave_out`; the routers by default) or makes the run refuse (`check_prunable`): no weight is
skipped silently. Fused experts of the layout `surgeon.models.experts` knows are split into layers while a
run prunes.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from surgeon.errors import SurgeonError, first_line
from surgeon.models import hub
from surgeon.models.builtin import EMBEDDED_MODELS, drop_quantizer
from surgeon.models.experts import ExpertLayers, is_fused_experts
from surgeon.models.families import FAMILIES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# `leave_out` names parts of the decoder blocks not to prune: this word for the Mixture-of-Experts routers,
# else glob patterns over parameter names. The routers are left out by default.
ROUTER = "router"
LEAVE_OUT = (ROUTER,)


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from: a hub id or directory, plus a GGUF file inside it."""

    path: str
    gguf_file: str | None = None

    @property
    def on_hub(self) -> bool:
        """Whether loading it may ask the hub (not a local folder or file)."""
        return not Path(self.path).is_dir()

    def explain(self, name: str, error: BaseException) -> str:
        """One line on why `name` did not load: the hub's state and the built-in names for a hub id."""
        if not self.on_hub:
            return first_line(error)
        if not hub.reachable():
            return (f"not a local folder, a .gguf file or a built-in model ({', '.join(EMBEDDED_MODELS)}), "
                    f"and not in the local cache: {hub.unreachable_reason()}")
        return f"{first_line(error)} (built-in models: {', '.join(EMBEDDED_MODELS)})"


def resolve_source(name: str) -> ModelSource:
    """Map a model name (embedded name, .gguf file, directory or hub id) to a `ModelSource`."""
    if name in EMBEDDED_MODELS:
        folder = EMBEDDED_MODELS[name].folder(name)
        if folder is not None:
            return ModelSource(str(folder))
        path = EMBEDDED_MODELS[name].path(name)
        return ModelSource(str(path.parent), path.name)
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise SurgeonError(f"model file {name!r} does not exist")
        return ModelSource(str(path.parent), path.name)
    if path.exists() and not path.is_dir():
        raise SurgeonError(f"model {name!r} is a file but not a .gguf file; give a directory or a hub id")
    if not path.exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise SurgeonError(f"model directory {name!r} does not exist")
    return ModelSource(str(path) if path.is_dir() else name)


def load_tokenizer(name: str, gguf_file: str | None = None) -> PreTrainedTokenizerBase:
    """Load a tokenizer by hub id, directory, or from a GGUF file inside a directory."""
    from transformers import AutoTokenizer

    source = resolve_source(name) if gguf_file is None else ModelSource(name, gguf_file)
    try:
        with hub.cache_only_when_unreachable(source.on_hub):
            return AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SurgeonError(
            f"cannot load a tokenizer from {name!r} ({source.explain(name, error)}); pass --tokenizer NAME_OR_PATH"
        ) from error


def causal_lm_class(path: str) -> Any:
    """The class that loads the causal LM at `path`: a DeciLM compact checkpoint's own (`compact_modeling`, no
    remote code needed), else `AutoModelForCausalLM`."""
    from transformers import AutoModelForCausalLM

    from surgeon.models import compact_modeling

    config = Path(path) / "config.json"
    family = json.loads(config.read_text()).get("model_type", "") if config.is_file() else ""
    if family == compact_modeling.DeciLMConfig.model_type:
        return compact_modeling.DeciLMForCausalLM
    return AutoModelForCausalLM


def load_model(
    name: str, tokenizer: str | None = None, dtype: str = "float32", device: str = "cpu"
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer (or the one named by `tokenizer`), in eval mode."""

    if dtype not in DTYPES:
        raise SurgeonError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SurgeonError(f"device {device!r} requested but no CUDA GPU is available")
    source = resolve_source(name)
    try:
        with hub.cache_only_when_unreachable(source.on_hub):
            model = causal_lm_class(source.path).from_pretrained(source.path, gguf_file=source.gguf_file,
                                                                 dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError) as error:
        raise SurgeonError(f"cannot load model {name!r}: {source.explain(name, error)}") from error
    if source.gguf_file is not None:
        drop_quantizer(model)
    model.to(device).eval()
    tok = load_tokenizer(tokenizer) if tokenizer else load_tokenizer(source.path, source.gguf_file)
    prunable_layers(model)  # fail early, naming the architecture, if nothing can be pruned
    return model, tok


def attention_layout(config: Any) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) of a transformers config; 0 where the config does not say."""
    heads: int = getattr(config, "num_attention_heads", None) or 0
    kv_heads: int = getattr(config, "num_key_value_heads", None) or heads
    head_dim: int = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", 0) // heads if heads else 0)
    return heads, kv_heads, head_dim


def max_seqlen(model: nn.Module) -> int | None:
    """The longest sequence the model's position embeddings allow, if the config says."""
    return getattr(model.config, "max_position_embeddings", None)


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's decoder blocks: the `nn.ModuleList` of `num_hidden_layers` modules with linears."""
    expected = getattr(model.config, "num_hidden_layers", None)
    candidates = [
        module
        for module in model.modules()
        if isinstance(module, nn.ModuleList)
        and len(module) > 0
        and all(any(isinstance(m, nn.Linear) for m in block.modules()) for block in module)
    ]
    exact = [module for module in candidates if expected is None or len(module) == expected]
    chosen = exact or candidates
    if not chosen:
        arch = getattr(model.config, "model_type", type(model).__name__)
        raise SurgeonError(
            f"architecture {arch!r} ({type(model).__name__}) is not supported: "
            "no decoder blocks holding nn.Linear layers were found"
        )
    if str(getattr(model.config, "model_type", None)).removeprefix("surgeon_compact_") not in FAMILIES:
        _warn_untested(str(getattr(model.config, "model_type", type(model).__name__)))
    return max(chosen, key=len)


@functools.cache
def _warn_untested(arch: str) -> None:
    """Warn once per architecture that it is not among the tested families."""
    logger.warning("architecture %r is not a tested family; using generic block discovery", arch)


def prunable_layers(model: nn.Module, leave_out: tuple[str, ...] = LEAVE_OUT) -> list[list[tuple[str, nn.Linear]]]:
    """Per decoder block, the (qualified name, module) of every `nn.Linear` inside it that `leave_out` keeps in.

    An expert's layer (`experts.ExpertLayers`) is left out by its own name or by its fused parameter's
    (`….experts.gate_up_proj` for its gate and up projections, `….experts.down_proj` for its down).
    """
    names = {module: name for name, module in model.named_modules()}
    routers = _router_modules(model)
    fused = {id(layer): f"{names[module]}.{part}" for module in names if isinstance(module, ExpertLayers)
             for expert in module for layer, part in ((expert.gate_proj, "gate_up_proj"),
                                                      (expert.up_proj, "gate_up_proj"),
                                                      (expert.down_proj, "down_proj"))}
    return [
        [(names[m], m) for m in block.modules()
         if isinstance(m, nn.Linear) and not _left_out(f"{names[m]}.weight", m in routers, leave_out)
         and not (id(m) in fused and _left_out(fused[id(m)], False, leave_out))]
        for block in decoder_blocks(model)
    ]


def block_weights(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Every parameter of the decoder blocks, by qualified name (weights, biases, norms, fused experts)."""
    names = {id(param): name for name, param in model.named_parameters(remove_duplicate=False)}
    return [(names[id(param)], param) for block in decoder_blocks(model) for param in block.parameters()]


def unprunable_weights(model: nn.Module, leave_out: tuple[str, ...] = LEAVE_OUT) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of each weight matrix in the decoder blocks that is neither a prunable layer's nor left out.

    A weight matrix is any parameter of two or more dimensions: an `nn.Linear` weight, a router's
    weight held in its own module, a Mixture-of-Experts model's fused [experts, out, in] weights
    (prunable in the layout `experts.is_fused_experts` knows, which a run splits into layers).
    """
    prunable = {id(module.weight) for block in prunable_layers(model, leave_out) for _, module in block}
    prunable |= {id(param) for module in model.modules() if is_fused_experts(module)  # split while pruning
                 for param in (module.gate_up_proj, module.down_proj)}
    routers = {id(param) for module in _router_modules(model) for param in module.parameters()}
    return [(name, tuple(param.shape)) for name, param in block_weights(model)
            if param.dim() >= 2 and id(param) not in prunable
            and not _left_out(name, id(param) in routers, leave_out)]


def check_prunable(model: nn.Module, leave_out: tuple[str, ...] = LEAVE_OUT) -> None:
    """Refuse, in one line naming them, weight matrices of the decoder blocks that the run cannot prune."""
    missing = unprunable_weights(model, leave_out)
    if not missing:
        return
    arch = getattr(model.config, "model_type", type(model).__name__)
    patterns = list(dict.fromkeys(re.sub(r"\.\d+\.", ".*.", name) for name, _ in missing))
    shapes = {re.sub(r"\.\d+\.", ".*.", name): shape for name, shape in missing}
    listed = ", ".join(f"{pattern} {list(shapes[pattern])}" for pattern in patterns)
    raise SurgeonError(
        f"{arch}: {len(missing)} weight matrices of the decoder blocks cannot be pruned (only nn.Linear layers "
        f"can): {listed}; leave them out with --leave-out '{','.join((*leave_out, *patterns))}' to prune the rest"
    )


def _router_modules(model: nn.Module) -> set[nn.Module]:
    """Mixture-of-Experts routers: modules whose class is a router (MixtralTopKRouter, …) or a shared expert's gate."""
    return {module for name, module in model.named_modules()
            if "router" in type(module).__name__.lower() or name.endswith("shared_expert_gate")}


def _left_out(name: str, router: bool, leave_out: tuple[str, ...]) -> bool:
    """Whether the parameter `name` is left out: a router under "router", or its name matches a glob pattern."""
    return (router and ROUTER in leave_out) or any(fnmatch.fnmatchcase(name, pattern) for pattern in leave_out)
