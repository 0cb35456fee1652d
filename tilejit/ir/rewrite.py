"""Small utilities passes use to edit the IR in place."""
from __future__ import annotations

from collections import Counter
from typing import Iterator

from .core import Block, Function, Op, Value
from .ops import OpKind


def use_counts(scope: Function | Block) -> Counter:
    """How many operands name each value (by id), over every op of ``scope`` and its nested regions."""
    counts: Counter = Counter()
    for op in scope.walk():
        counts.update(v.id for v in op.operands)
    return counts


def reads(op: Op, value: Value) -> bool:
    """Whether ``op``, or an op nested in its regions, takes ``value`` as an operand."""
    return any(v is value for x in (op, *(y for r in op.regions for y in r.walk())) for v in x.operands)


def replace_uses(fn: Function, old: Value, new: Value) -> None:
    for op in fn.walk():
        op.operands = [new if v is old else v for v in op.operands]


def blocks(block: Block) -> Iterator[Block]:
    """``block`` and every block nested in it."""
    yield block
    for op in block.ops:
        for region in op.regions:
            yield from blocks(region)


def clone_op(op: Op, mapping: dict[int, Value]) -> Op:
    """A copy of ``op`` and of the ops nested in its regions, with fresh results (named and promised as the
    originals); operands are looked up in ``mapping`` (value id -> value), which the copy's own values join."""
    regions = []
    for region in op.regions:
        args = [_fresh_like(a) for a in region.args]
        mapping.update((a.id, b) for a, b in zip(region.args, args))
        block = Block(args)
        block.ops = [clone_op(inner, mapping) for inner in region.ops]
        regions.append(block)
    copy = Op(op.kind, [mapping.get(v.id, v) for v in op.operands], [r.type for r in op.results], op.attrs, regions,
              op.loc)
    for old, new in zip(op.results, copy.results):
        new.name, new.multiple_of = old.name, old.multiple_of
        mapping[old.id] = new
    return copy


def _fresh_like(v: Value) -> Value:
    fresh = Value(v.type, v.name)
    fresh.multiple_of = v.multiple_of
    return fresh


def defining_op(v: Value) -> Op | None:
    return v.owner if isinstance(v.owner, Op) else None


def int_constant(v: Value) -> int | None:
    """The value of ``v`` when it is an integer constant (not a bool), else None."""
    op = defining_op(v)
    if op is not None and op.kind is OpKind.CONSTANT and type(op.attrs.value) is int:
        return op.attrs.value
    return None


def is_zero(v: Value) -> bool:
    """Whether ``v`` is the constant 0, or a tile splat of it (``T.zeros``)."""
    op = defining_op(v)
    if op is not None and op.kind is OpKind.SPLAT:
        op = defining_op(op.operands[0])
    return op is not None and op.kind is OpKind.CONSTANT and op.attrs.value == 0
