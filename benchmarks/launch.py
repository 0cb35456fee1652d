"""Host-side costs: launch overhead, cold compile, disk-cache hit, and import time.

    python -m benchmarks.launch [--launches 1000] [--reps 15] [--out DIR]

- Launch overhead: a tiny kernel with four tensor arguments (1 element each) and two ints, launched N times in
  a row from Python; host time / N, median over --reps repetitions, the launchers taking turns. Against tilejit's
  Python launch path, Triton (same kernel), torch ``x.add_(1)``, and the bare driver call every launcher ends in
  (cuLaunchKernel with the parameters packed once, from a C loop, or a ctypes loop without the compiled launcher).
- Cold compile: the DESIGN.md matmul (128x128x32, 4 warps, 3 stages, 1024^3 fp16) in a fresh process with an
  empty TILEJIT_CACHE_DIR: time from after the imports and input set-up to the first launch's completion, and
  the compile seconds recorded in the cache entry.
- Disk hit: the same in fresh processes that find the entry on disk.
- Import: ``import tilejit`` on top of an imported torch, fresh processes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import (DEFAULT_OUT, RUN_LOG_PATH, append_results, machine_stamp, markdown_table,
                               stamp_line, write_json)

REPO_ROOT = Path(__file__).resolve().parent.parent

# Run in a fresh interpreter: first launch of the DESIGN.md matmul, timed after imports and input set-up.
_FIRST_LAUNCH = """
import json, time
import torch
import tilejit
from benchmarks.kernels import matmul
a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
b = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
c = torch.empty(1024, 1024, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
meta = dict(BM=128, BN=128, BK=32, num_warps=4, num_stages=3)
t0 = time.perf_counter()
matmul.kernel[(8, 8)](a, b, c, **meta)
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
compiled = matmul.kernel.compile(a, b, c, **meta)  # the in-memory entry the launch made
print(json.dumps({"seconds": seconds, "from_disk": compiled.from_disk,
                  "compile_seconds": compiled.meta.get("compile_seconds")}))
"""

_IMPORT = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import tilejit
t2 = time.perf_counter()
print(json.dumps({"torch": t1 - t0, "tilejit": t2 - t1}))
"""


def loop_timer(launch: Callable[[], Any]) -> Callable[[int], float]:
    """A timer of ``launch``: host microseconds per call over ``n`` back-to-back calls."""
    def timed(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            launch()
        return (time.perf_counter() - t0) / n * 1e6
    return timed


def host_overheads(launchers: dict[str, Callable[[], Any]], launches: int, reps: int,
                   timers: dict[str, Callable[[int], float]] | None = None) -> dict[str, dict[str, float]]:
    """Median microseconds of host time per launch of each launcher over ``reps`` runs of ``launches`` back-to-back
    launches (the GPU synchronized before and after each run, outside the timing).

    The launchers take turns (the order rotates every repetition) after each has run once and then a shared
    warm-up of about a second, so a slow stretch of a shared host, or GPU clocks still ramping up, lands on all
    of them alike. ``timers`` are measured in the same rotation: each returns microseconds per launch for a count
    of launches it makes itself.

    Not used: timing launches queued behind a GPU kept busy by ``torch.cuda._sleep``. On the H200 host that made
    tilejit's and the bare driver call's launches 1.6-2.3x slower (13.2 and 5.6 us) while torch's and Triton's
    barely moved, so it measures something about long launch queues rather than the launcher.
    """
    import torch

    def synced(timer: Callable[[int], float]) -> Callable[[int], float]:
        def timed(n: int) -> float:
            torch.cuda.synchronize()
            us = timer(n)
            torch.cuda.synchronize()
            return us
        return timed

    all_timers = {name: loop_timer(launch) for name, launch in launchers.items()} | (timers or {})
    measured = {name: synced(timer) for name, timer in all_timers.items()}
    for timed in measured.values():
        timed(10)  # first calls (a JIT's compile) outside the warm-up's time limit
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:
        for timed in measured.values():
            timed(launches)
    samples: dict[str, list[float]] = {name: [] for name in measured}
    names = list(measured)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            samples[name].append(measured[name](launches))
    return {name: {"us_per_launch": statistics.median(samples[name]), "min_us_per_launch": min(samples[name])}
            for name in names}


def driver_floor_timer() -> tuple[str, Callable[[int], float]]:
    """(name, timer) of the benchmark kernel's bare cuLaunchKernel with its parameters packed once: from a C loop
    (``_launch.c``'s ``time_driver_launches``) when the compiled launcher is loaded, else through ctypes in a
    Python loop. The timer returns microseconds per launch for ``n`` launches: the floor under any launcher."""
    import torch

    from benchmarks import kernels
    from tilejit.runtime import native

    x, y, z, w = (torch.ones(1, device="cuda") for _ in range(4))
    args, kwargs = (x, y, z, w, 1, 0), {"BLOCK": 32, "num_warps": 1}
    for _ in range(2):  # the first launch compiles and makes the dispatcher, the second registers its entry
        kernels.tiny[(1,)](*args, **kwargs)
    module = native.ready()
    if module is not None and kernels.tiny._dispatcher is not None:
        def timed(n: int) -> float:
            return module.time_driver_launches(kernels.tiny._dispatcher, n, torch.cuda.current_stream().cuda_stream,
                                               args, kwargs)
        return "cuLaunchKernel alone (C loop)", timed
    signature, values, _ = kernels.tiny._fast_args(args, kwargs)
    launcher = kernels.tiny._fast[signature]
    launcher((1, 1, 1), torch.cuda.current_stream().cuda_stream, values)  # packs this thread's buffer
    params, raw = launcher._per_thread.slot[1], launcher._raw_launch

    def timed_ctypes(n: int) -> float:
        stream = torch.cuda.current_stream().cuda_stream
        t0 = time.perf_counter()
        for _ in range(n):
            raw(1, 1, 1, stream, params)
        return (time.perf_counter() - t0) / n * 1e6

    return "cuLaunchKernel alone (ctypes loop)", timed_ctypes


def _launchers() -> dict[str, Callable[[], Any] | str]:
    """name -> zero-argument launch, or the reason it is unavailable."""
    import torch

    import tilejit
    from benchmarks import kernels
    from tilejit.runtime import native

    native.load()  # built now rather than in the background during the timed launches (a fresh cache dir)
    x, y, z, w = (torch.ones(1, device="cuda") for _ in range(4))
    out: dict[str, Callable[[], Any] | str] = {}
    grid = (1,)
    out["tilejit"] = lambda: kernels.tiny[grid](x, y, z, w, 1, 0, BLOCK=32, num_warps=1)
    # The same kernel through the Python launch path (what runs where the compiled launcher cannot be built): the
    # switch is read at a kernel's first GPU launch.
    python_path = tilejit.kernel(kernels.tiny.fn)
    previous = os.environ.get("TILEJIT_NATIVE_LAUNCH")
    os.environ["TILEJIT_NATIVE_LAUNCH"] = "0"
    try:
        python_path[grid](x, y, z, w, 1, 0, BLOCK=32, num_warps=1)
    finally:
        if previous is None:
            del os.environ["TILEJIT_NATIVE_LAUNCH"]
        else:
            os.environ["TILEJIT_NATIVE_LAUNCH"] = previous
    assert python_path._dispatcher is None and python_path._native_off
    out["tilejit, Python launch path"] = lambda: python_path[grid](x, y, z, w, 1, 0, BLOCK=32, num_warps=1)
    # The same kernel under @tilejit.autotune (two configs, keyed on n): after the first call tunes, a launch is a
    # key lookup plus the chosen config's launch.
    configs = [tilejit.Config({"BLOCK": 32}, num_warps=1), tilejit.Config({"BLOCK": 64}, num_warps=1)]
    tuned = tilejit.autotune(configs=configs, key=["n"])(tilejit.kernel(kernels.tiny.fn))
    tuned[grid](x, y, z, w, 1, 0)
    out["tilejit, autotuned (2 configs)"] = lambda: tuned[grid](x, y, z, w, 1, 0)

    def grid_fn(meta):  # a grid computed from the chosen config, as matmul launches do
        return (tilejit.cdiv(meta["X"].shape[0], meta["BLOCK"]),)

    tuned[grid_fn](x, y, z, w, 1, 0)
    out["tilejit, autotuned, grid function"] = lambda: tuned[grid_fn](x, y, z, w, 1, 0)
    try:
        from benchmarks import triton_kernels
    except Exception as error:  # noqa: BLE001 - report, do not fail
        out["triton"] = f"unavailable: {type(error).__name__}: {error}"
    else:
        out["triton"] = lambda: triton_kernels.tiny[grid](x, y, z, w, 1, 0, BLOCK=32, num_warps=1)
    out["torch x.add_(1)"] = lambda: x.add_(1)
    return out


def _run_python(code: str, env_extra: dict[str, str], timeout: float = 300) -> dict[str, Any]:
    env = {**os.environ, **env_extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_launch_times(cold_runs: int, hit_runs: int) -> dict[str, Any]:
    """Cold (empty cache dir each time) and disk-hit (the last cold run's dir) first launches, fresh processes."""
    cold, hit = [], []
    with tempfile.TemporaryDirectory(prefix="tilejit-bench-") as root:
        for i in range(cold_runs):
            cache = Path(root) / f"cold{i}"
            cold.append(_run_python(_FIRST_LAUNCH, {"TILEJIT_CACHE_DIR": str(cache)}))
        for _ in range(hit_runs):
            hit.append(_run_python(_FIRST_LAUNCH, {"TILEJIT_CACHE_DIR": str(cache)}))
    if any(r["from_disk"] for r in cold) or not all(r["from_disk"] for r in hit):
        raise RuntimeError(f"cache behaved unexpectedly: cold runs {cold}, disk-hit runs {hit}")
    return {
        "cold_ms": statistics.median(r["seconds"] for r in cold) * 1e3,
        "cold_compile_ms": statistics.median(r["compile_seconds"] for r in cold) * 1e3,
        "disk_hit_ms": statistics.median(r["seconds"] for r in hit) * 1e3,
        "cold_runs": cold, "hit_runs": hit,
    }


def import_times(runs: int) -> dict[str, Any]:
    samples = [_run_python(_IMPORT, {}) for _ in range(runs)]
    return {"tilejit_ms": statistics.median(s["tilejit"] for s in samples) * 1e3,
            "torch_ms": statistics.median(s["torch"] for s in samples) * 1e3, "runs": samples}


def _attempt(what: str, fn: Callable[[], Any], errors: list[str]) -> Any:
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - each measurement stands alone
        errors.append(f"{what}: {type(error).__name__}: {str(error)[-1500:]}")
        print(f"# {what} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=1000, help="launches per repetition (default 1000)")
    parser.add_argument("--reps", type=int, default=15, help="repetitions; the median is reported (default 15)")
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh processes with an empty cache (default 3)")
    parser.add_argument("--hit-runs", type=int, default=5, help="fresh processes hitting the disk cache (default 5)")
    parser.add_argument("--import-runs", type=int, default=5, help="fresh processes timing imports (default 5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for launch.json (default {DEFAULT_OUT})")
    parser.add_argument("--results", type=Path, default=RUN_LOG_PATH, help="Markdown file the table is appended to")
    parser.add_argument("--no-append", action="store_true", help="do not append to the run log")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("benchmarks.launch: no CUDA GPU visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    meta = machine_stamp()
    print(f"# launch costs on {meta['gpu']}, CPU {meta['cpu']}; {stamp_line(meta)}", flush=True)
    errors: list[str] = []  # measurements that failed: exit status 1
    notes: list[str] = []  # unavailable baselines (no Triton): reported, not a failure
    rows: list[list[Any]] = []
    results: dict[str, Any] = {"meta": meta, "launch": {}}

    available: dict[str, Callable[[], Any]] = {}
    for name, launch in _launchers().items():
        if isinstance(launch, str):
            notes.append(f"{name}: {launch}")
            rows.append([f"launch overhead: {name}", "n/a", launch[:120]])
        else:
            available[name] = launch

    floor_name, floor_timer = driver_floor_timer()
    timers = {floor_name: floor_timer}
    measured = _attempt("launch overheads", lambda: host_overheads(available, args.launches, args.reps, timers),
                        errors) or {}
    for name, r in measured.items():
        results["launch"][name] = r
        if name == floor_name:
            results["driver_floor_us"] = r["us_per_launch"]
            rows.append([name, f"{r['us_per_launch']:.2f} us",
                         f"same kernel, parameters packed once, nothing but the driver call in the loop: the floor "
                         f"under any launcher on this host; median of {args.reps} x {args.launches}"])
        else:
            rows.append([f"launch overhead: {name}", f"{r['us_per_launch']:.2f} us",
                         f"host time, median of {args.reps} x {args.launches} back-to-back launches, launchers "
                         f"taking turns (min {r['min_us_per_launch']:.2f} us)"])
        print(f"{name}: {r['us_per_launch']:.2f} us (min {r['min_us_per_launch']:.2f})", flush=True)

    from benchmarks import kernels
    from tilejit.runtime import native

    dispatcher = kernels.tiny._dispatcher
    results["native_launcher"] = "active" if dispatcher is not None else f"unavailable: {native.failure()}"
    print(f"compiled launcher: {results['native_launcher']}", flush=True)
    if dispatcher is not None:
        results["native_stats"] = stats = dispatcher.stats()
        if stats["fallbacks"] or stats["hits"] < args.launches * args.reps:
            errors.append(f"the timed tilejit launches did not all take the compiled launcher: {stats}")

    first = _attempt("first launch", lambda: first_launch_times(args.cold_runs, args.hit_runs), errors)
    results["first_launch"] = first
    if first is not None:
        rows.append(["cold compile + first launch, DESIGN matmul 128x128x32 fp16", f"{first['cold_ms']:.0f} ms",
                     f"fresh process, empty cache dir; compile_seconds in the entry {first['cold_compile_ms']:.0f} ms; "
                     f"median of {args.cold_runs}"])
        rows.append(["disk-cache hit + first launch, same kernel", f"{first['disk_hit_ms']:.1f} ms",
                     f"fresh process; frontend + cache read + module load + launch; median of {args.hit_runs}"])
        print(f"cold {first['cold_ms']:.0f} ms (compile {first['cold_compile_ms']:.0f} ms), "
              f"disk hit {first['disk_hit_ms']:.1f} ms", flush=True)

    imports = _attempt("import times", lambda: import_times(args.import_runs), errors)
    results["imports"] = imports
    if imports is not None:
        rows.append(["import tilejit after import torch", f"{imports['tilejit_ms']:.0f} ms",
                     f"fresh processes, median of {args.import_runs}; "
                     f"import torch itself {imports['torch_ms']:.0f} ms"])
        print(f"import tilejit {imports['tilejit_ms']:.0f} ms (torch {imports['torch_ms']:.0f} ms)", flush=True)

    results["errors"], results["notes"] = errors, notes
    path = write_json(args.out / "launch.json", results)
    table = markdown_table(["measurement", "value", "how"], rows)
    print()
    print(table)
    print(f"wrote {path}")
    if not args.no_append:
        title = "host costs: launch, compile, cache hit, import"
        print(f"appended to {append_results(title, table, meta, args.results, notes + errors)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
