"""Every command's settings hold each field to its own choices and least value, naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from surgeon.app.settings import ExportConfig, QuantizeConfig, RecoverConfig, RunConfig
from surgeon.config import PruneConfig
from surgeon.scale.plan_config import PlanConfig

# the settings a class, or a field, needs beside it to be valid at all, so that a bad field is the only fault
VALID = {ExportConfig: {"compact": True}, "speed_context": {"structure": "coupled"}, "task_limit": {"tasks": "boolq"},
         "layer_deviation": {"structure": "unstructured"}}
BOUNDED = [(cls, f) for cls in (PruneConfig, RunConfig, RecoverConfig, PlanConfig, ExportConfig, QuantizeConfig)
           for f in dataclasses.fields(cls) if f.metadata.get("least") is not None or f.metadata.get("choices")]


@pytest.mark.parametrize("cls,field", BOUNDED, ids=[f"{cls.__name__}.{f.name}" for cls, f in BOUNDED])
def test_a_field_outside_its_bounds_is_refused_by_name(cls, field):
    least, choices = field.metadata.get("least"), field.metadata.get("choices")
    bad = least - 1 if least is not None else "none-of-these"
    with pytest.raises(ValueError, match=f"^{field.name}={bad!r}: " if choices else f"^{field.name}={bad}: "):
        cls(**VALID.get(cls, {}), **{field.name: bad})
    if least is not None:
        cls(**VALID.get(cls, {}), **VALID.get(field.name, {}), **{field.name: least})  # the least value is allowed


def test_every_bounded_class_is_checked():
    assert {cls for cls, _ in BOUNDED} == {PruneConfig, RunConfig, RecoverConfig, PlanConfig, ExportConfig,
                                           QuantizeConfig}
