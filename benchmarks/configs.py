"""Matmul TFLOP/s per explicit config in several launch modes, next to cuBLAS, in one run.

    python -m benchmarks.configs [--shapes 4096x4096x4096,...] [--dtype fp16|bf16|fp8|int8|tf32]
                                 [--configs 128x256x64w8s4,...]
                                 [--modes off,ws,persistent]

Where ``benchmarks.matmul`` times the autotuned kernel, this times ``benchmarks.kernels.matmul.kernel`` (the same
DESIGN.md matmul with grouped tile order) at each given config in each mode (plain, ``warp_specialize``,
``persistent``), so the effect of a launch option is read directly; it is how the default config space was chosen.
The first rows of each shape are the autotuned launch and its chosen config launched plainly (the launch paths
compared). Every output is checked against cuBLAS first (poisoned with NaN, as ``benchmarks.matmul`` does). Prints a Markdown table and
writes ``configs.json`` into --out.
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_OUT, machine_stamp, markdown_table, matmul_tflops, write_json
from benchmarks.matmul import DTYPES, LOWP_DTYPES, interleave, measure, parse_shapes

DEFAULT_SHAPES = "4096x4096x4096,8192x8192x8192,4096x11008x4096,2048x2048x2048,8192x8192x1024"
DEFAULT_CONFIGS = "128x256x64w8s3,128x256x64w8s4,256x128x64w8s3,256x128x64w8s4,128x128x64w8s4,128x128x64w4s4"
_CONFIG = re.compile(r"^(\d+)x(\d+)x(\d+)w(\d+)s(\d+)$")


def parse_configs(text: str) -> list[tuple[int, int, int, int, int]]:
    out = []
    for item in text.split(","):
        match = _CONFIG.match(item.strip())
        if not match:
            raise argparse.ArgumentTypeError(f"config {item!r} is not BMxBNxBKwWARPSsSTAGES (e.g. 128x256x64w8s4)")
        out.append(tuple(int(g) for g in match.groups()))
    return out


# mode -> launch options: plain, a producer warpgroup, one program per SM walking the grid (with the producer)
MODES = {"off": {}, "ws": {"warp_specialize": True}, "persistent": {"persistent": True},
         "pingpong": {"pingpong": True}}
MODES.update({f"{name}-c2": {**options, "cluster": 2} for name, options in list(MODES.items()) if options})
MODES["stream-k"] = {"stream_k": True}  # persistent, the last waves' tiles shared out as K iterations
MODES.update({f"split-k{n}": {"split_k": n} for n in (2, 4)})  # each tile's K loop cut over a cluster of n programs


def _problem(dtype_name: str, m: int, n: int, k: int):
    """Operands of the DESIGN matmul (B given K x N) in ``dtype_name``, its output, a float reference, the baseline
    (cuBLAS; ``torch._scaled_mm`` / ``torch._int_mm`` for fp8 / int8, given B K-major as they want it; tf32
    allowed for float32), the autotuned kernel and the launch arguments the dtype adds."""
    import torch

    import tilejit.language as T
    from benchmarks import kernels

    if dtype_name in DTYPES:
        dtype = getattr(torch, DTYPES[dtype_name])
        a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        return a, b, c, a @ b, lambda: torch.matmul(a, b, out=c), kernels.matmul, {}
    if dtype_name == "fp8":
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(k, n, device="cuda").to(torch.float8_e4m3fn)
        bt, one = b.T.contiguous(), torch.ones((), device="cuda")
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return (a, b, c, a.float() @ b.float(), lambda: torch._scaled_mm(a, bt.T, scale_a=one, scale_b=one,
                out_dtype=torch.bfloat16), kernels.lowp_mm_nn, {"ACC": T.float32})
    if dtype_name == "int8":
        a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
        b = torch.randint(-128, 128, (k, n), device="cuda", dtype=torch.int8)
        bt = b.T.contiguous()
        c = torch.empty(m, n, device="cuda", dtype=torch.int32)
        return (a, b, c, (a.double() @ b.double()).float(), lambda: torch._int_mm(a, bt.T), kernels.lowp_mm_nn,
                {"ACC": T.int32})
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.empty(m, n, device="cuda")
    if dtype_name == "tf32nt":  # B given N x K (K-major, as wgmma reads tf32): the kernel benchmarks.matmul times
        b = b.T.contiguous()
        kernel = kernels.tf32_mm_nt
        ref = a.double() @ b.double().T
    else:
        kernel, ref = kernels.tf32_mm_nn, a.double() @ b.double()
    bmat = b.T if dtype_name == "tf32nt" else b

    def tf32_matmul():
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            torch.matmul(a, bmat, out=c)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    return a, b, c, ref, tf32_matmul, kernel, {}


def config_runs(kernel, operands: tuple, extra: dict, m: int, n: int, configs: list,
                modes: list[str]) -> list[tuple[str, str, Any]]:
    """(config label, mode, launch) for every config in every mode: ``kernel`` (a ``tilejit.kernel``) launched on
    ``operands`` over the config's own grid, bound when the launch is made (each is run again later, in turn with
    the others: a launch that looked its grid up when run would take the last config's)."""
    import tilejit

    out = []
    for bm, bn, bk, warps, stages in configs:
        launcher = kernel[(tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)]
        for mode in modes:
            out.append((f"{bm}x{bn}x{bk} w{warps} s{stages}", mode, functools.partial(
                launcher, *operands, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, **extra,
                **MODES[mode])))
    return out


def bench(shape: tuple[int, int, int], dtype_name: str, configs: list, modes: list[str],
          tuned_row: bool = True) -> list[dict[str, Any]]:
    from benchmarks.kernels import matmul_grid, nt_grid
    from tilejit.testing import do_bench

    m, n, k = shape
    a, b, c, ref, baseline, matmul, extra = _problem(dtype_name, m, n, k)
    cublas = {"status": "ok", "ms": float(do_bench(baseline))}
    timed = {"cublas": (baseline, cublas)}  # every row's run, timed again in turn at the end (interleave)
    rows = []
    if tuned_row:
        # the autotuned launch path (tuning happens in the first call), to compare with the same config launched
        # plainly
        grid_of = nt_grid if dtype_name == "tf32nt" else matmul_grid
        tuned_run = lambda: matmul[grid_of](a, b, c, **extra)  # noqa: E731
        tuned = measure(tuned_run, c, ref, m, n, k)
        best = matmul.best_config
        rows.append({"shape": f"{m}x{n}x{k}", "config": f"autotuned: {best}", "mode": "autotuned", **tuned})
        timed["autotuned"] = (tuned_run, rows[-1])
        print(f"{m}x{n}x{k} autotuned ({best}): {tuned.get('tflops', tuned['status'])}", flush=True)
        kw = best.kwargs
        configs = [(kw["BM"], kw["BN"], kw["BK"], best.num_warps, best.num_stages)] + list(configs)
    for label, mode, run in config_runs(matmul.kernel, (a, b, c), extra, m, n, configs, modes):
        result = measure(run, c, ref, m, n, k)
        rows.append({"shape": f"{m}x{n}x{k}", "config": label, "mode": mode, **result})
        timed[f"{label} {mode}"] = (run, rows[-1])
        print(f"{m}x{n}x{k} {label} {mode}: {result.get('tflops', result['status'])}", flush=True)
    interleave(timed, m, n, k)
    for row in rows:
        row["cublas_ms"] = cublas["ms"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES))
    parser.add_argument("--dtype", choices=sorted([*DTYPES, *LOWP_DTYPES, "tf32nt"]), default="fp16",
                        help="fp8 / int8 / tf32: the DESIGN matmul with B given K x N (a transposing copy feeds "
                             "wgmma), against torch._scaled_mm / torch._int_mm / cuBLAS tf32 given B K-major; "
                             "tf32nt: float32 with B given N x K (benchmarks.matmul's tf32 kernel)")
    parser.add_argument("--configs", type=parse_configs, default=parse_configs(DEFAULT_CONFIGS))
    parser.add_argument("--modes", default="off,ws", help=f"comma-separated, among {', '.join(MODES)}")
    parser.add_argument("--no-tuned", action="store_true", help="skip the autotuned row (and its tuning time)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks.configs needs a CUDA GPU", file=sys.stderr)
        return 2
    modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    if not modes or any(x not in MODES for x in modes):
        parser.error(f"--modes takes {', '.join(MODES)}, not {args.modes!r}")
    rows = []
    for shape in args.shapes:
        rows += bench(shape, args.dtype, args.configs, modes, tuned_row=not args.no_tuned)
    stamp = machine_stamp()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "configs.json", {"machine": stamp, "rows": rows})
    table = [[r["shape"], r["config"], r["mode"], r.get("tflops", r["status"]),
              matmul_tflops(*map(int, r["shape"].split("x")), r["cublas_ms"]),
              r["cublas_ms"] / r["ms"] if "ms" in r else None] for r in rows]
    print(f"\n{stamp['gpu']} (driver {stamp['driver']}), {args.dtype}\n")
    print(markdown_table(["shape", "config", "mode", "tilejit TFLOP/s", "cuBLAS TFLOP/s",
                          "vs cuBLAS"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
