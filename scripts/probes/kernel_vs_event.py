"""Where a short GEMM's measured time goes: CUDA-event time (what ``do_bench`` reports) next to the kernel's own
duration on the GPU (the torch profiler's CUPTI record), for tilejit at a fixed config and for cuBLAS.

    python scripts/probes/kernel_vs_event.py [DTYPE:MxNxK:BMxBNxBKwWsS[:OPTION...] ...]

Cases as in ``scripts/probes/ncu_compare.py``. Each case: ``do_bench`` (L2 flushed before each run) of the tilejit launch
and of ``torch.matmul``, then 50 flushed runs of each under the profiler; prints the event median, the mean
kernel duration and their difference (launch and front-end time the event sees), per implementation.
"""
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tilejit  # noqa: E402
from benchmarks.kernels import matmul  # noqa: E402
from ncu_compare import parse_case  # noqa: E402
from tilejit.testing import do_bench  # noqa: E402

DEFAULT_CASES = ["fp16:1024x1024x1024:64x128x64w4s4:ws", "fp16:512x512x512:64x64x64w4s8:persistent",
                 "fp16:1x4096x4096:64x64x128w4s6:sk2"]


def kernel_us(fn, flush, runs=50):
    """Mean GPU duration (us) of the kernels ``fn`` launches, over ``runs`` flushed calls, and their names."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            flush()
            fn()
        torch.cuda.synchronize()
    per_name = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "zero" not in event.name.lower() \
                and "fill" not in event.name.lower():
            per_name.setdefault(event.name, []).append(event.device_time)
    return {name[:60]: (statistics.mean(times), len(times)) for name, times in per_name.items()}


def main(cases):
    flush_buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    flush = flush_buf.zero_
    print(torch.cuda.get_device_name())
    for case in cases:
        dtype_name, (m, n, k), kw = parse_case(case)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
        a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        launcher = matmul.kernel[(tilejit.cdiv(m, kw["BM"]) * tilejit.cdiv(n, kw["BN"]),)]
        impls = {"tilejit": lambda: launcher(a, b, c, **kw), "cuBLAS": lambda: torch.matmul(a, b, out=c)}
        for name, fn in impls.items():
            event_us = do_bench(fn) * 1e3
            kernels = kernel_us(fn, flush)
            total = sum(t for t, _ in kernels.values())
            detail = ", ".join(f"{kname} {t:.2f} us x{cnt}" for kname, (t, cnt) in kernels.items())
            print(f"{case} {name}: event {event_us:.2f} us, kernels {total:.2f} us, gap {event_us - total:.2f} us"
                  f"  [{detail}]", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT_CASES)
