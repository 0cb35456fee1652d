"""Split-K: the K loop of a GEMM-like kernel cut over the programs of one thread-block cluster.

With the ``split_k=S`` launch option (2 <= S <= 8, sm_90 and newer), each program of the user's grid becomes a
cluster of S programs stacked along z. Program ``r`` of a cluster (``tj.split_index``) runs the ``r``-th of S
equal shares of the loop's iterations; ``tj.split_reduce`` then sums the partial accumulators over the cluster
through distributed shared memory, program 0 adding the others' partials in a fixed order (the result does not
depend on timing); only program 0 runs what follows the loop (the epilogue), which this pass wraps in
``if split_index == 0``. ``T.program_id(2)`` and ``T.num_programs(2)`` keep the user's meaning: the emitter
divides by S. Small and skinny problems (M <= 128, or fewer output tiles than SMs) fill the GPU this way.

The rewrite is exact only for kernels of the DESIGN matmul's shape, so it checks them and otherwise raises a
located :class:`~tilejit.errors.CompilationError` saying why:

* exactly one top-level ``for`` loop carries accumulators, and every value it carries is a sum: initialised
  to zeros and changed only by ``gemm(a, b, acc)`` or ``acc + x`` (``x`` not computed from ``acc``), with nothing
  else in the loop reading it; its step is a positive compile-time constant;
* the accumulators are float32 or int32 (the partials are exchanged as 4-byte words);
* nothing before the loop writes memory (all S programs run it), and the loop's results are used after it only.
"""
from __future__ import annotations

from ..errors import CompilationError
from .. import dtypes as D
from ..ir import (BinaryAttrs, BinaryOp, Block, CastAttrs, CompareAttrs, CompareOp, ConstantAttrs, Function,
                  NoAttrs, Op, OpKind, ScalarType, SplitAttrs, Value)
from ..ir.rewrite import defining_op, is_zero
from ..target import Target


class SplitKError(CompilationError):
    """The ``split_k`` launch option asked for a kernel (or an arch) the split-K rewrite cannot serve."""


def split_k(fn: Function, target: Target) -> None:
    splits = target.split_k
    if splits == 1:
        return
    if target.sm < 90:
        raise _error(fn, None, f"split_k={splits} needs thread-block clusters (sm_90 or newer); {target.arch} has "
                               "none", "launch with split_k=1 on this GPU")
    loop = _the_k_loop(fn)
    _check_prologue(fn, loop)
    r = _split_loop_bounds(fn, loop, splits)
    _reduce_and_guard_epilogue(fn, loop, r, splits)
    fn.attrs["split_k"] = splits


# -- which loop ---------------------------------------------------------------------------------------------

def _the_k_loop(fn: Function) -> Op:
    loops = [op for op in fn.body.ops if op.kind is OpKind.FOR and op.results
             and any(inner.kind is OpKind.GEMM for inner in op.regions[0].walk())]
    if len(loops) != 1:
        where = loops[1] if len(loops) > 1 else None
        raise _error(fn, where, f"split_k needs exactly one top-level loop that accumulates matrix products; this "
                                f"kernel has {len(loops)}",
                     "split_k applies to kernels shaped like the DESIGN.md matmul (one K loop, then the epilogue); "
                     "launch with split_k=1")
    loop = loops[0]
    body = loop.regions[0]
    for i, arg in enumerate(body.args[1:]):
        why = _not_a_sum(loop, i)
        if why:
            raise _error(fn, loop, f"split_k cannot cut this loop: its carried value '{arg.name or i}' {why}",
                         "only sums (acc = zeros; acc += a @ b or acc += x) can be split over K; launch with "
                         "split_k=1")
        if arg.dtype not in (D.float32, D.int32):
            raise _error(fn, loop, f"split_k needs float32 or int32 accumulators; '{arg.name or i}' is "
                                   f"{arg.dtype.name}", "accumulate in float32 (or int32), or launch with split_k=1")
    step = defining_op(loop.operands[2])
    if step is None or step.kind is not OpKind.CONSTANT or not step.attrs.value > 0:
        raise _error(fn, loop, "split_k needs a loop step that is a positive compile-time constant",
                     "step the K loop by a constexpr tile size (T.range(0, K, BK)), or launch with split_k=1")
    return loop


def _not_a_sum(loop: Op, i: int) -> str | None:
    """Why carried value ``i`` of ``loop`` is not a sum of per-iteration terms (None when it is one)."""
    body = loop.regions[0]
    arg, init = body.args[1 + i], loop.operands[3 + i]
    if not is_zero(init):
        return "does not start at zero"
    chain = {arg.id}  # the values that hold the running sum within one iteration
    chain_ops: list[Op] = []  # the additions that carry it from one value to the next
    v = body.terminator.operands[i]
    while v is not arg:
        op = defining_op(v)
        if op is None or op not in body.ops:
            return "is not updated by additions in the loop body"
        if op.kind is OpKind.GEMM:
            prev, terms = op.operands[2], op.operands[:2]
        elif op.kind is OpKind.BINARY and op.attrs.op is BinaryOp.ADD:
            a, b = op.operands
            prev, terms = (a, [b]) if _depends_on(a, arg, body) else (b, [a])
        else:
            return f"is updated by {op.kind.mnemonic}, not by a sum"
        if any(_depends_on(t, arg, body) for t in terms):
            return "is added to a term computed from itself"
        chain.add(v.id)
        chain_ops.append(op)
        v = prev
    for op in body.walk():
        for index, operand in enumerate(op.operands):
            if operand.id not in chain:
                continue
            if op is body.terminator and index == i:
                continue
            if any(op is c for c in chain_ops) and (op.kind is not OpKind.GEMM or index == 2):
                continue
            return f"is read by {op.kind.mnemonic} inside the loop"
    return None


def _depends_on(v: Value, root: Value, body: Block) -> bool:
    """Whether ``v`` is computed (within ``body``) from ``root``."""
    seen, stack = set(), [v]
    while stack:
        x = stack.pop()
        if x is root:
            return True
        if x.id in seen:
            continue
        seen.add(x.id)
        op = defining_op(x)
        if op is not None and op in body.ops:
            stack.extend(op.operands)
    return False


def _check_prologue(fn: Function, loop: Op) -> None:
    for op in fn.body.ops[:fn.body.ops.index(loop)]:
        effects = [op] + [inner for region in op.regions for inner in region.walk()]
        writer = next((o for o in effects if o.kind.writes_memory), None)
        if writer is not None:
            raise _error(fn, writer, "split_k: this write comes before the K loop, and every program of a split-K "
                                     "cluster would run it", "move it after the loop, or launch with split_k=1")


# -- the rewrite ---------------------------------------------------------------------------------------------

def _split_loop_bounds(fn: Function, loop: Op, splits: int) -> Value:
    """Program r's share: iterations [r * chunk, (r + 1) * chunk) of the loop's n, chunk = ceil(n / splits)."""
    lo, hi, step = loop.operands[:3]
    t = lo.type
    at = fn.body.ops.index(loop)
    new: list[Op] = []

    def emit(kind: OpKind, operands: list[Value], attrs, type_=t) -> Value:
        op = Op(kind, operands, [type_], attrs, loc=loop.loc)
        new.append(op)
        return op.result

    def const(value: int) -> Value:
        return emit(OpKind.CONSTANT, [], ConstantAttrs(value))

    def binary(op: BinaryOp, a: Value, b: Value) -> Value:
        return emit(OpKind.BINARY, [a, b], BinaryAttrs(op))

    r32 = emit(OpKind.SPLIT_INDEX, [], SplitAttrs(splits), ScalarType(D.int32))
    r = r32 if t.dtype == D.int32 else emit(OpKind.CAST, [r32], CastAttrs(t.dtype))
    span = binary(BinaryOp.MAX, binary(BinaryOp.SUB, hi, lo), const(0))
    trips = binary(BinaryOp.FLOORDIV, binary(BinaryOp.ADD, span, binary(BinaryOp.SUB, step, const(1))), step)
    chunk = binary(BinaryOp.FLOORDIV, binary(BinaryOp.ADD, trips, const(splits - 1)), const(splits))
    width = binary(BinaryOp.MUL, chunk, step)
    new_lo = binary(BinaryOp.ADD, lo, binary(BinaryOp.MUL, r, width))
    new_hi = binary(BinaryOp.MIN, hi, binary(BinaryOp.ADD, new_lo, width))
    new_lo.name, new_hi.name = "k_split_lo", "k_split_hi"
    fn.body.ops[at:at] = new
    loop.operands[0], loop.operands[1] = new_lo, new_hi
    return r32


def _reduce_and_guard_epilogue(fn: Function, loop: Op, r: Value, splits: int) -> None:
    """Sum the loop's results over the cluster, then run everything after the loop in program 0 only."""
    ops = fn.body.ops
    at = ops.index(loop) + 1
    epilogue = ops[at:]
    del ops[at:]
    for result in loop.results:
        reduce = Op(OpKind.SPLIT_REDUCE, [result], [result.type], SplitAttrs(splits), loc=loop.loc)
        reduce.result.name = result.name
        for op in epilogue:
            for inner in [op] + [o for region in op.regions for o in region.walk()]:
                inner.operands = [reduce.result if v is result else v for v in inner.operands]
        ops.append(reduce)
    zero = Op(OpKind.CONSTANT, [], [ScalarType(D.int32)], ConstantAttrs(0), loc=loop.loc)
    leader = Op(OpKind.COMPARE, [r, zero.result], [ScalarType(D.bool_)], CompareAttrs(CompareOp.EQ), loc=loop.loc)
    then_block, else_block = Block(), Block()
    then_block.ops = epilogue + [Op(OpKind.YIELD, [], [], NoAttrs())]
    else_block.ops = [Op(OpKind.YIELD, [], [], NoAttrs())]
    guard = Op(OpKind.IF, [leader.result], [], NoAttrs(), regions=[then_block, else_block], loc=loop.loc)
    ops.extend([zero, leader, guard])


def _error(fn: Function, op: Op | None, message: str, hint: str) -> SplitKError:
    loc = getattr(op, "loc", None)
    if loc is None:
        return SplitKError(f"kernel {fn.name}: {message}", filename=fn.filename, hint=hint)
    return SplitKError.at(loc, message, hint=hint)
