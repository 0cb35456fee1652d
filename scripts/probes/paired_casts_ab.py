"""What casting register tiles two at a time (``tj_from_f32x2``) does to kernels' speed: every kernel compiled with
TILEJIT_PAIRED_CASTS=1 and with =0 (part of the cache key), each mode in its own process (a launch's compiled
dispatch does not read the variable again), the two modes taking turns twice; CUDA-graph replays, the faster of a
mode's two runs kept (a probe, not a benchmark). Rows: the fast fp8 product with B given K x N and a bf16 C (where the single casts
let ptxas serialize the main loop), the same with B given N x K, the fp16 DESIGN matmul and the attention
forward's default configs (P's cast is in their inner loop).

    python scripts/probes/paired_casts_ab.py
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tilejit  # noqa: E402
from benchmarks.kernels import matmul as tuned_matmul, scaled_mm as tuned_scaled_mm  # noqa: E402
from mn8_forms import matmul_fast  # noqa: E402
from tilejit.testing import do_bench_cudagraph  # noqa: E402

attention = importlib.import_module("tilejit.ops.fused_attention")
design_matmul, scaled_mm = tuned_matmul.kernel, tuned_scaled_mm.kernel  # the kernels, launched with fixed configs


def cases():
    """(name, flops, run, check) per row: run launches under the current TILEJIT_PAIRED_CASTS."""
    torch.manual_seed(0)
    rows = []
    for size in (8192,):
        a = (torch.randn(size, size, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        bt = (torch.randn(size, size, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        b = bt.T.contiguous()
        ref = (a.double() @ b.double())
        out = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
        ones = torch.ones(size, device="cuda")
        for bm, bn, w, opt in ((128, 256, 8, "persistent"), (256, 128, 8, "persistent"), (128, 128, 8, "persistent"),
                               (128, 128, 8, "warp_specialize"), (64, 128, 4, "warp_specialize")):
            cfg = dict(BM=bm, BN=bn, BK=128, num_warps=w, num_stages=4, **{opt: True})
            grid2 = (tilejit.cdiv(size, bm), tilejit.cdiv(size, bn))
            grid1 = (grid2[0] * grid2[1],)
            rows.append((f"fp8 fast B KxN {size}^3 {bm}x{bn} {opt}", 2 * size ** 3,
                         lambda cfg=cfg, g=grid2, a=a, b=b, out=out: matmul_fast[g](a, b, out, **cfg), out, ref))
            rows.append((f"fp8 fast B NxK {size}^3 {bm}x{bn} {opt}", 2 * size ** 3,
                         lambda cfg=cfg, g=grid1, a=a, bt=bt, out=out, ones=ones: scaled_mm[g](
                             a, bt, ones, ones, out, PRECISION="fast", **cfg), out, ref))
        x = torch.randn(size, size, device="cuda", dtype=torch.float16)
        y = torch.randn(size, size, device="cuda", dtype=torch.float16)
        z = torch.empty(size, size, device="cuda", dtype=torch.float16)
        cfg = dict(BM=128, BN=256, BK=64, num_warps=8, num_stages=4, persistent=True)
        rows.append((f"fp16 DESIGN matmul {size}^3 128x256 persistent", 2 * size ** 3,
                     lambda cfg=cfg, x=x, y=y, z=z: design_matmul[(tilejit.cdiv(size, 128) * tilejit.cdiv(size, 256),)](
                         x, y, z, **cfg), z, x.double() @ y.double()))
    q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    for causal in (False, True):
        flops = 4 * 4 * 16 * 4096 * 4096 * 128 // (2 if causal else 1)
        ref = attention.reference(q[:1, :2], k[:1, :2], v[:1, :2], causal)
        rows.append((f"attention() D=128 S=4096 causal={causal}", flops,
                     lambda causal=causal: attention.attention(q, k, v, causal=causal, out=o), None, (o, ref)))
    return rows


def measure() -> None:
    """One process, one mode: a JSON line per row (name, TFLOP/s, relative error)."""
    for name, flops, run, out, ref in cases():
        run()
        torch.cuda.synchronize()
        if out is not None:
            err = float(((out.double() - ref).norm() / ref.norm()).item())
        else:
            got, want = ref
            err = float((got[:1, :2].double().cpu() - want.cpu()).abs().max().item())
        print(json.dumps([name, flops / do_bench_cudagraph(run) / 1e9, err]), flush=True)


def main() -> None:
    if "--measure" in sys.argv:
        measure()
        return
    print(torch.cuda.get_device_name())
    best: dict[str, dict[str, tuple[float, float]]] = {}
    for _ in range(2):
        for mode in ("1", "0"):
            done = subprocess.run([sys.executable, __file__, "--measure"], capture_output=True, text=True,
                                  env={**os.environ, "TILEJIT_PAIRED_CASTS": mode})
            if done.returncode:
                sys.exit(f"the run with TILEJIT_PAIRED_CASTS={mode} failed:\n{done.stderr[-3000:]}")
            for line in done.stdout.splitlines():
                name, tflops, err = json.loads(line)
                seen = best.setdefault(name, {}).get(mode)
                if seen is None or tflops > seen[0]:
                    best[name][mode] = (tflops, err)
    print("| kernel | paired TFLOP/s | single TFLOP/s | paired / single | rel. err paired | rel. err single |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for name, modes in best.items():
        (p, pe), (q, qe) = modes["1"], modes["0"]
        print(f"| {name} | {p:.0f} | {q:.0f} | {p / q:.3f} | {pe:.2e} | {qe:.2e} |")


if __name__ == "__main__":
    main()
