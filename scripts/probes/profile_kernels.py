"""Launch one kernel a few times with a fixed config, for ``ncu`` to profile (no autotuning, no timing loop).

    ncu --launch-skip 2 --launch-count 1 -k regex:tj_ python scripts/probes/profile_kernels.py attention|gemm|gemm_ws|gemm_skinny|tf32

``gemm_ws`` is ``gemm`` (4096^3 fp16, 128x256x64, 8 warps, 4 stages) with a producer warpgroup (warp_specialize).
``gemm:BMxBNxBKwWsS[:OPTION...]`` launches the 4096^3 DESIGN matmul at that config, with launch options among
``ws``, ``persistent``, ``bf16`` (operands in bf16 instead of fp16); e.g. with
``TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16`` it profiles the sm_80 path.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _attention_module():
    from tilejit.ops import fused_attention

    return fused_attention


def main(what: str) -> None:
    torch.manual_seed(0)
    if what == "attention":
        att = _attention_module()
        q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for _ in range(4):
            att.attention(q, k, v, causal=False, BM=128, BN=64, num_warps=8)
    elif what == "tf32":  # the K-major tf32 matmul at 4096^3, the autotuner's usual pick (128x256x32 w8 s4)
        from benchmarks import kernels

        a = torch.randn(4096, 4096, device="cuda")
        bt = torch.randn(4096, 4096, device="cuda")
        c = torch.empty(4096, 4096, device="cuda")
        for _ in range(4):
            kernels.tf32_mm_nt.kernel[(16 * 32,)](a, bt, c, BM=128, BN=256, BK=32, num_warps=8, num_stages=4)
    elif what.startswith("gemm:"):
        from benchmarks import kernels
        from benchmarks.configs import parse_configs

        spec, *options = what.split(":")[1:]
        (bm, bn, bk, warps, stages), = parse_configs(spec)
        dtype = torch.bfloat16 if "bf16" in options else torch.float16
        a = torch.randn(4096, 4096, device="cuda", dtype=dtype)
        b = torch.randn(4096, 4096, device="cuda", dtype=dtype)
        c = torch.empty(4096, 4096, device="cuda", dtype=dtype)
        grid = (-(-4096 // bm) * -(-4096 // bn),)
        for _ in range(4):
            kernels.matmul.kernel[grid](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages,
                                        warp_specialize="ws" in options, persistent="persistent" in options)
    else:
        from benchmarks import kernels

        m, n, k = (128, 4096, 4096) if what == "gemm_skinny" else (4096, 4096, 4096)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        cfg = dict(BM=128, BN=64, BK=64, num_warps=4, num_stages=4, split_k=2) if what == "gemm_skinny" else \
            dict(BM=128, BN=256, BK=64, num_warps=8, num_stages=4, warp_specialize=what == "gemm_ws")
        grid = (-(-m // cfg["BM"]) * -(-n // cfg["BN"]),)
        for _ in range(4):
            kernels.matmul.kernel[grid](a, b, c, **cfg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
