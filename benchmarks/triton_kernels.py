"""Triton baselines: a grouped-ordering tiled matmul with a small autotune space, and the tiny launch kernel.

Importing this module needs triton; the benchmarks import it inside ``try`` and report "n/a" without it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _config(bm: int, bn: int, bk: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps,
                         num_stages=stages)


MATMUL_CONFIGS = [
    _config(128, 256, 64, 8, 3), _config(256, 128, 64, 8, 3), _config(128, 128, 64, 8, 4),
    _config(128, 128, 32, 4, 4), _config(64, 256, 32, 4, 4), _config(128, 64, 32, 4, 4),
    _config(64, 128, 64, 4, 4), _config(64, 64, 64, 4, 4),
]


@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Programs walk C in groups of GROUP_M tile rows so neighbouring programs share B tiles in L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows/cols past the edge wrap around (their results are never stored), keeping loads unmasked in M, N.
    a_ptrs = a_ptr + (rm % M)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=rk[None, :] < K - k0, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < K - k0, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """c = a @ b (2-D, 16-bit), autotuned over MATMUL_CONFIGS."""
    m, k = a.shape
    n = b.shape[1]

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    _matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         c.stride(0), c.stride(1))
    return c


def matmul_best_config() -> str:
    config = _matmul_kernel.best_config
    if config is None:
        return "n/a"
    kw = config.kwargs
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{config.num_warps} s{config.num_stages}"


_LOWP_CONFIGS = [
    _config(128, 256, 128, 8, 3), _config(128, 128, 128, 8, 4), _config(128, 128, 64, 4, 4),
    _config(128, 256, 64, 8, 3), _config(64, 128, 128, 4, 4), _config(128, 128, 32, 8, 3),
]


@triton.autotune(configs=_LOWP_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _matmul_lowp_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        stride_cm, stride_cn, SCALED: tl.constexpr, INT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    # The matmul above for fp8 (row/column scales in the epilogue), int8 (int32 sums) and float32 (tf32 dots).
    # EVEN_K loads without a mask: Triton cannot cast the masked loads' `other` to an fp8 type.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rm % M)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + (rn % N)[None, :] * stride_bn
    if INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < K - k0, other=0)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - k0, other=0)
        if INT:
            acc += tl.dot(a, b, out_dtype=tl.int32)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SCALED:
        acc = acc * tl.load(sa_ptr + rm, mask=rm < M, other=0.0)[:, None]
        acc = acc * tl.load(sb_ptr + rn, mask=rn < N, other=0.0)[None, :]
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul_lowp(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, sa: torch.Tensor | None = None,
                sb: torch.Tensor | None = None) -> torch.Tensor:
    """c = a @ b (* sa[:, None] * sb[None, :] when given) for fp8, int8 or float32 (tf32) operands; ``b`` may be
    a transposed view (K-major)."""
    m, k = a.shape
    n = b.shape[1]

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    scaled = sa is not None
    _matmul_lowp_kernel[grid](a, b, c, sa if scaled else c, sb if scaled else c, m, n, k, a.stride(0), a.stride(1),
                              b.stride(0), b.stride(1), c.stride(0), c.stride(1), SCALED=scaled,
                              INT=a.dtype == torch.int8, EVEN_K=k % 128 == 0)
    return c


def matmul_lowp_best_config() -> str:
    config = getattr(_matmul_lowp_kernel, "best_config", None)  # unset until a tuning succeeded
    if config is None:
        return "n/a"
    kw = config.kwargs
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{config.num_warps} s{config.num_stages}"


@triton.jit
def tiny(x_ptr, y_ptr, z_ptr, w_ptr, n, m, BLOCK: tl.constexpr):
    """The same work as ``benchmarks.kernels.tiny``: four pointers, two ints (n is also the length)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    z = tl.load(z_ptr + offs, mask=mask)
    tl.store(w_ptr + offs, x * y + z + (n - m), mask=mask)


_ATTN_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                 for bm, bn, w, s in ((128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                                      (128, 32, 4, 4), (64, 32, 4, 4))]


@triton.autotune(configs=_ATTN_CONFIGS, key=["S", "D", "CAUSAL"])
@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, S, H, stride_b, stride_h, stride_s,
                     D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # One program per BLOCK_M query rows of one (batch, head): online softmax over BLOCK_N key/value blocks,
    # in base 2 (qk_scale includes log2(e)); q/k/v/o share one contiguous (B, H, S, D) layout.
    block = tl.program_id(0)
    bh = tl.program_id(1)
    base = (bh // H) * stride_b + (bh % H) * stride_h
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + base + rows[:, None] * stride_s + dims[None, :], mask=rows[:, None] < S, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    end = tl.minimum((block + 1) * BLOCK_M, S) if CAUSAL else S
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kt = tl.load(k_ptr + base + cols[None, :] * stride_s + dims[:, None], mask=cols[None, :] < S, other=0.0)
        s = tl.dot(q, kt) * qk_scale
        keep = cols[None, :] < S
        if CAUSAL:
            keep = keep & (rows[:, None] >= cols[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + base + cols[:, None] * stride_s + dims[None, :], mask=cols[:, None] < S, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + rows[:, None] * stride_s + dims[None, :], out.to(o_ptr.dtype.element_ty),
             mask=rows[:, None] < S)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for contiguous (B, H, S, D) tensors of one shape (no grouped heads)."""
    batch, heads, seq, dim = q.shape
    out = torch.empty_like(q) if out is None else out

    def grid(meta):
        return (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads)

    _attn_fwd_kernel[grid](q, k, v, out, dim ** -0.5 * 1.4426950408889634, seq, heads, q.stride(0), q.stride(1),
                           q.stride(2), D=dim, CAUSAL=causal)
    return out
