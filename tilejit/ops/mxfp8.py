"""Microscaled float8 matrix products (OCP MX, MXFP8), written in tilejit's language.

The operands are e4m3 or e5m2 with e8m0 block scales, one per 32 elements of K: A (M, K) with ``a_scales``
(M, cdiv(K, 32)), B given N x K with ``b_scales`` (N, cdiv(K, 32)), both ``torch.float8_e8m0fnu`` (a scale
byte e means 2^(e - 127)). The product is ``C[m, n] = sum_k A[m, k] 2^(a_scales[m, k // 32] - 127) B[n, k]
2^(b_scales[n, k // 32] - 127)``, out in bfloat16.

Each program computes a BM x BN tile and walks K in BK steps with ``T.gemm(..., scale_a=, scale_b=)`` given
the steps' (BM, BK / 32) and (BN, BK / 32) e8m0 scale tiles (the microscaled form, docs/language.md): on every
arch but sm_100a the operands are dequantized into bfloat16 registers (exactly, but for values leaving
bfloat16's range) and multiplied on the tensor cores with float32 sums; on sm_100a (compiled, never run here)
128x128 tiles and K steps of 128 run on ``tcgen05.mma ... kind::mxf8f6f4.block_scale.block32`` with the scales
in tensor memory. M, N and K are ragged (the scales index with ceil; the
missing elements of a partial K block read as 0).

``mxfp8_matmul`` runs as the PyTorch operator ``tilejit::mxfp8_mm``; ``reference`` is the float64 dequantized
product the tests check against.
"""
from __future__ import annotations

import torch

import tilejit
import tilejit.language as T
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, decode_config, encode_config, namespace

#: Elements of K that one e8m0 scale covers.
BLOCK = 32
#: Elements of K per step of the op's loop: 128 on sm_100a (the block-scaled tcgen05 kind takes whole 128-byte
#: rows of K), else 64 (the dequantized form's registers).
BK_SM100, BK = 128, 64
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@tilejit.kernel
def mxfp8_mm(A, SA, B, SB, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, STAGES: T.constexpr):
    """C = A @ B^T with A's and B's e8m0 scales (one per 32 of K) applied; one BM x BN tile."""
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=STAGES):
        kb = k0 // 32
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], B[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True,
                     scale_a=SA[m0:m0 + BM, kb:kb + BK // 32], scale_b=SB[n0:n0 + BN, kb:kb + BK // 32])
    C[m0:m0 + BM, n0:n0 + BN] = acc


def default_config(m: int, n: int) -> dict:
    """128x128 tiles (64 rows, then 64 columns, when that leaves most of an H100's 132 SMs idle); the K step
    (``BK``, not a config key) follows the arch."""
    bm, bn = 128, 128
    if tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn) < 100:
        bm = 64
        if tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn) < 100:
            bn = 64
    return dict(BM=bm, BN=bn, STAGES=3, num_warps=4 if bm == 64 else 8)


#: What the product can be written as.
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(a, a_scales, b, b_scales, out_dtype=torch.bfloat16) -> None:
    """Types, shapes, dtypes and devices of a microscaled product's operands, or a typed error naming the one to fix
    (ArgumentError for a non-tensor or a wrong ``out_dtype``, ArgumentValueError, a ValueError, for the rest)."""
    bad = arg_checks.ArgumentValueError
    arg_checks.tensors("mxfp8_matmul", a=a, a_scales=a_scales, b=b, b_scales=b_scales)
    arg_checks.out_dtype("mxfp8_matmul", out_dtype, OUT_DTYPES)
    arg_checks.same_device("mxfp8_matmul", a=a, a_scales=a_scales, b=b, b_scales=b_scales)
    if a.dim() != 2 or b.dim() != 2:
        raise bad(f"mxfp8_matmul: a must be 2-D (M, K) and b 2-D (N, K), got a {tuple(a.shape)}, b {tuple(b.shape)}")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in _FP8:
            raise bad(f"mxfp8_matmul: {name} must be float8 (e4m3fn or e5m2), got {t.dtype}")
    if b.shape[1] != a.shape[1]:
        raise bad(f"mxfp8_matmul: a is {a.shape[0]}x{a.shape[1]} but b's rows have {b.shape[1]} elements; b is given "
                  "N x K")
    kb = tilejit.cdiv(a.shape[1], BLOCK)
    for name, t, rows in (("a_scales", a_scales, a.shape[0]), ("b_scales", b_scales, b.shape[0])):
        if tuple(t.shape) != (rows, kb) or t.dtype != torch.float8_e8m0fnu:
            raise bad(f"mxfp8_matmul: {name} must be torch.float8_e8m0fnu of shape {(rows, kb)} (one scale per 32 "
                      f"elements of K, ceil of the ragged edge), got {t.dtype} {tuple(t.shape)}")
    arg_checks.runs_on("mxfp8_matmul", "a", a, a.numel() > 0 and b.shape[0] > 0)


def _run(a, a_scales, b, b_scales, out, config: dict) -> torch.Tensor:
    m, n = a.shape[0], b.shape[0]
    if out.numel() == 0 or a.shape[1] == 0:  # no rows or columns; or K = 0, a sum of nothing (as torch.mm)
        return out.zero_()
    arch_major = torch.cuda.get_device_capability(a.device)[0] if a.is_cuda else 9
    cfg = {**default_config(m, n), **config, "BK": BK_SM100 if arch_major == 10 else BK}
    mxfp8_mm[(tilejit.cdiv(m, cfg["BM"]), tilejit.cdiv(n, cfg["BN"]))](a, a_scales, b, b_scales, out, **cfg)
    return out


def mxfp8_matmul(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                 out_dtype: torch.dtype = torch.bfloat16, **config) -> torch.Tensor:
    """(a @ b^T) with MX block scales: a (M, K) and b (N, K) float8 (e4m3fn or e5m2), ``a_scales``
    (M, cdiv(K, 32)) and ``b_scales`` (N, cdiv(K, 32)) ``torch.float8_e8m0fnu``, on one device; (M, N) of
    ``out_dtype`` (bfloat16, float16 or float32). ``config`` (BM, BN, STAGES, launch options) overrides
    ``default_config``. M, N or K of 0: no launch (K = 0 gives zeros)."""
    _check(a, a_scales, b, b_scales, out_dtype)
    return _OPS.mm(a, a_scales, b, b_scales, out_dtype, encode_config(config, "mxfp8_matmul"))


def reference(a, a_scales, b, b_scales) -> torch.Tensor:
    """The float64 product of the dequantized operands (each scale over its 32 elements of K)."""
    def dequantize(t, scales):
        return t.double() * scales.double().repeat_interleave(BLOCK, 1)[:, :t.shape[1]]
    return dequantize(a, a_scales) @ dequantize(b, b_scales).T


def _mm_op(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
           out_dtype: torch.dtype, config: list[int]) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype, device=a.device)
    return _run(a, a_scales, b, b_scales, out, decode_config(config))


class _Operators:
    """The PyTorch operator of this module, in ``namespace``: ``mxfp8_mm`` (functional, not differentiable)."""

    def __init__(self, namespace: str):
        self.mm = Operator(f"{namespace}::mxfp8_mm", _mm_op, fake=lambda a, sa, b, sb, out_dtype, config:
                           a.new_empty(a.shape[0], b.shape[0], dtype=out_dtype))


_OPS = _Operators(namespace(__name__, "tilejit.ops.mxfp8"))
