"""Launch one stream-K matmul many times with a NaN-poisoned output and report every launch that leaves a tile
unwritten (NaN) or wrong, with the tiles affected and the tile counters left behind. It found a
stream-K failure (2026-11-26, NVIDIA H200): run beside other processes, the first launch lost counter arrivals when the workspace's zero
fill ran on another stream than the launch's (runtime/launch.stream_k_workspace).

    python scripts/probes/stream_k_stress.py [M N K BM BN BK WARPS STAGES] [--launches 300] [--poison-workspace]
                                      [--fresh-workspace] [--preallocate] [--sync-first]
"""
from __future__ import annotations

import argparse
import sys

import torch

import tilejit

sys.path.insert(0, "tests")
from kernels import matmul  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dims", nargs="*", type=int, default=[128, 4096, 4096, 128, 256, 64, 8, 4])
    p.add_argument("--launches", type=int, default=300)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--poison-workspace", action="store_true",
                   help="fill the stream-K partial-sum workspace with NaN before every launch")
    p.add_argument("--preallocate", action="store_true",
                   help="allocate the stream's workspace (zeroed counters) and synchronize before the first launch")
    p.add_argument("--sync-first", action="store_true", help="synchronize the device right before the first launch")
    p.add_argument("--fresh-workspace", action="store_true",
                   help="drop the workspace before every launch (each launch allocates its own, as the first does)")
    args = p.parse_args()
    m, n, k, bm, bn, bk, warps, stages = args.dims
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    ref = (a.double() @ b.double()).float()
    c = torch.empty(m, n, device="cuda", dtype=dtype)
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, stream_k=True)
    grid = (tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))
    bad = 0
    noise = torch.empty(64 << 20, device="cuda", dtype=torch.uint8)
    from tilejit.runtime import launch as rt_launch
    if args.preallocate:
        meta = matmul.compile(a, b, c, **kw).meta
        programs = int(meta["stream_k"])
        rt_launch.stream_k_workspace(torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream,
                                     programs * int(meta["stream_k_slot_bytes"]),
                                     programs * int(meta["stream_k_flags"]))
        torch.cuda.synchronize()
    if args.sync_first:
        matmul.compile(a, b, c, **kw)
        torch.cuda.synchronize()
    for i in range(args.launches):
        c.fill_(float("nan"))
        if i % 3 == 0:  # other work on the GPU between launches (allocator churn, poisoned memory)
            noise.random_()
            del noise
            noise = torch.full((64 << 18,), float("nan"), device="cuda")
        if args.fresh_workspace:
            rt_launch._WORKSPACES.clear()
        if args.poison_workspace:
            for data, _ in rt_launch._WORKSPACES.values():
                data.view(torch.float32)[: data.numel() // 4].fill_(float("nan"))
        matmul[grid](a, b, c, **kw)
        torch.cuda.synchronize()
        nan = torch.isnan(c)
        err = (c.float() - ref).abs().nan_to_num(0).max().item()
        if nan.any() or err > 1e-2 * ref.abs().max().item():
            bad += 1
            tiles = sorted({(int(r) // bm, int(cc) // bn) for r, cc in nan.nonzero()[:4096].tolist()})
            print(f"launch {i}: {int(nan.sum())} NaN, max err {err:.3g}, tiles {tiles[:20]}", flush=True)
            for _, flags in rt_launch._WORKSPACES.values():  # tiles whose count did not complete
                counters = flags.view(torch.int64).cpu()
                left = [(j, int(x) >> 32, int(x) & 0xffffffff) for j, x in enumerate(counters.tolist()) if x]
                print(f"    counters left (index, epoch, count): {left[:20]}", flush=True)
            compiled = matmul.compile(a, b, c, **kw)
            print("    from disk:", compiled.from_disk, {key: compiled.meta.get(key) for key in (
                "persistent", "stream_k", "stream_k_slot_bytes", "stream_k_flags", "compile_seconds", "spills",
                "registers", "shared_bytes")}, flush=True)
    print(f"{bad} bad launches of {args.launches} ({m}x{n}x{k}, {bm}x{bn}x{bk} w{warps} s{stages}, {dtype})")


if __name__ == "__main__":
    main()
