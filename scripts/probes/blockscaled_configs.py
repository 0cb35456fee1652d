"""Where block-scaled fp8's time goes: ``fp8_blockscaled_matmul`` / ``_grouped_matmul`` on DeepSeek-V3's shapes,
each launch timed two ways (``do_bench``: the Python call, L2 flushed, as ``benchmarks.fp8_blockscaled`` does;
``do_bench_cudagraph``: the kernel alone, replayed from a CUDA graph), beside torch's block-wise ``_scaled_mm``
timed the same two ways, then a sweep of tile / ring / launch-option configs (graph-timed, each checked against
the float64 reference first). A probe, not a benchmark.

    python scripts/probes/blockscaled_configs.py [--shapes 128x7168x2048,...] [--no-sweep]
"""
import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit.ops.fp8_blockscaled as F  # noqa: E402
from benchmarks.fp8_blockscaled import _torch_blockwise, quantize  # noqa: E402
from tilejit.testing import do_bench, do_bench_cudagraph  # noqa: E402

SHAPES = "128x7168x2048,128x4096x7168,128x2112x7168,4096x7168x2048,4096x4096x7168,4096x2112x7168"


def sweep_configs(m: int, n: int):
    tiles = [(128, 128, 8), (64, 128, 4), (64, 64, 4), (128, 64, 8)]
    options = [dict(warp_specialize=True), dict(warp_specialize=False), dict(persistent=True),
               dict(pingpong=True), dict(cluster=2), dict(split_k=2)]
    for (bm, bn, nw), stages, opts in itertools.product(tiles, (4, 6), options):
        if opts.get("split_k") and m > 1024:
            continue
        if opts.get("pingpong") and nw != 4:
            continue
        yield dict(BM=bm, BN=bn, STAGES=stages, num_warps=nw, **opts)


def tflops(m, n, k, ms):
    return 2 * m * n * k / ms / 1e9


def check(out, ref):
    if out.isnan().any():
        return float("nan")
    return float(((out.double() - ref).norm() / ref.norm()).item())


def dense(m, n, k, sweep: bool):
    torch.manual_seed(m + n + k)
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
    ref = F.reference(a, sa, b, sb)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    shape = f"{m}x{n}x{k}"
    default = F.default_config(m, n, torch.cuda.get_device_capability()[0], k)
    runs = [("tilejit default " + str(default), lambda: F.fp8_blockscaled_matmul(a, sa, b, sb, out=out)),
            ("torch block-wise _scaled_mm", _torch_blockwise(a, sa, b, sb, out))]
    for label, run in runs:
        out.fill_(float("nan"))
        run()
        err = check(out, ref)
        host = do_bench(run)
        graph = do_bench_cudagraph(run)
        print(f"| {shape} | {label} | {host * 1e3:.1f} | {tflops(m, n, k, host):.0f} | {graph * 1e3:.1f} | "
              f"{tflops(m, n, k, graph):.0f} | {err:.1e} |", flush=True)
    if not sweep:
        return
    best = []
    for cfg in sweep_configs(m, n):
        try:
            out.fill_(float("nan"))
            F.fp8_blockscaled_matmul(a, sa, b, sb, out=out, **cfg)
            err = check(out, ref)
            if not err < 5e-3:
                print(f"  {shape} {cfg}: WRONG err {err}", flush=True)
                continue
            ms = do_bench_cudagraph(lambda: F.fp8_blockscaled_matmul(a, sa, b, sb, out=out, **cfg))
        except Exception as e:  # noqa: BLE001 - a config that does not build is a row, not the end
            print(f"  {shape} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            continue
        best.append((ms, cfg))
        print(f"  {shape} {cfg}: {ms * 1e3:.1f} us {tflops(m, n, k, ms):.0f} TFLOP/s", flush=True)
    best.sort(key=lambda t: t[0])
    for ms, cfg in best[:5]:
        print(f"BEST {shape}: {tflops(m, n, k, ms):.0f} TFLOP/s {ms * 1e3:.1f} us {cfg}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    print(torch.cuda.get_device_name())
    print("| shape | what | host-timed us | TFLOP/s | graph-timed us | TFLOP/s | err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes.split(","):
        m, n, k = map(int, shape.split("x"))
        dense(m, n, k, not args.no_sweep)


if __name__ == "__main__":
    main()
