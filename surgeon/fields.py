"""`opt`, the field every command's settings are made of, and `check`, which holds settings to their fields' bounds.

A setting, its help, its choices and its least value stand in one place, the field: the CLI builds its options from
the fields, and each settings class's `__post_init__` calls `check` before its own checks across settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def opt(default: Any, help: str, choices: tuple[str, ...] | None = None, shown: str | None = None,
        least: float | None = None) -> Any:
    """A settings field with its CLI help; `shown` describes the default that `None` stands for; a value must be one
    of `choices`, and at least `least`, where given."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "shown": shown,
                                                        "least": least})


def check(settings: Any) -> None:
    """Raise ValueError naming the first field of `settings` (a dataclass of `opt` fields) that is not one of its
    choices or is below its least value; None, which stands for a default, passes."""
    for f in dataclasses.fields(settings):
        value, choices, least = getattr(settings, f.name), f.metadata.get("choices"), f.metadata.get("least")
        if value is None:
            continue
        if choices is not None and value not in choices:
            raise ValueError(f"{f.name}={value!r}: choose one of {', '.join(choices)}")
        if least is not None and value < least:
            raise ValueError(f"{f.name}={value}: must be at least {least:g}")
