"""Where decode_attention's time goes: the same decode step under several page sizes, block sizes, ring depths,
warp counts and split counts, as achieved GB/s of the cache it reads (a probe, not a benchmark).

    python scripts/probes/decode_variants.py [--batch 32] [--context 32768] [--quick]

Rows: the default plan first for each page size (None: a contiguous cache), then the variants. Every launch is
checked against the float64 reference of one sequence before it is timed.
"""
from __future__ import annotations

import argparse
import importlib
import math

import torch

from tilejit.testing import do_bench

decode = importlib.import_module("tilejit.ops.decode_attention")


def cache(batch, context, heads, kv_heads, dim, page, dtype):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    if page is None:
        k = torch.randn(batch, context, kv_heads, dim, device="cuda", dtype=dtype)
        return q, k, torch.randn_like(k), lens, None
    per_seq = math.ceil(context / page)
    k = torch.randn(batch * per_seq, page, kv_heads, dim, device="cuda", dtype=dtype)
    table = torch.randperm(batch * per_seq, device="cuda", dtype=torch.int32).view(batch, per_seq)
    return q, k, torch.randn_like(k), lens, table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--pages", default="none,16,64,256")
    parser.add_argument("--quick", action="store_true", help="default plans only")
    ns = parser.parse_args()
    heads, kv_heads, dim, dtype = 64, 8, 128, torch.bfloat16
    name = torch.cuda.get_device_name()
    print("| page | config | splits | us | GB/s | device |\n| --- | --- | --- | --- | --- | --- |")
    for page_text in ns.pages.split(","):
        page = None if page_text == "none" else int(page_text)
        q, k, v, lens, table = cache(ns.batch, ns.context, heads, kv_heads, dim, page, dtype)
        nbytes = 2 * ns.batch * ns.context * kv_heads * dim * dtype.itemsize
        want = decode.reference(q[:1], k, v, lens[:1], None if table is None else table[:1])
        planned, gather, splits = decode.plan(q, k, table)
        variants = [({}, None)]
        if not ns.quick:
            for bn, stages, warps in [(32, 4, 4), (64, 2, 4), (64, 4, 4), (64, 3, 8), (128, 2, 4), (128, 3, 4),
                                      (128, 3, 8)]:
                variants.append((dict(BN=bn, STAGES=stages, num_warps=warps), None))
            for s in (1, 4, 16):
                if s != splits:
                    variants.append(({}, s))
        for config, split in variants:
            label = ", ".join(f"{key}={val}" for key, val in config.items()) or f"default {planned}"
            try:
                out = decode.decode_attention_forward(q, k, v, lens, table, num_splits=split, **config)
                err = (out[:1].double() - want).abs().max().item()
                if not err < 2e-2:
                    print(f"| {page} | {label} | {split} | wrong: max err {err:.3g} | | {name} |")
                    continue
                ms = do_bench(lambda: decode.decode_attention_forward(q, k, v, lens, table, num_splits=split,
                                                                      **config))
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile or launch is a row too
                print(f"| {page} | {label} | {split} | {type(exc).__name__}: {str(exc)[:80]} | | {name} |")
                continue
            print(f"| {page} | {label} | {split if split else splits} | {ms * 1e3:.1f} | {nbytes / ms / 1e6:.0f} "
                  f"| {name} |", flush=True)


if __name__ == "__main__":
    main()
