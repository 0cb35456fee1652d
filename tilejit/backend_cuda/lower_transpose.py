"""``transpose_copy``: a shared tile copied into a shared tile with its two dims swapped.

``passes/transpose_operands.py`` puts one before a gemm whose lowering reads an operand only in the other
major-ness (fp8 / int8 / f32 B given K x N on wgmma). Both tiles use the swizzled :class:`SharedLayout`.

The threads move 32-bit words: a block of ``e x e`` elements (``e = 4 / itemsize``: 4 x 4 bytes, 2 x 2 halves or
one f32) is read as ``e`` words of consecutive source rows, transposed in registers with byte permutes
(``prmt``) and written as ``e`` words of consecutive destination rows. With ``P`` blocks per source row and ``Q``
per destination row (``P`` a multiple of 32), lane ``l`` of the ``g``-th group of 32 work items takes source
block column ``32 * (g % (P / 32)) + l`` and block row ``(l + g / (P / 32)) % Q``: one warp's reads then cover a
whole 128-byte source row span (32 distinct banks after the XOR swizzle), and its writes go to 32 different
destination rows whose word within the row differs by lane, which the swizzle spreads over 32 banks as well (each
lane writes word ``(l + t) % 32`` of its row; rows ``4l + j`` give the swizzle phase ``4 (l % 2) + j``, the same
for lanes that share a word). With ``P`` below 32 (a divisor of it) a group covers ``P`` columns and ``32 / P``
block rows, turned the same way. tests/backend/test_transpose_copy.py replays the generated code: every element
lands once in its place, and the default tiles of fp8 / int8 (BK = 128) and tf32 (BK = 32) are free of bank
conflicts (BK = 64 or BN = 64 fp8 tiles: 2-way).

Synchronisation: the copy's writes (generic proxy) are fenced for the tensor cores' async proxy and a block
barrier follows. In a loop whose gemms stay in flight (``AsyncMma``) the destination is a ring of 3 tiles
indexed by the loop's iteration: iteration ``k`` writes the tile the gemms of iteration ``k - 3`` read, which
every warpgroup waited for (``wgmma.wait_group 1`` of iteration ``k - 2``) before the barrier of iteration
``k - 1``. Elsewhere a single tile is used and a barrier before the copy makes sure its last readers are done.
"""
from __future__ import annotations

from ..ir import Op, OpKind
from ..ir.layouts import CExpr, SharedLayout, c_text
from .emitter import Emitter, emits
from .lower_memory import stage_shared

# prmt selectors: (x, y) -> bytes [x0 y0 x1 y1], [x2 y2 x3 y3], [x0 x1 y0 y1], [x2 x3 y2 y3] (PTX 9.7.8.7)
_INTERLEAVE_LO, _INTERLEAVE_HI, _PAIRS_LO, _PAIRS_HI = "0x5140", "0x7362", "0x5410", "0x7632"


def _transpose_words(em: Emitter, e: int) -> None:
    """``tj_y{j}`` (column ``j`` of the block, down its ``e`` rows) from ``tj_x{i}`` (row ``i``)."""
    if e == 1:
        em.line("const unsigned tj_y0 = tj_x0;")
    elif e == 2:
        em.line(f"const unsigned tj_y0 = __byte_perm(tj_x0, tj_x1, {_PAIRS_LO}), "
                f"tj_y1 = __byte_perm(tj_x0, tj_x1, {_PAIRS_HI});")
    else:
        em.line(f"const unsigned tj_t0 = __byte_perm(tj_x0, tj_x1, {_INTERLEAVE_LO}), "
                f"tj_t1 = __byte_perm(tj_x2, tj_x3, {_INTERLEAVE_LO});")
        em.line(f"const unsigned tj_t2 = __byte_perm(tj_x0, tj_x1, {_INTERLEAVE_HI}), "
                f"tj_t3 = __byte_perm(tj_x2, tj_x3, {_INTERLEAVE_HI});")
        em.line(f"const unsigned tj_y0 = __byte_perm(tj_t0, tj_t1, {_PAIRS_LO}), "
                f"tj_y1 = __byte_perm(tj_t0, tj_t1, {_PAIRS_HI});")
        em.line(f"const unsigned tj_y2 = __byte_perm(tj_t2, tj_t3, {_PAIRS_LO}), "
                f"tj_y3 = __byte_perm(tj_t2, tj_t3, {_PAIRS_HI});")


@emits(OpKind.TRANSPOSE_COPY)
def _transpose_copy(em: Emitter, op: Op) -> None:
    src = em.shared[op.operands[0].id]
    dst = stage_shared(em, op.result)
    rows, cols = op.operands[0].type.shape
    e = 4 // op.result.dtype.itemsize
    per_row, per_col = cols // e, rows // e  # blocks along a source row (P) and along a destination row (Q)
    total, threads = per_row * per_col, em.target.threads
    ring = dst.layout.stages > 1
    if ring:
        dst.slot = f"(tj_it % {dst.layout.stages})"
    em.comment(op, f"transposing copy {rows}x{cols} -> {cols}x{rows} ({op.result.dtype}, {e}x{e}-element blocks"
                   + (f", ring of {dst.layout.stages} tiles" if ring else "") + ")")
    if not ring:
        em.barrier("the tile's previous readers are done")
    em.open("")
    em.line(f"unsigned char* const tj_src = {src.pointer()};")
    em.line(f"unsigned char* const tj_dst = {dst.pointer()};")
    em.line("#pragma unroll")
    em.open(f"for (int tj_i = 0; tj_i < {-(-total // threads)}; ++tj_i)")
    em.line(f"const int tj_w = tid + tj_i * {threads};")
    if total % threads:
        em.line(f"if (tj_w >= {total}) break;")
    if per_row % 32 == 0 or 32 % per_row == 0:
        # a group of 32 work items covers `lanes` block columns x 32 / `lanes` block rows, turned diagonally
        lanes = min(per_row, 32)
        groups, rows_per_group = per_row // lanes, 32 // lanes
        lane = "(tj_w & 31)" if lanes == 32 else f"(tj_w & {lanes - 1})"
        group = "(tj_w >> 5)"
        column = lane if groups == 1 else f"{CExpr(group) % groups} * {lanes} + {lane}"
        turn = group if groups == 1 else f"{group} / {groups}"
        diagonal = lane if lanes == 32 else f"{lane} + ((tj_w & 31) >> {lanes.bit_length() - 1})"
        em.line(f"const int tj_cb = {column};")
        em.line(f"const int tj_rb = {CExpr(f'({diagonal} + {turn} * {rows_per_group})') % per_col};")
    else:
        em.line(f"const int tj_cb = {CExpr('tj_w') % per_row}, tj_rb = tj_w / {per_row};")
    s_lay: SharedLayout = src.layout
    d_lay: SharedLayout = dst.layout
    for i in range(e):
        at = c_text(s_lay.elem_offset(CExpr(f"(tj_rb * {e} + {i})"), CExpr(f"(tj_cb * {e})")))
        em.line(f"const unsigned tj_x{i} = *reinterpret_cast<const unsigned*>(tj_src + {at});")
    _transpose_words(em, e)
    for j in range(e):
        at = c_text(d_lay.elem_offset(CExpr(f"(tj_cb * {e} + {j})"), CExpr(f"(tj_rb * {e})")))
        em.line(f"*reinterpret_cast<unsigned*>(tj_dst + {at}) = tj_y{j};")
    em.close()
    em.close()
    em.line("tj_fence_proxy_async();  // the copy's writes, visible to the tensor cores' async proxy")
    em.barrier()
