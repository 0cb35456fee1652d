"""Rewrites that put the IR in the form the lowering expects.

* ``x + gemm(a, b, 0)`` (the frontend's ``acc += a @ b``) becomes ``gemm(a, b, x)``, so the product
  accumulates in place in the accumulator registers instead of a fresh tile plus an add.
* ``gemm(trans(a), ...)`` becomes ``gemm(a, ..., transpose_a=True)``: the tensor core reads the other
  major-ness directly (ldmatrix ``.trans``) and no transposed copy is ever made.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import BinaryOp, Function, OpKind
from ..ir.rewrite import blocks, defining_op, is_zero, replace_uses, use_counts


def canonicalize(fn: Function) -> None:
    _fold_transposes(fn)
    _fuse_accumulate(fn)


def _fold_transposes(fn: Function) -> None:
    for op in fn.walk():
        if op.kind is not OpKind.GEMM:
            continue
        for index, flag in ((0, "transpose_a"), (1, "transpose_b")):
            src = defining_op(op.operands[index])
            if src is not None and src.kind is OpKind.TRANSPOSE:
                op.operands[index] = src.operands[0]
                op.attrs = replace(op.attrs, **{flag: not getattr(op.attrs, flag)})


def _fuse_accumulate(fn: Function) -> None:
    counts = use_counts(fn)
    for block in blocks(fn.body):
        for add in list(block.ops):
            if add.kind is not OpKind.BINARY or add.attrs.op is not BinaryOp.ADD or not add.result.is_tile:
                continue
            for acc, product in (add.operands, add.operands[::-1]):
                gemm = defining_op(product)
                if (gemm is None or gemm.kind is not OpKind.GEMM or counts[product.id] != 1
                        or gemm not in block.ops or not is_zero(gemm.operands[2])
                        or acc.type != product.type):
                    continue
                # Move the gemm to the add's position: its operands are all defined before the add.
                block.ops.remove(gemm)
                block.ops[block.ops.index(add)] = gemm
                gemm.operands[2] = acc
                replace_uses(fn, add.result, gemm.result)
                gemm.result.name = add.result.name or gemm.result.name
                break
