"""A one-kernel attention backward (dK, dV and dQ in one program per key block; dQ summed by float32 atomics, as
FlashAttention-2/3 do), timed beside ``attention_backward``'s two kernels and cuDNN, same run:

    python scripts/probes/attn_bwd_fused.py [--seq 4096] [--dim 128] [--compile-only]

Five products a step instead of the two kernels' seven (dQ's kernel recomputes S and dP). Measured on an H100
(bf16, B=4, H=16, S=4096): D=128 236.5 TFLOP/s (64x128 w8) against 409.1 for the two kernels and 508.3 cuDNN;
causal 216.7 / 346.0 / 459.1; D=64 195.3 / 343.5 / 417.1. The per-element float32 atomics of dQ (32 KiB a step)
and its transposed product (dS^T staged for wgmma) are the suspects; not profiled further.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit  # noqa: E402
import tilejit.language as T  # noqa: E402

LOG2E = 1.4426950408889634


@tilejit.func
def _step(k, v, Q, dO, Lse, Delta, dQacc, b, h, m0, cols, dk, dv, qk_scale, BM, D, MASK, DQ_STORE):
    q = Q[b, h, m0:m0 + BM, 0:D]
    do = dO[b, h, m0:m0 + BM, 0:D]
    lse = Lse[b, h, m0:m0 + BM]
    delta = Delta[b, h, m0:m0 + BM]
    st = T.gemm(k, q, T.zeros((k.shape[0], BM), T.float32), transpose_b=True)
    pt = T.exp2(st * qk_scale - lse[None, :])
    if MASK:
        rows = m0 + T.arange(0, BM)
        pt = T.where(cols[:, None] <= rows[None, :], pt, 0.0)
    dv = T.gemm(pt.to(dO.dtype), do, dv)
    dpt = T.gemm(v, do, T.zeros((k.shape[0], BM), T.float32), transpose_b=True)
    dst = (pt * (dpt - delta[None, :])).to(Q.dtype)
    dk = T.gemm(dst, q, dk)
    dq = T.gemm(dst, k, T.zeros((BM, D), T.float32), transpose_a=True)
    if DQ_STORE:  # timing only: each step overwrites dQ's partial sums (what a bulk reduction could cost at best)
        dQacc[b, h, m0:m0 + BM, 0:D] = dq
    else:
        T.atomic_add(dQacc[b, h, m0:m0 + BM, 0:D], dq, sem="relaxed")
    return dk, dv


@tilejit.kernel
def attn_bwd_fused(Q, K, V, dO, Lse, Delta, dK, dV, dQacc, sm_scale, HKV, GROUP: T.constexpr, BM: T.constexpr,
                   BN: T.constexpr, D: T.constexpr, CAUSAL: T.constexpr, DQ_STORE: T.constexpr = False):
    pid_bh = T.program_id(1)
    b = pid_bh // HKV
    kv = pid_bh % HKV
    n0 = T.program_id(0) * BN
    S = Q.shape[2]
    k = K[b, kv, n0:n0 + BN, 0:D]
    v = V[b, kv, n0:n0 + BN, 0:D]
    cols = n0 + T.arange(0, BN)
    qk_scale = sm_scale * 1.4426950408889634
    dk = T.zeros((BN, D), T.float32)
    dv = T.zeros((BN, D), T.float32)
    for g in range(GROUP):
        h = kv * GROUP + g
        lo = 0
        if CAUSAL:
            lo = T.minimum(n0 + BN, S)
            for m0 in T.range(n0, lo, BM, stages=2):
                dk, dv = _step(k, v, Q, dO, Lse, Delta, dQacc, b, h, m0, cols, dk, dv, qk_scale, BM, D, True,
                               DQ_STORE)
        for m0 in T.range(lo, S, BM, stages=2):
            dk, dv = _step(k, v, Q, dO, Lse, Delta, dQacc, b, h, m0, cols, dk, dv, qk_scale, BM, D, False,
                           DQ_STORE)
    dK[b, kv, n0:n0 + BN, 0:D] = (dk * sm_scale).to(dK.dtype)
    dV[b, kv, n0:n0 + BN, 0:D] = dv.to(dV.dtype)


@tilejit.kernel
def dq_convert(dQacc, dQ, sm_scale, H, BM: T.constexpr, D: T.constexpr):
    b = T.program_id(1) // H
    h = T.program_id(1) % H
    m0 = T.program_id(0) * BM
    dQ[b, h, m0:m0 + BM, 0:D] = (dQacc[b, h, m0:m0 + BM, 0:D] * sm_scale).to(dQ.dtype)


def backward(do, q, k, v, out, lse, causal, BM, BN, warps, dq_store=False, **opts):
    from tilejit.ops.fused_attention import attn_bwd_preprocess

    B, H, S, D = q.shape
    hkv = k.shape[1]
    scale = 1 / math.sqrt(D)
    delta = torch.empty(B, H, S, device=q.device, dtype=torch.float32)
    attn_bwd_preprocess[(tilejit.cdiv(S, 128), B * H)](out, do, delta, H, BM=128, D=D)
    dqacc = torch.zeros(B, H, S, D, device=q.device, dtype=torch.float32)
    dk, dv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
    attn_bwd_fused[(tilejit.cdiv(S, BN), B * hkv)](q, k, v, do, lse, delta, dk, dv, dqacc, scale, hkv,
                                                   GROUP=H // hkv, BM=BM, BN=BN, D=D, CAUSAL=causal,
                                                   DQ_STORE=dq_store, num_warps=warps, **opts)
    dq_convert[(tilejit.cdiv(S, 128), B * H)](dqacc, dq, scale, H, BM=128, D=D)
    return dq, dk, dv


CONFIGS = [(64, 64, 4, {}), (64, 128, 8, {}), (64, 128, 8, {"warp_specialize": True}), (64, 64, 4,
           {"warp_specialize": True})]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--dq-store", action="store_true", help="also time each config with dQ's partial tile stored, "
                    "not added (wrong dQ: the cost of moving it out with no reduction, a bound for a bulk one)")
    args = ap.parse_args()
    S, D = args.seq, args.dim
    B, H = max(1, 16384 // S), 16
    if args.compile_only:
        x = torch.empty(B, H, S, D, dtype=torch.bfloat16, device="meta")
        lse = torch.empty(B, H, S, dtype=torch.float32, device="meta")
        acc = torch.empty(B, H, S, D, dtype=torch.float32, device="meta")
        for bm, bn, w, opts in CONFIGS:
            for causal in (False, True):
                try:
                    ck = attn_bwd_fused.compile(x, x, x, x, lse, lse, x, x, acc, 0.1, H, GROUP=1, BM=bm, BN=bn, D=D,
                                                CAUSAL=causal, num_warps=w, arch="sm_90a", **opts)
                    print(bm, bn, w, opts, causal, "regs", ck.meta.get("registers"), "spills", ck.meta.get("spills"))
                except Exception as exc:
                    print(bm, bn, w, opts, causal, type(exc).__name__, str(exc)[:300])
        return
    from tilejit.ops import fused_attention as fa
    from tilejit.testing import do_bench

    print(torch.cuda.get_device_name())
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    for causal in (False, True):
        flops = 2.5 * 4.0 * B * H * S * S * D / (2 if causal else 1)
        out, lse = fa.attention_forward(q.detach(), k.detach(), v.detach(), causal=causal)
        ref = fa.attention_backward(do, q.detach(), k.detach(), v.detach(), out, lse, causal=causal)
        ms = do_bench(lambda: fa.attention_backward(do, q.detach(), k.detach(), v.detach(), out, lse, causal=causal))
        print(f"S={S} D={D} causal={causal} two kernels (default): {flops / ms / 1e9:.1f}", flush=True)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            o2 = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = do_bench(lambda: torch.autograd.grad(o2, (q, k, v), do, retain_graph=True))
        print(f"  cuDNN: {flops / ms / 1e9:.1f}", flush=True)
        for bm, bn, w, opts in CONFIGS:
            try:
                got = backward(do, q.detach(), k.detach(), v.detach(), out, lse, causal, bm, bn, w, **opts)
                err = max((g.float() - r.float()).abs().max().item() for g, r in zip(got, ref))
                ms = do_bench(lambda: backward(do, q.detach(), k.detach(), v.detach(), out, lse, causal, bm, bn, w,
                                               **opts))
                print(f"  fused {bm}x{bn} w{w} {opts}: {flops / ms / 1e9:.1f}  max diff vs two kernels {err:.3g}",
                      flush=True)
            except Exception as exc:
                print(f"  fused {bm}x{bn} w{w} {opts}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            if args.dq_store:
                try:
                    ms = do_bench(lambda: backward(do, q.detach(), k.detach(), v.detach(), out, lse, causal, bm, bn,
                                                   w, dq_store=True, **opts))
                    print(f"  fused {bm}x{bn} w{w} {opts}, dQ stored (timing only): {flops / ms / 1e9:.1f}", flush=True)
                except Exception as exc:
                    print(f"  fused {bm}x{bn} w{w} {opts}, dQ stored: {type(exc).__name__}: {str(exc)[:200]}",
                          flush=True)


if __name__ == "__main__":
    main()
