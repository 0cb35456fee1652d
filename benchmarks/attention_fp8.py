"""float8 attention forward TFLOP/s and error: ``tilejit.ops.attention_fp8`` (e4m3 q, k, v) against tilejit's bf16
``attention()`` and SDPA's cuDNN and flash backends in bf16, on the same random inputs.

    python -m benchmarks.attention_fp8 [--seqs 1024,2048,4096,8192,16384] [--dims 128] [--scales tensor,block]
                                       [--tune all|default] [--out DIR]
    python -m benchmarks.attention --mode fp8 ...   # the same run, through the attention benchmark

16k tokens per problem (batch = 16384 // seq), 16 heads, causal and not. FLOPs 4 * B * H * S^2 * D (halved when
causal), for every column alike. Columns:

- ``fp8``: the kernel alone on a v transposed beforehand (``v_transposed=True``), the fastest config of
  ``fp8_attention.CONFIGS`` (each also warp-specialized with a 2- and a 3-deep ring on sm_90), or with ``--tune default``
  the config ``attention_fp8`` takes; ``fp8 + transpose``: the call on v as (B, H, S, D), which transposes it
  first (one read and write of v);
- ``bf16``: ``tilejit.ops.attention`` with its default config (what ``attention(q, k, v)`` runs); ``cuDNN`` and
  ``flash``: SDPA in bf16;
- ``err``: relative Frobenius error of each against float64 attention of the float32 inputs (the first batch
  entry, 2 heads); the fp8 one includes e4m3's rounding of q, k and v (about 4.7% of the output's norm on randn
  inputs) and of P; ``err deq``: fp8's against float64 attention of the dequantized e4m3 inputs (P's rounding
  and the kernel's own).

Every timing goes through ``tilejit.testing.do_bench`` in one process on one GPU. Scales: ``tensor`` (one per
tensor) or ``block`` (one per 128 rows / keys).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import DEFAULT_OUT, append_results, machine_stamp, markdown_table, write_json
from tilejit.ops import fp8_attention as fa
from tilejit.ops import fused_attention

HEADERS = ["D", "seq", "batch", "scales", "causal", "fp8 TFLOP/s", "config", "fp8 + transpose", "bf16 attention()",
           "SDPA cuDNN bf16", "SDPA flash bf16", "fp8 / bf16 attention()", "fp8 / cuDNN", "fp8 err", "fp8 err deq",
           "bf16 err", "cuDNN err"]


def _tflops(batch, heads, seq, dim, causal, ms):
    return 4.0 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12


def _error(out, ref):
    return ((out[:1, :2].double() - ref).norm() / ref.norm()).item()


def _label(cfg):
    return (f"{cfg['BM']}x{cfg['BN']} w{cfg['num_warps']}" + (" ws" if cfg.get("warp_specialize") else "")
            + (f" s{cfg['STAGES']}" if cfg.get("STAGES", 2) != 2 else ""))


def _configs(dim, tune):
    hopper = torch.cuda.get_device_capability()[0] == 9
    if tune == "default":
        return [fa.default_config(dim, hopper=hopper)]
    modes = (0, 2, 3) if hopper else (0,)  # not warp-specialized, or with a ring of 2 or 3 stages
    return [dict(BM=bm, BN=bn, num_warps=w, **(dict(warp_specialize=True, STAGES=ws) if ws else {}))
            for bm, bn, w in fa.CONFIGS[dim] for ws in modes]


def _fp8_best(q, k, vt, scales, causal, tflops, tune):
    """(ms, label, output) of the fastest fp8 config on the pre-transposed v."""
    from tilejit.testing import do_bench

    qs, ks, vs = scales
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    best = None
    for cfg in _configs(q.shape[3], tune):
        def run():
            fa.attention_fp8(q, k, vt, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal, v_transposed=True,
                             out=out, **cfg)
        ms = do_bench(run)
        print(f"  fp8 {tuple(q.shape)} causal={causal} {_label(cfg)}: {tflops(ms):.1f} TFLOP/s", flush=True)
        if best is None or ms < best[0]:
            best = (ms, _label(cfg), out.clone())
    return best


def _baselines(raw16, causal, tflops):
    """{name: (TFLOP/s or None, output or None)} of bf16 attention() and SDPA's cuDNN and flash backends."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tilejit.testing import do_bench

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(*raw16, is_causal=causal)
        return run

    runs = {"bf16 attention()": lambda: fused_attention.attention(*raw16, causal=causal),
            "SDPA cuDNN bf16": sdpa(SDPBackend.CUDNN_ATTENTION), "SDPA flash bf16": sdpa(SDPBackend.FLASH_ATTENTION)}
    results = {}
    for name, run in runs.items():
        try:
            out = run()
            results[name] = (tflops(do_bench(run)), out)
        except Exception as e:  # a backend that does not take this shape: n/a, said why
            results[name] = (None, None)
            print(f"{name} unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return results


def measure(dim, seq, heads, per_block, causal, tune):
    """One row: TFLOP/s and errors of fp8 and the bf16 baselines on one set of randn inputs."""
    from tilejit.testing import do_bench

    batch = max(1, 16384 // seq)
    torch.manual_seed(seq + dim)
    raw = [torch.randn(batch, heads, seq, dim, device="cuda") for _ in range(3)]
    (q, qs), (k, ks), (v, vs) = (fa.quantize(t, per_block) for t in raw)
    vt = fa.transpose_v(v)

    def tflops(ms):
        return _tflops(batch, heads, seq, dim, causal, ms)

    exact = fused_attention.reference(*(t[:1, :2].double() for t in raw), causal)
    dequantized = fa.reference(*(t[:1, :2] for t in (q, k, v)), *(s if s.dim() == 0 else s[:1, :2]
                                                                  for s in (qs, ks, vs)), causal)
    ms, label, out = _fp8_best(q, k, vt, (qs, ks, vs), causal, tflops, tune)
    end_to_end = tflops(do_bench(lambda: fa.attention_fp8(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs,
                                                          causal=causal)))
    baselines = _baselines([t.bfloat16() for t in raw], causal, tflops)
    row = {"dim": dim, "seq": seq, "batch": batch, "scales": "block" if per_block else "tensor", "causal": causal,
           "fp8": tflops(ms), "config": label, "fp8 + transpose": end_to_end, "fp8 err": _error(out, exact),
           "fp8 err deq": _error(out, dequantized)}
    for name, (speed, result) in baselines.items():
        row[name] = speed
        row[f"{name} err"] = _error(result, exact) if result is not None else None
    return row


def table_row(row):
    bf16, cudnn = row["bf16 attention()"], row["SDPA cuDNN bf16"]
    return [row["dim"], row["seq"], row["batch"], row["scales"], "yes" if row["causal"] else "no", row["fp8"],
            row["config"], row["fp8 + transpose"], bf16, cudnn, row["SDPA flash bf16"],
            f"{row['fp8'] / bf16:.2f}" if bf16 else None, f"{row['fp8'] / cudnn:.2f}" if cudnn else None,
            row["fp8 err"], row["fp8 err deq"], row["bf16 attention() err"], row["SDPA cuDNN bf16 err"]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    parser.add_argument("--dims", default="128")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--scales", default="tensor,block", help="tensor, block or tensor,block")
    parser.add_argument("--tune", choices=("all", "default"), default="all",
                        help="all: the fastest fp8 config of the space; default: the config attention_fp8 takes")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)


def run(ns) -> int:
    scales = ns.scales.split(",")
    if not scales or set(scales) - {"tensor", "block"}:
        raise SystemExit(f"--scales takes tensor and/or block, not {ns.scales!r}")
    if torch.cuda.get_device_capability() < (8, 9):
        raise SystemExit("attention_fp8 needs float8 tensor-core products (sm_89 or newer)")
    rows = []
    for dim in (int(d) for d in ns.dims.split(",")):
        for seq in (int(s) for s in ns.seqs.split(",")):
            for form in scales:
                for causal in (False, True):
                    rows.append(measure(dim, seq, ns.heads, form == "block", causal, ns.tune))
                    print(table_row(rows[-1]), flush=True)
    meta = machine_stamp()
    table = markdown_table(HEADERS, [table_row(r) for r in rows])
    print(table)
    append_results(f"Attention forward, fp8 e4m3 against bf16, {ns.heads} heads, 16k tokens", table, meta, notes=[
        "fp8: tilejit.ops.attention_fp8 on a pre-transposed v (the kernel alone); fp8 + transpose: the call that "
        "transposes v first. bf16 attention(): tilejit's default config. Errors: relative Frobenius norm against "
        "float64 attention of the float32 inputs (first batch entry, 2 heads); err deq: fp8 against float64 of "
        "its dequantized e4m3 inputs (P's rounding)."])
    write_json(ns.out / "attention_fp8.json", {"meta": meta, "results": rows})
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
