"""The constructs the kernel language lacks, rejected anywhere in a kernel's or helper's body before anything is
compiled (even in a branch that a constexpr ``if`` would prune), and the plain words errors use for them."""
from __future__ import annotations

import ast

from ..errors import UnsupportedSyntaxError, docs_link
from .source import ParsedSource

_NO_EXCEPTIONS = ("check compile-time conditions with assert on constexprs, and runtime ones with if or T.where; "
                  "out-of-bounds loads and stores are masked for you")
_HELPER = "define helpers at module level with @tilejit.func (they are inlined)"
_NO_CONTAINERS = ("kernels hold scalars, tiles and compile-time tuples: use a tuple, a tile (T.arange, T.full) "
                  "or separate arguments")

# AST node class name -> (what the user wrote, in words; a hint). Every statement and expression the frontend has
# no visit_ method for is here (tests/frontend/test_errors_corpus.py checks it).
CONSTRUCTS: dict[str, tuple[str, str]] = {
    "Try": ("a 'try' statement", _NO_EXCEPTIONS),
    "TryStar": ("a 'try/except*' statement", _NO_EXCEPTIONS),
    "Raise": ("a 'raise' statement", _NO_EXCEPTIONS),
    "With": ("a 'with' statement", "kernels have no context managers; write the body without it"),
    "AsyncWith": ("an 'async with' statement", "kernels are not coroutines"),
    "AsyncFor": ("an 'async for' loop", "kernels are not coroutines"),
    "AsyncFunctionDef": ("an 'async def' inside a kernel", _HELPER),
    "Await": ("an 'await' expression", "kernels are not coroutines"),
    "FunctionDef": ("a function defined inside a kernel ('def' in its body)", _HELPER),
    "Lambda": ("a 'lambda' expression", _HELPER),
    "ClassDef": ("a class definition", "define classes outside kernels; pass their values as arguments"),
    "Global": ("a 'global' declaration", "kernels cannot assign globals: write results through stores"),
    "Nonlocal": ("a 'nonlocal' declaration", "kernels cannot assign enclosing variables: write results through "
                 "stores"),
    "Yield": ("a 'yield' expression", "kernels are not generators: write results through stores"),
    "YieldFrom": ("a 'yield from' expression", "kernels are not generators: write results through stores"),
    "ListComp": ("a list comprehension ([... for ...])", "build a tile with T.arange / T.full, or unroll a loop "
                 "with T.static_range"),
    "SetComp": ("a set comprehension ({... for ...})", _NO_CONTAINERS),
    "DictComp": ("a dict comprehension ({k: v for ...})", _NO_CONTAINERS),
    "GeneratorExp": ("a generator expression ((... for ...))", "build a tile with T.arange / T.full, or unroll "
                     "a loop with T.static_range"),
    "Delete": ("a 'del' statement", "names need no deleting in kernels; reassign them instead"),
    "Import": ("an 'import' statement", "import at module level; kernels may use tilejit.language and math"),
    "ImportFrom": ("an 'import' statement", "import at module level; kernels may use tilejit.language and math"),
    "Break": ("'break'", "kernel loops run every iteration: guard the rest of the body with an if, or compute "
              "the trip count before the loop"),
    "Continue": ("'continue'", "guard the rest of the loop body with an if"),
    "Match": ("a 'match' statement", "use if/elif on constexprs or runtime scalars"),
    "TypeAlias": ("a 'type' alias", "define type aliases outside kernels"),
    "Dict": ("a dict literal ({...})", _NO_CONTAINERS),
    "Set": ("a set literal ({a, b})", _NO_CONTAINERS),
    "List": ("a list literal ([...])", "a list of constants is a compile-time sequence; for values, build a tile "
             "(T.arange, T.full, T.where) or pass separate arguments"),
    "JoinedStr": ("an f-string", "kernels cannot format strings; use plain string constants or constexprs"),
    "FormattedValue": ("an f-string", "kernels cannot format strings; use plain string constants or constexprs"),
    "Starred": ("a starred expression (*x)", "pass arguments one by one"),
    "NamedExpr": ("an assignment expression (:=)", "assign on a line of its own"),
    "Slice": ("a slice (a:b) outside a tensor or tile subscript", "slice tensors (X[i:i + BLOCK]); tuples take "
              "constant indices"),
    "Return": ("a 'return' here", "a function returns once, as the last statement of its body"),
}

_UNSUPPORTED_NODES = tuple(getattr(ast, name) for name in (
    "Try", "TryStar", "With", "AsyncWith", "AsyncFor", "AsyncFunctionDef", "Lambda", "ClassDef", "Global",
    "Nonlocal", "Yield", "YieldFrom", "Await", "ListComp", "DictComp", "SetComp", "GeneratorExp", "Delete",
    "Raise", "Import", "ImportFrom", "Break", "Continue", "Match", "TypeAlias") if hasattr(ast, name))


def construct_words(node: ast.AST) -> tuple[str, str]:
    """(the construct in plain words, what to do instead) for an AST node the language lacks."""
    name = type(node).__name__
    words, hint = CONSTRUCTS.get(name, (f"this Python construct ({name})", ""))
    more = f"see {docs_link('what-kernels-cannot-do')}"
    return words, f"{hint} ({more})" if hint else more


def unsupported_construct(parsed: ParsedSource, node: ast.AST) -> UnsupportedSyntaxError:
    words, hint = construct_words(node)
    lineno, col = node.lineno, node.col_offset + parsed.col_offset
    return UnsupportedSyntaxError(f"{words} is not supported in kernels", filename=parsed.filename, lineno=lineno,
                                  col=col, source_line=parsed.source_line(lineno), hint=hint)


def check_constructs(parsed: ParsedSource) -> None:
    """Reject constructs the language lacks anywhere in a kernel's or helper's body, even in branches a
    constexpr ``if`` prunes, so a kernel is rejected before anything is compiled whatever its arguments."""
    tree = parsed.tree
    # the decorators above the kernel (autotune configs, heuristics' lambdas) are host code, not kernel code
    parts = [*tree.body, tree.args] + ([tree.returns] if getattr(tree, "returns", None) is not None else []) \
        if isinstance(tree, ast.FunctionDef) else [tree]
    for node in (n for part in parts for n in ast.walk(part)):
        if isinstance(node, _UNSUPPORTED_NODES) or (isinstance(node, ast.FunctionDef) and node is not parsed.tree):
            raise unsupported_construct(parsed, node)
