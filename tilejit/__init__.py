"""tilejit: a Python JIT for NVIDIA tensor cores.

    import tilejit
    import tilejit.language as T

    @tilejit.kernel
    def add(X, Y, BLOCK: T.constexpr):
        i = T.program_id(0) * BLOCK
        Y[i:i + BLOCK] = X[i:i + BLOCK] + 1
"""
from . import language
from .errors import (BackendCompileError, CompilationError, DispatchError, InternalError, LaunchError, LimitError,
                     NameResolutionError, RegisterError, SharedMemoryError, TilejitError, TypeCheckError,
                     UnsupportedSyntaxError, UsageError)
from .language import cdiv
from .runtime.jit import Kernel, func, kernel
from .version import __version__

__all__ = [
    "kernel", "func", "cdiv", "language", "docs", "Kernel", "Config", "autotune", "heuristics", "torch_op", "testing",
    "__version__",
    "TilejitError", "CompilationError", "UnsupportedSyntaxError", "TypeCheckError", "NameResolutionError",
    "DispatchError", "BackendCompileError", "LaunchError", "SharedMemoryError", "RegisterError", "LimitError",
    "UsageError", "InternalError",
]


def docs(section: str | None = None) -> str:
    """The path of the language reference installed with tilejit (``docs/language.md`` in the repository), with
    ``#section`` appended when given: the file error hints point to. Read it in any Markdown viewer."""
    from pathlib import Path

    path = Path(__file__).resolve().parent / "docs" / "language.md"
    return f"{path}#{section}" if section else str(path)


def __getattr__(name):
    # The autotuner and benchmarking helpers import lazily: `import tilejit` stays cheap.
    if name in ("Config", "autotune"):
        from . import autotuner

        return getattr(autotuner, name)
    if name == "heuristics":
        from .launch_heuristics import heuristics

        return heuristics
    if name == "torch_op":
        from .torch_ops import torch_op

        return torch_op
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'tilejit' has no attribute {name!r}")
