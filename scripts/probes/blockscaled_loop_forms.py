"""What limits the block-scaled fp8 main loop: the same 4096x4096x7168 problem (e4m3, bf16 out) in loop forms
that each drop or move one part of ``tilejit.ops.fp8_blockscaled.blockscaled_mm``'s work, graph-timed (a probe;
only the "scaled" forms compute the block-scaled product, the others are timing references).

    python scripts/probes/blockscaled_loop_forms.py [--shape 4096x4096x7168]

Forms: "scaled" (the op's kernel; also with the activation scales stored column-major, as DeepGEMM takes
them), "scales hoisted" (one scale pair loaded before the loop: no per-iteration
global loads), "no scales, precise" (the plain fp8 product promoted every 128 of K), "no scales, fast", "scales
prefetched" (each iteration loads the next one's scales, carried in the loop), "two halves" (a 128x256 tile as two
128-column scaled gemms sharing the A tile); the unscaled product in 128x256 tiles; and 128x256 tiles whose column scales are picked per column half
("wide").
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit  # noqa: E402
import tilejit.language as T  # noqa: E402
import tilejit.ops.fp8_blockscaled as F  # noqa: E402
from benchmarks.fp8_blockscaled import quantize  # noqa: E402
from tilejit.testing import do_bench_cudagraph  # noqa: E402


@tilejit.kernel
def hoisted(A, SA, B, SB, C, BM: T.constexpr, BN: T.constexpr, STAGES: T.constexpr):
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    sa = SA[m0:m0 + BM, 0]
    sb = SB[n0 // 128, 0]
    for k0 in T.range(0, K, 128, stages=STAGES):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                     scale_a=sa, scale_b=sb)
    C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def unscaled(A, B, C, BM: T.constexpr, BN: T.constexpr, STAGES: T.constexpr, PRECISION: T.constexpr):
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, 128, stages=STAGES):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                     precision=PRECISION)
    C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def prefetched(A, SA, B, SB, C, BM: T.constexpr, BN: T.constexpr, STAGES: T.constexpr):
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    sa_next = SA[m0:m0 + BM, 0]
    sb_next = SB[n0 // 128, 0]
    for k0 in T.range(0, K, 128, stages=STAGES):
        kb = k0 // 128
        sa = sa_next
        sb = sb_next
        sa_next = SA[m0:m0 + BM, kb + 1]
        sb_next = SB[n0 // 128, kb + 1]
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                     scale_a=sa, scale_b=sb)
    C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def halves(A, SA, B, SB, C, BM: T.constexpr, STAGES: T.constexpr):
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * 256
    lo = T.zeros((BM, 128), T.float32)
    hi = T.zeros((BM, 128), T.float32)
    for k0 in T.range(0, K, 128, stages=STAGES):
        kb = k0 // 128
        a = A[m0:m0 + BM, k0:k0 + 128]
        sa = SA[m0:m0 + BM, kb]
        lo = T.gemm(a, B[n0:n0 + 128, k0:k0 + 128], lo, transpose_b=True, scale_a=sa, scale_b=SB[n0 // 128, kb])
        hi = T.gemm(a, B[n0 + 128:n0 + 256, k0:k0 + 128], hi, transpose_b=True, scale_a=sa,
                    scale_b=SB[n0 // 128 + 1, kb])
    C[m0:m0 + BM, n0:n0 + 128] = lo
    C[m0:m0 + BM, n0 + 128:n0 + 256] = hi


@tilejit.kernel
def wide(A, SA, B, SB, C, BM: T.constexpr, BN: T.constexpr, STAGES: T.constexpr):
    M, K = A.shape
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, 128, stages=STAGES):
        kb = k0 // 128
        sb = T.where(T.arange(0, BN) < 128, SB[n0 // 128, kb], SB[n0 // 128 + 1, kb])
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                     scale_a=SA[m0:m0 + BM, kb], scale_b=sb)
    C[m0:m0 + BM, n0:n0 + BN] = acc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="4096x4096x7168")
    m, n, k = map(int, parser.parse_args().shape.split("x"))
    torch.manual_seed(0)
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
    ref = F.reference(a, sa, b, sb)
    sa_cols = sa.t().contiguous().t()  # the same scales stored column-major (DeepGEMM's layout): rows adjacent
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    grid = (tilejit.cdiv(m, 128), tilejit.cdiv(n, 128))
    op_grid = (tilejit.cdiv(m, 128) * tilejit.cdiv(n, 128),)  # (the op's kernel walks a 1-D grid)
    grid256 = (tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))
    forms = []
    for opts in (dict(persistent=True), dict(warp_specialize=True)):
        tag = "persistent" if opts.get("persistent") else "ws"
        cfg = dict(BM=128, BN=128, STAGES=4, num_warps=8, **opts)
        forms += [
            (f"scaled {tag}", True, lambda cfg=cfg: F.blockscaled_mm[op_grid](a, sa, b, sb, out, **cfg)),
            (f"scaled, activation scales column-major {tag}", True,
             lambda cfg=cfg: F.blockscaled_mm[op_grid](a, sa_cols, b, sb, out, **cfg)),
            (f"scales hoisted {tag}", False, lambda cfg=cfg: hoisted[grid](a, sa, b, sb, out, **cfg)),
            (f"no scales, precise {tag}", False,
             lambda cfg=cfg: unscaled[grid](a, b, out, PRECISION="precise", **cfg)),
            (f"no scales, fast {tag}", False, lambda cfg=cfg: unscaled[grid](a, b, out, PRECISION="fast", **cfg)),
            (f"scales prefetched {tag}", True, lambda cfg=cfg: prefetched[grid](a, sa, b, sb, out, **cfg)),
            (f"two halves {tag}", True, lambda opts=opts: halves[grid256](a, sa, b, sb, out, BM=128, STAGES=3,
                                                                          num_warps=8, **opts)),
        ]
    grid_wide = (tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))
    for opts in (dict(persistent=True), dict(warp_specialize=True)):
        tag = "persistent" if opts.get("persistent") else "ws"
        for precision in ("precise", "fast"):
            forms.append((f"no scales, {precision} 128x256 {tag}", False,
                          lambda opts=opts, precision=precision: unscaled[grid_wide](
                              a, b, out, BM=128, BN=256, STAGES=4, num_warps=8, PRECISION=precision, **opts)))
    for opts in (dict(persistent=True), dict(warp_specialize=True)):
        tag = "persistent" if opts.get("persistent") else "ws"
        forms.append((f"wide 128x256 (column scales by T.where) {tag}", True,
                      lambda opts=opts: wide[grid_wide](a, sa, b, sb, out, BM=128, BN=256, STAGES=4, num_warps=8,
                                                        **opts)))
    print(torch.cuda.get_device_name(), f"{m}x{n}x{k}")
    for label, exact, run in forms:
        try:
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            err = float(((out.double() - ref).norm() / ref.norm()).item())
            ms = do_bench_cudagraph(run)
        except Exception as e:  # noqa: BLE001 - a form that does not build is a row
            print(f"| {label} | {type(e).__name__}: {str(e).splitlines()[0][:200]} |", flush=True)
            continue
        note = f"err {err:.1e}" if exact else "(timing only)"
        print(f"| {label} | {ms * 1e3:.1f} us | {2 * m * n * k / ms / 1e9:.0f} TFLOP/s | {note} |", flush=True)


if __name__ == "__main__":
    main()
