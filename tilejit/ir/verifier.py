"""Structural checks run after the frontend and between passes.

Every op gets the generic checks (operands defined before use; its attribute class is checked when the op is
built) and the structural rule its kind declares in the op table (``ops.OpKind``). A failure here is a compiler
bug, not a user error: it raises :class:`IRVerificationError` naming the op, its source location and the
printed IR, so a pass that broke an invariant is caught where it did so.
"""
from __future__ import annotations

from .core import Block, Function, Op


class IRVerificationError(AssertionError):
    pass


def verify(fn: Function) -> None:
    defined: set[int] = {p.value.id for p in fn.params if p.value is not None}
    _verify_block(fn, fn.body, defined)


def _verify_block(fn: Function, block: Block, defined: set[int]) -> None:
    scope = set(defined)
    scope.update(a.id for a in block.args)
    for op in block.ops:
        for v in op.operands:
            if v.id not in scope:
                _fail(fn, op, f"operand {v!r} is used before it is defined")
        problem = op.kind.verify(op)  # the kind's rule, declared with it in ops.py
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
