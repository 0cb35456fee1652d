"""Attention forward TFLOP/s: tilejit's examples/attention.py against torch SDPA (flash and cuDNN backends).

    python -m benchmarks.attention [--seqs 1024,4096] [--dims 64,128] [--out DIR]

bf16, 16k tokens per problem (batch = 16384 // seq), 16 heads; causal and not. tilejit takes the fastest config
of ``examples/attention.CONFIGS`` for the head dim (each timed, best kept), every timing through
``tilejit.testing.do_bench`` in one process on one GPU. FLOPs: 4 * B * H * S^2 * D (halved when causal).
Triton: a FlashAttention-2-style kernel (``benchmarks.triton_kernels.attention``), checked like the others
before it is timed. The backward pass is not measured.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from benchmarks.common import DEFAULT_OUT, append_results, machine_stamp, markdown_table, write_json

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tilejit_examples_attention_bench", ROOT / "examples" / "attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)


def _tflops(batch, heads, seq, dim, causal, ms):
    flops = 4.0 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def main(argv=None) -> int:
    from tilejit.testing import do_bench

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="1024,4096")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ns = parser.parse_args(argv)
    from torch.nn.attention import SDPBackend

    baselines = {"SDPA flash": _sdpa(SDPBackend.FLASH_ATTENTION), "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION)}
    try:
        from benchmarks import triton_kernels
        baselines["Triton"] = lambda q, k, v, causal: triton_kernels.attention(q, k, v, causal)
    except ImportError as e:  # Triton is optional: its column reads n/a
        print(f"Triton unavailable: {e}")
    rows, records = [], []
    for dim in (int(d) for d in ns.dims.split(",")):
        for seq in (int(s) for s in ns.seqs.split(",")):
            batch = max(1, 16384 // seq)
            torch.manual_seed(seq + dim)
            q, k, v = (torch.randn(batch, ns.heads, seq, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                ref = attention.reference(q[:1, :2], k[:1, :2], v[:1, :2], causal)
                best = None
                for bm, bn, warps in attention.CONFIGS[dim]:
                    cfg = dict(BM=bm, BN=bn, num_warps=warps)
                    out = attention.attention(q, k, v, causal=causal, **cfg)
                    err = (out[:1, :2].double() - ref).abs().max().item()
                    if err > 3e-2:
                        raise AssertionError(f"tilejit attention {cfg} is wrong: max |err| {err}")
                    ms = do_bench(lambda: attention.attention(q, k, v, causal=causal, out=out, **cfg))
                    if best is None or ms < best[0]:
                        best = (ms, f"{bm}x{bn} w{warps}")
                row = {"dim": dim, "seq": seq, "batch": batch, "causal": causal,
                       "tilejit": _tflops(batch, ns.heads, seq, dim, causal, best[0]), "config": best[1]}
                for name, fn in baselines.items():
                    try:
                        err = (fn(q, k, v, causal)[:1, :2].double() - ref).abs().max().item()
                        if err > 3e-2:
                            raise RuntimeError(f"wrong result: max |err| {err}")
                        row[name] = _tflops(batch, ns.heads, seq, dim, causal, do_bench(lambda: fn(q, k, v, causal)))
                    except Exception as e:  # a backend that does not take this shape, or fails: n/a, said why
                        row[name] = None
                        print(f"{name} unavailable for D={dim} S={seq}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                records.append(row)
                rows.append([dim, seq, batch, "yes" if causal else "no", row["tilejit"], row["config"],
                             row["SDPA flash"], row["SDPA cuDNN"], row.get("Triton"),
                             row["tilejit"] / row["SDPA cuDNN"] if row["SDPA cuDNN"] else None,
                             row["tilejit"] / row["Triton"] if row.get("Triton") else None])
                print(rows[-1], flush=True)
    meta = machine_stamp()
    table = markdown_table(["D", "seq", "batch", "causal", "tilejit TFLOP/s", "config", "SDPA flash",
                            "SDPA cuDNN", "Triton", "tilejit / cuDNN", "tilejit / Triton"], rows)
    print(table)
    write_json(ns.out / "attention.json", {"meta": meta, "results": records})
    append_results("Attention forward, bf16, 16 heads, 16k tokens", table, meta,
                   notes=["tilejit: examples/attention.py, best config of its space; the FlashAttention-2 "
                          "structure (no warp specialization; on sm_90a P feeds the second wgmma from registers; "
                          "the causal mask only on diagonal blocks). Triton: benchmarks/triton_kernels.attention, "
                          "a FlashAttention-2-style kernel autotuned over 6 configs."])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
