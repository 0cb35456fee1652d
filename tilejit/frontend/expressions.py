"""Expressions of the kernel language: names and globals, arithmetic, comparisons, subscripts (tile views and
tensor windows, loads and stores), calls (builtins, ``@tilejit.func`` helpers, constant folding of Python
builtins)."""
from __future__ import annotations

import ast
import builtins
import inspect
import operator
import types
from dataclasses import dataclass
from typing import Any

from .. import dtypes as D
from .. import language as lang
from ..dtypes import DType
from ..errors import NameResolutionError, UnsupportedSyntaxError, did_you_mean, docs_link
from ..ir import AxisAttrs, BinaryOp, Block, CompareOp, NoAttrs, OpKind, ScalarType, UnaryOp, Value
from .semantic import describe, is_const
from .source import JITFunction
from .spec import NeedsShape
from .builtins import BUILTINS, python_minmax
from .constructs import construct_words
from .triton_names import triton_spelling


@dataclass
class TensorArg:
    """A tensor parameter: its IR value and per-dim extents/strides (IR scalars or ints)."""
    name: str
    value: Value
    shape: tuple[Any, ...]
    strides: tuple[Value, ...]
    item_of: str | None = None  # the tensor list this tensor is an item of (its extents are never constants)

    @property
    def dtype(self) -> DType:
        return self.value.type.dtype


@dataclass
class TensorListArg:
    """A tensor-list parameter: ``As[g]`` gives the :class:`TensorArg` of its tensor ``g``, ``len(As)`` its length."""
    name: str
    value: Value

    @property
    def dtype(self) -> DType:
        return self.value.type.dtype

    @property
    def rank(self) -> int:
        return self.value.type.rank


@dataclass
class TensorWindow:
    """``A[...]`` in a kernel: per tensor dim a start (IR scalar) and a compile-time length; ``dropped`` dims were
    indexed by an integer; ``axis``, when set, is the dim indexed by the 1-D integer tile ``index`` (a gather,
    scatter or indexed atomic: ``X[idx, 0:D]``)."""
    tensor: TensorArg
    starts: list
    lengths: tuple[int, ...]
    dropped: tuple[int, ...]
    axis: int | None = None
    index: Value | None = None


_BINOPS = {
    ast.Add: BinaryOp.ADD, ast.Sub: BinaryOp.SUB, ast.Mult: BinaryOp.MUL, ast.Div: BinaryOp.TRUEDIV,
    ast.FloorDiv: BinaryOp.FLOORDIV, ast.Mod: BinaryOp.MOD, ast.BitAnd: BinaryOp.AND, ast.BitOr: BinaryOp.OR,
    ast.BitXor: BinaryOp.XOR, ast.LShift: BinaryOp.SHL, ast.RShift: BinaryOp.SHR,
}
_CMPOPS = {
    ast.Lt: CompareOp.LT, ast.LtE: CompareOp.LE, ast.Gt: CompareOp.GT, ast.GtE: CompareOp.GE,
    ast.Eq: CompareOp.EQ, ast.NotEq: CompareOp.NE,
}
_ALLOWED_MODULES = {"math"}
_KERNEL_BUILTINS = ("range", "min", "max", "abs", "float", "int", "bool", "len")  # Python's, usable in kernels
_TENSOR_ATTRS = ("shape", "dtype", "stride", "ndim")
_TILE_ATTRS = ("T", "shape", "dtype", "to")
_LIST_METHODS = ("append", "extend", "insert", "pop", "remove")
_CONST_TYPES = (bool, int, float, str, type(None))



def _same_value(a: Any, b: Any, depth: int = 8) -> bool:
    """Whether two scalars are the same computation (``pid * BN`` written twice in ``A[pid * BN:pid * BN + BN]``)."""
    if not (isinstance(a, Value) and isinstance(b, Value)):
        return False
    if a.id == b.id:
        return True
    oa, ob = a.owner, b.owner
    if depth == 0 or oa is None or ob is None or isinstance(oa, Block) or isinstance(ob, Block):
        return False
    return (oa.kind is ob.kind and oa.kind.is_pure and oa.attrs == ob.attrs and a.type == b.type
            and len(oa.operands) == len(ob.operands)
            and all(_same_value(x, y, depth - 1) for x, y in zip(oa.operands, ob.operands)))


_PY_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
               ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
               ast.NotIn: lambda a, b: a not in b}


def _tile_view_index(index: ast.expr) -> bool:
    """Whether a subscript only adds dims (None) and keeps them (':'), as ``tile[:, None]`` does."""
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    return all(isinstance(i, ast.Constant) and i.value is None or isinstance(i, ast.Slice) and i.lower is None
               and i.upper is None and i.step is None for i in items)


def _folded_object(x: Any) -> bool:
    """A compile-time Python object that is not a number: folded wherever it is compared or tested."""
    return x is None or isinstance(x, (str, tuple))


class Expressions:
    """The expression visitors of :class:`~tilejit.frontend.visitor.CodeGenerator`."""

    # -- expressions -----------------------------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, (bool, int, float, str)) or node.value is None:
            return node.value
        raise self.error(node, f"unsupported constant {node.value!r}", cls=UnsupportedSyntaxError)

    def visit_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.visit(e) for e in node.elts)

    def visit_List(self, node: ast.List) -> tuple:
        """A list of compile-time constants (``w = [0.25, 0.5, 0.25]``, as Triton accepts) is the tuple of them:
        it is read, indexed and iterated, never changed. A list of run-time values stays an error."""
        items = tuple(self.visit(e) for e in node.elts)
        if all(is_const(item) for item in items):
            return items
        words, hint = construct_words(node)
        raise self.error(node, f"{words} of run-time values is not supported in kernels (a list of constants is)",
                         hint, UnsupportedSyntaxError)

    def lookup(self, name: str, node: ast.AST) -> Any:
        if name in self.scope:
            return self.scope[name]
        if name in self.dead:
            raise self.error(node, f"'{name}' is not defined here: {self.dead[name]}", cls=NameResolutionError)
        if name in self.global_env:
            return self._global(name, self.global_env[name], node)
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise self.error(node, f"name '{name}' is not defined{did_you_mean(name, self.visible_names())}",
                         cls=NameResolutionError)

    def visible_names(self) -> set[str]:
        """The names a kernel could mean: locals, parameters, and the globals of its module it may read."""
        names = set(self.scope) | set(self.global_env) | set(_KERNEL_BUILTINS)
        module_globals = getattr(self.parsed.fn, "__globals__", {})
        names.update(n for n, obj in module_globals.items() if not n.startswith("_") and (
            isinstance(obj, (*_CONST_TYPES, DType, JITFunction, lang.constexpr, types.ModuleType))))
        return names

    def _global(self, name: str, obj: Any, node: ast.AST) -> Any:
        if isinstance(obj, lang.constexpr):
            obj = obj.value
        if isinstance(obj, _CONST_TYPES) or isinstance(obj, (DType, JITFunction)):
            return obj
        if isinstance(obj, types.ModuleType) and (obj.__name__.startswith("tilejit") or obj.__name__ in _ALLOWED_MODULES):
            return obj
        if getattr(obj, "__tilejit_builtin__", None) or obj is lang.constexpr:
            return obj
        if isinstance(obj, tuple) and all(isinstance(x, (bool, int, float)) for x in obj):
            return obj
        if callable(obj) and getattr(obj, "__module__", "") == "math":
            return obj
        if isinstance(obj, types.FunctionType):
            hint = (f"'{name}' is a plain Python function: decorate it with @tilejit.func to call it in kernels "
                    f"(it is inlined; {docs_link('helper-functions')}), or compute its value outside the kernel")
        else:
            hint = ("kernels may read int/float/bool/str constants, dtypes, tilejit.language and @tilejit.func "
                    f"helpers from globals; pass other values as arguments ({docs_link('globals')})")
        raise self.error(node, f"global '{name}' ({type(obj).__name__}) cannot be used inside a kernel", hint,
                         NameResolutionError)

    def visit_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id, node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        base = self.visit(node.value)
        attr = node.attr
        if isinstance(base, types.ModuleType):
            if not hasattr(base, attr):
                public = getattr(base, "__all__", None) or [n for n in dir(base) if not n.startswith("_")]
                alias = node.value.id + "." if isinstance(node.value, ast.Name) else ""
                triton_hint = triton_spelling(attr) if base is lang else None
                if triton_hint is not None:  # a Triton habit: its spelling, not a name that merely looks alike
                    raise self.error(node, f"module '{base.__name__}' has no attribute '{attr}'",
                                     f"{triton_hint} ({docs_link('coming-from-triton')})", NameResolutionError)
                hint = (f"the language's functions and dtypes are listed in {docs_link('reference')}"
                        if base is lang else None)
                raise self.error(node, f"module '{base.__name__}' has no attribute '{attr}'"
                                       f"{did_you_mean(attr, public, alias)}", hint, NameResolutionError)
            return self._global(f"{base.__name__}.{attr}", getattr(base, attr), node)
        if isinstance(base, TensorArg):
            if attr == "shape":
                return base.shape
            if attr == "dtype":
                return base.dtype
            if attr == "stride":
                return ("stride", base)
            if attr == "ndim":
                return len(base.shape)
        elif isinstance(base, TensorListArg):
            if attr == "dtype":
                return base.dtype
            if attr == "ndim":
                return base.rank
            raise self.error(node, f"tensor list '{base.name}' has no attribute '{attr}' in a kernel",
                             f"pick one of its tensors first: {base.name}[g].{attr}; len({base.name}) is the number "
                             f"of tensors ({docs_link('tensor-lists')})", NameResolutionError)
        elif isinstance(base, Value) and base.is_tile:
            if attr == "T":
                return self.sem.transpose(base)
            if attr == "shape":
                return base.type.shape
            if attr == "dtype":
                return base.dtype
            if attr == "to":
                return ("to", base)
        elif isinstance(base, Value) and base.is_scalar:
            if attr == "dtype":
                return base.dtype
            if attr == "to":
                return ("to", base)
        elif isinstance(base, DType) and attr in ("bits", "itemsize", "is_floating"):
            return getattr(base, attr)
        what = describe(base) if not isinstance(base, TensorArg) else "tensor " + base.name
        known = (_TENSOR_ATTRS if isinstance(base, TensorArg) else _TILE_ATTRS if isinstance(base, Value) and
                 base.is_tile else ("dtype", "to") if isinstance(base, Value) else ())
        hint = None
        if attr in _LIST_METHODS and isinstance(base, (tuple, Value)):
            hint = ("tiles are values, not lists: make a whole tile at once (T.zeros, T.full, T.arange) and "
                    "update it with arithmetic or T.where(T.arange(0, N) == i, value, tile); a list of tiles "
                    f"cannot be built in a kernel ({docs_link('tiles')})")
        elif isinstance(base, Value) and attr in lang.__all__:
            hint = f"tiles have no methods besides .to() and .T: write T.{attr}(x, ...) ({docs_link('reference')})"
        elif known and not did_you_mean(attr, known):
            hint = f"a {what.split()[0]} has {', '.join(known)}"
        raise self.error(node, f"{what} has no attribute '{attr}' in a kernel{did_you_mean(attr, known)}", hint,
                         NameResolutionError)

    def binary(self, op: BinaryOp, x: Any, y: Any, node: ast.AST) -> Any:
        if isinstance(x, tuple) and isinstance(y, tuple) and op is BinaryOp.ADD:
            return x + y
        result = self.sem.binary(op, x, y)
        if op in (BinaryOp.ADD, BinaryOp.SUB) and isinstance(result, Value) and result.is_scalar:
            bx, ox = self.split_offset(x)
            by, oy = self.split_offset(y)
            if op is BinaryOp.ADD and (by is None or bx is None):
                self.offsets[result.id] = (bx if by is None else by, ox + oy)
            elif op is BinaryOp.SUB and by is None:
                self.offsets[result.id] = (bx, ox - oy)
        return result

    def split_offset(self, x: Any) -> tuple[Any, int]:
        """``x`` as ``base + constant`` (base None for a constant), to measure slice lengths."""
        if isinstance(x, int):
            return None, int(x)
        if isinstance(x, Value):
            base, off = self.offsets.get(x.id, (x, 0))
            if isinstance(base, Value) and base.owner is not None and not isinstance(base.owner, Block) \
                    and base.owner.kind is OpKind.CAST and base.owner.operands[0].id in self.offsets:
                inner_base, inner_off = self.split_offset(base.owner.operands[0])
                return inner_base, inner_off + off
            return base, off
        return x, 0

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        x, y = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, ast.MatMult):
            return self.sem.gemm(x, y, None)
        if isinstance(node.op, ast.Pow):
            return self.power(x, y, node)
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(node, f"unsupported operator {type(node.op).__name__}", cls=UnsupportedSyntaxError)
        return self.binary(op, x, y, node)

    def power(self, x: Any, y: Any, node: ast.AST) -> Any:
        if is_const(x) and is_const(y):
            return x ** y
        if not (isinstance(y, int) and 0 <= y <= 64):
            raise self.error(node, "'**' on runtime values needs a small non-negative int constant exponent",
                             "use T.exp2(y * T.log(x) / math.log(2)) for other powers")
        result: Any = 1
        for _ in range(y):
            result = x if result == 1 and not isinstance(result, Value) else self.sem.binary(BinaryOp.MUL, result, x)
        return result if isinstance(result, Value) or y else self.sem.cast(1, x.dtype)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        x = self.visit(node.operand)
        if isinstance(node.op, ast.UAdd):
            return x
        if isinstance(node.op, ast.USub):
            return self.sem.unary(UnaryOp.NEG, x)
        if isinstance(node.op, ast.Not):
            if is_const(x) or _folded_object(x) or isinstance(x, DType):  # strings, None, tuples: compile time
                return not x
            if not isinstance(x, Value):
                raise self.error(node, f"'not' needs a scalar or a compile-time value, got {describe(x)}",
                                 "use ~ on bool tiles")
            return self.sem.unary(UnaryOp.NOT, self.sem.truth(x))
        if isinstance(node.op, ast.Invert):
            if is_const(x):
                return ~x
            return self.sem.unary(UnaryOp.NOT, x)
        return self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        op = BinaryOp.AND if isinstance(node.op, ast.And) else BinaryOp.OR
        result = self.visit(node.values[0])
        for value_node in node.values[1:]:
            if is_const(result) or _folded_object(result):  # short-circuit at compile time
                if (op is BinaryOp.AND) != bool(result):
                    return result
                result = self.visit(value_node)
                continue
            y = self.visit(value_node)
            if isinstance(result, Value) and result.is_tile or isinstance(y, Value) and y.is_tile:
                raise self.error(node, "'and'/'or' need scalars", "use & and | on bool tiles")
            result = self.sem.binary(op, self.sem.truth(result), self.sem.truth(y))
        return result

    def visit_Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        result: Any = True
        for op_node, right_node in zip(node.ops, node.comparators):
            right = self.visit(right_node)
            if isinstance(op_node, (ast.Is, ast.IsNot)):
                if isinstance(left, Value) or isinstance(right, Value):
                    raise self.error(node, "'is' compares compile-time objects only", "use == on values")
                value = (left is right) if isinstance(op_node, ast.Is) else (left is not right)
            elif _folded_object(left) or _folded_object(right):
                # strings, None and tuples (constexprs, constants): compared by Python, at compile time
                if isinstance(left, (Value, TensorArg)) or isinstance(right, (Value, TensorArg)):
                    raise self.error(node, f"cannot compare {describe(left)} with {describe(right)}",
                                     "strings, None and tuples are compile-time values: compare them with "
                                     "constexprs or constants")
                try:
                    value = _PY_COMPARE[type(op_node)](left, right)
                except (KeyError, TypeError) as e:
                    raise self.error(node, f"cannot compare {left!r} with {right!r} at compile time ({e})") from None
            elif isinstance(left, DType) or isinstance(right, DType):
                if not isinstance(op_node, (ast.Eq, ast.NotEq)):
                    raise self.error(node, "dtypes can only be compared with == and !=")
                value = (left == right) == isinstance(op_node, ast.Eq)
            elif type(op_node) not in _CMPOPS:
                word = "not in" if isinstance(op_node, ast.NotIn) else "in"
                raise self.error(node, f"'{word}' on run-time values is not supported in kernels",
                                 "'in' tests compile-time tuples and strings (constexprs); compare run-time values "
                                 "with == joined by |", UnsupportedSyntaxError)
            else:
                value = self.sem.compare(_CMPOPS[type(op_node)], left, right)
            result = value if result is True else self.sem.binary(BinaryOp.AND, self.sem.truth(result), self.sem.truth(value))
            left = right
        return result

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        cond = self.visit(node.test)
        if is_const(cond) or _folded_object(cond) or isinstance(cond, DType):  # decided at compile time
            return self.visit(node.body if cond else node.orelse)
        x, y = self.visit(node.body), self.visit(node.orelse)
        if isinstance(cond, Value) and cond.is_scalar:
            return self.sem.where(cond, x, y)
        raise self.error(node, "a conditional expression needs a scalar condition", "use T.where on tiles")

    # -- subscripts: tensor windows and tile views -------------------------------------------
    def visit_Subscript(self, node: ast.Subscript) -> Any:
        base = self.visit(node.value)
        if isinstance(base, TensorArg):
            return self.load(self.tensor_window(node, base))
        if isinstance(base, TensorListArg):
            return self.list_item(node, base)
        index = node.slice
        twice = self.tensor_indexed_twice(node)
        if twice is not None and not (isinstance(base, Value) and base.is_tile and _tile_view_index(index)):
            raise twice
        if isinstance(base, tuple):
            i = self.visit(index)
            if not isinstance(i, int):
                raise self.error(node, "tuples can only be indexed by compile-time ints")
            try:
                return base[i]
            except IndexError:
                raise self.error(node, f"index {i} is out of range for a tuple of {len(base)}") from None
        if isinstance(base, Value) and base.is_tile:
            return self.tile_view(base, index)
        raise self.error(node, f"cannot index {describe(base)}")

    def list_item(self, node: ast.Subscript, tensors: TensorListArg) -> TensorArg:
        """``As[g]``: tensor ``g`` of a tensor list, with run-time extents and strides read from the list's table."""
        name = tensors.name
        if isinstance(node.slice, (ast.Slice, ast.Tuple)):
            raise self.error(node, f"'{name}' is a list of tensors: pick one with a single integer index before "
                                   "slicing it", f"write {name}[g][m0:m0 + BM, k0:k0 + BK] ({docs_link('tensor-lists')})")
        g = self.visit(node.slice)
        if isinstance(g, bool) or not (isinstance(g, int) or isinstance(g, Value) and g.is_scalar
                                       and g.dtype.is_integer):
            raise self.error(node.slice, f"a tensor list is indexed by an integer scalar, got {describe(g)}",
                             f"{name}[g] with g an int such as T.program_id(1) ({docs_link('tensor-lists')})")
        item = self.b.create1(OpKind.LIST_ITEM, [tensors.value, self.sem.cast(g, D.int64)],
                              tensors.value.type.element, NoAttrs())
        item.name = name  # the list's specialization (unit strides, alignment) holds for each of its tensors
        shape = tuple(self.b.create1(OpKind.TENSOR_DIM, [item], ScalarType(D.int64), AxisAttrs(d))
                      for d in range(tensors.rank))
        strides = tuple(self.b.create1(OpKind.TENSOR_STRIDE, [item], ScalarType(D.int64), AxisAttrs(d))
                        for d in range(tensors.rank))
        for what, values in (("size", shape), ("stride", strides)):
            for d, v in enumerate(values):
                v.name = f"{name}_{what}{d}"
        return TensorArg(name, item, shape, strides, item_of=name)

    def tensor_indexed_twice(self, node: ast.Subscript):
        """The error for ``X[i][...]`` on a tensor argument ``X`` (a tensor takes its indices in one subscript;
        perhaps a list of tensors was meant), or None."""
        inner = node.value
        if not (isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name)):
            return None
        tensor = self.scope.get(inner.value.id)
        if not isinstance(tensor, TensorArg) or tensor.item_of is not None:
            return None
        x = inner.value.id
        return self.error(node, f"tensor '{x}' is indexed twice ({x}[...][...]): a tensor takes all its indices in "
                                f"one subscript, {x}[i, j0:j0 + BJ]",
                          f"if '{x}' is meant to be a list of tensors, pass a list or tuple of tensors for it at "
                          f"launch ({docs_link('tensor-lists')})")

    def tile_view(self, tile: Value, index: ast.expr) -> Value:
        items = index.elts if isinstance(index, ast.Tuple) else [index]
        dim = 0
        result = tile
        for item in items:
            if isinstance(item, ast.Constant) and item.value is None:
                result = self.sem.expand_dims(result, dim)
                dim += 1
            elif isinstance(item, ast.Slice) and item.lower is None and item.upper is None and item.step is None:
                dim += 1
            else:
                raise self.error(item, "tiles can only be indexed with ':' and None (to add a dimension)",
                                 "load a smaller window from the tensor instead")
        if dim - (result.type.rank - tile.type.rank) > tile.type.rank:
            raise self.error(index, f"too many indices for a tile of rank {tile.type.rank}")
        return result

    def tensor_window(self, node: ast.Subscript, tensor: Any = None):
        """(tensor, starts, lengths, dropped dims) of ``A[...]``; lengths are compile-time ints."""
        if tensor is None:
            tensor = self.visit(node.value)
        if isinstance(tensor, TensorListArg):
            raise self.error(node, f"'{tensor.name}' is a list of tensors: pick one with a single integer index "
                                   "before slicing it", f"write {tensor.name}[g][m0:m0 + BM, n0:n0 + BN] = tile "
                                                        f"({docs_link('tensor-lists')})")
        if not isinstance(tensor, TensorArg):
            raise self.error(node.value, f"only tensor arguments can be sliced-assigned, not {describe(tensor)}")
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rank = len(tensor.shape)
        if len(items) > rank:
            raise self.error(node, f"too many indices ({len(items)}) for tensor '{tensor.name}' of rank {rank}")
        items = list(items) + [ast.Slice(lower=None, upper=None, step=None)] * (rank - len(items))
        starts, lengths, dropped = [], [], []
        axis, index = None, None
        for dim, item in enumerate(items):
            if isinstance(item, ast.Slice):
                if item.step is not None:
                    raise self.error(item, "strided slices are not supported", cls=UnsupportedSyntaxError)
                lo = self.visit(item.lower) if item.lower is not None else 0
                if item.upper is None:
                    if item.lower is not None:
                        raise self.error(item, "a slice needs an end: write start:start + BLOCK")
                    extent = tensor.shape[dim]
                    if not isinstance(extent, int) and tensor.item_of is not None:
                        raise self.error(item, f"':' takes a whole extent, which must be a compile-time constant; "
                                               f"the tensors of list '{tensor.item_of}' have run-time extents",
                                         "slice a constexpr length instead: start:start + BLOCK")
                    if not isinstance(extent, int):
                        raise NeedsShape(tensor.name, dim)
                    hi = extent
                else:
                    hi = self.visit(item.upper)
                for bound in (lo, hi):
                    if isinstance(bound, bool) or not (isinstance(bound, int) or (
                            isinstance(bound, Value) and bound.is_scalar and bound.dtype.is_integer)):
                        raise self.error(item, f"slice bounds must be integers, got {describe(bound)}",
                                         "a start is an integer scalar such as T.program_id(0) * BLOCK; "
                                         "convert a float with int(x)")
                lo_base, lo_off = self.split_offset(lo)
                hi_base, hi_off = self.split_offset(hi)
                same = lo_base is hi_base or _same_value(lo_base, hi_base)
                if not same:
                    raise self.error(item, "the length of a slice must be a compile-time constant",
                                     "write start:start + BLOCK with BLOCK a T.constexpr")
                length = hi_off - lo_off
                if length <= 0:
                    raise self.error(item, f"slice length must be positive, got {length}")
                starts.append(lo)
                lengths.append(length)
            else:
                idx = self.visit(item)
                if isinstance(idx, Value) and idx.is_tile:  # X[idx, 0:D]: rows picked by an index tile
                    if axis is not None:
                        raise self.error(item, "only one dimension can be indexed by a tile",
                                         "gather along one dim, slice the others")
                    if idx.type.rank != 1 or not idx.dtype.is_integer:
                        raise self.error(item, f"an index tile must be a 1-D integer tile, got {describe(idx)}",
                                         "build it with T.arange or load it from an int32/int64 tensor; "
                                         "convert floats with .to(T.int32)")
                    axis, index = dim, idx
                    starts.append(0)
                    lengths.append(idx.type.shape[0])
                    continue
                if isinstance(idx, bool) or not (isinstance(idx, int) or (isinstance(idx, Value) and idx.is_scalar
                                                                          and idx.dtype.is_integer)):
                    raise self.error(item, f"tensor index must be an integer, a slice or a 1-D integer tile, "
                                           f"got {describe(idx)}")
                starts.append(idx)
                lengths.append(1)
                dropped.append(dim)
        start_values = [self.sem.as_value(s) for s in starts]
        return TensorWindow(tensor, start_values, tuple(lengths), tuple(dropped), axis, index)

    def load(self, w: TensorWindow) -> Value:
        if w.axis is not None:
            return self.sem.gather(w.tensor.value, w.starts, w.lengths, w.dropped, w.axis, w.index)
        return self.sem.load(w.tensor.value, w.starts, w.lengths, w.dropped)

    def store(self, w: TensorWindow, value: Any, node: ast.AST) -> None:
        if not (isinstance(value, Value) or is_const(value)):
            raise self.error(node, f"cannot store {describe(value)} into tensor '{w.tensor.name}'")
        if w.axis is not None:
            self.sem.scatter(w.tensor.value, w.starts, w.lengths, w.dropped, w.axis, w.index, value)
            return
        self.sem.store(w.tensor.value, w.starts, w.lengths, w.dropped, value)

    # -- calls -----------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> Any:
        fn = self.visit(node.func)
        name = getattr(fn, "__tilejit_builtin__", None)
        handler = BUILTINS.get(name) if name is not None else None
        if getattr(handler, "takes_ast", False):
            return handler(self, node)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.error(node, "*args and **kwargs are not supported in kernel calls", cls=UnsupportedSyntaxError)
        args = [self.visit(a) for a in node.args]
        kwargs = {k.arg: self.visit(k.value) for k in node.keywords}
        if isinstance(fn, tuple) and len(fn) == 2 and fn[0] == "to":
            return self.method_to(node, fn[1], args, kwargs)
        if isinstance(fn, tuple) and len(fn) == 2 and fn[0] == "stride":
            tensor = fn[1]
            if len(args) != 1 or not isinstance(args[0], int):
                raise self.error(node, "stride() takes one compile-time int")
            try:
                return tensor.strides[args[0]]
            except IndexError:
                raise self.error(node, f"tensor '{tensor.name}' has no dim {args[0]}") from None
        if name is not None:
            if handler is None:
                raise self.error(node, f"T.{name} cannot be called here", cls=UnsupportedSyntaxError)
            try:
                return handler(self, node, *args, **kwargs)
            except TypeError as e:
                if "builtin_" not in str(e):
                    raise
                params = list(inspect.signature(handler).parameters)[2:]  # after (gen, node)
                unknown = [k for k in kwargs if k not in params]
                close = did_you_mean(unknown[0], params) if unknown else ""
                raise self.error(node, f"wrong arguments for T.{name}: {str(e).split(') ', 1)[-1]}{close}",
                                 f"T.{name}({', '.join(params)}); help(T.{name}) shows an example") from None
        if isinstance(fn, JITFunction):
            return self.inline(node, fn, args, kwargs)
        if fn is lang.constexpr:
            return args[0] if args else None
        if fn in (builtins.min, builtins.max):
            return python_minmax(self, node, fn is builtins.max, args)
        if fn is builtins.abs:
            return self.sem.unary(UnaryOp.ABS, args[0])
        if fn in (builtins.float, builtins.int, builtins.bool):
            if all(is_const(a) or isinstance(a, str) for a in args):
                try:
                    return fn(*args)
                except (ArithmeticError, ValueError, TypeError) as e:  # float("x"), int(float("inf")) ...
                    raise self.error(node, f"cannot fold {fn.__name__}({', '.join(map(repr, args))}) at compile "
                                     f"time: {e}") from None
            target = {builtins.float: D.float32, builtins.int: D.int32, builtins.bool: D.bool_}[fn]
            return self.sem.cast(args[0], target) if fn is not builtins.bool else self.sem.truth(args[0])
        if fn is builtins.len:
            if len(args) == 1 and isinstance(args[0], tuple):
                return len(args[0])
            if len(args) == 1 and isinstance(args[0], TensorListArg):
                return self.b.create1(OpKind.LIST_LEN, [args[0].value], ScalarType(D.int64), NoAttrs())
            if len(args) == 1 and isinstance(args[0], TensorArg):
                t = args[0].name
                raise self.error(node, f"len() of tensor '{t}': use {t}.shape[0]",
                                 f"len() counts the tensors of a tensor list (a list or tuple of tensors passed "
                                 f"at launch) and the items of a compile-time tuple ({docs_link('tensor-lists')})")
            raise self.error(node, "len() works on compile-time tuples and tensor lists only")
        if getattr(fn, "__module__", None) == "math" and callable(fn):
            if all(is_const(a) for a in args):
                try:
                    return fn(*args, **kwargs)
                except (ArithmeticError, ValueError, TypeError) as e:
                    shown = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
                    raise self.error(node, f"cannot fold math.{fn.__name__}({shown}) at compile time: {e}") from None
            raise self.error(node, f"math.{fn.__name__} runs at compile time on constants only",
                             "use T.exp, T.log, T.sqrt ... on runtime values")
        fname = getattr(fn, "__name__", type(fn).__name__)
        raise self.error(node, f"'{fname}' is not a tilejit function and cannot be called at run time",
                         "decorate helpers with @tilejit.func, or compute the value outside the kernel",
                         UnsupportedSyntaxError)

    def method_to(self, node: ast.Call, value: Value, args: list, kwargs: dict) -> Value:
        extra = [k for k in kwargs if k != "dtype"]
        if len(args) + len(kwargs) != 1 or extra:
            raise self.error(node, ".to() takes exactly one argument, the dtype"
                             + (f" (unexpected {', '.join(repr(k) for k in extra)})" if extra else ""),
                             "write x.to(T.float16)")
        dtype = args[0] if args else kwargs["dtype"]
        if not isinstance(dtype, DType):
            raise self.error(node, f".to() takes a dtype such as T.float16, got {dtype!r}")
        return self.sem.cast(value, dtype)

    def inline(self, node: ast.Call, helper: JITFunction, args: list, kwargs: dict) -> Any:
        parsed = helper.parsed
        params = parsed.tree.args
        names = [a.arg for a in params.args]
        defaults = params.defaults
        bound: dict[str, Any] = {}
        if len(args) > len(names):
            raise self.error(node, f"{helper.__name__}() takes {len(names)} arguments, got {len(args)}")
        bound.update(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise self.error(node, f"{helper.__name__}() got an unexpected or repeated argument '{k}'"
                                       f"{did_you_mean(k, set(names) - set(bound))}",
                                 f"its parameters: {helper.__name__}({', '.join(names)})")
            bound[k] = v
        for name, default in zip(names[len(names) - len(defaults):], defaults):
            if name not in bound:
                bound[name] = self.visit(default)
        missing = [n for n in names if n not in bound]
        if missing:
            raise self.error(node, f"{helper.__name__}() is missing arguments {missing}")
        if self.inline_depth > 32:
            raise self.error(node, "helpers nest too deeply (recursion is not supported)", cls=UnsupportedSyntaxError)
        from .constructs import check_constructs
        from .source import referenced_globals

        check_constructs(parsed)
        sub = type(self)(parsed, self.b, referenced_globals(helper.fn))
        sub.scope = bound
        sub.offsets = self.offsets
        sub.inline_depth = self.inline_depth + 1
        sub.visit_body(parsed.tree.body, top=True)
        return sub.return_value
