"""Matmul TFLOP/s: tilejit (autotuned) vs torch.matmul (cuBLAS) vs Triton, in one run on one GPU.

    python -m benchmarks.matmul [--quick] [--dtypes fp16,bf16] [--shapes 4096x4096x4096,...] [--out DIR]
                                [--sm80-path]

Before timing, every implementation's output is compared with cuBLAS's (max abs error relative to the largest
|reference| value); a mismatch is reported as FAIL and not timed. Times are medians of ``tilejit.testing.do_bench``
(CUDA events, L2 flushed before every run). Writes ``matmul.json`` (after every shape, so an interrupted run
keeps what it measured) and, with matplotlib, ``matmul.png`` into --out; appends the table to the run log,
benchmarks/history/runs.md.

``--dtypes fp8`` times both fp8 modes, each against its like (``fp8-precise``: tilejit's default, whose wgmma sums
are promoted into float32, against ``torch._scaled_mm``'s default; ``fp8-fast``: ``precision="fast"`` against
``_scaled_mm(use_fast_accum=True)``), and adds a table with each one's error against float64 and its share of the
dense fp8 peak.

``--sm80-path`` adds a column on Hopper GPUs: the same matmul through the sm_80 path (``kernels.SM80_PINS``:
mma.sync and cp.async pinned, the config space of an sm_80 GPU), tuned and timed in the same run.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import (DEFAULT_OUT, RUN_LOG_PATH, append_results, bar_chart, fmt, machine_stamp,
                               markdown_table, matmul_tflops, stamp_line, write_json)

Shape = tuple[int, int, int]

# The quick set: large squares, a short K and a ragged shape (--quick runs only these).
QUICK_SHAPES: list[Shape] = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (1000, 3000, 777)]
# The sweep: squares, LLM projections (decode to prefill M against the N, K of Llama-7B: attention 4096 x
# 4096, MLP up 11008 x 4096 and down 4096 x 11008; and of Llama-2-70B: attention output 8192 x 8192, MLP up 28672 x
# 8192 and down 8192 x 28672), a ragged shape.
LLAMA_NK: list[tuple[int, int]] = [(4096, 4096), (11008, 4096), (4096, 11008), (8192, 8192), (28672, 8192),
                                   (8192, 28672)]
SWEEP_SHAPES: list[Shape] = (
    [(s, s, s) for s in (512, 1024, 2048, 4096, 8192)]
    + [(m, n, k) for m in (1, 16, 128, 4096) for n, k in LLAMA_NK]
    + [(1000, 3000, 777)]
)
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
# Operand dtypes with their own kernels and baselines (bench_lowp_shape); "fp8" on the command line is both modes.
FP8_MODES = {"fp8-precise": "precise", "fp8-fast": "fast"}
LOWP_DTYPES = (*FP8_MODES, "int8", "tf32")
#: Dense (no sparsity) fp8 tensor-core peak of an H100 SXM (NVIDIA's datasheet: 3,958 TFLOP/s with sparsity); the
#: H200 has the same chip and peak.
FP8_DENSE_PEAK_TFLOPS = 1979.0
REL_TOL = 2e-2  # max |out - ref| / max |ref|: 16-bit rounding of outputs is ~4e-3 of the value
IMPLS = ("tilejit", "cublas", "triton")


def all_shapes(quick: bool) -> list[Shape]:
    """Quick: the quick set. Full: the quick set first (so a time budget covers it), then the sweep."""
    shapes = list(QUICK_SHAPES)
    if not quick:
        shapes += [s for s in SWEEP_SHAPES if s not in shapes]
    return shapes


def parse_shapes(text: str) -> list[Shape]:
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"shape {item!r} is not MxNxK (e.g. 4096x4096x4096)")
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return shapes


def parse_dtypes(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    names = [m for t in names for m in (FP8_MODES if t == "fp8" else (t,))]
    unknown = [t for t in names if t not in DTYPES and t not in LOWP_DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"dtypes must be among {', '.join([*DTYPES, 'fp8', *LOWP_DTYPES])}; "
                                         f"got {text!r}")
    return names


def relative_error(out, ref) -> float:
    """max |out - ref| / max |ref| in float32; inf if any output is NaN (never written)."""
    diff = (out.float() - ref.float()).abs().nan_to_num(float("inf")).max().item()
    return diff / max(ref.float().abs().max().item(), 1e-6)


def _describe(config: Any) -> str:
    if config is None:
        return "n/a"
    kw = config.kwargs
    split = f" split-K {config.split_k}" if getattr(config, "split_k", 1) != 1 else ""
    ws = " ws" if getattr(config, "warp_specialize", False) else ""
    ws += " persistent" if getattr(config, "persistent", False) else ""
    ws += " pingpong" if getattr(config, "pingpong", False) else ""
    return f"{kw['BM']}x{kw['BN']}x{kw['BK']} w{config.num_warps} s{config.num_stages}{split}{ws}"


def measure(run: Callable[[], Any], out, ref, m: int, n: int, k: int) -> dict[str, Any]:
    """Run once (autotuning happens here), check against ``ref`` with ``out`` poisoned, then time."""
    import torch

    from tilejit.testing import do_bench

    try:
        run()
        out.fill_(float("nan") if out.is_floating_point() else -(2 ** 31))  # poisoned: unwritten shows up
        run()
        torch.cuda.synchronize()
        err = relative_error(out, ref)
        if not err <= REL_TOL:
            return {"status": "FAIL", "rel_err": err}
        ms = float(do_bench(run))
    except Exception as error:  # noqa: BLE001 - one failing implementation must not stop the others
        # A launch error (e.g. an illegal address) poisons the CUDA context: later runs will fail as well.
        return {"status": "ERROR", "error": f"{type(error).__name__}: {error}"[:2000]}
    return {"status": "ok", "rel_err": err, "ms": ms, "tflops": matmul_tflops(m, n, k, ms)}


#: Timing rounds after the first: every implementation of a shape is timed again in turn, so none is favoured by
#: the GPU's temperature (clocks fall as it heats; whoever is timed first, right after a cool-down or right after
#: the tuner's work, would be measured at other clocks). Each figure is the median of its rounds.
ROUNDS = 2


def interleave(timed: dict[str, tuple[Callable[[], Any], dict[str, Any]]], m: int, n: int, k: int,
               rounds: int = ROUNDS) -> None:
    """Time each ``name: (run, result)`` whose result is ok ``rounds`` more times, rotating the order every
    round, and set its ``ms`` / ``tflops`` to the median of all its timings (``ms_rounds`` keeps them)."""
    import statistics

    from tilejit.testing import do_bench

    names = [name for name, (_, result) in timed.items() if result.get("status") == "ok"]
    for name in names:
        timed[name][1]["ms_rounds"] = [timed[name][1]["ms"]]
    for r in range(1, rounds + 1):
        shift = r % len(names) if names else 0  # (round r starts with a different implementation than the last)
        for name in names[shift:] + names[:shift]:
            run, result = timed[name]
            result["ms_rounds"].append(float(do_bench(run)))
    for name in names:
        result = timed[name][1]
        result["ms"] = statistics.median(result["ms_rounds"])
        result["tflops"] = matmul_tflops(m, n, k, result["ms"])


def baseline_refusal(dtype_name: str, m: int, n: int, k: int) -> str | None:
    """Why the library baseline cannot take this shape (its documented limits), or None: a refusal is "n/a",
    not a failure of the benchmark."""
    if dtype_name.startswith("fp8") and (k % 16 or n % 16):
        return "torch._scaled_mm needs K and N multiples of 16"
    if dtype_name == "int8" and (m <= 16 or k % 8 or n % 8):
        return "torch._int_mm needs M > 16 and K, N multiples of 8"
    return None


def triton_refusal(dtype_name: str, k: int) -> str | None:
    """The Triton low-precision kernel loads fp8 unmasked (Triton cannot cast a masked load's `other` to fp8),
    so it takes fp8 only when every K block is whole."""
    if dtype_name.startswith("fp8") and k % 128:
        return "the Triton fp8 kernel needs K % 128 == 0"
    return None


def _tuned(row: dict[str, Any], tuner: Any, impl: str = "tilejit") -> None:
    stats = tuner.stats
    tuned = row[impl]["status"] != "ERROR"  # after an error best_config may be the previous shape's
    row[impl].update(config=_describe(getattr(tuner, "best_config", None)) if tuned else "n/a",
                     timed=len(stats.timed), failed=len(stats.failed), tuned_from_disk=stats.from_disk)
    if stats.failed:
        row[impl]["failed_configs"] = list(stats.failed)


def _time_nn(row: dict[str, Any], runs: dict[str, Callable[[], Any]], a, bt, out_dtype, ref, m: int, n: int,
             k: int) -> None:
    """``tilejit_nn``: the same product through the DESIGN matmul with B given K x N (MN-major; fp8 without the
    scales), which on sm_90a gathers B into registers (``backend_cuda/lower_wgmma_mn8.py``), and on sm_90a
    ``tilejit_nn_copy``: the same with the transposing copy pinned (``kernels.LOWP_COPY_PINS``); both tuned and
    timed in the rounds of the shape's other runs."""
    import torch

    import tilejit.language as T
    from benchmarks import kernels
    b = bt.T.contiguous()
    c = torch.empty(m, n, device=a.device, dtype=out_dtype)
    acc = T.int32 if out_dtype == torch.int32 else T.float32
    runs["tilejit_nn"] = lambda: kernels.lowp_mm_nn[kernels.matmul_grid](a, b, c, ACC=acc)
    row["tilejit_nn"] = measure(runs["tilejit_nn"], c, ref, m, n, k)
    _tuned(row, kernels.lowp_mm_nn, "tilejit_nn")
    if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device)[0] != 9:
        return
    c_copy = torch.empty(m, n, device=a.device, dtype=out_dtype)
    pins = kernels.LOWP_COPY_PINS["int8" if out_dtype == torch.int32 else "fp8"]

    def copy_run() -> None:
        with kernels.pinned(pins):
            kernels.lowp_mm_nn_copy[kernels.matmul_grid](a, b, c_copy, ACC=acc)
    runs["tilejit_nn_copy"] = copy_run
    row["tilejit_nn_copy"] = measure(copy_run, c_copy, ref, m, n, k)
    _tuned(row, kernels.lowp_mm_nn_copy, "tilejit_nn_copy")


def _time_tf32_nn(row: dict[str, Any], runs: dict[str, Callable[[], Any]], a, b, ref, m: int, n: int,
                  k: int) -> None:
    """``tilejit_nn``: the DESIGN matmul in float32 with B given K x N (on sm_90a B is read into registers as the
    transposed product's A), and on sm_90a ``tilejit_nn_copy``: the same with the transposing copy pinned
    (``kernels.TF32_COPY_PINS``), both tuned and timed in the shape's rounds."""
    import torch

    from benchmarks import kernels
    c_nn = torch.empty(m, n, device=a.device)
    runs["tilejit_nn"] = lambda: kernels.tf32_mm_nn[kernels.matmul_grid](a, b, c_nn)
    row["tilejit_nn"] = measure(runs["tilejit_nn"], c_nn, ref, m, n, k)
    _tuned(row, kernels.tf32_mm_nn, "tilejit_nn")
    if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device)[0] != 9:
        return
    c_copy = torch.empty(m, n, device=a.device)

    def copy_run() -> None:
        with kernels.pinned(kernels.TF32_COPY_PINS):
            kernels.tf32_mm_nn_copy[kernels.matmul_grid](a, b, c_copy)
    runs["tilejit_nn_copy"] = copy_run
    row["tilejit_nn_copy"] = measure(copy_run, c_copy, ref, m, n, k)
    _tuned(row, kernels.tf32_mm_nn_copy, "tilejit_nn_copy")


def frobenius_error(out, ref64) -> float | None:
    """||out - ref|| / ||ref|| (Frobenius) against a float64 reference; None when an output is NaN."""
    diff = out.double() - ref64
    if diff.isnan().any():
        return None
    return (diff.norm() / ref64.norm().clamp_min(1e-300)).item()


def _fp8_runs(row: dict[str, Any], runs: dict[str, Callable[[], Any]], mode: str, a, bt, m: int, n: int, k: int,
              device: str):
    """The fp8 row of ``mode`` ("fp8-precise" / "fp8-fast"): tilejit's scaled_mm at that precision and
    ``torch._scaled_mm`` with the like accumulation, each with its error against float64 (``err_f64``). Returns
    (the float32 reference, Triton's arguments)."""
    import torch

    from benchmarks import kernels

    precision = FP8_MODES[mode]
    sa = torch.rand(m, 1, device=device) + 0.5
    sb = torch.rand(1, n, device=device) + 0.5
    ref64 = (a.double() @ bt.double().T) * sa.double() * sb.double()
    ref = ref64.float()
    c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    sa1, sb1 = sa.reshape(m), sb.reshape(n)
    runs["tilejit"] = lambda: kernels.scaled_mm[kernels.nt_grid](a, bt, sa1, sb1, c, PRECISION=precision)
    row["tilejit"] = measure(runs["tilejit"], c, ref, m, n, k)
    row["tilejit"]["err_f64"] = frobenius_error(c, ref64)
    _tuned(row, kernels.scaled_mm)
    if precision == "precise":  # (the DESIGN matmul, without scales, at the default precision)
        _time_nn(row, runs, a, bt, torch.bfloat16, (a.float() @ bt.float().T), m, n, k)
    c_ref = torch.empty(m, n, device=device, dtype=torch.bfloat16)

    def baseline():
        c_ref.copy_(torch._scaled_mm(a, bt.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                     use_fast_accum=precision == "fast"))
    refusal = baseline_refusal(mode, m, n, k)
    runs["cublas"] = baseline
    row["cublas"] = {"status": "n/a", "reason": refusal} if refusal else measure(baseline, c_ref, ref, m, n, k)
    if row["cublas"]["status"] == "ok":
        row["cublas"]["err_f64"] = frobenius_error(c_ref, ref64)
    return ref, (a, bt.T, torch.empty(m, n, device=device, dtype=torch.bfloat16), sa1, sb1)


def bench_lowp_shape(m: int, n: int, k: int, dtype_name: str, triton_mod: Any, device: str = "cuda") -> dict[str, Any]:
    """fp8, int8 or tf32: tilejit's kernel against torch's tensor-core baseline (the "cuBLAS" column) and Triton.

    - fp8 ("fp8-precise", "fp8-fast"): e4m3 A (M x K) and B given N x K (the K-major form fp8 tensor cores and
      ``torch._scaled_mm`` take), row and column float32 scales, bfloat16 out; baseline ``torch._scaled_mm`` with
      the same scales and the like accumulation (``use_fast_accum`` for the fast mode); Triton in the precise
      row only (one kernel, its own accumulation). Both carry their error against float64.
    - int8: A (M x K), B given N x K, int32 out; baseline ``torch._int_mm``.
    - fp8 and int8 rows also time the DESIGN matmul with B given K x N (``tilejit_nn``, fp8 without scales), and
      on sm_90a that with the transposing copy pinned under ``tilejit_nn_copy``.
    - tf32: float32 A and B given N x K (K-major, as wgmma reads tf32 from shared memory; the row also times the
      DESIGN matmul with B given K x N under ``tilejit_nn``, and on sm_90a that with the transposing copy pinned
      under ``tilejit_nn_copy``); baseline ``torch.matmul`` with tf32 allowed.
    The MN-major runs take part in the timing rounds; ``mn_major_rows`` tabulates them against cuBLAS (tf32) or
    the K-major tilejit form (fp8, int8).
    """
    import torch

    from benchmarks import kernels

    torch.manual_seed(0)
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": dtype_name}
    runs: dict[str, Callable[[], Any]] = {}
    if dtype_name in FP8_MODES:
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        bt = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
        ref, triton_args = _fp8_runs(row, runs, dtype_name, a, bt, m, n, k, device)
    elif dtype_name == "int8":
        a = torch.randint(-128, 128, (m, k), device=device, dtype=torch.int8)
        bt = torch.randint(-128, 128, (n, k), device=device, dtype=torch.int8)
        ref = (a.double() @ bt.double().T).float()
        c = torch.empty(m, n, device=device, dtype=torch.int32)
        runs["tilejit"] = lambda: kernels.int8_mm[kernels.nt_grid](a, bt, c)
        row["tilejit"] = measure(runs["tilejit"], c, ref, m, n, k)
        _tuned(row, kernels.int8_mm)
        _time_nn(row, runs, a, bt, torch.int32, ref, m, n, k)
        c_ref = torch.empty(m, n, device=device, dtype=torch.int32)
        refusal = baseline_refusal(dtype_name, m, n, k)
        runs["cublas"] = lambda: c_ref.copy_(torch._int_mm(a, bt.T))
        row["cublas"] = ({"status": "n/a", "reason": refusal} if refusal else
                         measure(runs["cublas"], c_ref, ref, m, n, k))
        triton_args = (a, bt.T, torch.empty(m, n, device=device, dtype=torch.int32), None, None)
    else:
        a = torch.randn(m, k, device=device)
        bt = torch.randn(n, k, device=device)
        b = bt.T.contiguous()
        ref = a.double() @ b.double()
        c = torch.empty(m, n, device=device)
        runs["tilejit"] = lambda: kernels.tf32_mm_nt[kernels.nt_grid](a, bt, c)
        row["tilejit"] = measure(runs["tilejit"], c, ref, m, n, k)
        _tuned(row, kernels.tf32_mm_nt)
        _time_tf32_nn(row, runs, a, b, ref, m, n, k)
        c_ref = torch.empty(m, n, device=device)
        previous = torch.backends.cuda.matmul.allow_tf32

        def tf32_matmul() -> None:  # cuBLAS with tf32 allowed around the call only
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                torch.matmul(a, b, out=c_ref)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = previous
        runs["cublas"] = tf32_matmul
        row["cublas"] = measure(tf32_matmul, c_ref, ref, m, n, k)
        triton_args = (a, bt.T, torch.empty(m, n, device=device), None, None)
    if triton_mod is None:
        row["triton"] = {"status": "n/a"}
    elif dtype_name == "fp8-fast":
        row["triton"] = {"status": "n/a", "reason": "one Triton fp8 kernel: timed in the fp8-precise row"}
    elif triton_refusal(dtype_name, k):
        row["triton"] = {"status": "n/a", "reason": triton_refusal(dtype_name, k)}
    else:
        x, y, out, s_a, s_b = triton_args
        runs["triton"] = lambda: triton_mod.matmul_lowp(x, y, out, s_a, s_b)
        row["triton"] = measure(runs["triton"], out, ref, m, n, k)
        row["triton"]["config"] = triton_mod.matmul_lowp_best_config()
        if dtype_name in FP8_MODES and row["triton"]["status"] == "ok":
            row["triton"]["err_f64"] = frobenius_error(out, ref.double())
    if device != "cpu":
        interleave({name: (run, row[name]) for name, run in runs.items()}, m, n, k)
    return row


def bench_shape(m: int, n: int, k: int, dtype_name: str, triton_mod: Any, device: str = "cuda",
                sm80: bool = False) -> dict[str, Any]:
    """One shape and dtype through every implementation (``device="cpu"`` only for tests on the interpreter);
    ``sm80``: and through the sm_80 path (``tilejit_sm80``)."""
    import torch

    if dtype_name in LOWP_DTYPES:
        return bench_lowp_shape(m, n, k, dtype_name, triton_mod, device)

    from benchmarks import kernels

    dtype = getattr(torch, DTYPES[dtype_name])
    torch.manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    ref = torch.matmul(a, b)
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "dtype": dtype_name}

    c = torch.empty(m, n, device=device, dtype=dtype)
    runs = {"tilejit": lambda: kernels.matmul[kernels.matmul_grid](a, b, c)}
    row["tilejit"] = measure(runs["tilejit"], c, ref, m, n, k)
    _tuned(row, kernels.matmul)

    c_blas = torch.empty(m, n, device=device, dtype=dtype)
    runs["cublas"] = lambda: torch.matmul(a, b, out=c_blas)
    row["cublas"] = measure(runs["cublas"], c_blas, ref, m, n, k)

    if triton_mod is None:
        row["triton"] = {"status": "n/a"}
    else:
        c_tri = torch.empty(m, n, device=device, dtype=dtype)
        runs["triton"] = lambda: triton_mod.matmul(a, b, c_tri)
        row["triton"] = measure(runs["triton"], c_tri, ref, m, n, k)
        row["triton"]["config"] = triton_mod.matmul_best_config()
    if sm80:
        c_80 = torch.empty(m, n, device=device, dtype=dtype)

        def sm80_run():
            with kernels.sm80_path():
                kernels.matmul_sm80[kernels.matmul_grid](a, b, c_80)
        runs["tilejit_sm80"] = sm80_run
        row["tilejit_sm80"] = measure(sm80_run, c_80, ref, m, n, k)
        _tuned(row, kernels.matmul_sm80, "tilejit_sm80")
    if device != "cpu":
        interleave({name: (run, row[name]) for name, run in runs.items()}, m, n, k)
    return row


def _cell(result: dict[str, Any]) -> str:
    status = result["status"]
    if status == "ok":
        return fmt(result["tflops"])
    if status == "FAIL":
        return f"FAIL (err {result['rel_err']:.2g})"
    return status  # ERROR, n/a


def _ratio(row: dict[str, Any], other: str) -> float | None:
    a, b = row["tilejit"], row[other]
    if a["status"] == "ok" and b["status"] == "ok":
        return a["tflops"] / b["tflops"]
    return None


TABLE_HEADERS = ["shape (MxNxK)", "dtype", "tilejit TFLOP/s", "cuBLAS TFLOP/s", "Triton TFLOP/s",
                 "tilejit/cuBLAS", "tilejit/Triton", "tilejit config"]


def launch_host_times(launches: int = 1000, reps: int = 15) -> dict[str, dict[str, float]]:
    """Host microseconds per launch of ``kernels.matmul`` on a 256^3 fp16 problem (small, so the GPU keeps up and
    the host's time is what is measured), once tuned: launched plainly with the chosen config's meta arguments and
    its grid and with ``kernels.matmul_grid``, and through the autotuner (the compiled launcher's tuned dispatch)
    with the same two; the launchers take turns (``benchmarks.launch.host_overheads``). A grid function costs
    its Python call on either path: compare a tuned launch with the plain one of the same grid form."""
    import torch

    from benchmarks import kernels
    from benchmarks.launch import host_overheads

    a, b = (torch.randn(256, 256, device="cuda", dtype=torch.float16) for _ in range(2))
    c = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    tuner = kernels.matmul
    tuner[kernels.matmul_grid](a, b, c)  # tunes (or reads the stored choice)
    config = tuner.best_config
    grid = kernels.matmul_grid({"A": a, "B": b, "C": c, **config.launch_kwargs})
    meta = config.launch_kwargs
    launchers = {
        "plain launch (the chosen config, grid tuple)": lambda: tuner.kernel[grid](a, b, c, **meta),
        "tuned launch (grid tuple)": lambda: tuner[grid](a, b, c),
        "plain launch (the chosen config, grid function)": lambda: tuner.kernel[kernels.matmul_grid](a, b, c,
                                                                                                     **meta),
        "tuned launch (grid function)": lambda: tuner[kernels.matmul_grid](a, b, c),
    }
    for launch in launchers.values():  # each path's first launches compile, make and fill its tables
        for _ in range(4):
            launch()
    return host_overheads(launchers, launches, reps)


def launch_rows(times: dict[str, dict[str, float]]) -> list[list[Any]]:
    """Rows of the launch host-time table: each launcher's median and its difference from the first launcher of
    the same grid form (the text from "grid" on, e.g. "grid function)"; the first launcher where none names one)."""
    first = next(iter(times.values()))["us_per_launch"]
    by_form: dict[str, float] = {}
    for name, r in times.items():
        by_form.setdefault(_grid_form(name), r["us_per_launch"])
    return [[name, f"{r['us_per_launch']:.2f} us",
             f"{r['us_per_launch'] - (by_form[_grid_form(name)] if _grid_form(name) else first):+.2f} us",
             f"{r['min_us_per_launch']:.2f} us"] for name, r in times.items()]


def _grid_form(name: str) -> str:
    return name[name.index("grid"):] if "grid" in name else ""


def table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for r in rows:
        ratios = [_ratio(r, "cublas"), _ratio(r, "triton")]
        config = r["tilejit"].get("config", "n/a")
        if "tilejit_nn" in r:  # the MN-major B form of the same product, for comparison (mn_major_rows)
            config += f"; B K x N: {_cell(r['tilejit_nn'])}"
        out.append([f"{r['m']}x{r['n']}x{r['k']}", r["dtype"], _cell(r["tilejit"]), _cell(r["cublas"]),
                    _cell(r["triton"]), *(None if x is None else f"{x:.2f}" for x in ratios), config])
    return out


MN_MAJOR_HEADERS = ["shape (MxNxK)", "dtype", "B K x N TFLOP/s", "against", "its TFLOP/s", "ratio",
                    "transposing copy TFLOP/s", "B K x N config"]


def mn_major_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """The MN-major table: the DESIGN matmul with B given K x N (``tilejit_nn``) against cuBLAS tf32 (tf32) or
    tilejit's K-major form (fp8, int8, B given N x K), and on sm_90a the transposing copy it replaced."""
    out = []
    for r in rows:
        if "tilejit_nn" not in r:
            continue
        nn = r["tilejit_nn"]
        other = "cublas" if r["dtype"] == "tf32" else "tilejit"
        base = r[other]
        ratio = nn["tflops"] / base["tflops"] if nn["status"] == base["status"] == "ok" else None
        copy = _cell(r["tilejit_nn_copy"]) if "tilejit_nn_copy" in r else "n/a"
        out.append([f"{r['m']}x{r['n']}x{r['k']}", r["dtype"], _cell(nn),
                    "cuBLAS tf32" if other == "cublas" else "tilejit B N x K", _cell(base),
                    None if ratio is None else f"{ratio:.2f}", copy, nn.get("config", "n/a")])
    return out


SM80_HEADERS = ["shape (MxNxK)", "dtype", "sm_80 path TFLOP/s", "tilejit (native) TFLOP/s", "cuBLAS TFLOP/s",
                "sm_80 path / cuBLAS", "sm_80 path config"]


def sm80_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """The sm_80 path's table (``--sm80-path``): its figure next to the native tilejit kernel and cuBLAS."""
    out = []
    for r in rows:
        if "tilejit_sm80" not in r:
            continue
        sm80, blas = r["tilejit_sm80"], r["cublas"]
        ratio = sm80["tflops"] / blas["tflops"] if sm80["status"] == blas["status"] == "ok" else None
        out.append([f"{r['m']}x{r['n']}x{r['k']}", r["dtype"], _cell(sm80), _cell(r["tilejit"]), _cell(blas),
                    None if ratio is None else f"{ratio:.2f}", sm80.get("config", "n/a")])
    return out


FP8_HEADERS = ["shape (MxNxK)", "mode", "tilejit TFLOP/s", "baseline", "baseline TFLOP/s", "tilejit/baseline",
               "tilejit err", "baseline err", "Triton err", "tilejit % of peak", "baseline % of peak"]


def fp8_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """The fp8 table: each mode against its like baseline, the error of each against float64 (relative Frobenius
    norm over the same fp8 values and scales), and each one's share of the dense fp8 peak."""
    def err(result: dict[str, Any]) -> str | None:
        return None if result.get("err_f64") is None else f"{result['err_f64']:.3g}"

    def peak(result: dict[str, Any]) -> str | None:
        return f"{100 * result['tflops'] / FP8_DENSE_PEAK_TFLOPS:.0f}%" if result["status"] == "ok" else None

    out = []
    for r in rows:
        if r["dtype"] not in FP8_MODES:
            continue
        ratio = _ratio(r, "cublas")
        baseline = "_scaled_mm" + (" use_fast_accum" if r["dtype"] == "fp8-fast" else "")
        out.append([f"{r['m']}x{r['n']}x{r['k']}", FP8_MODES[r["dtype"]], _cell(r["tilejit"]), baseline,
                    _cell(r["cublas"]), None if ratio is None else f"{ratio:.2f}", err(r["tilejit"]),
                    err(r["cublas"]), err(r["triton"]), peak(r["tilejit"]), peak(r["cublas"])])
    return out


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> Path | None:
    """Grouped bars of TFLOP/s per shape and dtype, and tilejit/cuBLAS below; None without matplotlib."""
    bars = {name: [r[impl].get("tflops", 0.0) if r[impl]["status"] == "ok" else 0.0 for r in rows]
            for impl, name in (("tilejit", "tilejit"), ("cublas", "cuBLAS"), ("triton", "Triton"))}
    return bar_chart(path, "matmul", meta, [f"{r['m']}x{r['n']}x{r['k']}\n{r['dtype']}" for r in rows], bars,
                     {"tilejit / cuBLAS": [_ratio(r, "cublas") or 0.0 for r in rows]}, width=0.27, ratio_width=0.5)


def _load_triton() -> tuple[Any, str | None]:
    try:
        from benchmarks import triton_kernels
    except Exception as error:  # noqa: BLE001 - no Triton (or a broken one): the column says n/a
        return None, f"{type(error).__name__}: {error}"
    return triton_kernels, None


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.matmul", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the quick set: " + ", ".join(
        f"{m}x{n}x{k}" for m, n, k in QUICK_SHAPES))
    parser.add_argument("--shapes", type=parse_shapes, help="comma-separated MxNxK list (overrides --quick)")
    parser.add_argument("--dtypes", type=parse_dtypes, default=["fp16", "bf16"],
                        help="fp16,bf16 (default both), fp8, int8, tf32 (each against its torch baseline)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for JSON/PNG (default {DEFAULT_OUT})")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new shape after this many seconds (default 420); report what ran")
    parser.add_argument("--results", type=Path, default=RUN_LOG_PATH, help="Markdown file the table is appended to")
    parser.add_argument("--no-append", action="store_true", help="do not append to the run log")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every autotuning decision")
    parser.add_argument("--no-launch-times", action="store_true",
                        help="skip the host time of a tuned launch against a plain one (256^3 fp16, a few seconds)")
    parser.add_argument("--sm80-path", action="store_true",
                        help="also tune and time the sm_80 path (mma.sync and cp.async pinned; Hopper GPUs only)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("benchmarks.matmul: no CUDA GPU visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.verbose:
        logging.getLogger("tilejit.autotune").setLevel(logging.INFO)
    previous_handler = signal.signal(signal.SIGTERM, _raise_interrupt)  # `timeout` still gets a partial report

    if args.sm80_path and torch.cuda.get_device_capability()[0] != 9:
        print("benchmarks.matmul: --sm80-path compiles the sm_80 path for sm_90a; this GPU is not a Hopper GPU "
              "(on an sm_80 GPU the plain run is that path)", file=sys.stderr)
        return 2
    meta = machine_stamp()
    triton_mod, triton_error = _load_triton()
    shapes = args.shapes or all_shapes(args.quick)
    work = [(shape, dt) for shape in shapes for dt in args.dtypes]
    print(f"# matmul on {meta['gpu']}: {len(work)} runs; {stamp_line(meta)}", flush=True)
    if triton_error:
        print(f"# Triton unavailable: {triton_error}", flush=True)

    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    interrupted = None
    start = time.monotonic()
    json_path = args.out / "matmul.json"
    try:
        for (m, n, k), dt in work:
            if time.monotonic() - start > args.budget_s:
                skipped.append(f"{m}x{n}x{k} {dt}")
                continue
            t0 = time.monotonic()
            try:
                row = bench_shape(m, n, k, dt, triton_mod, sm80=args.sm80_path and dt in DTYPES)
            except Exception as error:  # noqa: BLE001 - e.g. inputs not allocatable: report, go on
                failure = {"status": "ERROR", "error": f"{type(error).__name__}: {error}"[:2000]}
                row = {"m": m, "n": n, "k": k, "dtype": dt, **{impl: dict(failure) for impl in IMPLS}}
            row["seconds"] = round(time.monotonic() - t0, 1)
            rows.append(row)
            cells = table_rows([row])[0]
            print(f"[{time.monotonic() - start:6.1f}s] {cells[0]} {dt}: tilejit {cells[2]} ({cells[7]}, "
                  f"{row['tilejit'].get('timed', 0)} timed, {row['tilejit'].get('failed', 0)} failed), "
                  f"cuBLAS {cells[3]}, Triton {cells[4]}", flush=True)
            for impl in IMPLS:
                if row[impl]["status"] == "ERROR":
                    print(f"    {impl} ERROR: {row[impl]['error'].splitlines()[0][:300]}", flush=True)
                elif row[impl].get("reason"):
                    print(f"    {impl} n/a: {row[impl]['reason']}", flush=True)
            write_json(json_path, {"meta": meta, "rows": rows, "complete": False})
    except KeyboardInterrupt as stop:
        interrupted = str(stop) or "KeyboardInterrupt"
    finally:
        signal.signal(signal.SIGTERM, previous_handler)

    launch_times: dict[str, Any] = {}
    if not args.no_launch_times and not interrupted:
        try:
            launch_times = launch_host_times()
        except Exception as error:  # noqa: BLE001 - a measurement of its own: report, keep the TFLOP/s table
            launch_times = {"error": f"{type(error).__name__}: {error}"[:2000]}
    notes = []
    if triton_error:
        notes.append(f"Triton unavailable: {triton_error}")
    if skipped:
        notes.append(f"Not run (time budget of {args.budget_s:.0f} s spent): {', '.join(skipped)}")
    if interrupted:
        notes.append(f"Interrupted ({interrupted}) after {len(rows)} of {len(work)} runs.")
    notes.append(f"tilejit: DESIGN.md matmul, autotuned over tilejit.configs.matmul_configs(); correctness "
                 f"vs cuBLAS before timing (max abs err / max |ref| <= {REL_TOL}); do_bench median, L2 flushed.")
    write_json(json_path, {"meta": meta, "rows": rows, "complete": not (skipped or interrupted),
                           "notes": notes, "launch_host_us": launch_times})
    table = markdown_table(TABLE_HEADERS, table_rows(rows))
    if "error" in launch_times:
        notes.append(f"launch host times failed: {launch_times['error']}")
    elif launch_times:
        table += ("\n\nHost time per launch of the autotuned matmul, 256^3 fp16, same run (median of 15 x 1000 "
                  "back-to-back launches, launchers taking turns):\n\n"
                  + markdown_table(["launch", "host time", "vs plain (same grid form)", "min"], launch_rows(launch_times)))
    if args.sm80_path and sm80_rows(rows):
        table += ("\n\nThe sm_80 path (mma.sync and cp.async pinned, `kernels.SM80_PINS`; autotuned over an sm_80 GPU's "
                  "config space) in the same run:\n\n" + markdown_table(SM80_HEADERS, sm80_rows(rows)))
    if fp8_rows(rows):
        table += (f"\n\nfp8, each mode against its like (error: relative Frobenius norm against float64 over the same "
                  f"fp8 values; peak: {FP8_DENSE_PEAK_TFLOPS:,.0f} TFLOP/s dense, H100 SXM):\n\n"
                  + markdown_table(FP8_HEADERS, fp8_rows(rows)))
    if mn_major_rows(rows):
        table += ("\n\nMN-major operands (the DESIGN matmul, B given K x N) in the same run, against cuBLAS tf32 "
                  "(tf32) or the K-major tilejit form (fp8, int8):\n\n" + markdown_table(MN_MAJOR_HEADERS,
                                                                                          mn_major_rows(rows)))
    print()
    print(table)
    print("\n".join(notes))
    print(f"wrote {json_path}")
    if rows and not args.no_append:
        title = "matmul TFLOP/s, tilejit vs cuBLAS vs Triton" + (" (quick set)" if args.quick else "")
        print(f"appended to {append_results(title, table, meta, args.results, notes)}")
    try:
        png = plot(rows, meta, args.out / "matmul.png") if rows else None
        print(f"wrote {png}" if png else "no plot (no rows, or matplotlib is not installed)")
    except Exception as error:  # noqa: BLE001 - a plot is a convenience
        print(f"plot failed: {type(error).__name__}: {error}")
    failed = any(r[impl]["status"] in ("FAIL", "ERROR") for r in rows for impl in ("tilejit", "cublas"))
    return 1 if failed or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
