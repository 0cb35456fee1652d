"""Block-scaled (microscaled, OCP MX) gemms that no block-scaled tensor-core lowering takes, rewritten into the
portable form.

The frontend makes ``T.gemm(..., scale_a=, scale_b=)`` with e8m0 scales one gemm of five operands
(``ir.is_block_scaled``). A lowering that reads the scales itself declares ``GemmLowering.block_scaled`` (sm_100a's
``tcgen05.mma ... kind::mxf8f6f4.block_scale``); where one fits the gemm on this target it stays as it is, and
everywhere else (sm_80, sm_90a, and sm_100a shapes the block-scaled kind does not take) it becomes the bfloat16
product of the operands dequantized in registers (``frontend.microscaled.dequantized_product``). First in the
pipeline, so every later pass sees either a gemm a block-scaled lowering takes or ordinary ops.
"""
from __future__ import annotations

from ..frontend.microscaled import dequantized_product
from ..frontend.semantic import Semantic
from ..ir import Block, Builder, Function, OpKind, is_block_scaled
from ..ir.rewrite import blocks, replace_uses
from ..target import REGISTRY, Target


def block_scaled_lowering_fits(op, target: Target) -> bool:
    """Whether a lowering that reads the block scales itself takes the gemm ``op`` on ``target``."""
    return any(impl.payload.block_scaled and impl.rejection(op, target) is None
               for impl in REGISTRY.candidates("gemm"))


def expand_microscaled(fn: Function, target: Target) -> None:
    for block in list(blocks(fn.body)):
        for op in [o for o in block.ops if o.kind is OpKind.GEMM and is_block_scaled(o)]:
            if block_scaled_lowering_fits(op, target):
                continue
            made = Block([])
            builder = Builder(made)
            builder.loc = op.loc
            a, b, acc, sa, sb = op.operands
            result = dequantized_product(Semantic(builder), a, b, acc, op.attrs.transpose_a, op.attrs.transpose_b,
                                         sa, sb)
            at = block.ops.index(op)
            block.ops[at:at + 1] = made.ops
            replace_uses(fn, op.result, result)
