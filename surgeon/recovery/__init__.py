"""Recovery after pruning: the pruned model trained to match the dense model's next-token distributions, every
weight pruning removed kept exactly zero."""

from __future__ import annotations

from dataclasses import dataclass

from surgeon.errors import SurgeonError

LOSSES = ("kl", "next-token")  # to the dense model's next-token distributions, or to the text's next tokens
MIXED_PRECISION = ("no", "bf16")  # the forward passes in the models' dtype, or in bfloat16 under autocast


@dataclass(frozen=True)
class Distill:
    """Settings of one recovery: AdamW's peak learning rate `lr` (warmed up linearly over the first `warmup` of
    the steps, then decayed on a cosine to zero; `surgeon recover`'s default is `RecoverConfig.lr`), `weight_decay`,
    `batch_size` windows per step, the seed that orders the windows and draws the adapters, the `loss` ("kl" to the
    teacher, or "next-token" on the text), `hidden_weight` (with "kl": this times `hidden_loss` of the decoder
    blocks' outputs added to the objective), `lora_rank` (0: the weights train; else peft adapters of that rank,
    merged at the end) and `teacher_top_k` (0: the teacher runs beside the student; else its K most likely next
    tokens per position are computed first, and the KL is taken over them and the rest of the vocabulary as one
    outcome, so that the teacher need not be held while the student trains), and `mixed_precision` ("bf16": both
    models' forward passes run in bfloat16 under `torch.autocast`, accelerate's `--mixed_precision bf16`, while the
    weights, their gradients and AdamW's moments keep the models' dtype; "no": all in that dtype)."""

    lr: float
    warmup: float = 0.1
    weight_decay: float = 0.0
    batch_size: int = 1
    seed: int = 0
    loss: str = "kl"
    hidden_weight: float = 0.0
    lora_rank: int = 0
    teacher_top_k: int = 0
    mixed_precision: str = "no"

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise SurgeonError(f"lr={self.lr}: must be positive")
        if self.loss not in LOSSES:
            raise SurgeonError(f"loss={self.loss!r}: choose one of {', '.join(LOSSES)}")
        if self.hidden_weight < 0 or (self.hidden_weight and self.loss != "kl"):
            raise SurgeonError(f"hidden_weight={self.hidden_weight}: must be >= 0, and is a weight beside the KL loss")
        if self.mixed_precision not in MIXED_PRECISION:
            raise SurgeonError(f"mixed_precision={self.mixed_precision!r}: choose one of {', '.join(MIXED_PRECISION)}")
        if self.lora_rank < 0:
            raise SurgeonError(f"lora_rank={self.lora_rank}: must be 0 (the weights train) or a rank")
        if self.teacher_top_k < 0 or (self.teacher_top_k and (self.loss != "kl" or self.hidden_weight)):
            raise SurgeonError(f"teacher_top_k={self.teacher_top_k}: must be >= 0, and caches the teacher's "
                               "next-token distributions for the KL loss without the hidden-state term")
