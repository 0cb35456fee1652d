"""Fused attention (FlashAttention-2 style), forward and backward, written in tilejit's language.

Forward (``attn_fwd``): one program computes BM query rows of one (batch, head): it walks the keys and values in
blocks of BN rows (``T.range`` pipelines their loads), keeps the running row maximum ``m_i`` and row sum ``l_i``
of the online softmax in registers, and rescales the output accumulator as the maximum grows. Covered:

- causal and full attention (``CAUSAL``); the causal loop stops at the diagonal block;
- head dims 64, 128 and 256 (``D``, a constexpr);
- grouped-query attention: ``Q`` has ``H`` heads, ``K``/``V`` have ``H // GROUP``; query head ``h`` reads
  key/value head ``h // GROUP``;
- variable sequence lengths by masking (``VARLEN``): batch ``b`` attends over its first ``Lens[b]`` keys; its
  query rows past ``Lens[b]`` (padding) get the attention of those padding queries over the same keys;
- on Hopper, ``default_config`` warp-specializes the key/value loop with a 3-deep ring for head dims 128 and 256,
  where the compiler defers each block's ``p @ v`` to run under the next block's ``q @ k^T``
  (``passes.warp_specialize.deferred_gemm``);
- a sliding window (``WINDOW_LEFT``/``WINDOW_RIGHT`` >= 0: row i sees keys i - left .. i + right): the key loop
  runs from the window's first block to its last only, every block masked; a row that sees no key gives 0 (and
  LSE +inf). A logit softcap (``SOFTCAP`` > 0): the scaled scores become ``c * tanh(s / c)``. Both default off,
  and the kernels without them compile as before;
- ``ONE_LOOP``: every key block in one loop, each deciding at run time whether to mask, instead of an unmasked
  loop and a masked one; the form ``persistent=True`` needs (a second loop's ring would need memory beside the
  kept one), and the causal default on Hopper for short sequences (``ONE_LOOP_SEQ``);
- ``STORE_LSE``: also the rows' log-sum-exp, in base 2 (``log2 sum_j 2^(s_ij * sm_scale * log2 e)``, the
  natural one times log2 e), float32 (B, H, S), which the backward reads.

Backward (``attention_backward``): ``attn_bwd_preprocess`` (Delta = rowsum(dO * O)), ``attn_bwd_dkdv`` (one
program per key block and key/value head, looping over the query heads of its group and their query blocks,
recomputing P^T = exp2(K Q^T * scale * log2 e - LSE)) and ``attn_bwd_dq`` (one program per query block and head,
looping over key blocks; no atomics). Causal and full, windows and softcaps (dS through tanh's derivative), GQA,
ragged and variable lengths (``lens``: the keys of
batch ``b`` end at ``Lens[b]``; every query row, padding included, has a gradient, as it has an output); head
dims 64 and 128 on wgmma on sm_90a, 256 too, but its dK/dV runs on mma.sync there (see ``BWD_CONFIGS``).

``attention(q, k, v, causal=..., lens=...)`` runs the forward as the PyTorch operator ``tilejit::attention_fwd``,
differentiable in q, k and v (its backward the operator ``tilejit::attention_bwd``); ``reference`` is float64 SDPA,
what the tests and examples/attention.py check against.
"""
from __future__ import annotations

import math

import torch

import tilejit
import tilejit.language as T
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, decode_config, encode_config, namespace

LOG2E = 1.4426950408889634


@tilejit.func
def _score_scales(sm_scale, SOFTCAP):
    """(qk_scale, tanh_scale): what the scores are multiplied by to enter exp2 (exp(x) = exp2(x * log2 e)), and,
    with a softcap, by what they enter tanh; the capped scores come out of a step already in base-2 units, so
    their qk_scale is 1."""
    qk_scale = sm_scale * 1.4426950408889634
    tanh_scale = sm_scale
    if SOFTCAP > 0.0:
        tanh_scale = sm_scale / SOFTCAP
        qk_scale = 1.0
    return qk_scale, tanh_scale


@tilejit.func
def _visible(rows, cols, S, CAUSAL, LEFT, RIGHT):
    """Which scores of a query-row x key block count (row-major: rows x cols): keys before ``S``; ``CAUSAL``: keys
    up to the row; ``LEFT``/``RIGHT`` >= 0: keys row - LEFT .. row + RIGHT."""
    valid = cols[None, :] < S
    if CAUSAL:
        valid = valid & (cols[None, :] <= rows[:, None])
    if LEFT >= 0:
        valid = valid & (cols[None, :] >= rows[:, None] - LEFT)
    if RIGHT >= 0:
        valid = valid & (cols[None, :] <= rows[:, None] + RIGHT)
    return valid


@tilejit.func
def _online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D, MASK, CAUSAL, LEFT, RIGHT,
                         SOFTCAP, tanh_scale):
    """One key/value block: scores, the running max and sum rescaled, the output accumulated. ``MASK``: the
    block crosses the end of the keys (or, ``CAUSAL``, the diagonal; or a window edge), so its scores are masked
    first; the blocks before need no mask. The scale goes into the max and the exponent (``s * scale - m``: one
    FMA). ``SOFTCAP`` > 0: the scores are capped first, ``c * tanh(s * sm_scale / c)`` in base-2 units (the
    caller's ``qk_scale`` is then 1). ``LEFT``/``RIGHT`` >= 0: row i sees keys i - LEFT .. i + RIGHT."""
    k = K[b, kv, n0:n0 + BN, 0:D]
    s = T.gemm(q, k, T.zeros((q.shape[0], BN), T.float32), transpose_b=True)
    if SOFTCAP > 0.0:
        s = T.tanh(s * tanh_scale) * (SOFTCAP * 1.4426950408889634)
    if MASK:
        valid = _visible(rows, n0 + T.arange(0, BN), S, CAUSAL, LEFT, RIGHT)
        s = T.where(valid, s, float("-inf"))
    m_new = T.maximum(m_i, T.max(s, 1) * qk_scale)
    m_exp = m_new
    if LEFT >= 0 or RIGHT >= 0:  # a row may have seen no key yet (max -inf): its exponents subtract 0 instead
        m_exp = T.where(m_new == float("-inf"), 0.0, m_new)
    p = T.exp2(s * qk_scale - m_exp[:, None])
    alpha = T.exp2(m_i - m_exp)
    l_i = l_i * alpha + T.sum(p, 1)
    acc = acc * alpha[:, None]
    v = V[b, kv, n0:n0 + BN, 0:D]
    acc += p.to(V.dtype) @ v
    return m_new, l_i, acc


@tilejit.kernel
def attn_fwd(Q, K, V, O, Lse, Lens, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr, BN: T.constexpr,
             D: T.constexpr, CAUSAL: T.constexpr, VARLEN: T.constexpr, STORE_LSE: T.constexpr = False,
             STAGES: T.constexpr = 2, WINDOW_LEFT: T.constexpr = -1, WINDOW_RIGHT: T.constexpr = -1,
             SOFTCAP: T.constexpr = 0.0, ONE_LOOP: T.constexpr = False):
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    m0 = T.program_id(0) * BM
    if CAUSAL:  # the last query blocks attend to the most keys: start them first, so no long block runs alone at the end
        m0 = (T.num_programs(0) - 1 - T.program_id(0)) * BM
    S = Q.shape[2]
    if VARLEN:
        S = Lens[b]
    q = Q[b, h, m0:m0 + BM, 0:D]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    qk_scale, tanh_scale = _score_scales(sm_scale, SOFTCAP)
    rows = m0 + T.arange(0, BM)
    # Blocks wholly before the end of the keys (and, causal, left of the diagonal) run unmasked; the rest (the
    # last partial block; the diagonal blocks) run masked.
    lo = (S // BN) * BN
    if CAUSAL:
        lo = T.minimum(m0, lo) if BM % BN == 0 else 0
    # STAGES: the key/value ring's depth (a deeper ring pays off when a producer warpgroup fills it:
    # warp_specialize=True; the compiler lowers it where shared memory does not hold it). Warp-specialized and 3
    # deep, the compiler issues each block's p @ v under the next block's q @ k^T (FlashAttention-3's overlap).
    first = 0
    if WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0:  # a window: every block masked, none before the window's first
        lo = 0
        if WINDOW_LEFT >= 0:
            lo = (T.maximum(m0 - WINDOW_LEFT, 0) // BN) * BN
        first = lo
    elif not ONE_LOOP:
        for n0 in T.range(0, lo, BN, stages=STAGES):
            m_i, l_i, acc = _online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D,
                                                 False, False, -1, -1, SOFTCAP, tanh_scale)
    hi = S
    if CAUSAL:
        hi = T.minimum(S, m0 + BM)
    if WINDOW_RIGHT >= 0:
        hi = T.minimum(hi, m0 + BM + WINDOW_RIGHT)
    if ONE_LOOP:  # every block in the one ring, each deciding whether to mask (from lo on)
        for n0 in T.range(first, hi, BN, stages=STAGES):
            m_i, l_i, acc = _online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D,
                                                 n0 >= lo, CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, tanh_scale)
    else:
        for n0 in T.range(lo, hi, BN, stages=2):
            m_i, l_i, acc = _online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D, True,
                                                 CAUSAL, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, tanh_scale)
    if WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0:  # a row that sees no key (padding past a length): 0, LSE +inf
        l_i = T.where(l_i > 0.0, l_i, 1.0)
        m_i = T.where(m_i == float("-inf"), float("inf"), m_i)
    O[b, h, m0:m0 + BM, 0:D] = (acc / l_i[:, None]).to(O.dtype)
    if STORE_LSE:
        # base 2: log2 of sum_j 2^(s_ij * sm_scale * log2 e), the natural log-sum-exp times log2 e
        Lse[b, h, m0:m0 + BM] = m_i + T.log2(l_i)



@tilejit.kernel
def attn_bwd_preprocess(O, dO, Delta, H, BM: T.constexpr, D: T.constexpr):
    """Delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] (float32): the row term of the softmax gradient."""
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    m0 = T.program_id(0) * BM
    o = O[b, h, m0:m0 + BM, 0:D].to(T.float32)
    do = dO[b, h, m0:m0 + BM, 0:D].to(T.float32)
    Delta[b, h, m0:m0 + BM] = T.sum(o * do, 1)


@tilejit.func
def _dkdv_step(k, v, Q, dO, Lse, Delta, b, h, m0, cols, L, dk, dv, qk_scale, BM, D, MASK_CAUSAL, MASK_KEYS,
               LEFT, RIGHT, SOFTCAP, tanh_scale):
    """One query block against this program's keys, in key-major orientation (BN x BM), so that P^T and dS^T
    come out of a product in the layout the next product reads as its left operand. ``MASK_KEYS``: keys from
    ``L`` on (past a variable length) take no part (their P^T, hence dS^T, is 0). ``LEFT``/``RIGHT`` >= 0:
    the window (row i sees keys i - LEFT .. i + RIGHT); ``SOFTCAP``: the capped scores, as in the forward, and
    dS^T through tanh's derivative."""
    q = Q[b, h, m0:m0 + BM, 0:D]
    do = dO[b, h, m0:m0 + BM, 0:D]
    lse = Lse[b, h, m0:m0 + BM]
    delta = Delta[b, h, m0:m0 + BM]
    st = T.gemm(k, q, T.zeros((k.shape[0], BM), T.float32), transpose_b=True)
    if SOFTCAP > 0.0:
        tt = T.tanh(st * tanh_scale)
        st = tt * (SOFTCAP * 1.4426950408889634)
    pt = T.exp2(st * qk_scale - lse[None, :])
    if MASK_CAUSAL:
        rows = m0 + T.arange(0, BM)
        pt = T.where(cols[:, None] <= rows[None, :], pt, 0.0)
    if LEFT >= 0:
        pt = T.where(cols[:, None] >= (m0 + T.arange(0, BM))[None, :] - LEFT, pt, 0.0)
    if RIGHT >= 0:
        pt = T.where(cols[:, None] <= (m0 + T.arange(0, BM))[None, :] + RIGHT, pt, 0.0)
    if MASK_KEYS:
        pt = T.where(cols[:, None] < L, pt, 0.0)
    dv = T.gemm(pt.to(dO.dtype), do, dv)
    dpt = T.gemm(v, do, T.zeros((k.shape[0], BM), T.float32), transpose_b=True)
    dst = pt * (dpt - delta[None, :])
    if SOFTCAP > 0.0:
        dst = dst * (1.0 - tt * tt)
    dk = T.gemm(dst.to(Q.dtype), q, dk)
    return dk, dv


@tilejit.kernel
def attn_bwd_dkdv(Q, K, V, dO, Lse, Delta, dK, dV, Lens, sm_scale, HKV, GROUP: T.constexpr, BM: T.constexpr,
                  BN: T.constexpr, D: T.constexpr, CAUSAL: T.constexpr, VARLEN: T.constexpr = False,
                  WINDOW_LEFT: T.constexpr = -1, WINDOW_RIGHT: T.constexpr = -1, SOFTCAP: T.constexpr = 0.0):
    """dK and dV of BN keys of one (batch, key/value head): loops over the GROUP query heads that read this
    head and over their query blocks, recomputing P^T from Lse. Causal: the loop starts at the first query
    block that reaches these keys; only the BN // BM blocks that straddle the diagonal are masked.

    Query rows past the sequence read as zeros (q, dO, Lse and Delta), which makes their terms exactly 0;
    key rows past it are not stored. So only the causal blocks need a mask. ``VARLEN``: batch ``b``'s keys from
    ``Lens[b]`` on take no part (masked; a program whose keys all lie past it runs no block and stores zeros),
    while every query row, padding included, does (as in the forward). A window (``WINDOW_LEFT``/``WINDOW_RIGHT``
    >= 0): the loop runs over the query blocks whose rows see these keys only, every one masked."""
    assert BN % BM == 0, "attn_bwd_dkdv needs BN to be a multiple of BM (the diagonal spans whole query blocks)"
    pid_bh = T.program_id(1)
    b = pid_bh // HKV
    kv = pid_bh % HKV
    n0 = T.program_id(0) * BN
    S = Q.shape[2]
    L = S
    if VARLEN:
        L = Lens[b]
        S = T.minimum(S, T.maximum(L - n0, 0) * S)  # 0 when these keys all lie past the length: no block runs
    k = K[b, kv, n0:n0 + BN, 0:D]
    v = V[b, kv, n0:n0 + BN, 0:D]
    cols = n0 + T.arange(0, BN)
    qk_scale, tanh_scale = _score_scales(sm_scale, SOFTCAP)
    dk = T.zeros((BN, D), T.float32)
    dv = T.zeros((BN, D), T.float32)
    for g in range(GROUP):
        h = kv * GROUP + g
        lo = 0
        if WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0:  # rows n0 - RIGHT .. n0 + BN - 1 + LEFT see these keys
            if CAUSAL:
                lo = n0
            if WINDOW_RIGHT >= 0:
                lo = (T.maximum(n0 - WINDOW_RIGHT, 0) // BM) * BM
            hi = S
            if WINDOW_LEFT >= 0:
                hi = T.minimum(S, n0 + BN + WINDOW_LEFT)
            for m0 in T.range(lo, hi, BM, stages=2):
                dk, dv = _dkdv_step(k, v, Q, dO, Lse, Delta, b, h, m0, cols, L, dk, dv, qk_scale, BM, D, CAUSAL,
                                    VARLEN, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, tanh_scale)
        else:
            if CAUSAL:
                # query blocks [n0, n0 + BN) straddle the diagonal; earlier ones see none of these keys
                lo = T.minimum(n0 + BN, S)
                for m0 in T.range(n0, lo, BM, stages=2):
                    dk, dv = _dkdv_step(k, v, Q, dO, Lse, Delta, b, h, m0, cols, L, dk, dv, qk_scale, BM, D, True,
                                        VARLEN, -1, -1, SOFTCAP, tanh_scale)
            for m0 in T.range(lo, S, BM, stages=2):
                dk, dv = _dkdv_step(k, v, Q, dO, Lse, Delta, b, h, m0, cols, L, dk, dv, qk_scale, BM, D, False,
                                    VARLEN, -1, -1, SOFTCAP, tanh_scale)
    dK[b, kv, n0:n0 + BN, 0:D] = (dk * sm_scale).to(dK.dtype)
    dV[b, kv, n0:n0 + BN, 0:D] = dv.to(dV.dtype)


@tilejit.func
def _dq_step(q, do, lse, delta, K, V, b, kv, n0, S, rows, dq, qk_scale, BN, D, MASK, CAUSAL, LEFT, RIGHT,
             SOFTCAP, tanh_scale):
    """One key block against this program's queries: dS = P * (dO V^T - Delta), dQ += dS K (``SOFTCAP``: dS
    through tanh's derivative; ``LEFT``/``RIGHT``: the window, as in the forward)."""
    k = K[b, kv, n0:n0 + BN, 0:D]
    v = V[b, kv, n0:n0 + BN, 0:D]
    s = T.gemm(q, k, T.zeros((q.shape[0], BN), T.float32), transpose_b=True)
    if SOFTCAP > 0.0:
        t = T.tanh(s * tanh_scale)
        s = t * (SOFTCAP * 1.4426950408889634)
    p = T.exp2(s * qk_scale - lse[:, None])
    if MASK:
        # keys past the sequence read as zeros, but exp2(0 - lse) times 0 - Delta is not a zero term: mask them
        valid = _visible(rows, n0 + T.arange(0, BN), S, CAUSAL, LEFT, RIGHT)
        p = T.where(valid, p, 0.0)
    dp = T.gemm(do, v, T.zeros((q.shape[0], BN), T.float32), transpose_b=True)
    ds = p * (dp - delta[:, None])
    if SOFTCAP > 0.0:
        ds = ds * (1.0 - t * t)
    return T.gemm(ds.to(K.dtype), k, dq)


@tilejit.kernel
def attn_bwd_dq(Q, K, V, dO, Lse, Delta, dQ, Lens, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr,
                BN: T.constexpr, D: T.constexpr, CAUSAL: T.constexpr, VARLEN: T.constexpr = False,
                WINDOW_LEFT: T.constexpr = -1, WINDOW_RIGHT: T.constexpr = -1, SOFTCAP: T.constexpr = 0.0):
    """dQ of BM query rows of one (batch, head), looping over key blocks (no atomics: one program owns its
    rows). Unmasked blocks first (whole blocks left of the diagonal, or inside the sequence), then the masked
    ones (the diagonal blocks, or the ragged last block). ``VARLEN``: the keys end at ``Lens[b]``, as in the
    forward. A window: the key blocks it reaches only, every one masked."""
    assert BM % BN == 0, "attn_bwd_dq needs BM to be a multiple of BN (the diagonal spans whole key blocks)"
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    m0 = T.program_id(0) * BM
    S = Q.shape[2]  # the keys this program's rows attend to: all, or (VARLEN) batch b's first Lens[b]
    if VARLEN:
        S = Lens[b]
    q = Q[b, h, m0:m0 + BM, 0:D]
    do = dO[b, h, m0:m0 + BM, 0:D]
    lse = Lse[b, h, m0:m0 + BM]
    delta = Delta[b, h, m0:m0 + BM]
    rows = m0 + T.arange(0, BM)
    qk_scale, tanh_scale = _score_scales(sm_scale, SOFTCAP)
    dq = T.zeros((BM, D), T.float32)
    hi = S
    if CAUSAL:
        hi = T.minimum(S, m0 + BM)
    mid = (S // BN) * BN
    if CAUSAL:
        mid = T.minimum(m0, mid)
    if WINDOW_LEFT >= 0 or WINDOW_RIGHT >= 0:
        mid = 0
        if WINDOW_LEFT >= 0:
            mid = (T.maximum(m0 - WINDOW_LEFT, 0) // BN) * BN
        if WINDOW_RIGHT >= 0:
            hi = T.minimum(hi, m0 + BM + WINDOW_RIGHT)
    else:
        for n0 in T.range(0, mid, BN, stages=2):
            dq = _dq_step(q, do, lse, delta, K, V, b, kv, n0, S, rows, dq, qk_scale, BN, D, False, CAUSAL, -1, -1,
                          SOFTCAP, tanh_scale)
    for n0 in T.range(mid, hi, BN, stages=2):
        dq = _dq_step(q, do, lse, delta, K, V, b, kv, n0, S, rows, dq, qk_scale, BN, D, True, CAUSAL, WINDOW_LEFT,
                      WINDOW_RIGHT, SOFTCAP, tanh_scale)
    dQ[b, h, m0:m0 + BM, 0:D] = (dq * sm_scale).to(dQ.dtype)

# The config space the tests compile and run: (BM, BN, num_warps) per head dim.
CONFIGS = {
    64: [(128, 64, 8), (64, 64, 4), (128, 128, 8), (64, 128, 4)],
    128: [(128, 64, 8), (64, 64, 4), (128, 128, 8), (64, 128, 4)],
    256: [(64, 32, 4), (64, 64, 4)],
}


def default_config(head_dim: int, causal: bool = False, hopper: bool = False) -> dict:
    """Tiles that fit the shared memory of every supported GPU for this head dim; on Hopper (``hopper``: sm_90),
    the fastest config measured on an H100 (bf16, S = 4096; benchmarks/RESULTS.md), the key/value loop
    warp-specialized where that paid."""
    if hopper:  # warp-specialized, p @ v then runs under the next block's q @ k^T (3-deep ring: 2 slots held)
        if head_dim <= 64:
            return dict(BM=64, BN=64 if causal else 128, num_warps=4)
        if head_dim <= 128:
            return dict(BM=128, BN=128, num_warps=8, warp_specialize=True, STAGES=3)
        return dict(BM=64, BN=64, num_warps=4, warp_specialize=True, STAGES=3)
    if head_dim <= 128:
        return dict(BM=128, BN=64, num_warps=8)
    return dict(BM=64, BN=32, num_warps=4)


#: The longest sequence up to which ``attention()``'s causal forward on Hopper at head dim 128 runs as one key loop
#: (``attn_fwd``'s ``ONE_LOOP``, warp-specialized, not persistent): its diagonal block comes through the producer's
#: ring instead of a second loop's. H200, bf16, 128x128 w8, 3 stages, 16 heads, 16k tokens (TFLOP/s, against the
#: two loops): S = 1024 318.8 against 299.8, 2048 428.3 against 421.4, 4096 505.3 against 509.2
#: (``scripts/probes/attention_walk.py --isolate``). Persistent, the same loop ran slower at every length (S = 1024:
#: 268.3 walking the grid in order, 302.1 in a snake; non-causal 448.1 against 471.7): each program still stages
#: its Q and stores its O itself (no room for a TMA store's buffer beside the ring) while the tensor cores wait.
ONE_LOOP_SEQ = 2048


# The backward kernels' config space, per head dim: (BM, BN, num_warps) of attn_bwd_dkdv (BM query rows per step
# against BN keys; BN % BM == 0) and of attn_bwd_dq (BM query rows against BN keys per step; BM % BN == 0).
# The first of each is the default. On sm_90a the products run on wgmma (P^T, dS^T and dS from registers) when
# the program's rows split into 64-row slabs per warpgroup and BM, BN are multiples of 64; head dim 256's dK/dV
# (two 64 x 256 float32 accumulators, 256 registers per thread in one warpgroup) only fits spread over 8 warps,
# which runs on mma.sync.
BWD_CONFIGS = {
    64: {"dkdv": [(64, 128, 8), (64, 64, 4), (128, 128, 8)], "dq": [(128, 64, 8), (64, 64, 4), (128, 128, 8)]},
    128: {"dkdv": [(64, 128, 8), (64, 64, 4)], "dq": [(128, 64, 8), (64, 64, 4), (128, 128, 8)]},
    256: {"dkdv": [(64, 64, 8)], "dq": [(64, 64, 4), (64, 64, 8)]},
}


# The backward's defaults on sm_80/86/89 (mma.sync), head dims 64 and 128: measured through the sm_80 path on an
# H200 (scripts/probes/attention_sm80.py, bf16, S = 4096, 2026-11-26; attention_sm80_bwd_h200.log): D=64 218.8 TFLOP/s
# against 174.8 for BWD_CONFIGS' first (which spill 40 and 16 bytes on sm_80; these none); D=128 232.8 against
# 217.7, the dQ config without spills (140 bytes before), dK/dV's 64x64 w4 with 32 bytes (every config without
# spills there holds 32 keys a program and ran at 101-138).
SM80_BWD_CONFIGS = {64: {"dkdv": (32, 128, 4), "dq": (64, 64, 4)}, 128: {"dkdv": (64, 64, 4), "dq": (128, 128, 8)}}


def default_bwd_config(head_dim: int, hopper: bool = False, sm80: bool = False) -> dict:
    """{"dkdv": {...}, "dq": {...}}: the first config of BWD_CONFIGS for the smallest listed head dim >= this; on
    Hopper (sm_90) at head dims 64 and 128, the fastest measured on an H100 (bf16, S = 4096; benchmarks/RESULTS.md);
    on sm_80/86/89 (``sm80``) there, ``SM80_BWD_CONFIGS``."""
    dim = next(d for d in sorted(BWD_CONFIGS) if head_dim <= d)
    if hopper and dim in (64, 128):
        return {"dkdv": dict(BM=64, BN=64, num_warps=4), "dq": dict(BM=64, BN=64, num_warps=4)}
    if sm80 and dim in SM80_BWD_CONFIGS:
        return {name: dict(BM=bm, BN=bn, num_warps=w) for name, (bm, bn, w) in SM80_BWD_CONFIGS[dim].items()}
    return {name: dict(BM=bm, BN=bn, num_warps=w) for name, ((bm, bn, w), *_) in BWD_CONFIGS[dim].items()}


def _hopper(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] == 9


def _sm80(t: torch.Tensor) -> bool:
    """Whether ``t`` is on an sm_80/86/89 GPU, where the products run on mma.sync."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device)[0] == 8


def _check_lens(lens, batch, device=None, op: str = "attention"):
    arg_checks.optional_tensors(op, lens=lens)
    if lens is not None and (lens.dtype != torch.int32 or lens.shape != (batch,)):
        raise arg_checks.ArgumentValueError(f"{op}: lens must be an int32 tensor of shape ({batch},), got "
                                            f"{lens.dtype} {tuple(lens.shape)}")
    if lens is not None and device is not None and lens.device != device:
        raise arg_checks.ArgumentValueError(f"{op}: lens is on {lens.device} but q is on {device}")


def _lens(lens, batch, device):
    """The ``Lens`` argument: ``lens`` (int32, one per batch entry, each in 1..S), or a placeholder."""
    _check_lens(lens, batch, device)
    return torch.zeros(1, dtype=torch.int32, device=device) if lens is None else lens


def _masking(causal: bool, window, softcap, op: str = "attention") -> dict:
    """The kernels' masking constexprs: ``CAUSAL``, and ``WINDOW_LEFT``, ``WINDOW_RIGHT``, ``SOFTCAP`` where set
    (so the kernels without them compile as before). Key j is visible to query i when i - left <= j <= i + right;
    causal is a right bound of 0, and a right bound of 0 runs as causal."""
    left, right = arg_checks.window(op, window)
    softcap = arg_checks.softcap(op, softcap)
    masking = {"CAUSAL": bool(causal) or right == 0}
    if left >= 0:
        masking["WINDOW_LEFT"] = left
    if right > 0 and not causal:
        masking["WINDOW_RIGHT"] = right
    if softcap:
        masking["SOFTCAP"] = float(softcap)
    # The kernels split the unmasked key blocks from the masked ones by hand; the compiler's peeling
    # (passes/peel_masks.py) is left to the windowed loops, where every block is masked as written.
    masking["peel_masks"] = left >= 0 or "WINDOW_RIGHT" in masking
    return masking


def _forward(q, k, v, causal, sm_scale, lens, out, lse, config, window=None, softcap=None):
    group = arg_checks.attention_operands("attention", q, k, v)
    batch, heads, seq, dim = q.shape
    if out is not None:
        arg_checks.like("attention", "out", out, q.shape, (q.dtype,), q.device, "like q")
    if lse is not None:
        arg_checks.like("attention", "lse", lse, (batch, heads, seq), (torch.float32,), q.device)
    masking = _masking(causal, window, softcap)
    causal = masking.pop("CAUSAL")
    # no config given: the measured-best one for this GPU (16-bit inputs: float32's tiles need the portable
    # config's shared memory); else the given keys over the portable default
    hopper = not config and _hopper(q) and q.element_size() == 2
    config = {**default_config(dim, causal, hopper), **config}
    out = torch.empty_like(q) if out is None else out
    if q.numel() == 0:  # no batch, head or row: nothing to attend (lse, (B, H, S), is empty too)
        return out
    lens_arg = _lens(lens, batch, q.device)
    grid = (tilejit.cdiv(seq, config["BM"]), batch * heads)
    # one key loop: asked for (persistent: its ring stays across the programs an SM walks), or by default where
    # the causal diagonal's block, fed by the producer like the others, beats a second loop's cold ring
    if config.get("persistent") or hopper and causal and seq <= ONE_LOOP_SEQ and 64 < dim <= 128 \
            and set(masking) == {"peel_masks"}:
        masking.update(ONE_LOOP=True, peel_masks=False)
    attn_fwd[grid](q, k, v, out, lse if lse is not None else lens_arg, lens_arg, sm_scale, heads, GROUP=group,
                   D=dim, CAUSAL=causal, VARLEN=lens is not None, STORE_LSE=lse is not None, **{**masking, **config})
    return out


def attention_backward(do, q, k, v, out, lse, *, causal: bool = False, sm_scale: float | None = None,
                       lens: torch.Tensor | None = None, dq=None, dk=None, dv=None, delta=None,
                       config: dict | None = None, window: tuple[int, int] | None = None,
                       softcap: float | None = None):
    """(dq, dk, dv) of attention given the upstream gradient ``do``, the forward's ``out`` and its base-2
    log-sum-exp ``lse`` (float32 (B, H, S), from ``attention_forward``, with the same ``lens``, ``window`` and
    ``softcap``). Outputs may be preallocated; ``delta`` (float32 (B, H, S)) is scratch. ``config`` overrides
    ``default_bwd_config``: {"dkdv": {...}, "dq": {...}}. With ``lens``, keys past a batch's length get zero
    gradients."""
    op = "attention_backward"
    group = arg_checks.attention_operands(op, q, k, v)
    batch, heads, seq, dim = q.shape
    rows = (batch, heads, seq)
    for name, t, like, shape, dtype in (("do", do, "q", q.shape, q.dtype), ("out", out, "q", q.shape, q.dtype),
                                        ("lse", lse, "", rows, torch.float32), ("dq", dq, "q", q.shape, q.dtype),
                                        ("dk", dk, "k", k.shape, k.dtype), ("dv", dv, "v", v.shape, v.dtype),
                                        ("delta", delta, "", rows, torch.float32)):
        if t is not None or name in ("do", "out", "lse"):
            arg_checks.like(op, name, t, shape, (dtype,), q.device, f"like {like}" if like else "")
    masking = _masking(causal, window, softcap, op)
    causal = masking.pop("CAUSAL")
    sm_scale = arg_checks.sm_scale(op, sm_scale, dim)
    cfg = default_bwd_config(dim, hopper=_hopper(q), sm80=_sm80(q))
    for name, over in _check_bwd_config(config, op, "config").items():
        encode_config(over, f"{op}: config[{name!r}]")
        cfg[name] = {**cfg[name], **over}
    arg_checks.runs_on(op, "q", q)
    do = do.contiguous()
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    if q.numel() == 0:  # no query (no batch, head or row): no gradient flows to any key
        return dq, dk.zero_(), dv.zero_()
    if delta is None:
        delta = torch.empty(batch, heads, seq, dtype=torch.float32, device=q.device)
    rows = max(16, 4096 // dim)  # 32 float32 values per thread and tile at 4 warps
    attn_bwd_preprocess[(tilejit.cdiv(seq, rows), batch * heads)](out, do, delta, heads, BM=rows, D=dim,
                                                                    num_warps=4)
    kv_heads = k.shape[1]
    lens_arg = _lens(lens, batch, q.device)
    varlen = lens is not None
    c = cfg["dkdv"]
    attn_bwd_dkdv[(tilejit.cdiv(seq, c["BN"]), batch * kv_heads)](
        q, k, v, do, lse, delta, dk, dv, lens_arg, sm_scale, kv_heads, GROUP=group, D=dim, CAUSAL=causal,
        VARLEN=varlen, **{**masking, **c})
    c = cfg["dq"]
    attn_bwd_dq[(tilejit.cdiv(seq, c["BM"]), batch * heads)](
        q, k, v, do, lse, delta, dq, lens_arg, sm_scale, heads, GROUP=group, D=dim, CAUSAL=causal, VARLEN=varlen,
        **{**masking, **c})
    return dq, dk, dv


def attention_forward(q, k, v, *, causal: bool = False, sm_scale: float | None = None, lens=None, out=None,
                      lse=None, window: tuple[int, int] | None = None, softcap: float | None = None, **config):
    """(out, lse): the forward that also writes the base-2 log-sum-exp (float32 (B, H, S)) the backward reads
    (+inf for a row that sees no key, whose output is 0: with a window, padding rows past a length)."""
    arg_checks.attention_operands("attention_forward", q, k, v)
    batch, heads, seq, dim = q.shape
    sm_scale = arg_checks.sm_scale("attention_forward", sm_scale, dim)
    encode_config(config, "attention_forward")  # the keys and values attention() takes (a 0 tile divided by zero)
    arg_checks.runs_on("attention_forward", "q", q)
    if lse is None:
        lse = torch.empty(batch, heads, seq, dtype=torch.float32, device=q.device)
    return _forward(q, k, v, causal, sm_scale, lens, out, lse, config, window, softcap), lse


def _check_bwd_config(bwd_config, op: str = "attention", name: str = "bwd_config"):
    if bwd_config is not None and (not isinstance(bwd_config, dict) or set(bwd_config) - {"dkdv", "dq"}):
        got = sorted(bwd_config) if isinstance(bwd_config, dict) else repr(bwd_config)
        raise arg_checks.ArgumentValueError(f"{op}: {name}'s keys are 'dkdv' and 'dq' (each a config dict), got {got}")
    return bwd_config or {}


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              sm_scale: float | None = None, lens: torch.Tensor | None = None, out: torch.Tensor | None = None,
              bwd_config: dict | None = None, window: tuple[int, int] | None = None, softcap: float | None = None,
              **config) -> torch.Tensor:
    """softmax(q @ k^T * sm_scale [causal mask]) @ v for q (B, H, S, D) and k, v (B, H // G, S, D).

    The PyTorch operator ``tilejit::attention_fwd`` (works under ``torch.compile(fullgraph=True)``), differentiable
    in q, k and v: when one of them requires grad the forward also stores the log-sum-exp and the backward runs
    ``attention_backward`` (operator ``tilejit::attention_bwd``; ``bwd_config`` overrides its tiles: {"dkdv":
    {...}, "dq": {...}}). ``config`` (BM, BN, STAGES, launch options) overrides ``default_config``. ``out``
    (preallocated, written in place) is for inference: not with inputs that require grad. Head dims 64, 128 and
    256 have configs (``BWD_CONFIGS``); other dims up to 256 take the next one's. Variable lengths (``lens``,
    int32 (B,)): batch ``b`` attends over its first ``lens[b]`` keys, every query row included (rows past
    ``lens[b]`` are padding whose output the caller ignores); differentiable too. ``window=(left, right)``
    (flash_attn's convention): key j is visible to query i when i - left <= j <= i + right, -1 unbounded; causal
    means right = 0; the kernels skip key blocks outside it. A row that sees no key (with a window, a padding row
    past ``lens[b]``) gets 0. ``softcap=c``: the scaled scores become c * tanh(s / c) before the softmax.

    q, k and v share one dtype, float16, bfloat16 or float32 (tf32 products), and one device; k and v have q's
    batch, sequence length S and head dim D (1 to 256): each query attends over the S keys of its batch entry
    (queries and keys of other lengths: ``attention_varlen``), so there are no keys exactly when there are no
    queries. An empty q (B, H or S of 0) gives an empty output without a launch, as SDPA does. ``lens[b]`` lies
    in 1..S (not checked: reading it would synchronize). ``out`` has q's shape, dtype and device.
    """
    arg_checks.attention_operands("attention", q, k, v)
    dim = q.shape[3]
    sm_scale = arg_checks.sm_scale("attention", sm_scale, dim)
    _check_lens(lens, q.shape[0], q.device)
    _masking(causal, window, softcap)
    if out is not None:
        arg_checks.like("attention", "out", out, q.shape, (q.dtype,), q.device, "like q")
    left, right = arg_checks.window("attention", window)
    masking = (left, right, float(softcap or 0.0))
    fwd = encode_config(config, "attention")
    bwd = _check_bwd_config(bwd_config)
    arg_checks.runs_on("attention", "q", q)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if dim > max(BWD_CONFIGS):
            raise arg_checks.ArgumentValueError(f"attention: no backward for head dim {dim} (at most "
                                                f"{max(BWD_CONFIGS)})")
        if out is not None:
            raise arg_checks.ArgumentValueError("attention: out= is written in place, which autograd cannot record; "
                                                "leave it out when q, k or v require grad (or run under "
                                                "torch.no_grad())")
        return _OPS.forward(q, k, v, lens, causal, *masking, sm_scale, fwd, True,
                            encode_config(bwd.get("dkdv", {}), "attention bwd_config['dkdv']"),
                            encode_config(bwd.get("dq", {}), "attention bwd_config['dq']"))[0]
    if out is None:
        return _OPS.forward(q, k, v, lens, causal, *masking, sm_scale, fwd, False, [], [])[0]
    _OPS.forward_into(q, k, v, lens, out, causal, *masking, sm_scale, fwd)
    return out


def reference(q, k, v, causal, sm_scale=None, lens=None, window=None, softcap=None):
    """float64 attention with the key/value heads repeated for GQA: SDPA, or (``window``, ``softcap``) the scores
    written out. With ``lens``, batch ``b``'s rows (padding rows too) attend over its first ``lens[b]`` keys
    (causal: key j <= row i, SDPA's top-left aligned mask), as the kernels define them; a row that sees no key
    gives 0. Differentiable like SDPA."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    q64 = q.double()
    if window is not None or softcap:
        return _reference_masked(q64, k64, v64, causal, sm_scale, lens, window, softcap)
    if lens is None:
        return torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=sm_scale)
    return torch.cat([torch.nn.functional.scaled_dot_product_attention(
        q64[b:b + 1], k64[b:b + 1, :, :n], v64[b:b + 1, :, :n], is_causal=causal, scale=sm_scale)
        for b, n in enumerate(lens.tolist())])


def _reference_masked(q, k, v, causal, sm_scale, lens, window, softcap):
    """softmax over the visible keys of c * tanh(q k^T * sm_scale / c) (or the plain scaled scores), in float64;
    rows with no visible key give 0."""
    seq = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[3]) if sm_scale is None else sm_scale
    scores = q @ k.transpose(-1, -2) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(seq, device=q.device)[:, None]
    cols = torch.arange(seq, device=q.device)[None, :]
    left, right = arg_checks.window("attention", window)
    visible = torch.ones(seq, seq, dtype=torch.bool, device=q.device)
    if causal:
        visible &= cols <= rows
    if left >= 0:
        visible &= cols >= rows - left
    if right >= 0:
        visible &= cols <= rows + right
    visible = visible.expand(q.shape[0], 1, seq, seq)
    if lens is not None:
        visible = visible & (cols < lens.to(q.device).long()[:, None, None, None])
    scores = scores.masked_fill(~visible, float("-inf"))
    top = scores.amax(-1, keepdim=True).detach()
    weights = torch.exp(scores - torch.where(torch.isinf(top), 0.0, top))
    total = weights.sum(-1, keepdim=True)
    return (weights / torch.where(total > 0, total, 1.0)) @ v


def _grads_like(do, q, k, v, *_):
    """The fake (torch.compile's shape-only) kernel of a backward operator: dq, dk, dv shaped as q, k, v."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _Operators:
    """The PyTorch operators of this module, in ``namespace``: ``attention_fwd`` (functional: (out, lse), lse
    empty unless ``store_lse``; differentiable), ``attention_fwd_out`` (writes ``out`` in place) and
    ``attention_bwd`` ((dq, dk, dv))."""

    def __init__(self, namespace: str):
        self.forward = Operator(f"{namespace}::attention_fwd", _fwd_op, fake=_fwd_fake, backward=self._backward,
                                setup_context=_fwd_setup_context, materialize_grads=False)
        self.forward_into = Operator(f"{namespace}::attention_fwd_out", _fwd_out_op, mutates_args=("out",))
        self.backward = Operator(f"{namespace}::attention_bwd", _bwd_op, fake=_grads_like)

    def _backward(self, ctx, grad_out, grad_lse):
        if grad_out is None:  # only the log-sum-exp was used (its gradient is not taken)
            return (None,) * 13
        if not ctx.store_lse:
            raise RuntimeError("attention_fwd was called with store_lse=False, so it has no backward: "
                               "tilejit.ops.attention stores the log-sum-exp when an input requires grad")
        q, k, v, out, lse, lens = ctx.saved_tensors
        dq, dk, dv = self.backward(grad_out, q, k, v, out, lse, lens, ctx.causal, *ctx.masking, ctx.sm_scale,
                                   ctx.dkdv, ctx.dq)
        return (dq, dk, dv) + (None,) * 10


def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor | None, causal: bool,
            window_left: int, window_right: int, softcap: float, sm_scale: float, config: list[int],
            store_lse: bool, dkdv_config: list[int], dq_config: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, seq, _ = q.shape
    lse = torch.empty(batch, heads, seq, dtype=torch.float32, device=q.device) if store_lse else \
        q.new_empty(0, dtype=torch.float32)
    out = _forward(q, k, v, causal, sm_scale, lens, None, lse if store_lse else None, decode_config(config),
                   (window_left, window_right), softcap)
    return out, lse


def _fwd_fake(q, k, v, lens, causal, window_left, window_right, softcap, sm_scale, config, store_lse, dkdv_config,
              dq_config):
    lse_shape = q.shape[:3] if store_lse else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, lens, causal, window_left, window_right, softcap, sm_scale, _, store_lse, dkdv, dq = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, lens)
    ctx.causal, ctx.masking, ctx.sm_scale = causal, (window_left, window_right, softcap), sm_scale
    ctx.store_lse, ctx.dkdv, ctx.dq = store_lse, dkdv, dq


def _fwd_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor | None, out: torch.Tensor,
                causal: bool, window_left: int, window_right: int, softcap: float, sm_scale: float,
                config: list[int]) -> None:
    _forward(q, k, v, causal, sm_scale, lens, out, None, decode_config(config), (window_left, window_right), softcap)


def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, lens: torch.Tensor | None, causal: bool, window_left: int, window_right: int,
            softcap: float, sm_scale: float, dkdv_config: list[int],
            dq_config: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return attention_backward(do, q, k, v, out, lse, causal=causal, sm_scale=sm_scale, lens=lens,
                              config={"dkdv": decode_config(dkdv_config), "dq": decode_config(dq_config)},
                              window=(window_left, window_right), softcap=softcap)


_OPS = _Operators(namespace(__name__, "tilejit.ops.fused_attention"))

