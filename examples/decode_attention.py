"""One decode step over a paged KV cache with ``tilejit.ops.decode_attention``: a pool of pages (num_pages,
page_size, kv_heads, D) as vLLM and ``flash_attn_with_kvcache`` lay it out, a block table listing each sequence's
pages (shuffled over the pool), GQA (4 query heads per KV head) and ragged cache lengths. The step writes each
sequence's new key and value at its length, counts it, and attends with one query token per sequence; the result
is checked against float64 attention on the keys gathered through the block table. On a GPU (bf16) the step is
then captured in a CUDA graph and replayed on new inputs; without one it runs through the interpreter (fp16).

    python examples/decode_attention.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # run from a checkout
from tilejit.ops import decode_attention  # noqa: E402


def reference(q, k_cache, v_cache, cache_seqlens, block_table):
    """float64 on the CPU: each sequence's keys gathered through its pages, each KV head's query heads, softmax."""
    batch, heads, dim = q.shape
    page_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(batch, heads, dim, dtype=torch.float64)
    for b, length in enumerate(cache_seqlens.tolist()):
        slots = torch.arange(length, device=q.device)
        pages = block_table[b].long()[slots // page_size]
        k, v = (c[pages, slots % page_size].double().cpu() for c in (k_cache, v_cache))   # (length, kv_heads, D)
        qg = q[b].double().cpu().view(kv_heads, heads // kv_heads, dim)
        scores = torch.einsum("hgd,nhd->hgn", qg, k) / dim ** 0.5
        out[b] = torch.einsum("hgn,nhd->hgd", scores.softmax(-1), v).reshape(heads, dim)
    return out


def main() -> None:
    gpu = torch.cuda.is_available() and os.environ.get("TILEJIT_INTERPRET") != "1"
    if not gpu:
        os.environ["TILEJIT_INTERPRET"] = "1"
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float16)
    batch, heads, kv_heads, dim, page_size, capacity = (16, 32, 8, 128, 16, 4096) if gpu else (3, 8, 2, 32, 16, 80)
    where = torch.cuda.get_device_name() if gpu else "CPU (interpreter)"
    torch.manual_seed(0)
    pages_per_seq = -(-capacity // page_size)
    num_pages = batch * pages_per_seq + 5                    # a pool with spare pages no sequence owns
    k_cache = torch.randn(num_pages, page_size, kv_heads, dim, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    block_table = torch.randperm(num_pages, device=device)[:batch * pages_per_seq].view(batch, -1).int()
    cache_seqlens = torch.randint(0, capacity - 2, (batch,), device=device, dtype=torch.int32)
    q, k_new, v_new = (torch.randn(batch, n, dim, device=device, dtype=dtype) for n in (heads, kv_heads, kv_heads))

    def step():
        """Write this token's key and value into slot cache_seqlens[b] of each sequence's pages, then attend."""
        slot = cache_seqlens.long()
        page = block_table.gather(1, (slot // page_size)[:, None]).squeeze(1).long()
        k_cache[page, slot % page_size] = k_new
        v_cache[page, slot % page_size] = v_new
        cache_seqlens.add_(1)
        return decode_attention(q, k_cache, v_cache, cache_seqlens, block_table)

    def check(out, what):
        err = (out.double().cpu() - reference(q, k_cache, v_cache, cache_seqlens, block_table)).abs().max().item()
        print(f"decode_attention {what}: B={batch} Hq={heads} Hkv={kv_heads} D={dim} page={page_size} "
              f"lengths {cache_seqlens.min().item()}..{cache_seqlens.max().item()}: max |err| = {err:.2e} on {where}")
        if not err < 2e-2:
            sys.exit(f"decode_attention {what}: error {err:.2e} is too large")

    check(step(), "eager")
    if gpu:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):                        # records the step; the first call compiled it
            graph_out = step()
        for t in (q, k_new, v_new):
            t.copy_(torch.randn_like(t))
        graph.replay()                                       # appends the new token and attends, as eager did
        check(graph_out, "CUDA graph replay")


if __name__ == "__main__":
    main()
