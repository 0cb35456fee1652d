"""The constructs the kernel language lacks, rejected anywhere in a kernel's or helper's body before anything is
compiled (even in a branch that a constexpr ``if`` would prune)."""
from __future__ import annotations

import ast

from ..errors import UnsupportedSyntaxError
from .source import ParsedSource


_UNSUPPORTED_NODES = tuple(getattr(ast, name) for name in (
    "Try", "TryStar", "With", "AsyncWith", "AsyncFor", "AsyncFunctionDef", "Lambda", "ClassDef", "Global",
    "Nonlocal", "Yield", "YieldFrom", "Await", "ListComp", "DictComp", "SetComp", "GeneratorExp", "Delete",
    "Raise", "Import", "ImportFrom", "Break", "Continue", "Match") if hasattr(ast, name))



def check_constructs(parsed: ParsedSource) -> None:
    """Reject constructs the language lacks anywhere in a kernel's or helper's body, even in branches a
    constexpr ``if`` prunes, so a kernel is rejected before anything is compiled whatever its arguments."""
    tree = parsed.tree
    # the decorators above the kernel (autotune configs, heuristics' lambdas) are host code, not kernel code
    parts = [*tree.body, tree.args] + ([tree.returns] if getattr(tree, "returns", None) is not None else []) \
        if isinstance(tree, ast.FunctionDef) else [tree]
    for node in (n for part in parts for n in ast.walk(part)):
        if isinstance(node, _UNSUPPORTED_NODES) or (isinstance(node, ast.FunctionDef) and node is not parsed.tree):
            name = type(node).__name__.lower()
            lineno, col = node.lineno, node.col_offset + parsed.col_offset
            raise UnsupportedSyntaxError(f"'{name}' is not supported in kernels", filename=parsed.filename,
                                         lineno=lineno, col=col, source_line=parsed.source_line(lineno),
                                         hint="see DESIGN.md 'The language' for what kernels accept")
