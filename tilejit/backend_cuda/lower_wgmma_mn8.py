"""``gemm`` on sm_90a wgmma with an MN-major float8 or int8 operand gathered into registers as the instruction's A.

wgmma reads 8-bit operands from shared memory K-major only. As for tf32 (``lower_wgmma_mn``, whose forms, swapped
product, accumulator layouts, double buffering and waits this lowering shares), the MN-major operand becomes the
instruction's A, read from its swizzled K x MN tile into registers, and the K-major operand stays the descriptor
B: ``wgmma.mma_async.m64nNk32`` ``.f32.e4m3/.e5m2`` (precision "fast", or "precise" with the float32 promotion of
``lower_wgmma``) and ``.s32.s8.s8``.

The fragment of A for k32 step ``kk`` of a 64-row slab: lane ``4 g + t`` holds (row g, k 4t..4t+3) in a0, (row
g + 8, same k) in a1, (row g, k 16 + 4t..) in a2, (row g + 8, k 16 + 4t..) in a3, one byte per k (PTX ISA
9.7.15.5.1, 8-bit A of m64nNk32; rows from 16 * warp). In the K x MN tile those four k bytes lie in four rows.
One ``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`` reads the warp's 16 MN bytes (one 16-byte chunk) of all
32 k rows of the step, as four 8 x 8 matrices of b16 (two MN bytes each): lane ``8 i + j`` gives the address of
row j of matrix i, k = 16 (i >> 1) + 4 (j >> 1) + 2 ((i & 1) ^ (j >> 2)) + (j & 1), and ``.trans`` hands lane
(g, t) in register i the rows 2t, 2t + 1 of b16 column g: a 2 x 2 byte block (k of those two rows, mn 2g,
2g + 1). So matrices 2h and 2h + 1 give lane (g, t) the four k 16 h + 4t .. + 3 (matrix 2h the lower pair for
t < 2, the upper for t >= 2: that keeps each matrix's 8 rows on 8 different swizzle phases) of mn 2g and 2g + 1,
which two ``__byte_perm`` (``SELECT_WORD``, per-lane selectors) make into two fragment words, one per column.
They belong to lanes g' = 2g mod 8 and 2g + 1 mod 8 (as a0 / a2 for g < 4, a1 / a3 for g >= 4): one
``__shfl_sync`` per register moves them there, the first from lane 4 ((g' >> 1) + 4 (g' & 1)) + t, the second
from that lane ^ 16 (lanes g >= 4 build their two words in the other order, so each lane sends one word a
shuffle and every word reaches its lane), and an odd g' swaps the two it received (a select). Per instruction
and warp: 1 ldmatrix.x4 and 4 shuffles, 5 instructions of the shared-memory pipe (MIO) where the gather of
4 32-bit shared loads, 8 ``__shfl_xor_sync`` and their 8 byte permutes (a 4 x 4 byte transpose in two butterfly
rounds) took 12; per lane 4 byte permutes and 4 selects beside them (ALU).

Bank conflicts: each of the ldmatrix's four phases reads one matrix, 8 rows of one 16-byte chunk position whose k
are 8 distinct residues mod 8 (128-byte rows: chunk ^ (k % 8)) or, in a 64-byte row, 4 swizzle phases times
both halves of a 128-byte line: 32 banks, no conflict (the 32-bit loads conflicted 2-way).
``tests/backend/test_wgmma_mn_major_8bit.py`` replays the ldmatrix, permutes, shuffles and selects lane by lane
against the real layout and counts the banks of each phase.

The ldmatrix and shuffles of an instruction's fragment are issued before the wait that frees its buffer (into
``tj_w`` and ``tj_x``, selected into the buffer after the wait), so their latency overlaps the instructions in
flight; a promoted gemm (precision "precise") waits first, keeping a third fragment's registers out of its
temporaries' room (its bands beside a 128-register accumulator are 64 columns: ``GATHER_REGISTERS``), and
gathers a k step's fragment again in each band (holding a k group's four fragments across the bands instead, 16
registers, spilled 360-436 bytes at 128x256 and 256x128 on 8 warps). A slab of 64 MN bytes is half a 128-byte
panel: one row offset a lane is hoisted per half-panel (``Emitter.hoist``); a k step (32 rows, the swizzle's
period a multiple of it) and whole panels add the ldmatrix's immediate to it.

Pinning ``TILEJIT_GEMM_LOWERING=wgmma_m64nNk32_fp8`` (or ``wgmma_m64nNk32_int8``) keeps the transposing
shared-memory copy (``passes/transpose_operands.py``) instead, for comparison.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op
from ..ir.layouts import CExpr, SharedLayout, WgmmaLayout, c_text
from ..target import REGISTRY, Target
from .emitter import Emitter
from .lower_gemm import _acc_f32, _acc_i32, _ldmatrix_at, _mnk, _operand_dtypes
from .lower_wgmma import int8_n_fits, promoted
from .lower_wgmma_mn import (_FRAGMENT_REGS, GATHER_REGISTERS, WgmmaRegisterMN, _buffers, _instruction_mn,
                             one_operand_mn_major, shapes_fit)

#: ``__byte_perm`` selector that gathers, from the two 2 x 2 byte blocks of one k half (matrices 2 h, 2 h + 1),
#: the word (4 k, the block's first mn column) of a lane with t < 2; t >= 2 (whose matrix 2 h holds the upper
#: k pair) XORs ``SELECT_T_HIGH`` into it, and the word of the second mn column is ``SELECT_MN_ODD`` further.
SELECT_WORD = 0x6420
SELECT_T_HIGH = 0x6420 ^ 0x2064
SELECT_MN_ODD = 0x1111


def ldmatrix_coords(tid):
    """(k, mn) of the 16-byte row (mn .. mn + 15) whose address thread ``tid`` gives to ``ldmatrix.x4.trans``
    at k step 0 of its warpgroup's first slab: lane 8 i + j gives row j of matrix i (module docstring)."""
    wg, warp, lane = tid >> 7, (tid >> 5) & 3, tid & 31
    i, j = lane >> 3, lane & 7
    t = j >> 1
    return 16 * (i >> 1) + 4 * t + 2 * ((i & 1) ^ (t >> 1)) + (j & 1), wg * 64 + warp * 16


def ldmatrix_offset(lay: SharedLayout, shift: int = 0):
    """Byte offset in ``lay`` (a K x MN tile) of the row thread ``tid`` addresses, ``shift`` columns further (a C
    expression)."""
    k, mn = ldmatrix_coords(CExpr("tid"))
    return lay.elem_offset(k, mn + shift)


class WgmmaRegisterMN8(WgmmaRegisterMN):
    """``wgmma.mma_async.m64nNk32`` (e4m3 / e5m2 into f32, s8 into s32) with A's fragment gathered from an
    MN-major shared tile by one ``ldmatrix.x4.trans``, byte permutes and one shuffle a register (module
    docstring)."""

    fragment_type = "unsigned"
    promotion_beside = GATHER_REGISTERS

    def setup_a(self, em: Emitter, op: Op, a, layout: WgmmaLayout, mn_major: bool) -> None:
        em.line(f"const unsigned tj_fsa = {em.shared[a.id].base()};  // the MN-major tile's shared address")
        em.line(f"unsigned tj_fa[{_buffers(op, layout) * _FRAGMENT_REGS}];  // A's fragment, double-buffered by "
                "instruction")
        self._start(em, op, a, 0, 0, 0, layout)

    def load_fragment(self, em: Emitter, op: Op, lay: SharedLayout, kk: int, s: int, layout: WgmmaLayout,
                      first: int, wait: bool) -> None:
        shift = s * layout.groups * 64  # MN columns from the warpgroup's first slab
        panel_cols = lay.row_pitch // lay.elem_bytes
        at = kk * 32 * lay.row_pitch + shift // panel_cols * lay.panel_bytes
        half = shift % panel_cols  # 0, or 64: the other half of each panel (offsets hoisted apart)
        sel, other = (em.hoist("unsigned", f"{SELECT_WORD ^ odd_column:#x}u ^ (((tid >> 1) & 1) * {SELECT_T_HIGH:#x}u)"
                               f" ^ (((tid >> 4) & 1) * {SELECT_MN_ODD:#x}u)") for odd_column in (0, SELECT_MN_ODD))
        source = em.hoist("unsigned", "((tid >> 1) & 12) + ((tid << 2) & 16) + (tid & 3)", key="wgmma_mn8_source")
        odd = em.hoist("unsigned", "(tid >> 2) & 1", key="wgmma_mn8_odd")
        off = em.hoist("unsigned", c_text(ldmatrix_offset(lay, half)), key=("wgmma_mn8_ldmatrix", lay, half))
        early = not promoted(op)  # (module docstring: a promoted gemm waits first)
        if wait and not early:
            self.wait_for_buffer(em, op, layout)
        em.open("")
        em.line(f"unsigned tj_w[{_FRAGMENT_REGS}], tj_x[{_FRAGMENT_REGS}];  // 2 k x 2 mn byte blocks; words of 4 k "
                "of one mn column, from the lanes that hold them")
        em.require_support("tj_ldmatrix_x4_trans_at", _ldmatrix_at("x4", True))
        em.line(f"tj_ldmatrix_x4_trans_at<{at}>(tj_w[0], tj_w[1], tj_w[2], tj_w[3], tj_fsa + {off});")
        for h in range(2):
            for r, (selector, lane) in enumerate(((sel, source), (other, f"{source} ^ 16u"))):
                em.line(f"tj_x[{2 * h + r}] = __shfl_sync(0xffffffffu, __byte_perm(tj_w[{2 * h}], tj_w[{2 * h + 1}], "
                        f"{selector}), {lane});")
        if wait and early:
            self.wait_for_buffer(em, op, layout)
        for h in range(2):
            em.line(f"tj_fa[{first + 2 * h}] = {odd} ? tj_x[{2 * h + 1}] : tj_x[{2 * h}];")
            em.line(f"tj_fa[{first + 2 * h + 1}] = {odd} ? tj_x[{2 * h}] : tj_x[{2 * h + 1}];")
        em.close()


def _not_pingpong_beyond_a_slab(op: Op, target: Target) -> bool:
    """Not a pingpong kernel whose group owns more than one 64-row slab of the tile's M: there the gather's
    registers spilled (1,832 bytes at 128x128 on 4 warps, under the 168 registers a pingpong thread gets; 64x256
    on 4 warps spilled nothing); the copy takes it (``configs.promotion_fits``, the same rule)."""
    return not (target.pingpong and _mnk(op)[0] > 64 * (target.num_warps // 4))


def _int8_n(op: Op, target: Target) -> bool:
    return int8_n_fits(_instruction_mn(op)[1])


_PINGPONG = "not a pingpong kernel whose group owns more than one 64-row slab of M"
_ONE_MN = "exactly one operand is MN-major (A given K x M, or B given K x N)"
_SHAPES = ("the MN-major operand's extent in 64-row slabs per warpgroup and whole 128-byte panels or one 64-byte "
           "row, the other's <= 256 and a multiple of 8, K in whole k32 steps, accumulator <= 128 registers, the "
           "K-major tile's rows in a wgmma swizzle mode")

REGISTRY.register("gemm", "wgmma_mn_m64nNk32_fp8", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are float8 (e4m3fn, e5m2)": _operand_dtypes(D.float8_e4m3fn, D.float8_e5m2),
    "accumulator is f32": _acc_f32,
    _ONE_MN: one_operand_mn_major,
    _SHAPES: shapes_fit,
    _PINGPONG: _not_pingpong_beyond_a_slab,
})(WgmmaRegisterMN8())

REGISTRY.register("gemm", "wgmma_mn_m64nNk32_int8", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are int8": _operand_dtypes(D.int8),
    "accumulator is i32": _acc_i32,
    _ONE_MN: one_operand_mn_major,
    _SHAPES: shapes_fit,
    _PINGPONG: _not_pingpong_beyond_a_slab,
    "the instruction's N % 16 == 0 or N in (8, 24)": _int8_n,
})(WgmmaRegisterMN8())
