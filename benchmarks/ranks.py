"""Many ranks, one cache: time to first launch and tuning time of a multi-GPU job.

    python -m benchmarks.ranks [--world 4] [--out DIR] [--remote redis://127.0.0.1:PORT/0]

Each phase spawns ``--world`` fresh processes (one per GPU, NCCL), all sharing one cache directory as the ranks
of one host do, and times on every rank, from after ``init_process_group`` and input set-up to the results
being on the GPU, the first launch of "the set": the autotuned DESIGN matmul (fp16, 4096^3; its default space)
and the attention forward and backward (bf16, B=4, H=16, S=4096, D=128, causal). The slowest rank's time is the
job's. Phases:

- ``cold, 1 rank``: an empty cache, one process: the tuning time of a job that does not split it;
- ``cold``: an empty cache, all ranks: the configs are split among the ranks and the timings pooled;
- ``warm disk``: the same directory again (a restarted job on the same host);
- ``imported bundle``: a fresh directory filled by ``tilejit cache import`` of the cold phase's export (a host
  that never compiles; NVRTC is made unloadable in these processes to prove it);
- ``warm remote``: a fresh directory with ``--remote`` (a Redis the cold phase filled): a second host.
  Skipped, and said so, without a Redis.

Every rank reports its matmul choice; the phase fails unless all ranks chose the same config, and each rank checks
its matmul against a float64 reference on its own random inputs.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import DEFAULT_OUT, append_results, machine_stamp, markdown_table, write_json

REPO_ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _without_nvrtc() -> None:
    """This process cannot load NVRTC: every question to the library fails as a missing libnvrtc does."""
    from tilejit.backend_cuda import nvrtc
    from tilejit.errors import BackendUnavailableError

    def unloadable():
        raise BackendUnavailableError("cannot load the NVRTC library (made unloadable by benchmarks.ranks)")

    nvrtc._nvrtc = unloadable
    nvrtc._recorded_version = lambda: None
    nvrtc.nvrtc_version.cache_clear()
    nvrtc._library_version.cache_clear()


def _rank_main(rank: int, world: int, port: int, cache: str, remote: str | None, no_nvrtc: bool,
               out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ["TILEJIT_CACHE_DIR"] = cache
    if remote:
        os.environ["TILEJIT_REMOTE_CACHE"] = remote
    else:
        os.environ.pop("TILEJIT_REMOTE_CACHE", None)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if world > 1 else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, device_id=torch.device("cuda", rank) if world > 1 else None)
    try:
        if no_nvrtc:
            _without_nvrtc()
        from benchmarks.kernels import matmul, matmul_grid
        from tilejit.ops import attention

        gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16, generator=gen)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16, generator=gen)
        c = torch.full((4096, 4096), float("nan"), device="cuda", dtype=torch.float16)
        q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=gen,
                               requires_grad=True) for _ in range(3))
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        matmul[matmul_grid](a, b, c)
        torch.cuda.synchronize()
        matmul_s = time.perf_counter() - start
        o = attention(q, k, v, causal=True)
        o.backward(torch.ones_like(o))
        torch.cuda.synchronize()
        total_s = time.perf_counter() - start
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        choices = [None] * world
        dist.all_gather_object(choices, str(matmul.best_config))
        from tilejit.cache.kernel_cache import origin_counts

        origins = {name: n for name, n in origin_counts().items() if n and name != "memory"}
        stats = matmul.stats
        report = {"rank": rank, "matmul_s": matmul_s, "compile_s": stats.compile_s, "bench_s": stats.bench_s,
                  "configs_compiled": len(stats.compiled), "configs_timed": len(stats.timed), "total_s": total_s, "error": err, "choices": choices,
                  "origins": origins, "attention_finite": bool(torch.isfinite(o).all() and torch.isfinite(q.grad).all())}
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def run_phase(name: str, world: int, cache: Path, out: Path, remote: str | None = None,
              no_nvrtc: bool = False) -> dict:
    import torch.multiprocessing as mp

    phase_out = out / name.replace(" ", "-").replace(",", "")
    phase_out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    mp.spawn(_rank_main, args=(world, _free_port(), str(cache), remote, no_nvrtc, str(phase_out)), nprocs=world,
             join=True)
    wall = time.perf_counter() - wall
    reports = [json.loads((phase_out / f"rank{r}.json").read_text()) for r in range(world)]
    choices = {choice for r in reports for choice in r["choices"]}
    return {"phase": name, "world": world, "wall_s": wall,
            "matmul_s": max(r["matmul_s"] for r in reports),
            "compile_s": max(r["compile_s"] for r in reports), "bench_s": max(r["bench_s"] for r in reports),
            "configs_per_rank": max(r["configs_compiled"] for r in reports), "total_s": max(r["total_s"] for r in reports),
            "max_error": max(r["error"] for r in reports), "one_choice": len(choices) == 1,
            "choice": sorted(choices)[0],
            "origins": {name: sum(r["origins"].get(name, 0) for r in reports)
                        for name in sorted({n for r in reports for n in r["origins"]})},
            "finite": all(r["attention_finite"] for r in reports)}


def _cli(*args: str, cache: Path) -> None:
    env = {**os.environ, "TILEJIT_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-m", "tilejit.cli", "cache", *args], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--remote", default=os.environ.get("TILEJIT_REMOTE_CACHE"),
                        help="a Redis URL for the warm-remote phase (TILEJIT_REMOTE_CACHE_KEY must name a key file)")
    args = parser.parse_args(argv)
    import torch

    world = min(args.world, torch.cuda.device_count())
    if world < 2:
        print(f"benchmarks.ranks needs 2 or more GPUs; this machine has {torch.cuda.device_count()}")
        return 1
    work = Path(tempfile.mkdtemp(prefix="tilejit-ranks-"))
    rows = [run_phase("cold, 1 rank", 1, work / "one", args.out)]
    rows.append(run_phase("cold", world, work / "host-a", args.out, remote=args.remote))
    rows.append(run_phase("warm disk", world, work / "host-a", args.out))
    _cli("export", str(work / "kernels.tar"), cache=work / "host-a")
    _cli("import", str(work / "kernels.tar"), cache=work / "host-c")
    rows.append(run_phase("imported bundle", world, work / "host-c", args.out, no_nvrtc=True))
    if args.remote:
        rows.append(run_phase("warm remote", world, work / "host-b", args.out, remote=args.remote))
    meta = machine_stamp()
    table = markdown_table(
        ["phase", "ranks", "matmul first launch s", "of it compiling s", "of it timing s", "configs per rank",
         "set first launch s", "wall s", "one choice", "kernels by origin (all ranks)",
         "matmul err"],
        [[r["phase"], r["world"], round(r["matmul_s"], 2), round(r["compile_s"], 2), round(r["bench_s"], 2),
          r["configs_per_rank"], round(r["total_s"], 2), round(r["wall_s"], 1),
          "yes" if r["one_choice"] else "NO", " ".join(f"{k} {v}" for k, v in r["origins"].items()), f"{r['max_error']:.1e}"] for r in rows])
    split = rows[1]["matmul_s"] / rows[0]["matmul_s"]
    notes = [f"split tuning: {world} ranks took {split:.2f}x the time of one (matmul first launch, cold)",
             f"matmul choice: {rows[1]['choice']}"]
    if not args.remote:
        notes.append("warm remote: not run (no --remote Redis given)")
    print(table)
    print("\n".join(notes))
    write_json(args.out / "ranks.json", {"meta": meta, "rows": rows, "notes": notes})
    append_results(f"Ranks: time to first launch ({world} GPUs)", table, meta, notes=notes)
    ok = all(r["one_choice"] and r["finite"] and r["max_error"] < 1e-2 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
