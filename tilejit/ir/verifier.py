"""Structural checks run after the frontend and between passes.

Every op gets the generic checks (operands defined before use; its attribute class is checked when the op is
built; a promise on a value it defines (``MultipleOf``) fits the value) and the structural rule its kind declares
in the op table (``ops.OpKind``). A failure here is a compiler bug, not a user error: it raises
:class:`IRVerificationError` naming the op, its source location and the printed IR, so a pass that broke an
invariant is caught where it did so.
"""
from __future__ import annotations

from .core import Block, Function, Op, Value
from .types import ScalarType, TileType


class IRVerificationError(AssertionError):
    pass


def verify(fn: Function) -> None:
    defined: set[int] = {p.value.id for p in fn.params if p.value is not None}
    for p in fn.params:
        if p.value is not None and _promise_problem(p.value):
            raise IRVerificationError(f"invalid IR in {fn.name}: parameter {p.name}: {_promise_problem(p.value)}")
    _verify_block(fn, fn.body, defined)


def _promise_problem(v: Value) -> str | None:
    """What is wrong with ``v``'s promise, if it has one: it needs an integer scalar (one divisor) or an
    integer tile (one divisor per dim)."""
    if v.multiple_of is None:
        return None
    n = len(v.multiple_of.divisors)
    if isinstance(v.type, ScalarType) and v.dtype.is_integer and n == 1:
        return None
    if isinstance(v.type, TileType) and v.dtype.is_integer and n == v.type.rank:
        return None
    return f"a promise of {n} divisor(s) on {v!r}"


def _verify_block(fn: Function, block: Block, defined: set[int]) -> None:
    scope = set(defined)
    scope.update(a.id for a in block.args)
    for op in block.ops:
        for v in op.operands:
            if v.id not in scope:
                _fail(fn, op, f"operand {v!r} is used before it is defined")
        problem = op.kind.verify(op)  # the kind's rule, declared with it in ops.py
        for v in [*op.results, *(a for region in op.regions for a in region.args)]:
            problem = problem or _promise_problem(v)
        if problem:
            _fail(fn, op, problem)
        for region in op.regions:
            _verify_block(fn, region, scope)
        scope.update(r.id for r in op.results)


def _fail(fn: Function, op: Op, problem: str) -> None:
    from .printer import print_function

    where = f" at {op.loc}" if op.loc else ""
    raise IRVerificationError(f"invalid IR in {fn.name}: tj.{op.kind.mnemonic}{where}: {problem}\n"
                              f"{print_function(fn)}")
