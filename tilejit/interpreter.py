"""A CPU interpreter of the tile IR: runs a kernel's frontend IR on torch tensors, program by program.

``TILEJIT_INTERPRET=1`` routes ``kernel[grid](...)`` here. Every program instance of the grid runs the
whole function in turn (x fastest, then y, then z), so a kernel can be debugged, and tested, on a
machine without a GPU. Each :class:`~tilejit.ir.OpKind` has one rule in ``_RULES``, registered with
``@rule(kind)``; a rule reads its operands from ``env`` (``Value.id`` -> value) and writes its results
there.

Values: tiles are torch tensors of the tile's dtype; scalars are 0-d torch tensors of their dtype, so
int32 arithmetic wraps and float32 scalars round exactly as they will on the GPU. The numerics follow
the language (``tilejit/frontend/semantic.py``) and the GPU:

* 8/16-bit float arithmetic, comparisons and math functions compute in float32 and round back to the
  operand dtype after every op, as the generated code does per instruction.
* ``//`` and ``%`` on integers follow Python (floor, divisor's sign). Division by zero does not trap (a
  padded, never-stored lane of a ragged tile may divide by zero): ``x // 0`` is -1 and ``x % 0`` is ``x``,
  as the GPU's ``div``/``rem`` give; kernels must not rely on either value.
* ``min``/``max`` (and the max/min reductions) propagate NaN, which makes NaN bugs visible here even
  where the GPU's ``fmaxf`` would drop them.
* Casts: float -> float rounds to nearest even; float -> int truncates toward zero and saturates at the
  integer's range with NaN -> 0 (PTX ``cvt.rzi.sat``); int -> int wraps; anything -> bool is ``!= 0``.
  Float -> fp8 rounds to nearest even and saturates to the largest finite value (+-448 e4m3fn, +-57344
  e5m2; infinities too), as ``cvt.rn.satfinite`` does; NaN stays NaN.
* ``gemm`` computes the product in float32 from the exact operand values (float64 for float64 operands;
  int8 exactly, wrapped to int32) and adds it to the accumulator in that dtype.
  A float16 accumulator (``out_dtype=T.float16``) is rounded to float16 after every 16 values of K (one
  tensor-core step; within the step the products are summed in float32).
* Loads read out-of-bounds elements as 0; stores skip them. Gathers read out-of-range indices as 0; scatters
  skip them, and of duplicate indices the last write in row-major order wins (the GPU: any one of them).
* Atomics update their elements one after the other in row-major order (program after program), so duplicate
  indices accumulate and each sees the previous one's result; out-of-bounds elements are skipped, old value 0.

Stores are undone if the run fails, so an error leaves the output tensors as they were.
"""
from __future__ import annotations

import itertools
import linecache
from typing import Any, Callable, Iterable

import torch

from . import dtypes as D
from .dtypes import DType
from .errors import TilejitError
from .ir import (MX_BLOCK, AtomicOp, BinaryOp, Block, CompareOp, Function, Op, OpKind, ReduceKind, ScalarType,
                 TensorListType, TensorType, UnaryOp, is_block_scaled)


class InterpreterError(TilejitError):
    """An op failed while the interpreter ran it: says which op, where in the kernel, and in which program."""

    def __init__(self, message: str, op: Op | None = None, program: tuple[int, int, int] | None = None) -> None:
        self.op = op
        self.program = program
        lines = []
        where = f"{op.loc}: " if op is not None and op.loc is not None else ""
        what = f"tj.{op.kind.mnemonic} failed" if op is not None else "interpreter error"
        pid = f" in program {program}" if program is not None else ""
        lines.append(f"{where}{what}{pid}: {message}")
        if op is not None and op.loc is not None:
            source = linecache.getline(op.loc.filename, op.loc.lineno).rstrip("\n")
            if source:
                lines.append("    " + source.expandtabs(4))
                lines.append("    " + " " * len(source[:op.loc.col].expandtabs(4)) + "^")
        super().__init__("\n".join(lines))


Env = dict[int, Any]
Rule = Callable[[Op, Env, "_Context"], None]
_RULES: dict[OpKind, Rule] = {}


def rule(kind: OpKind) -> Callable[[Rule], Rule]:
    """Register the interpreter rule of one op kind."""
    def register(fn: Rule) -> Rule:
        if kind in _RULES:
            raise ValueError(f"two interpreter rules for {kind}")
        _RULES[kind] = fn
        return fn
    return register


class _Context:
    """Per-launch state: the grid, the current program, cached constants and the stores' undo log."""

    def __init__(self, grid: tuple[int, int, int]) -> None:
        self.grid = grid
        self.num_programs = tuple(torch.tensor(g, dtype=torch.int32) for g in grid)
        self.program: tuple[int, int, int] = (0, 0, 0)
        self.program_ids: tuple[torch.Tensor, ...] = ()
        self.constants: dict[int, torch.Tensor] = {}
        self.plans: dict[int, tuple[list[tuple[Rule, Op]], list[int]]] = {}
        self.undo: list[tuple[torch.Tensor, torch.Tensor]] = []

    def plan(self, block: Block) -> tuple[list[tuple[Rule, Op]], list[int]]:
        """The block's (rule, op) list without its terminator, and the ids of the values it yields."""
        cached = self.plans.get(id(block))
        if cached is None:
            ops = block.ops
            term = block.terminator
            if term is not None:
                ops = ops[:-1]
            steps = []
            for op in ops:
                fn = _RULES.get(op.kind)
                if fn is None:
                    raise InterpreterError(f"the interpreter has no rule for tj.{op.kind.mnemonic} (it runs "
                                           "frontend IR, before lowering passes)", op)
                steps.append((fn, op))
            cached = (steps, [v.id for v in term.operands] if term is not None else [])
            self.plans[id(block)] = cached
        return cached


def _run_block(block: Block, env: Env, ctx: _Context) -> list[Any]:
    steps, yielded = ctx.plan(block)
    for fn, op in steps:
        try:
            fn(op, env, ctx)
        except InterpreterError:
            raise
        except Exception as e:  # a torch op that rejects its inputs: report the kernel's line, not ours
            raise InterpreterError(f"{type(e).__name__}: {e}", op, ctx.program) from e
    return [env[i] for i in yielded]


# -- outputs -----------------------------------------------------------------------------------------

def output_problem(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` cannot be written by a kernel, or None: its elements share memory (a dimension of stride 0
    over more than one element, as ``expand()`` makes), or it requires grad while autograd records (a kernel's
    writes are invisible to autograd). The interpreter and the launch refuse the same outputs."""
    shape, strides = tensor.shape, tensor.stride()
    if 0 not in shape:
        for dim, (extent, stride) in enumerate(zip(shape, strides)):
            if stride == 0 and extent > 1:
                return (f"has stride 0 in dimension {dim} over {extent} elements (an expand()ed view?), so its "
                        "elements share memory and every write would land on the same address; write into a tensor "
                        "of its own (.contiguous() or .clone())")
    if tensor.requires_grad and torch.is_grad_enabled():
        return ("requires grad: autograd does not see a kernel's writes; write into a tensor that does not require "
                "grad (detach() it, or launch under torch.no_grad())")
    return None


def output_problems(written: Iterable[str], values: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(parameter, argument, problem) for every tensor, or tensor list item, of the ``written`` parameters in
    ``values`` that ``output_problem`` refuses."""
    found = []
    for name in written:
        value = values.get(name)
        items = [(name, value)] if isinstance(value, torch.Tensor) else [
            (f"{name}[{i}]", t) for i, t in enumerate(value or ()) if isinstance(t, torch.Tensor)]
        for label, tensor in items:
            problem = output_problem(tensor)
            if problem is not None:
                found.append((name, label, problem))
    return found


# -- entry point -----------------------------------------------------------------------------------

def interpret(fn: Function, grid: tuple[int, int, int], values: dict[str, Any]) -> None:
    """Run ``fn`` for every program of ``grid`` on the CPU tensors and Python scalars in ``values``."""
    env: Env = {}
    for param in fn.runtime_params:
        if param.name not in values:
            raise InterpreterError(f"kernel {fn.name}: no argument for parameter '{param.name}'")
        env[param.value.id] = _bind_argument(fn.name, param.name, param.value.type, values[param.name])
    writers = fn.writers()
    for name, label, problem in output_problems(writers, values):
        raise InterpreterError(f"kernel {fn.name}: output '{label}' {problem}", writers[name])
    g = tuple(int(n) for n in grid) + (1,) * (3 - len(grid))
    ctx = _Context((g[0], g[1], g[2]))
    ctx.plan(fn.body)  # reject ops without a rule before anything runs
    for op in fn.walk():
        for region in op.regions:
            ctx.plan(region)
    try:
        # Autograd records nothing: a kernel's writes are no differentiable ops, and an output written from an input
        # that requires grad must not join its graph (the output would then require grad, refused at the next launch).
        with torch.no_grad():
            for z, y, x in itertools.product(range(g[2]), range(g[1]), range(g[0])):
                ctx.program = (x, y, z)
                ctx.program_ids = tuple(torch.tensor(p, dtype=torch.int32) for p in ctx.program)
                _run_block(fn.body, env, ctx)
    except BaseException:
        # Put back what the failed run wrote; the run's own (located) error is what the caller sees, even when a
        # view cannot be restored (an overlapping output view refuses copy_ as it refused the store).
        for view, old in reversed(ctx.undo):
            try:
                with torch.no_grad():
                    view.copy_(old)
            except Exception:  # noqa: BLE001 - restoring is best effort
                pass
        raise


def _bind_argument(kernel: str, name: str, ir_type: Any, arg: Any) -> Any:
    if isinstance(ir_type, TensorType):
        if not isinstance(arg, torch.Tensor):
            raise InterpreterError(f"kernel {kernel}: argument '{name}' must be a torch tensor, got "
                                   f"{type(arg).__name__}")
        if arg.device.type != "cpu":
            raise InterpreterError(f"kernel {kernel}: argument '{name}' is on {arg.device}; the interpreter "
                                   "(TILEJIT_INTERPRET=1) runs on CPU tensors, move it with .cpu()")
        if D.from_torch(arg.dtype) != ir_type.dtype or arg.dim() != ir_type.rank:
            raise InterpreterError(f"kernel {kernel}: argument '{name}' is a {arg.dim()}-d {arg.dtype} tensor, "
                                   f"the IR expects {ir_type}")
        return arg
    if isinstance(ir_type, TensorListType):
        if not isinstance(arg, (list, tuple)):
            raise InterpreterError(f"kernel {kernel}: argument '{name}' must be a list or tuple of torch tensors, got "
                                   f"{type(arg).__name__}")
        return [_bind_argument(kernel, f"{name}[{i}]", ir_type.element, t) for i, t in enumerate(arg)]
    if isinstance(ir_type, ScalarType):
        if isinstance(arg, torch.Tensor) or not isinstance(arg, (bool, int, float)):
            raise InterpreterError(f"kernel {kernel}: argument '{name}' must be a Python int, float or bool, got "
                                   f"{type(arg).__name__}")
        return _scalar(arg, ir_type.dtype)
    raise InterpreterError(f"kernel {kernel}: parameter '{name}' has unexpected IR type {ir_type}")


# -- dtype helpers ---------------------------------------------------------------------------------

_TORCH = {d: d.to_torch() for d in D.ALL_DTYPES}


def _scalar(value: Any, dtype: DType) -> torch.Tensor:
    """A 0-d tensor of ``dtype``; integers wrap to the dtype's width like a C cast."""
    if dtype.is_integer and not isinstance(value, bool):
        bits = dtype.bits
        value = int(value) & ((1 << bits) - 1)
        if dtype.kind == "int" and value >= 1 << (bits - 1):
            value -= 1 << bits
    return torch.tensor(value, dtype=_TORCH[dtype])


def _widen(x: torch.Tensor) -> torch.Tensor:
    """8/16-bit floats compute in float32 (then round back with ``.to``)."""
    if x.dtype in _NARROW_FLOATS:
        return x.float()
    return x


_NARROW_FLOATS = {torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2}
_COMPUTE_DTYPE = {t: torch.float32 for t in _NARROW_FLOATS}


def _as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


# -- scalars and tensor metadata -------------------------------------------------------------------

@rule(OpKind.CONSTANT)
def _constant(op: Op, env: Env, ctx: _Context) -> None:
    value = ctx.constants.get(id(op))
    if value is None:
        value = ctx.constants[id(op)] = _scalar(op.attrs.value, op.result.type.dtype)
    env[op.results[0].id] = value


@rule(OpKind.PROGRAM_ID)
def _program_id(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = ctx.program_ids[op.attrs.axis]


@rule(OpKind.NUM_PROGRAMS)
def _num_programs(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = ctx.num_programs[op.attrs.axis]


@rule(OpKind.TENSOR_DIM)
def _tensor_dim(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = torch.tensor(env[op.operands[0].id].shape[op.attrs.axis], dtype=torch.int64)


@rule(OpKind.TENSOR_STRIDE)
def _tensor_stride(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = torch.tensor(env[op.operands[0].id].stride(op.attrs.axis), dtype=torch.int64)


@rule(OpKind.LIST_ITEM)
def _list_item(op: Op, env: Env, ctx: _Context) -> None:
    tensors = env[op.operands[0].id]
    g = int(env[op.operands[1].id])
    if 0 <= g < len(tensors):
        env[op.results[0].id] = tensors[g]
    else:  # outside the list: an empty tensor, which loads read as 0 and stores skip (as on the GPU)
        item = op.result.type
        empty = torch.empty(0, dtype=_TORCH[item.dtype])
        env[op.results[0].id] = empty.as_strided((0,) * item.rank, (0,) * item.rank)  # extents and strides 0


@rule(OpKind.LIST_LEN)
def _list_len(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = torch.tensor(len(env[op.operands[0].id]), dtype=torch.int64)


# -- elementwise arithmetic ------------------------------------------------------------------------

def _floordiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    zero = b == 0
    if bool(zero.any()):  # e.g. a padded lane that is never stored: no trap, like the GPU
        return torch.where(zero, torch.full_like(a, -1), torch.div(a, b.masked_fill(zero, 1), rounding_mode="floor"))
    return torch.div(a, b, rounding_mode="floor")


def _mod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    zero = b == 0
    if bool(zero.any()):
        return torch.where(zero, a, torch.remainder(a, b.masked_fill(zero, 1)))
    return torch.remainder(a, b)  # the remainder takes the divisor's sign, as in Python


def _bitwise(bool_fn: Callable, int_fn: Callable) -> Callable:
    return lambda a, b: bool_fn(a, b) if a.dtype == torch.bool else int_fn(a, b)


_BINARY: dict[BinaryOp, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    BinaryOp.ADD: torch.add,
    BinaryOp.SUB: torch.sub,
    BinaryOp.MUL: torch.mul,
    BinaryOp.TRUEDIV: torch.div,
    BinaryOp.FLOORDIV: _floordiv,
    BinaryOp.MOD: _mod,
    BinaryOp.MIN: torch.minimum,
    BinaryOp.MAX: torch.maximum,
    BinaryOp.AND: _bitwise(torch.logical_and, torch.bitwise_and),
    BinaryOp.OR: _bitwise(torch.logical_or, torch.bitwise_or),
    BinaryOp.XOR: _bitwise(torch.logical_xor, torch.bitwise_xor),
    BinaryOp.SHL: torch.bitwise_left_shift,
    BinaryOp.SHR: torch.bitwise_right_shift,  # arithmetic on signed ints, as shr.s32
}


@rule(OpKind.BINARY)
def _binary(op: Op, env: Env, ctx: _Context) -> None:
    a = env[op.operands[0].id]
    b = env[op.operands[1].id]
    out = _BINARY[op.attrs.op](_widen(a), _widen(b))
    env[op.results[0].id] = _as_dtype(out, a.dtype)


def _not(x: torch.Tensor) -> torch.Tensor:
    return torch.logical_not(x) if x.dtype == torch.bool else torch.bitwise_not(x)


_UNARY: dict[UnaryOp, Callable[[torch.Tensor], torch.Tensor]] = {
    UnaryOp.NEG: torch.neg,
    UnaryOp.NOT: _not,
    UnaryOp.EXP: torch.exp,
    UnaryOp.EXP2: torch.exp2,
    UnaryOp.LOG: torch.log,
    UnaryOp.SQRT: torch.sqrt,
    UnaryOp.RSQRT: torch.rsqrt,
    UnaryOp.ABS: torch.abs,
    UnaryOp.LOG2: torch.log2,
    UnaryOp.SIN: torch.sin,
    UnaryOp.COS: torch.cos,
    UnaryOp.TANH: torch.tanh,
    UnaryOp.ERF: torch.erf,
    UnaryOp.SIGMOID: torch.sigmoid,
}


@rule(OpKind.UNARY)
def _unary(op: Op, env: Env, ctx: _Context) -> None:
    x = env[op.operands[0].id]
    env[op.results[0].id] = _as_dtype(_UNARY[op.attrs.op](_widen(x)), x.dtype)


@rule(OpKind.FMA)
def _fma(op: Op, env: Env, ctx: _Context) -> None:
    # float32 (and 16-bit) operands: the product is exact in float64, so one float64 sum rounded to the dtype
    # is the fused result (up to a double rounding on exact ties); float64 operands: torch.addcmul.
    a, b, c = (env[v.id] for v in op.operands)
    if a.dtype == torch.float64:
        out = torch.addcmul(c, a, b)
    else:
        out = (a.double() * b.double() + c.double()).float()
    env[op.results[0].id] = _as_dtype(out, a.dtype)


_COMPARE = {
    CompareOp.LT: torch.lt, CompareOp.LE: torch.le, CompareOp.GT: torch.gt,
    CompareOp.GE: torch.ge, CompareOp.EQ: torch.eq, CompareOp.NE: torch.ne,
}


@rule(OpKind.COMPARE)
def _compare(op: Op, env: Env, ctx: _Context) -> None:
    a = env[op.operands[0].id]
    b = env[op.operands[1].id]
    env[op.results[0].id] = _COMPARE[op.attrs.op](_widen(a), _widen(b))


@rule(OpKind.SELECT)
def _select(op: Op, env: Env, ctx: _Context) -> None:
    cond, x, y = (env[v.id] for v in op.operands)
    env[op.results[0].id] = _as_dtype(torch.where(cond, _widen(x), _widen(y)), x.dtype)


@rule(OpKind.CAST)
def _cast(op: Op, env: Env, ctx: _Context) -> None:
    x = env[op.operands[0].id]
    target: DType = op.attrs.dtype
    if target.is_bool:
        out = _widen(x) != 0
    elif target.is_integer and x.is_floating_point():
        # truncate toward zero, saturating like cvt.rzi.sat: NaN -> 0, out of range -> the nearest bound
        info = torch.iinfo(_TORCH[target])
        wide = torch.nan_to_num(x.double().trunc(), nan=0.0)
        out = wide.clamp(info.min, info.max).to(_TORCH[target])
        if info.max >= 2 ** 53:  # int64's max rounds up to 2**63 as a double, which would wrap to its min
            out = torch.where(wide >= float(info.max), torch.tensor(info.max, dtype=out.dtype), out)
    elif target.is_fp8:
        # via float32 (torch converts to fp8 only from wider floats), saturating as cvt.rn.satfinite does (torch's
        # e5m2 overflows to inf; its e4m3fn saturates already)
        big = torch.finfo(_TORCH[target]).max
        out = x.float().clamp(-big, big).to(_TORCH[target])
    else:
        out = x.to(_TORCH[target])
    env[op.results[0].id] = out


# -- tile creation and shape -----------------------------------------------------------------------

@rule(OpKind.SPLAT)
def _splat(op: Op, env: Env, ctx: _Context) -> None:
    # Values are never written in place, so a broadcast view of the 0-d scalar is a valid tile.
    env[op.results[0].id] = env[op.operands[0].id].expand(op.attrs.shape)


@rule(OpKind.ARANGE)
def _arange(op: Op, env: Env, ctx: _Context) -> None:
    value = ctx.constants.get(id(op))
    if value is None:
        value = ctx.constants[id(op)] = torch.arange(op.attrs.start, op.attrs.end, dtype=torch.int32)
    env[op.results[0].id] = value


@rule(OpKind.EXPAND_DIMS)
def _expand_dims(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = env[op.operands[0].id].unsqueeze(op.attrs.axis)


@rule(OpKind.BROADCAST)
def _broadcast(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = env[op.operands[0].id].expand(op.attrs.shape)


@rule(OpKind.TRANSPOSE)
def _transpose(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = env[op.operands[0].id].permute(op.attrs.perm)


@rule(OpKind.TRANSPOSE_COPY)
def _transpose_copy(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = env[op.operands[0].id].permute((1, 0))


@rule(OpKind.CONVERT_LAYOUT)
def _convert_layout(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = env[op.operands[0].id]


# Split-K ops exist only after the split-K pass; the interpreter runs frontend IR, where a program is the whole
# cluster: it is split 0 and its partial sum is already the total.
@rule(OpKind.SPLIT_INDEX)
def _split_index(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = torch.tensor(0, dtype=torch.int32)


@rule(OpKind.SPLIT_REDUCE)
def _split_reduce(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = env[op.operands[0].id]


# Stream-K ops likewise: the interpreter's program runs its tile's whole K loop (iterations 0 to "no end": the
# pass caps the loop's bound at the original one) and its sum needs no fix-up.
@rule(OpKind.STREAM_K_BOUND)
def _stream_k_bound(op: Op, env: Env, ctx: _Context) -> None:
    env[op.results[0].id] = torch.tensor(2**31 - 1 if op.attrs.end else 0, dtype=torch.int32)


@rule(OpKind.STREAM_K_FIXUP)
def _stream_k_fixup(op: Op, env: Env, ctx: _Context) -> None:
    for operand, result in zip(op.operands, op.results):
        env[result.id] = env[operand.id]
    env[op.results[-1].id] = torch.tensor(True)


# -- reductions and matrix products ----------------------------------------------------------------

@rule(OpKind.REDUCE)
def _reduce(op: Op, env: Env, ctx: _Context) -> None:
    x = env[op.operands[0].id]
    axis = op.attrs.axis
    kind = op.attrs.kind
    out_dtype = _TORCH[op.result.type.dtype]
    if kind is ReduceKind.SUM:
        out = _widen(x).sum(axis, dtype=_COMPUTE_DTYPE.get(out_dtype, out_dtype))
    elif x.dtype == torch.bool:
        out = x.any(axis) if kind is ReduceKind.MAX else x.all(axis)
    else:
        out = (_widen(x).amax if kind is ReduceKind.MAX else _widen(x).amin)(axis)
    env[op.results[0].id] = _as_dtype(out, out_dtype)


@rule(OpKind.SCAN)
def _scan(op: Op, env: Env, ctx: _Context) -> None:
    # a sequential sum along the axis, like the generated code's per-line loop
    # (torch.cumsum accumulates float32 in float64 on the CPU: step by step instead, in the dtype)
    x = env[op.operands[0].id].movedim(op.attrs.axis, 0)
    out = torch.empty_like(x)
    acc = torch.zeros_like(x[0])
    for j in range(x.shape[0]):
        acc = acc + x[j]
        out[j] = acc
    env[op.results[0].id] = out.movedim(0, op.attrs.axis)


@rule(OpKind.GEMM)
def _gemm(op: Op, env: Env, ctx: _Context) -> None:
    a, b, acc = (env[v.id] for v in op.operands[:3])
    if op.attrs.transpose_a:
        a = a.T
    if op.attrs.transpose_b:
        b = b.T
    if is_block_scaled(op):
        # e8m0 scales (2^(e - 127)) over their 32 elements of K: exact products, float32 sums
        sa, sb = (env[v.id].float().repeat_interleave(MX_BLOCK, 1) for v in op.operands[3:])
        out = acc + (a.float() * sa) @ (b.float() * sb.T)
    elif acc.dtype == torch.int32:
        # int8 x int8 products summed in float64 are exact for any K below 2^39
        product = (a.double() @ b.double()).to(torch.int64)
        out = (acc.to(torch.int64) + product).to(torch.int32)
    elif acc.dtype == torch.float16:
        out = _f16_accumulate(acc, a, b)
    elif op.attrs.precision == "fast":
        out = _fp8_fast_accumulate(acc, a, b)
    else:
        compute = acc.dtype  # float32, or float64 for float64 operands
        if op.attrs.precision == "tf32":  # the tensor cores read the upper 19 bits of each float32
            a, b = _truncate_to_tf32(a), _truncate_to_tf32(b)
        out = acc.to(compute) + a.to(compute) @ b.to(compute)
    env[op.results[0].id] = out


#: K values per tensor-core instruction step of float16 operands (mma.sync m16n8k16, wgmma k16, tcgen05
#: kind::f16): a float16 accumulator is rounded once per step.
F16_ACC_K_STEP = 16


def _f16_accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc + a @ b`` with a float16 accumulator: each 16-wide k step's products (exact in float32) summed in
    float32, added to the accumulator and rounded to float16, step after step."""
    out = acc
    a, b = a.float(), b.float()
    for k0 in range(0, a.shape[1], F16_ACC_K_STEP):
        step = a[:, k0:k0 + F16_ACC_K_STEP] @ b[k0:k0 + F16_ACC_K_STEP]
        out = (out.float() + step).to(torch.float16)
    return out


#: K values per wgmma step of float8 operands (m64nNk32): the unit of the fast accumulator's rounding.
FP8_ACC_K_STEP = 32
#: Bits the fast float8 accumulator keeps below each step's leading bit (DeepSeek-V3, section 3.5.2: "the highest
#: 14 bits of each mantissa product"; SageAttention2 found the result held with 13 explicit mantissa bits).
FP8_FAST_ACC_BITS = 14


def _fp8_fast_accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc + a @ b`` as a float8 gemm with precision "fast" sums on sm_90a's wgmma (the tensor cores' own
    accumulator for the whole K). Per 32-wide k step, the accumulator and the 32 products (exact in float64) are
    aligned to the largest exponent among them and each truncated toward -inf below ``FP8_FAST_ACC_BITS`` bits
    of it (fixed-point sum, exact), and the sum is truncated toward zero to ``FP8_FAST_ACC_BITS`` significant
    bits. A model, not a bit-exact copy: each step loses less than 34 units of 2**-13 of its largest term, and on
    random e4m3 inputs its error matches the H100's (0.00214 against 0.00213 measured, K = 4096, bf16 out)."""
    out = acc.double()
    a, b = a.double(), b.double()
    for k0 in range(0, a.shape[1], FP8_ACC_K_STEP):
        terms = torch.cat([out[..., None], a[:, None, k0:k0 + FP8_ACC_K_STEP] * b.T[None, :, k0:k0 + FP8_ACC_K_STEP]],
                          dim=-1)
        _, exponent = torch.frexp(terms.abs().amax(dim=-1, keepdim=True))  # largest = m * 2**exponent, m in [0.5, 1)
        quantum = torch.ldexp(torch.ones_like(terms[..., :1]), exponent - FP8_FAST_ACC_BITS)
        total = (torch.trunc(terms / quantum) * quantum).sum(dim=-1)
        mantissa, exponent = torch.frexp(total)
        out = torch.ldexp(torch.trunc(torch.ldexp(mantissa, torch.full_like(exponent, FP8_FAST_ACC_BITS))),
                          exponent - FP8_FAST_ACC_BITS)
    return out.to(acc.dtype)


def _truncate_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 values with the 13 low mantissa bits cleared, as a tf32 tensor-core operand sees them."""
    return (x.contiguous().view(torch.int32) & -8192).view(torch.float32)


# -- global memory ---------------------------------------------------------------------------------

def _window(op: Op, env: Env, tensor: torch.Tensor, first_start: int):
    """(tensor index, tile index) of the in-bounds part of the op's window, or None when it is empty."""
    shape = op.attrs.shape
    dropped = op.attrs.dropped
    src: list[Any] = []
    dst: list[slice] = []
    clipped = False
    for d, (v, n) in enumerate(zip(op.operands[first_start:], shape)):
        start = int(env[v.id])
        size = tensor.shape[d]
        lo = max(start, 0)
        hi = min(start + n, size)
        if hi <= lo:
            return None
        if d in dropped:
            src.append(start)
            continue
        src.append(slice(lo, hi))
        if lo != start or hi != start + n:
            clipped = True
        dst.append(slice(lo - start, hi - start))
    return tuple(src), (tuple(dst) if clipped else None)


@rule(OpKind.LOAD)
def _load(op: Op, env: Env, ctx: _Context) -> None:
    tensor = env[op.operands[0].id]
    tile_shape = op.attrs.tile_shape  # () for one element (X[i, j]): a 0-d scalar
    window = _window(op, env, tensor, 1)
    if window is None:
        out = torch.zeros(tile_shape, dtype=tensor.dtype)
    else:
        src, dst = window
        if dst is None:
            out = tensor[src].clone(memory_format=torch.contiguous_format)  # a copy: later stores must not show
        else:
            out = torch.zeros(tile_shape, dtype=tensor.dtype)
            out[dst] = tensor[src]
    env[op.results[0].id] = out


@rule(OpKind.STORE)
def _store(op: Op, env: Env, ctx: _Context) -> None:
    tensor = env[op.operands[0].id]
    value = env[op.operands[1].id]
    window = _window(op, env, tensor, 2)
    if window is None:
        return
    src, dst = window
    view = tensor[src]
    ctx.undo.append((view, view.clone()))
    view.copy_(value if dst is None else value[dst])


@rule(OpKind.BOUNDED)
def _bounded(op: Op, env: Env, ctx: _Context) -> None:
    tensor = env[op.operands[0].id]
    cut = tuple(slice(0, max(0, min(int(env[v.id]), n))) for v, n in zip(op.operands[1:], tensor.shape))
    env[op.results[0].id] = tensor[cut]  # a view: stores through it reach the argument


# -- gathers, scatters and atomics: element coordinates ----------------------------------------------

def _element_coords(attrs: Any, tensor: torch.Tensor, starts: list[torch.Tensor], index: torch.Tensor | None):
    """Per tensor dim, the coordinate of every tile element (int64 tensors of the tile's shape), and the mask of
    elements inside the tensor."""
    tile_shape = attrs.tile_shape
    axis = getattr(attrs, "axis", None)
    coords = []
    k = 0
    for d in range(tensor.dim()):
        start = int(starts[d])
        if d in attrs.dropped:
            c = torch.full(tile_shape, start, dtype=torch.int64)
        elif d == axis:
            c = index.to(torch.int64)
            k += 1
        else:
            n = attrs.shape[d]
            view = [1] * len(tile_shape)
            view[k] = n
            c = (torch.arange(n, dtype=torch.int64) + start).reshape(view).expand(tile_shape)
            k += 1
        coords.append(c)
    mask = torch.ones(tile_shape, dtype=torch.bool)
    for d, c in enumerate(coords):
        mask &= (c >= 0) & (c < tensor.shape[d])
    return coords, mask


class _IndexedUndo:
    """Undo-log entry for writes through advanced indexing (no view to restore into)."""

    def __init__(self, tensor: torch.Tensor, where: tuple) -> None:
        self.tensor, self.where = tensor, where

    def copy_(self, old: torch.Tensor) -> None:
        self.tensor[self.where] = old


@rule(OpKind.GATHER)
def _gather(op: Op, env: Env, ctx: _Context) -> None:
    tensor = env[op.operands[0].id]
    coords, mask = _element_coords(op.attrs, tensor, [env[v.id] for v in op.operands[2:]], env[op.operands[1].id])
    out = torch.zeros(op.attrs.tile_shape, dtype=tensor.dtype)
    out[mask] = tensor[tuple(c[mask] for c in coords)]
    env[op.results[0].id] = out


@rule(OpKind.SCATTER)
def _scatter(op: Op, env: Env, ctx: _Context) -> None:
    tensor = env[op.operands[0].id]
    value = env[op.operands[1].id]
    coords, mask = _element_coords(op.attrs, tensor, [env[v.id] for v in op.operands[3:]], env[op.operands[2].id])
    where = tuple(c[mask] for c in coords)
    ctx.undo.append((_IndexedUndo(tensor, where), tensor[where].clone()))
    for i, v in zip(zip(*(w.tolist() for w in where)), value[mask].tolist()):  # in order: the last write wins
        tensor[i] = v


def _atomic_update(kind: AtomicOp, old: torch.Tensor, val: torch.Tensor, cmp: torch.Tensor | None) -> torch.Tensor:
    if kind is AtomicOp.ADD:
        return old + val
    if kind is AtomicOp.MAX:
        return torch.maximum(old, val)
    if kind is AtomicOp.MIN:
        return torch.minimum(old, val)
    if kind is AtomicOp.XCHG:
        return val.clone()
    return torch.where(_same_bits(old, cmp), val, old)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bitwise equality, as atom.cas compares (NaN equals NaN of the same bits; -0.0 differs from 0.0)."""
    if a.is_floating_point():
        view = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
                torch.bfloat16: torch.int16}[a.dtype]
        return a.contiguous().view(view) == b.contiguous().view(view)
    return a == b


@rule(OpKind.ATOMIC)
def _atomic(op: Op, env: Env, ctx: _Context) -> None:
    a = op.attrs
    tensor = env[op.operands[0].id]
    val = env[op.operands[1].id]
    cmp = env[op.operands[2].id] if a.op is AtomicOp.CAS else None
    index = env[op.operands[a.index_operand].id] if a.index_operand is not None else None
    coords, mask = _element_coords(a, tensor, [env[v.id] for v in op.operands[a.first_start:]], index)
    where = tuple(c[mask] for c in coords)
    old = torch.zeros(a.tile_shape, dtype=tensor.dtype)
    ctx.undo.append((_IndexedUndo(tensor, where), tensor[where].clone()))
    vals = val.expand(a.tile_shape)[mask]
    cmps = cmp.expand(a.tile_shape)[mask] if cmp is not None else None
    flat = sum(w * tensor.stride(d) for d, w in enumerate(where)) if where else torch.zeros(0, dtype=torch.int64)
    if flat.numel() == torch.unique(flat).numel():  # no element twice: one vectorized read-modify-write
        current = tensor[where].clone()
        tensor[where] = _atomic_update(a.op, current, vals, cmps)
        old[mask] = current
        env[op.results[0].id] = old
        return
    olds = []
    for n, i in enumerate(zip(*(w.tolist() for w in where))):  # duplicates: one after the other
        current = tensor[i].clone()
        tensor[i] = _atomic_update(a.op, current, vals[n], cmps[n] if cmps is not None else None)
        olds.append(current)
    old[mask] = torch.stack(olds) if olds else old[mask]
    env[op.results[0].id] = old


# -- control flow ----------------------------------------------------------------------------------

@rule(OpKind.FOR)
def _for(op: Op, env: Env, ctx: _Context) -> None:
    lo, hi, step = (int(env[v.id]) for v in op.operands[:3])
    carried = [env[v.id] for v in op.operands[3:]]
    if step == 0:
        raise InterpreterError("loop step is zero at run time", op, ctx.program)
    body = op.regions[0]
    iv_arg, *carried_args = body.args
    iv_dtype = iv_arg.type.dtype
    iv = lo
    while (step > 0 and iv < hi) or (step < 0 and iv > hi):
        env[iv_arg.id] = _scalar(iv, iv_dtype)
        for arg, value in zip(carried_args, carried):
            env[arg.id] = value
        carried = _run_block(body, env, ctx)
        iv += step
    for result, value in zip(op.results, carried):
        env[result.id] = value


@rule(OpKind.WHILE)
def _while(op: Op, env: Env, ctx: _Context) -> None:
    cond_block, body = op.regions
    carried = [env[v.id] for v in op.operands]
    while True:
        for arg, value in zip(cond_block.args, carried):
            env[arg.id] = value
        (cond,) = _run_block(cond_block, env, ctx)
        if not bool(cond):
            break
        for arg, value in zip(body.args, carried):
            env[arg.id] = value
        carried = _run_block(body, env, ctx)
    for result, value in zip(op.results, carried):
        env[result.id] = value


@rule(OpKind.IF)
def _if(op: Op, env: Env, ctx: _Context) -> None:
    taken = op.regions[0] if bool(env[op.operands[0].id]) else op.regions[1]
    for result, value in zip(op.results, _run_block(taken, env, ctx)):
        env[result.id] = value


@rule(OpKind.YIELD)
def _yield(op: Op, env: Env, ctx: _Context) -> None:
    raise InterpreterError("tj.yield must be the last op of a for/if region", op, ctx.program)
