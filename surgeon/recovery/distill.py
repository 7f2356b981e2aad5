"""Distillation from the dense model (teacher) into the pruned one (student), what pruning decided kept exactly.

The loss is the KL divergence KL(p_teacher ‖ p_student) of the next-token distributions, averaged over tokens: no
data labels, so the student approaches the teacher rather than the text (the next-token loss on the text is the
alternative). The decoder blocks train, which pruning changed; the embeddings, the head and the final norm keep the
dense model's values (AdamW would move each rare token's row by about the learning rate per step on gradients that
are mostly rounding noise). Every parameter of the decoder blocks that pruning left with exact zeros keeps those
zeros: their gradients are masked before each step (so AdamW's moments for them stay zero and its update is exactly
zero) and the parameter is masked again after it. So unstructured and N:M zeros stay zero, every N:M group stays
N:M, and removed rows, columns, neurons and heads stay removed: a compact export after recovery is as small as before.

With `lora_rank`, low-rank adapters (peft) on the decoder blocks' linear layers train instead of the weights. An
adapter's rows for a layer's removed output rows and its columns for removed input columns are held at zero, so the
product BA is zero wherever a whole row or column was removed; after training the adapters are merged and every
pruned zero is put back (the unstructured and N:M positions, where BA is dense, lose that part of the update).

Under torchrun the student and the teacher are sharded with FSDP2 (`surgeon.scale.distributed.shard_model`) and
each rank takes an equal share of every batch: FSDP2 averages the gradients, so the step is the one-process step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from surgeon.errors import SurgeonError
from surgeon.models.adapter import decoder_blocks
from surgeon.pruning.report import bar
from surgeon.recovery import Distill


@dataclass
class DistillReport:
    """What a recovery did: `losses` (the mean loss per step), `tokens` trained on, `seconds`, `masked` (parameters
    whose zeros were kept) and `kept_zeros` (how many zeros they hold, the same before and after)."""

    losses: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    masked: int = 0
    kept_zeros: int = 0


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a parameter or gradient sharded by FSDP2, else the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def pruned_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """Per parameter of the decoder blocks that holds exact zeros (on this rank, when sharded), by qualified name,
    where it is nonzero: what pruning kept (a weight or bias that is exactly zero was removed, or stays zero)."""
    names = {id(param): name for name, param in model.named_parameters()}
    masks = {}
    for param in decoder_blocks(model).parameters():
        zeros = _local(param.detach()) == 0
        if bool(zeros.any()):
            masks[names[id(param)]] = ~zeros
    return masks


def _rate(step: int, steps: int, warmup: float) -> float:
    """The learning rate's factor at `step` (0-based) of `steps`: linear warm-up, then a cosine to zero."""
    ramp = max(1, round(warmup * steps))
    if step < ramp:
        return (step + 1) / ramp
    return 0.5 * (1 + math.cos(math.pi * (step - ramp) / max(1, steps - ramp)))


def forward_precision(settings: Distill, device: torch.device) -> AbstractContextManager[Any]:
    """The forward passes' precision: bfloat16 autocast where `settings.mixed_precision` is "bf16" (the weights and
    the optimizer keep their dtype; the losses promote the logits to float32), else the models' own dtype."""
    return torch.autocast(device.type, torch.bfloat16, enabled=settings.mixed_precision == "bf16")


def kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher ‖ p_student) of the next-token distributions, summed over the vocabulary, averaged over tokens
    (float32 at least)."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    student = F.log_softmax(student_logits.to(dtype), dim=-1).flatten(0, -2)
    teacher = F.log_softmax(teacher_logits.to(dtype), dim=-1).flatten(0, -2)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


def top_k_targets(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's `k` largest next-token log-probabilities [..., k] (float32 at least), their tokens (int32) and
    the log of the probability of every other token [...]: what `top_k_kl` reads in place of its logits."""
    log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    values, indices = log_probs.topk(min(k, logits.shape[-1]), dim=-1)
    rest = log_probs.scatter(-1, indices, float("-inf")).logsumexp(-1)
    return values, indices.to(torch.int32), rest


def top_k_kl(student_logits: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
             rest: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher ‖ p_student) over the teacher's top-k tokens and the rest of the vocabulary as one outcome
    (`top_k_targets`), averaged over tokens: the full KL where k is the vocabulary, never more than it otherwise."""
    student = F.log_softmax(student_logits.to(torch.promote_types(student_logits.dtype, torch.float32)), dim=-1)
    indices = indices.long()
    top = (values.exp() * (values - student.gather(-1, indices))).sum(-1)
    student_rest = student.scatter(-1, indices, float("-inf")).logsumexp(-1)
    tail = torch.where(rest > float("-inf"), rest.exp() * (rest - student_rest), torch.zeros_like(rest))
    return (top + tail).mean()


Targets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # `top_k_targets` of one batch (this rank's share)


def training_batches(windows: torch.Tensor, settings: Distill) -> tuple[torch.Tensor, ...]:
    """The batches of `settings.batch_size` training windows, in the order drawn with `settings.seed`."""
    order = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(settings.seed))
    return tuple(windows[order].split(settings.batch_size))


def _share(batch: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """This rank's equal share of `batch`'s windows (all of them in one process)."""
    if group is None:
        return batch
    share = batch.shape[0] // dist.get_world_size(group)
    rank = dist.get_rank(group)
    return batch[rank * share:(rank + 1) * share]


@torch.no_grad()
def teacher_targets(teacher: nn.Module, windows: torch.Tensor, settings: Distill,
                    group: dist.ProcessGroup | None = None, progress: bool = True) -> list[Targets]:
    """The teacher's `settings.teacher_top_k` targets (`top_k_targets`) for this rank's share of every training
    batch, in host memory, so that the student trains without the teacher (`Distillation`'s `targets`)."""
    device = next(teacher.parameters()).device
    teacher.eval()
    targets = []
    for batch in bar(training_batches(windows, settings), "teacher's top-k", progress):
        with forward_precision(settings, device):
            logits = teacher(input_ids=_share(batch, group).to(device), use_cache=False).logits
        values, indices, rest = top_k_targets(logits, settings.teacher_top_k)
        targets.append((values.cpu(), indices.cpu(), rest.cpu()))
    return targets


def hidden_loss(student_states: tuple[torch.Tensor, ...], teacher_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The mean over layers of the student's squared error to the teacher's hidden states, relative to the teacher's:
    Σ‖h_s − h_t‖² / Σ‖h_t‖² per layer (float32 at least)."""
    errors = []
    for student, teacher in zip(student_states, teacher_states, strict=True):
        dtype = torch.promote_types(student.dtype, torch.float32)
        reference = teacher.to(dtype)
        errors.append((student.to(dtype) - reference).pow(2).sum() / reference.pow(2).sum().clamp_min(1e-30))
    return torch.stack(errors).mean()


def _adapter_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """Per adapter matrix of a peft model, the rows of B (outputs) and columns of A (inputs) its layer kept: zero
    where the layer's whole output row or input column is zero, so that BA adds nothing there."""
    masks = {}
    for name, module in model.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "lora_A") and "default" in module.lora_A:
            weight = module.base_layer.weight.detach()
            rows, columns = (weight != 0).any(dim=1, keepdim=True), (weight != 0).any(dim=0, keepdim=True)
            if not bool(rows.all()):
                masks[f"{name}.lora_B.default.weight"] = rows
            if not bool(columns.all()):
                masks[f"{name}.lora_A.default.weight"] = columns
    return masks


def _with_adapters(model: nn.Module, rank: int, seed: int) -> nn.Module:
    """`model` with peft LoRA adapters of `rank` on its decoder blocks' linear layers (drawn with `seed`), only they
    trainable."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise SurgeonError("LoRA recovery (--lora-rank) needs the `peft` package: pip install peft") from error
    inside = {id(module) for module in decoder_blocks(model).modules()}
    targets = [name for name, module in model.named_modules() if isinstance(module, nn.Linear) and id(module) in inside]
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        wrapped: nn.Module = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                                              target_modules=targets))
    return wrapped


class Distillation:
    """One recovery run over `windows` [n, seqlen] (one pass, `settings.batch_size` windows a step, in an order
    drawn with `settings.seed`): `run` trains `student` in place toward `teacher` (unused with the next-token loss),
    its pruned zeros kept; `state`/`restore` save and continue it after any step. With a process `group` (torchrun,
    both models sharded by FSDP2) each rank trains on its share of every batch."""

    def __init__(self, student: nn.Module, teacher: nn.Module | None, windows: torch.Tensor, settings: Distill,
                 group: dist.ProcessGroup | None = None, targets: list[Targets] | None = None):
        if windows.dim() != 2 or windows.shape[0] < 1:
            raise SurgeonError(f"training windows must have shape [n, seqlen] with n >= 1, not {list(windows.shape)}")
        self.world = 1 if group is None else dist.get_world_size(group)
        if settings.batch_size % self.world:
            raise SurgeonError(f"batch size {settings.batch_size} does not split over {self.world} ranks: give a "
                               "multiple of the number of ranks")
        if settings.loss == "kl" and teacher is None and targets is None:
            raise SurgeonError("the KL loss needs the dense model (teacher), or its top-k targets")
        if targets is not None and not settings.teacher_top_k:
            raise SurgeonError("the teacher's top-k targets are read with teacher_top_k set")
        if settings.teacher_top_k and targets is None:
            assert teacher is not None
            targets = teacher_targets(teacher, windows, settings, group, progress=False)
        if settings.lora_rank and group is not None:
            raise SurgeonError("LoRA recovery runs in one process: launch it without torchrun")
        self.student, self.settings, self.group = student, settings, group
        self.teacher: nn.Module | None = None if settings.teacher_top_k else teacher
        self.targets: list[Targets] | None = targets if settings.teacher_top_k else None
        self.masks = pruned_masks(student)
        zeros = sum(int((~mask).sum()) for mask in self.masks.values())
        self.report = DistillReport(masked=len(self.masks), kept_zeros=zeros)
        if group is not None:
            self._sum_counts()
        self.flags = {name: param.requires_grad for name, param in student.named_parameters()}
        blocks = {id(param) for param in decoder_blocks(student).parameters()}
        for param in student.parameters():  # what pruning changed trains; the embeddings and the head stay
            param.requires_grad_(id(param) in blocks)
        self.trained = _with_adapters(student, settings.lora_rank, settings.seed) if settings.lora_rank else student
        self.train_masks = _adapter_masks(self.trained) if settings.lora_rank else self.masks
        self.params = dict(self.trained.named_parameters())
        with torch.no_grad():
            for name, mask in self.train_masks.items():
                _local(self.params[name].data).mul_(mask)
        self.optimizer = torch.optim.AdamW([p for p in self.trained.parameters() if p.requires_grad], lr=settings.lr,
                                           weight_decay=settings.weight_decay)
        self.batches = training_batches(windows, settings)
        steps = len(self.batches)
        if targets is not None and len(targets) != steps:
            raise SurgeonError(f"{len(targets)} batches of the teacher's targets for {steps} training batches")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           lambda step: _rate(step, steps, settings.warmup))
        self.step = 0

    def _sum_counts(self) -> None:
        """The masked parameters and kept zeros over all ranks' shards."""
        counts = torch.tensor([self.report.kept_zeros])
        dist.all_reduce(counts, group=self.group)
        flags = torch.tensor([name in self.masks for name, _ in self.student.named_parameters()], dtype=torch.int64)
        dist.all_reduce(flags, group=self.group)
        self.report.kept_zeros, self.report.masked = int(counts[0]), int((flags > 0).sum())

    def _loss(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of `batch` (the step's) objective, and of its mean loss (KL or next-token; the objective
        without the hidden-state term, which the runs' reports compare)."""
        device = next(self.student.parameters()).device
        with forward_precision(self.settings, device):
            return self._forward(_share(batch, self.group).to(device))

    def _forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`_loss` on this rank's token ids, in the forward passes' precision."""
        if self.settings.loss == "next-token":
            loss: torch.Tensor = self.trained(input_ids=ids, labels=ids, use_cache=False).loss
            return loss, loss
        if self.targets is not None:
            values, indices, rest = (t.to(ids.device) for t in self.targets[self.step])
            loss = top_k_kl(self.trained(input_ids=ids, use_cache=False).logits, values, indices, rest)
            return loss, loss
        assert self.teacher is not None
        hidden = self.settings.hidden_weight > 0
        with torch.no_grad():
            target = self.teacher(input_ids=ids, use_cache=False, output_hidden_states=hidden)
        output = self.trained(input_ids=ids, use_cache=False, output_hidden_states=hidden)
        loss = kl_loss(output.logits, target.logits)
        if not hidden:
            return loss, loss
        # hidden_states[0] is the embedding's output, which does not train
        states = hidden_loss(output.hidden_states[1:], target.hidden_states[1:])
        return loss + self.settings.hidden_weight * states, loss

    def _masked(self, grads: bool) -> None:
        """Zero the gradients (`grads`) or the parameters wherever pruning removed a weight."""
        with torch.no_grad():
            for name, mask in self.train_masks.items():
                param = self.params[name]
                target = param.grad if grads else param.data
                if target is not None:
                    _local(target).mul_(mask)

    @contextmanager
    def _training(self) -> Iterator[None]:
        """The student in training mode, the teacher in eval mode, for the duration."""
        was_training = self.student.training
        if self.teacher is not None:
            self.teacher.eval()
        self.trained.train()
        try:
            yield
        finally:
            self.trained.train(was_training)

    def run(self, progress: bool = True, after_step: Callable[[DistillReport], None] | None = None) -> DistillReport:
        """Train on the batches after the last one done; `after_step` is called with the report so far after every
        step (to checkpoint, or to evaluate a curve). With adapters, they are merged at the end and the zeros put
        back; returns the report."""
        start = time.perf_counter() - self.report.seconds
        with self._training():
            for batch in bar(self.batches[self.step:], "recovery", progress):
                objective, loss = self._loss(batch)
                self.optimizer.zero_grad(set_to_none=True)
                objective.backward()
                self._masked(grads=True)
                self.optimizer.step()
                self.scheduler.step()
                self._masked(grads=False)
                value = loss.detach()
                if self.group is not None:
                    dist.all_reduce(value, group=self.group)
                    value /= self.world
                self.step += 1
                self.report.losses.append(float(value))
                self.report.tokens += batch.numel()
                self.report.seconds = time.perf_counter() - start
                if after_step is not None:
                    after_step(self.report)
        if self.settings.lora_rank:
            self.trained.merge_and_unload()  # type: ignore[operator]
            self.trained = self.student
            params = dict(self.student.named_parameters())
            with torch.no_grad():
                for name, mask in self.masks.items():
                    params[name].mul_(mask)
        for name, param in self.student.named_parameters():
            param.requires_grad_(self.flags[name])
        return self.report

    def state(self) -> dict[str, Any]:
        """What continuing after the last step needs: the trained parameters, the optimizer's and the schedule's
        state, the step and the report (under torchrun, this rank's shards: a run continues on as many ranks)."""
        moments = self.optimizer.state_dict()
        moments["state"] = {index: {key: _local(value) for key, value in values.items()}
                            for index, values in moments["state"].items()}
        return {"model": {key: _local(value) for key, value in self.trained.state_dict().items()},
                "optimizer": moments, "scheduler": self.scheduler.state_dict(), "step": self.step,
                "report": asdict(self.report)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a `state` (under torchrun, this rank's)."""
        with torch.no_grad():
            for key, value in self.trained.state_dict().items():
                _local(value).copy_(state["model"][key])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if isinstance(param, DTensor):  # the moments back as shards of the parameter they belong to
                    moments = self.optimizer.state[param]
                    for key, value in moments.items():
                        if value.shape == param.to_local().shape and value.dim():
                            moments[key] = DTensor.from_local(value, param.device_mesh, param.placements)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.report = DistillReport(**state["report"])


def distill(student: nn.Module, teacher: nn.Module | None, windows: torch.Tensor, settings: Distill,
            progress: bool = True, after_step: Callable[[DistillReport], None] | None = None) -> DistillReport:
    """Train `student` in place on `windows` [n, seqlen] toward `teacher`'s next-token distributions, its pruned
    zeros kept (`Distillation`, in one process, from the first step)."""
    return Distillation(student, teacher, windows, settings).run(progress, after_step)
