"""Small utilities passes use to edit the IR in place."""
from __future__ import annotations

from collections import Counter
from typing import Iterator

from .core import Block, Function, Op, Value


def use_counts(fn: Function) -> Counter:
    counts: Counter = Counter()
    for op in fn.walk():
        counts.update(v.id for v in op.operands)
    return counts


def replace_uses(fn: Function, old: Value, new: Value) -> None:
    for op in fn.walk():
        op.operands = [new if v is old else v for v in op.operands]


def blocks(block: Block) -> Iterator[Block]:
    """``block`` and every block nested in it."""
    yield block
    for op in block.ops:
        for region in op.regions:
            yield from blocks(region)


def defining_op(v: Value) -> Op | None:
    return v.owner if isinstance(v.owner, Op) else None

