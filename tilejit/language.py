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
    "bounded", "multiple_of", "max_contiguous", "log2", "sin", "cos", "tanh", "erf", "sigmoid", "fma", "cumsum",
    "atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas",
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
def gemm(a, b, acc, transpose_a=False, transpose_b=False):
    """``acc + op(a) @ op(b)`` on tensor cores; ``op`` transposes when asked."""


@builtin
def copy(src, dst):
    """Store ``src`` (a tile or a tensor slice) into the tensor slice ``dst``."""


@builtin
def bounded(tensor, extents):
    """A view of tensor argument ``tensor`` whose valid region is ``min(tensor.shape[d], extents[d])`` along each
    dim (``extents``: a tuple of runtime or compile-time ints, one per dim; a negative extent counts as 0).
    Loads through the view read 0 past the bounds, and stores, scatters and atomics skip those elements, as they
    do past a tensor's own shape; ``view.shape`` is ``extents``. For grouped GEMMs with per-group sizes and
    packed variable-length sequences, whose padding must not be written. Loads through a view use cp.async or
    element-wise copies, never TMA (its descriptor is encoded on the host from the argument's own shape).

    Example::

        Cv = T.bounded(C, (M_valid, N))
        Cv[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)    # rows >= M_valid are not written
    """


@builtin
def multiple_of(x, values):
    """Triton's ``tl.multiple_of(x, 16)``: a promise that integer ``x`` is a multiple of ``values`` (an int, or a
    tuple per dim of a tile). Accepted so Triton code ports unchanged, and returns ``x``; tilejit does not use it
    yet: it already specializes on each int argument's divisibility by 16 and checks alignment at run time (one
    uniform test) before vectorizing a load or store. Example: ``k0 = T.multiple_of(k0, 64)``."""


@builtin
def max_contiguous(x, values):
    """Triton's ``tl.max_contiguous(x, n)``: accepted and returns ``x`` (no effect in tilejit; see
    :func:`multiple_of`)."""


@builtin
def log2(x):
    """Base-2 logarithm, elementwise (``log2f``, 1 ulp). Integer inputs become float32; 16-bit floats compute in
    float32 and round back. Example: ``bits = T.log2(x)``."""


@builtin
def sin(x):
    """Sine, elementwise (``sinf``: accurate over the full range, 2 ulp; not the fast ``__sinf``). Integer inputs
    become float32. Example: ``y = T.sin(theta)``."""


@builtin
def cos(x):
    """Cosine, elementwise (``cosf``, 2 ulp). Integer inputs become float32. Example (rotary embedding)::

        rot = x * T.cos(theta) + x_swapped * T.sin(theta)
    """


@builtin
def tanh(x):
    """Hyperbolic tangent, elementwise (``tanhf``, 2 ulp; not ``tanh.approx``). Integer inputs become float32.
    Example: ``gelu = 0.5 * x * (1 + T.tanh(0.79788456 * (x + 0.044715 * x * x * x)))``."""


@builtin
def erf(x):
    """The error function, elementwise (``erff``, 2 ulp). Integer inputs become float32.
    Example: ``gelu = 0.5 * x * (1 + T.erf(x * 0.70710678))``."""


@builtin
def sigmoid(x):
    """``1 / (1 + exp(-x))``, elementwise (``expf``'s accuracy; saturates to 0 and 1 without NaN). Integer inputs
    become float32. Example: ``silu = x * T.sigmoid(x)``."""


@builtin
def fma(a, b, c):
    """``a * b + c`` rounded once (``fmaf``/``fma``), elementwise, with the usual promotion and broadcasting;
    integer operands become float32; 16-bit floats compute in float32 and round back once.
    The interpreter computes float32 operands in float64 and rounds (exact but for rare double roundings).
    Example: ``acc = T.fma(x, w[None, :], acc)``."""


@builtin
def cumsum(x, axis=0):
    """Inclusive prefix sum of tile ``x`` along ``axis`` (a compile-time int; negative counts from the end); the
    result has ``x``'s shape. dtypes as ``T.sum``: 8/16-bit floats give float32, bool and 8/16-bit ints int32,
    others keep theirs. Each line is summed left to right (the GPU goes through shared memory: one thread per
    line), so float results match the interpreter's. Example::

        offsets = T.cumsum(counts, 0) - counts     # exclusive scan
    """


_ATOMIC_COMMON = """
    ``pointer`` is a window of a tensor argument written with the load/store syntax: a slice
    ``C[m0:m0 + BM, n0:n0 + BN]``, a single element ``C[i]`` / ``C[i, j]``, or rows picked by a 1-D integer index
    tile ``H[idx]`` / ``C[idx, 0:D]`` (one dim at most). ``val`` is a tile that broadcasts to the window's shape,
    or a scalar; it is cast to the tensor's dtype as a store would.

    Tensor dtypes: float32, float64, int32, int64, float16 and bfloat16 (per element: add is ``atom.add.noftz``,
    from sm_70 for f16 and sm_90 for bf16, else a compare-and-swap loop on the 16 bits, as are f16/bf16 max, min
    and xchg); bool, 8/16-bit ints and fp8 are errors. Packed f16x2/bf16x2 atomics are not used.
    Out-of-bounds elements (or out-of-range indices) are skipped: nothing is written and their old value reads 0.
    Duplicate indices in an index tile are applied one after the other, as separate atomics.

    ``sem``: "relaxed", "acquire", "release" or "acq_rel" (default, as in Triton); ``scope``: "gpu" (default),
    "cta" or "sys"; they become PTX ``atom.<sem>.<scope>`` (``red.<sem>.<scope>`` when the result is unused and
    ``sem`` is "relaxed" or "release").

    Returns the old values: a tile of the window's shape (a scalar for a single element), in the tensor's dtype.
    The interpreter applies the elements of one call in row-major order, program after program.
"""


@builtin
def atomic_add(pointer, val, sem="acq_rel", scope="gpu"):
    """Atomically add ``val`` to every element of ``pointer``; returns the old values.

    Example (split-K: every program adds its partial product into a float32 ``C``)::

        T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem="relaxed")
        T.atomic_add(Hist[bins], 1)          # a histogram: bins is an int32 tile
    """


atomic_add.__doc__ += _ATOMIC_COMMON


@builtin
def atomic_max(pointer, val, sem="acq_rel", scope="gpu"):
    """Atomically replace every element of ``pointer`` by ``max(old, val)``; returns the old values.

    Integers use ``atom.max``; floats a compare-and-swap loop (NaN propagates, as in ``T.maximum``).

    Example::

        T.atomic_max(RowMax[m0:m0 + BM], T.max(x, 1))
    """


atomic_max.__doc__ += _ATOMIC_COMMON


@builtin
def atomic_min(pointer, val, sem="acq_rel", scope="gpu"):
    """Atomically replace every element of ``pointer`` by ``min(old, val)``; returns the old values.

    Integers use ``atom.min``; floats a compare-and-swap loop (NaN propagates, as in ``T.minimum``).

    Example::

        T.atomic_min(Best[0], score)
    """


atomic_min.__doc__ += _ATOMIC_COMMON


@builtin
def atomic_xchg(pointer, val, sem="acq_rel", scope="gpu"):
    """Atomically store ``val`` into every element of ``pointer``; returns the old values.

    Example (release a lock)::

        T.atomic_xchg(Lock[0], 0, sem="release")
    """


atomic_xchg.__doc__ += _ATOMIC_COMMON


@builtin
def atomic_cas(pointer, cmp, val, sem="acq_rel", scope="gpu"):
    """Atomic compare-and-swap: where an element equals ``cmp`` (bitwise) it becomes ``val``; returns the old
    values (so ``old == cmp`` tells where the swap happened). ``cmp`` broadcasts like ``val``.

    Example (take a spin lock)::

        while T.atomic_cas(Lock[0], 0, 1, sem="acquire") != 0:
            pass
    """


atomic_cas.__doc__ += _ATOMIC_COMMON


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
