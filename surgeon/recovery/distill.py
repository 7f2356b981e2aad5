"""Distillation from the dense model (teacher) into the pruned one (student), what pruning decided kept exactly.

The loss is the KL divergence KL(p_teacher ‖ p_student) of the next-token distributions, averaged over tokens: no
data labels, so the student approaches the teacher rather than the text. Every parameter of the decoder blocks that
pruning left with exact zeros keeps those zeros: their gradients are masked before each step (so AdamW's moments
for them stay zero and its update is exactly zero) and the parameter is masked again after it. So unstructured and
N:M zeros stay zero, every N:M group stays N:M, and removed rows, columns, neurons and heads stay removed: a compact
export after recovery is as small as before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from surgeon.errors import SurgeonError
from surgeon.models.adapter import decoder_blocks
from surgeon.pruning.report import bar


@dataclass(frozen=True)
class Distill:
    """Settings of one recovery: AdamW's peak learning rate `lr` (warmed up linearly over the first `warmup` of
    the steps, then decayed on a cosine to zero), `weight_decay`, `batch_size` windows per step, the seed that
    orders the windows."""

    lr: float = 1e-4
    warmup: float = 0.1
    weight_decay: float = 0.0
    batch_size: int = 1
    seed: int = 0


@dataclass
class DistillReport:
    """What a recovery did: `losses` (the mean KL per step), `tokens` trained on, `seconds`, `masked` (parameters
    whose zeros were kept) and `kept_zeros` (how many zeros they hold, the same before and after)."""

    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    masked: int = 0
    kept_zeros: int = 0


def pruned_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """Per parameter of the decoder blocks that holds exact zeros, by qualified name, where it is nonzero: what
    pruning kept (a weight or bias that is exactly zero was removed, or stays zero)."""
    names = {id(param): name for name, param in model.named_parameters()}
    masks = {}
    for param in decoder_blocks(model).parameters():
        zeros = param.detach() == 0
        if bool(zeros.any()):
            masks[names[id(param)]] = ~zeros
    return masks


def _rate(step: int, steps: int, warmup: float) -> float:
    """The learning rate's factor at `step` (0-based) of `steps`: linear warm-up, then a cosine to zero."""
    ramp = max(1, round(warmup * steps))
    if step < ramp:
        return (step + 1) / ramp
    return 0.5 * (1 + math.cos(math.pi * (step - ramp) / max(1, steps - ramp)))


def kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher ‖ p_student) of the next-token distributions, summed over the vocabulary, averaged over tokens
    (float32 at least)."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    student = F.log_softmax(student_logits.to(dtype), dim=-1).flatten(0, -2)
    teacher = F.log_softmax(teacher_logits.to(dtype), dim=-1).flatten(0, -2)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


def distill(student: nn.Module, teacher: nn.Module, windows: torch.Tensor, settings: Distill,
            progress: bool = True, after_step: Callable[[DistillReport], None] | None = None) -> DistillReport:
    """Train `student` in place on `windows` [n, seqlen] (one pass, `settings.batch_size` windows a step, in an
    order drawn with `settings.seed`) toward `teacher`'s next-token distributions, its pruned zeros kept;
    `after_step` is called with the report so far after every step (e.g. to evaluate a curve)."""
    if windows.dim() != 2 or windows.shape[0] < 1:
        raise SurgeonError(f"training windows must have shape [n, seqlen] with n >= 1, not {list(windows.shape)}")
    masks = pruned_masks(student)
    params = dict(student.named_parameters())
    zeros = sum(int((~mask).sum()) for mask in masks.values())
    device = next(student.parameters()).device
    trained = [param for param in student.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=settings.lr, weight_decay=settings.weight_decay)
    order = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(settings.seed))
    batches = windows[order].split(settings.batch_size)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _rate(step, len(batches), settings.warmup))
    report = DistillReport(masked=len(masks), kept_zeros=zeros)
    was_training = student.training
    teacher.eval()
    student.train()
    start = time.perf_counter()
    try:
        for batch in bar(batches, "recovery", progress):
            batch = batch.to(device)
            with torch.no_grad():
                target = teacher(input_ids=batch, use_cache=False).logits
            loss = kl_loss(student(input_ids=batch, use_cache=False).logits, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            with torch.no_grad():
                for name, mask in masks.items():
                    grad = params[name].grad
                    if grad is not None:
                        grad.mul_(mask)
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                for name, mask in masks.items():
                    params[name].mul_(mask)
            report.losses.append(float(loss.detach()))
            report.tokens += batch.numel()
            if after_step is not None:
                after_step(report)
    finally:
        student.train(was_training)
    report.seconds = time.perf_counter() - start
    return report
