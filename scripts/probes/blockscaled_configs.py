"""Where block-scaled fp8's time goes: ``fp8_blockscaled_matmul`` / ``_grouped_matmul`` on DeepSeek-V3's shapes,
each launch timed two ways (``do_bench``: the Python call, L2 flushed, as ``benchmarks.fp8_blockscaled`` does;
``do_bench_cudagraph``: the kernel alone, replayed from a CUDA graph), beside torch's block-wise ``_scaled_mm``
timed the same two ways, then a sweep of tile / ring / launch-option configs (graph-timed, each checked against
the float64 reference first). A probe, not a benchmark.

    python scripts/probes/blockscaled_configs.py [--shapes 128x7168x2048,...] [--no-sweep]
    python scripts/probes/blockscaled_configs.py --widths | --orders | --grouped-cost [--shapes ...]

``--orders``: the defaults under tile orders (``GROUP_M``), dense and grouped. ``--grouped-cost``: what the
grouped kernel pays over the dense one. ``--widths``: per shape, 128 against 256 columns a tile (persistent,
stream-K, and 256 specialized), dense and grouped (8 experts, as ``benchmarks.fp8_blockscaled`` draws them),
beside torch, graph-timed, with the default's choice.
"""
import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tilejit  # noqa: E402
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


def _experts(m, n, k, experts):
    """Group offsets of ``experts`` experts sharing ``m`` rows raggedly (as ``benchmarks.fp8_blockscaled`` draws
    them), and their quantized (experts, n, k) weights with scales."""
    weights = torch.rand(experts) + 0.5
    counts = (weights / weights.sum() * m).long()
    counts[-1] += m - int(counts.sum())
    offsets = torch.tensor([0] + counts.cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    return (offsets, *quantize(torch.randn(experts, n, k, device="cuda"), 128))


def widths(m, n, k, no_grouped=False):
    torch.manual_seed(m + n + k)
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
    ref = F.reference(a, sa, b, sb)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    shape = f"{m}x{n}x{k}"
    major = torch.cuda.get_device_capability()[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = F.default_config(m, n, major, k, sms)
    runs = [("torch block-wise _scaled_mm", _torch_blockwise(a, sa, b, sb, out))]
    for cfg in (dict(BN=128, persistent=True), dict(BN=256, persistent=True), dict(BN=256, warp_specialize=True),
                dict(BN=128, stream_k=True), dict(BN=256, stream_k=True)):
        cfg = dict(BM=128, STAGES=4, num_warps=8, **cfg)
        mark = " (default)" if cfg == default else ""
        runs.append((f"{cfg}{mark}", lambda cfg=cfg: F.fp8_blockscaled_matmul(a, sa, b, sb, out=out, **cfg)))
    for label, run in runs:
        out.fill_(float("nan"))
        run()
        ms = do_bench_cudagraph(run)
        print(f"| dense {shape} | {label} | {ms * 1e3:.1f} | {tflops(m, n, k, ms):.0f} | {check(out, ref):.1e} |",
              flush=True)
    if m < 1024 or no_grouped:
        return
    experts = 8
    torch.manual_seed(m + n + k + 1)
    offsets, bg, sbg = _experts(m, n, k, experts)
    ref = F.grouped_reference(a, sa, bg, sbg, offsets)
    default = F.grouped_config(m, n, experts, major, sms)
    for bn in (128, 256):
        cfg = dict(BM=128, BN=bn, STAGES=4, num_warps=8, persistent=True)
        mark = " (default)" if cfg == default else ""

        def run(cfg=cfg):
            F.fp8_blockscaled_grouped_matmul(a, sa, bg, sbg, offsets, out=out, **cfg)
        out.fill_(float("nan"))
        run()
        ms = do_bench_cudagraph(run)
        print(f"| grouped {shape} | {cfg}{mark} | {ms * 1e3:.1f} | {tflops(m, n, k, ms):.0f} | "
              f"{check(out, ref):.1e} |", flush=True)


def grouped_cost(m, n, k):
    """What the grouped kernel pays over the dense one: the same m x n x k as a dense product, as one expert, and
    as 8 experts of m / 8 rows each (whole tiles: no rows wasted), all 128x128 specialized, graph-timed."""
    torch.manual_seed(m + n + k)
    experts = 8
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    bg, sbg = quantize(torch.randn(experts, n, k, device="cuda"), 128)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    cfg = dict(BM=128, BN=128, STAGES=4, num_warps=8, warp_specialize=True)
    one = torch.tensor([0, m], dtype=torch.int32, device="cuda")
    even = torch.arange(0, m + 1, m // experts, dtype=torch.int32, device="cuda")
    runs = [("dense", lambda: F.fp8_blockscaled_matmul(a, sa, bg[0], sbg[0], out=out, **cfg)),
            ("dense persistent", lambda: F.fp8_blockscaled_matmul(a, sa, bg[0], sbg[0], out=out,
                                                                  **dict(cfg, warp_specialize=False,
                                                                         persistent=True))),
            ("grouped, 1 expert", lambda: F.fp8_blockscaled_grouped_matmul(a, sa, bg[:1], sbg[:1], one, out=out,
                                                                           **cfg)),
            ("grouped, 8 experts of m/8", lambda: F.fp8_blockscaled_grouped_matmul(a, sa, bg, sbg, even, out=out,
                                                                                   **cfg))]
    for label, run in runs:
        out.fill_(float("nan"))
        run()
        ms = do_bench_cudagraph(run)
        print(f"| {m}x{n}x{k} | {label} | {ms * 1e3:.1f} | {tflops(m, n, k, ms):.0f} | "
              f"{'nan' if out.isnan().any() else 'ok'} |", flush=True)


def orders(m, n, k):
    """The op's defaults under tile orders: ``GROUP_M`` row tiles a group (4, 8, 16) and the row-first walk (one
    group of every row tile), dense and grouped (8 experts drawn as ``benchmarks.fp8_blockscaled`` draws them),
    graph-timed."""
    torch.manual_seed(m + n + k)
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = F.reference(a, sa, b, sb)
    experts = 8
    offsets, bg, sbg = _experts(m, n, k, experts)
    gref = F.grouped_reference(a, sa, bg, sbg, offsets)
    major, sms = torch.cuda.get_device_capability()[0], torch.cuda.get_device_properties(0).multi_processor_count
    dense_cfg = F.default_config(m, n, major, k, sms)
    grouped_cfg = F.grouped_config(m, n, experts, major, sms)
    dense_grid = (tilejit.cdiv(m, dense_cfg["BM"]) * tilejit.cdiv(n, dense_cfg["BN"]),)
    row_tiles = tilejit.cdiv(m, grouped_cfg["BM"]) + experts
    tiles = torch.empty((row_tiles, 3), dtype=torch.int32, device="cuda")
    F.grouped_row_tiles[(row_tiles,)](offsets, tiles, experts, BM=grouped_cfg["BM"], num_warps=1)
    grouped_grid = (row_tiles * tilejit.cdiv(n, grouped_cfg["BN"]),)
    for group_m in (4, 8, 16, 1 << 20):
        label = "row-first" if group_m == 1 << 20 else f"GROUP_M={group_m}"
        for kind, run, want in (
                ("dense", lambda: F.blockscaled_mm[dense_grid](a, sa, b, sb, out, GROUP_M=group_m, **dense_cfg),
                 ref),
                ("grouped", lambda: F.blockscaled_grouped_mm[grouped_grid](a, sa, bg, sbg, out, tiles,
                                                                           GROUP_M=group_m, **grouped_cfg),
                 gref)):
            out.fill_(float("nan"))
            run()
            err = check(out, want)
            ms = do_bench_cudagraph(run)
            print(f"| {kind} {m}x{n}x{k} | {label} | {ms * 1e3:.1f} | {tflops(m, n, k, ms):.0f} | {err:.1e} |",
                  flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--widths", action="store_true")
    parser.add_argument("--grouped-cost", action="store_true")
    parser.add_argument("--orders", action="store_true")
    parser.add_argument("--no-grouped", action="store_true", help="--widths: dense rows only")
    args = parser.parse_args()
    print(torch.cuda.get_device_name())
    if args.orders:
        print("| shape | order | graph-timed us | TFLOP/s | err |\n| --- | --- | --- | --- | --- |")
        for shape in args.shapes.split(","):
            orders(*map(int, shape.split("x")))
        return
    if args.grouped_cost:
        print("| shape | what | graph-timed us | TFLOP/s | all written |\n| --- | --- | --- | --- | --- |")
        for shape in args.shapes.split(","):
            grouped_cost(*map(int, shape.split("x")))
        return
    if args.widths:
        print("| shape | what | graph-timed us | TFLOP/s | err |\n| --- | --- | --- | --- | --- |")
        for shape in args.shapes.split(","):
            widths(*map(int, shape.split("x")), no_grouped=args.no_grouped)
        return
    print("| shape | what | host-timed us | TFLOP/s | graph-timed us | TFLOP/s | err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes.split(","):
        m, n, k = map(int, shape.split("x"))
        dense(m, n, k, not args.no_sweep)


if __name__ == "__main__":
    main()
