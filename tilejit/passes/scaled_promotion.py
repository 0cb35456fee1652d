"""Block-scaled float8 products folded into the promotion of a wgmma gemm (sm_90a).

The frontend builds ``T.gemm(a, b, acc, scale_a=sa, scale_b=sb)`` over one block of K (at most 128 products) as a
fresh product, ``p = gemm(a, b, 0)`` of precision "fast", then ``fma(p, scale, acc)`` with ``scale`` the tile
``sa[:, None] * sb[None, :]`` (``Semantic._scaled_gemm``). Lowered as written, ``p`` holds registers of its own
beside the accumulator (a 64 x N slab of each per warpgroup) and its wgmma is waited for whole before the FMAs.

Where the product is lowered on wgmma, this pass makes the pair one gemm ``gemm(a, b, acc, scale)`` of precision
"precise" (the IR's scaled form: ``acc + (a @ b) * scale``): ``lower_wgmma.emit_promoted`` sums each chunk of
columns in a temporary and adds it into the accumulator, in place, with one FMA by the scale where a precise gemm
adds it; the temporaries are a chunk wide, and with two of them the next chunk's wgmma runs while one is added.
The result is bit for bit the pair's: each element is the same tensor-core sum over the block, scaled and added
with the same FMA. Runs after the layouts are fixed (the scale, the product and the accumulator share one layout,
so the scale's registers line up with the accumulator's) and before pipelining, which then sees one gemm.

Measured on an H100 (``scripts/probes/blockscaled_loop_forms.py``, 4096x4096x7168, 128x128 persistent): 909
TFLOP/s against 889 for the pair. A 128x256 or 256x128 tile (the unscaled precise loop's best: 1,255) still
spills 300-900 bytes a thread: beside the 128-register accumulator and a 64-register temporary, ptxas spills once
the four rows a thread holds get four distinct scale products, whether the scales come from global memory, from
shared memory (where the producer warpgroup would stage them) or are constants; with two distinct products it
does not (``benchmarks/history/investigations.md``).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Function, Op, OpKind, Value
from ..ir.rewrite import blocks, defining_op, is_zero, use_counts
from ..target import Target

#: Products of K a fresh product may sum for its scale to apply to it whole (the frontend's block).
SCALED_BLOCK_K = 128


def fold_scaled_products(fn: Function, target: Target) -> None:
    if not target.arch.has_wgmma:
        return
    uses = use_counts(fn)
    for block in blocks(fn.body):
        for fma in [o for o in block.ops if o.kind is OpKind.FMA]:
            gemm, scale = _fresh_product(fma, block.ops, uses)
            if gemm is None:
                continue
            a, b = gemm.operands[:2]
            fused = Op(OpKind.GEMM, [a, b, fma.operands[2], scale], [], replace(gemm.attrs, precision="precise"),
                       loc=gemm.loc)
            fused.results = [fma.result]  # the FMA's result, under its own name, now made by the gemm
            fma.result.owner = fused
            block.ops[block.ops.index(fma)] = fused
            block.ops.remove(gemm)


def _fresh_product(fma: Op, ops: list[Op], uses) -> tuple[Op | None, Value | None]:
    """(the gemm, the scale) when ``fma`` is ``fma(p, scale, acc)`` (or ``fma(scale, p, acc)``) with ``p`` made
    in the same block ``ops`` by a float8 wgmma gemm over at most one block of K, summed fresh ("fast", from a
    zero tile) and read by this FMA alone, all three tiles in one layout; else (None, None)."""
    for p, scale in (fma.operands[:2], fma.operands[1::-1]):
        gemm = defining_op(p)
        if gemm is None or gemm.kind is not OpKind.GEMM or len(gemm.operands) != 3 or uses.get(p.id) != 1:
            continue
        a, b, acc = gemm.operands
        k = a.type.shape[0] if gemm.attrs.transpose_a else a.type.shape[1]
        layout = p.type.layout
        if (a.dtype.is_fp8 and gemm.attrs.precision == "fast" and (gemm.attrs.impl or "").startswith("wgmma")
                and k <= SCALED_BLOCK_K and is_zero(acc) and scale.is_tile and scale.type == p.type
                and fma.operands[2].type == p.type and fma.result.type.layout == layout
                and any(o is gemm for o in ops)):
            return gemm, scale
    return None, None
