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


@triton.autotune(configs=_ATTN_CONFIGS, key=["S", "D", "CAUSAL", "STORE_LSE"])
@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, qk_scale, S, H, stride_b, stride_h, stride_s,
                     D: tl.constexpr, CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    # One program per BLOCK_M query rows of one (batch, head): online softmax over BLOCK_N key/value blocks,
    # in base 2 (qk_scale includes log2(e)); q/k/v/o share one contiguous (B, H, S, D) layout. STORE_LSE also
    # writes each row's base-2 log-sum-exp to lse (B * H, S) for the backward.
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
    if STORE_LSE:
        tl.store(lse_ptr + bh * S + rows, m_i + tl.math.log2(l_i), mask=rows < S)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              out: torch.Tensor | None = None, lse: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for contiguous (B, H, S, D) tensors of one shape (no grouped heads); with
    ``lse`` (float32 (B, H, S)) also each row's base-2 log-sum-exp, which the backward needs."""
    batch, heads, seq, dim = q.shape
    out = torch.empty_like(q) if out is None else out

    def grid(meta):
        return (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads)

    _attn_fwd_kernel[grid](q, k, v, out, out if lse is None else lse, dim ** -0.5 * 1.4426950408889634, seq, heads,
                           q.stride(0), q.stride(1), q.stride(2), D=dim, CAUSAL=causal, STORE_LSE=lse is not None)
    return out


# Backward, FlashAttention-2 style: a preprocess kernel (delta = rowsum(dO * O)), one kernel per key block for
# dK and dV (walking the query blocks and recomputing P^T from the saved log-sum-exp), one per query block for
# dQ (walking the key blocks). Causal: each walk starts, or stops, at the diagonal, and only the blocks that
# straddle it pay for the mask. Same layout as the forward: contiguous (B, H, S, D), lse/delta (B, H, S).

@triton.jit
def _attn_bwd_preprocess_kernel(o_ptr, do_ptr, delta_ptr, S, BLOCK_M: tl.constexpr, D: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = bh * S * D + rows[:, None] * D + tl.arange(0, D)[None, :]
    o = tl.load(o_ptr + offs, mask=rows[:, None] < S, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=rows[:, None] < S, other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh * S + rows, tl.sum(o * do, 1), mask=rows < S)


@triton.jit
def _dkdv_block(k, v, dk, dv, q_base, do_base, lse_base, delta_base, m0, cols, qk_scale, S, D: tl.constexpr,
                BLOCK_M: tl.constexpr, MASK: tl.constexpr):
    # Key-major: P^T (BLOCK_N x BLOCK_M) is the left operand of dV's product and dS^T of dK's, untransposed.
    rows = m0 + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    in_seq = rows < S
    qt = tl.load(q_base + rows[None, :] * D + dims[:, None], mask=in_seq[None, :], other=0.0)
    do = tl.load(do_base + rows[:, None] * D + dims[None, :], mask=in_seq[:, None], other=0.0)
    # rows past S read lse = delta = 0 with q = dO = 0: their terms are exactly 0
    lse = tl.load(lse_base + rows, mask=in_seq, other=0.0)
    delta = tl.load(delta_base + rows, mask=in_seq, other=0.0)
    pt = tl.math.exp2(tl.dot(k, qt) * qk_scale - lse[None, :])
    if MASK:
        pt = tl.where(cols[:, None] <= rows[None, :], pt, 0.0)
    dv = tl.dot(pt.to(do.dtype), do, dv)
    dpt = tl.dot(v, tl.trans(do))
    dst = pt * (dpt - delta[None, :])
    dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk)
    return dk, dv


_BWD_DKDV_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                     for bm, bn, w, s in ((32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3),
                                          (16, 128, 4, 4))]
_BWD_DQ_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                   for bm, bn, w, s in ((128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3),
                                        (128, 16, 4, 4))]


@triton.autotune(configs=_BWD_DKDV_CONFIGS, key=["S", "D", "CAUSAL"])
@triton.jit
def _attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, sm_scale, S,
                          D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BLOCK_N keys of one (batch, head); BLOCK_N is a multiple of BLOCK_M, so the diagonal crosses exactly the
    # BLOCK_N // BLOCK_M query blocks starting at n0.
    n0 = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    head = bh.to(tl.int64) * S * D
    cols = n0 + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    kv_offs = head + cols[:, None] * D + dims[None, :]
    k = tl.load(k_ptr + kv_offs, mask=cols[:, None] < S, other=0.0)
    v = tl.load(v_ptr + kv_offs, mask=cols[:, None] < S, other=0.0)
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    lse_base = lse_ptr + bh * S
    delta_base = delta_ptr + bh * S
    qk_scale = sm_scale * 1.4426950408889634
    start = 0
    if CAUSAL:
        start = tl.minimum(n0 + BLOCK_N, S)
        for m0 in range(n0, start, BLOCK_M):
            dk, dv = _dkdv_block(k, v, dk, dv, q_ptr + head, do_ptr + head, lse_base, delta_base, m0, cols,
                                 qk_scale, S, D, BLOCK_M, True)
    for m0 in range(start, S, BLOCK_M):
        dk, dv = _dkdv_block(k, v, dk, dv, q_ptr + head, do_ptr + head, lse_base, delta_base, m0, cols, qk_scale,
                             S, D, BLOCK_M, False)
    tl.store(dk_ptr + kv_offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=cols[:, None] < S)
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=cols[:, None] < S)


@triton.jit
def _dq_block(q, do, dq, lse, delta, k_base, v_base, n0, rows, qk_scale, S, D: tl.constexpr,
              BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    cols = n0 + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    kt = tl.load(k_base + cols[None, :] * D + dims[:, None], mask=cols[None, :] < S, other=0.0)
    vt = tl.load(v_base + cols[None, :] * D + dims[:, None], mask=cols[None, :] < S, other=0.0)
    p = tl.math.exp2(tl.dot(q, kt) * qk_scale - lse[:, None])
    if MASK:
        # a key past S is a zero row of K, yet exp2(-lse) * (0 - delta) is no zero weight: mask it
        keep = cols[None, :] < S
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        p = tl.where(keep, p, 0.0)
    ds = p * (tl.dot(do, vt) - delta[:, None])
    return tl.dot(ds.to(kt.dtype), tl.trans(kt), dq)


@triton.autotune(configs=_BWD_DQ_CONFIGS, key=["S", "D", "CAUSAL"])
@triton.jit
def _attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, sm_scale, S,
                        D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # BLOCK_M query rows of one (batch, head); BLOCK_M is a multiple of BLOCK_N. Whole key blocks inside the
    # sequence (and left of the diagonal) first, unmasked; then the rest, masked.
    m0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    head = bh.to(tl.int64) * S * D
    rows = m0 + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    q_offs = head + rows[:, None] * D + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=rows[:, None] < S, other=0.0)
    do = tl.load(do_ptr + q_offs, mask=rows[:, None] < S, other=0.0)
    lse = tl.load(lse_ptr + bh * S + rows, mask=rows < S, other=0.0)
    delta = tl.load(delta_ptr + bh * S + rows, mask=rows < S, other=0.0)
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    mid = (S // BLOCK_N) * BLOCK_N
    end = S
    if CAUSAL:
        mid = tl.minimum(m0, mid)
        end = tl.minimum(m0 + BLOCK_M, S)
    for n0 in range(0, mid, BLOCK_N):
        dq = _dq_block(q, do, dq, lse, delta, k_ptr + head, v_ptr + head, n0, rows, qk_scale, S, D, BLOCK_N,
                       False, CAUSAL)
    for n0 in range(mid, end, BLOCK_N):
        dq = _dq_block(q, do, dq, lse, delta, k_ptr + head, v_ptr + head, n0, rows, qk_scale, S, D, BLOCK_N,
                       True, CAUSAL)
    tl.store(dq_ptr + q_offs, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=rows[:, None] < S)


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, causal: bool, grads=None, delta: torch.Tensor | None = None):
    """(dq, dk, dv) of ``attention`` for contiguous (B, H, S, D) inputs, given its ``out`` and ``lse``; ``grads``
    (dq, dk, dv) and ``delta`` (float32 (B, H, S)) may be preallocated."""
    batch, heads, seq, dim = q.shape
    assert all(t.is_contiguous() for t in (do, q, k, v, out)) and k.shape == q.shape, "contiguous, no GQA"
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    delta = torch.empty_like(lse) if delta is None else delta
    rows = max(16, 4096 // dim)
    _attn_bwd_preprocess_kernel[(triton.cdiv(seq, rows), batch * heads)](out, do, delta, seq, BLOCK_M=rows, D=dim)
    sm_scale = dim ** -0.5
    _attn_bwd_dkdv_kernel[lambda meta: (triton.cdiv(seq, meta["BLOCK_N"]), batch * heads)](
        q, k, v, do, lse, delta, dk, dv, sm_scale, seq, D=dim, CAUSAL=causal)
    _attn_bwd_dq_kernel[lambda meta: (triton.cdiv(seq, meta["BLOCK_M"]), batch * heads)](
        q, k, v, do, lse, delta, dq, sm_scale, seq, D=dim, CAUSAL=causal)
    return dq, dk, dv


def attention_fwd_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool):
    """Forward (keeping the log-sum-exp) then backward: (out, dq, dk, dv)."""
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    out = attention(q, k, v, causal, lse=lse)
    return (out, *attention_backward(do, q, k, v, out, lse, causal))


def attention_bwd_best_config() -> str:
    parts = []
    for name, kernel in (("dkdv", _attn_bwd_dkdv_kernel), ("dq", _attn_bwd_dq_kernel)):
        config = getattr(kernel, "best_config", None)
        if config is not None:
            kw = config.kwargs
            parts.append(f"{name} {kw['BLOCK_M']}x{kw['BLOCK_N']} w{config.num_warps} s{config.num_stages}")
    return ", ".join(parts) or "n/a"
