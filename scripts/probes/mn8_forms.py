"""MN-major fp8 (B given K x N) against its K-major form, precise and fast, graph-timed on fixed tiles (a probe):
``benchmarks.kernels.matmul`` (precise, B K x N), its fast twin here, and ``scaled_mm`` (B N x K) with unit scales.
With ``TILEJIT_GEMM_LOWERING=wgmma_m64nNk32_fp8`` the MN-major B takes the transposing copy (by the math warps)
instead of the register gather.

    python scripts/probes/mn8_forms.py [--sizes 4096,8192]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit  # noqa: E402
import tilejit.language as T  # noqa: E402
from benchmarks.kernels import matmul as tuned_matmul, scaled_mm as tuned_scaled_mm  # noqa: E402
from tilejit.testing import do_bench_cudagraph  # noqa: E402

matmul, scaled_mm = tuned_matmul.kernel, tuned_scaled_mm.kernel


@tilejit.kernel
def matmul_fast(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C = A @ B with B given K x N, fp8 summed in the tensor cores' own accumulator (precision "fast")."""
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], B[k0:k0 + BK, n0:n0 + BN], acc, precision="fast")
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4096,8192")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    print(torch.cuda.get_device_name())
    torch.manual_seed(0)
    tiles = dict(w8=dict(num_warps=8, num_stages=4), w4=dict(num_warps=4, num_stages=4))
    for size in sizes:
        m = n = k = size
        a = (torch.randn(m, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        bt = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
        b = bt.T.contiguous()
        ones_m, ones_n = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
        ref = a.double() @ b.double()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 2 * m * n * k
        rows = []
        for bm, bn, w, opt in ((128, 128, "w8", "persistent"), (128, 128, "w8", "warp_specialize"),
                               (64, 128, "w4", "warp_specialize"), (128, 256, "w8", "persistent"),
                               (256, 128, "w8", "persistent"), (256, 128, "w8", "warp_specialize"),
                               (128, 256, "w8", "warp_specialize")):
            cfg = dict(BM=bm, BN=bn, BK=128, **tiles[w], **{opt: True})
            g1 = (tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)
            g2 = (tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))
            for label, run in (
                    ("precise K-major", lambda: scaled_mm[g1](a, bt, ones_m, ones_n, out, **cfg)),
                    ("precise MN", lambda: matmul[g1](a, b, out, **cfg)),
                    ("fast K-major", lambda: scaled_mm[g1](a, bt, ones_m, ones_n, out, PRECISION="fast", **cfg)),
                    ("fast MN", lambda: matmul_fast[g2](a, b, out, **cfg))):
                try:
                    out.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    err = float(((out.double() - ref).norm() / ref.norm()).item())
                    rows.append((f"{size}^3 {bm}x{bn} {w} {opt}", label, flops / do_bench_cudagraph(run) / 1e9, err))
                except Exception as e:  # noqa: BLE001 - a form that does not build is a row
                    rows.append((f"{size}^3 {bm}x{bn} {w} {opt}", label, float("nan"), str(e).splitlines()[0][:80]))
        for tile, label, tflops, err in rows:
            print(f"| {tile} | {label} | {tflops:.0f} | {err if isinstance(err, str) else f'{err:.2e}'} |", flush=True)


if __name__ == "__main__":
    main()
