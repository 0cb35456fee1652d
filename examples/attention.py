"""Fused attention forward (FlashAttention-2 style) written in tilejit's language.

One program computes BM query rows of one (batch, head): it walks the keys and values in blocks of BN rows
(``T.range`` pipelines their loads), keeps the running row maximum ``m_i`` and row sum ``l_i`` of the online
softmax in registers, and rescales the output accumulator as the maximum grows. Covered:

- causal and full attention (``CAUSAL``); the causal loop stops at the diagonal block;
- head dims 64, 128 and 256 (``D``, a constexpr);
- grouped-query attention: ``Q`` has ``H`` heads, ``K``/``V`` have ``H // GROUP``; query head ``h`` reads
  key/value head ``h // GROUP``;
- variable sequence lengths by masking (``VARLEN``): batch ``b`` attends over its first ``Lens[b]`` keys; its
  query rows past ``Lens[b]`` (padding) get the attention of those padding queries over the same keys.

``attention(q, k, v, causal=..., lens=...)`` launches it; run this file to check it against
``torch.nn.functional.scaled_dot_product_attention`` (on a GPU if there is one, else through the interpreter on
small shapes).
"""
from __future__ import annotations

import math
import os

import torch

import tilejit
import tilejit.language as T

LOG2E = 1.4426950408889634


@tilejit.func
def _online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D, MASK_DIAGONAL):
    """One key/value block: scores, the running max and sum rescaled, the output accumulated."""
    k = K[b, kv, n0:n0 + BN, 0:D]
    s = T.gemm(q, k, T.zeros((q.shape[0], BN), T.float32), transpose_b=True)
    cols = n0 + T.arange(0, BN)
    valid = cols[None, :] < S
    if MASK_DIAGONAL:
        valid = valid & (cols[None, :] <= rows[:, None])
    s = T.where(valid, s * qk_scale, float("-inf"))
    m_new = T.maximum(m_i, T.max(s, 1))
    p = T.exp2(s - m_new[:, None])
    alpha = T.exp2(m_i - m_new)
    l_i = l_i * alpha + T.sum(p, 1)
    acc = acc * alpha[:, None]
    v = V[b, kv, n0:n0 + BN, 0:D]
    acc += p.to(V.dtype) @ v
    return m_new, l_i, acc


@tilejit.kernel
def attn_fwd(Q, K, V, O, Lens, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr, BN: T.constexpr,
             D: T.constexpr, CAUSAL: T.constexpr, VARLEN: T.constexpr):
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    m0 = T.program_id(0) * BM
    S = Q.shape[2]
    if VARLEN:
        S = T.max(Lens[b:b + 1], 0)
    q = Q[b, h, m0:m0 + BM, 0:D]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    qk_scale = sm_scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    rows = m0 + T.arange(0, BM)
    lo = 0
    if CAUSAL and BM % BN == 0:
        # Blocks left of the diagonal need no causal mask: run them unmasked, then the diagonal blocks masked.
        lo = T.minimum(m0, S)
        for n0 in T.range(0, lo, BN, stages=2):
            m_i, l_i, acc = _online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D,
                                                 False)
    hi = S
    if CAUSAL:
        hi = T.minimum(S, m0 + BM)
    for n0 in T.range(lo, hi, BN, stages=2):
        m_i, l_i, acc = _online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D, CAUSAL)
    O[b, h, m0:m0 + BM, 0:D] = (acc / l_i[:, None]).to(O.dtype)


# The config space the tests compile and run: (BM, BN, num_warps) per head dim.
CONFIGS = {
    64: [(128, 64, 8), (64, 64, 4), (128, 128, 8), (64, 128, 4)],
    128: [(128, 64, 8), (64, 64, 4), (128, 128, 8), (64, 128, 4)],
    256: [(64, 32, 4), (64, 64, 4)],
}


def default_config(head_dim: int) -> dict:
    """Tiles that fit the shared memory of every supported GPU for this head dim."""
    if head_dim <= 64:
        return dict(BM=128, BN=64, num_warps=8)
    if head_dim <= 128:
        return dict(BM=128, BN=64, num_warps=8)
    return dict(BM=64, BN=32, num_warps=4)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              sm_scale: float | None = None, lens: torch.Tensor | None = None, out: torch.Tensor | None = None,
              **config) -> torch.Tensor:
    """softmax(q @ k^T * sm_scale [causal mask]) @ v for q (B, H, S, D) and k, v (B, H // G, S, D)."""
    batch, heads, seq, dim = q.shape
    if k.shape[1] == 0 or heads % k.shape[1]:
        raise ValueError(f"query heads {heads} must be a multiple of key/value heads {k.shape[1]}")
    config = {**default_config(dim), **config}
    out = torch.empty_like(q) if out is None else out
    sm_scale = 1.0 / math.sqrt(dim) if sm_scale is None else sm_scale
    lens_arg = lens if lens is not None else torch.zeros(1, dtype=torch.int32, device=q.device)
    grid = (tilejit.cdiv(seq, config["BM"]), batch * heads)
    attn_fwd[grid](q, k, v, out, lens_arg, sm_scale, heads, GROUP=heads // k.shape[1], D=dim,
                   CAUSAL=causal, VARLEN=lens is not None, **config)
    return out


def reference(q, k, v, causal, sm_scale=None, lens=None):
    """float64 SDPA with the key/value heads repeated for GQA (rows past a varlen length are not compared)."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    q64 = q.double()
    if lens is None:
        return torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=sm_scale)
    out = torch.zeros_like(q64)
    for b, n in enumerate(lens.tolist()):
        out[b, :, :n] = torch.nn.functional.scaled_dot_product_attention(
            q64[b:b + 1, :, :n], k64[b:b + 1, :, :n], v64[b:b + 1, :, :n], is_causal=causal, scale=sm_scale)[0]
    return out


def main() -> None:
    gpu = torch.cuda.is_available() and os.environ.get("TILEJIT_INTERPRET") != "1"
    if not gpu:
        os.environ["TILEJIT_INTERPRET"] = "1"
    device = "cuda" if gpu else "cpu"
    dtype = torch.bfloat16 if gpu else torch.float32
    shapes = [(2, 4, 1000, 64, 2), (1, 2, 257, 128, 1)] if gpu else [(1, 2, 70, 32, 2)]
    for batch, heads, seq, dim, group in shapes:
        for causal in (False, True):
            torch.manual_seed(seq + dim + causal)
            q = torch.randn(batch, heads, seq, dim, device=device, dtype=dtype)
            k = torch.randn(batch, heads // group, seq, dim, device=device, dtype=dtype)
            v = torch.randn(batch, heads // group, seq, dim, device=device, dtype=dtype)
            out = torch.full_like(q, float("nan"))
            cfg = {} if gpu else dict(BM=32, BN=16, num_warps=4)
            attention(q, k, v, causal=causal, out=out, **cfg)
            err = (out.double() - reference(q, k, v, causal)).abs().max().item()
            print(f"attention B={batch} H={heads} S={seq} D={dim} GQA={group} causal={causal}: "
                  f"max |err| = {err:.2e} on {torch.cuda.get_device_name() if gpu else 'CPU (interpreter)'}")
            assert err < (3e-2 if dtype == torch.bfloat16 else 1e-4), err


if __name__ == "__main__":
    main()
