"""Scope inference: where each tile lives.

Gemm operands are read by the tensor cores from shared memory, so a load that feeds one is staged there
(cp.async writes it, ldmatrix reads it); a gemm operand computed in registers is written to shared memory
first. Accumulators and every elementwise result live in registers. A staged tile that is also used
elementwise is read back into registers for those uses. (A tcgen05 accumulator that a TMA main loop keeps in
tensor memory takes scope tmem in the loop's body later, in ``software_pipeline.mark_async_mma``: that needs the gemm's
lowering and the loads' copies, which are chosen after this pass.)
"""
from __future__ import annotations

from ..ir import Function, NoAttrs, Op, OpKind, Scope, TileType
from ..ir.rewrite import blocks, defining_op


def _convert(block, anchor: Op, value, scope: Scope):
    op = Op(OpKind.CONVERT_LAYOUT, [value], [TileType(value.type.shape, value.dtype, scope)], NoAttrs(),
            loc=anchor.loc)
    block.ops.insert(block.ops.index(anchor), op)
    return op.result


def infer_scopes(fn: Function) -> None:
    staged = set()
    for op in fn.walk():
        if op.kind is OpKind.GEMM:
            for v in op.operands[:2]:
                src = defining_op(v)
                if src is not None and src.kind is OpKind.LOAD:
                    staged.add(v.id)
    for block in blocks(fn.body):
        for a in block.args:
            if isinstance(a.type, TileType):
                a.type = a.type.with_scope(Scope.REGISTER)
        for op in block.ops:
            for r in op.results:
                if isinstance(r.type, TileType):
                    r.type = r.type.with_scope(Scope.SHARED if r.id in staged else Scope.REGISTER)
    for block in blocks(fn.body):
        for op in list(block.ops):
            for index, v in enumerate(op.operands):
                if not isinstance(v.type, TileType):
                    continue
                gemm_operand = op.kind is OpKind.GEMM and index < 2
                if gemm_operand and v.type.scope is not Scope.SHARED:
                    op.operands[index] = _convert(block, op, v, Scope.SHARED)
                elif not gemm_operand and v.type.scope is Scope.SHARED:
                    op.operands[index] = _convert(block, op, v, Scope.REGISTER)
