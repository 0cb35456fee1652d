"""The kernel language, imported as ``T``.

These names only mean something inside an ``@tilejit.kernel`` (or ``@tilejit.func``) body, where the
frontend compiles them; called from ordinary Python they raise :class:`LanguageUsageError`. The rules
for dtypes, promotion and broadcasting live in :mod:`tilejit.frontend.semantic`; the language is described, with
examples, in docs/language.md (``tilejit.docs()`` gives the path of the copy installed with the package).
"""
from __future__ import annotations

import functools

from .dtypes import (bfloat16, bool_, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float16, float32, float64, int8,
                     int16, int32, int64, uint8)
from .errors import TilejitError

bool = bool_  # noqa: A001 - the language's name for the 1-bit type, as in torch

__all__ = [
    "constexpr", "program_id", "num_programs", "cdiv", "arange", "zeros", "full", "where", "exp", "exp2",
    "log", "sqrt", "rsqrt", "abs", "maximum", "minimum", "sum", "max", "min", "gemm", "copy", "range",
    "bounded", "multiple_of", "max_contiguous", "log2", "sin", "cos", "tanh", "erf", "sigmoid", "fma", "cumsum",
    "atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas",
    "static_range", "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
    "float8_e8m0fnu", "int8",
    "int16", "int32", "int64", "uint8", "bool",
]


class LanguageUsageError(TilejitError):
    """A ``tilejit.language`` function was called outside a kernel."""


class constexpr:  # noqa: N801 - spelled like the annotation users write
    """Marks a compile-time parameter (``BM: T.constexpr``) or wraps a global constant.

    Constexpr values are substituted before the kernel is compiled and are part of the cache key: each distinct
    value compiles a separate kernel. A constexpr argument is an int, float, bool, str, dtype, None or a tuple of
    those (not a tensor: pass ``t.item()``). Tile shapes, slice lengths and ``T.static_range`` bounds must be
    constexprs or arithmetic on them. Strings, None and tuples compare at compile time.

    Example::

        BLOCK_DEFAULT = T.constexpr(128)          # a global the kernel may read

        @tilejit.kernel
        def act(X, Y, ACTIVATION: T.constexpr, BLOCK: T.constexpr):
            x = X[0:BLOCK]
            if ACTIVATION == "relu":              # pruned at compile time
                x = T.maximum(x, 0.0)
            Y[0:BLOCK] = x

        act[(1,)](x, y, ACTIVATION="relu", BLOCK=1024)

    See docs/language.md#constexprs.
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
    """Index of this program instance along grid ``axis``.

    Args:
        axis: 0, 1 or 2 (a constant): the grid dimension, as in ``kernel[(gx, gy, gz)]``.

    Returns:
        An int32 scalar in ``[0, grid[axis])``.

    Example::

        m0 = T.program_id(0) * BM            # first row of this instance's tile
        C[m0:m0 + BM, 0:BN] = acc

    See docs/language.md#launching.
    """


@builtin
def num_programs(axis):
    """Number of program instances along grid ``axis``.

    Args:
        axis: 0, 1 or 2 (a constant).

    Returns:
        An int32 scalar: ``grid[axis]`` of the launch (1 for an axis the grid does not have).

    Example::

        for tile in range(T.program_id(0), T.cdiv(n, BLOCK), T.num_programs(0)):   # a persistent loop
            X[tile * BLOCK:tile * BLOCK + BLOCK] = 0.0
    """


def cdiv(a, b):
    """Ceiling division ``(a + b - 1) // b`` of integers: how many blocks of ``b`` cover ``a``.

    Works on host ints (``tilejit.cdiv`` is the same function, for grids) and, inside kernels, on integer scalars
    and constants.

    Args:
        a: an int (or an integer scalar in a kernel).
        b: a positive int.

    Example::

        grid = (tilejit.cdiv(M, BM), tilejit.cdiv(N, BN))   # not M / BM: grid entries must be ints
        matmul[grid](A, B, C, BM=128, BN=128, BK=32)
    """
    return -(-a // b)


cdiv.__tilejit_builtin__ = "cdiv"


@builtin
def arange(start, end=None):
    """The integers ``[start, end)`` as a 1-D int32 tile.

    Args:
        start: a compile-time int; with ``end`` omitted it is the end and the start is 0 (``T.arange(n)``).
        end: a compile-time int greater than ``start``.

    Returns:
        An int32 tile of shape ``(end - start,)``.

    Example::

        offs = i + T.arange(0, BLOCK)                 # element indices of this instance
        y = T.where(offs < n, x, 0.0)
        rows = T.arange(0, BM)[:, None]               # (BM, 1), for 2-D masks

    See docs/language.md#tiles.
    """


@builtin
def zeros(shape, dtype):
    """A tile of ``shape`` filled with 0.

    Args:
        shape: a tuple of compile-time positive ints, e.g. ``(BM, BN)``.
        dtype: the tile's dtype (default ``T.float32``).

    Returns:
        A tile of ``shape`` and ``dtype``.

    Example::

        acc = T.zeros((BM, BN), T.float32)            # a matmul accumulator
        for k0 in T.range(0, K, BK):
            acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]

    See docs/language.md#tiles and docs/language.md#loop-carried-values.
    """


@builtin
def full(shape, value, dtype):
    """A tile of ``shape`` filled with ``value``.

    Args:
        shape: a tuple of compile-time positive ints.
        value: a constant (``float("-inf")``) or a run-time scalar (a kernel argument); not a tile.
        dtype: the tile's dtype; by default the scalar's dtype, float32 for a float constant, int32 for an int.

    Returns:
        A tile of ``shape`` and ``dtype``, every element ``value`` converted to ``dtype``.

    Example::

        m = T.full((BM,), float("-inf"), T.float32)   # running maximum of an online softmax
    """


@builtin
def where(condition, x, y):
    """Elementwise ``x if condition else y``.

    Args:
        condition: a bool tile or scalar (a comparison such as ``offs < n``).
        x, y: tiles, scalars or constants.

    Returns:
        A tile of the three operands' broadcast shape, of ``x`` and ``y``'s promoted dtype.

    Example::

        x = T.where(x > 0, x, x * 0.01)                       # leaky ReLU
        s = T.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))   # a causal mask

    This is how a kernel chooses per element; ``if`` needs a scalar. See docs/language.md#broadcasting.
    """


@builtin
def exp(x):
    """Elementwise ``e ** x``.

    Args:
        x: a tile or scalar. Integer inputs are converted to float32; float inputs keep their dtype.

    Returns:
        A tile (or scalar) of ``x``'s shape.

    Example::

        p = T.exp(s - m[:, None])                  # softmax numerators
    """


@builtin
def exp2(x):
    """Elementwise ``2 ** x`` (faster than ``T.exp`` on the GPU: one hardware ``ex2.approx`` on float32, at most
    2 ulp off; results below 2**-126, the subnormal range, are flushed to 0).

    Args:
        x: a tile or scalar. Integer inputs are converted to float32; float inputs keep their dtype.

    Returns:
        A tile (or scalar) of ``x``'s shape.

    Example::

        p = T.exp2((s - m[:, None]) * 1.4426950408889634)   # exp(s - m) via log2(e)
    """


@builtin
def log(x):
    """Elementwise natural logarithm.

    Args:
        x: a tile or scalar. Integer inputs are converted to float32; float inputs keep their dtype.

    Returns:
        A tile (or scalar) of ``x``'s shape.

    Example::

        lse = m + T.log(l)                         # log-sum-exp
    """


@builtin
def sqrt(x):
    """Elementwise square root.

    Args:
        x: a tile or scalar. Integer inputs are converted to float32; float inputs keep their dtype.

    Returns:
        A tile (or scalar) of ``x``'s shape.

    Example::

        norm = T.sqrt(T.sum(x * x, 0))
    """


@builtin
def rsqrt(x):
    """Elementwise ``1 / sqrt(x)``.

    Args:
        x: a tile or scalar. Integer inputs are converted to float32; float inputs keep their dtype.

    Returns:
        A tile (or scalar) of ``x``'s shape.

    Example::

        y = x * T.rsqrt(T.sum(x * x, 0) / N + eps)   # RMS norm
    """


@builtin
def abs(x):  # noqa: A001
    """Elementwise absolute value.

    Args:
        x: a tile or scalar of any numeric dtype (the result keeps it).

    Example::

        err = T.max(T.abs(x - y), 0)
    """


@builtin
def maximum(x, y):
    """Elementwise maximum of ``x`` and ``y``.

    Args:
        x, y: tiles, scalars or constants; shapes broadcast and dtypes promote as for ``+``.

    Example::

        x = T.maximum(x, 0.0)                          # ReLU
        m_new = T.maximum(m, T.max(s, 1))              # running row maximum
    """


@builtin
def minimum(x, y):
    """Elementwise minimum of ``x`` and ``y``.

    Args:
        x, y: tiles, scalars or constants; shapes broadcast and dtypes promote as for ``+``.

    Example::

        x = T.minimum(T.maximum(x, 0.0), 6.0)          # ReLU6
    """


@builtin
def sum(x, axis=None):  # noqa: A001
    """Sum along ``axis``.

    Args:
        x: a tile.
        axis: a constant int (negative counts from the end), or None to reduce every axis.

    Returns:
        A tile of ``x``'s shape without ``axis`` (a scalar when none is left). 8/16-bit floats accumulate and return float32; 8/16-bit integers and bools int32.

    Example::

        l = T.sum(p, 1)                                 # (BM, BN) -> (BM,)

    See docs/language.md#reductions.
    """


@builtin
def max(x, axis=None):  # noqa: A001
    """Maximum along ``axis``.

    Args:
        x: a tile.
        axis: a constant int (negative counts from the end), or None to reduce every axis.

    Returns:
        A tile of ``x``'s shape without ``axis`` (a scalar when none is left). The dtype is ``x``'s.

    Example::

        m = T.max(s, 1)                                 # row maxima of a (BM, BN) tile

    See docs/language.md#reductions.
    """


@builtin
def min(x, axis=None):  # noqa: A001
    """Minimum along ``axis``.

    Args:
        x: a tile.
        axis: a constant int (negative counts from the end), or None to reduce every axis.

    Returns:
        A tile of ``x``'s shape without ``axis`` (a scalar when none is left). The dtype is ``x``'s.

    Example::

        lo = T.min(x, 0)

    See docs/language.md#reductions.
    """


@builtin
def gemm(a, b, acc, transpose_a=False, transpose_b=False, precision=None, out_dtype=None, scale_a=None,
         scale_b=None):
    """Matrix product with accumulation: ``acc + op(a) @ op(b)``, on tensor cores.

    ``op(t)`` is ``t.T`` when the matching ``transpose_*`` is True, else ``t``. ``a @ b`` is the same product
    with a fresh zero accumulator (and the default precision).

    Args:
        a: a 2-D tile; ``op(a)`` has shape (M, K). float16, bfloat16, float8 (e4m3fn, e5m2), int8 or float32.
            A 3-D tile (Bt, M, K) with a 3-D ``b`` (Bt, K, N) is a batch of Bt products (see below).
        b: a 2-D tile of ``a``'s dtype (the two float8 formats mix); ``op(b)`` has shape (K, N).
        acc: a (M, N) tile of the accumulator dtype ``out_dtype``: by default float32 for float16, bfloat16,
            fp8 and float32 operands, int32 for int8 (exact sums). ``None`` starts from zeros.
        transpose_a, transpose_b: compile-time bools (default False).
        out_dtype: the accumulator and result dtype, as ``tl.dot(out_dtype=)``: ``T.float32`` (the default;
            ``T.int32`` for int8), or ``T.float16`` for float16 operands, which accumulates in float16 on the
            tensor cores' f16 accumulators (mma.sync f16.f16.f16.f16, wgmma .f16, tcgen05 kind::f16 with an
            f16 D): half the accumulator registers, less accurate. The sum is rounded to float16 after every
            16 values of K (the interpreter does the same; within a step the hardware's rounding is its own).
            ``acc`` must have this dtype; any other combination (float16 with bfloat16, fp8 or int8 operands,
            an ``acc`` of another dtype) is a compile error.
        precision: a compile-time string. For float8 operands:

            * ``"precise"`` (the default): sums in float32. On sm_90a the wgmma partial sums (kept by the
              tensor cores in about 14 significant bits) are added into float32 registers every 128 products
              of K, as cuBLAS's default fp8 mode does; the interpreter sums in float32. (mma.sync m16n8k32,
              on sm_89 and where wgmma does not fit, has the same short accumulator and is not promoted yet.)
            * ``"fast"``: the tensor cores' own accumulator for the whole K (as
              ``torch._scaled_mm(use_fast_accum=True)``): faster, with an error that grows with K; the
              interpreter models sm_90a's truncations (docs/language.md, matrix products).

            For float32 operands (16-bit, int8 and float8 operands ignore these, as ``tl.dot`` does;
            "precise"/"fast" on anything but float8 operands is a compile error):

            * ``"tf32"`` (the default, as in Triton; also what ``a @ b`` uses): tensor cores, each operand
              truncated to tf32 (10 explicit mantissa bits), so products carry a relative error up to 2**-10;
              sums stay float32. The interpreter truncates the same way.
            * ``"tf32x3"``: each operand split into a tf32 high part and a tf32 remainder; three tensor-core
              products (hi*hi + hi*lo + lo*hi) give close to float32 accuracy at three times the work.
            * ``"ieee"``: exact float32 multiply-adds on the FMA units (no tensor cores; slow).

        scale_a, scale_b: block scales of float8 operands (DeepSeek-V3's block-scaled fp8): ``scale_a`` a
            float32 scalar or (M,) tile (one scale per row of ``op(a)``), ``scale_b`` a float32 scalar or (N,)
            tile (one per column of ``op(b)``); either may be left out (1). The result is then
            ``acc + (op(a) @ op(b)) * scale_a[:, None] * scale_b[None, :]`` in float32: the product is summed
            fresh by the tensor cores over the tile's K (the tensor cores' own accumulator when K <= 128, the
            promotion interval of precision "precise"), then scaled and added into ``acc`` with one FMA per
            element; call it once per 128-wide block of K. float8 operands only.
            With ``T.float8_e8m0fnu`` tiles instead (``scale_a`` (M, K / 32), ``scale_b`` (N, K / 32), both
            given) it is the microscaled (OCP MX) product: each 32 elements of K of a row of ``op(a)`` and of a
            column of ``op(b)`` scaled by 2^(e - 127) before multiplying; sm_100a runs it on tcgen05's
            block-scaled kind, other arches on bfloat16 products of the dequantized operands.

    Returns:
        ``acc + op(a) @ op(b)``, a (M, N) tile of ``acc``'s dtype.

    Batches: ``a`` of shape (Bt, M, K) and ``b`` of shape (Bt, K, N) (``a @ b`` too) give a (Bt, M, N) tile,
    product ``i`` of slices ``a[i]`` and ``b[i]`` (the transposes swap the last two dims); Bt is a compile-time
    size and each of the Bt products runs as a 2-D one.

    Which instructions run: float16/bfloat16 on wgmma (sm_90a) or ldmatrix + mma.sync (sm_80+, also sm_100a
    today); fp8 on wgmma k32 (sm_90a) or mma.sync m16n8k32 (sm_89+); int8 on wgmma / mma.sync k32; tf32 on wgmma
    k8 / mma.sync m16n8k8. wgmma takes 8-bit and float32 operands K-major only (``a`` stored M x K, ``b`` given
    N x K with ``transpose_b=True``); the other majors of those dtypes run on mma.sync with gathered fragments
    (slower). Operands loaded from tensors are staged in shared memory for you; a dtype with no tensor-core
    instruction on the target falls back to FMAs.

    Example::

        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, K, BK, stages=3):
            a = A[m0:m0 + BM, k0:k0 + BK]                      # (BM, BK)
            b = B[n0:n0 + BN, k0:k0 + BK]                      # (BN, BK): B stored N x K (K-major)
            acc = T.gemm(a, b, acc, transpose_b=True)          # acc += a @ b.T
        C[m0:m0 + BM, n0:n0 + BN] = acc                        # the store converts to C's dtype

        acc16 = T.zeros((BM, BN), T.float16)                   # float16 operands, float16 accumulation
        acc16 = T.gemm(a, b, acc16, transpose_b=True, out_dtype=T.float16)

        # block-scaled fp8, BK = 128: SA (M, cdiv(K, 128)) per 1x128 block, SB (cdiv(N, 128), cdiv(K, 128))
        acc = T.gemm(a, b, acc, transpose_b=True, scale_a=SA[m0:m0 + BM, k0 // 128],
                     scale_b=SB[n0 // 128, k0 // 128])

    See docs/language.md#matrix-products and #block-scaled-float8.
    """


@builtin
def copy(src, dst):
    """Store ``src`` into the tensor window ``dst``: ``T.copy(x, C[m0:m0 + BM, n0:n0 + BN])`` is
    ``C[m0:m0 + BM, n0:n0 + BN] = x``.

    Args:
        src: a tile, scalar or constant (a tensor slice ``A[...]`` is loaded first); it broadcasts to the
            window's shape.
        dst: a slice of a tensor argument, written in the call (not a variable holding one).

    Elements of the window outside the tensor are not written, and ``src`` is converted to the tensor's dtype
    (floats round to nearest even). See docs/language.md#loads-and-stores.

    Example::

        T.copy(acc, C[m0:m0 + BM, n0:n0 + BN])
    """


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
    """Triton's ``tl.multiple_of(x, 16)``: a promise that integer ``x`` is a multiple of ``values``; returns ``x``.

    The promise is about the value ``x`` itself, at every use (not only the returned one), so make it only of a
    value that always is a multiple. tilejit uses the power-of-two part of it (48 counts as 16) where a load or
    store asks whether its window is aligned for vector (or 16-byte ``cp.async``) accesses: a window start, a
    tensor extent (``T.multiple_of(X.shape[1], 16)``: the promise is then about the tensor's extent, which every
    access of ``X`` reads) or a stride (``X.stride(0)``). When every run-time alignment test of an access is
    known at compile time, only its vector path is generated, with no per-call test and no element-wise
    fallback. Known without any hint: constants, program ids times constants, sums, differences and products
    of known values, loop counters of loops whose start and step are known, each int argument that is a multiple
    of 16 at the call (the runtime specializes on it: a kernel compiles once for such values and once for others),
    and the alignment of each tensor argument's data pointer and strides (also part of the specialization).

    A broken promise is your bug, not a checked error: results are undefined (misaligned vector accesses fault or
    read the wrong elements; a tile past an extent promised whole reads or writes out of bounds), as in Triton.
    The interpreter (``TILEJIT_INTERPRET=1``) ignores promises. A promise on a compile-time constant is checked
    (a located error when it is not a multiple). On a tile, ``values`` is one int or one per dim (Triton's
    per-dim reading); tile promises are recorded in the IR but generate no different code yet.

    Args:
        x: an integer scalar or tile.
        values: the promised divisor (a positive int; for a tile, or a tuple with one per dim).

    Returns:
        ``x`` unchanged.

    Example::

        N = T.multiple_of(X.shape[1], 16)     # every row of X is a whole number of 16 elements
        k0 = T.multiple_of(Offsets[g], 64)    # a start read from memory
    """


@builtin
def max_contiguous(x, values):
    """Triton's ``tl.max_contiguous(x, n)``: accepted and checked (a positive int, or one per dim of a tile), and
    returns ``x`` unchanged; it generates no different code. Slices already tell tilejit which accesses are
    contiguous (``X[i0:i0 + BLOCK]`` moves with vector accesses where it is aligned), and gathers and scatters
    through an index tile access element by element, so nothing would read the promise. A broken one changes
    nothing.

    Args:
        x: an integer scalar or tile.
        values: the promised number of contiguous values (an int, or a tuple per dim).

    Returns:
        ``x`` unchanged.

    Example::

        offs = T.max_contiguous(T.arange(0, BLOCK), BLOCK)
    """


@builtin
def log2(x):
    """Base-2 logarithm, elementwise (``log2f``, 1 ulp). Integer inputs become float32; 16-bit floats compute in
    float32 and round back.

    Args:
        x: a tile or a scalar; float16/bfloat16 compute in float32 and round back, integers become float32.

    Returns:
        a tile (or scalar) of x's shape, in x's float dtype.

    Example::

        bits = T.log2(x)
    """


@builtin
def sin(x):
    """Sine, elementwise (``sinf``: accurate over the full range, 2 ulp; not the fast ``__sinf``). Integer inputs
    become float32.

    Args:
        x: a tile or a scalar; float16/bfloat16 compute in float32 and round back, integers become float32.

    Returns:
        a tile (or scalar) of x's shape, in x's float dtype.

    Example::

        y = T.sin(theta)
    """


@builtin
def cos(x):
    """Cosine, elementwise (``cosf``, 2 ulp). Integer inputs become float32.

    Args:
        x: a tile or a scalar; float16/bfloat16 compute in float32 and round back, integers become float32.

    Returns:
        a tile (or scalar) of x's shape, in x's float dtype.

    Example::

        # rotary embedding
        rot = x * T.cos(theta) + x_swapped * T.sin(theta)
    """


@builtin
def tanh(x):
    """Hyperbolic tangent, elementwise (``tanhf``, 2 ulp; not ``tanh.approx``). Integer inputs become float32.

    Args:
        x: a tile or a scalar; float16/bfloat16 compute in float32 and round back, integers become float32.

    Returns:
        a tile (or scalar) of x's shape, in x's float dtype.

    Example::

        gelu = 0.5 * x * (1 + T.tanh(0.79788456 * (x + 0.044715 * x * x * x)))
    """


@builtin
def erf(x):
    """The error function, elementwise (``erff``, 2 ulp). Integer inputs become float32.

    Args:
        x: a tile or a scalar; float16/bfloat16 compute in float32 and round back, integers become float32.

    Returns:
        a tile (or scalar) of x's shape, in x's float dtype.

    Example::

        gelu = 0.5 * x * (1 + T.erf(x * 0.70710678))
    """


@builtin
def sigmoid(x):
    """``1 / (1 + exp(-x))``, elementwise (``expf``'s accuracy; saturates to 0 and 1 without NaN). Integer inputs
    become float32.

    Args:
        x: a tile or a scalar; float16/bfloat16 compute in float32 and round back, integers become float32.

    Returns:
        a tile (or scalar) of x's shape, in x's float dtype.

    Example::

        silu = x * T.sigmoid(x)
    """


@builtin
def fma(a, b, c):
    """``a * b + c`` rounded once (``fmaf``/``fma``), elementwise, with the usual promotion and broadcasting;
    integer operands become float32; 16-bit floats compute in float32 and round back once.
    The interpreter computes float32 operands in float64 and rounds (exact but for rare double roundings).

    Args:
        a, b, c: tiles or scalars, broadcast together (promotion as for ``+`` and ``*``).

    Returns:
        ``a * b + c`` rounded once, in the promoted dtype.

    Example::

        acc = T.fma(x, w[None, :], acc)
    """


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

    Example::

        # split-K: every program adds its partial product into a float32 C
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

    Example::

        # release a lock
        T.atomic_xchg(Lock[0], 0, sem="release")
    """


atomic_xchg.__doc__ += _ATOMIC_COMMON


@builtin
def atomic_cas(pointer, cmp, val, sem="acq_rel", scope="gpu"):
    """Atomic compare-and-swap: where an element equals ``cmp`` (bitwise) it becomes ``val``; returns the old
    values (so ``old == cmp`` tells where the swap happened). ``cmp`` broadcasts like ``val``.

    Example::

        # take a spin lock
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
    "range", """range(lo, hi, step=1, stages=None, warp_specialize=None): a software-pipelined runtime loop.

    Used only as the iterable of a ``for`` loop. ``lo``, ``hi`` and ``step`` are integer scalars or constants (one
    argument is ``hi``, as for Python's ``range``). The loads of each iteration are issued ``stages - 1``
    iterations ahead (multi-buffered in shared memory), so they overlap the matrix products of earlier ones;
    ``stages`` is a compile-time int >= 1, by default the launch's ``num_stages``. Values assigned before the loop
    and updated in it are carried (docs/language.md#loop-carried-values).

    ``warp_specialize`` (a compile-time bool; None follows the launch option of that name): on sm_90a, True gives
    the loop a producer warpgroup issuing its TMA loads while the ``num_warps`` warps only compute; a loop that
    cannot take it (not a plain GEMM main loop at the kernel's top level) fails to
    compile with the reason. False keeps the loop plain. Other archs ignore it (docs/language.md#launching).

    Example::

        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, K, BK, stages=3):
            acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    """)
static_range = _LoopMarker(
    "static_range", """static_range(lo, hi, step=1): a loop with compile-time bounds, unrolled by the compiler.

    Used only as the iterable of a ``for`` loop; the bounds are constexprs or constants, and the loop variable is
    a compile-time int in each unrolled copy (usable in tile shapes, tuple indices and constexpr ``if``).

    Example::

        for j in T.static_range(0, 4):
            X[j * BLOCK:(j + 1) * BLOCK] = 0.0
    """)
