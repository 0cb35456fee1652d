"""Causal attention forward with two query blocks a program (block i and block n - 1 - i: every program the same
number of key blocks), against ``attention()``'s one block a program, at short sequences (a probe, not a
benchmark).

    python scripts/probes/attention_block_pairs.py [--seqs 1024,2048] [--dims 64,128] [--compile-only]

Each block runs the tuned forward's two loops (unmasked, then the diagonal), so a warp-specialized program's producer
can fill the ring with the second block's keys while the consumers finish the first.
"""
from __future__ import annotations

import argparse
import importlib

import torch

import tilejit
import tilejit.language as T

fa = importlib.import_module("tilejit.ops.fused_attention")


@tilejit.func
def _one_block(Q, K, V, O, b, h, kv, m0, S, sm_scale, BM, BN, D, STAGES):
    q = Q[b, h, m0:m0 + BM, 0:D]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    qk_scale = sm_scale * 1.4426950408889634
    rows = m0 + T.arange(0, BM)
    lo = T.minimum(m0, (S // BN) * BN)
    for n0 in T.range(0, lo, BN, stages=STAGES):
        m_i, l_i, acc = fa._online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D, False,
                                                False, -1, -1, 0.0, sm_scale)
    for n0 in T.range(lo, T.minimum(S, m0 + BM), BN, stages=2):
        m_i, l_i, acc = fa._online_softmax_step(q, K, V, b, kv, n0, S, rows, m_i, l_i, acc, qk_scale, BN, D, True,
                                                True, -1, -1, 0.0, sm_scale)
    O[b, h, m0:m0 + BM, 0:D] = (acc / l_i[:, None]).to(O.dtype)


@tilejit.kernel
def attn_fwd_pairs(Q, K, V, O, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr, BN: T.constexpr, D: T.constexpr,
                   STAGES: T.constexpr = 2):
    """Causal; grid (cdiv(cdiv(S, BM), 2), B * H): program i takes query blocks n - 1 - i, then i (once when
    they are one)."""
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    S = Q.shape[2]
    n = T.cdiv(S, BM)
    i = T.program_id(0)
    _one_block(Q, K, V, O, b, h, kv, (n - 1 - i) * BM, S, sm_scale, BM, BN, D, STAGES)
    if i != n - 1 - i:
        _one_block(Q, K, V, O, b, h, kv, i * BM, S, sm_scale, BM, BN, D, STAGES)


def pairs(q, k, v, out, config):
    batch, heads, seq, dim = q.shape
    grid = (tilejit.cdiv(tilejit.cdiv(seq, config["BM"]), 2), batch * heads)
    attn_fwd_pairs[grid](q, k, v, out, 1.0 / dim ** 0.5, heads, GROUP=heads // k.shape[1], D=dim, **config)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", default="1024,2048")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--compile-only", action="store_true", help="sm_90a cubins and their register counts")
    ns = parser.parse_args()
    configs = [dict(BM=128, BN=128, num_warps=8, warp_specialize=True, STAGES=3), dict(BM=64, BN=64, num_warps=4),
               dict(BM=128, BN=64, num_warps=8, warp_specialize=True, STAGES=3),
               dict(BM=64, BN=64, num_warps=4, warp_specialize=True, STAGES=3)]
    if ns.compile_only:
        for dim in map(int, ns.dims.split(",")):
            q = torch.empty(4, 16, 1024, dim, dtype=torch.bfloat16, device="meta")
            for config in configs:
                c = attn_fwd_pairs.compile(q, q, q, q, 0.1, 16, GROUP=1, D=dim, arch="sm_90a", **config)
                print(dim, config, "spills", c.meta["spills"], "smem", c.shared_bytes,
                      "specialized", "producer" in c.asm["cuda"], flush=True)
        return
    from tilejit.testing import do_bench, do_bench_cudagraph
    name = torch.cuda.get_device_name()
    print("| D | seq | config | pairs TFLOP/s | attention() same config | attention() default | pairs graph | default graph "
          "| device |\n" + "| --- " * 9 + "|")
    for dim in map(int, ns.dims.split(",")):
        for seq in map(int, ns.seqs.split(",")):
            batch, heads = 16384 // seq, 16
            torch.manual_seed(seq + dim)
            q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            flops = 4 * batch * heads * seq * seq * dim / 2
            default = lambda: fa.attention_forward(q, k, v, causal=True)  # noqa: E731
            base_ms, base_graph = do_bench(default), do_bench_cudagraph(default)
            for config in configs:
                if config["BM"] % config["BN"] or (dim == 64 and config["BM"] == 128 and config["BN"] == 128):
                    continue
                out = torch.full_like(q, float("nan"))
                try:
                    pairs(q, k, v, out, config)
                    err = (out.float() - want.float()).abs().max().item()
                    assert err < 2e-2, f"max error {err:.3g}"
                    ms = do_bench(lambda: pairs(q, k, v, out, config))
                    graph = do_bench_cudagraph(lambda: pairs(q, k, v, out, config))
                    same = do_bench(lambda: fa.attention_forward(q, k, v, causal=True, **config))
                except Exception as exc:  # noqa: BLE001 - a config that fails is a row too
                    print(f"| {dim} | {seq} | {config} | {type(exc).__name__}: {str(exc)[:100]} | | | | | {name} |")
                    continue
                print(f"| {dim} | {seq} | {config} | {flops / ms / 1e9:.1f} | {flops / same / 1e9:.1f} "
                      f"| {flops / base_ms / 1e9:.1f} | {flops / graph / 1e9:.1f} | {flops / base_graph / 1e9:.1f} "
                      f"| {name} |", flush=True)


if __name__ == "__main__":
    main()
