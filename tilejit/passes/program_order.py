"""Longest programs first: a kernel whose loop runs more iterations the higher its program id along one axis (a
causal attention forward's key loop ends at its query block's diagonal: ``hi = min(S, m0 + BM)`` with ``m0 =
program_id(0) * BM``) runs its programs in the reverse order along that axis, so the longest start first and
the shortest fill the last wave (the longest-processing-time-first order ``tilejit.ops.fused_attention`` writes
by hand; measured on an H200, the obvious causal forward at S = 16k: ``benchmarks/RESULTS.md``).

The rewrite replaces every ``program_id(axis)`` by ``num_programs(axis) - 1 - program_id(axis)``: each program
computes what the program of the mirrored id computed before, so results are bit-identical and only the order in
which the hardware starts the programs changes. It applies when

* a loop of the kernel's top-level block has an upper bound that is non-decreasing in that program id, and grows
  with it somewhere, while its lower bound and step do not grow with it (``_trend`` follows integer adds,
  subtracts, products and floor divisions by constants, min, max and widening casts back to the program id;
  anything else that depends on it leaves the trend unknown), and no top-level loop's trip count falls with it;
* the kernel has no atomics and no ``while`` loops (programs that wait on each other, a semaphore or a lock, may
  rely on the order in which they start), and is not split-K, stream-K or clustered (their programs pair up by
  id).

The first axis (0, 1, 2) that qualifies is the one reversed. The ``longest_first`` launch option (on by default)
turns the pass off; ``fn.attrs["longest_first"]`` records the axis, and the printed IR shows the new ops.
"""
from __future__ import annotations

from ..ir import BinaryAttrs, BinaryOp, Builder, Block, ConstantAttrs, Function, Op, OpKind, Value
from ..ir.ops import AxisAttrs
from ..ir.rewrite import blocks, int_constant, replace_uses
from ..target import Target

#: A trend of a value in the program id: grows (non-decreasing, and depends on it), does not depend on it,
#: falls (non-increasing, and depends on it); None: depends on it some other way (or unknown).
GROWS, FLAT, FALLS = 1, 0, -1


def order_programs(fn: Function, target: Target) -> None:
    """Reverse the program order along the first axis whose program id lengthens a top-level loop (module
    docstring); off with ``longest_first=False``."""
    if not target.options.longest_first or fn.attrs.get("split_k", 1) > 1 or target.stream_k or target.cluster > 1:
        return
    ops = list(fn.walk())
    if any(op.kind in (OpKind.ATOMIC, OpKind.WHILE) for op in ops):
        return
    loops = [op for op in fn.body.ops if op.kind is OpKind.FOR]
    for axis in range(3):
        ids = [op for op in ops if op.kind is OpKind.PROGRAM_ID and op.attrs.axis == axis]
        if ids and loops and _lengthens(loops, {op.result.id for op in ids}):
            for op in ids:
                _mirror(fn, op, axis)
            fn.attrs["longest_first"] = axis
            return


def _lengthens(loops: list[Op], pid: set[int]) -> bool:
    """Whether some loop's trip count grows with the program id and none falls with it."""
    grows = False
    for loop in loops:
        lo, hi, step = (_trend(v, pid, {}) for v in loop.operands[:3])
        if None in (lo, hi) or step != FLAT:
            return False
        trip = _combine(hi, -lo)
        if trip is None or trip == FALLS:
            return False  # bounds that move together or apart, or the longest programs first already
        grows = grows or trip == GROWS
    return grows


def _combine(a: int | None, b: int | None) -> int | None:
    """The trend of a sum of two values of trends ``a`` and ``b``."""
    if a is None or b is None:
        return None
    if a == FLAT or b == FLAT or a == b:
        return a if b == FLAT else b
    return None


def _trend(v: Value, pid: set[int], seen: dict[int, int | None]) -> int | None:
    """How the integer ``v`` moves with the program id (``GROWS``, ``FLAT``, ``FALLS`` or None)."""
    if v.id in pid:
        return GROWS
    if v.id in seen:
        return seen[v.id]
    op = v.owner
    if not isinstance(op, Op):
        return FLAT  # an argument, or a region's argument
    seen[v.id] = None  # cycles (none in SSA, but safe)
    trends = [_trend(x, pid, seen) for x in op.operands]
    if all(t == FLAT for t in trends) and not op.regions:
        out = FLAT
    elif op.kind is OpKind.CAST and v.dtype.is_integer and op.operands[0].dtype.is_integer \
            and v.dtype.bits >= op.operands[0].dtype.bits:
        out = trends[0]
    elif op.kind is OpKind.BINARY and v.dtype.is_integer:
        out = _binary(op, trends)
    else:
        out = None
    seen[v.id] = out
    return out


def _binary(op: Op, trends: list[int | None]) -> int | None:
    a, b = trends
    kind = op.attrs.op
    if kind in (BinaryOp.ADD, BinaryOp.MIN, BinaryOp.MAX):
        return _combine(a, b)
    if kind is BinaryOp.SUB:
        return _combine(a, None if b is None else -b)
    left, right = (int_constant(v) for v in op.operands)
    if kind in (BinaryOp.MUL, BinaryOp.FLOORDIV) and right is not None and a is not None:
        return _scaled(a, right)
    if kind is BinaryOp.MUL and left is not None and b is not None:
        return _scaled(b, left)
    return None


def _scaled(trend: int, factor: int) -> int:
    """The trend of a value of trend ``trend`` multiplied (or floor-divided) by the constant ``factor``."""
    return FLAT if factor == 0 else trend if factor > 0 else -trend


def _mirror(fn: Function, pid: Op, axis: int) -> None:
    """``program_id(axis)`` replaced by ``num_programs(axis) - 1 - program_id(axis)`` right after it."""
    block = next(b for b in blocks(fn.body) if any(o is pid for o in b.ops))
    build = Builder(Block())
    with build.located(pid.loc):
        count = build.create1(OpKind.NUM_PROGRAMS, [], pid.result.type, AxisAttrs(axis))
        one = build.create1(OpKind.CONSTANT, [], pid.result.type, ConstantAttrs(1))
        last = build.create1(OpKind.BINARY, [count, one], pid.result.type, BinaryAttrs(BinaryOp.SUB))
        mirrored = build.create1(OpKind.BINARY, [last, pid.result], pid.result.type, BinaryAttrs(BinaryOp.SUB))
    replace_uses(fn, pid.result, mirrored)  # the new ops are not in fn yet: the mirror keeps reading the id
    mirrored.name, pid.result.name = pid.result.name, None
    at = block.ops.index(pid)
    block.ops[at + 1:at + 1] = build.block.ops
