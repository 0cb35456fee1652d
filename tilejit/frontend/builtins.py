"""The ``T.<name>`` builtins a kernel may call, each declared once beside its handler.

``@builtin("name")`` puts a handler in :data:`BUILTINS`, the one table the frontend's call dispatch reads. A
handler takes the code generator, the call's AST node and the call's evaluated arguments, and returns what the
call evaluates to (an IR value, a Python constant, or None). ``tilejit.language`` holds the user-facing stubs
with the same names; ``tests/frontend/test_frontend_builtins.py`` checks the two agree.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Any, Callable

from .. import dtypes as D
from ..ir import AtomicOp, AxisAttrs, BinaryOp, MultipleOf, NoAttrs, OpKind, ReduceKind, ScalarType, UnaryOp, Value
from ..ir.rewrite import int_constant
from .microscaled import is_microscaled, microscaled_gemm
from .semantic import SemanticError, describe, is_const

Handler = Callable[..., Any]
BUILTINS: dict[str, Handler] = {}


def builtin(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for name in names:
            if name in BUILTINS:
                raise ValueError(f"T.{name} has two handlers")
            BUILTINS[name] = fn
        return fn
    return register


def _grid_query(gen, node, kind: OpKind, axis: Any) -> Value:
    if type(axis) is not int or axis not in (0, 1, 2):  # (not 0.0 or True: the axis is an int)
        raise gen.error(node, f"grid axis must be 0, 1 or 2, got {axis!r}")
    return gen.b.create1(kind, [], ScalarType(D.int32), AxisAttrs(axis))


@builtin("program_id")
def builtin_program_id(gen, node, axis=0):
    return _grid_query(gen, node, OpKind.PROGRAM_ID, axis)


@builtin("num_programs")
def builtin_num_programs(gen, node, axis=0):
    return _grid_query(gen, node, OpKind.NUM_PROGRAMS, axis)


@builtin("cdiv")
def builtin_cdiv(gen, node, a, b):
    if is_const(a) and is_const(b):
        return -(-a // b)
    return gen.sem.binary(BinaryOp.FLOORDIV, gen.sem.binary(BinaryOp.ADD, a, gen.sem.binary(BinaryOp.SUB, b, 1)), b)


@builtin("arange")
def builtin_arange(gen, node, start, end=None):
    return gen.sem.arange(start, end)


@builtin("zeros")
def builtin_zeros(gen, node, shape, dtype=D.float32):
    return gen.sem.full(shape, 0, dtype)


@builtin("full")
def builtin_full(gen, node, shape, value, dtype=None):
    if dtype is None:
        dtype = value.dtype if isinstance(value, Value) else (D.float32 if isinstance(value, float) else D.int32)
    return gen.sem.full(shape, value, dtype)


@builtin("where")
def builtin_where(gen, node, condition, x, y):
    return gen.sem.where(condition, x, y)


@builtin("maximum")
def builtin_maximum(gen, node, x, y):
    return gen.sem.binary(BinaryOp.MAX, x, y)


@builtin("minimum")
def builtin_minimum(gen, node, x, y):
    return gen.sem.binary(BinaryOp.MIN, x, y)


def python_minmax(gen, node, is_max: bool, args: list) -> Any:
    """Python's ``min``/``max`` in a kernel: folded on constants, elementwise minimum/maximum otherwise."""
    if len(args) == 1 and isinstance(args[0], tuple):
        args = list(args[0])
    if len(args) < 2:
        raise gen.error(node, "min()/max() need at least two values")
    result = args[0]
    for a in args[1:]:
        result = gen.sem.binary(BinaryOp.MAX if is_max else BinaryOp.MIN, result, a)
    return result


@builtin("gemm")
def builtin_gemm(gen, node, a, b, acc, transpose_a=False, transpose_b=False, precision=None, out_dtype=None,
                 scale_a=None, scale_b=None):
    if not (is_const(transpose_a) and is_const(transpose_b)):
        raise gen.error(node, "transpose_a/transpose_b must be compile-time bools")
    if precision is not None and not isinstance(precision, str):
        raise gen.error(node, "precision must be a compile-time string: \"tf32\", \"tf32x3\" or \"ieee\" "
                              "(float32 operands), \"precise\" or \"fast\" (float8 operands)")
    if out_dtype is not None and not isinstance(out_dtype, D.DType):
        raise gen.error(node, f"out_dtype must be a dtype such as T.float32 or T.float16, got {describe(out_dtype)}")
    if is_microscaled(scale_a, scale_b):  # e8m0 scales: the microscaled (MX) form
        return microscaled_gemm(gen.sem, a, b, acc, bool(transpose_a), bool(transpose_b), precision, out_dtype,
                                scale_a, scale_b)
    return gen.sem.gemm(a, b, acc, bool(transpose_a), bool(transpose_b), precision, out_dtype, scale_a, scale_b)


@builtin("copy")
def builtin_copy(gen, node: ast.Call) -> None:
    """``T.copy(src, dst_slice)``: takes the AST (its destination is a slice to store to, not a value)."""
    if len(node.args) != 2 or node.keywords:
        raise gen.error(node, "T.copy takes two arguments: T.copy(src, dst_slice)")
    src = gen.visit(node.args[0])
    dst = node.args[1]
    if not isinstance(dst, ast.Subscript):
        raise gen.error(dst, "the destination of T.copy must be a tensor slice such as C[m0:m0 + BM, n0:n0 + BN]")
    gen.store(gen.tensor_window(dst), src, node)


builtin_copy.takes_ast = True  # the call dispatch passes the node alone, before evaluating arguments


def _atomic(op: AtomicOp) -> Handler:
    """``T.atomic_<op>(X[window], value[, val], sem=, scope=)``: takes the AST, since the first argument is a
    tensor window to update, not a value to load."""
    params = ["cmp", "val"] if op is AtomicOp.CAS else ["val"]
    usage = f"T.atomic_{op.value}(X[...], {', '.join(params)}, sem='acq_rel', scope='gpu')"

    def handler(gen, node: ast.Call):
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise gen.error(node, f"*args and **kwargs are not supported in {usage}")
        names = ["pointer", *params, "sem", "scope"]
        given = dict(zip(names, node.args))
        if len(node.args) > len(names):
            raise gen.error(node, f"too many arguments: {usage}")
        for k in node.keywords:
            if k.arg not in names or k.arg in given:
                raise gen.error(node, f"unexpected or repeated argument '{k.arg}': {usage}")
            given[k.arg] = k.value
        missing = [n for n in ["pointer", *params] if n not in given]
        if missing:
            raise gen.error(node, f"missing {', '.join(missing)}: {usage}")
        target = given["pointer"]
        if not isinstance(target, ast.Subscript):
            raise gen.error(target, f"the first argument of T.atomic_{op.value} must be a tensor window such as "
                                    "C[m0:m0 + BM, n0:n0 + BN] or C[i]")
        w = gen.tensor_window(target)
        values = {n: gen.visit(given[n]) for n in params}
        options = {n: gen.visit(given[n]) if n in given else default
                   for n, default in (("sem", "acq_rel"), ("scope", "gpu"))}
        node_of = {"sem": given.get("sem", node), "scope": given.get("scope", node)}
        for n, v in options.items():
            if not isinstance(v, str):
                raise gen.error(node_of[n], f"{n}= must be a compile-time string, got {v!r}")
        try:
            return gen.sem.atomic(op, w.tensor.value, w.starts, w.lengths, w.dropped, w.axis, w.index,
                                  values["val"], values.get("cmp"), options["sem"], options["scope"])
        except SemanticError as e:
            at = node_of["sem"] if "sem must" in str(e) else node_of["scope"] if "scope must" in str(e) else node
            raise gen.error(at, str(e), e.hint) from None

    handler.__name__ = handler.__qualname__ = f"builtin_atomic_{op.value}"
    handler.takes_ast = True
    return handler


for _aop in AtomicOp:
    builtin(f"atomic_{_aop.value}")(_atomic(_aop))


def _unary(op: UnaryOp) -> Handler:
    def handler(gen, node, x):
        return gen.sem.unary(op, x)
    handler.__name__ = handler.__qualname__ = f"builtin_{op.value}"  # named in argument errors
    return handler


def _reduce(kind: ReduceKind) -> Handler:
    def handler(gen, node, x, axis=None):
        return gen.sem.reduce(x, axis, kind)
    handler.__name__ = handler.__qualname__ = f"builtin_{kind.value}"
    return handler


@builtin("bounded")
def builtin_bounded(gen, node, tensor, extents):
    """``T.bounded(C, (M, N))``: a view of tensor argument ``C`` whose valid region is ``min(C.shape[d], extents[d])``
    along each dim; loads, stores, gathers, scatters and atomics through it treat the rest as out of bounds."""
    if not (isinstance(getattr(tensor, "value", None), Value) and tensor.value.is_tensor):  # a TensorArg
        raise gen.error(node, f"T.bounded needs a tensor argument, got {describe(tensor)}")
    extents = extents if isinstance(extents, tuple) else (extents,)
    rank = len(tensor.shape)
    if len(extents) != rank:
        raise gen.error(node, f"T.bounded of the rank-{rank} tensor '{tensor.name}' needs {rank} "
                              f"extent{'s' if rank != 1 else ''}, got {len(extents)}", "pass one extent per dim, e.g. T.bounded(C, (M, N))")
    values = []
    for e in extents:
        if isinstance(e, bool) or not (isinstance(e, int) or isinstance(e, Value) and e.is_scalar
                                       and e.dtype.is_integer):
            raise gen.error(node, f"T.bounded extents must be integers, got {describe(e)}")
        values.append(gen.sem.cast(e, D.int64))
    view = gen.b.create1(OpKind.BOUNDED, [tensor.value, *values], tensor.value.type, NoAttrs())
    view.name = tensor.value.name  # the argument's specialization (alignment, unit strides) still applies
    return dataclasses.replace(tensor, value=view, shape=tuple(extents))


def _hint_values(gen, node, x, values) -> tuple[int, ...]:
    """The checked arguments of a hint: ``values`` as a tuple of positive ints, for an integer ``x``."""
    vals = values if isinstance(values, tuple) else (values,)
    if not vals or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in vals):
        raise gen.error(node, f"the hint needs a positive compile-time int (or a tuple of them), got {values!r}")
    if not (isinstance(x, Value) and x.dtype.is_integer or isinstance(x, int) and not isinstance(x, bool)):
        raise gen.error(node, f"hints apply to integer scalars or tiles, got {x!r}")
    rank = x.type.rank if isinstance(x, Value) and x.is_tile else 0
    if len(vals) != 1 and len(vals) != rank:
        what = f"a rank-{rank} tile" if rank else "a scalar"
        raise gen.error(node, f"the hint gives {len(vals)} values for {what}",
                        f"give one int{f' or {rank}, one per dim' if rank else ''}")
    return vals * rank if rank and len(vals) == 1 else vals


@builtin("multiple_of")
def builtin_multiple_of(gen, node, x, values):
    """``T.multiple_of(x, n)``: records the promise on ``x`` itself (``Value.multiple_of``; every use of ``x``
    sees it) and returns ``x``. A compile-time constant is checked instead."""
    vals = _hint_values(gen, node, x, values)
    known = int_constant(x) if isinstance(x, Value) and x.is_scalar else x  # (an int argument equal to 1 too)
    if known is not None and not isinstance(known, Value):
        if known % vals[0]:
            raise gen.error(node, f"T.multiple_of: {known} is not a multiple of {vals[0]}")
        return x
    x.multiple_of = MultipleOf(vals).merged(x.multiple_of)
    return x


@builtin("max_contiguous")
def builtin_max_contiguous(gen, node, x, values):
    """``T.max_contiguous(x, n)``: checked, then ``x`` unchanged. Slices already tell the compiler which accesses
    are contiguous, and gathers and scatters access element by element, so nothing would read the promise."""
    _hint_values(gen, node, x, values)
    return x


@builtin("fma")
def builtin_fma(gen, node, a, b, c):
    return gen.sem.fma(a, b, c)


@builtin("cumsum")
def builtin_cumsum(gen, node, x, axis=0):
    return gen.sem.cumsum(x, axis)


for _op in (UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.LOG, UnaryOp.SQRT, UnaryOp.RSQRT, UnaryOp.ABS, UnaryOp.LOG2,
            UnaryOp.SIN, UnaryOp.COS, UnaryOp.TANH, UnaryOp.ERF, UnaryOp.SIGMOID):
    builtin(_op.value)(_unary(_op))
for _kind in (ReduceKind.SUM, ReduceKind.MAX, ReduceKind.MIN):
    builtin(_kind.value)(_reduce(_kind))
