"""Is the block-scaled loop's time in its scale addresses? ``tilejit.ops.fp8_blockscaled.blockscaled_mm``
(128x128, 4 stages, 8 warps, persistent, sm_90a) timed as the compiler writes it and with its CUDA edited by
hand before NVRTC sees it: the activation scales' two row pointers, the weight scale's pointer and their bounds
computed once per program, and the three pointers stepped by the K-block stride each iteration (the loop as the
compiler emits it recomputes 64-bit row addresses and bounds from run-time strides every iteration: 191 SASS
instructions an iteration against 147 edited, counted on CPU).

    python scripts/probes/blockscaled_carried_pointers.py [--edited] [--shape 4096x4096x7168]

Run it once plain and once with ``--edited``, each in a fresh ``TILEJIT_CACHE_DIR`` (the edit is not part of the
cache key). The edit matches the CUDA generated for that one config; a source that does not match is an error.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit  # noqa: E402
import tilejit.backend_cuda.stages as stages  # noqa: E402
import tilejit.ops.fp8_blockscaled as F  # noqa: E402
from benchmarks.fp8_blockscaled import quantize  # noqa: E402
from tilejit.testing import do_bench_cudagraph  # noqa: E402

_ROW = "(((tid >> 7) * 64) + (((tid >> 5) & 3) * 16) + ((tid & 31) >> 2))"
_LOOP = "      for (int64_t v18_k0 = v5; (v18_k0 < v6_A_size1); v18_k0 += v7, ++tj_it) {"
_EDITS = [
    (_LOOP,
     f"      const float* tj_sa0 = v1_SA + (int64_t)(v10_m0 + {_ROW}) * v1_SA_stride0;\n"
     "      const float* tj_sa1 = tj_sa0 + 8 * v1_SA_stride0;\n"
     f"      const bool tj_ok0 = (uint64_t)((int64_t)v10_m0 + {_ROW}) < (uint64_t)v1_SA_size0;\n"
     f"      const bool tj_ok1 = (uint64_t)((int64_t)v10_m0 + {_ROW} + 8) < (uint64_t)v1_SA_size0;\n"
     "      const float* tj_sbp = v3_SB + (int64_t)(v13_n0 / 128) * v3_SB_stride0;\n"
     "      const bool tj_okb = (uint64_t)(v13_n0 / 128) < (uint64_t)v3_SB_size0;\n"
     "      const int tj_nkb = (int)(v1_SA_size1 < v3_SB_size1 ? v1_SA_size1 : v3_SB_size1);\n"
     "      int tj_kb = 0;\n"
     "      const float* tj_pa0 = tj_sa0; const float* tj_pa1 = tj_sa1; const float* tj_pb = tj_sbp;\n"
     "      for (int64_t v18_k0 = v5; (v18_k0 < v6_A_size1); v18_k0 += v7, ++tj_it, ++tj_kb, "
     "tj_pa0 += v1_SA_stride1, tj_pa1 += v1_SA_stride1, tj_pb += v3_SB_stride1) {"),
    ("          v21[0] = (tj_dropped_ok && (uint64_t)((int64_t)(v10_m0) + (((((((0 >> 6) * 2) + (tid >> 7)) * 64) + "
     "(((tid >> 5) & 3) * 16)) + ((tid & 31) >> 2)) + ((((0 & 63) >> 1) & 1) * 8))) < (uint64_t)v1_SA_size0) ? "
     "tj_p[(int64_t)((((((((0 >> 6) * 2) + (tid >> 7)) * 64) + (((tid >> 5) & 3) * 16)) + ((tid & 31) >> 2)) + "
     "((((0 & 63) >> 1) & 1) * 8))) * v1_SA_stride0] : float{};",
     "          v21[0] = (tj_kb < tj_nkb && tj_ok0) ? *tj_pa0 : 0.0f;"),
    ("          v21[2] = (tj_dropped_ok && (uint64_t)((int64_t)(v10_m0) + (((((((2 >> 6) * 2) + (tid >> 7)) * 64) + "
     "(((tid >> 5) & 3) * 16)) + ((tid & 31) >> 2)) + ((((2 & 63) >> 1) & 1) * 8))) < (uint64_t)v1_SA_size0) ? "
     "tj_p[(int64_t)((((((((2 >> 6) * 2) + (tid >> 7)) * 64) + (((tid >> 5) & 3) * 16)) + ((tid & 31) >> 2)) + "
     "((((2 & 63) >> 1) & 1) * 8))) * v1_SA_stride0] : float{};",
     "          v21[2] = (tj_kb < tj_nkb && tj_ok1) ? *tj_pa1 : 0.0f;"),
    ("        const float v24 = ((uint64_t)(int64_t)(v23) < (uint64_t)v3_SB_size0 && (uint64_t)(int64_t)(v20_kb) < "
     "(uint64_t)v3_SB_size1) ? *(v3_SB + ((int64_t)(v23) * v3_SB_stride0 + (int64_t)(v20_kb) * v3_SB_stride1)) : "
     "float{};",
     "        const float v24 = (tj_okb && tj_kb < tj_nkb) ? *tj_pb : 0.0f;"),
]


def _edit(source: str) -> str:
    for old, new in _EDITS:
        if source.count(old) != 1:
            raise SystemExit(f"the generated CUDA no longer holds the line the edit replaces: {old[:80]}...")
        source = source.replace(old, new)
    return source


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="4096x4096x7168")
    parser.add_argument("--edited", action="store_true")
    args = parser.parse_args()
    m, n, k = map(int, args.shape.split("x"))
    if args.edited:
        plain = stages.compile_cuda
        stages.compile_cuda = lambda source, **kw: plain(_edit(source) if "tj_blockscaled_mm" in source
                                                         else source, **kw)
    torch.manual_seed(0)
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
    ref = F.reference(a, sa, b, sb)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    grid = (tilejit.cdiv(m, 128) * tilejit.cdiv(n, 128),)  # (the op's kernel walks a 1-D grid)

    def run():
        F.blockscaled_mm[grid](a, sa, b, sb, out, BM=128, BN=128, STAGES=4, num_warps=8, persistent=True)

    out.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    err = float(((out.double() - ref).norm() / ref.norm()).item())
    times = [do_bench_cudagraph(run) for _ in range(3)]
    label = "edited (pointers carried)" if args.edited else "as compiled"
    print(torch.cuda.get_device_name(), f"{m}x{n}x{k}")
    for ms in times:
        print(f"| {label} | {ms * 1e3:.1f} us | {2 * m * n * k / ms / 1e9:.0f} TFLOP/s | err {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
