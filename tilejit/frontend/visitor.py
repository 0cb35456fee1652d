"""Python AST -> tile IR: the code generator, composed of the statement and expression visitors, and the
entry points that build one specialization's IR and check a kernel's constructs.

Names are bound to IR values (scalars and tiles), Python constants (folded at compile time), tensor
arguments, dtypes, tuples of those, and the namespaces/functions a kernel may call. Loops and runtime
``if`` statements turn the names they rebind into loop-carried values and ``if`` results. The statements live in
``statements.py``, the expressions in ``expressions.py``, the ``T.<name>`` builtins in ``builtins.py``.
"""
from __future__ import annotations

import ast
from typing import Any

from .. import dtypes as D
from ..errors import CompilationError, LimitError, TypeCheckError, UnsupportedSyntaxError
from ..ir import (AxisAttrs, Block, Builder, Function, Loc, MultipleOf, OpKind, Param, ScalarType, TensorListType,
                  TensorType, Value)
from .expressions import Expressions, TensorArg, TensorListArg
from .limits import MAX_NESTING_DEPTH, CountingBuilder, LimitExceeded
from .semantic import Semantic, SemanticError
from .source import ParsedSource
from .spec import ArgSpec, ConstexprSpec, TensorListSpec, TensorSpec
from .constructs import check_constructs, construct_words
from .statements import Statements

__all__ = ["CodeGenerator", "TensorArg", "build_function", "check_constructs"]


class CodeGenerator(Statements, Expressions, ast.NodeVisitor):
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
        self.nesting = 0  # syntax nodes being visited, one inside the other (helpers' bodies included)

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
        self.nesting += 1
        with self.b.located(self.loc(node) if hasattr(node, "lineno") else None):
            try:
                if self.nesting > MAX_NESTING_DEPTH:
                    raise LimitExceeded(f"expressions and statements nest more than {MAX_NESTING_DEPTH} deep here",
                                        "split the expression with intermediate variables (acc = a + b; acc = acc + c)")
                return super().visit(node)
            except SemanticError as e:
                raise self.error(node, str(e), e.hint) from None
            except LimitExceeded as e:
                raise self.error(node, str(e), e.hint, LimitError) from None
            finally:
                self.nesting -= 1

    def generic_visit(self, node: ast.AST) -> Any:
        words, hint = construct_words(node)
        raise self.error(node, f"{words} is not supported in kernels", hint, UnsupportedSyntaxError)

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


def build_function(parsed: ParsedSource, specs: dict[str, ArgSpec], global_env: dict[str, Any]) -> Function:
    """The IR of one specialization: ``specs`` holds every parameter's spec, in order."""
    body = Block()
    builder = CountingBuilder(body)
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
        elif isinstance(spec, TensorListSpec):
            value = Value(TensorListType(spec.dtype, spec.rank), arg.arg)
            params.append(Param(arg.arg, "tensor_list", value))
            gen.scope[arg.arg] = TensorListArg(arg.arg, value)
        else:
            value = Value(ScalarType(spec.dtype), arg.arg)
            if spec.divisible16 and not spec.equals_one:  # the specialization's promise (part of the cache key)
                value.multiple_of = MultipleOf((16,))
            params.append(Param(arg.arg, "scalar", value))
            gen.scope[arg.arg] = value
            if spec.equals_one:
                with builder.located(gen.loc(arg)):
                    gen.scope[arg.arg] = gen.sem.constant(1, spec.dtype)
    try:
        gen.visit_body(tree.body, top=True)
    except RecursionError:  # the caller's own stack was deep: Python's limit came before MAX_NESTING_DEPTH
        raise gen.error(tree, "the kernel nests too deeply for Python's stack", "split deep expressions with "
                        "intermediate variables, or compile from a shallower call stack", LimitError) from None
    fn = Function(tree.name, params, body, parsed.filename)
    fn.attrs["tensor_specs"] = {name: spec for name, spec in specs.items() if isinstance(spec, TensorSpec)}
    # the items of a tensor list are named after it (As[g] is a value named As): what all of them share
    fn.attrs["tensor_specs"].update({name: spec.item_spec() for name, spec in specs.items()
                                     if isinstance(spec, TensorListSpec)})
    return fn
