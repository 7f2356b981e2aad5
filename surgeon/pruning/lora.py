"""Interleaved low-rank first-order corrections (paper sec. 3.6).

Between shots, LoRA adapters (via `peft`) on every prunable layer are trained for a few steps on
the calibration windows with the language-modelling loss, merged into the weights, and the
pruning masks are re-applied so removed weights stay exactly zero.
"""

from __future__ import annotations

import torch
from torch import nn

from surgeon.errors import SurgeonError
from surgeon.models.layer import Layer
from surgeon.pruning.phases import Lora
from surgeon.pruning.report import bar


def lora_correction(model: nn.Module, layers: list[Layer], calibration: torch.Tensor, settings: Lora,
                    desc: str | None = None) -> float:
    """Train LoRA adapters for `settings.steps` steps, merge them, re-apply masks; return the last loss. With `desc`,
    a progress bar of the steps so named."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise SurgeonError("interleaved LoRA (--lora-steps) needs the `peft` package: pip install peft") from error
    lora = LoraConfig(r=settings.rank, lora_alpha=2 * settings.rank, lora_dropout=0.0,
                      target_modules=[layer.name for layer in layers])
    flags = [(p, p.requires_grad) for p in model.parameters()]
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(settings.seed)  # the adapters' initial values, from the run's seed, not the global state
        peft_model = get_peft_model(model, lora)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed)
    loss = torch.tensor(float("nan"))
    was_training = model.training
    peft_model.train()
    for _ in bar(range(settings.steps), desc, desc is not None):
        index = torch.randint(0, calibration.shape[0], (settings.batch_size,), generator=generator)
        batch = calibration[index].to(device)
        loss = peft_model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    peft_model.merge_and_unload()
    model.train(was_training)
    for p, flag in flags:
        p.requires_grad_(flag)
    with torch.no_grad():
        for layer in layers:
            layer.store(layer.weight())
    return float(loss.detach())
