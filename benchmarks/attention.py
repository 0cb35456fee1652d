"""Attention TFLOP/s, forward and backward: tilejit.ops' attention against torch SDPA (flash and cuDNN
backends) and a Triton FlashAttention-2-style baseline.

    python -m benchmarks.attention [--passes fwd,bwd] [--dtypes bf16,fp16] [--seqs 1024,4096] [--dims 64,128]
                                   [--tune all|default] [--sm80-path] [--out DIR]
    python -m benchmarks.attention --plot attention.json --out DIR   # redraw the PNGs of stored results
    python -m benchmarks.attention --mode fp8 [benchmarks.attention_fp8's arguments]   # e4m3 against bf16
    python -m benchmarks.attention --mode decode [options]   # paged-cache decode: benchmarks/decode_attention.py
    python -m benchmarks.attention --mode varlen [options]   # packed variable lengths: benchmarks/varlen_attention.py

16k tokens per problem (batch = 16384 // seq), 16 heads; causal and not; bf16 unless ``--dtypes`` says more.
Every timing goes through ``tilejit.testing.do_bench`` (the forward's one-loop comparison also through
``do_bench_cudagraph``) in one process on one GPU, and every implementation is checked against float64 (a slice
of the batch) before it is timed.

- ``fwd``: the forward. FLOPs 4 * B * H * S^2 * D (halved when causal). tilejit takes the fastest config of
  ``tilejit.ops.fused_attention.CONFIGS`` for the head dim, each also warp-specialized on sm_90 (" ws", with a
  3-deep ring: " s3"); ``--tune default`` times only the config ``attention()`` takes when given none. Beside it,
  "one loop": ``benchmarks.kernels.attention_one_loop``, the forward written the obvious way (one ``T.range``
  loop, ``T.where`` masks, no launch options but tiles and warps), the fastest of the same tiles, with the
  compiler's mask peeling (the default) and without it (``peel_masks=False``, "unpeeled"). The "graph" columns
  time the same configs again from CUDA-graph replays (``do_bench_cudagraph``: the kernels alone, no L2 flush),
  the fastest config of each: ``do_bench`` flushes the L2 before each call, so a launch whose host path outlasts
  the flush (``attention()``'s operator dispatch, a launcher still being built) shows in its time.
- ``bwd``: the backward alone (the forward runs once beforehand and is not timed): tilejit's three kernels
  (``attention_backward``), SDPA's backward node (``torch.autograd.grad`` of one forward's output, graph
  retained), Triton's three kernels. FLOPs 2.5x the forward's (as FlashAttention counts: 5 products instead of
  2), halved when causal. tilejit takes the fastest dK/dV config of ``BWD_CONFIGS`` (with the default dQ
  config), then the fastest dQ config with it.
- ``--sm80-path`` (Hopper GPUs): tilejit's kernels compiled as the sm_80 path (``benchmarks.kernels.SM80_PINS``,
  mma.sync and cp.async pinned) over the configs an sm_80 GPU takes, next to the same baselines.

Triton: ``benchmarks.triton_kernels`` (forward autotuned over 6 configs, backward over 5 per kernel); its
column reads n/a without Triton.
"""
from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch

from benchmarks.common import DEFAULT_OUT, append_results, bar_chart, machine_stamp, markdown_table, write_json
from tilejit.ops import fused_attention as attention

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEADERS = ["D", "seq", "batch", "dtype", "causal", "tilejit TFLOP/s", "config", "one loop", "one loop config",
           "one loop unpeeled", "SDPA flash", "SDPA cuDNN", "Triton", "tilejit / cuDNN", "tilejit / Triton",
           "one loop / tilejit", "tilejit graph", "one loop graph", "one loop / tilejit, graph"]


def _tflops(batch, heads, seq, dim, causal, ms, backward=False):
    flops = 4.0 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    return flops / (ms * 1e-3) / 1e12


def _tflops_of(q, causal, ms, backward=True):
    batch, heads, seq, dim = q.shape
    return _tflops(batch, heads, seq, dim, causal, ms, backward)


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _sdpa_backward(backend):
    """SDPA's backward alone: one forward (its node chosen under ``backend``) whose graph each call walks again."""
    from torch.nn.attention import sdpa_kernel

    def setup(q, k, v, do, causal):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)
    return setup


def _triton_backward(triton_kernels):
    def setup(q, k, v, do, causal):
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        out = triton_kernels.attention(q, k, v, causal, lse=lse)
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        delta = torch.empty_like(lse)
        return lambda: triton_kernels.attention_backward(do, q, k, v, out, lse, causal, grads=grads, delta=delta)
    return setup


def _reference_grads(q, k, v, do, causal):
    """float64 autograd gradients of the first batch entry's first two heads (no GQA here: they depend on
    those heads only)."""
    leaves = [t[:1, :2].detach().double().requires_grad_() for t in (q, k, v)]
    attention.reference(*leaves, causal).backward(do[:1, :2].double())
    return [t.grad for t in leaves]


def _grad_error(grads, ref):
    """The largest error of the three gradients, each relative to its reference's largest magnitude."""
    return max((g[:1, :2].double() - r).abs().max().item() / r.abs().max().item() for g, r in zip(grads, ref))


def _row(dim, seq, batch, dtype, causal, best, baselines, tflops):
    row = {"dim": dim, "seq": seq, "batch": batch, "dtype": dtype, "causal": causal,
           "tilejit": tflops(best[0]), "config": best[1]}
    row.update(baselines)
    return row


def _table_row(row):
    return [row["dim"], row["seq"], row["batch"], row["dtype"], "yes" if row["causal"] else "no", row["tilejit"],
            row["config"], row.get("one loop"), row.get("one loop config"), row.get("one loop unpeeled"),
            row["SDPA flash"], row["SDPA cuDNN"], row.get("Triton"),
            row["tilejit"] / row["SDPA cuDNN"] if row["SDPA cuDNN"] else None,
            row["tilejit"] / row["Triton"] if row.get("Triton") else None,
            row["one loop"] / row["tilejit"] if row.get("one loop") else None,
            row.get("tilejit graph"), row.get("one loop graph"),
            row["one loop graph"] / row["tilejit graph"] if row.get("one loop graph") and row.get("tilejit graph")
            else None]


def _label(cfg):
    return (f"{cfg['BM']}x{cfg['BN']} w{cfg['num_warps']}" + (" ws" if cfg.get("warp_specialize") else "")
            + (f" s{cfg['STAGES']}" if cfg.get("STAGES", 2) != 2 else ""))


#: ``--sm80-path``: tilejit's kernels compiled as the sm_80 path (``benchmarks.kernels.SM80_PINS``) with the
#: configs of a GPU without Hopper's options
SM80_PATH = False


def _hopper_configs() -> bool:
    """Whether tilejit's configs are those of sm_90 (warp-specialized modes, Hopper defaults)."""
    return not SM80_PATH and torch.cuda.get_device_capability()[0] == 9


def _forward(q, k, v, causal, baselines, tflops, tune="all"):
    from tilejit.testing import do_bench, do_bench_cudagraph

    ref = attention.reference(q[:1, :2], k[:1, :2], v[:1, :2], causal)
    best = best_graph = None
    hopper = _hopper_configs()
    if tune == "default":  # what attention() takes when given no config
        configs = [attention.default_config(q.shape[3], causal, hopper=hopper)]
    else:
        # on sm_90 each config also runs with its key/value loop warp-specialized (a producer warpgroup fills the
        # ring), with a 2- and a 3-deep ring (the deferred p @ v holds two slots)
        modes = (False, True, 3) if hopper else (False,)
        configs = [dict(BM=bm, BN=bn, num_warps=warps, **({"warp_specialize": True} if ws else {}),
                        **({"STAGES": 3} if ws == 3 else {}))
                   for (bm, bn, warps), ws in ((c, ws) for c in attention.CONFIGS[q.shape[3]] for ws in modes)]
    for cfg in configs:
        out = attention.attention(q, k, v, causal=causal, **cfg)
        err = (out[:1, :2].double() - ref).abs().max().item()
        if err > 3e-2:
            raise AssertionError(f"tilejit attention {cfg} is wrong: max |err| {err}")
        ms = do_bench(lambda: attention.attention(q, k, v, causal=causal, out=out, **cfg))
        graph_ms = do_bench_cudagraph(lambda: attention.attention(q, k, v, causal=causal, out=out, **cfg))
        print(f"  fwd {tuple(q.shape)} causal={causal} {cfg}: {tflops(ms):.1f} TFLOP/s, graph {tflops(graph_ms):.1f}",
              flush=True)
        if best is None or ms < best[0]:
            best = (ms, _label(cfg))
        best_graph = graph_ms if best_graph is None else min(best_graph, graph_ms)
    results = _one_loop(q, k, v, causal, ref, tflops)
    results["tilejit graph"] = tflops(best_graph)
    for name, fn in baselines.items():
        try:
            err = (fn(q, k, v, causal)[:1, :2].double() - ref).abs().max().item()
            if err > 3e-2:
                raise RuntimeError(f"wrong result: max |err| {err}")
            results[name] = tflops(do_bench(lambda: fn(q, k, v, causal)))
        except Exception as e:  # a backend that does not take this shape, or fails: n/a, said why
            results[name] = None
            print(f"{name} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return best, results


def _one_loop(q, k, v, causal, ref, tflops):
    """The "one loop" columns: the obvious forward (``benchmarks.kernels.attention_one_loop``) over the tiles of
    ``tilejit.ops.fused_attention.CONFIGS`` (no other launch option), peeled (its best config) and unpeeled (that config
    with ``peel_masks=False``)."""
    import tilejit
    from benchmarks.kernels import attention_one_loop
    from tilejit.testing import do_bench, do_bench_cudagraph

    batch, heads, seq, dim = q.shape
    out = torch.empty_like(q)

    def timed(bm, bn, warps, peel):
        def run():
            attention_one_loop[(tilejit.cdiv(seq, bm), heads, batch)](q, k, v, out, dim ** -0.5, BM=bm, BN=bn, D=dim,
                                                                      CAUSAL=causal, num_warps=warps,
                                                                      **({} if peel else {"peel_masks": False}))
        run()
        err = (out[:1, :2].double() - ref).abs().max().item()
        if err > 3e-2:
            raise AssertionError(f"the one-loop forward {bm}x{bn} w{warps} is wrong: max |err| {err}")
        return do_bench(run), do_bench_cudagraph(run)

    best = best_graph = None
    for bm, bn, warps in attention.CONFIGS[dim]:
        ms, graph_ms = timed(bm, bn, warps, True)
        print(f"  one loop {tuple(q.shape)} causal={causal} {bm}x{bn} w{warps}: {tflops(ms):.1f} TFLOP/s, "
              f"graph {tflops(graph_ms):.1f}", flush=True)
        if best is None or ms < best[0]:
            best = (ms, (bm, bn, warps))
        best_graph = graph_ms if best_graph is None else min(best_graph, graph_ms)
    bm, bn, warps = best[1]
    return {"one loop": tflops(best[0]), "one loop config": f"{bm}x{bn} w{warps}",
            "one loop unpeeled": tflops(timed(bm, bn, warps, False)[0]), "one loop graph": tflops(best_graph)}


def _backward(q, k, v, causal, baselines, tflops, tune="all"):
    from tilejit.testing import do_bench

    dim = q.shape[3]
    do = torch.randn_like(q)
    ref = _reference_grads(q, k, v, do, causal)
    out, lse = attention.attention_forward(q, k, v, causal=causal)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    delta = torch.empty_like(lse)

    def timed(cfg):
        def run():
            return attention.attention_backward(do, q, k, v, out, lse, causal=causal, dq=grads[0], dk=grads[1],
                                                dv=grads[2], delta=delta, config=cfg)
        run()
        err = _grad_error(grads, ref)
        if err > 2e-2:
            raise AssertionError(f"tilejit attention backward {cfg} is wrong: max relative |err| {err}")
        return do_bench(run)

    def label(c):
        return f"{c['BM']}x{c['BN']} w{c['num_warps']}" + (" ws" if c.get("warp_specialize") else "")

    hopper = _hopper_configs()
    sm80 = SM80_PATH or torch.cuda.get_device_capability()[0] == 8
    default = attention.default_bwd_config(dim, hopper=hopper, sm80=sm80)
    best = (timed(default), default) if tune == "default" else None
    # on sm_90 the dQ configs also run warp-specialized
    for kernel in ("dkdv", "dq") if tune == "all" else ():
        base = best[1] if best else default
        own = (default[kernel]["BM"], default[kernel]["BN"], default[kernel]["num_warps"])
        space = attention.BWD_CONFIGS[dim][kernel]
        for (bm, bn, warps), ws in ((c, ws) for c in ([own] if own not in space else []) + space
                                    for ws in ((False, True) if hopper and kernel == "dq" else (False,))):
            cfg = {**base, kernel: dict(BM=bm, BN=bn, num_warps=warps, **({"warp_specialize": True} if ws else {}))}
            ms = timed(cfg)
            print(f"  bwd {tuple(q.shape)} causal={causal} {kernel} {cfg[kernel]}: "
                  f"{_tflops_of(q, causal, ms):.1f} TFLOP/s", flush=True)
            if best is None or ms < best[0]:
                best = (ms, cfg)
    best = (best[0], f"dkdv {label(best[1]['dkdv'])}, dq {label(best[1]['dq'])}")
    results = {}
    for name, setup in baselines.items():
        try:
            run = setup(q, k, v, do, causal)
            err = _grad_error(run(), ref)
            if err > 2e-2:
                raise RuntimeError(f"wrong result: max relative |err| {err}")
            results[name] = tflops(do_bench(run))
        except Exception as e:  # a backend that does not take this shape, or fails: n/a, said why
            results[name] = None
            print(f"{name} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return best, results


BASELINES = ("SDPA flash", "SDPA cuDNN", "Triton")
_MODE = argparse.ArgumentParser(add_help=False)
#: The modes that run a benchmark module of their own: fp8 (e4m3 attention_fp8 against bf16), decode (paged-cache
#: decode_attention against SDPA and FlashInfer), varlen (packed variable lengths against the padded forward).
MODE_MODULES = {"fp8": "attention_fp8", "decode": "decode_attention", "varlen": "varlen_attention"}
_MODE.add_argument("--mode", choices=("default", *MODE_MODULES), default="default",
                   help="fp8, decode or varlen: benchmarks/attention_fp8.py, decode_attention.py or "
                        "varlen_attention.py, with their own arguments (their --help)")
TITLES = {"fwd": "Attention forward", "bwd": "Attention backward (forward excluded)"}


def plot(rows, meta, title, path: Path) -> Path | None:
    """Grouped bars of TFLOP/s per (D, seq, causal, dtype) row, tilejit and the baselines, and tilejit / cuDNN and
    tilejit / Triton below; None without matplotlib."""
    labels = [f"D{r['dim']} S{r['seq']}\n{r['dtype']}{' causal' if r['causal'] else ''}" for r in rows]
    bars = {name: [r.get(name) or 0.0 for r in rows] for name in ("tilejit", *BASELINES)}
    ratios = {f"tilejit / {name}": [r["tilejit"] / r[name] if r.get(name) else 0.0 for r in rows]
              for name in ("SDPA cuDNN", "Triton")}
    return bar_chart(path, title, meta, labels, bars, ratios, width=0.2, ratio_width=0.35, per_label=0.7)


def plot_json(path: Path, out: Path) -> list[Path]:
    """The PNGs of a stored ``attention.json`` (no GPU needed): ``attention_fwd.png`` / ``attention_bwd.png``."""
    import json

    data = json.loads(Path(path).read_text())
    written = []
    for p, key in (("fwd", "results"), ("bwd", "backward")):
        if data.get(key):
            png = plot(data[key], data["meta"], TITLES[p], out / f"attention_{p}.png")
            if png is not None:
                written.append(png)
    return written


def main(argv=None) -> int:
    mode, rest = _MODE.parse_known_args(argv)
    if mode.mode in MODE_MODULES:  # a benchmark of its own, with its own arguments (--help there)
        return importlib.import_module(f"benchmarks.{MODE_MODULES[mode.mode]}").main(rest)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[_MODE])
    parser.add_argument("--passes", default="fwd", help="fwd, bwd or fwd,bwd")
    parser.add_argument("--dtypes", default="bf16", help="bf16, fp16 or bf16,fp16")
    parser.add_argument("--seqs", default="1024,4096")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tune", choices=("all", "default"), default="all",
                        help="all: the fastest config of the space (each timed); default: the config attention() "
                             "takes when given none")
    parser.add_argument("--sm80-path", action="store_true",
                        help="compile tilejit's kernels as the sm_80 path (mma.sync and cp.async pinned) with an "
                             "sm_80 GPU's configs (Hopper GPUs only; the baselines are unchanged)")
    parser.add_argument("--plot", type=Path, metavar="JSON",
                        help="only draw the PNGs of a stored attention.json into --out (no GPU needed)")
    ns = parser.parse_args(argv)
    if ns.plot is not None:
        ns.out.mkdir(parents=True, exist_ok=True)
        written = plot_json(ns.plot, ns.out)
        print("\n".join(f"wrote {p}" for p in written) if written else "no plot (matplotlib is not installed)")
        return 0
    passes = ns.passes.split(",")
    if not passes or set(passes) - {"fwd", "bwd"}:
        parser.error(f"--passes takes fwd and/or bwd, not {ns.passes!r}")
    dtypes = ns.dtypes.split(",")
    if not dtypes or set(dtypes) - set(DTYPES):
        parser.error(f"--dtypes takes {', '.join(DTYPES)}, not {ns.dtypes!r}")
    if ns.sm80_path:
        global SM80_PATH
        if torch.cuda.get_device_capability()[0] != 9:
            parser.error("--sm80-path compiles the sm_80 path for sm_90a: it needs a Hopper GPU")
        import os

        from benchmarks.kernels import SM80_PINS
        os.environ.update(SM80_PINS)
        SM80_PATH = True
    from torch.nn.attention import SDPBackend

    fwd_baselines = {"SDPA flash": _sdpa(SDPBackend.FLASH_ATTENTION), "SDPA cuDNN": _sdpa(SDPBackend.CUDNN_ATTENTION)}
    bwd_baselines = {"SDPA flash": _sdpa_backward(SDPBackend.FLASH_ATTENTION),
                     "SDPA cuDNN": _sdpa_backward(SDPBackend.CUDNN_ATTENTION)}
    try:
        from benchmarks import triton_kernels
        fwd_baselines["Triton"] = lambda q, k, v, causal: triton_kernels.attention(q, k, v, causal)
        bwd_baselines["Triton"] = _triton_backward(triton_kernels)
    except ImportError as e:  # Triton is optional: its column reads n/a
        print(f"Triton unavailable: {e}")
    records = {p: [] for p in passes}
    for dim in (int(d) for d in ns.dims.split(",")):
        for seq in (int(s) for s in ns.seqs.split(",")):
            batch = max(1, 16384 // seq)
            for dtype in dtypes:
                torch.manual_seed(seq + dim)
                q, k, v = (torch.randn(batch, ns.heads, seq, dim, device="cuda", dtype=DTYPES[dtype])
                           for _ in range(3))
                for causal in (False, True):
                    for p in passes:
                        def tflops(ms, backward=p == "bwd"):
                            return _tflops(batch, ns.heads, seq, dim, causal, ms, backward)

                        run, baselines = (_forward, fwd_baselines) if p == "fwd" else (_backward, bwd_baselines)
                        best, results = run(q, k, v, causal, baselines, tflops, ns.tune)
                        records[p].append(_row(dim, seq, batch, dtype, causal, best, results, tflops))
                        print(p, _table_row(records[p][-1]), flush=True)
    meta = machine_stamp()
    out = {"meta": meta}
    titles = TITLES
    notes = {
        "fwd": [f"tilejit: tilejit.ops.attention, {'the best config of its space' if ns.tune == 'all' else 'its default config'}"
                " (ws: warp-specialized, the p @ v of one key block issued under the next block's q @ k^T; "
                "s3: a 3-deep ring; on sm_90a P feeds the second wgmma from registers; the causal mask only on "
                "diagonal blocks). Triton: benchmarks/triton_kernels.attention, a FlashAttention-2-style kernel "
                "autotuned over 6 configs."],
        "bwd": ["Backward only: the forward (with its log-sum-exp) runs once before timing. FLOPs 2.5x the "
                "forward's (halved when causal), as FlashAttention counts.",
                "tilejit: tilejit.ops.attention_backward (preprocess, dK/dV per key block, dQ per query "
                "block; P^T, dS^T and dS feed wgmma from registers on sm_90a), best dK/dV then best dQ config of "
                "BWD_CONFIGS. SDPA: torch.autograd.grad through the backend's node (graph retained). Triton: "
                "benchmarks/triton_kernels.attention_backward, the same three kernels autotuned over 5 configs "
                "each."],
    }
    if SM80_PATH:
        for p in passes:
            notes[p].insert(0, "tilejit through the sm_80 path (--sm80-path: mma.sync and cp.async pinned, an sm_80 "
                               "GPU's configs) on this Hopper GPU.")
    for p in passes:
        table = markdown_table(HEADERS, [_table_row(r) for r in records[p]])
        print(table)
        out["results" if p == "fwd" else "backward"] = records[p]
        append_results(f"{titles[p]}, {'/'.join(dtypes)}, {ns.heads} heads, 16k tokens", table, meta, notes=notes[p])
    write_json(ns.out / "attention.json", out)
    for path in plot_json(ns.out / "attention.json", ns.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
