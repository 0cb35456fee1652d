"""The attention forward as one key loop (``fused_attention.attn_fwd``'s ``ONE_LOOP``), warp-specialized and
persistent, against ``attn_fwd``'s two loops and cuDNN, after checking the persistent walk against float64 over ragged lengths,
GQA, windows, softcaps and variable lengths.

    python scripts/probes/attention_walk.py [--seqs 1024,2048,4096] [--dims 128,64] [--check-only]
    python scripts/probes/attention_walk.py --isolate [--seqs ...]   # the kernels launched directly, same tiles
"""
from __future__ import annotations

import argparse

import torch

from tilejit.ops import fused_attention as attention
from tilejit.testing import do_bench


def check(configs) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = [dict(seq=1000, dim=128, heads=4, group=1, causal=True),
             dict(seq=1000, dim=128, heads=4, group=1, causal=False),
             dict(seq=333, dim=64, heads=8, group=4, causal=True),
             dict(seq=777, dim=64, heads=4, group=2, causal=False, lens=True),
             dict(seq=700, dim=128, heads=4, group=2, causal=True, lens=True),
             dict(seq=600, dim=128, heads=2, group=1, causal=False, window=(100, 37)),
             dict(seq=600, dim=64, heads=2, group=1, causal=True, window=(129, 0), softcap=30.0),
             dict(seq=517, dim=128, heads=2, group=1, causal=True, softcap=20.0, lse=True)]
    for case in cases:
        dim, seq, heads, group = case["dim"], case["seq"], case["heads"], case["group"]
        batch = 3
        q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        lens = torch.tensor([seq, seq // 2 + 1, 1], dtype=torch.int32, device="cuda") if case.get("lens") else None
        ref = attention.reference(q, k, v, case["causal"], lens=lens, window=case.get("window"),
                                  softcap=case.get("softcap"))
        for cfg in configs[dim]:
            out = torch.full_like(q, float("nan"))
            if case.get("lse"):
                out, lse = attention.attention_forward(q, k, v, causal=case["causal"], out=out, lens=lens,
                                                       softcap=case.get("softcap"), window=case.get("window"), **cfg)
                plain, lse0 = attention.attention_forward(q, k, v, causal=case["causal"], lens=lens,
                                                          softcap=case.get("softcap"), window=case.get("window"))
                assert torch.allclose(lse, lse0, atol=2e-2, rtol=0), f"lse {case} {cfg}"
            else:
                attention.attention(q, k, v, causal=case["causal"], out=out, lens=lens, window=case.get("window"),
                                    softcap=case.get("softcap"), **cfg)
            err = (out.double() - ref).abs().max().item()
            assert not out.isnan().any() and err < 3e-2, f"{case} {cfg}: max |err| {err}"
            print(f"ok {case} {cfg}: max |err| {err:.2e}", flush=True)


def isolate(seqs, dim=128) -> None:
    """The walk's kernel with and without ``persistent`` against ``attn_fwd``, the same tiles, launched directly."""
    import tilejit
    print(f"\n{torch.cuda.get_device_name()}: D = {dim}, 128x128 w8, 3 stages, warp-specialized; TFLOP/s (do_bench)")
    for seq in seqs:
        for causal in (True, False):
            batch, heads = 16384 // seq, 16
            q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out = torch.empty_like(q)
            flops = 4.0 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
            grid = (tilejit.cdiv(seq, 128), batch * heads)
            lens = torch.zeros(1, dtype=torch.int32, device="cuda")
            cfg = dict(GROUP=1, BM=128, BN=128, D=dim, CAUSAL=causal, VARLEN=False, num_warps=8, STAGES=3)
            forms = {"attn_fwd ws": (attention.attn_fwd, dict(warp_specialize=True, peel_masks=False)),
                     "walk ws": (attention.attn_fwd, dict(warp_specialize=True, peel_masks=False, ONE_LOOP=True)),
                     "walk persistent": (attention.attn_fwd, dict(persistent=True, peel_masks=False, ONE_LOOP=True)),
                     "walk persistent s2": (attention.attn_fwd, dict(persistent=True, peel_masks=False, ONE_LOOP=True,
                                                                          STAGES=2))}
            line = []
            for name, (kernel, extra) in forms.items():
                run = lambda: kernel[grid](q, k, v, out, lens, lens, 0.088, heads, **{**cfg, **extra})  # noqa
                line.append(f"{name} {flops / do_bench(run) / 1e9:.1f}")
            print(f"S={seq} causal={causal}: " + ", ".join(line), flush=True)


def tile_sweep(seqs, dim) -> None:
    """Causal only: ``attention()``'s default against the one-loop kernel warp-specialized over the tiles of
    ``CONFIGS[dim]`` and 2- and 3-deep rings, launched directly (what a default for this head dim would take)."""
    import tilejit
    print(f"\n{torch.cuda.get_device_name()}: D = {dim}, causal, bf16; TFLOP/s (do_bench)")
    for seq in seqs:
        batch, heads = 16384 // seq, 16
        q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        flops = 2.0 * batch * heads * seq * seq * dim
        lens = torch.zeros(1, dtype=torch.int32, device="cuda")
        line = [f"attention() {flops / do_bench(lambda: attention.attention(q, k, v, causal=True, out=out)) / 1e9:.1f}"]
        for bm, bn, warps in attention.CONFIGS[dim]:
            for stages in (2, 3):
                grid = (tilejit.cdiv(seq, bm), batch * heads)
                cfg = dict(GROUP=1, BM=bm, BN=bn, D=dim, CAUSAL=True, VARLEN=False, num_warps=warps, STAGES=stages,
                           warp_specialize=True, peel_masks=False)
                run = lambda: attention.attn_fwd[grid](q, k, v, out, lens, lens, 0.125, heads,  # noqa: E731
                                                       ONE_LOOP=True, **cfg)
                line.append(f"walk {bm}x{bn} w{warps} s{stages} {flops / do_bench(run) / 1e9:.1f}")
        print(f"S={seq}: " + ", ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", default="1024,2048,4096")
    parser.add_argument("--dims", default="128,64")
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--isolate", action="store_true")
    parser.add_argument("--tiles", action="store_true")
    args = parser.parse_args()
    if args.tiles:
        for dim in args.dims.split(","):
            tile_sweep([int(s) for s in args.seqs.split(",")], int(dim))
        return
    if args.isolate:
        return isolate([int(s) for s in args.seqs.split(",")])
    print(torch.cuda.get_device_name())
    check({d: [dict(BM=bm, BN=bn, num_warps=w, STAGES=3, persistent=True) for bm, bn, w in attention.CONFIGS[d]]
           for d in (64, 128)})
    if args.check_only:
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for dim in map(int, args.dims.split(",")):
        for seq in map(int, args.seqs.split(",")):
            for causal in (True, False):
                batch, heads = 16384 // seq, 16
                q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = 4.0 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
                ref = attention.reference(q[:1, :2], k[:1, :2], v[:1, :2], causal)

                def timed(cfg):
                    out = torch.full_like(q, float("nan"))
                    attention.attention(q, k, v, causal=causal, out=out, **cfg)
                    err = (out[:1, :2].double() - ref).abs().max().item()
                    assert err < 3e-2, f"{cfg}: {err}"
                    return flops / do_bench(lambda: attention.attention(q, k, v, causal=causal, out=out, **cfg)) / 1e9

                tiles = attention.default_config(dim, causal, hopper=True)
                times = [timed({}), timed(tiles), timed({**tiles, "persistent": True})]
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    times.append(flops / do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal)) / 1e9)
                rows.append((dim, seq, causal, *times))
                print(rows[-1], flush=True)
    print(f"\n{torch.cuda.get_device_name()}: bf16, 16 heads, batch 16384 / S, TFLOP/s (do_bench); attention() with no "
          "config; attn_fwd (two loops) and the persistent walk on the same tiles")
    print("| D | S | causal | attention() | two loops | persistent walk | cuDNN | attention() / cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    for d, s, c, dflt, two, walk, cu in rows:
        print(f"| {d} | {s} | {c} | {dflt:.1f} | {two:.1f} | {walk:.1f} | {cu:.1f} | {dflt / cu:.2f} |")

if __name__ == "__main__":
    main()
