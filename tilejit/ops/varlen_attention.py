"""Attention over packed variable-length batches (``flash_attn_varlen_func``'s conventions), forward and backward,
and the forward over a paged key/value cache.

The B sequences lie one after another: q (total_q, H, D), k and v (total_k, H // G, D); sequence ``b`` owns the
query rows ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1]`` and the key rows of ``cu_seqlens_k`` alike. The kernels take
these tensors as (1, heads, tokens, D) views (no copy) and reuse fused_attention's per-block steps: a program maps
its ids to (sequence, head, query block), reads its sequence's bounds from the cu_seqlens with scalar loads, and
walks the keys as the padded forward does (same tiles, same split into unmasked blocks and masked ones) in absolute
key rows. Query row i of a sequence with Lq queries and Lk keys sits on key row i + Lk - Lq (the bottom-right
aligned diagonal of flash-attn): causal sees keys up to it, a window (left, right) keys diagonal - left ..
diagonal + right. A query block past a sequence's end reads the next sequence's rows, whose results are never
stored (stores past the end go through ``T.bounded`` views ending at the sequence's last row); the key block
that crosses the end reads through such a view too (the next sequence's keys read 0), so no value of one
sequence, NaN included, reaches another. A row that sees no key (a window, causal with Lq > Lk, Lk = 0) gives
0. The grid covers ``max_seqlen_q`` (the host never reads the cu_seqlens); blocks past a shorter sequence run no
key block.

Backward: ``attn_bwd_preprocess`` (Delta) as for the padded batch, then ``attn_varlen_bwd_dkdv`` (one program per
key block and key/value head) and ``attn_varlen_bwd_dq`` (one per query block and head). The dK/dV program reads
the query blocks that straddle the diagonal, or cross the sequence's end, through views bounded at the sequence's
end (so the next sequence's rows read as zeros, whose terms are exactly 0), the whole ones inside it directly;
the dQ program reads keys as the forward does.

Paged (``block_table``): k and v are (num_pages, page_size, H // G, D) and sequence b's key j lives in page
``block_table[b, j // page_size]`` at row ``j % page_size``; ``attn_varlen_paged_fwd`` gathers each key block's
rows. Forward only.
"""
from __future__ import annotations

import math

import torch

import tilejit
import tilejit.language as T
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, namespace
from tilejit.ops.fused_attention import (BWD_CONFIGS, _dkdv_step, _dq_step, _hopper, _masking, _online_softmax_step,
                                         _grads_like, _score_scales, _sm80, _visible, attn_bwd_preprocess,
                                         default_bwd_config, default_config)

@tilejit.func
def _key_blocks(m, len_q, len_k, BM, BN, CAUSAL, LEFT, RIGHT):
    """(mid, hi): the key rows (relative to the sequence) that query block ``m`` walks: unmasked blocks from 0 to
    ``mid``, masked ones from ``mid`` to ``hi``; with a window, only the blocks it reaches, all masked (``mid``
    its first block). A block past the queries walks none."""
    diag = m + len_k - len_q  # the key on the diagonal of the block's first row
    mid = (len_k // BN) * BN
    hi = len_k
    if CAUSAL:
        mid = T.minimum(mid, (T.maximum(diag + 1, 0) // BN) * BN)
        hi = T.minimum(hi, diag + BM)
    if LEFT >= 0 or RIGHT >= 0:
        mid = 0
        if LEFT >= 0:
            mid = (T.maximum(diag - LEFT, 0) // BN) * BN
        if RIGHT >= 0:
            hi = T.minimum(hi, diag + BM + RIGHT)
    # a block past the queries walks none; scalar math, not an if, so that a producer warpgroup can compute the
    # bounds (passes/warp_specialize.py)
    inside = T.minimum(T.maximum(len_q - m, 0), 1)
    return mid * inside, hi * inside


@tilejit.func
def _start_rows(Q, h, r0, sm_scale, BM, D, SOFTCAP):
    """A block's query rows and the online softmax's start: (q, row maxima -inf, row sums 0, accumulator 0, the
    scale of the scores into base 2, the scale into tanh's argument with a softcap)."""
    q = Q[0, h, r0:r0 + BM, 0:D]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    qk_scale, tanh_scale = _score_scales(sm_scale, SOFTCAP)
    return q, m_i, l_i, acc, qk_scale, tanh_scale


@tilejit.func
def _finish(acc, m_i, l_i, O, Lse, h, r0, q_end, BM, D, STORE_LSE):
    """Stores the block's rows up to the sequence's end: a row that saw no key gives 0 (and LSE +inf). A block
    inside the sequence stores directly (on sm_90a through the TMA), the last one through a view ending there."""
    l_i = T.where(l_i > 0.0, l_i, 1.0)
    m_i = T.where(m_i == float("-inf"), float("inf"), m_i)
    o = (acc / l_i[:, None]).to(O.dtype)
    if r0 + BM <= q_end:
        O[0, h, r0:r0 + BM, 0:D] = o
    else:
        Ov = T.bounded(O, (1, O.shape[1], q_end, D))
        Ov[0, h, r0:r0 + BM, 0:D] = o
    if STORE_LSE:
        Lv = T.bounded(Lse, (1, Lse.shape[1], q_end))
        Lv[0, h, r0:r0 + BM] = m_i + T.log2(l_i)


@tilejit.kernel
def attn_varlen_fwd(Q, K, V, O, Lse, CuQ, CuK, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr, BN: T.constexpr,
                    D: T.constexpr, CAUSAL: T.constexpr, STORE_LSE: T.constexpr = False, STAGES: T.constexpr = 2,
                    WINDOW_LEFT: T.constexpr = -1, WINDOW_RIGHT: T.constexpr = -1, SOFTCAP: T.constexpr = 0.0):
    """BM query rows of one (sequence, head); Q, K, V, O are (1, heads, tokens, D) views, Lse (1, H, total_q).
    The masked blocks take causal as a right bound of 0 (``MASK_RIGHT``), so a row that sees no key stays 0."""
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    m = T.program_id(0) * BM
    if CAUSAL:  # the last query blocks attend to the most keys: start them first
        m = (T.num_programs(0) - 1 - T.program_id(0)) * BM
    q0 = CuQ[b]
    q_end = CuQ[b + 1]
    k0 = CuK[b]
    k_end = CuK[b + 1]
    len_q = q_end - q0
    r0 = q0 + m
    q, m_i, l_i, acc, qk_scale, tanh_scale = _start_rows(Q, h, r0, sm_scale, BM, D, SOFTCAP)
    rows = (k_end - len_q + m) + T.arange(0, BM)  # each row's diagonal, in absolute key rows
    mid, hi = _key_blocks(m, len_q, k_end - k0, BM, BN, CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
    MASK_RIGHT = WINDOW_RIGHT
    if CAUSAL:
        MASK_RIGHT = 0
    if WINDOW_LEFT < 0 and WINDOW_RIGHT < 0:
        for n0 in T.range(k0, k0 + mid, BN, stages=STAGES):
            m_i, l_i, acc = _online_softmax_step(q, K, V, 0, kv, n0, k_end, rows, m_i, l_i, acc, qk_scale, BN, D,
                                                 False, False, -1, -1, SOFTCAP, tanh_scale)
    whole = k0 + ((k_end - k0) // BN) * BN  # the blocks before it lie inside the sequence
    for n0 in T.range(k0 + mid, T.minimum(k0 + hi, whole), BN, stages=2):
        m_i, l_i, acc = _online_softmax_step(q, K, V, 0, kv, n0, k_end, rows, m_i, l_i, acc, qk_scale, BN, D, True,
                                             False, WINDOW_LEFT, MASK_RIGHT, SOFTCAP, tanh_scale)
    Kv = T.bounded(K, (1, K.shape[1], k_end, D))  # the block across the end: the next sequence's keys read 0
    Vv = T.bounded(V, (1, V.shape[1], k_end, D))
    for n0 in T.range(T.maximum(k0 + mid, whole), k0 + hi, BN, stages=1):
        m_i, l_i, acc = _online_softmax_step(q, Kv, Vv, 0, kv, n0, k_end, rows, m_i, l_i, acc, qk_scale, BN, D,
                                             True, False, WINDOW_LEFT, MASK_RIGHT, SOFTCAP, tanh_scale)
    _finish(acc, m_i, l_i, O, Lse, h, r0, q_end, BM, D, STORE_LSE)


@tilejit.func
def _paged_step(q, Kc, Vc, Pages, b, kv, n0, len_k, rows, m_i, l_i, acc, qk_scale, BN, D, PAGE, LEFT, RIGHT,
                SOFTCAP, tanh_scale):
    """``_online_softmax_step`` over keys n0 .. n0 + BN of sequence ``b`` gathered from the paged cache (Kc, Vc:
    (num_pages * page_size, heads, D)); every block masked. Keys past the sequence's end read as 0 whatever its
    table holds past its pages."""
    cols = n0 + T.arange(0, BN)
    idx = T.where(cols < len_k, Pages[b, cols // PAGE] * PAGE + cols % PAGE, -1)  # past the keys: read as 0
    k = Kc[idx, kv, 0:D]
    s = T.gemm(q, k, T.zeros((q.shape[0], BN), T.float32), transpose_b=True)
    if SOFTCAP > 0.0:
        s = T.tanh(s * tanh_scale) * (SOFTCAP * 1.4426950408889634)
    s = T.where(_visible(rows, cols, len_k, False, LEFT, RIGHT), s, float("-inf"))
    m_new = T.maximum(m_i, T.max(s, 1) * qk_scale)
    m_exp = T.where(m_new == float("-inf"), 0.0, m_new)
    p = T.exp2(s * qk_scale - m_exp[:, None])
    alpha = T.exp2(m_i - m_exp)
    l_i = l_i * alpha + T.sum(p, 1)
    v = Vc[idx, kv, 0:D]
    acc = acc * alpha[:, None] + p.to(Vc.dtype) @ v
    return m_new, l_i, acc


@tilejit.kernel
def attn_varlen_paged_fwd(Q, Kc, Vc, O, Lse, CuQ, CuK, Pages, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr,
                          BN: T.constexpr, D: T.constexpr, PAGE: T.constexpr, CAUSAL: T.constexpr,
                          STORE_LSE: T.constexpr = False, WINDOW_LEFT: T.constexpr = -1,
                          WINDOW_RIGHT: T.constexpr = -1, SOFTCAP: T.constexpr = 0.0):
    """``attn_varlen_fwd`` with the keys of sequence b in the pages of ``Pages[b]``: key rows relative to the
    sequence, every block masked (``_paged_step``)."""
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    m = T.program_id(0) * BM
    q0 = CuQ[b]
    q_end = CuQ[b + 1]
    len_q = q_end - q0
    len_k = CuK[b + 1] - CuK[b]
    r0 = q0 + m
    q, m_i, l_i, acc, qk_scale, tanh_scale = _start_rows(Q, h, r0, sm_scale, BM, D, SOFTCAP)
    rows = (len_k - len_q + m) + T.arange(0, BM)
    mid, hi = _key_blocks(m, len_q, len_k, BM, BN, CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
    lo = 0
    if WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0:
        lo = mid
    MASK_RIGHT = WINDOW_RIGHT
    if CAUSAL:
        MASK_RIGHT = 0
    for n0 in T.range(lo, hi, BN, stages=1):
        m_i, l_i, acc = _paged_step(q, Kc, Vc, Pages, b, kv, n0, len_k, rows, m_i, l_i, acc, qk_scale, BN, D, PAGE,
                                    WINDOW_LEFT, MASK_RIGHT, SOFTCAP, tanh_scale)
    _finish(acc, m_i, l_i, O, Lse, h, r0, q_end, BM, D, STORE_LSE)


@tilejit.kernel
def attn_varlen_bwd_dq(Q, K, V, dO, Lse, Delta, dQ, CuQ, CuK, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr,
                       BN: T.constexpr, D: T.constexpr, CAUSAL: T.constexpr, WINDOW_LEFT: T.constexpr = -1,
                       WINDOW_RIGHT: T.constexpr = -1, SOFTCAP: T.constexpr = 0.0):
    """dQ of BM query rows of one (sequence, head), over the key blocks the forward walked (``_key_blocks``):
    unmasked, then masked. Rows past the sequence compute what is never stored."""
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    m = T.program_id(0) * BM
    q0 = CuQ[b]
    q_end = CuQ[b + 1]
    k0 = CuK[b]
    k_end = CuK[b + 1]
    len_q = q_end - q0
    r0 = q0 + m
    q = Q[0, h, r0:r0 + BM, 0:D]
    do = dO[0, h, r0:r0 + BM, 0:D]
    lse = Lse[0, h, r0:r0 + BM]
    delta = Delta[0, h, r0:r0 + BM]
    qk_scale, tanh_scale = _score_scales(sm_scale, SOFTCAP)
    rows = (k_end - len_q + m) + T.arange(0, BM)
    mid, hi = _key_blocks(m, len_q, k_end - k0, BM, BN, CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
    MASK_RIGHT = WINDOW_RIGHT
    if CAUSAL:
        MASK_RIGHT = 0
    dq = T.zeros((BM, D), T.float32)
    if WINDOW_LEFT < 0 and WINDOW_RIGHT < 0:
        for n0 in T.range(k0, k0 + mid, BN, stages=2):
            dq = _dq_step(q, do, lse, delta, K, V, 0, kv, n0, k_end, rows, dq, qk_scale, BN, D, False, False, -1, -1,
                          SOFTCAP, tanh_scale)
    whole = k0 + ((k_end - k0) // BN) * BN
    for n0 in T.range(k0 + mid, T.minimum(k0 + hi, whole), BN, stages=2):
        dq = _dq_step(q, do, lse, delta, K, V, 0, kv, n0, k_end, rows, dq, qk_scale, BN, D, True, False, WINDOW_LEFT,
                      MASK_RIGHT, SOFTCAP, tanh_scale)
    Kv = T.bounded(K, (1, K.shape[1], k_end, D))
    Vv = T.bounded(V, (1, V.shape[1], k_end, D))
    for n0 in T.range(T.maximum(k0 + mid, whole), k0 + hi, BN, stages=1):
        dq = _dq_step(q, do, lse, delta, Kv, Vv, 0, kv, n0, k_end, rows, dq, qk_scale, BN, D, True, False,
                      WINDOW_LEFT, MASK_RIGHT, SOFTCAP, tanh_scale)
    dQv = T.bounded(dQ, (1, H, q_end, D))
    dQv[0, h, r0:r0 + BM, 0:D] = (dq * sm_scale).to(dQ.dtype)


@tilejit.func
def _query_blocks(n, len_q, len_k, BN, CAUSAL, LEFT, RIGHT):
    """(lo, mid, hi): the query rows (relative to the sequence) whose keys include some of key block ``n``:
    ``lo`` .. ``mid`` the rows that need masks (the diagonal's BN rows, or with a window all of them), ``mid``
    .. ``hi`` the rest. A block past the keys has none."""
    diag = n - len_k + len_q  # the query row whose diagonal is the block's first key
    lo = 0
    mid = 0
    hi = len_q
    if CAUSAL:
        lo = T.maximum(diag, 0)
        mid = T.minimum(T.maximum(diag + BN, 0), len_q)
    if LEFT >= 0 or RIGHT >= 0:
        if RIGHT >= 0:
            lo = T.maximum(diag - RIGHT, 0)
        if LEFT >= 0:
            hi = T.minimum(len_q, diag + BN + LEFT)
        mid = hi
    if n >= len_k:
        lo = 0
        mid = 0
        hi = 0
    return lo, mid, hi


@tilejit.kernel
def attn_varlen_bwd_dkdv(Q, K, V, dO, Lse, Delta, dK, dV, CuQ, CuK, sm_scale, HKV, GROUP: T.constexpr,
                         BM: T.constexpr, BN: T.constexpr, D: T.constexpr, CAUSAL: T.constexpr,
                         WINDOW_LEFT: T.constexpr = -1, WINDOW_RIGHT: T.constexpr = -1, SOFTCAP: T.constexpr = 0.0):
    """dK and dV of BN keys of one (sequence, key/value head), over the GROUP query heads that read them and the
    query blocks of ``_query_blocks``: the masked ones and the last partial one through views that end at the
    sequence's last query row, the whole ones in between directly. Key rows past the sequence are not stored."""
    assert BN % BM == 0, "attn_varlen_bwd_dkdv needs BN to be a multiple of BM (the diagonal spans whole blocks)"
    pid_bh = T.program_id(1)
    b = pid_bh // HKV
    kv = pid_bh % HKV
    n = T.program_id(0) * BN
    q0 = CuQ[b]
    q_end = CuQ[b + 1]
    k0 = CuK[b]
    k_end = CuK[b + 1]
    len_q = q_end - q0
    len_k = k_end - k0
    k = K[0, kv, k0 + n:k0 + n + BN, 0:D]
    v = V[0, kv, k0 + n:k0 + n + BN, 0:D]
    cols = (q0 + n - len_k + len_q) + T.arange(0, BN)  # each key's diagonal query row, absolute
    Qv = T.bounded(Q, (1, Q.shape[1], q_end, D))
    dOv = T.bounded(dO, (1, dO.shape[1], q_end, D))
    Lsev = T.bounded(Lse, (1, Lse.shape[1], q_end))
    Deltav = T.bounded(Delta, (1, Delta.shape[1], q_end))
    qk_scale, tanh_scale = _score_scales(sm_scale, SOFTCAP)
    lo, mid, hi = _query_blocks(n, len_q, len_k, BN, CAUSAL, WINDOW_LEFT, WINDOW_RIGHT)
    mid = lo + ((mid - lo + BM - 1) // BM) * BM  # the masked blocks cover lo .. mid whole
    full = mid + (T.maximum(hi - mid, 0) // BM) * BM
    dk = T.zeros((BN, D), T.float32)
    dv = T.zeros((BN, D), T.float32)
    for g in range(GROUP):
        h = kv * GROUP + g
        for m0 in T.range(q0 + lo, q0 + mid, BM, stages=2):
            dk, dv = _dkdv_step(k, v, Qv, dOv, Lsev, Deltav, 0, h, m0, cols, 0, dk, dv, qk_scale, BM, D, CAUSAL,
                                False, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, tanh_scale)
        for m0 in T.range(q0 + mid, q0 + full, BM, stages=2):
            dk, dv = _dkdv_step(k, v, Q, dO, Lse, Delta, 0, h, m0, cols, 0, dk, dv, qk_scale, BM, D, False, False,
                                -1, -1, SOFTCAP, tanh_scale)
        for m0 in T.range(q0 + full, q0 + hi, BM, stages=1):
            dk, dv = _dkdv_step(k, v, Qv, dOv, Lsev, Deltav, 0, h, m0, cols, 0, dk, dv, qk_scale, BM, D, False,
                                False, -1, -1, SOFTCAP, tanh_scale)
    dKv = T.bounded(dK, (1, HKV, k_end, D))
    dVv = T.bounded(dV, (1, HKV, k_end, D))
    dKv[0, kv, k0 + n:k0 + n + BN, 0:D] = (dk * sm_scale).to(dK.dtype)
    dVv[0, kv, k0 + n:k0 + n + BN, 0:D] = dv.to(dV.dtype)


def _tokens_view(t: torch.Tensor) -> torch.Tensor:
    """(tokens, heads, D), contiguous, as the (1, heads, tokens, D) view the kernels index (no copy)."""
    tokens, heads, dim = t.shape
    return t.as_strided((1, heads, tokens, dim), (heads * dim, dim, heads * dim, 1))


def _check_inputs(q, k, v, cu_q, cu_k, max_q, max_k, block_table):
    """The errors for arguments the kernels cannot take; returns (batch, GQA group)."""
    op, bad = "attention_varlen", arg_checks.ArgumentValueError
    arg_checks.tensors(op, q=q, k=k, v=v)
    arg_checks.optional_tensors(op, block_table=block_table)
    floats = arg_checks.FLOATS
    if q.dtype not in floats or k.dtype != q.dtype or v.dtype != q.dtype:
        raise arg_checks.ArgumentError(f"attention_varlen: q, k and v must share one dtype of float16, bfloat16 or "
                                       f"float32, got {q.dtype}, {k.dtype}, {v.dtype}")
    arg_checks.same_device(op, q=q, k=k, v=v, block_table=block_table)
    kv_rank = 3 if block_table is None else 4
    layout = "(total_k, kv_heads, D)" if block_table is None else "(num_pages, page_size, kv_heads, D)"
    if q.dim() != 3 or k.dim() != kv_rank or k.shape != v.shape:
        raise bad(f"attention_varlen: q must be (total_q, heads, D) and k, v one shape {layout}, got q "
                  f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[-2]
    if k.shape[-1] != dim or not 16 <= dim <= 256 or dim % 16:
        raise bad(f"attention_varlen: q and k must have one head dim, a multiple of 16 from 16 to 256; got {dim} and "
                  f"{k.shape[-1]}")
    if kv_heads == 0 or heads % kv_heads:
        raise bad(f"attention_varlen: query heads {heads} must be a multiple of key/value heads {kv_heads}")
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise bad(f"attention_varlen: {name} must be an int32 tensor of shape (batch + 1,), got "
                      f"{getattr(cu, 'dtype', type(cu).__name__)} {tuple(getattr(cu, 'shape', ()))}")
        if cu.device != q.device:
            raise bad(f"attention_varlen: {name} is on {cu.device}, q on {q.device}")
    if cu_q.shape != cu_k.shape:
        raise bad(f"attention_varlen: cu_seqlens_q {tuple(cu_q.shape)} and cu_seqlens_k {tuple(cu_k.shape)} must have "
                  f"one shape (batch + 1,)")
    for name, value in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 0:
            raise bad(f"attention_varlen: {name} must be an int >= 0, got {value!r}")
    batch = cu_q.shape[0] - 1
    if block_table is not None and (block_table.dtype != torch.int32 or block_table.dim() != 2
                                    or block_table.shape[0] != batch):
        raise bad(f"attention_varlen: block_table must be an int32 tensor of shape ({batch}, max_pages), got "
                  f"{block_table.dtype} {tuple(block_table.shape)}")
    return batch, heads // kv_heads


def _forward(q, k, v, cu_q, cu_k, block_table, max_q, max_k, causal, window, softcap, sm_scale, lse, out=None):
    """Launches the forward into ``out`` (new when None; the rows of no sequence left as they were) and ``lse``
    (float32 (heads, total_q)) when given. The caller has checked the arguments (``_check_inputs``)."""
    heads, dim = q.shape[1], q.shape[2]
    batch, group = cu_q.shape[0] - 1, heads // k.shape[-2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q) if out is None else out
    if max_q == 0 or q.numel() == 0:  # no query row, or no head
        return out
    masking = _masking(causal, window, softcap)
    causal = masking.pop("CAUSAL")
    config = default_config(dim, causal, _hopper(q))
    lse_arg = lse.unsqueeze(0) if lse is not None else cu_q
    grid = (tilejit.cdiv(max_q, config["BM"]), batch * heads)
    if block_table is None:
        attn_varlen_fwd[grid](_tokens_view(q), _tokens_view(k), _tokens_view(v), _tokens_view(out), lse_arg, cu_q,
                              cu_k, sm_scale, heads, GROUP=group, D=dim, CAUSAL=causal, STORE_LSE=lse is not None,
                              **{**masking, **config})
        return out
    pages, page_size = k.shape[0], k.shape[1]
    config = {"BM": config["BM"], "BN": config["BN"], "num_warps": config["num_warps"]}
    attn_varlen_paged_fwd[grid](_tokens_view(q), k.view(pages * page_size, *k.shape[2:]),
                                v.view(pages * page_size, *v.shape[2:]), _tokens_view(out), lse_arg, cu_q, cu_k,
                                block_table.contiguous(), sm_scale, heads, GROUP=group, D=dim, PAGE=page_size,
                                CAUSAL=causal, STORE_LSE=lse is not None, **{**masking, **config})
    return out


def _backward(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, window, softcap, sm_scale):
    """(dq, dk, dv) given the forward's output and base-2 log-sum-exp (float32 (heads, total_q))."""
    batch, group = _check_inputs(q, k, v, cu_q, cu_k, max_q, max_k, None)
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[1]
    q, k, v, do, out = (t.contiguous() for t in (q, k, v, do, out))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if max_q == 0 or max_k == 0 or q.numel() == 0 or k.shape[0] == 0:
        return dq, dk, dv
    masking = _masking(causal, window, softcap)
    causal = masking.pop("CAUSAL")
    cfg = default_bwd_config(dim, hopper=_hopper(q), sm80=_sm80(q))
    total_q = q.shape[0]
    delta = torch.empty(1, heads, total_q, dtype=torch.float32, device=q.device)
    views = [_tokens_view(t) for t in (q, k, v, do)]
    rows = max(16, 4096 // dim)
    attn_bwd_preprocess[(tilejit.cdiv(total_q, rows), heads)](_tokens_view(out), views[3], delta, heads, BM=rows,
                                                             D=dim, num_warps=4)
    lse = lse.unsqueeze(0)
    c = cfg["dkdv"]
    attn_varlen_bwd_dkdv[(tilejit.cdiv(max_k, c["BN"]), batch * kv_heads)](
        *views, lse, delta, _tokens_view(dk), _tokens_view(dv), cu_q, cu_k, sm_scale, kv_heads, GROUP=group,
        D=dim, CAUSAL=causal, **{**masking, **c})
    c = cfg["dq"]
    attn_varlen_bwd_dq[(tilejit.cdiv(max_q, c["BM"]), batch * heads)](
        *views, lse, delta, _tokens_view(dq), cu_q, cu_k, sm_scale, heads, GROUP=group, D=dim, CAUSAL=causal,
        **{**masking, **c})
    return dq, dk, dv


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     sm_scale: float | None = None, window: tuple[int, int] | None = None,
                     softcap: float | None = None, block_table: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of B packed sequences, as ``flash_attn_varlen_func``: q (total_q, heads, D), k and v
    (total_k, heads // G, D), ``cu_seqlens_q``/``cu_seqlens_k`` int32 (B + 1,) the sequences' first rows (and the
    ends), ``max_seqlen_q``/``max_seqlen_k`` at least every sequence's length (they size the grid; the cu_seqlens
    are never read on the host). Returns (total_q, heads, D); rows of no sequence are left unwritten.

    ``causal``: query i of a sequence with Lq queries and Lk keys sees keys up to i + Lk - Lq (aligned to the
    bottom right); ``window=(left, right)`` (-1 unbounded) keys i + Lk - Lq - left .. i + Lk - Lq + right;
    ``softcap=c`` caps the scaled scores to c * tanh(s / c). A query row that sees no key gives 0. The PyTorch
    operator ``tilejit::attention_varlen_fwd``, differentiable in q, k and v (backward
    ``tilejit::attention_varlen_bwd``).

    ``block_table`` (int32 (B, max_pages)): k and v are a paged cache (num_pages, page_size, heads // G, D), key j
    of sequence b in page ``block_table[b, j // page_size]``, and ``cu_seqlens_k`` counts each sequence's keys
    (prefill over a paged cache). Forward only: with it, q, k and v must not require grad.
    """
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table)
    _masking(causal, window, softcap, "attention_varlen")
    sm_scale = arg_checks.sm_scale("attention_varlen", sm_scale, q.shape[2])
    masking = (*arg_checks.window("attention_varlen", window), float(softcap or 0.0))
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if grad and block_table is not None:
        raise arg_checks.ArgumentValueError("attention_varlen: the paged form (block_table) has no backward; run it "
                                            "under torch.no_grad() or with inputs that do not require grad")
    if grad and q.shape[2] > max(BWD_CONFIGS):
        raise arg_checks.ArgumentValueError(f"attention_varlen: no backward for head dim {q.shape[2]} (at most "
                                            f"{max(BWD_CONFIGS)})")
    arg_checks.runs_on("attention_varlen", "q", q, q.numel() > 0 and max_seqlen_q > 0)
    return _OPS.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q, max_seqlen_k,
                        bool(causal), *masking, sm_scale, grad)[0]


def reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, sm_scale=None, window=None, softcap=None):
    """float64 attention of the packed sequences, scores written out (differentiable): GQA heads repeated, the
    bottom-right aligned causal mask and window, the softcap; a row that sees no key gives 0."""
    scale = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else sm_scale
    left, right = arg_checks.window("attention_varlen", window)
    group = q.shape[1] // k.shape[1]
    outs = []
    for b in range(cu_seqlens_q.shape[0] - 1):
        q0, q1, k0, k1 = (int(x) for x in (cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b],
                                           cu_seqlens_k[b + 1]))
        qb = q[q0:q1].double().transpose(0, 1)
        kb = k[k0:k1].double().repeat_interleave(group, dim=1).transpose(0, 1)
        vb = v[k0:k1].double().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = qb @ kb.transpose(-1, -2) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        diag = torch.arange(q1 - q0, device=q.device)[:, None] + (k1 - k0) - (q1 - q0)
        cols = torch.arange(k1 - k0, device=q.device)[None, :]
        visible = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=q.device)
        if causal:
            visible &= cols <= diag
        if left >= 0:
            visible &= cols >= diag - left
        if right >= 0:
            visible &= cols <= diag + right
        scores = scores.masked_fill(~visible, float("-inf"))
        top = scores.amax(-1, keepdim=True).detach() if k1 > k0 else scores.sum(-1, keepdim=True)
        weights = torch.exp(scores - torch.where(torch.isinf(top), 0.0, top))
        total = weights.sum(-1, keepdim=True)
        outs.append(((weights / torch.where(total > 0, total, 1.0)) @ vb).transpose(0, 1))
    return torch.cat(outs) if outs else q.double()[:0]


class _Operators:
    """``attention_varlen_fwd`` ((out, lse), lse empty unless ``store_lse``; differentiable) and
    ``attention_varlen_bwd`` ((dq, dk, dv)), in ``namespace``."""

    def __init__(self, namespace: str):
        self.forward = Operator(f"{namespace}::attention_varlen_fwd", _fwd_op, fake=_fwd_fake, backward=self._backward,
                                setup_context=_fwd_setup_context, materialize_grads=False)
        self.backward = Operator(f"{namespace}::attention_varlen_bwd", _bwd_op, fake=_grads_like)

    def _backward(self, ctx, grad_out, grad_lse):
        if grad_out is None:  # only the log-sum-exp was used (its gradient is not taken)
            return (None,) * 14
        if not ctx.store_lse:
            raise RuntimeError("attention_varlen_fwd was called with store_lse=False, so it has no backward: "
                               "tilejit.ops.attention_varlen stores the log-sum-exp when an input requires grad")
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = self.backward(grad_out, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
        return (dq, dk, dv) + (None,) * 11


def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
            block_table: torch.Tensor | None, max_q: int, max_k: int, causal: bool, window_left: int,
            window_right: int, softcap: float, sm_scale: float, store_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _check_inputs(q, k, v, cu_q, cu_k, max_q, max_k, block_table)  # (called as torch.ops.tilejit...)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device) if store_lse else \
        q.new_empty(0, dtype=torch.float32)
    out = _forward(q, k, v, cu_q, cu_k, block_table, max_q, max_k, causal, (window_left, window_right), softcap,
                   sm_scale, lse if store_lse else None)
    return out, lse


def _fwd_fake(q, k, v, cu_q, cu_k, block_table, max_q, max_k, causal, window_left, window_right, softcap, sm_scale,
              store_lse):
    lse_shape = (q.shape[1], q.shape[0]) if store_lse else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, _, max_q, max_k, causal, window_left, window_right, softcap, sm_scale, store_lse = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, window_left, window_right, softcap, sm_scale)
    ctx.store_lse = store_lse


def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool,
            window_left: int, window_right: int, softcap: float,
            sm_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, (window_left, window_right), softcap,
                     sm_scale)


_OPS = _Operators(namespace(__name__, "tilejit.ops.varlen_attention"))
