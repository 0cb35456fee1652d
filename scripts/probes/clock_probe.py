"""SM clock and board power while one kernel runs back to back for ~2 s, for tilejit's and cuBLAS's kernels on
the same problem (read with NVML through torch.cuda): does a kernel lose speed to clocks lowered for power?

    python scripts/probes/clock_probe.py            # tf32 and fp16, tilejit's usual configs and cuBLAS
    TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16 python scripts/probes/clock_probe.py mma80 [BMxBNxBKwWsS ...]
                                             # bf16 through the sm_80 lowering at each config
"""
from __future__ import annotations

import sys
import threading
import time

import torch

import tilejit
from benchmarks.kernels import matmul, tf32_mm_nt
from tilejit.testing import do_bench

torch.backends.cuda.matmul.allow_tf32 = True
N = 4096


def probe(name: str, launch, flops: float, seconds: float = 2.0) -> None:
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    samples: list[tuple[int, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((torch.cuda.clock_rate(), torch.cuda.power_draw() / 1000))
            time.sleep(0.05)

    start, count = time.perf_counter(), 0
    t = threading.Thread(target=sample)
    t.start()
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    begin.record()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            launch()
        count += 20
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    done.set()
    t.join()
    ms = begin.elapsed_time(end) / count
    late = samples[len(samples) // 4:] or samples
    clock = sum(s[0] for s in late) / len(late)
    power = sum(s[1] for s in late) / len(late)
    flushed = do_bench(launch)
    warm = do_bench(launch, _timing=_NoFlush())
    print(f"{name:44s} back to back {flops / ms / 1e9:6.1f} TFLOP/s at {clock:5.0f} MHz {power:4.0f} W; do_bench "
          f"{flops / flushed / 1e9:6.1f} (L2 flushed), {flops / warm / 1e9:6.1f} (not)", flush=True)


class _NoFlush:
    """do_bench's timing without the L2 flush between runs."""

    def __init__(self) -> None:
        from tilejit.testing import _CudaTiming

        self._inner = _CudaTiming()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def flush_l2(self) -> None:
        pass


def mma80(specs: list[str]) -> None:
    from benchmarks.configs import parse_configs

    print(torch.cuda.get_device_name())
    a, b, c = (torch.randn(N, N, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 2.0 * N ** 3
    for bm, bn, bk, warps, stages in parse_configs(",".join(specs or ["128x128x64w4s3", "128x256x64w8s3"])):
        kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
        grid = tilejit.cdiv(N, bm) * tilejit.cdiv(N, bn)
        probe(f"tilejit bf16 {bm}x{bn}x{bk} w{warps} s{stages}",
              lambda: matmul.kernel[(grid,)](a, b, c, **kw), flops)
    probe("cuBLAS bf16", lambda: torch.mm(a, b), flops)
    from mma_ceiling import ceiling_launch  # (scripts/probes/ is on sys.path when this file is run)

    probe("mma.sync register-only ceiling", *ceiling_launch())


def main() -> None:
    if sys.argv[1:2] == ["mma80"]:
        return mma80(sys.argv[2:])
    print(torch.cuda.get_device_name())
    a32, bt32, c32 = (torch.randn(N, N, device="cuda") for _ in range(3))
    flops = 2.0 * N ** 3
    grid = tilejit.cdiv(N, 128) * tilejit.cdiv(N, 256)
    for mode in ({"persistent": True}, {"warp_specialize": True}, {"persistent": True, "cluster": 2}):
        kw = dict(BM=128, BN=256, BK=32, num_warps=8, num_stages=4, **mode)
        probe(f"tilejit tf32 128x256x32 {'+'.join(mode)}", lambda: tf32_mm_nt.kernel[(grid,)](a32, bt32, c32, **kw),
              flops)
    probe("cuBLAS tf32", lambda: torch.mm(a32, bt32.t()), flops)
    kw = dict(BM=128, BN=256, BK=32, num_warps=8, num_stages=4, persistent=True)
    probe("tilejit tf32 128x256x32 persistent (again)", lambda: tf32_mm_nt.kernel[(grid,)](a32, bt32, c32, **kw),
          flops)
    a, b, c = (torch.randn(N, N, device="cuda", dtype=torch.float16) for _ in range(3))
    for mode in ({"persistent": True}, {"persistent": True, "cluster": 2}):
        kw = dict(BM=256, BN=128, BK=64, num_warps=8, num_stages=4, **mode)
        probe(f"tilejit fp16 256x128x64 {'+'.join(mode)}", lambda: matmul.kernel[(grid,)](a, b, c, **kw), flops)
    probe("cuBLAS fp16", lambda: torch.mm(a, b), flops)


if __name__ == "__main__":
    main()
