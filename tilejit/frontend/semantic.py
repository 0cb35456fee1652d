"""Typing, promotion and broadcasting rules of the language, and the IR they build.

The rules, in one place:

* **Operands** are IR values (scalars or tiles) or Python constants (``int``, ``float``, ``bool``).
  Two Python constants fold at compile time with Python's own semantics.
* **Dtype promotion** (``promote``): equal dtypes stay; ``bool`` yields to the other; two floats take
  the wider, and two different floats of one width (f16/bf16, e4m3/e5m2) meet at ``float32``; a float
  beats an integer; two integers take the wider (signed wins at equal width). Arithmetic (``+ - * // %``)
  on bools alone (or bools and int constants) is on ``int32``, as Python counts ``True + 1 == 2``; bitwise
  ``& | ^`` keep ``bool``.
* **Python constants are weak**: next to a typed value they take that value's dtype (an ``int`` or
  ``float`` next to a ``float16`` tile is a ``float16`` constant); a ``float`` next to an integer value
  makes both ``float32``. A constant alone is ``int32`` (``int64`` if it does not fit), ``float32`` or
  ``bool``.
* **Broadcasting** follows NumPy: shapes are aligned on the right, missing leading dims are added, and a
  dim of 1 stretches to the other's length; a scalar stretches to any tile. The IR only ever sees
  operands of one shape: this module inserts ``splat``, ``expand_dims`` and ``broadcast``.
* ``/`` is true division (integers become ``float32``); ``//`` and ``%`` are integer-only and follow
  Python (floor toward -inf; the remainder takes the divisor's sign). Comparisons give ``bool``.
* ``a @ b`` on f16/bf16/fp8 tiles returns ``float32`` (int8: ``int32``), both operands of one dtype;
  ``T.gemm(..., out_dtype=T.float16)`` accumulates f16 operands in ``float16``. 3-D tiles (Bt, M, K) @
  (Bt, K, N) are Bt 2-D products; ``T.sum(a[:, :, None] * b[None, :, :], 1)`` is built as ``a @ b``.
* ``T.sum`` of 8/16-bit floats returns ``float32``, of ``bool``/8/16-bit ints ``int32``; ``max``/``min``
  keep the dtype. Reducing the last remaining axis gives a scalar.
* A cast ``x.to(dtype)`` rounds to nearest even between floats, truncates toward zero from float to
  int, and maps non-zero to ``True`` for ``bool``.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Sequence

from .. import dtypes as D
from ..dtypes import DType
from ..errors import docs_link
from ..ir.rewrite import defining_op, int_constant
from ..ir import (ATOMIC_SCOPES, ATOMIC_SEMS, AccessAttrs, ArangeAttrs, AtomicAttrs, AtomicOp, AxisAttrs, BinaryAttrs,
                  BinaryOp, Builder, CastAttrs, CompareAttrs, CompareOp, ConstantAttrs, F32_PRECISIONS, FP8_PRECISIONS,
                  GemmAttrs, IndexedAttrs, NoAttrs, OpKind, PermAttrs, gemm_precisions,
                  ReduceAttrs, ReduceKind, ScalarType, ShapeAttrs, TensorListType, TileType, UnaryAttrs, UnaryOp, Value)

PyConst = (bool, int, float)


def _fold_index_arithmetic(op: BinaryOp, a: Value, b: Value) -> int | None:
    """``a op b`` for +, - and * of two integer constant ops, wrapped to their width as the GPU would; None for
    anything else. An int argument equal to 1 enters as such a constant (not a Python int, whose comparisons would
    prune branches and skip their type join), and index arithmetic on it still folds to a constant start."""
    if op not in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL):
        return None
    x, y = int_constant(a), int_constant(b)
    if x is None or y is None or not (a.is_scalar and b.is_scalar):
        return None
    bits = a.dtype.bits
    value = _PY_BINARY[op](x, y) & ((1 << bits) - 1)
    return value - (1 << bits) if a.dtype.kind == "int" and value >> (bits - 1) else value


class SemanticError(Exception):
    """A rule of the language was broken; the frontend adds the source location."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def is_const(x: Any) -> bool:
    return isinstance(x, PyConst)


def describe(x: Any) -> str:
    if isinstance(x, Value):
        return f"{'tile' if x.is_tile else 'scalar'} of type {x.type}"
    value = getattr(x, "value", None)
    if isinstance(value, Value) and isinstance(value.type, TensorListType):  # a tensor-list argument
        name = getattr(x, "name", "?")
        return f"tensor list '{name}' ({value.type}; pick one of its tensors with {name}[g] first)"
    if isinstance(value, Value) and value.is_tensor:  # a tensor argument: load a tile from it first
        return f"tensor '{getattr(x, 'name', '?')}' ({value.type}; load a tile from it with a slice)"
    return f"{type(x).__name__} {x!r}"


_FLOAT_RANK = {8: 0, 16: 1, 32: 2, 64: 3}
#: The widest K of a scaled float8 product summed by the tensor cores' own accumulator before its scaled FMA into
#: float32 (DeepSeek-V3's promotion interval, the precise loop's ``lower_wgmma.PROMOTION_K``).
SCALED_GEMM_K = 128


def promote(a: DType, b: DType) -> DType:
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_floating and b.is_floating:
        if a.bits == b.bits:
            return D.float32 if a.bits <= 32 else a
        return a if _FLOAT_RANK[a.bits] > _FLOAT_RANK[b.bits] else b
    if a.is_floating:
        return a
    if b.is_floating:
        return b
    if a.bits != b.bits:
        return a if a.bits > b.bits else b
    return a if a.kind == "int" else b


def _no_scale_arithmetic(dtype: DType) -> None:
    if dtype.is_scale:
        raise SemanticError(f"arithmetic on {dtype} (e8m0 scale) values is not supported",
                            "convert them first: .to(T.float32) gives 2^(e - 127)")


def _bools_and_ints(x: Any, y: Any) -> bool:
    """Whether a binary operation's operands promote to ``bool``: a bool value, and the other a bool value or a
    (weak) bool or int constant."""
    values = [v for v in (x, y) if isinstance(v, Value)]
    return bool(values) and all(v.dtype.is_bool for v in values) and all(
        isinstance(c, int) for c in (x, y) if not isinstance(c, Value))


def const_dtype(c: Any) -> DType:
    if isinstance(c, bool):
        return D.bool_
    if isinstance(c, int):
        return D.int32 if -2**31 <= c < 2**31 else D.int64
    return D.float32


def _int_fits(c: Any, dtype: DType) -> bool:
    """Whether ``c`` (any value) is not a Python int constant that an integer ``dtype`` would cut: an int fits as a
    signed value or as the bit pattern of an unsigned one (``0xFFFFFFFF`` with int32, ``-1`` with uint8)."""
    if not isinstance(c, int) or isinstance(c, bool) or not dtype.is_integer:
        return True
    return -(1 << dtype.bits - 1) <= c < (1 << dtype.bits)


def _check_int_constant(c: Any, dtype: DType) -> None:
    """A Python int constant taking an integer ``dtype`` must fit it, never be silently cut (``2**40`` as an int32
    would become 0)."""
    if not _int_fits(c, dtype):
        raise SemanticError(f"the constant {c} does not fit {dtype}, the dtype it takes here",
                            f"make the tile wider (x.to(T.int64), T.full(..., T.int64)) or keep the constant "
                            f"within {dtype}'s range")


def shape_of(x: Any) -> tuple[int, ...]:
    return x.type.shape if isinstance(x, Value) and x.is_tile else ()


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da != db and 1 not in (da, db):
            raise SemanticError(f"cannot broadcast shapes {a} and {b}", _broadcast_hint(a, b))
        out.append(max(da, db))
    return tuple(reversed(out))


def _swapped(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two 2-D shapes that are each other's transpose, (64, 32) and (32, 64)."""
    return len(a) == len(b) == 2 and a != b and a == b[::-1]


def _broadcast_hint(a: tuple[int, ...], b: tuple[int, ...]) -> str:
    if _swapped(a, b):  # either transpose makes the shapes agree, with different results: name both
        return (f"the left operand {a} and the right operand {b} are each other's transpose; .T on the one stored "
                f"transposed: the left's .T gives {b} results, the right's .T gives {a} results")
    if len(a) != len(b):
        return (f"use x[:, None] or x[None, :] to add the missing dimension "
                f"({docs_link('broadcasting')})")
    return f"dimensions broadcast when they are equal or one of them is 1 ({docs_link('broadcasting')})"


def _gemm_hint(m: int, k: int, k2: int, n: int, transpose_a: bool, transpose_b: bool,
               acc_shape: tuple[int, ...] | None = None) -> str:
    """How to make an ``(m, k) @ (k2, n)`` product fit. A transpose is prescribed only when it is the one fix that
    gives the accumulator's shape (``acc_shape``, known for ``T.gemm``); otherwise a slice of the wrong length
    is as likely as a transposed operand, so the hint names both operands' shapes and what each transpose gives."""
    fixes = []  # (the product written with a transpose, its T.gemm flag, the result's shape)
    if k == n:
        fixes.append(("a @ b.T", f"transpose_b={not transpose_b}", (m, k2)))
    if m == k2:
        fixes.append(("a.T @ b", f"transpose_a={not transpose_a}", (k, n)))
    if acc_shape is not None:
        fitting = [fix for fix in fixes if fix[2] == tuple(acc_shape)]
        if len(fitting) == 1:
            written, flag, _ = fitting[0]
            return f"b's rows must match a's columns; the operand looks transposed: T.gemm(..., {flag}) ({written})"
    shapes = f"a is {m}x{k} and b is {k2}x{n}: b's rows must match a's columns ({k} != {k2})"
    if not fixes:
        return f"{shapes}; check the slices' lengths ({docs_link('matrix-products')})"
    gives = "; ".join(f"{written} (T.gemm(..., {flag})) gives {r[0]}x{r[1]}" for written, flag, r in fixes)
    return f"{shapes}: fix the slice of the wrong length, or, if an operand is stored transposed, {gives}"


_PY_BINARY = {
    BinaryOp.ADD: operator.add, BinaryOp.SUB: operator.sub, BinaryOp.MUL: operator.mul,
    BinaryOp.TRUEDIV: operator.truediv, BinaryOp.FLOORDIV: operator.floordiv, BinaryOp.MOD: operator.mod,
    BinaryOp.MIN: min, BinaryOp.MAX: max, BinaryOp.AND: operator.and_, BinaryOp.OR: operator.or_,
    BinaryOp.XOR: operator.xor, BinaryOp.SHL: operator.lshift, BinaryOp.SHR: operator.rshift,
}
_PY_COMPARE = {
    CompareOp.LT: operator.lt, CompareOp.LE: operator.le, CompareOp.GT: operator.gt,
    CompareOp.GE: operator.ge, CompareOp.EQ: operator.eq, CompareOp.NE: operator.ne,
}
_PY_UNARY = {
    UnaryOp.NEG: operator.neg, UnaryOp.NOT: operator.not_, UnaryOp.EXP: math.exp, UnaryOp.EXP2: lambda v: 2.0 ** v,
    UnaryOp.LOG: math.log, UnaryOp.SQRT: math.sqrt, UnaryOp.RSQRT: lambda v: 1 / math.sqrt(v), UnaryOp.ABS: abs,
    UnaryOp.LOG2: math.log2, UnaryOp.SIN: math.sin, UnaryOp.COS: math.cos, UnaryOp.TANH: math.tanh,
    UnaryOp.ERF: math.erf, UnaryOp.SIGMOID: lambda v: 1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v)),
}
_INT_ONLY = {BinaryOp.FLOORDIV, BinaryOp.MOD, BinaryOp.SHL, BinaryOp.SHR}
# The arithmetic that counts bools as the ints 0 and 1 (int32), as Python does; & | ^ keep them bools.
_INT_ARITHMETIC_ON_BOOL = {BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.FLOORDIV, BinaryOp.MOD}
_FLOAT_RESULT = {UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.LOG, UnaryOp.SQRT, UnaryOp.RSQRT, UnaryOp.LOG2, UnaryOp.SIN,
                 UnaryOp.COS, UnaryOp.TANH, UnaryOp.ERF, UnaryOp.SIGMOID}


class Semantic:
    """Builds typed IR for the language's operations; raises :class:`SemanticError` on misuse."""

    def __init__(self, builder: Builder) -> None:
        self.b = builder

    # -- scalars and constants -------------------------------------------------------------
    def constant(self, value: Any, dtype: DType | None = None) -> Value:
        dtype = dtype or const_dtype(value)
        if dtype.is_floating:
            value = float(value)
        elif dtype.is_bool:
            value = bool(value)
        else:
            value = int(value)
        return self.b.create1(OpKind.CONSTANT, [], ScalarType(dtype), ConstantAttrs(value))

    def as_value(self, x: Any, dtype: DType | None = None) -> Value:
        if isinstance(x, Value):
            return x
        if is_const(x):
            return self.constant(x, dtype)
        raise SemanticError(f"expected a scalar or tile, got {describe(x)}")

    def cast(self, x: Any, dtype: DType) -> Any:
        if not isinstance(dtype, DType):
            raise SemanticError(f".to() takes a dtype such as T.float16, got {dtype!r}")
        x = self.as_value(x, dtype if is_const(x) else None)
        if x.dtype == dtype:
            return x
        if dtype.is_scale:
            raise SemanticError(f"conversion of {x.dtype} to {dtype} is not supported in a kernel",
                                "e8m0 scales are read and converted to float32 (.to(T.float32)); quantize them on the "
                                "host (torch's .to(torch.float8_e8m0fnu))")
        result_type = TileType(x.type.shape, dtype) if x.is_tile else ScalarType(dtype)
        return self.b.create1(OpKind.CAST, [x], result_type, CastAttrs(dtype))

    # -- shapes ----------------------------------------------------------------------------
    def splat(self, scalar: Value, shape: tuple[int, ...]) -> Value:
        return self.b.create1(OpKind.SPLAT, [scalar], TileType(shape, scalar.dtype), ShapeAttrs(shape))

    def broadcast_to(self, x: Value, shape: tuple[int, ...]) -> Value:
        if x.is_scalar:
            return self.splat(x, shape)
        cur = x.type.shape
        if cur == shape:
            return x
        broadcast_shapes(cur, shape)  # raises if incompatible
        while len(cur) < len(shape):
            x = self.expand_dims(x, 0)
            cur = x.type.shape
        if cur != shape:
            x = self.b.create1(OpKind.BROADCAST, [x], TileType(shape, x.dtype), ShapeAttrs(shape))
        return x

    def expand_dims(self, x: Value, axis: int) -> Value:
        shape = list(x.type.shape)
        shape.insert(axis, 1)
        return self.b.create1(OpKind.EXPAND_DIMS, [x], TileType(tuple(shape), x.dtype), AxisAttrs(axis))

    def transpose(self, x: Value) -> Value:
        if not x.is_tile or x.type.rank != 2:
            raise SemanticError(f".T needs a 2-D tile, got {describe(x)}")
        m, n = x.type.shape
        return self.b.create1(OpKind.TRANSPOSE, [x], TileType((n, m), x.dtype), PermAttrs((1, 0)))

    # -- elementwise -----------------------------------------------------------------------
    def _unify(self, xs: Sequence[Any], dtype: DType | None = None) -> list[Value]:
        """Promote and broadcast operands to one dtype and shape (``dtype`` forces the dtype)."""
        typed = [x for x in xs if isinstance(x, Value)]
        for x in xs:
            if not isinstance(x, Value) and not is_const(x):
                raise SemanticError(f"expected a scalar or tile, got {describe(x)}")
        if dtype is None:
            if typed:
                dtype = typed[0].dtype
                for v in typed[1:]:
                    dtype = promote(dtype, v.dtype)
                # a weak float constant next to integer values makes the operation float32
                if not dtype.is_floating and any(isinstance(x, float) for x in xs):
                    dtype = D.float32
            else:
                dtype = const_dtype(xs[0])
                for c in xs[1:]:
                    dtype = promote(dtype, const_dtype(c))
        if typed and dtype.is_integer:
            for x in xs:  # an int constant that does not fit widens the operation, as Python's ints would
                if not _int_fits(x, dtype):
                    dtype = promote(dtype, const_dtype(x))
            for x in xs:
                _check_int_constant(x, dtype)
        shape: tuple[int, ...] = ()
        for x in typed:
            shape = broadcast_shapes(shape, shape_of(x))
        out = []
        for x in xs:
            v = self.cast(x, dtype)
            if shape:
                v = self.broadcast_to(v, shape)
            out.append(v)
        return out

    def _result_type(self, like: Value, dtype: DType):
        return TileType(like.type.shape, dtype) if like.is_tile else ScalarType(dtype)

    def binary(self, op: BinaryOp, x: Any, y: Any) -> Any:
        if is_const(x) and is_const(y):
            try:
                return _PY_BINARY[op](x, y)
            except ZeroDivisionError:
                raise SemanticError("division by zero in a compile-time expression") from None
        dtype = None
        if op is BinaryOp.TRUEDIV:
            vals = [v for v in (x, y) if isinstance(v, Value)]
            if all(not v.dtype.is_floating for v in vals) and not any(isinstance(v, float) for v in (x, y)):
                dtype = D.float32
        elif op in _INT_ARITHMETIC_ON_BOOL and _bools_and_ints(x, y):
            dtype = D.int32  # (x > 0) + 1 counts, as in Python: a bool constant 1 would make it (x > 0) | True
        a, b = self._unify([x, y], dtype)
        _no_scale_arithmetic(a.dtype)
        if op in _INT_ONLY and not a.dtype.is_integer:
            raise SemanticError(f"operator '{op.value}' needs integer operands, got {a.dtype}",
                                "cast with .to(T.int32) or use '/' for float division")
        if op in (BinaryOp.AND, BinaryOp.OR, BinaryOp.XOR) and a.dtype.is_floating:
            raise SemanticError(f"bitwise '{op.value}' needs integer or bool operands, got {a.dtype}")
        folded = _fold_index_arithmetic(op, a, b)
        if folded is not None:
            return self.constant(folded, a.dtype)
        return self.b.create1(OpKind.BINARY, [a, b], self._result_type(a, a.dtype), BinaryAttrs(op))

    def compare(self, op: CompareOp, x: Any, y: Any) -> Any:
        if is_const(x) and is_const(y):
            return _PY_COMPARE[op](x, y)
        a, b = self._unify([x, y])
        return self.b.create1(OpKind.COMPARE, [a, b], self._result_type(a, D.bool_), CompareAttrs(op))

    def unary(self, op: UnaryOp, x: Any) -> Any:
        if is_const(x):
            try:
                return _PY_UNARY[op](x)
            except (ValueError, ZeroDivisionError) as e:
                raise SemanticError(f"cannot fold {op.value}({x!r}): {e}") from None
        x = self.as_value(x)
        _no_scale_arithmetic(x.dtype)
        if op in _FLOAT_RESULT and not x.dtype.is_floating:
            x = self.cast(x, D.float32)
        if op in (UnaryOp.NEG, UnaryOp.ABS) and x.dtype.is_bool:
            raise SemanticError(f"{'negation' if op is UnaryOp.NEG else 'abs'} is not defined on bool values",
                                "use 'not'/~ to flip a mask, or convert first: x.to(T.int32)")
        if op is UnaryOp.NOT and not (x.dtype.is_bool or x.dtype.is_integer):
            raise SemanticError(f"'not'/'~' needs a bool or integer operand, got {x.dtype}")
        return self.b.create1(OpKind.UNARY, [x], self._result_type(x, x.dtype), UnaryAttrs(op))

    def fma(self, a: Any, b: Any, c: Any) -> Any:
        """``a * b + c`` rounded once; integer operands become float32."""
        if is_const(a) and is_const(b) and is_const(c):
            return math.fma(a, b, c) if hasattr(math, "fma") else a * b + c
        dtype = None
        typed = [v for v in (a, b, c) if isinstance(v, Value)]
        if all(not v.dtype.is_floating for v in typed):
            dtype = D.float32
        x, y, z = self._unify([a, b, c], dtype)
        return self.b.create1(OpKind.FMA, [x, y, z], self._result_type(x, x.dtype), NoAttrs())

    def cumsum(self, x: Any, axis: Any) -> Value:
        """Inclusive prefix sum along ``axis``; dtypes as ``T.sum`` (8/16-bit floats give float32, bool and
        8/16-bit ints int32)."""
        if not (isinstance(x, Value) and x.is_tile):
            raise SemanticError(f"T.cumsum needs a tile, got {describe(x)}")
        rank = x.type.rank
        if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
            raise SemanticError(f"axis must be a constant int in [-{rank}, {rank}), got {axis!r}")
        dtype = x.dtype
        if dtype.is_floating and dtype.bits < 32:
            dtype = D.float32
        elif (dtype.is_integer and dtype.bits < 32) or dtype.is_bool:
            dtype = D.int32
        x = self.cast(x, dtype)
        return self.b.create1(OpKind.SCAN, [x], TileType(x.type.shape, dtype), AxisAttrs(axis % rank))

    def truth(self, x: Any) -> Any:
        """``x != 0`` as a bool (Python truthiness for runtime values)."""
        if is_const(x) or x is None or isinstance(x, (str, tuple, DType)):  # compile-time objects fold
            return bool(x)
        if not isinstance(x, Value):
            raise SemanticError(f"expected a scalar or tile condition, got {describe(x)}")
        if x.dtype.is_bool:
            return x
        return self.compare(CompareOp.NE, x, 0)

    def where(self, cond: Any, x: Any, y: Any) -> Any:
        if cond is None or isinstance(cond, (str, tuple, DType)):  # compile-time objects: their truth
            cond = bool(cond)
        if is_const(cond):
            if is_const(x) and is_const(y):
                return x if cond else y
            # a compile-time condition chooses, but the result is still the operands' joined dtype and shape
            a, b = self._unify([x, y])
            shape = broadcast_shapes(shape_of(a), shape_of(b))
            chosen = a if cond else b
            return self.broadcast_to(chosen, shape) if shape and shape_of(chosen) != shape else chosen
        cond = self.truth(cond)
        a, b = self._unify([x, y])
        shape = broadcast_shapes(shape_of(cond), shape_of(a))
        if shape:
            cond, a, b = (self.broadcast_to(v, shape) for v in (cond, a, b))
        return self.b.create1(OpKind.SELECT, [cond, a, b], self._result_type(a, a.dtype), NoAttrs())

    # -- tile creation ---------------------------------------------------------------------
    def full(self, shape: Any, value: Any, dtype: DType) -> Value:
        shape = self.check_shape(shape)
        if not isinstance(dtype, DType):
            raise SemanticError(f"expected a dtype such as T.float32, got {dtype!r}")
        if not (is_const(value) or isinstance(value, Value) and value.is_scalar):
            raise SemanticError(f"the fill value must be a scalar, got {describe(value)}",
                                "convert a tile with x.to(dtype); broadcast it with x[:, None] or arithmetic")
        _check_int_constant(value, dtype)
        return self.splat(self.cast(value, dtype), shape)

    def arange(self, start: Any, end: Any = None) -> Value:
        if end is None:
            start, end = 0, start
        if not (isinstance(start, int) and isinstance(end, int)):
            raise SemanticError("T.arange needs compile-time integer bounds",
                                "pass the length as a T.constexpr parameter")
        if end <= start:
            raise SemanticError(f"T.arange({start}, {end}) is empty")
        return self.b.create1(OpKind.ARANGE, [], TileType((end - start,), D.int32), ArangeAttrs(start, end))

    @staticmethod
    def check_shape(shape: Any) -> tuple[int, ...]:
        if isinstance(shape, int):
            shape = (shape,)
        if not isinstance(shape, (tuple, list)) or not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise SemanticError(f"a tile shape must be a tuple of compile-time ints, got {shape!r}",
                                "use T.constexpr parameters for tile sizes")
        if any(d <= 0 for d in shape):
            raise SemanticError(f"tile dimensions must be positive, got {tuple(shape)}")
        return tuple(shape)

    # -- reductions and matrix products ----------------------------------------------------
    def reduce(self, x: Any, axis: Any, kind: ReduceKind) -> Any:
        if not (isinstance(x, Value) and x.is_tile):
            raise SemanticError(f"T.{kind.value} needs a tile, got {describe(x)}")
        if axis is None:
            while isinstance(x, Value) and x.is_tile:
                x = self.reduce(x, x.type.rank - 1, kind)
            return x
        rank = x.type.rank
        if not isinstance(axis, int) or not -rank <= axis < rank:
            raise SemanticError(f"axis must be a constant int in [-{rank}, {rank}), got {axis!r}")
        axis %= rank
        dtype = x.dtype
        product = self._as_product(x, axis) if kind is ReduceKind.SUM else None
        if product is not None:
            # sum(a[:, :, None] * b[None, :, :], 1) is a @ b: a product on tensor cores (float32 operands in
            # exact float32, precision "ieee"), never the (M, K, N) tile of products
            a, b = product
            return self.gemm(a, b, None, precision="ieee" if a.dtype == D.float32 else None)
        if kind is ReduceKind.SUM:
            if dtype.is_floating and dtype.bits < 32:
                dtype = D.float32
            elif (dtype.is_integer and dtype.bits < 32) or dtype.is_bool:
                dtype = D.int32
            x = self.cast(x, dtype)
        shape = x.type.shape[:axis] + x.type.shape[axis + 1:]
        result_type = TileType(shape, dtype) if shape else ScalarType(dtype)
        return self.b.create1(OpKind.REDUCE, [x], result_type, ReduceAttrs(axis, kind))

    def gemm(self, a: Any, b: Any, acc: Any, transpose_a: bool = False, transpose_b: bool = False,
             precision: str | None = None, out_dtype: DType | None = None, scale_a: Any = None,
             scale_b: Any = None) -> Value:
        if scale_a is not None or scale_b is not None:
            return self._scaled_gemm(a, b, acc, transpose_a, transpose_b, precision, out_dtype, scale_a, scale_b)
        for name, t in (("a", a), ("b", b)):
            if not (isinstance(t, Value) and t.is_tile and t.type.rank in (2, 3)):
                raise SemanticError(f"matrix product operand {name} must be a 2-D tile (or a 3-D batch of them), "
                                    f"got {describe(t)}")
        if a.dtype != b.dtype and not (a.dtype.is_fp8 and b.dtype.is_fp8):
            raise SemanticError(f"matrix product operands have different dtypes {a.dtype} and {b.dtype}",
                                "cast one with .to() (only the two float8 formats mix)")
        if a.dtype.is_bool or a.dtype in (D.int16, D.int32, D.int64, D.uint8):
            raise SemanticError(f"matrix products on {a.dtype} tiles are not supported",
                                "use float16, bfloat16, float8, int8, float32 or float64 operands")
        precision = self._gemm_precision(a.dtype, precision)
        acc_dtype = self._gemm_out_dtype(a.dtype, out_dtype)
        if a.type.rank == 3 or b.type.rank == 3:
            return self._batched_gemm(a, b, acc, transpose_a, transpose_b, precision, acc_dtype, out_dtype)
        m, k = a.type.shape[::-1] if transpose_a else a.type.shape
        k2, n = b.type.shape[::-1] if transpose_b else b.type.shape
        if k != k2:
            raise SemanticError(f"matrix product inner dimensions differ: {m}x{k} @ {k2}x{n}",
                                _gemm_hint(m, k, k2, n, transpose_a, transpose_b,
                                           acc.type.shape if isinstance(acc, Value) and acc.is_tile else None))
        if acc is None:
            acc = self.full((m, n), 0, acc_dtype)
        elif not (isinstance(acc, Value) and acc.is_tile):
            raise SemanticError(f"accumulator must be a tile, got {describe(acc)}")
        if acc.type.shape != (m, n):
            raise SemanticError(f"accumulator shape {acc.type.shape} does not match the product {m}x{n}",
                                f"the accumulator has the product's transposed shape: compute the transposed product "
                                f"b.T @ a.T, T.gemm(b, a, acc, transpose_a={not transpose_b}, "
                                f"transpose_b={not transpose_a}), or make the accumulator {m}x{n}"
                                if _swapped(acc.type.shape, (m, n)) else None)
        self._check_acc_dtype(acc, acc_dtype, a.dtype, out_dtype)
        return self.b.create1(OpKind.GEMM, [a, b, acc], TileType((m, n), acc_dtype),
                              GemmAttrs(bool(transpose_a), bool(transpose_b), precision))

    def _scaled_gemm(self, a: Any, b: Any, acc: Any, transpose_a: bool, transpose_b: bool, precision: str | None,
                     out_dtype: DType | None, scale_a: Any, scale_b: Any) -> Value:
        """``acc + (op(a) @ op(b)) * scale_a[:, None] * scale_b[None, :]`` on float8 tiles (block-scaled fp8): the
        product is summed fresh by the tensor cores over the tile's K (with at most ``SCALED_GEMM_K`` = 128 the
        tensor cores' own accumulator, precision "fast": this is the promotion interval), then scaled and added
        into the float32 ``acc`` with one FMA per element. A missing scale is 1. (e8m0 scales are the
        microscaled form, built by microscaled.py.)"""
        for name, t in (("a", a), ("b", b)):
            if not (isinstance(t, Value) and t.is_tile and t.type.rank == 2 and t.dtype.is_fp8):
                raise SemanticError(f"a scaled matrix product (scale_a=/scale_b=) takes 2-D float8 tiles; operand "
                                    f"{name} is {describe(t)}",
                                    "block scales apply to float8 (e4m3fn, e5m2) operands; multiply other "
                                    f"products by their scales after T.gemm ({docs_link('block-scaled-float8')})")
        if out_dtype not in (None, D.float32):
            raise SemanticError(f"a scaled matrix product accumulates in float32, not out_dtype={out_dtype.name}",
                                "leave out_dtype out")
        m = a.type.shape[1] if transpose_a else a.type.shape[0]
        k = a.type.shape[0] if transpose_a else a.type.shape[1]
        n = b.type.shape[0] if transpose_b else b.type.shape[1]
        scales = [self._block_scale(scale_a, "scale_a", m, "M", "row of op(a)"),
                  self._block_scale(scale_b, "scale_b", n, "N", "column of op(b)")]
        if precision is None and k <= SCALED_GEMM_K:
            precision = "fast"  # the fresh product of <= 128 products of K is the promotion interval itself
        product = self.gemm(a, b, None, transpose_a, transpose_b, precision)
        if acc is None:
            acc = self.full((m, n), 0, D.float32)
        elif not (isinstance(acc, Value) and acc.is_tile and acc.type.shape == (m, n) and acc.dtype == D.float32):
            raise SemanticError(f"the accumulator of a scaled matrix product must be a float32 {m}x{n} tile, got "
                                f"{describe(acc)}", f"create it with T.zeros(({m}, {n}), T.float32)")
        rows = self.expand_dims(scales[0], 1) if scales[0].is_tile else scales[0]
        cols = self.expand_dims(scales[1], 0) if scales[1].is_tile else scales[1]
        return self.fma(product, self.binary(BinaryOp.MUL, rows, cols), acc)

    def _block_scale(self, scale: Any, name: str, length: int, dim: str, what: str) -> Value:
        """``scale`` as a float32 scalar or (``length``,) tile (1.0 when None), or a located error."""
        if scale is None:
            return self.constant(1.0, D.float32)
        if is_const(scale) and not isinstance(scale, bool):
            return self.constant(float(scale), D.float32)
        ok_shape = isinstance(scale, Value) and (scale.is_scalar or scale.type.shape == (length,))
        if not ok_shape:
            raise SemanticError(f"{name} must be a float32 scalar or a 1-D float32 tile of length {dim} = {length} "
                                f"(one scale per {what}), got {describe(scale)}",
                                f"load it as e.g. SA[m0:m0 + BM, kb] ({docs_link('block-scaled-float8')})")
        if scale.dtype != D.float32:
            raise SemanticError(f"{name} must be float32, got {scale.dtype}", "convert it with .to(T.float32)")
        return scale

    @staticmethod
    def _gemm_precision(operand: DType, precision: str | None) -> str | None:
        """The precision of a product of ``operand`` tiles: float32's (default tf32, as Triton's), float8's
        (default precise: float32 sums), None for the dtypes that have one way to multiply. float32's choices
        are ignored by every other operand type, as ``tl.dot`` ignores ``input_precision`` there (so a ported
        kernel compiles; float8 then takes its default); float8's are refused on any other type."""
        choices = gemm_precisions(operand)
        if precision is None:
            return choices[0] if choices else None
        if precision in choices:
            return precision
        known = F32_PRECISIONS + FP8_PRECISIONS
        if precision not in known:
            raise SemanticError(f"unknown precision {precision!r} for a matrix product",
                                f"use one of {', '.join(repr(p) for p in known)} "
                                f"({docs_link('matrix-products')})")
        if precision in F32_PRECISIONS:
            return choices[0] if choices else None
        for_operand = (f"use one of {', '.join(repr(p) for p in choices)}" if choices
                       else "leave precision out: these operands have one way to multiply")
        kind = "float32" if precision in F32_PRECISIONS else "float8"
        raise SemanticError(f"precision {precision!r} does not apply to {operand.name} operands (it is a {kind} "
                            f"product's)", f"{for_operand} ({docs_link('matrix-products')})")

    @staticmethod
    def _gemm_out_dtype(operand: DType, out_dtype: DType | None) -> DType:
        """The accumulator dtype of a product of ``operand`` tiles: ``out_dtype`` when given and allowed, else
        the default (float32; int32 for int8; float64 for float64). float16 operands may also accumulate in
        float16 (``out_dtype=T.float16``: the tensor cores' f16 accumulators)."""
        default = D.int32 if operand == D.int8 else (D.float64 if operand == D.float64 else D.float32)
        if out_dtype is None or out_dtype == default:
            return default
        if not isinstance(out_dtype, DType):
            raise SemanticError(f"out_dtype must be a dtype such as T.float32, got {out_dtype!r}")
        if out_dtype == D.float16 and operand == D.float16:
            return out_dtype
        allowed = "T.float32 (default) or T.float16" if operand == D.float16 else f"T.{default.name}"
        why = ("float16 accumulation needs float16 operands (the tensor cores have no float16 accumulator for "
               f"{operand} inputs)" if out_dtype == D.float16 else f"{operand} operands accumulate in {default}")
        raise SemanticError(f"out_dtype={out_dtype.name} is not supported for {operand} operands: {why}",
                            f"use out_dtype={allowed} ({docs_link('matrix-products')})")

    @staticmethod
    def _check_acc_dtype(acc: Value, acc_dtype: DType, operand: DType, out_dtype: DType | None) -> None:
        if acc.dtype == acc_dtype:
            return
        if out_dtype is not None:
            raise SemanticError(f"accumulator dtype {acc.dtype} disagrees with out_dtype={out_dtype.name}",
                                f"the accumulator must have the product's dtype: create it with "
                                f"T.zeros(..., T.{acc_dtype.name}) or convert it with .to(T.{acc_dtype.name})")
        hint = f"create it with T.zeros(..., T.{acc_dtype.name})"
        if acc.dtype == D.float16 and operand == D.float16:
            hint = "to accumulate in float16, say so: T.gemm(a, b, acc, out_dtype=T.float16)"
        raise SemanticError(f"accumulator must be {acc_dtype} for {operand} operands, got {acc.dtype}", hint)

    # -- batched products: Bt independent 2-D products --------------------------------------------------------
    def _batched_gemm(self, a: Value, b: Value, acc: Any, transpose_a: bool, transpose_b: bool,
                      precision: str | None, acc_dtype: DType, out_dtype: DType | None) -> Value:
        """``(Bt, M, K) @ (Bt, K, N) -> (Bt, M, N)`` as ``Bt`` 2-D gemms on slices of the operands; the
        transposes apply to the last two dims. A slice of a tile loaded just before is a 2-D load of the same
        window (staged like any gemm operand); a slice of a computed tile is a masked sum over the batch dim."""
        if a.type.rank != 3 or b.type.rank != 3:
            raise SemanticError(f"a batched matrix product needs two 3-D tiles (Bt, M, K) and (Bt, K, N), got "
                                f"shapes {a.type.shape} and {b.type.shape}",
                                "give the 2-D operand the batch dim at its full size (x[None, :, :] + "
                                "T.zeros((Bt, K, N), x.dtype), or load it 3-D), or multiply 2-D tiles")
        bt, bt2 = a.type.shape[0], b.type.shape[0]
        m, k = a.type.shape[:0:-1] if transpose_a else a.type.shape[1:]
        k2, n = b.type.shape[:0:-1] if transpose_b else b.type.shape[1:]
        if bt != bt2:
            raise SemanticError(f"batched matrix product batch dims differ: {a.type.shape} @ {b.type.shape}",
                                "both operands need the same batch size Bt: (Bt, M, K) @ (Bt, K, N)")
        if k != k2:
            raise SemanticError(f"batched matrix product inner dimensions differ: {bt}x{m}x{k} @ {bt}x{k2}x{n}",
                                _gemm_hint(m, k, k2, n, transpose_a, transpose_b))
        if acc is not None:
            if not (isinstance(acc, Value) and acc.is_tile):
                raise SemanticError(f"accumulator must be a tile, got {describe(acc)}")
            if acc.type.shape != (bt, m, n):
                raise SemanticError(f"accumulator shape {acc.type.shape} does not match the batched product "
                                    f"{bt}x{m}x{n}")
            self._check_acc_dtype(acc, acc_dtype, a.dtype, out_dtype)
        shape = (bt, m, n)
        batch = self.broadcast_to(self.expand_dims(self.expand_dims(self.arange(0, bt), 1), 2), shape)
        out = None
        for i in range(bt):
            acc_i = self._batch_slice(acc, i) if acc is not None else self.full((m, n), 0, acc_dtype)
            product = self.b.create1(OpKind.GEMM, [self._batch_slice(a, i), self._batch_slice(b, i), acc_i],
                                     TileType((m, n), acc_dtype),
                                     GemmAttrs(bool(transpose_a), bool(transpose_b), precision))
            spread = self.broadcast_to(self.expand_dims(product, 0), shape)
            out = spread if out is None else self.where(self.compare(CompareOp.EQ, batch, i), spread, out)
        return out

    def _batch_slice(self, x: Value, i: int) -> Value:
        """``x[i]`` of a 3-D tile, as a 2-D tile."""
        load = defining_op(x)
        if (load is not None and load.kind is OpKind.LOAD and load in self.b.block.ops
                and not any(o.kind.writes_memory or o.regions
                            for o in self.b.block.ops[self.b.block.ops.index(load) + 1:])):
            # Read the slice from the tensor again: nothing wrote memory since the 3-D load.
            attrs = load.attrs
            dim = next(d for d in range(len(attrs.shape)) if d not in attrs.dropped)
            starts = list(load.operands[1:])
            starts[dim] = self.binary(BinaryOp.ADD, starts[dim], i) if i else starts[dim]
            shape = tuple(1 if d == dim else n for d, n in enumerate(attrs.shape))
            return self.load(load.operands[0], starts, shape, tuple(sorted((*attrs.dropped, dim))))
        bt = x.type.shape[0]
        batch = self.broadcast_to(self.expand_dims(self.expand_dims(self.arange(0, bt), 1), 2), x.type.shape)
        picked = self.where(self.compare(CompareOp.EQ, batch, i), x, 0)
        return self.cast(self.reduce(picked, 0, ReduceKind.SUM), x.dtype)  # exact: one term is not zero

    def _as_product(self, x: Value, axis: int) -> tuple[Value, Value] | None:
        """(a, b) when ``x`` is ``a[:, :, None] * b[None, :, :]`` of 2-D float tiles and ``axis`` is 1: the
        sum over ``axis`` is then ``a @ b``."""
        if axis != 1 or x.type.rank != 3:
            return None
        mul = defining_op(x)
        if mul is None or mul.kind is not OpKind.BINARY or mul.attrs.op is not BinaryOp.MUL:
            return None

        def source(v: Value, expanded_at: int) -> Value | None:
            op = defining_op(v)
            if op is not None and op.kind is OpKind.BROADCAST:
                v, op = op.operands[0], defining_op(op.operands[0])
            cast = None
            if op is not None and op.kind is OpKind.CAST:  # _unify promotes before it broadcasts
                cast, v, op = op.attrs.dtype, op.operands[0], defining_op(op.operands[0])
            if op is None or op.kind is not OpKind.EXPAND_DIMS or op.attrs.axis != expanded_at:
                return None
            src = op.operands[0]
            if not (src.is_tile and src.type.rank == 2):
                return None
            return self.cast(src, cast) if cast is not None else src

        for p, q in (mul.operands, mul.operands[::-1]):
            a, b = source(p, 2), source(q, 0)
            if a is not None and b is not None:
                break
        else:
            return None
        if a.dtype != b.dtype or a.dtype not in (D.float16, D.bfloat16, D.float32, D.float64):
            return None
        return a, b

    # -- global memory ---------------------------------------------------------------------
    def load(self, tensor: Value, starts: list[Value], shape: tuple[int, ...], dropped: tuple[int, ...]) -> Value:
        attrs = AccessAttrs(shape, dropped)
        tile = TileType(attrs.tile_shape, tensor.dtype) if attrs.tile_shape else ScalarType(tensor.dtype)
        return self.b.create1(OpKind.LOAD, [tensor, *starts], tile, attrs)

    def store(self, tensor: Value, starts: list[Value], shape: tuple[int, ...], dropped: tuple[int, ...],
              value: Any) -> None:
        attrs = AccessAttrs(shape, dropped)
        tile_shape = attrs.tile_shape
        if not tile_shape:  # X[i, j] = v: one element
            if isinstance(value, Value) and value.is_tile:
                raise SemanticError(f"cannot store a tile of shape {value.type.shape} into one element",
                                    "store a scalar, or store the tile into a slice")
            value = self.cast(value, tensor.dtype)
            self.b.create(OpKind.STORE, [tensor, value, *starts], [], attrs)
            return
        if isinstance(value, Value) and value.is_tile:
            try:
                if broadcast_shapes(value.type.shape, tile_shape) != tile_shape:
                    raise SemanticError("")
            except SemanticError:
                raise SemanticError(f"cannot store a tile of shape {value.type.shape} into a window of "
                                    f"shape {tile_shape}",
                                    "store its transpose, value.T" if _swapped(value.type.shape, tile_shape)
                                    else "load, compute and store windows of the same shape") from None
        value = self.cast(value, tensor.dtype)
        value = self.broadcast_to(value, tile_shape)
        self.b.create(OpKind.STORE, [tensor, value, *starts], [], attrs)

    # -- gathers, scatters and atomics -------------------------------------------------------
    def index_tile(self, idx: Value, tile_shape: tuple[int, ...], position: int) -> Value:
        """The 1-D index tile ``idx`` placed at tile dim ``position`` and broadcast to ``tile_shape``."""
        if not (isinstance(idx, Value) and idx.is_tile and idx.type.rank == 1):
            raise SemanticError(f"an index tile must be 1-D, got {describe(idx)}",
                                "index with a 1-D integer tile such as X[idx, 0:D]")
        if not idx.dtype.is_integer:
            raise SemanticError(f"an index tile must have an integer dtype, got {idx.dtype}",
                                "convert it with idx.to(T.int32)")
        if idx.dtype.bits < 32:
            idx = self.cast(idx, D.int32)
        for _ in range(position):
            idx = self.expand_dims(idx, 0)
        while idx.type.rank < len(tile_shape):
            idx = self.expand_dims(idx, idx.type.rank)
        return self.broadcast_to(idx, tile_shape)

    def gather(self, tensor: Value, starts: list[Value], shape: tuple[int, ...], dropped: tuple[int, ...],
               axis: int, idx: Value) -> Value:
        attrs = IndexedAttrs(shape, dropped, axis)
        index = self.index_tile(idx, attrs.tile_shape, _tile_position(axis, dropped))
        return self.b.create1(OpKind.GATHER, [tensor, index, *starts], TileType(attrs.tile_shape, tensor.dtype), attrs)

    def _window_value(self, value: Any, tensor: Value, tile_shape: tuple[int, ...], what: str) -> Value:
        """``value`` cast to the tensor's dtype and broadcast to the window (a scalar for a one-element window)."""
        if not (isinstance(value, Value) or is_const(value)):
            raise SemanticError(f"{what} must be a scalar or tile, got {describe(value)}")
        if not tile_shape:
            if isinstance(value, Value) and value.is_tile:
                raise SemanticError(f"cannot use a tile of shape {value.type.shape} with one element",
                                    "pass a scalar, or index the tensor with slices")
            return self.cast(value, tensor.dtype)
        if isinstance(value, Value) and value.is_tile:
            try:
                ok = broadcast_shapes(value.type.shape, tile_shape) == tile_shape
            except SemanticError:
                ok = False
            if not ok:
                raise SemanticError(f"cannot use a tile of shape {value.type.shape} with a window of shape "
                                    f"{tile_shape}")
        return self.broadcast_to(self.cast(value, tensor.dtype), tile_shape)

    def scatter(self, tensor: Value, starts: list[Value], shape: tuple[int, ...], dropped: tuple[int, ...],
                axis: int, idx: Value, value: Any) -> None:
        attrs = IndexedAttrs(shape, dropped, axis)
        index = self.index_tile(idx, attrs.tile_shape, _tile_position(axis, dropped))
        value = self._window_value(value, tensor, attrs.tile_shape, "the stored value")
        self.b.create(OpKind.SCATTER, [tensor, value, index, *starts], [], attrs)

    def atomic(self, op: AtomicOp, tensor: Value, starts: list[Value], shape: tuple[int, ...],
               dropped: tuple[int, ...], axis: int | None, idx: Value | None, value: Any, cmp: Any = None,
               sem: Any = "acq_rel", scope: Any = "gpu") -> Value:
        name = f"T.atomic_{op.value}"
        if sem not in ATOMIC_SEMS:
            raise SemanticError(f"{name}: sem must be one of {', '.join(repr(s) for s in ATOMIC_SEMS)}, got {sem!r}")
        if scope not in ATOMIC_SCOPES:
            raise SemanticError(f"{name}: scope must be one of {', '.join(repr(s) for s in ATOMIC_SCOPES)}, "
                                f"got {scope!r}")
        dtype = tensor.dtype
        if dtype not in ATOMIC_DTYPES:
            raise SemanticError(f"{name} on a {dtype.name} tensor is not supported",
                                "atomics work on float32, float64, float16, bfloat16, int32 and int64 tensors")
        attrs = AtomicAttrs(op, sem, scope, shape, dropped, axis)
        tile_shape = attrs.tile_shape
        operands = [tensor, self._window_value(value, tensor, tile_shape, f"the value of {name}")]
        if op is AtomicOp.CAS:
            operands.append(self._window_value(cmp, tensor, tile_shape, f"the compared value of {name}"))
        if axis is not None:
            operands.append(self.index_tile(idx, tile_shape, _tile_position(axis, dropped)))
        result = TileType(tile_shape, dtype) if tile_shape else ScalarType(dtype)
        return self.b.create1(OpKind.ATOMIC, [*operands, *starts], result, attrs)


ATOMIC_DTYPES = (D.float32, D.float64, D.int32, D.int64, D.float16, D.bfloat16)


def _tile_position(axis: int, dropped: tuple[int, ...]) -> int:
    """The tile dim a tensor dim becomes once the dropped dims are gone."""
    return axis - sum(1 for d in dropped if d < axis)
