"""The one step that checks a run's settings against the model and the number of ranks sharing it.

`prune` runs it before its first shot; the CLI and `surgeon plan` run it on the model's meta skeleton
before any weight loads (`check_skeleton`). What cannot run is refused in one line naming it.
"""

from __future__ import annotations

from torch import nn

from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError
from surgeon.models.adapter import check_prunable, decoder_blocks, prunable_layers
from surgeon.models.experts import experts_as_layers
from surgeon.scale.block_groups import groups_limit


def check_settings(model: nn.Module, config: PruneConfig, world: int) -> list[list[tuple[str, nn.Linear]]]:
    """Refuse what `config` cannot run on `model` (its fused experts split into layers,
    `experts.experts_as_layers`) over `world` ranks, its weight matrices already checked (`check_prunable`); per
    decoder block, the layers it prunes."""
    blocks = prunable_layers(model, config.leave_out_parts)
    if not any(blocks):
        raise SurgeonError(f"leave_out {config.leave_out!r} leaves no layer of the decoder blocks to prune")
    if config.nm:
        for name, module in (pair for block in blocks for pair in block):
            if module.in_features % config.nm[1]:
                raise SurgeonError(f"{config.structure}: M={config.nm[1]} does not divide the "
                                   f"{module.in_features} columns of {name}")
    if config.spec.layer_rule is not None and config.nm and config.shot_count != 1:
        raise SurgeonError(f"{config.method} prunes N:M in one shot; use --shots 1")
    limit = groups_limit(len(blocks), world, config.curvature_split)
    if config.block_groups > limit:
        raise SurgeonError(f"block_groups={config.block_groups}: more groups than the {limit} decoder blocks "
                           f"{'each rank' if limit < len(blocks) else 'the model'} accumulates factors of")
    if world > 1 and config.lora_steps:
        raise SurgeonError("lora_steps run in one process; launch without torchrun")
    return blocks


def check_skeleton(skeleton: nn.Module, config: PruneConfig, world: int) -> None:
    """`check_prunable` and `check_settings` on a model built on the meta device from its configuration alone
    (no weights)."""
    check_prunable(skeleton, config.leave_out_parts)
    with experts_as_layers(decoder_blocks(skeleton)):
        check_settings(skeleton, config, world)
