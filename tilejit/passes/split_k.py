"""Split-K and stream-K: the K loop of a GEMM-like kernel cut into parts that several programs run, their
partial sums added before the epilogue.

**Split-K** cuts it over the programs of one thread-block cluster.

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
  to zeros and changed only by ``gemm(a, b, acc)``, ``acc + x`` or ``fma(x, y, acc)`` (``x``, ``y`` not computed
  from ``acc``: a block-scaled product), with nothing else in the loop reading it; its step is a positive
  compile-time constant;
* the accumulators are float32 or int32 (the partials are exchanged as 4-byte words);
* nothing before the loop writes memory (all S programs run it), and the loop's results are used after it only.

**Stream-K** (the ``stream_k`` launch option, sm_90a; :func:`stream_k`) serves a persistent kernel, whose P
programs (one per SM) walk the output tiles. When the tile count T is not a multiple of P, the last wave leaves
SMs idle. With stream-K the walk hands out the tiles of the last wave (T mod P of them; all T when T < P) as K
iterations instead: program p gets the p-th of P equal runs of their iterations, which may
start or end inside a tile. A run that does not cover its tile writes its partial accumulators to a global
workspace and counts its iterations on the tile's counter; the run that completes the count sums every run's
partials in program order (deterministic) and runs the epilogue. Nobody waits for another program, so the
kernel cannot hang when some programs are not resident yet. The tiles before run whole, as in a persistent
kernel. The same kernel checks apply, and the loop's bounds must not depend on ``T.program_id`` (every tile has
as many iterations).
"""
from __future__ import annotations

from ..errors import CompilationError
from .. import dtypes as D
from ..ir import (BinaryAttrs, BinaryOp, Block, CastAttrs, CompareAttrs, CompareOp, ConstantAttrs, Function,
                  NoAttrs, Op, OpKind, ScalarType, SplitAttrs, StreamKAttrs, Value)
from ..ir.rewrite import defining_op, is_zero
from ..target import Target

#: How a user wrote a binary op, for the messages.
_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "min": "T.minimum",
              "max": "T.maximum", "and": "&", "or": "|", "xor": "^", "shl": "<<", "shr": ">>"}


def _written(op: Op) -> str:
    """An op as the user wrote it, for a message: its operator (or the IR op's name) and its location."""
    what = (f"'{_OPERATORS.get(op.attrs.op.value, op.attrs.op.value)}'" if op.kind is OpKind.BINARY
            else op.kind.mnemonic)
    return what + (f" ({op.loc})" if op.loc else "")


class SplitKError(CompilationError):
    """The ``split_k`` launch option asked for a kernel (or an arch) the split-K rewrite cannot serve."""


class StreamKError(CompilationError):
    """The ``stream_k`` launch option asked for a kernel (or an arch) the stream-K rewrite cannot serve."""


def split_k(fn: Function, target: Target) -> None:
    splits = target.split_k
    if splits == 1:
        return
    if target.sm < 90:
        # located at the matrix product the option would split (else the first loop), as the kernel checks are
        product = next((op for op in fn.walk() if op.kind is OpKind.GEMM),
                       next((op for op in fn.walk() if op.kind is OpKind.FOR), None))
        raise _error(fn, product, f"split_k={splits} needs thread-block clusters (sm_90 or newer); {target.arch} "
                                  "has none", "launch with split_k=1 on this GPU")
    loop = _the_k_loop(fn, "split_k")
    _check_prologue(fn, loop, "split_k")
    r = _split_loop_bounds(fn, loop, splits)
    _reduce_and_guard_epilogue(fn, loop, r, splits)
    fn.attrs["split_k"] = splits


def stream_k(fn: Function, loop: Op) -> None:
    """Cut ``loop`` (the warp-specialized K loop of a persistent kernel) into stream-K runs: its bounds become
    those of the run the program does now (``stream_k_bound``, which also carries the loop's own bounds for the
    walk's schedule), the loop's results are fixed up (``stream_k_fixup``) and what follows the loop runs only
    where the run starts the tile. Raises :class:`StreamKError` for kernels it cannot cut exactly."""
    if _the_k_loop(fn, "stream_k") is not loop:
        raise _error(fn, loop, "stream_k: the warp-specialized loop is not the kernel's K loop",
                     "launch without stream_k", StreamKError)
    _check_prologue(fn, loop, "stream_k")
    varying = next((o for o in _computing(fn, loop.operands[:3]) if o.kind is OpKind.PROGRAM_ID), None)
    if varying is not None:
        raise _error(fn, loop, "stream_k needs the K loop to run as many iterations in every output tile; its "
                               "bounds depend on T.program_id", "launch without stream_k (persistent=True keeps "
                                                                 "whole tiles per program)", StreamKError)
    lo, hi, step = loop.operands[:3]
    b = _Bounds(loop)
    k0, k1 = (b.index(OpKind.STREAM_K_BOUND, [lo, hi, step], StreamKAttrs(end)) for end in (False, True))
    new_lo = b.binary(BinaryOp.ADD, lo, b.binary(BinaryOp.MUL, k0, step))
    new_hi = b.binary(BinaryOp.MIN, hi, b.binary(BinaryOp.ADD, lo, b.binary(BinaryOp.MUL, k1, step)))
    b.set(fn, new_lo, new_hi, "k_run")
    _fix_up_and_guard_epilogue(fn, loop)


class _Bounds:
    """Scalar ops computing new bounds for ``loop``, inserted right before it by ``set``; in the type of the
    loop's bounds unless told otherwise."""

    def __init__(self, loop: Op) -> None:
        self.loop, self.type, self.ops = loop, loop.operands[0].type, []

    def emit(self, kind: OpKind, operands: list[Value], attrs, type_=None) -> Value:
        op = Op(kind, operands, [type_ or self.type], attrs, loc=self.loop.loc)
        self.ops.append(op)
        return op.result

    def const(self, value: int) -> Value:
        return self.emit(OpKind.CONSTANT, [], ConstantAttrs(value))

    def binary(self, op: BinaryOp, a: Value, b: Value) -> Value:
        return self.emit(OpKind.BINARY, [a, b], BinaryAttrs(op))

    def index(self, kind: OpKind, operands: list[Value], attrs) -> Value:
        """An int32 index op, cast to the bounds' type."""
        k = self.emit(kind, operands, attrs, ScalarType(D.int32))
        return k if self.type.dtype == D.int32 else self.emit(OpKind.CAST, [k], CastAttrs(self.type.dtype))

    def set(self, fn: Function, lo: Value, hi: Value, name: str) -> None:
        lo.name, hi.name = f"{name}_lo", f"{name}_hi"
        at = fn.body.ops.index(self.loop)
        fn.body.ops[at:at] = self.ops
        self.loop.operands[0], self.loop.operands[1] = lo, hi


def _fix_up_and_guard_epilogue(fn: Function, loop: Op) -> None:
    """The loop's results summed over the tile's runs (``stream_k_fixup``); everything after the loop runs only in
    the program that owns the sum."""
    ops = fn.body.ops
    at = ops.index(loop) + 1
    epilogue = ops[at:]
    del ops[at:]
    fixup = Op(OpKind.STREAM_K_FIXUP, list(loop.results), [r.type for r in loop.results] + [ScalarType(D.bool_)],
               NoAttrs(), loc=loop.loc)
    swap = dict(zip((r.id for r in loop.results), fixup.results))
    for result, summed in zip(loop.results, fixup.results):
        summed.name = result.name
    for op in epilogue:
        for inner in [op] + [o for region in op.regions for o in region.walk()]:
            inner.operands = [swap.get(v.id, v) for v in inner.operands]
    then_block, else_block = Block(), Block()
    then_block.ops = epilogue + [Op(OpKind.YIELD, [], [], NoAttrs())]
    else_block.ops = [Op(OpKind.YIELD, [], [], NoAttrs())]
    ops.extend([fixup, Op(OpKind.IF, [fixup.results[-1]], [], NoAttrs(), regions=[then_block, else_block],
                          loc=loop.loc)])


def _computing(fn: Function, values: list[Value]) -> list[Op]:
    """The ops of the kernel's top-level block that ``values`` are computed from (through any depth)."""
    producers = {r.id: o for o in fn.body.ops for r in o.results}
    seen, out, stack = set(), [], list(values)
    while stack:
        v = stack.pop()
        op = producers.get(v.id)
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        out.append(op)
        stack.extend(op.operands)
    return out


# -- which loop ---------------------------------------------------------------------------------------------

#: How each option that cuts the K loop is turned off, for the hints of its errors.
_OFF = {"split_k": "launch with split_k=1", "stream_k": "launch without stream_k"}


def _the_k_loop(fn: Function, option: str) -> Op:
    loops = [op for op in fn.body.ops if op.kind is OpKind.FOR and op.results
             and any(inner.kind is OpKind.GEMM for inner in op.regions[0].walk())]
    off = _OFF[option]
    if len(loops) != 1:
        where = loops[1] if len(loops) > 1 else kernel_site(fn)
        raise _error(fn, where, f"{option} needs exactly one top-level loop that accumulates matrix products; this "
                                f"kernel has {len(loops)}",
                     f"{option} applies to kernels shaped like the README's matmul (one K loop, then the epilogue); "
                     f"{off}")
    loop = loops[0]
    body = loop.regions[0]
    for i, arg in enumerate(body.args[1:]):
        why = _not_a_sum(loop, i)
        if why:
            raise _error(fn, loop, f"{option} cannot cut this loop: its carried value '{arg.name or i}' {why}",
                         f"only sums (acc = zeros; acc += a @ b or acc += x) can be split over K; {off}")
        if arg.dtype not in (D.float32, D.int32):
            raise _error(fn, loop, f"{option} needs float32 or int32 accumulators; '{arg.name or i}' is "
                                   f"{arg.dtype.name}", f"accumulate in float32 (or int32), or {off}")
    step = defining_op(loop.operands[2])
    if step is None or step.kind is not OpKind.CONSTANT or not step.attrs.value > 0:
        raise _error(fn, loop, f"{option} needs a loop step that is a positive compile-time constant",
                     f"step the K loop by a constexpr tile size (T.range(0, K, BK)), or {off}")
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
        elif op.kind is OpKind.FMA:  # acc + x * y (a block-scaled product added with its scale)
            prev, terms = op.operands[2], op.operands[:2]
        else:
            return f"is updated by {_written(op)}, not by a sum"
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
            if any(op is c for c in chain_ops) and (op.kind not in (OpKind.GEMM, OpKind.FMA) or index == 2):
                continue
            return f"is read by {_written(op)} inside the loop"
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


def _check_prologue(fn: Function, loop: Op, option: str) -> None:
    who = {"split_k": "every program of a split-K cluster", "stream_k": "every program with a share of the tile's K "
                                                                         "loop"}[option]
    for op in fn.body.ops[:fn.body.ops.index(loop)]:
        effects = [op] + [inner for region in op.regions for inner in region.walk()]
        writer = next((o for o in effects if o.kind.writes_memory), None)
        if writer is not None:
            raise _error(fn, writer, f"{option}: this write comes before the K loop, and {who} would run it",
                         f"move it after the loop, or {_OFF[option]}")


# -- the rewrite ---------------------------------------------------------------------------------------------

def _split_loop_bounds(fn: Function, loop: Op, splits: int) -> Value:
    """Program r's share: iterations [r * chunk, (r + 1) * chunk) of the loop's n, chunk = ceil(n / splits)."""
    lo, hi, step = loop.operands[:3]
    b = _Bounds(loop)
    r = b.index(OpKind.SPLIT_INDEX, [], SplitAttrs(splits))
    r32 = b.ops[0].result
    span = b.binary(BinaryOp.MAX, b.binary(BinaryOp.SUB, hi, lo), b.const(0))
    trips = b.binary(BinaryOp.FLOORDIV, b.binary(BinaryOp.ADD, span, b.binary(BinaryOp.SUB, step, b.const(1))), step)
    chunk = b.binary(BinaryOp.FLOORDIV, b.binary(BinaryOp.ADD, trips, b.const(splits - 1)), b.const(splits))
    width = b.binary(BinaryOp.MUL, chunk, step)
    new_lo = b.binary(BinaryOp.ADD, lo, b.binary(BinaryOp.MUL, r, width))
    new_hi = b.binary(BinaryOp.MIN, hi, b.binary(BinaryOp.ADD, new_lo, width))
    b.set(fn, new_lo, new_hi, "k_split")
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


def kernel_site(fn: Function) -> Op | None:
    """Where a launch option's refusal points when no op of the kernel is at fault: its first matrix product, else
    its first loop, else its first located op."""
    ops = list(fn.walk())
    return next((op for kind in (OpKind.GEMM, OpKind.FOR) for op in ops if op.kind is kind and op.loc),
                next((op for op in ops if op.loc), None))


def _error(fn: Function, op: Op | None, message: str, hint: str,
           cls: type[CompilationError] = SplitKError) -> CompilationError:
    loc = getattr(op, "loc", None)
    if loc is None:
        return cls(f"kernel {fn.name}: {message}", filename=fn.filename, hint=hint)
    return cls.at(loc, message, hint=hint)
