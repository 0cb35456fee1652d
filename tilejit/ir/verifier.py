"""Structural checks run after the frontend and between passes.

A failure here is a compiler bug, not a user error: it raises :class:`IRVerificationError` naming the op,
its source location and the printed IR, so a pass that broke an invariant is caught where it did so.
"""
from __future__ import annotations

from typing import Callable

from .core import Block, Function, Op, Value
from .ops import OpKind
from .types import ScalarType, TensorType, TileType


class IRVerificationError(AssertionError):
    pass


def _shape(v: Value):
    return v.type.shape if isinstance(v.type, TileType) else ()


_RULES: dict[OpKind, Callable[[Op], str | None]] = {}


def rule(*kinds: OpKind):
    def register(fn):
        for k in kinds:
            _RULES[k] = fn
        return fn
    return register


@rule(OpKind.BINARY, OpKind.COMPARE, OpKind.SELECT)
def _elementwise(op: Op) -> str | None:
    shapes = {_shape(v) for v in op.operands}
    if len(shapes) != 1:
        return f"operands of different shapes {sorted(shapes)}"
    if _shape(op.result) != shapes.pop():
        return "result shape differs from operands"
    if op.kind is OpKind.BINARY and len({v.dtype for v in op.operands}) != 1:
        return "operands of different dtypes"
    return None


@rule(OpKind.UNARY, OpKind.CAST, OpKind.CONVERT_LAYOUT)
def _unary(op: Op) -> str | None:
    if _shape(op.operands[0]) != _shape(op.result):
        return "result shape differs from operand"
    return None


@rule(OpKind.GEMM)
def _gemm(op: Op) -> str | None:
    a, b, acc = (v.type for v in op.operands)
    m, k = a.shape[::-1] if op.attrs.transpose_a else a.shape
    k2, n = b.shape[::-1] if op.attrs.transpose_b else b.shape
    if k != k2 or acc.shape != (m, n) or op.result.type.shape != (m, n):
        return f"gemm shapes {a.shape} x {b.shape} -> {acc.shape} do not agree"
    return None


@rule(OpKind.LOAD, OpKind.STORE)
def _access(op: Op) -> str | None:
    tensor = op.operands[0].type
    starts = op.operands[2:] if op.kind is OpKind.STORE else op.operands[1:]
    if not isinstance(tensor, TensorType):
        return "first operand is not a tensor"
    if len(starts) != tensor.rank or len(op.attrs.shape) != tensor.rank:
        return f"{len(starts)} start indices for a rank-{tensor.rank} tensor"
    if any(not isinstance(s.type, ScalarType) or not s.dtype.is_integer for s in starts):
        return "start indices must be integer scalars"
    tile = op.result.type if op.kind is OpKind.LOAD else op.operands[1].type
    if not isinstance(tile, TileType) or tile.shape != op.attrs.tile_shape:
        return f"tile {tile} does not match the window {op.attrs.tile_shape}"
    return None


@rule(OpKind.FOR)
def _for(op: Op) -> str | None:
    body = op.regions[0]
    inits = op.operands[3:]
    if len(body.args) != len(inits) + 1:
        return "body arguments do not match iter_args"
    term = body.terminator
    if term is None or len(term.operands) != len(inits):
        return "body must end in a yield of every carried value"
    for init, arg, res, y in zip(inits, body.args[1:], op.results, term.operands):
        if not (init.type == arg.type == res.type == y.type):
            return f"carried value types differ: {init.type}, {arg.type}, {res.type}, {y.type}"
    return None


@rule(OpKind.IF)
def _if(op: Op) -> str | None:
    for region in op.regions:
        term = region.terminator
        if op.results and (term is None or [v.type for v in term.operands] != [r.type for r in op.results]):
            return "each branch must yield one value per result, of the result's type"
    return None


@rule(OpKind.WHILE)
def _while(op: Op) -> str | None:
    cond, body = op.regions
    types = [v.type for v in op.operands]
    if [a.type for a in cond.args] != types or [a.type for a in body.args] != types:
        return "condition and body arguments must match the carried values"
    if cond.terminator is None or len(cond.terminator.operands) != 1 or \
            not isinstance(cond.terminator.operands[0].type, ScalarType):
        return "the condition region must yield one scalar"
    if body.terminator is None or [v.type for v in body.terminator.operands] != types:
        return "the body must yield every carried value, of its type"
    if any(isinstance(t, TileType) for t in types):
        return "a while loop carries scalars only"
    return None


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
        check = _RULES.get(op.kind)
        problem = check(op) if check else None
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
