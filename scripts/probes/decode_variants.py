"""Where decode_attention's time goes: the same decode step under several page sizes, block sizes, ring depths,
warp counts and split counts, as achieved GB/s of the cache it reads (a probe, not a benchmark).

    python scripts/probes/decode_variants.py [--batch 32] [--context 32768] [--quick]
    python scripts/probes/decode_variants.py --grid --batches 8,32,128 --contexts 4096,32768 [--pages 16]

``--grid``: every split count (1-16) against every ring depth (2-6) of the default block, each timed from CUDA-graph
replays as well as by ``do_bench``, with the blocks an SM holds (the occupancy API on the compiled kernel) and the
waves the grid takes: what a plan counting resident blocks would choose.

Rows: the default plan first for each page size (None: a contiguous cache), then the variants: block size, ring
depth and warps (a page of 16 keys caps the block at 16: there the warps are the variants, 4 warps being the
scalar-FMA score product the default avoids), then split counts. Every launch is checked against the float64
reference of one sequence before it is timed; the config column is what the launch ran with (``plan``).
"""
from __future__ import annotations

import argparse
import math

import torch

from tilejit.testing import do_bench, do_bench_cudagraph
import tilejit.ops.paged_decode as decode


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


def resident_blocks(q, k, v, lens, table, out, config, splits) -> int:
    """Blocks of the ``decode_fwd`` this call launches that one SM holds (the occupancy API on its loaded kernel)."""
    from tilejit.runtime.launch import resident_blocks as blocks_of
    _, args, keywords, _ = decode._fwd_call(q, k, v, lens, table, out, 1.0, -1, 0.0, (1.0, None, 1.0, None),
                                            dict(config), splits)
    return blocks_of(decode.decode_fwd.compile(*args, **keywords), q.device.index or 0)


def grid(ns) -> None:
    """Split counts against ring depths, graph-timed (see the module's docstring)."""
    heads, kv_heads, dim, dtype = 64, 8, 128, torch.bfloat16
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("| page | batch | context | STAGES | splits | default | blocks/SM | waves | us (graph) | GB/s (graph) "
          "| GB/s (do_bench) | device |\n" + "| --- " * 12 + "|")
    for page_text in ns.pages.split(","):
        page = None if page_text == "none" else int(page_text)
        for batch in map(int, ns.batches.split(",")):
            for context in map(int, ns.contexts.split(",")):
                q, k, v, lens, table = cache(batch, context, heads, kv_heads, dim, page, dtype)
                nbytes = 2 * batch * context * kv_heads * dim * dtype.itemsize
                want = decode.reference(q[:1], k, v, lens[:1], None if table is None else table[:1])
                out = torch.empty_like(q)
                decode._PIPELINES.clear()
                decode.decode_attention_forward(q, k, v, lens, table, out=out)  # the default launch's choice
                chosen = next(iter(decode._PIPELINES.values()), None)
                for stages in (2, 3, 4, 6):
                    for splits in (1, 2, 4, 8, 16):
                        def run():
                            decode.decode_attention_forward(q, k, v, lens, table, num_splits=splits, out=out,
                                                            STAGES=stages)
                        try:
                            out.fill_(float("nan"))
                            run()
                            err = (out[:1].double() - want.to(out.device)).abs().max().item()
                            if not err < 2e-2:
                                print(f"| {page} | {batch} | {context} | {stages} | {splits} | | | | wrong: {err:.3g} "
                                      f"| | | {name} |")
                                continue
                            blocks = resident_blocks(q, k, v, lens, table, out, {"STAGES": stages}, splits)
                            programs = kv_heads * batch * splits
                            waves = f"{programs / (blocks * sms):.2f}" if blocks else "?"
                            graph_ms = do_bench_cudagraph(run)
                            ms = do_bench(run)
                        except Exception as exc:  # noqa: BLE001 - a variant that fails is a row too
                            print(f"| {page} | {batch} | {context} | {stages} | {splits} | | | | "
                                  f"{type(exc).__name__}: {str(exc)[:80]} | | | {name} |")
                            continue
                        mark = "yes" if chosen == (stages, splits) else ""
                        print(f"| {page} | {batch} | {context} | {stages} | {splits} | {mark} | {blocks} | {waves} "
                              f"| {graph_ms * 1e3:.1f} | {nbytes / graph_ms / 1e6:.0f} | {nbytes / ms / 1e6:.0f} "
                              f"| {name} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grid", action="store_true", help="split counts against ring depths (see above)")
    parser.add_argument("--batches", default="8,32,64,128")
    parser.add_argument("--contexts", default="4096,32768")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--pages", default="none,16,64,256")
    parser.add_argument("--quick", action="store_true", help="default plans only")
    ns = parser.parse_args()
    if ns.grid:
        grid(ns)
        return
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
