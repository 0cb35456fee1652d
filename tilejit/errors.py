"""tilejit's exceptions, in one small hierarchy.

``TilejitError`` is the root. A user's mistake in kernel code is a ``CompilationError`` (or a subclass) that
points at the file, line and column of the kernel and shows the line with a caret, like a C compiler does. A
failure below the user's code is a ``BackendCompileError`` (NVRTC rejected generated source) or a
``LaunchError`` (the CUDA driver refused to load or launch a kernel).
"""
from __future__ import annotations

from collections.abc import Sequence


class TilejitError(Exception):
    """Base class of every error tilejit raises on purpose."""


class CompilationError(TilejitError):
    """A problem in the user's kernel, located in its source.

    ``str()`` gives ``file:line:col: error: message``, then the source line with a caret under the column,
    then ``hint: ...`` when a hint is given. ``lineno`` is 1-based and ``col`` is 0-based, as in Python's
    ``ast`` nodes; the printed column is 1-based, as compilers print it.
    """

    def __init__(
        self,
        message: str,
        *,
        filename: str | None = None,
        lineno: int | None = None,
        col: int | None = None,
        source_line: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.filename = filename
        self.lineno = lineno
        self.col = col
        self.source_line = source_line
        self.hint = hint
        super().__init__(message)

    def location(self) -> str:
        """``file:line:col`` with whatever parts are known ("<unknown>" when no file is)."""
        parts = [self.filename or "<unknown>"]
        if self.lineno is not None:
            parts.append(str(self.lineno))
            if self.col is not None:
                parts.append(str(self.col + 1))
        return ":".join(parts)

    def __str__(self) -> str:
        lines = [f"{self.location()}: error: {self.message}"]
        if self.source_line is not None:
            # Tabs are shown as 4 spaces in the line and counted as 4 columns before the caret, so they agree.
            raw = self.source_line.rstrip("\n")
            shown = raw.expandtabs(4)
            lines.append("    " + shown)
            if self.col is not None:
                caret_col = len(raw[: self.col].expandtabs(4))
                lines.append("    " + " " * caret_col + "^")
        lines.extend(self._detail_lines())
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)

    def _detail_lines(self) -> list[str]:
        """Extra lines a subclass shows between the caret and the hint."""
        return []


class UnsupportedSyntaxError(CompilationError):
    """A Python construct that tilejit kernels do not support (``try``, ``with``, closures, ...)."""


class TypeCheckError(CompilationError):
    """A shape or dtype mismatch found by inference (``(64, 32) @ (16, 64)``, ``int8 + bfloat16``, ...)."""


class NameResolutionError(CompilationError):
    """A name in the kernel that is neither a parameter, a local, a constexpr global nor a tilejit builtin."""


class DispatchError(CompilationError):
    """No registered lowering fits an op; the message lists every candidate and the predicate that rejected it."""

    def __init__(
        self,
        message: str,
        candidates: Sequence[tuple[str, str]] = (),
        **location: object,
    ) -> None:
        self.candidates: tuple[tuple[str, str], ...] = tuple(candidates)
        super().__init__(message, **location)  # type: ignore[arg-type]

    def _detail_lines(self) -> list[str]:
        if not self.candidates:  # callers may list them in the message themselves
            return []
        width = max(len(name) for name, _ in self.candidates)
        return ["candidates:"] + [f"  {name.ljust(width)}  rejected: {why}" for name, why in self.candidates]


class SharedMemoryError(CompilationError):
    """A kernel's tiles need more shared memory than one block may have on the target, even unpipelined."""


class BackendCompileError(TilejitError):
    """NVRTC rejected the generated CUDA source: a tilejit bug or an unsupported arch/feature combination.

    ``log`` is NVRTC's full log, ``arch`` the target, ``source`` the generated CUDA text. ``source_path`` is
    where that text was written (a temporary file first; the cache may move it and set ``source_path`` again).
    """

    def __init__(self, log: str, *, arch: str, source: str, source_path: str | None = None, name: str = "") -> None:
        self.log = log
        self.arch = arch
        self.source = source
        self.source_path = source_path
        self.name = name
        super().__init__(log)

    def __str__(self) -> str:
        what = f"kernel {self.name!r}" if self.name else "generated CUDA source"
        where = self.source_path or "<not written>"
        return (
            f"NVRTC failed to compile {what} for {self.arch} (this is a tilejit bug, please report it with the "
            f"source file)\nsource: {where}\nNVRTC log:\n{self.log.rstrip()}"
        )


class BackendUnavailableError(TilejitError):
    """A piece of the CUDA toolchain (cuda-python, the NVRTC library, the driver) is missing; says what to install."""


class LaunchError(TilejitError):
    """The CUDA driver refused to load or launch a kernel (bad cubin, too much shared memory, bad grid, ...)."""


class ArgumentError(TilejitError, TypeError):
    """A launch's arguments do not fit the kernel: arity, argument types, tensor dtypes, constexpr types. Also a
    TypeError, as Python's own call errors are."""


class ArgumentValueError(TilejitError, ValueError):
    """A launch's values are out of range: the grid, a launch option, an int too wide for its parameter, tensors
    on different devices. Also a ValueError."""
