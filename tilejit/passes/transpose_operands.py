"""Transposing copies for gemm operands given in the major-ness their best lowering cannot read.

wgmma and tcgen05 read 8-bit and 32-bit operands K-major only (their transpose bits exist for 16-bit types alone,
PTX ISA 9.7.15.5.1), and 16-bit B given K x N only in whole 64-column panels. So ``a @ b`` with ``b`` given K x N
in fp8, int8 or float32 (the DESIGN matmul's own layout) would otherwise fall to mma.sync. This pass runs after
scope inference and before the dispatch registry fixes each gemm's lowering (``infer_layouts``): where the
registry would pick a better lowering (a higher priority) with an operand in the other major-ness, the operand's
staged shared tile is copied into a new shared tile with its dims swapped (``transpose_copy``, lowered by
``backend_cuda/lower_transpose.py``) and the gemm's transpose flag flips, so the gemm computes the same product:
``a @ b`` becomes ``gemm(a, b', transpose_b=True)`` with ``b' = b^T`` stored N x K (K-major).

The staged tile keeps its own copy from global memory (TMA in a pipelined loop) and its ring; the transposing copy
reads a landed slot and writes the tile the tensor cores read, right after the load (in a loop body, each
iteration; a tile loaded before a loop is transposed once there), one copy per tile whatever the gemms reading it.
Only operands loaded from a tensor are transposed (a tile staged from registers would better be stored in the
right order in the first place). A lowering that gathers an MN-major operand's fragment itself (on sm_90a tf32,
``backend_cuda/lower_wgmma_mn.py``, and fp8 / int8, ``lower_wgmma_mn8.py``) takes the given form with no copy
(its priority is not below the copied form's), and is not paired with a copy of the other operand
(``GemmLowering.gathers_mn_major``): with both operands MN-major, both are copied. A pinned lowering
(``TILEJIT_GEMM_LOWERING``) is honoured: a copy is added only when the pinned lowering takes the transposed form
and not the given one.
"""
from __future__ import annotations

from dataclasses import replace

from .. import knobs
from ..errors import DispatchError
from ..ir import Function, NoAttrs, Op, OpKind, Scope, TileType
from ..ir.rewrite import blocks, defining_op
from ..target import REGISTRY, Target

#: Tiles in the destination ring of a transposing copy in a loop whose gemms stay in flight (``mark_async_mma``):
#: the gemms of the two iterations before may still read theirs (see ``backend_cuda/lower_transpose.py``).
IN_FLIGHT_COPIES = 3

# Which operands to try in the other major-ness, fewest copies first: (A, B).
_FLIPS = ((False, True), (True, False), (True, True))


def transpose_operands(fn: Function, target: Target) -> None:
    pinned = knobs.gemm_lowering()
    home = {id(op): block for block in blocks(fn.body) for op in block.ops}  # the block of each op
    copies: dict[int, Op] = {}  # the transposing copy of each staged tile made so far (one per tile)
    for op in [op for op in fn.walk() if op.kind is OpKind.GEMM]:
        _maybe_transpose(op, target, pinned, home, copies)


def _priority(op: Op, target: Target, pinned: str | None, copied: bool = False) -> int | None:
    """The priority of the lowering the registry would give ``op``, or None when none fits (or, for a form that
    needs a copy, when that lowering gathers an MN-major operand itself: one copy beside it spills)."""
    try:
        impl = REGISTRY.select("gemm", op, target, only=pinned)
    except DispatchError:
        return None
    return None if copied and impl.payload.gathers_mn_major else impl.priority


def _transposable(v) -> bool:
    """A 2-D shared tile loaded from a tensor, whose rows pack into 32-bit words after the swap."""
    if not isinstance(v.type, TileType) or v.type.scope is not Scope.SHARED or len(v.type.shape) != 2:
        return False
    src = defining_op(v)
    per_word = 4 // v.dtype.itemsize if v.dtype.itemsize <= 4 else 0
    return (src is not None and src.kind is OpKind.LOAD and per_word > 0
            and all(d % per_word == 0 for d in v.type.shape))


def _transpose_copy(v, loc) -> Op:
    rows, cols = v.type.shape
    return Op(OpKind.TRANSPOSE_COPY, [v], [TileType((cols, rows), v.dtype, Scope.SHARED)], NoAttrs(), loc=loc)


def _maybe_transpose(op: Op, target: Target, pinned: str | None, home: dict, copies: dict) -> None:
    given = _priority(op, target, pinned)
    best: tuple[int, tuple[bool, bool], list[Op | None]] | None = None
    for flips in _FLIPS:
        if not all(_transposable(op.operands[i]) for i in (0, 1) if flips[i]):
            continue
        made = [_transpose_copy(op.operands[i], op.loc) if flips[i] else None for i in (0, 1)]
        trial = Op(OpKind.GEMM, [c.result if c else v for c, v in zip(made, op.operands[:2])] + [op.operands[2]],
                   [op.result.type], _flipped(op.attrs, flips), loc=op.loc)
        got = _priority(trial, target, pinned, copied=True)
        if got is not None and (given is None or got > given) and (best is None or got > best[0]):
            best = (got, flips, made)
    if best is None:
        return
    _, flips, trial_copies = best
    for i, copy in enumerate(trial_copies):
        if copy is None:
            continue
        v = op.operands[i]
        if v.id not in copies:
            # right after the load (not before the gemm): a tile loaded outside a loop is transposed once
            load = defining_op(v)
            block = home[id(load)]
            block.ops.insert(block.ops.index(load) + 1, copy)
            home[id(copy)] = block
            copies[v.id] = copy
        op.operands[i] = copies[v.id].result
    op.attrs = _flipped(op.attrs, flips)


def _flipped(attrs, flips: tuple[bool, bool]):
    return replace(attrs, transpose_a=attrs.transpose_a ^ flips[0], transpose_b=attrs.transpose_b ^ flips[1])
