"""Decode attention over a paged KV cache: achieved bytes per second of cache read against the GPU's HBM peak,
tilejit.ops.decode_attention (tilejit/ops/paged_decode.py) against SDPA on gathered K/V and FlashInfer's paged decode.

    python -m benchmarks.decode_attention [--batches 1,8,32,64,128,256] [--contexts 1024,4096,16384,65536,131072]
                                          [--heads 64] [--kv-heads 8] [--dim 128] [--page-size 16] [--dtype bf16]
                                          [--max-cache-gib 40] [--out DIR]
    python -m benchmarks.attention --mode decode [same options]

One query token per sequence, every sequence of the batch at the full context, GQA 8:1 and D=128 by default.
Decode reads the cache once and does ~1 FLOP per byte, so TFLOP/s means nothing: the figure is GB/s of K and V
read (batch x context x kv_heads x D x 2 bytes x 2), and that as a share of the HBM peak named by the device
(H100 SXM 3.35 TB/s, H200 4.8 TB/s; n/a for a GPU not in ``HBM_PEAK_TBS``). Times: ``tilejit.testing.do_bench``
(CUDA events, L2 flushed before each run, median), in one process on one GPU; tilejit's also replayed from a CUDA
graph, as serving stacks run decode (``do_bench_cudagraph``: back-to-back calls, no flush; a cache larger than the
L2 is read from HBM anyway). ``do_bench``'s flush reads back half of what it wrote, so the L2 it leaves is clean:
a flush by writes alone left dirty lines that drained during the timed kernel (7 us of 148 at batch 32 x 4k on an
H200, ``scripts/probes/flush_clean.py``).

- tilejit: ``decode_attention(q, k_pages, v_pages, cache_seqlens, block_table)``, default configs and split count.
- SDPA gathered: what a user has without a kernel: the pages gathered into contiguous (B, Hkv, S, D) K and V
  (``k_pages[block_table]``), then ``scaled_dot_product_attention(..., enable_gqa=True)``; the gather is timed.
- FlashInfer: ``BatchDecodeWithPagedKVCacheWrapper`` (NHD layout, planned once outside the timing), the faster
  of its CUDA-core and tensor-core decode, when ``import flashinfer`` works; the output says so where it does not.

Every implementation's output is checked against tilejit's float64 reference on the first sequence before it is
timed. Shapes whose cache (or SDPA's gathered copy) would pass ``--max-cache-gib`` are skipped and listed.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from benchmarks.common import DEFAULT_OUT, append_results, machine_stamp, markdown_table, write_json
from tilejit.testing import do_bench, do_bench_cudagraph
import tilejit.ops.paged_decode as decode

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: HBM peak bandwidth, TB/s, by a substring of torch's device name (the first that matches)
HBM_PEAK_TBS = {"H200": 4.8, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H100": 3.35}
HEADERS = ["batch", "context", "tilejit us", "tilejit GB/s", "tilejit % HBM", "stages, splits", "tilejit graph us",
           "tilejit graph % HBM", "SDPA gathered us", "SDPA gathered GB/s", "FlashInfer us", "FlashInfer GB/s",
           "tilejit / FlashInfer", "tilejit / SDPA"]


def hbm_peak_tbs(name: str) -> float | None:
    return next((tbs for key, tbs in HBM_PEAK_TBS.items() if key in name), None)


def _sdpa_gathered(q, k_pages, v_pages, lens, table):
    """Gather the pages into contiguous K, V and run SDPA on them (all sequences at the full context)."""
    batch, heads, dim = q.shape
    context = int(lens[0])

    def run():
        k = k_pages[table].flatten(1, 2)[:, :context].transpose(1, 2)
        v = v_pages[table].flatten(1, 2)[:, :context].transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)
        return out[:, :, 0]
    return run


def flashinfer_note() -> str:
    """"FlashInfer <version>" when ``import flashinfer`` works, else why it does not."""
    try:
        import flashinfer
    except Exception as err:  # noqa: BLE001 - any import failure means "not available here"
        return f"FlashInfer unavailable ({type(err).__name__}: {err}): its columns read n/a"
    return f"FlashInfer {getattr(flashinfer, '__version__', '?')}"


def _flashinfer(q, k_pages, v_pages, lens, table):
    """FlashInfer's paged decode planned (outside the timing) for these pages: a run without and one with tensor
    cores."""
    import flashinfer

    batch, heads, dim = q.shape
    page_size, kv_heads = k_pages.shape[1], k_pages.shape[2]
    pages_per_seq = (lens.long() + page_size - 1) // page_size
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = pages_per_seq.cumsum(0)
    indices = torch.cat([table[b, :int(n)] for b, n in enumerate(pages_per_seq.tolist())]).to(torch.int32)
    last = ((lens - 1) % page_size + 1).to(torch.int32)
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    runs = []
    for tensor_cores in (False, True):  # CUDA-core and tensor-core decode: the faster one counts
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
        try:
            wrapper.plan(indptr, indices, last, heads, kv_heads, dim, page_size, q_data_type=q.dtype,
                         kv_data_type=k_pages.dtype)
        except TypeError:  # versions before the split of data_type
            wrapper.plan(indptr, indices, last, heads, kv_heads, dim, page_size, data_type=q.dtype)
        runs.append(lambda wrapper=wrapper: wrapper.run(q, (k_pages, v_pages)))
    return runs


def _checked(name, fn, want):
    out = fn()
    got = out[:1].double().cpu()
    if torch.isnan(got).any() or not torch.allclose(got, want, rtol=2e-2, atol=2e-2):
        raise AssertionError(f"{name}: output differs from the float64 reference "
                             f"(max error {(got - want).abs().max().item():.3g})")
    return do_bench(fn)


def decode_inputs(batch, context, heads=64, kv_heads=8, dim=128, page=16, dtype=torch.bfloat16):
    """(q, k_pages, v_pages, lens, block_table) of a decode step, seeded by the shape: every sequence at
    ``context`` keys, its pages in shuffled order."""
    torch.manual_seed(batch + context)
    q = torch.randn(batch, heads, dim, device="cuda", dtype=dtype)
    per_seq = math.ceil(context / page)
    k_pages = torch.randn(batch * per_seq, page, kv_heads, dim, device="cuda", dtype=dtype)
    v_pages = torch.randn_like(k_pages)
    table = torch.randperm(batch * per_seq, device="cuda", dtype=torch.int32).view(batch, per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return q, k_pages, v_pages, lens, table


def _row(batch, context, ns, dtype, with_flashinfer, peak):
    kv_heads, dim = ns.kv_heads, ns.dim
    q, k_pages, v_pages, lens, table = decode_inputs(batch, context, ns.heads, kv_heads, dim, ns.page_size, dtype)
    want = decode.reference(q[:1], k_pages, v_pages, lens[:1], table[:1])
    cache_bytes = 2 * batch * context * kv_heads * dim * dtype.itemsize

    def gbs(ms):
        return None if ms is None else cache_bytes / (ms * 1e-3) / 1e9

    ms = _checked("tilejit", lambda: decode.decode_attention(q, k_pages, v_pages, lens, table), want)
    graph_ms = do_bench_cudagraph(lambda: decode.decode_attention(q, k_pages, v_pages, lens, table))
    stages, splits = decode.chosen_pipeline(q, k_pages, v_pages, lens, table)
    sdpa_ms = None
    if 2 * cache_bytes <= ns.max_cache_gib * 2 ** 30:  # the gathered copy doubles the memory
        sdpa_ms = _checked("SDPA gathered", _sdpa_gathered(q, k_pages, v_pages, lens, table), want)
    fi_ms = None
    if with_flashinfer:
        fi_ms = min(_checked("FlashInfer", run, want) for run in _flashinfer(q, k_pages, v_pages, lens, table))
    achieved = gbs(ms)

    def share(ms):
        return None if peak is None else 100 * gbs(ms) / (peak * 1e3)
    return [batch, context, ms * 1e3, achieved, share(ms), f"{stages}, {splits}", graph_ms * 1e3, share(graph_ms),
            None if sdpa_ms is None else sdpa_ms * 1e3, gbs(sdpa_ms), None if fi_ms is None else fi_ms * 1e3,
            gbs(fi_ms), None if fi_ms is None else fi_ms / ms, None if sdpa_ms is None else sdpa_ms / ms]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32,64,128,256")
    parser.add_argument("--contexts", default="1024,4096,16384,65536,131072")
    parser.add_argument("--heads", type=int, default=64, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--max-cache-gib", type=float, default=40.0,
                        help="skip shapes whose K+V cache is larger (SDPA: whose gathered copy would pass it too)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ns = parser.parse_args(argv)
    dtype = DTYPES[ns.dtype]
    name = torch.cuda.get_device_name()
    peak = hbm_peak_tbs(name)
    note = flashinfer_note()
    print(note)
    print(f"{name}: HBM peak {peak if peak is not None else 'unknown (n/a)'} TB/s")
    rows, skipped = [], []
    for batch in (int(b) for b in ns.batches.split(",")):
        for context in (int(c) for c in ns.contexts.split(",")):
            if 2 * batch * context * ns.kv_heads * ns.dim * dtype.itemsize > ns.max_cache_gib * 2 ** 30:
                skipped.append(f"{batch}x{context}")
                continue
            rows.append(_row(batch, context, ns, dtype, "unavailable" not in note, peak))
            print(markdown_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
            torch.cuda.empty_cache()
    table = markdown_table(HEADERS, rows)
    print(table)
    notes = [f"Decode, {ns.heads} query heads over {ns.kv_heads} KV heads, D={ns.dim}, {ns.dtype}, pages of "
             f"{ns.page_size} keys in random order, every sequence at the full context; GB/s of K+V read; HBM "
             f"peak {peak if peak is not None else 'n/a'} TB/s.", note]
    if skipped:
        notes.append(f"Skipped (cache over {ns.max_cache_gib} GiB): {', '.join(skipped)}.")
    meta = machine_stamp()
    append_results(f"Decode attention, {ns.dtype}, GQA {ns.heads}:{ns.kv_heads}, D={ns.dim}, page {ns.page_size}",
                   table, meta, notes=notes)
    write_json(ns.out / "decode_attention.json", {"meta": meta, "headers": HEADERS, "results": rows,
                                                  "notes": notes})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
