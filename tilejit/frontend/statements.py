"""Statements of the kernel language: assignments, ``if``, ``for`` (runtime, static and pipelined), ``while``,
``assert``. Names rebound in a runtime ``if`` or loop become ``if`` results or loop-carried values."""
from __future__ import annotations

import ast
import builtins
from typing import Any

from .. import dtypes as D
from ..dtypes import DType
from ..errors import CompilationError, UnsupportedSyntaxError, did_you_mean, docs_link
from ..ir import Block, ForAttrs, LoopKind, NoAttrs, OpKind, ScalarType, TileType, Value
from .expressions import _BINOPS
from .semantic import describe, is_const, promote


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


class Statements:
    """The statement visitors of :class:`~tilejit.frontend.visitor.CodeGenerator`."""

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
            symbol = {ast.MatMult: "@", ast.Pow: "**"}.get(type(node.op), type(node.op).__name__)
            raise self.error(node, f"'{symbol}=' is not supported in kernels",
                             f"write it out: x = x {symbol} y" + (" (or acc = T.gemm(a, b, acc) to accumulate a "
                                                                   "product)" if symbol == "@" else ""),
                             UnsupportedSyntaxError)
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
            what = {ast.Attribute: "an attribute (x.name = ...)", ast.Starred: "a starred name (*rest)"}.get(
                type(target), f"this target ({type(target).__name__})")
            raise self.error(target, f"cannot assign to {what} in a kernel",
                             "assign to a name, a tuple of names, or a tensor slice (X[i:i + BLOCK] = tile)",
                             UnsupportedSyntaxError)

    def visit_Assert(self, node: ast.Assert) -> None:
        cond = self.visit(node.test)
        if not (is_const(cond) or cond is None or isinstance(cond, (DType, tuple, str))):
            raise self.error(node, "assert needs a compile-time condition", cls=UnsupportedSyntaxError)
        if not cond:
            msg = self.visit(node.msg) if node.msg is not None else ast.unparse(node.test)
            raise self.error(node, f"assertion failed at compile time: {msg}")

    # -- control flow ----------------------------------------------------------------------
    def visit_If(self, node: ast.If) -> None:
        cond = self.visit(node.test)
        if is_const(cond) or cond is None or isinstance(cond, (DType, tuple, str)):
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

    def _not_carried(self, node: ast.AST, name: str, value: Any):
        """The error for a loop that reassigns ``name``, which holds something a loop cannot carry."""
        hint = (f"start it as a value: {name} = T.zeros((BM, BN), T.float32) for an accumulator, or 0 / 0.0"
                if value is None else "carry values (tiles, scalars or constants) through loops")
        return self.error(node, f"'{name}' ({describe(value)}) cannot be reassigned inside a loop", hint)

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
        given = list(kwargs)
        stages = kwargs.pop("stages", None)
        specialize = kwargs.pop("warp_specialize", None)
        if kwargs or given and kind != "range":
            bad = next(iter(kwargs), given[0] if given else "stages")
            allowed = ["stages", "warp_specialize"] if kind == "range" else []
            raise self.error(call, f"unexpected keyword '{bad}' for this loop{did_you_mean(bad, allowed)}",
                             "only T.range takes keywords: T.range(lo, hi, step, stages=S, warp_specialize=B)")
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
        if stages is not None and not (isinstance(stages, int) and not isinstance(stages, bool) and stages >= 1):
            raise self.error(call, f"stages must be a compile-time int >= 1, got {describe(stages)}")
        if specialize is not None and not isinstance(specialize, bool):
            raise self.error(call, f"warp_specialize must be a compile-time True or False, got {describe(specialize)}")
        self._runtime_loop(node, lo, hi, step,
                           ForAttrs(LoopKind.PIPELINED if kind == "range" else LoopKind.RANGE, stages,
                                    warp_specialize=specialize))

    def _runtime_loop(self, node: ast.For, lo: Any, hi: Any, step: Any, attrs: ForAttrs) -> None:
        iv_dtype = D.int32
        for a in (lo, hi, step):
            iv_dtype = promote(iv_dtype, a.dtype if isinstance(a, Value) else D.int32)
        bounds = [self.sem.cast(a, iv_dtype) for a in (lo, hi, step)]
        before = dict(self.scope)
        candidates = [n for n in _assigned_names(node.body) if n in before and n != node.target.id]
        for n in candidates:
            if not (isinstance(before[n], Value) or is_const(before[n])):
                raise self._not_carried(node, n, before[n])
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
        self._check_while_condition(node)  # a tile as the condition is the real mistake, even when one is carried
        candidates = [n for n in _assigned_names(node.body) if n in before]
        for n in candidates:
            if isinstance(before[n], Value) and before[n].is_tile:
                raise self._tile_in_while(node, n)
            if not (isinstance(before[n], Value) or is_const(before[n])):
                raise self._not_carried(node, n, before[n])
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
                          "use for ... in range(...) (or T.range) for loops over tiles; a while loop carries "
                          f"scalars only ({docs_link('while-loops')})", UnsupportedSyntaxError)

    def _check_while_condition(self, node: ast.While) -> None:
        """The condition, evaluated once on the values before the loop into a block that is dropped: a tile
        there is reported as such, not as the tile the body carries."""
        saved = dict(self.scope)
        try:
            with self.b.at(Block()):
                test = self.visit(node.test)
        finally:
            self.scope = saved
        if isinstance(test, Value) and test.is_tile:
            raise self._tile_condition(node.test)

    def _tile_condition(self, node: ast.AST) -> CompilationError:
        return self.error(node, "a while condition must be a scalar, not a tile",
                          "reduce the tile first, e.g. while T.max(x, 0) > 0 (the loop then cannot carry x: "
                          f"tiles are carried by for loops only; {docs_link('while-loops')})")

    def _while_regions(self, node: ast.While, carried: dict[str, Any], before: dict[str, Any]):
        """The condition block (yields the test as a bool) and the body block (values not yet yielded)."""
        cond_args = [Value(t, n) for n, t in carried.items()]
        cond_block = Block(cond_args)
        self.scope = {**before, **dict(zip(carried, cond_args))}
        with self.b.at(cond_block):
            test = self.visit(node.test)
            if isinstance(test, Value) and test.is_tile:
                raise self._tile_condition(node.test)
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
