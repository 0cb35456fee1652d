"""Where the obvious attention forward loses to ``attention()`` at D=64 (bf16, 16 heads, 16k tokens): the one
loop (``benchmarks.kernels.attention_one_loop``) at each tile with the launch model's choice and with 2 stages
forced, beside ``attention()``'s default, same run. Prints TFLOP/s and the model's choice.

    python scripts/probes/one_loop_d64.py [--seqs 1024,4096] [--dims 64]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit  # noqa: E402
from benchmarks.kernels import attention_one_loop  # noqa: E402
from tilejit.ops import fused_attention  # noqa: E402
from tilejit.testing import do_bench  # noqa: E402

TILES = [(64, 64, 4), (64, 128, 4), (128, 64, 8), (128, 128, 8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--dims", default="64")
    args = ap.parse_args()
    print(torch.cuda.get_device_name())
    for seq in map(int, args.seqs.split(",")):
        for d in map(int, args.dims.split(",")):
            batch, heads = max(1, 16384 // seq), 16
            q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o = torch.empty_like(q)
            scale = 1 / math.sqrt(d)
            for causal in (False, True):
                flops = 4.0 * batch * heads * seq * seq * d / (2 if causal else 1)
                tf = lambda ms: flops / ms / 1e9  # noqa: E731
                ms = do_bench(lambda: fused_attention.attention(q, k, v, causal=causal))
                print(f"S={seq} D={d} causal={causal} attention() default: {tf(ms):.1f}", flush=True)
                for bm, bn, w in TILES:
                    grid = (tilejit.cdiv(seq, bm), heads, batch)
                    for opts in ({}, {"num_stages": 2}, {"num_stages": 3}):
                        kw = dict(BM=bm, BN=bn, D=d, CAUSAL=causal, num_warps=w, **opts)
                        try:
                            ck = attention_one_loop.compile(q, k, v, o, scale, **kw)
                            ms = do_bench(lambda: attention_one_loop[grid](q, k, v, o, scale, **kw))
                        except Exception as exc:  # a config that does not fit: say so, go on
                            print(f"  {bm}x{bn} w{w} {opts}: {type(exc).__name__}: {str(exc)[:100]}")
                            continue
                        chose = (ck.meta.get("launch_model") or {}).get("values", "")
                        print(f"  {bm}x{bn} w{w} {opts or 'model'}: {tf(ms):.1f}  model={chose} "
                              f"regs={ck.meta.get('registers', '?')}", flush=True)


if __name__ == "__main__":
    main()
