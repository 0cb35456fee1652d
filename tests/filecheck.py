"""A small pure-Python FileCheck for expected-text tests over printed IR and generated CUDA.

``filecheck(text, checks)`` reads directives from ``checks``, one per line, as LLVM FileCheck does:

* ``CHECK: pat``       -- ``pat`` occurs at or after the end of the previous match.
* ``CHECK-NEXT: pat``  -- ``pat`` occurs on the line right after the previous match's line.
* ``CHECK-SAME: pat``  -- ``pat`` occurs on the previous match's line, after that match.
* ``CHECK-NOT: pat``   -- ``pat`` does not occur between the previous match and the next one (or the end).
* ``CHECK-LABEL: pat`` -- like ``CHECK``, but labels are found first and split the text into blocks:
  the checks after a label only look inside its block (up to the next label's match).

A pattern is a literal substring, except ``{{regex}}`` (a Python regex), ``[[NAME:regex]]`` (matches
``regex`` and binds its text to ``NAME``) and ``[[NAME]]`` (the text bound earlier); in ``[[[``, the first
``[`` is literal (``%Y[[[START]]]`` matches ``%Y[%3]``). Runs of spaces in the
literal parts match any run of horizontal whitespace; leading/trailing whitespace of a pattern is ignored.
A match never spans lines. Blank lines and lines starting with ``#`` or ``//`` in ``checks`` are ignored;
any other line must be a directive (a misspelled ``CHEK:`` is an error, not a silent no-op).

On failure it raises ``AssertionError`` naming the failing directive, where the search started, and the
text with line numbers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["filecheck", "FileCheckSyntaxError"]

_KINDS = ("CHECK", "CHECK-NEXT", "CHECK-SAME", "CHECK-NOT", "CHECK-LABEL")
_DIRECTIVE = re.compile(r"^\s*(CHECK(?:-[A-Z]+)?):(.*)$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class FileCheckSyntaxError(ValueError):
    """The check text itself is malformed (unknown directive, unbalanced ``{{``, bad regex, ...)."""


@dataclass
class _Directive:
    kind: str
    pattern: str
    lineno: int  # 1-based line in the check text

    def __str__(self) -> str:
        return f"{self.kind}: {self.pattern}  (check line {self.lineno})"


@dataclass(frozen=True)
class _Pos:
    line: int  # 0-based line of the input
    col: int


@dataclass
class _Match:
    line: int
    start: int
    end: int


@dataclass
class _State:
    variables: dict[str, str] = field(default_factory=dict)


def _parse(checks: str) -> list[_Directive]:
    out = []
    for i, raw in enumerate(checks.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("//"):
            continue
        m = _DIRECTIVE.match(raw)
        if m is None or m.group(1) not in _KINDS:
            raise FileCheckSyntaxError(f"check line {i}: not a FileCheck directive: {raw!r} "
                                       f"(expected one of {', '.join(k + ':' for k in _KINDS)})")
        pattern = m.group(2).strip()
        if not pattern:
            raise FileCheckSyntaxError(f"check line {i}: {m.group(1)} has an empty pattern")
        out.append(_Directive(m.group(1), pattern, i))
    return out


def _literal(text: str) -> str:
    return "[ \t]+".join(re.escape(part) for part in re.split(r"[ \t]+", text))


def _capture_end(pattern: str, start: int) -> int:
    """Index of the ``]]`` closing a ``[[NAME:regex]]`` whose regex starts at ``start``.

    Like LLVM, brackets inside the regex (``[a-z]``) are skipped, so ``[[V:%[a-z]]]`` ends at the last ``]]``.
    """
    depth = 0
    i = start
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            if depth == 0 and pattern.startswith("]]", i):
                return i
            depth = max(depth - 1, 0)
        i += 1
    return -1


def _tokens(d: _Directive):
    """Split a pattern into ("lit", text), ("re", regex), ("def", name, regex) and ("use", name)."""
    pattern = d.pattern
    i = 0
    lit = ""
    while i < len(pattern):
        if pattern.startswith("{{", i):
            end = pattern.find("}}", i + 2)
            if end < 0:
                raise FileCheckSyntaxError(f"unbalanced '{{{{' in {d}")
            yield ("lit", lit)
            lit = ""
            yield ("re", pattern[i + 2:end])
            i = end + 2
        elif pattern.startswith("[[[", i):
            lit += "["  # a literal '[' right before a variable, as in %Y[[[START]]]
            i += 1
        elif pattern.startswith("[[", i):
            m = _NAME.match(pattern, i + 2)
            if m is None:
                raise FileCheckSyntaxError(f"'[[' must start [[NAME]] or [[NAME:regex]] in {d}")
            j = m.end()
            if pattern.startswith("]]", j):
                yield ("lit", lit)
                lit = ""
                yield ("use", m.group())
                i = j + 2
            elif pattern.startswith(":", j):
                end = _capture_end(pattern, j + 1)
                if end < 0:
                    raise FileCheckSyntaxError(f"unbalanced '[[' in {d}")
                yield ("lit", lit)
                lit = ""
                yield ("def", m.group(), pattern[j + 1:end])
                i = end + 2
            else:
                raise FileCheckSyntaxError(f"'[[' must start [[NAME]] or [[NAME:regex]] in {d}")
        else:
            lit += pattern[i]
            i += 1
    yield ("lit", lit)


def _compile(d: _Directive, variables: dict[str, str]) -> tuple[re.Pattern, dict[str, str]]:
    """The regex for ``d`` given the variables bound so far, and {group name: variable name}."""
    parts: list[str] = []
    groups: dict[str, str] = {}      # internal group -> variable
    local: dict[str, str] = {}       # variable -> internal group, for uses later in the same pattern
    for token in _tokens(d):
        kind = token[0]
        if kind == "lit":
            if token[1]:
                parts.append(_literal(token[1]))
        elif kind == "re":
            parts.append(f"(?:{token[1]})")
        elif kind == "def":
            group = f"_v{len(groups)}"
            groups[group] = token[1]
            local[token[1]] = group
            parts.append(f"(?P<{group}>{token[2]})")
        elif token[1] in local:
            parts.append(f"(?P={local[token[1]]})")
        elif token[1] in variables:
            parts.append(re.escape(variables[token[1]]))
        else:
            raise AssertionError(f"filecheck: {d} uses [[{token[1]}]] before it is defined; "
                                 f"defined: {sorted(variables) or 'none'}")
    try:
        return re.compile("".join(parts)), groups
    except re.error as e:
        raise FileCheckSyntaxError(f"bad regex in {d}: {e}") from None


def _search(regex: re.Pattern, lines: list[str], start: _Pos, end: _Pos) -> tuple[_Match, re.Match] | None:
    """First match of ``regex`` in ``[start, end)``, never spanning lines."""
    for li in range(start.line, min(end.line, len(lines) - 1) + 1):
        lo = start.col if li == start.line else 0
        hi = end.col if li == end.line else len(lines[li])
        if lo > hi:
            continue
        m = regex.search(lines[li], lo, hi)
        if m is not None:
            return _Match(li, m.start(), m.end()), m
    return None


def _numbered(lines: list[str], mark: int | None) -> str:
    width = len(str(len(lines)))
    out = []
    for i, line in enumerate(lines):
        arrow = ">>" if i == mark else "  "
        out.append(f"{arrow}{str(i + 1).rjust(width)} | {line}")
    return "\n".join(out)


def _fail(d: _Directive, why: str, lines: list[str], start: _Pos, state: _State) -> AssertionError:
    where = (f"input line {start.line + 1}, column {start.col + 1}"
             if start.line < len(lines) else "the end of the input")
    text = (f"filecheck: {d.kind} failed: {why}\n"
            f"  directive: {d}\n"
            f"  search started at {where}\n")
    if state.variables:
        text += f"  variables: {state.variables}\n"
    text += "input (>> marks the line the search started on):\n" + _numbered(lines, start.line)
    return AssertionError(text)


def filecheck(text: str, checks: str) -> None:
    """Check ``text`` against the directives in ``checks``; raise ``AssertionError`` on a mismatch."""
    directives = _parse(checks)
    if not directives:
        raise FileCheckSyntaxError("no CHECK directives found")
    lines = text.split("\n")
    end_of_text = _Pos(len(lines) - 1, len(lines[-1]))
    state = _State()

    # Labels first: each is searched after the previous one; together they split the text into blocks.
    label_matches: dict[int, _Match] = {}
    cursor = _Pos(0, 0)
    for idx, d in enumerate(directives):
        if d.kind != "CHECK-LABEL":
            continue
        if "[[" in d.pattern:
            raise FileCheckSyntaxError(f"{d}: CHECK-LABEL patterns cannot define or use variables")
        regex, _ = _compile(d, {})
        found = _search(regex, lines, cursor, end_of_text)
        if found is None:
            raise _fail(d, "label not found", lines, cursor, state)
        label_matches[idx] = found[0]
        cursor = _Pos(found[0].line, found[0].end)

    def block_end(after: int) -> _Pos:
        for idx in sorted(label_matches):
            if idx > after:
                m = label_matches[idx]
                return _Pos(m.line, m.start)
        return end_of_text

    prev: _Match | None = None
    pos = _Pos(0, 0)
    limit = block_end(-1)
    pending_not: list[_Directive] = []

    def check_nots(upto: _Pos) -> None:
        for nd in pending_not:
            regex, _ = _compile(nd, state.variables)
            found = _search(regex, lines, pos, upto)
            if found is not None:
                hit = found[0]
                raise _fail(nd, f"pattern found at input line {hit.line + 1}, column {hit.start + 1}: "
                                f"{lines[hit.line][hit.start:hit.end]!r}", lines, pos, state)
        pending_not.clear()

    for idx, d in enumerate(directives):
        if d.kind == "CHECK-NOT":
            pending_not.append(d)
            continue
        if d.kind == "CHECK-LABEL":
            m = label_matches[idx]
            check_nots(_Pos(m.line, m.start))
            prev, pos, limit = m, _Pos(m.line, m.end), block_end(idx)
            continue
        regex, groups = _compile(d, state.variables)
        if d.kind in ("CHECK-NEXT", "CHECK-SAME"):
            if prev is None:
                raise FileCheckSyntaxError(f"{d} has no previous match to follow")
            line = prev.line + 1 if d.kind == "CHECK-NEXT" else prev.line
            start = _Pos(line, 0) if d.kind == "CHECK-NEXT" else pos
            if line >= len(lines):
                raise _fail(d, "there is no next line", lines, _Pos(len(lines), 0), state)
            found = _search(regex, lines, start, _Pos(line, len(lines[line])))
            if found is None:
                what = "the line after the previous match" if d.kind == "CHECK-NEXT" else \
                    "the rest of the previous match's line"
                raise _fail(d, f"pattern not found on {what}", lines, start, state)
        else:
            found = _search(regex, lines, pos, limit)
            if found is None:
                raise _fail(d, "pattern not found", lines, pos, state)
        match, m = found
        check_nots(_Pos(match.line, match.start))
        for group, name in groups.items():
            state.variables[name] = m.group(group)
        prev, pos = match, _Pos(match.line, match.end)
    check_nots(limit)
