"""The kernel language, imported as ``T``.

These names only mean something inside an ``@tilejit.kernel`` (or ``@tilejit.func``) body, where the
frontend compiles them; called from ordinary Python they raise :class:`LanguageUsageError`. The rules
for dtypes, promotion and broadcasting live in :mod:`tilejit.frontend.semantic`.
"""
from __future__ import annotations

import functools

from .dtypes import (bfloat16, bool_, float8_e4m3fn, float8_e5m2, float16, float32, float64, int8, int16,
                     int32, int64, uint8)
from .errors import TilejitError

bool = bool_  # noqa: A001 - the language's name for the 1-bit type, as in torch

__all__ = [
    "constexpr", "program_id", "num_programs", "cdiv", "arange", "zeros", "full", "where", "exp", "exp2",
    "log", "sqrt", "rsqrt", "abs", "maximum", "minimum", "sum", "max", "min", "gemm", "copy", "range",
    "static_range", "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "int8",
    "int16", "int32", "int64", "uint8", "bool",
]


class LanguageUsageError(TilejitError):
    """A ``tilejit.language`` function was called outside a kernel."""


class constexpr:  # noqa: N801 - spelled like the annotation users write
    """Marks a compile-time parameter (``BM: T.constexpr``) or wraps a global constant.

    Constexpr values are substituted before the kernel is compiled and are part of the cache key.
    """

    def __init__(self, value) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"constexpr({self.value!r})"


def builtin(fn):
    """Marks a language function: the frontend compiles calls to it; plain calls raise."""

    @functools.wraps(fn)
    def outside_kernel(*args, **kwargs):
        raise LanguageUsageError(
            f"tilejit.language.{fn.__name__}() can only be called inside a @tilejit.kernel or @tilejit.func")

    outside_kernel.__tilejit_builtin__ = fn.__name__
    return outside_kernel


@builtin
def program_id(axis):
    """Index of this program instance along grid ``axis`` (0, 1 or 2), an int32 scalar."""


@builtin
def num_programs(axis):
    """Number of program instances along grid ``axis``."""


def cdiv(a, b):
    """Ceiling division ``(a + b - 1) // b``; works on host ints and, inside kernels, on scalars."""
    return -(-a // b)


cdiv.__tilejit_builtin__ = "cdiv"


@builtin
def arange(start, end=None):
    """``[start, end)`` as an int32 tile; bounds are compile-time ints (``arange(n)`` is ``[0, n)``)."""


@builtin
def zeros(shape, dtype):
    """A tile of ``shape`` (compile-time ints) filled with 0."""


@builtin
def full(shape, value, dtype):
    """A tile of ``shape`` filled with ``value`` (a constant or runtime scalar) cast to ``dtype``."""


@builtin
def where(condition, x, y):
    """Elementwise ``x if condition else y`` with broadcasting."""


@builtin
def exp(x):
    """Elementwise e**x (floats; integers are promoted to float32)."""


@builtin
def exp2(x):
    """Elementwise 2**x."""


@builtin
def log(x):
    """Elementwise natural logarithm."""


@builtin
def sqrt(x):
    """Elementwise square root."""


@builtin
def rsqrt(x):
    """Elementwise 1/sqrt(x)."""


@builtin
def abs(x):  # noqa: A001
    """Elementwise absolute value."""


@builtin
def maximum(x, y):
    """Elementwise maximum with broadcasting."""


@builtin
def minimum(x, y):
    """Elementwise minimum with broadcasting."""


@builtin
def sum(x, axis=None):  # noqa: A001
    """Sum along ``axis`` (all axes when None); 8/16-bit floats accumulate and return float32."""


@builtin
def max(x, axis=None):  # noqa: A001
    """Maximum along ``axis`` (all axes when None)."""


@builtin
def min(x, axis=None):  # noqa: A001
    """Minimum along ``axis`` (all axes when None)."""


@builtin
def gemm(a, b, acc, transpose_a=False, transpose_b=False, precision=None):
    """``acc + op(a) @ op(b)`` on tensor cores; ``op`` transposes when asked.

    Args:
        a, b: 2-D tiles, ``op(a)`` M x K and ``op(b)`` K x N. Both float16, both bfloat16, float8 (e4m3fn and
            e5m2 mix), both int8 or both float32.
        acc: the M x N accumulator: float32, int32 for int8 operands.
        transpose_a, transpose_b: compile-time bools; ``op(x)`` is ``x.T`` when set (``a.T @ b`` folds to the
            same thing).
        precision: float32 operands only (ignored for the others), a compile-time string:

            * ``"tf32"`` (the default, as in Triton; also what ``a @ b`` uses): tensor cores, each operand
              truncated to tf32 (10 explicit mantissa bits), so products carry a relative error up to 2**-10;
              sums stay float32.
            * ``"tf32x3"``: each operand split into a tf32 high part and a tf32 remainder; three tensor-core
              products (hi*hi + hi*lo + lo*hi) give close to float32 accuracy at three times the work.
            * ``"ieee"``: exact float32 multiply-adds on the FMA units (no tensor cores; slow).

    Which instructions run: f16/bf16 on wgmma (sm_90a) or ldmatrix + mma.sync (sm_80+); fp8 on wgmma k32
    (sm_90a) or mma.sync m16n8k32 (sm_89+); int8 on wgmma / mma.sync k32 (int32 sums, exact); tf32 on wgmma
    k8 / mma.sync m16n8k8. wgmma needs 8-bit and float32 operands K-major (``a`` stored M x K, ``b`` given
    as N x K with ``transpose_b=True``); other majors of those dtypes run on mma.sync. Operand dtypes without
    a tensor-core instruction on the target fall back to FMAs.

    Example::

        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], B[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    """


@builtin
def copy(src, dst):
    """Store ``src`` (a tile or a tensor slice) into the tensor slice ``dst``."""


class _LoopMarker:
    def __init__(self, name: str, doc: str) -> None:
        self.__name__ = name
        self.__doc__ = doc
        self.__tilejit_builtin__ = name

    def __call__(self, *args, **kwargs):
        raise LanguageUsageError(f"tilejit.language.{self.__name__}() can only be used as the iterable of a "
                                 "for loop inside a @tilejit.kernel")

    def __repr__(self) -> str:
        return f"tilejit.language.{self.__name__}"


range = _LoopMarker(  # noqa: A001
    "range", "range(lo, hi, step=1, stages=None): a software-pipelined runtime loop; loads of each "
             "iteration are prefetched ``stages - 1`` iterations ahead (default: the launch's num_stages).")
static_range = _LoopMarker(
    "static_range", "static_range(lo, hi, step=1): a loop with compile-time bounds, unrolled by the compiler.")
