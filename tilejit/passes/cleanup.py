"""Dead-code elimination: drops ops whose results nobody uses and that have no side effects.

Runs right after the frontend (which materialises every tensor extent and stride up front) and after
passes that leave dead values behind. A result that carries a promise (``T.multiple_of``) counts as used: a
promise about a tensor's extent or stride informs accesses that read the extent directly, not this value.
"""
from __future__ import annotations

from ..ir import Block, Function


def _has_effects(op) -> bool:
    """An op that writes memory has effects; a loop or ``if`` has them when something inside it does."""
    if op.kind.writes_memory:
        return True
    return any(_has_effects(inner) for region in op.regions for inner in region.ops)


def cleanup(fn: Function) -> None:
    while _sweep(fn.body, _live_uses(fn.body)):
        pass


def sweep_block(block: Block) -> None:
    """Drop the dead ops of ``block`` alone (a loop body, whose values are used only inside it)."""
    while _sweep(block, _live_uses(block)):
        pass


def _live_uses(block: Block) -> set[int]:
    used: set[int] = set()
    for op in block.walk():
        used.update(v.id for v in op.operands)
    return used


def _sweep(block: Block, used: set[int]) -> bool:
    changed = False
    kept = []
    for op in block.ops:
        for region in op.regions:
            changed |= _sweep(region, used)
        if (not op.kind.is_terminator and not _has_effects(op)
                and not any(r.id in used or r.multiple_of is not None for r in op.results)):
            changed = True
            continue
        kept.append(op)
    block.ops = kept
    return changed
