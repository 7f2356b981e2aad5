"""Block groups: the decoder blocks split into groups, one curvature pass each (`PruneConfig.block_groups`),
checked against the ranks that share the run."""

from __future__ import annotations

from surgeon.config import PruneConfig
from surgeon.errors import SurgeonError


def group_edges(blocks: int, count: int) -> list[int]:
    """Where `count` groups of consecutive blocks, as even as they divide, start and end among `blocks`."""
    return [round(i * blocks / count) for i in range(count + 1)]


def groups_limit(blocks: int, ranks: int, split: str) -> int:
    """The most block groups a run can have: the decoder blocks each process accumulates factors of (split by
    blocks over several ranks, the fewest any rank owns)."""
    return blocks // ranks if split == "blocks" and ranks > 1 else blocks


def check_block_groups(blocks: int, ranks: int, config: PruneConfig) -> None:
    """Refuse more block groups than `groups_limit` allows, the same way on every rank."""
    limit = groups_limit(blocks, ranks, config.curvature_split)
    if config.block_groups > limit:
        raise SurgeonError(f"block_groups={config.block_groups}: more groups than the {limit} decoder blocks "
                           f"{'each rank' if limit < blocks else 'the model'} accumulates factors of")
