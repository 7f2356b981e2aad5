"""The one exception type for bad input; the CLI prints its message as one line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class SurgeonError(Exception):
    """A problem with the user's input or environment, with a message that names it."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def require_finite(tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise naming the first of `tensors` (by their descriptions) that holds a NaN or an infinity."""
    for what, tensor in tensors.items():
        if not tensor.isfinite().all():
            raise SurgeonError(f"NaN or infinity in {what}; check the model's dtype and data")
