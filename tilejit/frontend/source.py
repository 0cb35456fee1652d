"""Getting a kernel's Python source, its AST and the locations errors point at."""
from __future__ import annotations

import ast
import hashlib
import inspect
import linecache
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageTypeError


@dataclass
class ParsedSource:
    fn: Callable
    filename: str
    tree: ast.FunctionDef
    text: str           # the dedented source
    col_offset: int     # columns removed by dedent, added back in error locations
    constructs_checked: bool = False  # visitor.check_constructs passed (it runs once, at the first compile)

    def source_line(self, lineno: int) -> str:
        return linecache.getline(self.filename, lineno).rstrip("\n")


def parse_function(fn: Callable) -> ParsedSource:
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as e:
        raise UsageTypeError(f"cannot read the source of {getattr(fn, '__name__', fn)!r}: {e}; "
                             "kernels must be defined in a file (not in an interactive prompt or exec)") from None
    raw = "".join(lines)
    text = textwrap.dedent(raw)
    col_offset = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
    module = ast.parse(text)
    tree = module.body[0]
    if not isinstance(tree, ast.FunctionDef):
        raise UsageTypeError(f"{fn!r} is not a plain function definition")
    ast.increment_lineno(module, first - 1)
    filename = inspect.getsourcefile(fn) or "<unknown>"
    return ParsedSource(fn, filename, tree, text, col_offset)


def check_signature(parsed: ParsedSource) -> None:
    """Reject parameter lists the language has no meaning for (``*args``, ``**kwargs``, keyword-only and
    positional-only parameters) with a located error, before any argument is seen.

    Kept here, away from the AST visitor, so that binding a launch does not import the frontend and the IR: a
    launch whose kernel is found in the disk cache never needs them. The rest of the construct checks runs
    with the frontend (``visitor.check_constructs``), before anything is compiled.
    """
    from ..errors import UnsupportedSyntaxError

    args = parsed.tree.args
    found = [(node, f"kernels cannot take {what}") for what, node in (("*args", args.vararg),
                                                                      ("**kwargs", args.kwarg)) if node]
    found += [(node, "kernels take plain positional-or-keyword parameters only")
              for node in args.posonlyargs + args.kwonlyargs]
    if found:
        node, message = found[0]
        lineno, col = node.lineno, node.col_offset + parsed.col_offset
        raise UnsupportedSyntaxError(message, filename=parsed.filename, lineno=lineno, col=col,
                                     source_line=parsed.source_line(lineno))


def source_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class JITFunction:
    """A ``@tilejit.func`` helper: inlined into the kernels that call it."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._parsed: ParsedSource | None = None

    @property
    def parsed(self) -> ParsedSource:
        if self._parsed is None:
            self._parsed = parse_function(self.fn)
        return self._parsed

    def __call__(self, *args: Any, **kwargs: Any):
        from ..language import LanguageUsageError

        raise LanguageUsageError(f"@tilejit.func {self.__name__}() can only be called inside a kernel")

    def __repr__(self) -> str:
        return f"<tilejit.func {self.__name__}>"


def referenced_helpers(fn: Callable, seen: set[int] | None = None) -> list[JITFunction]:
    """Every ``@tilejit.func`` reachable from ``fn``'s globals/closure by name, transitively."""
    seen = set() if seen is None else seen
    found: list[JITFunction] = []
    for obj in referenced_globals(fn).values():
        if isinstance(obj, JITFunction) and id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)
            found.extend(referenced_helpers(obj.fn, seen))
    return found


def referenced_globals(fn: Callable) -> dict[str, Any]:
    """Globals and closure variables named by ``fn``'s code (what the frontend may resolve)."""
    code = fn.__code__
    names = set(code.co_names)
    stack = [c for c in code.co_consts if inspect.iscode(c)]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if inspect.iscode(k))
    out = {n: fn.__globals__[n] for n in names if n in fn.__globals__}
    if fn.__closure__:
        for name, cell in zip(code.co_freevars, fn.__closure__):
            try:
                out[name] = cell.cell_contents
            except ValueError:
                pass
    return out
