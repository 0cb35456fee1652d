"""Where decode_attention's time goes: the same decode step under several page sizes, block sizes, ring depths,
warp counts and split counts, as achieved GB/s of the cache it reads (a probe, not a benchmark).

    python scripts/probes/decode_variants.py [--batch 32] [--context 32768] [--quick]

Rows: the default plan first for each page size (None: a contiguous cache), then the variants: block size, ring
depth and warps (a page of 16 keys caps the block at 16: there the warps are the variants, 4 warps being the
scalar-FMA score product the default avoids), then split counts. Every launch is checked against the float64
reference of one sequence before it is timed; the config column is what the launch ran with (``plan``).
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


def block_variants(page):
    """(BN, STAGES, num_warps) configs to try for a page size: where the page caps the block at 16 keys, ring
    depths and warps of that block (4 warps: the scalar score product); else block sizes in 1, 2 and 4 warps (none
    of these spill on sm_90a)."""
    if page is not None and page % 32:
        return [dict(BN=16, STAGES=stages, num_warps=warps) for stages, warps in
                [(2, 1), (3, 1), (6, 1), (8, 1), (4, 2), (8, 2), (4, 4)]]
    return [dict(BN=bn, STAGES=stages, num_warps=warps) for bn, stages, warps in
            [(16, 4, 1), (16, 8, 1), (32, 4, 2), (32, 6, 2), (32, 4, 4), (32, 6, 4), (64, 2, 4), (64, 4, 4),
             (128, 3, 8)]]


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
        splits = decode.plan(q, k, table)[2]
        variants = [({}, None)]
        if not ns.quick:
            variants += [(config, None) for config in block_variants(page)]
            variants += [({}, s) for s in (1, 2, 4, 8, 16) if s != splits]
        for config, split in variants:
            ran, shown = decode.plan(q, k, table, config=config)[0], split or splits
            label = ("default " if not config else "") + ", ".join(
                f"{key}={ran[key]}" for key in ("BN", "STAGES", "num_warps"))
            try:
                out = decode.decode_attention_forward(q, k, v, lens, table, num_splits=split, **config)
                err = (out[:1].double() - want.to(out.device)).abs().max().item()
                if not err < 2e-2:
                    print(f"| {page} | {label} | {shown} | wrong: max err {err:.3g} | | {name} |")
                    continue
                ms = do_bench(lambda: decode.decode_attention_forward(q, k, v, lens, table, num_splits=split,
                                                                      **config))
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile or launch is a row too
                print(f"| {page} | {label} | {shown} | {type(exc).__name__}: {str(exc)[:80]} | | {name} |")
                continue
            print(f"| {page} | {label} | {shown} | {ms * 1e3:.1f} | {nbytes / ms / 1e6:.0f} "
                  f"| {name} |", flush=True)


if __name__ == "__main__":
    main()
