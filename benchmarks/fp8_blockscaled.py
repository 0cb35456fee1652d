"""Block-scaled fp8 GEMM TFLOP/s on DeepSeek-V3's shapes: tilejit's ``fp8_blockscaled_matmul`` and
``fp8_blockscaled_grouped_matmul`` against the best path the installed torch offers, in one run on one GPU.

    python -m benchmarks.fp8_blockscaled [--quick] [--out DIR] [--no-append]

Operands as DeepSeek-V3 quantizes them: e4m3 activations (M, K) with one float32 scale per 1x128 block, e4m3
weights given N x K with one per 128x128 block, bfloat16 out. N x K of 7168 x 2048, 4096 x 7168 and 2112 x 7168,
M from 128 to 8192; grouped: 8 experts of ragged token counts (a mean of M / 8 each) on the first two.

Baselines, timed in the same run: torch's block-wise scaled matmul (``torch._scaled_mm`` with a (M, K/128)
outer-dim-major activation scale and a 128x128 weight scale: cuBLAS's block scaling, Hopper only, CUDA 12.9+),
when the installed torch accepts the shape; and cuBLAS bf16 on the dequantized operands (the matmul alone, the
dequantization not timed: the upper bound of the dequantize + bf16 path). Grouped rows compare with one
block-wise ``_scaled_mm`` per expert, launched back to back (the host-side loop an MoE layer without a grouped
kernel runs). Every row has each implementation's error (relative Frobenius norm against the float64 product of
the dequantized operands) and tilejit's share of the dense fp8 peak (1,979 TFLOP/s on an H100 SXM). TFLOP/s are
of the kernels alone, replayed from a CUDA graph (as DeepGEMM times its kernels); the last column is each Python
call's time with the host in it (at M = 128 the launch, not the kernel, sets it).

DeepGEMM's published H800 figures (the same SM count as the H100: 132) are printed beside the shapes they cover,
from DeepGEMM's README at commit 55ab91f (2025-03-25, "Performance": H800 SXM5, NVCC 12.8),
https://github.com/deepseek-ai/DeepGEMM/blob/55ab91f72f76e8a6db0e86282c3169a88d93df1b/README.md .
The table is appended to the run log (benchmarks/history/runs.md); RESULTS.md is kept by hand.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import (DEFAULT_OUT, RUN_LOG_PATH, append_results, machine_stamp, markdown_table,
                               matmul_tflops, stamp_line, write_json)

NK_SHAPES: list[tuple[int, int]] = [(7168, 2048), (4096, 7168), (2112, 7168)]
M_SWEEP = (128, 512, 1024, 2048, 4096, 8192)
QUICK_M = (128, 4096)
EXPERTS = 8
FP8_DENSE_PEAK_TFLOPS = 1979.0
#: DeepGEMM on an H800 (README at 55ab91f, 2025-03-25): (M, N, K) -> TFLOP/s; grouped (contiguous layout):
#: ("grouped", experts, M per group, N, K) -> TFLOP/s.
DEEPGEMM_H800: dict[tuple, int] = {
    (128, 2112, 7168): 352, (128, 4096, 7168): 533, (128, 7168, 2048): 510,
    (4096, 2112, 7168): 1009, (4096, 4096, 7168): 1265, (4096, 7168, 2048): 1168,
    ("grouped", 8, 4096, 4096, 7168): 1346, ("grouped", 8, 4096, 7168, 2048): 1214,
}


def quantize(x, block_rows: int):
    """(e4m3 values, float32 scales) of ``x`` (..., R, K) in blocks of ``block_rows`` x 128, each block scaled so
    that its largest magnitude is e4m3's 448; ragged edges padded for the amax only."""
    import torch

    *lead, r, k = x.shape
    rb, kb = -(-r // block_rows), -(-k // 128)
    padded = torch.nn.functional.pad(x, (0, kb * 128 - k, 0, rb * block_rows - r))
    blocks = padded.view(*lead, rb, block_rows, kb, 128)
    scales = blocks.abs().amax((-3, -1)).clamp_min(1e-6) / 448.0
    q = (blocks / scales[..., :, None, :, None]).view(*lead, rb * block_rows, kb * 128)[..., :r, :k]
    scales = scales if block_rows == 128 else scales.view(*lead, rb, kb)
    return q.to(torch.float8_e4m3fn).contiguous(), scales.float().contiguous()


def _error(out, ref) -> float:
    return float(((out.double() - ref).norm() / ref.norm()).item()) if not out.isnan().any() else float("nan")


def _time(run: Callable[[], Any], out, ref, m: int, n: int, k: int) -> dict[str, Any]:
    """Run once, check against ``ref`` with ``out`` poisoned, then time: the kernels alone (``do_bench_cudagraph``:
    the calls replayed from a CUDA graph, as a serving step or DeepGEMM's own benchmark sees them; the TFLOP/s)
    and the Python call (``do_bench``: CUDA events around each call after an L2 flush, which at M = 128 measures
    the host's time to launch rather than the kernel's)."""
    import torch

    from tilejit.testing import do_bench, do_bench_cudagraph

    try:
        run()
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        err = _error(out, ref)
        ms = float(do_bench_cudagraph(run))
        call_ms = float(do_bench(run))
    except Exception as error:  # noqa: BLE001 - one failing implementation must not stop the others
        return {"status": "ERROR", "error": f"{type(error).__name__}: {error}"[:300]}
    return {"status": "ok", "err": err, "ms": ms, "call_ms": call_ms, "tflops": matmul_tflops(m, n, k, ms)}


def _torch_blockwise(a, sa, b, sb, out):
    """``torch._scaled_mm`` with 1x128 x 128x128 block scales (the layouts torch's tests give it: the activation
    scale outer-dim-major, the weight scale's K blocks padded to a multiple of 4 and transposed)."""
    import torch

    sa_outer = sa.t().contiguous().t()
    kb = sb.shape[1]
    sb_padded = torch.nn.functional.pad(sb, (0, -kb % 4)).contiguous()
    scale_b = sb_padded.t()
    return lambda: out.copy_(torch._scaled_mm(a, b.t(), scale_a=sa_outer, scale_b=scale_b,
                                              out_dtype=torch.bfloat16))


def _expert_blockwise(a, sa, b, sb, out):
    """One expert's block-wise ``_scaled_mm`` (``_torch_blockwise``); where cuBLAS refuses the expert's row count
    (CUBLAS_STATUS_NOT_SUPPORTED from its heuristic for ragged counts), its rows padded with zeros to a multiple of 16 (up to 15
    rows more work; ``padded`` set on the returned callable)."""
    import torch

    run = _torch_blockwise(a, sa, b, sb, out)
    try:
        run()
        return run
    except RuntimeError:
        rows = -(-a.shape[0] // 16) * 16
        a_pad = torch.zeros(rows, a.shape[1], dtype=a.dtype, device=a.device)
        a_pad[:a.shape[0]] = a
        sa_pad = torch.ones(rows, sa.shape[1], dtype=sa.dtype, device=sa.device)
        sa_pad[:a.shape[0]] = sa
        out_pad = torch.empty(rows, out.shape[1], dtype=out.dtype, device=out.device)
        padded = _torch_blockwise(a_pad, sa_pad, b, sb, out_pad)

        def run_padded():
            padded()
            out.copy_(out_pad[:a.shape[0]])
        run_padded.padded = True
        return run_padded


def bench_dense(m: int, n: int, k: int) -> dict[str, Any]:
    import torch

    import tilejit.ops.fp8_blockscaled as F

    torch.manual_seed(m + n + k)
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(n, k, device="cuda"), 128)
    ref = F.reference(a, sa, b, sb)
    row: dict[str, Any] = {"m": m, "n": n, "k": k}
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    row["tilejit"] = _time(lambda: F.fp8_blockscaled_matmul(a, sa, b, sb, out=out), out, ref, m, n, k)
    row["tilejit"]["config"] = F.default_config(m, n, torch.cuda.get_device_capability()[0], k,
                                                torch.cuda.get_device_properties(0).multi_processor_count)
    row["torch_blockwise"] = _time(_torch_blockwise(a, sa, b, sb, out), out, ref, m, n, k)
    a16 = (a.double() * sa.double().repeat_interleave(128, 1)[:, :k]).to(torch.bfloat16)
    b16 = (b.double() * sb.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]).to(torch.bfloat16)
    row["cublas_bf16"] = _time(lambda: torch.mm(a16, b16.t(), out=out), out, ref, m, n, k)
    row["deepgemm_h800"] = DEEPGEMM_H800.get((m, n, k))
    return row


def bench_grouped(m: int, n: int, k: int) -> dict[str, Any]:
    """EXPERTS experts sharing ``m`` rows raggedly (counts drawn around m / EXPERTS)."""
    import torch

    import tilejit.ops.fp8_blockscaled as F

    torch.manual_seed(m + n + k + 1)
    weights = torch.rand(EXPERTS) + 0.5
    counts = (weights / weights.sum() * m).long()
    counts[-1] += m - int(counts.sum())
    offsets = torch.tensor([0] + counts.cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    a, sa = quantize(torch.randn(m, k, device="cuda"), 1)
    b, sb = quantize(torch.randn(EXPERTS, n, k, device="cuda"), 128)
    ref = F.grouped_reference(a, sa, b, sb, offsets)
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "experts": EXPERTS}
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    row["tilejit"] = _time(lambda: F.fp8_blockscaled_grouped_matmul(a, sa, b, sb, offsets, out=out), out, ref,
                           m, n, k)
    bounds = offsets.tolist()
    per_expert = [_expert_blockwise(a[lo:hi], sa[lo:hi], b[e], sb[e], out[lo:hi])
                  for e, (lo, hi) in enumerate(zip(bounds, bounds[1:])) if hi > lo]

    def loop():
        for run in per_expert:
            run()
    row["torch_blockwise"] = _time(loop, out, ref, m, n, k)
    row["torch_blockwise_padded"] = sum(getattr(run, "padded", False) for run in per_expert)
    row["deepgemm_h800"] = DEEPGEMM_H800.get(("grouped", EXPERTS, m // EXPERTS, n, k))
    return row


def _cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "n/a"
    if result.get("status") != "ok":
        return result.get("status", "n/a")
    return f"{result['tflops']:.0f} (err {result['err']:.1e})"


def table(rows: list[dict[str, Any]]) -> str:
    headers = ["shape", "tilejit TFLOP/s", "% of 1,979", "torch block-wise _scaled_mm", "cuBLAS bf16 (dequantized)",
               "tilejit / best torch", "DeepGEMM H800", "call us, tilejit / block-wise"]
    lines = []
    for r in rows:
        shape = f"{'grouped ' + str(r['experts']) + 'x ' if 'experts' in r else ''}{r['m']}x{r['n']}x{r['k']}"
        ours = r["tilejit"]
        torch_best = max((r[name]["tflops"] for name in ("torch_blockwise", "cublas_bf16")
                          if r.get(name, {}).get("status") == "ok"), default=None)
        ok = ours.get("status") == "ok"
        calls = [f"{1e3 * r[name]['call_ms']:.1f}" if r.get(name, {}).get("status") == "ok" else "n/a"
                 for name in ("tilejit", "torch_blockwise")]
        blockwise = _cell(r.get("torch_blockwise"))
        if r.get("torch_blockwise_padded"):
            blockwise += f" ({r['torch_blockwise_padded']} experts' rows padded to 16)"
        lines.append([shape, _cell(ours), f"{100 * ours['tflops'] / FP8_DENSE_PEAK_TFLOPS:.0f}%" if ok else "n/a",
                      blockwise, _cell(r.get("cublas_bf16")),
                      f"{ours['tflops'] / torch_best:.2f}x" if ok and torch_best else "n/a",
                      r.get("deepgemm_h800") or "-", " / ".join(calls)])
    return markdown_table(headers, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fp8_blockscaled", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only M in {QUICK_M}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder for the JSON (default {DEFAULT_OUT})")
    parser.add_argument("--results", type=Path, default=RUN_LOG_PATH, help="Markdown file the table is appended to")
    parser.add_argument("--no-append", action="store_true", help="do not append to the run log")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("benchmarks.fp8_blockscaled: no CUDA GPU visible", file=sys.stderr)
        return 2
    meta = machine_stamp()
    print(f"# block-scaled fp8 on {meta['gpu']}; {stamp_line(meta)}", flush=True)
    rows = []
    for n, k in NK_SHAPES:
        for m in QUICK_M if args.quick else M_SWEEP:
            rows.append(bench_dense(m, n, k))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    for n, k in NK_SHAPES[:2]:
        for m in (4096, 32768) if not args.quick else (4096,):
            rows.append(bench_grouped(m, n, k))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    write_json(args.out / "fp8_blockscaled.json", {"meta": meta, "rows": rows})
    if not args.no_append:
        append_results("Block-scaled fp8 (DeepSeek-V3 shapes)", text, meta, args.results, notes=[
            "e4m3, 1x128 activation and 128x128 weight float32 scales, bf16 out; err: relative Frobenius norm "
            "against float64 over the dequantized operands",
            "cuBLAS bf16: torch.mm on operands dequantized beforehand (dequantization not timed)",
            "DeepGEMM H800: README of deepseek-ai/DeepGEMM at 55ab91f (2025-03-25), H800 SXM5, NVCC 12.8"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
