"""Quantize a pruned model with llm-compressor for vLLM (extra `llmcompressor`; docs/USAGE.md, "Quantize and serve").

`surgeon quantize RUN_DIR --output OUT` loads a folder written by `surgeon prune`, `recover` or `export`, quantizes
every linear layer of the decoder blocks (never the LM head) with llm-compressor's `QuantizationModifier`, and writes
the checkpoint in the compressed-tensors format that vLLM and transformers load. No scheme offered needs calibration
data: W8A8 (int8 weights per output channel, int8 activations per token computed at run time), FP8_DYNAMIC (the same
in fp8) and W4A16 (int4 weights in groups of 128). Their weight quantization is symmetric, so a weight that pruning
made exactly zero quantizes to exactly zero; the written weights are read back, dequantized and checked, and a layer
where any came back is refused before anything appears in the output folder.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from surgeon.app.run import pruning_run
from surgeon.app.settings import QuantizeConfig
from surgeon.errors import SurgeonError, first_line
from surgeon.io import COMPLETE_MARKER, OutputDirectory, write_json

IGNORE = ("lm_head",)  # modules left unquantized, by name
ZeroMask = tuple[np.ndarray, torch.Size]  # where a weight is exactly zero: the bits packed, and the weight's shape


def require_llmcompressor() -> str:
    """llm-compressor's version, or a SurgeonError saying how to install it."""
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")  # its INFO lines go to stdout; read once, on import
    try:
        import llmcompressor
    except ImportError as error:
        raise SurgeonError("surgeon quantize needs llm-compressor, which is not installed: "
                           "pip install 'llm-surgeon[llmcompressor]' (or make install-llmcompressor)") from error
    version: str = llmcompressor.__version__
    return version


def weight_bytes(folder: Path) -> int:
    """Bytes on disk of a checkpoint's weight files (*.safetensors)."""
    return sum(file.stat().st_size for file in folder.glob("*.safetensors"))


def zero_masks(model: nn.Module) -> dict[str, ZeroMask]:
    """Where each linear layer's weight is exactly zero, by module name (one bit per weight)."""
    return {name: (np.packbits((module.weight.detach() == 0).cpu().numpy()), module.weight.shape)
            for name, module in model.named_modules() if isinstance(module, nn.Linear) and name not in IGNORE}


def check_groups(model: nn.Module, scheme: str) -> None:
    """Refuse a scheme that quantizes groups of input weights for a layer whose inputs they do not divide."""
    from compressed_tensors.quantization import preset_name_to_scheme

    group = preset_name_to_scheme(scheme, ["Linear"]).weights.group_size
    for name, module in model.named_modules():
        if group and isinstance(module, nn.Linear) and name not in IGNORE and module.in_features % group:
            raise SurgeonError(f"quantize: {scheme} quantizes groups of {group} inputs, but {name} has "
                               f"{module.in_features} inputs; choose W8A8 or FP8_DYNAMIC")


def quantize_model(model: nn.Module, scheme: str) -> None:
    """Quantize the model's linear layers but `IGNORE` in place with llm-compressor (`oneshot`, no calibration data)."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    oneshot(model=model, recipe=[QuantizationModifier(targets="Linear", scheme=scheme, ignore=list(IGNORE))])


def saved_weights(folder: Path, model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Each quantized layer of `model` with its weight as written to `folder`, dequantized."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors import safe_open

    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(file), framework="pt"))
                   for file in sorted(folder.glob("*.safetensors"))]
        where: dict[str, Any] = {}
        for handle in handles:
            where.update(dict.fromkeys(handle.keys(), handle))
        for name, module in model.named_modules():
            scheme = getattr(module, "quantization_scheme", None)
            if not isinstance(scheme, QuantizationScheme) or scheme.weights is None:
                continue
            prefix = f"{name}."
            state = {key[len(prefix):]: handle.get_tensor(key) for key, handle in where.items()
                     if key.startswith(prefix) and "." not in key[len(prefix):]}
            compressor = BaseCompressor.get_value_from_registry(scheme.format.value)
            yield name, compressor.decompress(state, scheme)["weight"]


def check_zeros(zeros: dict[str, ZeroMask], weights: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, int]:
    """Refuse a layer where a weight that was exactly zero is not any more; return (layers, zero weights) checked."""
    layers = count = 0
    for name, weight in weights:
        bits, shape = zeros[name]
        if weight.shape != shape:
            raise SurgeonError(f"quantize: {name} was written with shape {tuple(weight.shape)}, not {tuple(shape)}; "
                               "nothing was written")
        mask = torch.from_numpy(np.unpackbits(bits, count=math.prod(shape)).astype(bool)).view(shape)
        filled = int((weight[mask] != 0).sum())
        if filled:
            raise SurgeonError(f"quantize: {name}: {filled} of its {int(mask.sum())} zero weights are not zero after "
                               "quantization; nothing was written")
        layers += 1
        count += int(mask.sum())
    return layers, count


def scheme_format(model: nn.Module) -> str:
    """The compressed-tensors format the quantized layers were written in (e.g. int-quantized)."""
    schemes = [getattr(module, "quantization_scheme", None) for module in model.modules()]
    return ", ".join(sorted({str(scheme.format.value) for scheme in schemes if scheme is not None}))


def _load(source: Path) -> tuple[Any, Any]:
    """The model (in the checkpoint's dtype, eval mode) and tokenizer of a checkpoint folder."""
    from transformers import AutoTokenizer

    from surgeon.export.compact import load_compact

    try:
        return load_compact(source, dtype="auto").eval(), AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise SurgeonError(f"cannot load the model in {str(source)!r}: {first_line(error)}") from error


def run_quantize(config: QuantizeConfig) -> dict[str, Any]:
    """Write `config.run`'s model quantized with `config.scheme` to `config.output` with its tokenizer and
    report.json (the source's report and a "quantize" entry); return that report."""
    version = require_llmcompressor()
    source, report, folder = pruning_run(config.run, config.output, "quantize")
    with OutputDirectory(folder, config.overwrite) as output:
        model, tokenizer = _load(source)
        check_groups(model, config.scheme)
        zeros = zero_masks(model)
        quantize_model(model, config.scheme)
        with warnings.catch_warnings():  # llm-compressor's own modules count as offloaded while it saves
            warnings.filterwarnings("ignore", message="Attempting to save a model with offloaded modules")
            model.save_pretrained(output.staging, save_compressed=True)
        tokenizer.save_pretrained(output.staging)
        if (source / "compact_modeling.py").is_file():  # a DeciLM export's modeling code (trust_remote_code=True)
            shutil.copyfile(source / "compact_modeling.py", output.staging / "compact_modeling.py")
        layers, count = check_zeros(zeros, saved_weights(output.staging, model))
        report["quantize"] = {"scheme": config.scheme, "format": scheme_format(model), "source": str(source),
                              "ignore": list(IGNORE), "layers": layers, "zeros_kept": count,
                              "bytes_before": weight_bytes(source),
                              "bytes_after": weight_bytes(output.staging),
                              "llmcompressor": version}
        write_json(output.staging / COMPLETE_MARKER, report)
        output.commit()
    return report

