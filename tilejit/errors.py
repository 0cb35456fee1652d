"""tilejit's exceptions, in one small hierarchy.

``TilejitError`` is the root. A user's mistake in kernel code is a ``CompilationError`` (or a subclass) that
points at the file, line and column of the kernel and shows the line with a caret, like a C compiler does. A
failure below the user's code is a ``BackendCompileError`` (NVRTC rejected generated source) or a
``LaunchError`` (the CUDA driver refused to load or launch a kernel). A public function called the wrong way
(a launch's arguments, grid or options, an unknown arch) raises a ``UsageError``, which is also the
``TypeError`` or ``ValueError`` Python code expects. Anything else escaping tilejit is a bug: the public entry
points wrap it in an ``InternalError`` that says so (:func:`entry_point`).
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import inspect
import linecache
import os
import sys
import sysconfig
import types
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Callable, TypeVar


LANGUAGE_DOCS = "docs/language.md"


def docs_link(section: str) -> str:
    """Where the language reference explains ``section`` (an anchor of docs/language.md, shipped in the package:
    ``tilejit.docs()`` gives its path)."""
    return f"{LANGUAGE_DOCS}#{section}"


def did_you_mean(name: str, candidates: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean 'alpha'?)`` for the close matches of ``name`` among ``candidates``, else ""."""
    matches = close_matches(name, candidates)
    if not matches:
        return ""
    return f" (did you mean {' or '.join(repr(prefix + m) for m in matches)}?)"


def close_matches(name: str, candidates: Iterable[str]) -> list[str]:
    """Up to three of ``candidates`` that look like a misspelling of ``name``, best first. Case is ignored
    (``n`` suggests ``N``): names that differ only in case are the likeliest slips."""
    by_folded: dict[str, list[str]] = {}
    for candidate in sorted(set(candidates) - {name}):
        by_folded.setdefault(candidate.casefold(), []).append(candidate)
    folded = difflib.get_close_matches(name.casefold(), list(by_folded), n=3, cutoff=0.6)
    return [candidate for f in folded for candidate in by_folded[f]][:3]


def source_line(loc: Any) -> str | None:
    """The source line an IR location (``filename``, ``lineno``) points at, or None when it cannot be read."""
    if loc is None:
        return None
    return linecache.getline(loc.filename, loc.lineno).rstrip("\n") or None


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

    @classmethod
    def at(cls, loc: Any, message: str, *, hint: str | None = None, **details: Any):
        """The error located at ``loc`` (an IR op's location: ``filename``, ``lineno``, ``col``), its source line
        read back for the caret; without a location, just the message. ``details`` go to a subclass's own
        arguments (a ``SharedMemoryError``'s ``needs``)."""
        if loc is None:
            return cls(message, hint=hint, **details)
        return cls(message, filename=loc.filename, lineno=loc.lineno, col=loc.col, source_line=source_line(loc),
                   hint=hint, **details)

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
    """A kernel's tiles need more shared memory than one block may have on the target, even unpipelined.

    ``needs`` lists each shared tile (and the scratch buffer) with its bytes, shown below the caret."""

    def __init__(self, message: str, needs: Sequence[str] = (), **location: object) -> None:
        self.needs: tuple[str, ...] = tuple(needs)
        super().__init__(message, **location)  # type: ignore[arg-type]

    def _detail_lines(self) -> list[str]:
        return ["shared memory by tile:"] + [f"  {need}" for need in self.needs] if self.needs else []


class RegisterError(CompilationError):
    """A kernel's tiles need more registers per thread than a block of its thread count can give each thread
    (65,536 per block: many warps, or pingpong's two groups, leave each fewer)."""


class LimitError(CompilationError):
    """A kernel beyond one of the compiler's limits (tile elements, nesting depth, kernel size; their values are in
    ``tilejit.frontend.limits`` and the language docs)."""


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


class UsageError(TilejitError):
    """A public function called the wrong way: a launch's arguments, grid or options, an unknown arch ..."""


class UsageTypeError(UsageError, TypeError):
    """A :class:`UsageError` about the type or number of arguments (still a ``TypeError`` to callers)."""


class UsageValueError(UsageError, ValueError):
    """A :class:`UsageError` about an argument's value (still a ``ValueError`` to callers)."""


class UsageRuntimeError(UsageError, RuntimeError):
    """A :class:`UsageError` about the machine: no GPU to launch on or to read the arch from."""


class ArgumentError(UsageTypeError):
    """A launch's arguments do not fit the kernel: arity, argument types, tensor dtypes, constexpr types. Also a
    TypeError, as Python's own call errors are."""


class ArgumentValueError(UsageValueError):
    """A launch's values are out of range: the grid, a launch option, an int too wide for its parameter, tensors
    on different devices. Also a ValueError."""


class InternalError(TilejitError):
    """An exception that escaped tilejit's own code: a tilejit bug. The original is its ``__cause__``.

    :meth:`wrapping` makes one that is also an instance of the original's class when it can (an internal
    ``ValueError`` is still caught by ``except ValueError``).
    """

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return self.message

    @classmethod
    def wrapping(cls, error: BaseException) -> "InternalError":
        from .version import __version__

        message = (f"{type(error).__name__}: {error}\nthis is a tilejit bug; please report it with the traceback "
                   f"above, the kernel's source and its launch arguments (tilejit {__version__}, Python "
                   f"{sys.version.split()[0]})")
        return _internal_error(type(error), message)

    def __reduce__(self):  # the mixed-in classes are made at run time: pickle by what they wrap
        return _internal_error, (getattr(type(self), "wraps", None), self.message)


_internal_error_classes: dict[type, type] = {}


def _internal_error(wraps: type | None, message: str) -> InternalError:
    """An InternalError that is also a ``wraps`` when that class can be mixed in and built from one message."""
    if wraps is None:
        return InternalError(message)
    try:
        kind = _internal_error_classes.get(wraps)
        if kind is None:
            kind = type("InternalError", (InternalError, wraps), {"__module__": __name__, "wraps": wraps})
            _internal_error_classes[wraps] = kind
        return kind(message)
    except TypeError:  # a class that cannot be mixed in or built from one message (UnicodeDecodeError ...)
        return InternalError(message)


# -- public entry points: tracebacks that start at the user's code ------------------------------------------

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LIBRARY_DIRS = tuple({os.path.abspath(p) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                       if (p := sysconfig.get_paths().get(key))})


def _is_tilejit_file(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE_DIR)


def _is_library_file(filename: str) -> bool:
    """Python's own modules and installed packages (torch ...): neither tilejit nor the user's code."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap> is Python's; <stdin> and <string> the user's
        return not filename.startswith(("<stdin>", "<string>"))
    path = os.path.abspath(filename)
    return path.startswith(_LIBRARY_DIRS) or f"{os.sep}site-packages{os.sep}" in path


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` issued by the caller that makes the warning name the user's line
    (their launch, ``compile`` or autotuned call), not tilejit's: the first frame out from the caller that is
    neither tilejit's nor a library's that tilejit runs under (else the first frame outside tilejit)."""
    frame, level, outside_tilejit = sys._getframe(1), 1, None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_tilejit_file(filename):
            if not _is_library_file(filename):
                return level
            outside_tilejit = outside_tilejit or level
        frame, level = frame.f_back, level + 1
    return outside_tilejit or 1


#: The frame that entered ``user_call_site`` (tilejit's, called from the user's launch or ``compile`` line), for the
#: warnings of the work it starts: compile threads run in a copy of the context (``contextvars.copy_context``).
_CALL_SITE: contextvars.ContextVar[types.FrameType | None] = contextvars.ContextVar("tilejit_call_site", default=None)


@contextlib.contextmanager
def user_call_site():
    """Within this block (and in the threads started with a copy of its context), :func:`warn_user` names the
    line of the user's that called into tilejit: their launch, autotuned launch or ``compile``. The outermost block
    decides; entering one costs a frame reference, the user's frame is found only when a warning is issued."""
    if _CALL_SITE.get() is not None:
        yield
        return
    token = _CALL_SITE.set(sys._getframe(2))  # the caller of the ``with`` (1 is contextlib's __enter__)
    try:
        yield
    finally:
        _CALL_SITE.reset(token)


def _user_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The first frame out from ``frame`` that is neither tilejit's nor a library's (None when there is none)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_tilejit_file(filename) and not _is_library_file(filename):
            return frame
        frame = frame.f_back
    return None


def warn_user(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` located at the user's line: the call that ``user_call_site`` recorded, from whatever thread
    the warning comes (a config compiling on the autotuner's threads), else the first user frame out from the
    caller, as :func:`user_stacklevel` finds it."""
    site = _CALL_SITE.get()
    frame = _user_frame(site) if site is not None else None
    if frame is None:
        warnings.warn(message, category, stacklevel=user_stacklevel())
        return
    module_globals = frame.f_globals
    # (no module_globals: it only lets the warnings module ask the frame's loader for the line's source, and
    # loaders refuse in ways of their own: a module run as __main__ by `python -m` raises ImportError, code
    # torch.compile generates has no __spec__.loader and warn_explicit raises ValueError; linecache reads the
    # file by its name instead)
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=module_globals.get("__name__"),
                           registry=module_globals.setdefault("__warningregistry__", {}))


def user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without tilejit's frames and the library frames tilejit called (``ast``, torch ...): the user's
    own frames are kept, with the library frames they called."""
    kept, owner_is_user = [], True
    for t in _walk(tb):
        filename = t.tb_frame.f_code.co_filename
        if _is_tilejit_file(filename):
            owner_is_user = False
        elif not _is_library_file(filename):
            owner_is_user = True
            kept.append(t)
        elif owner_is_user:
            kept.append(t)
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _walk(tb: types.TracebackType | None) -> list[types.TracebackType]:
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next
    return out


def is_tilejit_bug(error: BaseException) -> bool:
    """Whether ``error`` is a tilejit bug: not a :class:`TilejitError`, and raised by tilejit's code (or by a
    library it called) rather than by the user's own code that tilejit called (a grid function, a hook)."""
    if isinstance(error, TilejitError) or getattr(error, _RAISED_IN_USER_CODE, False):
        return False
    for t in reversed(_walk(error.__traceback__)):
        filename = t.tb_frame.f_code.co_filename
        if _is_tilejit_file(filename):
            return True
        if not _is_library_file(filename):
            return False
    return True


# set on an exception that left a user's function called through call_user_function: the user's, whatever
# frames it passed (a grid function calling tilejit.cdiv wrongly is still the grid function's mistake)
_RAISED_IN_USER_CODE = "_tilejit_raised_in_user_code"


def call_user_function(fn: Callable[..., Any], role: str, expects: str, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` for a function of the user's that tilejit calls back (a grid function, a Config's
    pre_hook, a prune function, a heuristic). What goes wrong there is the user's mistake, never a tilejit bug:
    a function whose parameters cannot take the call raises a :class:`UsageTypeError` naming it, where it is
    defined and what it must take (``role`` says what the function is, ``expects`` how to write it); an exception
    raised inside it keeps its traceback (the user's lines) and is marked as the user's."""
    try:
        return fn(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - re-raised, or replaced by the user's signature mistake
        if isinstance(error, TypeError) and not _can_take(fn, args, kwargs):
            mistake = UsageTypeError(f"{role} ({describe_function(fn)}) cannot be called as tilejit calls it: "
                                     f"{_call_error_text(fn, error)}; {expects}")
            setattr(mistake, _RAISED_IN_USER_CODE, True)
            raise mistake from None
        try:
            setattr(error, _RAISED_IN_USER_CODE, True)
        except AttributeError:  # an exception class without a __dict__: judged by its frames
            pass
        if hasattr(error, "add_note"):  # Python 3.11+: printed under the user's traceback
            given = [a for a in args if isinstance(a, dict)]
            keys = f", given a dict of {', '.join(map(str, given[0]))}" if given else ""
            error.add_note(f"tilejit: raised inside {role} ({describe_function(fn)}){keys}")
        raise


def raised_in_user_code(error: BaseException) -> bool:
    """Whether ``error`` left a user's function that tilejit called back (see :func:`call_user_function`): the
    same mistake would recur with any config, so the autotuner raises it instead of skipping a config."""
    return bool(getattr(error, _RAISED_IN_USER_CODE, False))


def describe_function(fn: Callable[..., Any]) -> str:
    """``<lambda> at /path/file.py:12``: a function's name and where it is defined, when Python knows."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    code = getattr(fn, "__code__", None)
    if code is None:
        return name
    return f"{name} at {code.co_filename}:{code.co_firstlineno}"


def _can_take(fn: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether ``fn``'s signature accepts these arguments (True when it has no readable signature)."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return False
    except ValueError:  # builtins without a signature
        return True
    return True


def _call_error_text(fn: Callable[..., Any], error: TypeError) -> str:
    """Python's call error without the function's qualified name in front (``takes 0 positional arguments ...``)."""
    text = str(error)
    qualname = getattr(fn, "__qualname__", "")
    if qualname and text.startswith(qualname + "() "):
        rest = text[len(qualname) + 3:]
        return ("it is " if rest.startswith("missing") else "it ") + rest
    return text


F = TypeVar("F", bound=Callable[..., Any])

_TRACEBACK_FULL = ("full", "all", "1", "true", "yes", "on")
_TRACEBACK_SHORT = ("short", "0", "false", "no", "off")


def full_traceback() -> bool:
    """TILEJIT_TRACEBACK=full: keep tilejit's internal frames in the tracebacks of user errors (by default a
    compile or launch error shows the user's frames and the message only). Tracebacks of tilejit bugs are
    always full. Read here rather than in ``knobs`` (whose errors this module defines); a value it does not take
    is a ``UsageValueError``, raised over the error being shown (which Python prints first)."""
    value = os.environ.get("TILEJIT_TRACEBACK", "").strip().lower()
    if value in _TRACEBACK_FULL:
        return True
    if not value or value in _TRACEBACK_SHORT:
        return False
    raise UsageValueError(f"environment variable TILEJIT_TRACEBACK={value!r} is not valid: it takes full or short "
                          "(or 1/0, true/false, yes/no, on/off; or unset it)")


def entry_point(fn: F) -> F:
    """Marks a public function (a launch, ``kernel.ir``, ``kernel.compile`` ...): an error leaving it drops
    tilejit's internal frames from its traceback, so the user sees their own call and the message; a bug is
    wrapped in an :class:`InternalError` and keeps every frame. ``TILEJIT_TRACEBACK=full`` keeps every frame
    of user errors too. Nested entry points are harmless: the outermost one decides."""

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - re-raised, shortened or wrapped
            if isinstance(error, InternalError):
                raise
            if is_tilejit_bug(error):
                raise InternalError.wrapping(error) from error
            if full_traceback():
                raise
            if isinstance(error, TilejitError):
                error.__suppress_context__ = True  # "during handling of ..." of tilejit's own retries
            cause = error.__cause__
            if cause is not None and not isinstance(cause, InternalError):
                cause.__traceback__ = user_frames(cause.__traceback__)
            # tilejit's frames are hidden (TILEJIT_TRACEBACK=full shows them); no comment on the raise line, which
            # Python shows in the traceback
            raise error.with_traceback(user_frames(error.__traceback__))

    return entry  # type: ignore[return-value]
