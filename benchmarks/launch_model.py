"""The launch model's defaults against the fixed ones, row by row: a kernel written the obvious way (tiles and
warps only, no pipeline options) timed as the model compiles it and as the old fixed defaults did.

    python -m benchmarks.launch_model [--quick] [--dtypes fp16,bf16,tf32,fp8] [--shapes 4096x4096x4096,...]
                                      [--seqs 1024,4096,16384] [--dims 64,128] [--parts matmul,attention]
                                      [--all] [--out DIR]

Matmul: ``benchmarks.kernels.matmul.kernel`` (the README matmul, grouped order) with each of ``PLAIN_TILES`` (BK
scaled so a k-step is as many bytes as 64 halves), over the matmul sweep's shapes (``benchmarks.matmul``), operands
of each dtype, B stored K x N. Attention: ``benchmarks.kernels.attention_one_loop`` (one loop, every block masked) with
each of ``ATTENTION_TILES``, bf16, 16 heads, 16k tokens per problem, causal and not.

"old" is the launch with ``num_stages=3`` given (what ``TILEJIT_LAUNCH_MODEL=0`` or a launch before the model
compiled: 3 stages, no warp specialization, not persistent, cut to fit); "new" gives no ``num_stages``, so
``passes.launch_model`` chooses. Rows where both compile to the same CUDA are not timed ("same kernel"), unless
``--all``. Both are checked against a float32/float64 reference before timing and timed alternately with
``tilejit.testing.do_bench`` (median, L2 flushed). Prints new / old per row, the smallest ratio and the rows
under 0.98; writes ``launch_model.json`` into --out.
"""
from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.common import DEFAULT_OUT, machine_stamp, markdown_table, write_json
from benchmarks.matmul import QUICK_SHAPES, all_shapes, parse_shapes

#: (BM, BN, BK for 16-bit operands, num_warps): what a user writes without tuning
PLAIN_TILES = [(128, 128, 64, 4), (128, 256, 64, 8), (256, 128, 64, 8), (64, 128, 64, 4), (128, 128, 32, 4),
               (128, 128, 128, 8)]
#: (BM, BN, num_warps)
ATTENTION_TILES = [(128, 128, 8), (128, 64, 8), (64, 128, 4), (64, 64, 4)]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "fp8": torch.float8_e4m3fn}
HEADERS = ["kernel", "problem", "dtype", "tile", "old TFLOP/s", "new TFLOP/s", "new / old", "model chose"]
FLOOR = 0.98


def _time_pair(old: Callable[[], Any], new: Callable[[], Any], rounds: int = 3) -> tuple[float, float]:
    """Median milliseconds of ``old`` and ``new``, timed in alternating rounds (best round of each)."""
    from tilejit.testing import do_bench

    olds, news = [], []
    for _ in range(rounds):
        olds.append(do_bench(old))
        news.append(do_bench(new))
    return min(olds), min(news)


def _chose(compiled) -> str:
    chosen = compiled.meta.get("launch_model") or {}
    parts = [f"s{chosen['num_stages']}"] if "num_stages" in chosen else []
    parts += [name for name in ("warp_specialize", "persistent") if chosen.get(name)]
    return " ".join(parts) or "n/a"


def _row(kind, problem, dtype, tile, launch, flops, check) -> list[Any]:
    """One row: compile old and new, skip when their CUDA is the same (unless ``--all``), check, time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the old defaults' ring cut to fit says so)
        old_kernel, new_kernel = launch(compile_only=True, num_stages=3), launch(compile_only=True)
    chose = _chose(new_kernel)
    if not ARGS.all and old_kernel.asm["cuda"] == new_kernel.asm["cuda"]:
        return [kind, problem, dtype, tile, None, None, "same kernel", chose]
    for options in ({"num_stages": 3}, {}):
        check(lambda: launch(**options))
    ms_old, ms_new = _time_pair(lambda: launch(num_stages=3), lambda: launch())
    return [kind, problem, dtype, tile, flops / ms_old / 1e9, flops / ms_new / 1e9, ms_old / ms_new, chose]


def matmul_rows(shapes, dtypes) -> list[list[Any]]:
    from benchmarks.kernels import matmul
    import tilejit

    rows = []
    for m, n, k in shapes:
        for name in dtypes:
            dtype = DTYPES[name]
            torch.manual_seed(m + n + k)
            a = torch.randn(m, k, device="cuda").to(dtype)
            b = torch.randn(k, n, device="cuda").to(dtype)
            out_dtype = torch.float32 if dtype == torch.float32 else torch.float16
            c = torch.empty(m, n, device="cuda", dtype=out_dtype)
            refs: list[Any] = []  # cuBLAS's product (fp8 through fp16, exact; tf32 as tf32), made when first needed
            for bm, bn, bk16, warps in PLAIN_TILES:
                bk = bk16 * 2 // dtype.itemsize
                grid = (tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)

                def launch(compile_only=False, **options):
                    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, **options)
                    if compile_only:
                        return matmul.kernel.compile(a, b, c, **kw)
                    matmul.kernel[grid](a, b, c, **kw)

                def check(run):
                    if not refs:
                        torch.backends.cuda.matmul.allow_tf32 = True
                        wide = torch.float16 if dtype.itemsize == 1 else dtype
                        refs.append((a.to(wide) @ b.to(wide)).float())
                    ref = refs[0]
                    c.fill_(float("nan"))
                    run()
                    err = (c.float() - ref).abs().nan_to_num(float("inf")).max().item() / ref.abs().max().item()
                    if not err < 2e-2:
                        raise AssertionError(f"matmul {m}x{n}x{k} {name} {bm}x{bn}x{bk}: relative error {err}")

                row = _row("matmul", f"{m}x{n}x{k}", name, f"{bm}x{bn}x{bk} w{warps}", launch, 2.0 * m * n * k,
                           check)
                print(" | ".join(str(x) for x in row), flush=True)
                rows.append(row)
    return rows


def attention_rows(seqs, dims) -> list[list[Any]]:
    from benchmarks.kernels import attention_one_loop
    import tilejit

    rows = []
    heads = 16
    for seq in seqs:
        batch = max(1, 16384 // seq)
        for d in dims:
            torch.manual_seed(seq + d)
            q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            o = torch.empty_like(q)
            scale = 1.0 / math.sqrt(d)
            for causal in (False, True):
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q[:1, :2].double(), k[:1, :2].double(), v[:1, :2].double(), is_causal=causal)
                flops = 4.0 * batch * heads * seq * seq * d / (2 if causal else 1)
                for bm, bn, warps in ATTENTION_TILES:
                    grid = (tilejit.cdiv(seq, bm), heads, batch)

                    def launch(compile_only=False, **options):
                        kw = dict(BM=bm, BN=bn, D=d, CAUSAL=causal, num_warps=warps, **options)
                        if compile_only:
                            return attention_one_loop.compile(q, k, v, o, scale, **kw)
                        attention_one_loop[grid](q, k, v, o, scale, **kw)

                    def check(run):
                        o.fill_(float("nan"))
                        run()
                        err = (o[:1, :2].double() - ref).abs().max().item()
                        if not err < 3e-2:
                            raise AssertionError(f"attention S={seq} D={d} causal={causal} {bm}x{bn}: error {err}")

                    row = _row("attention" + (" causal" if causal else ""), f"B{batch} H{heads} S{seq} D{d}",
                               "bf16", f"{bm}x{bn} w{warps}", launch, flops, check)
                    print(" | ".join(str(x) for x in row), flush=True)
                    rows.append(row)
    return rows


ARGS = argparse.Namespace(all=False)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the matmul quick shapes and S=4096 only")
    parser.add_argument("--dtypes", default="fp16,bf16,tf32,fp8")
    parser.add_argument("--shapes", default=None, help="MxNxK,... (default: the matmul sweep)")
    parser.add_argument("--seqs", default="1024,4096,16384")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--parts", default="matmul,attention")
    parser.add_argument("--all", action="store_true", help="time rows whose old and new kernels are the same too")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ARGS = parser.parse_args(argv)
    shapes = parse_shapes(ARGS.shapes) if ARGS.shapes else (QUICK_SHAPES if ARGS.quick else all_shapes(False))
    seqs = [4096] if ARGS.quick else [int(s) for s in ARGS.seqs.split(",")]
    parts = ARGS.parts.split(",")
    rows = []
    if "matmul" in parts:
        rows += matmul_rows(shapes, [d for d in ARGS.dtypes.split(",") if d])
    if "attention" in parts:
        rows += attention_rows(seqs, [int(d) for d in ARGS.dims.split(",")])
    print(markdown_table(HEADERS, rows))
    timed = [r for r in rows if isinstance(r[6], float)]
    low = [r for r in timed if r[6] < FLOOR]
    if timed:
        worst = min(timed, key=lambda r: r[6])
        print(f"\n{len(timed)} rows timed ({len(rows) - len(timed)} the same kernel); smallest new / old "
              f"{worst[6]:.3f} ({worst[0]} {worst[1]} {worst[2]} {worst[3]}); {len(low)} under {FLOOR}")
    write_json(ARGS.out / "launch_model.json", {"machine": machine_stamp(), "headers": HEADERS, "rows": rows})
    return 1 if low else 0


if __name__ == "__main__":
    raise SystemExit(main())
