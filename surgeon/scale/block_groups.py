"""Block groups: the decoder blocks split into groups, one curvature pass each (`PruneConfig.block_groups`);
`settings.check_settings` checks their number with the run's other settings."""

from __future__ import annotations


def group_edges(blocks: int, count: int) -> list[int]:
    """Where `count` groups of consecutive blocks, as even as they divide, start and end among `blocks`."""
    return [round(i * blocks / count) for i in range(count + 1)]


def groups_limit(blocks: int, ranks: int, split: str) -> int:
    """The most block groups a run can have: the decoder blocks each process accumulates factors of (split by
    blocks over several ranks, the fewest any rank owns)."""
    return blocks // ranks if split == "blocks" and ranks > 1 else blocks

