"""Python AST -> tile IR: one visitor for the whole language.

Names are bound to IR values (scalars and tiles), Python constants (folded at compile time), tensor
arguments, dtypes, tuples of those, and the namespaces/functions a kernel may call. Loops and runtime
``if`` statements turn the names they rebind into loop-carried values and ``if`` results.
"""
from __future__ import annotations

import ast
import builtins
import types
from dataclasses import dataclass
from typing import Any

from .. import dtypes as D
from .. import language as lang
from ..dtypes import DType
from ..errors import CompilationError, NameResolutionError, TypeCheckError, UnsupportedSyntaxError
from ..ir import (AxisAttrs, BinaryOp, Block, Builder, CompareOp, ForAttrs, Function, Loc, LoopKind,
                  NoAttrs, OpKind, Param, ReduceKind, ScalarType, TensorType, TileType, UnaryOp, Value)
from .semantic import Semantic, SemanticError, describe, is_const, promote
from .source import JITFunction, ParsedSource
from .spec import ArgSpec, ConstexprSpec, NeedsShape, TensorSpec


@dataclass
class TensorArg:
    """A tensor parameter: its IR value and per-dim extents/strides (IR scalars or ints)."""
    name: str
    value: Value
    shape: tuple[Any, ...]
    strides: tuple[Value, ...]

    @property
    def dtype(self) -> DType:
        return self.value.type.dtype


class _Return(Exception):
    pass


_BINOPS = {
    ast.Add: BinaryOp.ADD, ast.Sub: BinaryOp.SUB, ast.Mult: BinaryOp.MUL, ast.Div: BinaryOp.TRUEDIV,
    ast.FloorDiv: BinaryOp.FLOORDIV, ast.Mod: BinaryOp.MOD, ast.BitAnd: BinaryOp.AND, ast.BitOr: BinaryOp.OR,
    ast.BitXor: BinaryOp.XOR, ast.LShift: BinaryOp.SHL, ast.RShift: BinaryOp.SHR,
}
_CMPOPS = {
    ast.Lt: CompareOp.LT, ast.LtE: CompareOp.LE, ast.Gt: CompareOp.GT, ast.GtE: CompareOp.GE,
    ast.Eq: CompareOp.EQ, ast.NotEq: CompareOp.NE,
}
_UNARY_BUILTINS = {"exp": UnaryOp.EXP, "exp2": UnaryOp.EXP2, "log": UnaryOp.LOG, "sqrt": UnaryOp.SQRT,
                   "rsqrt": UnaryOp.RSQRT, "abs": UnaryOp.ABS}
_REDUCE_BUILTINS = {"sum": ReduceKind.SUM, "max": ReduceKind.MAX, "min": ReduceKind.MIN}
_ALLOWED_MODULES = {"math"}
_CONST_TYPES = (bool, int, float, str, type(None))


def _assigned_names(stmts: list[ast.stmt]) -> list[str]:
    """Names (re)bound anywhere in ``stmts``, in first-seen order."""
    seen: dict[str, None] = {}
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                seen.setdefault(node.id, None)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                seen.setdefault(node.target.id, None)
    return list(seen)


def _last_store(stmts: list[ast.stmt], name: str) -> ast.AST | None:
    """The last place in ``stmts`` (in source order) that binds ``name``: where a loop error should point."""
    found = None
    for stmt in stmts:
        for node in ast.walk(stmt):
            target = node.target if isinstance(node, ast.AugAssign) else node
            if isinstance(target, ast.Name) and target.id == name and isinstance(target.ctx, ast.Store):
                if found is None or (target.lineno, target.col_offset) > (found.lineno, found.col_offset):
                    found = target
    return found


_PURE_KINDS = {OpKind.CONSTANT, OpKind.PROGRAM_ID, OpKind.NUM_PROGRAMS, OpKind.TENSOR_DIM, OpKind.TENSOR_STRIDE,
               OpKind.BINARY, OpKind.UNARY, OpKind.COMPARE, OpKind.SELECT, OpKind.CAST}


def _same_value(a: Any, b: Any, depth: int = 8) -> bool:
    """Whether two scalars are the same computation (``pid * BN`` written twice in ``A[pid * BN:pid * BN + BN]``)."""
    if not (isinstance(a, Value) and isinstance(b, Value)):
        return False
    if a.id == b.id:
        return True
    oa, ob = a.owner, b.owner
    if depth == 0 or oa is None or ob is None or isinstance(oa, Block) or isinstance(ob, Block):
        return False
    return (oa.kind is ob.kind and oa.kind in _PURE_KINDS and oa.attrs == ob.attrs and a.type == b.type
            and len(oa.operands) == len(ob.operands)
            and all(_same_value(x, y, depth - 1) for x, y in zip(oa.operands, ob.operands)))


class CodeGenerator(ast.NodeVisitor):
    def __init__(self, parsed: ParsedSource, builder: Builder, global_env: dict[str, Any]) -> None:
        self.parsed = parsed
        self.b = builder
        self.sem = Semantic(builder)
        self.scope: dict[str, Any] = {}
        self.global_env = global_env
        self.dead: dict[str, str] = {}  # name -> why it is not available here
        self.offsets: dict[int, tuple[Any, int]] = {}  # value id -> (base, constant offset)
        self.return_value: Any = None
        self.inline_depth = 0

    # -- errors and locations --------------------------------------------------------------
    def loc(self, node: ast.AST) -> Loc:
        return Loc(self.parsed.filename, getattr(node, "lineno", 0),
                   getattr(node, "col_offset", 0) + self.parsed.col_offset)

    def error(self, node: ast.AST, message: str, hint: str | None = None,
              cls: type[CompilationError] = TypeCheckError) -> CompilationError:
        loc = self.loc(node)
        return cls(message, filename=loc.filename, lineno=loc.lineno, col=loc.col,
                   source_line=self.parsed.source_line(loc.lineno), hint=hint)

    def visit(self, node: ast.AST) -> Any:
        with self.b.located(self.loc(node) if hasattr(node, "lineno") else None):
            try:
                return super().visit(node)
            except SemanticError as e:
                raise self.error(node, str(e), e.hint) from None

    def generic_visit(self, node: ast.AST) -> Any:
        raise self.error(node, f"unsupported Python construct: {type(node).__name__}",
                         "kernels accept assignments, arithmetic, calls to tilejit.language, for/if and "
                         "@tilejit.func helpers (see DESIGN.md 'The language')", UnsupportedSyntaxError)

    # -- statements ------------------------------------------------------------------------
    def visit_body(self, stmts: list[ast.stmt], top: bool = False) -> None:
        """Visit statements; ``top`` is the function's own body, the only place a ``return`` may end."""
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, ast.Return):
                if self.inline_depth == 0 and stmt.value is not None:
                    raise self.error(stmt, "a kernel cannot return a value",
                                     "kernels write results through stores: Y[i:i + BLOCK] = value",
                                     UnsupportedSyntaxError)
                if not top or i != len(stmts) - 1:
                    raise self.error(stmt, "an early 'return' is not supported",
                                     "a function may return only once, as the last statement of its body "
                                     "(not inside an if or a loop)", UnsupportedSyntaxError)
                self.return_value = None if stmt.value is None else self.visit(stmt.value)
                return
            self.visit(stmt)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        self.visit(node.value)

    def visit_Pass(self, node: ast.Pass) -> None:
        pass

    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.visit(node.value)
        for target in node.targets:
            self.assign(target, value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            raise self.error(node, "a bare annotation declares nothing in a kernel", cls=UnsupportedSyntaxError)
        self.assign(node.target, self.visit(node.value))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(node, f"unsupported operator {type(node.op).__name__}=", cls=UnsupportedSyntaxError)
        if isinstance(node.target, ast.Name):
            current = self.lookup(node.target.id, node.target)
            self.assign(node.target, self.binary(op, current, self.visit(node.value), node))
        elif isinstance(node.target, ast.Subscript):
            window = self.tensor_window(node.target)
            current = self.load(window)
            self.store(window, self.binary(op, current, self.visit(node.value), node), node)
        else:
            raise self.error(node, "augmented assignment needs a name or a tensor slice", cls=UnsupportedSyntaxError)

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.scope[target.id] = value
            self.dead.pop(target.id, None)
            if isinstance(value, Value) and value.name is None and value.owner is not None and not isinstance(value.owner, Block):
                value.name = target.id
        elif isinstance(target, (ast.Tuple, ast.List)):
            if not isinstance(value, tuple):
                raise self.error(target, f"cannot unpack {describe(value)}")
            if len(value) != len(target.elts):
                raise self.error(target, f"cannot unpack {len(value)} values into {len(target.elts)} names")
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            self.store(self.tensor_window(target), value, target)
        else:
            raise self.error(target, f"cannot assign to {type(target).__name__}", cls=UnsupportedSyntaxError)

    def visit_Assert(self, node: ast.Assert) -> None:
        cond = self.visit(node.test)
        if not is_const(cond):
            raise self.error(node, "assert needs a compile-time condition", cls=UnsupportedSyntaxError)
        if not cond:
            msg = self.visit(node.msg) if node.msg is not None else ast.unparse(node.test)
            raise self.error(node, f"assertion failed at compile time: {msg}")

    # -- control flow ----------------------------------------------------------------------
    def visit_If(self, node: ast.If) -> None:
        cond = self.visit(node.test)
        if is_const(cond) or cond is None or isinstance(cond, (DType, tuple)):
            self.visit_body(node.body if cond else node.orelse)
            return
        if not (isinstance(cond, Value) and cond.is_scalar):
            raise self.error(node.test, f"'if' needs a scalar condition, got {describe(cond)}",
                             "use T.where(cond, x, y) for elementwise choices on tiles")
        cond = self.sem.truth(cond)
        before = dict(self.scope)
        branches = []
        for stmts in (node.body, node.orelse):
            block = Block()
            self.scope = dict(before)
            with self.b.at(block):
                self.visit_body(stmts)
            branches.append((block, self.scope))
        self.scope = before
        names = [n for n in _assigned_names(node.body + node.orelse)]
        carried, yields = [], ([], [])
        for name in names:
            then_v, else_v = branches[0][1].get(name), branches[1][1].get(name)
            if then_v is None or else_v is None:
                self.scope.pop(name, None)
                self.dead[name] = "it is assigned in only one branch of an 'if' on a runtime condition"
                continue
            if then_v is else_v or (is_const(then_v) and is_const(else_v) and then_v == else_v
                                    and type(then_v) is type(else_v)):
                self.scope[name] = then_v
                continue
            if not all(isinstance(v, Value) or is_const(v) for v in (then_v, else_v)):
                raise self.error(node, f"'{name}' holds different non-value objects after the two branches")
            target = self._join_type(name, then_v, else_v, node)
            for (block, _), v, out in zip(branches, (then_v, else_v), yields):
                with self.b.at(block):
                    out.append(self._coerce(v, target, name, node))
            carried.append((name, target))
        for (block, _), out in zip(branches, yields):
            with self.b.at(block):
                self.b.create(OpKind.YIELD, out, [], NoAttrs())
        op = self.b.create(OpKind.IF, [cond], [t for _, t in carried], NoAttrs(),
                           regions=[branches[0][0], branches[1][0]])
        for (name, _), result in zip(carried, op.results):
            result.name = name
            self.scope[name] = result

    def _type_of(self, v: Any):
        if isinstance(v, Value):
            return v.type
        return ScalarType(D.float32 if isinstance(v, float) else (D.bool_ if isinstance(v, bool) else
                                                                    (D.int32 if -2**31 <= v < 2**31 else D.int64)))

    def _join_type(self, name: str, a: Any, b: Any, node: ast.AST):
        ta, tb = self._type_of(a), self._type_of(b)
        if ta == tb:
            return ta
        weak_a, weak_b = is_const(a), is_const(b)
        if weak_a and not weak_b and not (isinstance(a, float) and not tb.dtype.is_floating):
            dtype = tb.dtype
        elif weak_b and not weak_a and not (isinstance(b, float) and not ta.dtype.is_floating):
            dtype = ta.dtype
        else:
            dtype = promote(ta.dtype, tb.dtype)
        shapes = {t.shape for t in (ta, tb) if isinstance(t, TileType)}
        if len(shapes) > 1:
            raise self.error(node, f"'{name}' is a tile of shape {ta.shape} on one path and {tb.shape} on the other")
        return TileType(shapes.pop(), dtype) if shapes else ScalarType(dtype)

    def _coerce(self, v: Any, target, name: str, node: ast.AST) -> Value:
        have = self._type_of(v)
        if isinstance(have, TileType) and not isinstance(target, TileType):
            raise self.error(node, f"'{name}' changes from a scalar to a tile of shape {have.shape}",
                             f"initialise '{name}' as a tile, e.g. T.full(shape, value, dtype)")
        v = self.sem.cast(v, target.dtype)
        if isinstance(target, TileType):
            if v.is_tile and v.type.shape != target.shape:
                raise self.error(node, f"'{name}' changes shape from {v.type.shape} to {target.shape}")
            v = self.sem.broadcast_to(v, target.shape)
        return v

    def visit_For(self, node: ast.For) -> None:
        if node.orelse:
            raise self.error(node, "for/else is not supported", cls=UnsupportedSyntaxError)
        call = node.iter
        fn = self.visit(call.func) if isinstance(call, ast.Call) else None
        kind = getattr(fn, "__tilejit_builtin__", None) if fn is not builtins.range else "builtin_range"
        if kind not in ("range", "static_range", "builtin_range"):
            raise self.error(node.iter, "a kernel loop must iterate over range(...), T.range(...) or "
                                        "T.static_range(...)", cls=UnsupportedSyntaxError)
        if not isinstance(node.target, ast.Name):
            raise self.error(node.target, "the loop variable must be a single name", cls=UnsupportedSyntaxError)
        args = [self.visit(a) for a in call.args]
        kwargs = {k.arg: self.visit(k.value) for k in call.keywords}
        stages = kwargs.pop("stages", None)
        if kwargs or stages is not None and kind != "range":
            bad = next(iter(kwargs), "stages")
            raise self.error(call, f"unexpected keyword '{bad}' for this loop")
        if not 1 <= len(args) <= 3:
            raise self.error(call, f"range takes 1 to 3 arguments, got {len(args)}")
        lo, hi, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        for a in (lo, hi, step):
            if not (isinstance(a, int) and not isinstance(a, bool)) and not (
                    isinstance(a, Value) and a.is_scalar and a.dtype.is_integer):
                raise self.error(call, f"loop bounds must be integers, got {describe(a)}")
        if is_const(step) and step == 0:
            raise self.error(call, "range() step must not be zero")
        if kind == "static_range":
            if not all(is_const(a) for a in (lo, hi, step)):
                raise self.error(call, "T.static_range needs compile-time bounds",
                                 "use range(...) for runtime bounds")
            for i in range(lo, hi, step):
                self.scope[node.target.id] = i
                self.visit_body(node.body)
            return
        if stages is not None and not (isinstance(stages, int) and stages >= 1):
            raise self.error(call, f"stages must be a compile-time int >= 1, got {stages!r}")
        self._runtime_loop(node, lo, hi, step,
                           ForAttrs(LoopKind.PIPELINED if kind == "range" else LoopKind.RANGE, stages))

    def _runtime_loop(self, node: ast.For, lo: Any, hi: Any, step: Any, attrs: ForAttrs) -> None:
        iv_dtype = D.int32
        for a in (lo, hi, step):
            iv_dtype = promote(iv_dtype, a.dtype if isinstance(a, Value) else D.int32)
        bounds = [self.sem.cast(a, iv_dtype) for a in (lo, hi, step)]
        before = dict(self.scope)
        candidates = [n for n in _assigned_names(node.body) if n in before and n != node.target.id]
        for n in candidates:
            if not (isinstance(before[n], Value) or is_const(before[n])):
                raise self.error(node, f"'{n}' ({describe(before[n])}) cannot be reassigned inside a loop")
        carried = {n: self._type_of(before[n]) for n in candidates}
        # Visit the body until the carried types stop changing: a name initialised with a Python
        # constant (acc = 0) may become a tile inside the loop.
        for _ in range(4):
            body, yielded = self._loop_body(node, iv_dtype, carried, before)
            joined = {n: self._join_type(n, before[n] if is_const(before[n]) else Value(carried[n]),
                                         yielded[n], _last_store(node.body, n) or node) for n in carried}
            if joined == carried:
                break
            carried = joined
        else:
            raise self.error(node, "loop-carried values keep changing type")
        inits = [self._coerce(before[n], carried[n], n, node) for n in carried]
        with self.b.at(body):
            outs = [self._coerce(yielded[n], carried[n], n, _last_store(node.body, n) or node) for n in carried]
            self.b.create(OpKind.YIELD, outs, [], NoAttrs())
        op = self.b.create(OpKind.FOR, [*bounds, *inits], list(carried.values()), attrs, regions=[body])
        self.scope = before
        for name in [*_assigned_names(node.body), node.target.id]:
            if name not in before:
                self.scope.pop(name, None)
                self.dead[name] = "it is first assigned inside a loop; initialise it before the loop"
        for (name, _), result in zip(carried.items(), op.results):
            result.name = name
            self.scope[name] = result

    def _loop_body(self, node: ast.For, iv_dtype: DType, carried: dict[str, Any], before: dict[str, Any]):
        iv = Value(ScalarType(iv_dtype), node.target.id)
        args = [Value(t, n) for n, t in carried.items()]
        body = Block([iv, *args])
        self.scope = dict(before)
        self.scope[node.target.id] = iv
        self.scope.update(zip(carried, args))
        with self.b.at(body):
            self.visit_body(node.body)
        yielded = {n: self.scope[n] for n in carried}
        self.scope = before
        return body, yielded

    def visit_While(self, node: ast.While) -> None:
        """A runtime ``while`` over scalars: the names it rebinds are carried; tiles may not be."""
        if node.orelse:
            raise self.error(node, "while/else is not supported", cls=UnsupportedSyntaxError)
        before = dict(self.scope)
        candidates = [n for n in _assigned_names(node.body) if n in before]
        for n in candidates:
            if isinstance(before[n], Value) and before[n].is_tile:
                raise self._tile_in_while(node, n)
            if not (isinstance(before[n], Value) or is_const(before[n])):
                raise self.error(node, f"'{n}' ({describe(before[n])}) cannot be reassigned inside a loop")
        carried = {n: self._type_of(before[n]) for n in candidates}
        for _ in range(4):  # as for `for`: a name bound to a Python constant takes the body's type
            cond_block, body, yielded = self._while_regions(node, carried, before)
            joined = {n: self._join_type(n, before[n] if is_const(before[n]) else Value(carried[n]),
                                         yielded[n], _last_store(node.body, n) or node) for n in carried}
            if joined == carried:
                break
            carried = joined
        else:
            raise self.error(node, "loop-carried values keep changing type")
        for n, t in carried.items():
            if isinstance(t, TileType):
                raise self._tile_in_while(_last_store(node.body, n) or node, n)
        inits = [self._coerce(before[n], carried[n], n, node) for n in carried]
        with self.b.at(body):
            outs = [self._coerce(yielded[n], carried[n], n, _last_store(node.body, n) or node) for n in carried]
            self.b.create(OpKind.YIELD, outs, [], NoAttrs())
        op = self.b.create(OpKind.WHILE, inits, list(carried.values()), NoAttrs(), regions=[cond_block, body])
        self.scope = before
        for name in _assigned_names(node.body):
            if name not in before:
                self.scope.pop(name, None)
                self.dead[name] = "it is first assigned inside a loop; initialise it before the loop"
        for (name, _), result in zip(carried.items(), op.results):
            result.name = name
            self.scope[name] = result

    def _tile_in_while(self, node: ast.AST, name: str) -> CompilationError:
        return self.error(node, f"a while loop cannot carry the tile '{name}'",
                          "use for ... in range(...) (or T.range) for loops over tiles", UnsupportedSyntaxError)

    def _while_regions(self, node: ast.While, carried: dict[str, Any], before: dict[str, Any]):
        """The condition block (yields the test as a bool) and the body block (values not yet yielded)."""
        cond_args = [Value(t, n) for n, t in carried.items()]
        cond_block = Block(cond_args)
        self.scope = {**before, **dict(zip(carried, cond_args))}
        with self.b.at(cond_block):
            test = self.visit(node.test)
            if isinstance(test, Value) and test.is_tile:
                raise self.error(node.test, "a while condition must be a scalar, not a tile",
                                 "reduce the tile first, e.g. T.max(x, 0) > 0")
            if not (isinstance(test, Value) or is_const(test)):
                raise self.error(node.test, f"a while condition must be a scalar, got {describe(test)}")
            self.b.create(OpKind.YIELD, [self.sem.as_value(self.sem.truth(test))], [], NoAttrs())
        body_args = [Value(t, n) for n, t in carried.items()]
        body = Block(body_args)
        self.scope = {**before, **dict(zip(carried, body_args))}
        with self.b.at(body):
            self.visit_body(node.body)
        yielded = {n: self.scope[n] for n in carried}
        self.scope = before
        return cond_block, body, yielded

    # -- expressions -----------------------------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, (bool, int, float, str)) or node.value is None:
            return node.value
        raise self.error(node, f"unsupported constant {node.value!r}", cls=UnsupportedSyntaxError)

    def visit_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.visit(e) for e in node.elts)

    visit_List = visit_Tuple

    def lookup(self, name: str, node: ast.AST) -> Any:
        if name in self.scope:
            return self.scope[name]
        if name in self.dead:
            raise self.error(node, f"'{name}' is not defined here: {self.dead[name]}", cls=NameResolutionError)
        if name in self.global_env:
            return self._global(name, self.global_env[name], node)
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise self.error(node, f"name '{name}' is not defined", cls=NameResolutionError)

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
        raise self.error(node, f"global '{name}' ({type(obj).__name__}) cannot be used inside a kernel",
                         "kernels may read int/float/bool constants, dtypes, tilejit.language and "
                         "@tilejit.func helpers from globals; pass other values as arguments",
                         NameResolutionError)

    def visit_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id, node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        base = self.visit(node.value)
        attr = node.attr
        if isinstance(base, types.ModuleType):
            if not hasattr(base, attr):
                raise self.error(node, f"module '{base.__name__}' has no attribute '{attr}'", cls=NameResolutionError)
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
        raise self.error(node, f"{describe(base) if not isinstance(base, TensorArg) else 'tensor ' + base.name} "
                               f"has no attribute '{attr}' in a kernel", cls=NameResolutionError)

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
            if is_const(x) or x is None:
                return not x
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
            if is_const(result):  # short-circuit at compile time
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
            elif isinstance(left, DType) or isinstance(right, DType):
                if not isinstance(op_node, (ast.Eq, ast.NotEq)):
                    raise self.error(node, "dtypes can only be compared with == and !=")
                value = (left == right) == isinstance(op_node, ast.Eq)
            elif type(op_node) not in _CMPOPS:
                raise self.error(node, f"unsupported comparison {type(op_node).__name__}", cls=UnsupportedSyntaxError)
            else:
                value = self.sem.compare(_CMPOPS[type(op_node)], left, right)
            result = value if result is True else self.sem.binary(BinaryOp.AND, self.sem.truth(result), self.sem.truth(value))
            left = right
        return result

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        cond = self.visit(node.test)
        if is_const(cond) or cond is None:
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
        index = node.slice
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
        if not isinstance(tensor, TensorArg):
            raise self.error(node.value, f"only tensor arguments can be sliced-assigned, not {describe(tensor)}")
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rank = len(tensor.shape)
        if len(items) > rank:
            raise self.error(node, f"too many indices ({len(items)}) for tensor '{tensor.name}' of rank {rank}")
        items = list(items) + [ast.Slice(lower=None, upper=None, step=None)] * (rank - len(items))
        starts, lengths, dropped = [], [], []
        for dim, item in enumerate(items):
            if isinstance(item, ast.Slice):
                if item.step is not None:
                    raise self.error(item, "strided slices are not supported", cls=UnsupportedSyntaxError)
                lo = self.visit(item.lower) if item.lower is not None else 0
                if item.upper is None:
                    if item.lower is not None:
                        raise self.error(item, "a slice needs an end: write start:start + BLOCK")
                    extent = tensor.shape[dim]
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
                if isinstance(idx, bool) or not (isinstance(idx, int) or (isinstance(idx, Value) and idx.is_scalar
                                                                          and idx.dtype.is_integer)):
                    raise self.error(item, f"tensor index must be an integer or a slice, got {describe(idx)}")
                starts.append(idx)
                lengths.append(1)
                dropped.append(dim)
        if len(dropped) == rank:
            raise self.error(node, "indexing every dimension with an integer gives a single element",
                             "use a slice of length 1 (i:i + 1) to load a 1-element tile")
        start_values = [self.sem.as_value(s) for s in starts]
        return tensor, start_values, tuple(lengths), tuple(dropped)

    def load(self, window) -> Value:
        tensor, starts, lengths, dropped = window
        return self.sem.load(tensor.value, starts, lengths, dropped)

    def store(self, window, value: Any, node: ast.AST) -> None:
        tensor, starts, lengths, dropped = window
        if not (isinstance(value, Value) or is_const(value)):
            raise self.error(node, f"cannot store {describe(value)} into tensor '{tensor.name}'")
        self.sem.store(tensor.value, starts, lengths, dropped, value)

    # -- calls -----------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> Any:
        fn = self.visit(node.func)
        name = getattr(fn, "__tilejit_builtin__", None)
        if name == "copy":
            return self.builtin_copy(node)
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
            handler = getattr(self, f"builtin_{name}", None)
            if handler is None:
                raise self.error(node, f"T.{name} cannot be called here", cls=UnsupportedSyntaxError)
            try:
                return handler(node, *args, **kwargs)
            except TypeError as e:
                if "builtin_" not in str(e):
                    raise
                raise self.error(node, f"wrong arguments for T.{name}: {str(e).split(') ', 1)[-1]}") from None
        if isinstance(fn, JITFunction):
            return self.inline(node, fn, args, kwargs)
        if fn is lang.constexpr:
            return args[0] if args else None
        if fn in (builtins.min, builtins.max):
            return self.builtin_minmax(node, fn is builtins.max, args)
        if fn is builtins.abs:
            return self.sem.unary(UnaryOp.ABS, args[0])
        if fn in (builtins.float, builtins.int, builtins.bool):
            if all(is_const(a) or isinstance(a, str) for a in args):
                return fn(*args)
            target = {builtins.float: D.float32, builtins.int: D.int32, builtins.bool: D.bool_}[fn]
            return self.sem.cast(args[0], target) if fn is not builtins.bool else self.sem.truth(args[0])
        if fn is builtins.len:
            if len(args) == 1 and isinstance(args[0], tuple):
                return len(args[0])
            raise self.error(node, "len() works on compile-time tuples only")
        if getattr(fn, "__module__", None) == "math" and callable(fn):
            if all(is_const(a) for a in args):
                return fn(*args, **kwargs)
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
                raise self.error(node, f"{helper.__name__}() got an unexpected or repeated argument '{k}'")
            bound[k] = v
        for name, default in zip(names[len(names) - len(defaults):], defaults):
            if name not in bound:
                bound[name] = self.visit(default)
        missing = [n for n in names if n not in bound]
        if missing:
            raise self.error(node, f"{helper.__name__}() is missing arguments {missing}")
        if self.inline_depth > 32:
            raise self.error(node, "helpers nest too deeply (recursion is not supported)", cls=UnsupportedSyntaxError)
        from .source import referenced_globals

        check_constructs(parsed)
        sub = CodeGenerator(parsed, self.b, referenced_globals(helper.fn))
        sub.scope = bound
        sub.offsets = self.offsets
        sub.inline_depth = self.inline_depth + 1
        sub.visit_body(parsed.tree.body, top=True)
        return sub.return_value

    # -- language builtins (one method per T.<name>) -----------------------------------------
    def builtin_program_id(self, node, axis=0):
        return self._grid_query(node, OpKind.PROGRAM_ID, axis)

    def builtin_num_programs(self, node, axis=0):
        return self._grid_query(node, OpKind.NUM_PROGRAMS, axis)

    def _grid_query(self, node, kind: OpKind, axis: Any) -> Value:
        if axis not in (0, 1, 2) or isinstance(axis, bool):
            raise self.error(node, f"grid axis must be 0, 1 or 2, got {axis!r}")
        return self.b.create1(kind, [], ScalarType(D.int32), AxisAttrs(axis))

    def builtin_cdiv(self, node, a, b):
        if is_const(a) and is_const(b):
            return -(-a // b)
        return self.sem.binary(BinaryOp.FLOORDIV, self.sem.binary(BinaryOp.ADD, a, self.sem.binary(BinaryOp.SUB, b, 1)), b)

    def builtin_arange(self, node, start, end=None):
        return self.sem.arange(start, end)

    def builtin_zeros(self, node, shape, dtype=D.float32):
        return self.sem.full(shape, 0, dtype)

    def builtin_full(self, node, shape, value, dtype=None):
        if dtype is None:
            dtype = value.dtype if isinstance(value, Value) else (D.float32 if isinstance(value, float) else D.int32)
        return self.sem.full(shape, value, dtype)

    def builtin_where(self, node, condition, x, y):
        return self.sem.where(condition, x, y)

    def builtin_maximum(self, node, x, y):
        return self.sem.binary(BinaryOp.MAX, x, y)

    def builtin_minimum(self, node, x, y):
        return self.sem.binary(BinaryOp.MIN, x, y)

    def builtin_minmax(self, node, is_max: bool, args: list) -> Any:
        if len(args) == 1 and isinstance(args[0], tuple):
            args = list(args[0])
        if len(args) < 2:
            raise self.error(node, "min()/max() need at least two values")
        result = args[0]
        for a in args[1:]:
            result = self.sem.binary(BinaryOp.MAX if is_max else BinaryOp.MIN, result, a)
        return result

    def builtin_gemm(self, node, a, b, acc, transpose_a=False, transpose_b=False):
        if not (is_const(transpose_a) and is_const(transpose_b)):
            raise self.error(node, "transpose_a/transpose_b must be compile-time bools")
        return self.sem.gemm(a, b, acc, bool(transpose_a), bool(transpose_b))

    def builtin_copy(self, node: ast.Call) -> None:
        if len(node.args) != 2 or node.keywords:
            raise self.error(node, "T.copy takes two arguments: T.copy(src, dst_slice)")
        src = self.visit(node.args[0])
        dst = node.args[1]
        if not isinstance(dst, ast.Subscript):
            raise self.error(dst, "the destination of T.copy must be a tensor slice such as C[m0:m0 + BM, n0:n0 + BN]")
        self.store(self.tensor_window(dst), src, node)

    def _unary(self, node, name: str, x):
        return self.sem.unary(_UNARY_BUILTINS[name], x)

    def builtin_exp(self, node, x):
        return self._unary(node, "exp", x)

    def builtin_exp2(self, node, x):
        return self._unary(node, "exp2", x)

    def builtin_log(self, node, x):
        return self._unary(node, "log", x)

    def builtin_sqrt(self, node, x):
        return self._unary(node, "sqrt", x)

    def builtin_rsqrt(self, node, x):
        return self._unary(node, "rsqrt", x)

    def builtin_abs(self, node, x):
        return self._unary(node, "abs", x)

    def builtin_sum(self, node, x, axis=None):
        return self.sem.reduce(x, axis, ReduceKind.SUM)

    def builtin_max(self, node, x, axis=None):
        return self.sem.reduce(x, axis, ReduceKind.MAX)

    def builtin_min(self, node, x, axis=None):
        return self.sem.reduce(x, axis, ReduceKind.MIN)

def build_function(parsed: ParsedSource, specs: dict[str, ArgSpec], global_env: dict[str, Any]) -> Function:
    """The IR of one specialization: ``specs`` holds every parameter's spec, in order."""
    body = Block()
    builder = Builder(body)
    gen = CodeGenerator(parsed, builder, global_env)
    tree = parsed.tree
    params: list[Param] = []
    for arg in tree.args.args:
        spec = specs[arg.arg]
        if isinstance(spec, ConstexprSpec):
            params.append(Param(arg.arg, "constexpr", None, spec.value))
            gen.scope[arg.arg] = spec.value
        elif isinstance(spec, TensorSpec):
            value = Value(TensorType(spec.dtype, spec.rank), arg.arg)
            params.append(Param(arg.arg, "tensor", value))
            fixed = dict(spec.shape_constants)
            with builder.located(gen.loc(arg)):
                shape = tuple(fixed[d] if d in fixed else builder.create1(
                    OpKind.TENSOR_DIM, [value], ScalarType(D.int64), AxisAttrs(d)) for d in range(spec.rank))
                strides = tuple(builder.create1(OpKind.TENSOR_STRIDE, [value], ScalarType(D.int64), AxisAttrs(d))
                                for d in range(spec.rank))
            for d, s in enumerate(shape):
                if isinstance(s, Value):
                    s.name = f"{arg.arg}_size{d}"
            for d, s in enumerate(strides):
                s.name = f"{arg.arg}_stride{d}"
            gen.scope[arg.arg] = TensorArg(arg.arg, value, shape, strides)
        else:
            value = Value(ScalarType(spec.dtype), arg.arg)
            params.append(Param(arg.arg, "scalar", value))
            gen.scope[arg.arg] = 1 if spec.equals_one else value
    gen.visit_body(tree.body, top=True)
    fn = Function(tree.name, params, body, parsed.filename)
    fn.attrs["tensor_specs"] = {name: spec for name, spec in specs.items() if isinstance(spec, TensorSpec)}
    return fn


_UNSUPPORTED_NODES = tuple(getattr(ast, name) for name in (
    "Try", "TryStar", "With", "AsyncWith", "AsyncFor", "AsyncFunctionDef", "Lambda", "ClassDef", "Global",
    "Nonlocal", "Yield", "YieldFrom", "Await", "ListComp", "DictComp", "SetComp", "GeneratorExp", "Delete",
    "Raise", "Import", "ImportFrom", "Break", "Continue", "Match") if hasattr(ast, name))


def check_constructs(parsed: ParsedSource) -> None:
    """Reject constructs the language lacks anywhere in a kernel's or helper's body, even in branches a
    constexpr ``if`` prunes, so a kernel is rejected before anything is compiled whatever its arguments."""
    gen = CodeGenerator(parsed, Builder(Block()), {})
    for node in ast.walk(parsed.tree):
        if isinstance(node, _UNSUPPORTED_NODES) or (isinstance(node, ast.FunctionDef) and node is not parsed.tree):
            name = type(node).__name__.lower()
            raise gen.error(node, f"'{name}' is not supported in kernels",
                            "see DESIGN.md 'The language' for what kernels accept", UnsupportedSyntaxError)
