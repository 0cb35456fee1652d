"""The microscaled form of ``T.gemm`` (OCP MX, MXFP8): float8 operands with e8m0 block scales, one per 32
elements of K, for every row of op(a) and every column of op(b).

``T.gemm(a, b, acc, transpose_b=True, scale_a=sa, scale_b=sb)`` with ``sa`` a (M, K / 32) and ``sb`` a
(N, K / 32) float8_e8m0fnu tile is ``acc + sum_k a[m, k] 2^(sa[m, k // 32] - 127) b[k, n] 2^(sb[n, k // 32] - 127)``
(the dtype of the scales picks this form; float32 scales give DeepSeek-V3's per-128 form in semantic.py).

The frontend makes it one gemm op with five operands (a, b, acc, then the two scale tiles). Where a block-scaled
tensor-core lowering fits (sm_100a: ``tcgen05.mma ... kind::mxf8f6f4.block_scale.block32``), it stays one; elsewhere
``passes/microscaled.py`` rewrites it into :func:`dequantized_product`, built from the language's own ops: each
operand dequantized in registers (its scales expanded along K, ``x.to(float32) * 2^(e - 127)``, rounded to
bfloat16) and the two multiplied on the tensor cores in bfloat16 with a float32 accumulator. A power of two times
an e4m3/e5m2 value (4 or 3 significant bits) fits bfloat16's 8 exactly, so every product is exact and only the
float32 sums round, as the block-scaled tensor cores' own sums do; the exceptions are values whose scaled
magnitude leaves bfloat16's range (above ~3.4e38, or below 2^-133 where bfloat16's subnormals end) and the NaN
scale (0xff), which makes its block NaN. Correctness over speed: the expansion costs K / 32 selects per operand
element.
"""
from __future__ import annotations

from typing import Any

from .. import dtypes as D
from ..errors import docs_link
from ..ir import MX_BLOCK, BinaryOp, CompareOp, GemmAttrs, OpKind, ReduceKind, TileType, Value
from .semantic import SemanticError, describe


def is_microscaled(scale_a: Any, scale_b: Any) -> bool:
    """Whether either scale of a scaled gemm is an e8m0 tile (the microscaled form)."""
    return any(isinstance(s, Value) and s.dtype.is_scale for s in (scale_a, scale_b))


def microscaled_gemm(sem, a: Value, b: Value, acc: Any, transpose_a: bool, transpose_b: bool,
                     precision: str | None, out_dtype: Any, scale_a: Any, scale_b: Any) -> Value:
    """``acc + op(a) @ op(b)`` with each operand's e8m0 block scales applied (see the module docstring)."""
    for name, t in (("a", a), ("b", b)):
        if not (isinstance(t, Value) and t.is_tile and t.type.rank == 2 and t.dtype.is_fp8):
            raise SemanticError(f"a microscaled matrix product (e8m0 scale_a=/scale_b=) takes 2-D float8 tiles; "
                                f"operand {name} is {describe(t)}", _HINT)
    if precision is not None or out_dtype not in (None, D.float32):
        raise SemanticError("a microscaled matrix product sums in float32: precision= and out_dtype= do not apply",
                            "leave them out")
    m, k = a.type.shape[::-1] if transpose_a else a.type.shape
    k2, n = b.type.shape[::-1] if transpose_b else b.type.shape
    if k != k2:
        raise SemanticError(f"matrix product inner dimensions differ: {m}x{k} @ {k2}x{n}")
    if k % MX_BLOCK:
        raise SemanticError(f"a microscaled matrix product needs K a multiple of {MX_BLOCK} (one e8m0 scale per "
                            f"{MX_BLOCK} elements of K), got K = {k}", f"load K tiles of 32, 64, 128 ... ({_HINT})")
    sa = _scale_tile(scale_a, "scale_a", m, "M", k)
    sb = _scale_tile(scale_b, "scale_b", n, "N", k)
    if acc is None:
        acc = sem.full((m, n), 0, D.float32)
    elif not (isinstance(acc, Value) and acc.is_tile and acc.dtype == D.float32 and acc.type.shape == (m, n)):
        raise SemanticError(f"the accumulator of a microscaled matrix product must be a float32 {m}x{n} tile, got "
                            f"{describe(acc)}", f"create it with T.zeros(({m}, {n}), T.float32)")
    # float8 operands carry a precision; "precise" (float32 sums) is what the block-scaled kinds do
    return sem.b.create1(OpKind.GEMM, [a, b, acc, sa, sb], TileType((m, n), D.float32),
                         GemmAttrs(bool(transpose_a), bool(transpose_b), "precise"))


def dequantized_product(sem, a: Value, b: Value, acc: Value, transpose_a: bool, transpose_b: bool, sa: Value,
                        sb: Value) -> Value:
    """The block-scaled gemm ``acc + op(a) @ op(b)`` (scales ``sa``, ``sb``) as a bfloat16 gemm of the operands
    dequantized in registers (see the module docstring)."""
    a16 = _dequantize(sem, a, sa, k_axis=0 if transpose_a else 1)
    b16 = _dequantize(sem, b, sb, k_axis=1 if transpose_b else 0)
    return sem.gemm(a16, b16, acc, transpose_a, transpose_b)


_HINT = f"see {docs_link('microscaled-float8-mxfp8')}"


def _scale_tile(scale: Any, name: str, rows: int, dim: str, k: int) -> Value:
    want = (rows, k // MX_BLOCK)
    if not (isinstance(scale, Value) and scale.is_tile and scale.type.shape == want and scale.dtype.is_scale):
        raise SemanticError(f"{name} of a microscaled matrix product must be a float8_e8m0fnu tile of shape "
                            f"{want} ({dim} x K / {MX_BLOCK}: one scale per {MX_BLOCK} elements of K), got "
                            f"{describe(scale)}",
                            "give both scales as e8m0 tiles, e.g. SA[m0:m0 + BM, k0 // 32:k0 // 32 + BK // 32] "
                            f"({_HINT})")
    return scale


def _dequantize(sem, x: Value, scales: Value, k_axis: int) -> Value:
    """``x`` (float8, K along ``k_axis``) times its scales expanded over K (``scales`` (rows, K / 32), rows along
    the other axis), in bfloat16."""
    shape = x.type.shape
    k = shape[k_axis]
    blocks = k // MX_BLOCK
    factors = sem.cast(scales, D.float32)                        # (rows, blocks): 2^(e - 127)
    if blocks == 1:
        expanded = sem.expand_dims(sem.reduce(factors, 1, ReduceKind.SUM), k_axis)
    else:
        block_of_k = sem.binary(BinaryOp.FLOORDIV, sem.arange(0, k), MX_BLOCK)
        block_of_k = sem.expand_dims(block_of_k, 1 - k_axis)     # along K, broadcast over the rows
        block_ids = sem.expand_dims(sem.arange(0, blocks), 0)    # (1, blocks)
        expanded = sem.full(shape, 0.0, D.float32)
        for j in range(blocks):
            # column j of the scales, one per row, then placed over K's block j
            column = sem.reduce(sem.where(sem.compare(CompareOp.EQ, block_ids, j), factors, 0.0), 1, ReduceKind.SUM)
            column = sem.expand_dims(column, k_axis)
            expanded = sem.where(sem.compare(CompareOp.EQ, block_of_k, j), column, expanded)
    return sem.cast(sem.binary(BinaryOp.MUL, sem.cast(x, D.float32), expanded), D.bfloat16)
