"""``gemm`` on sm_90a wgmma with an MN-major float8 or int8 operand gathered into registers as the instruction's A.

wgmma reads 8-bit operands from shared memory K-major only. As for tf32 (``lower_wgmma_mn``, whose forms, swapped
product, accumulator layouts, double buffering and waits this lowering shares), the MN-major operand becomes the
instruction's A, read from its swizzled K x MN tile into registers, and the K-major operand stays the descriptor
B: ``wgmma.mma_async.m64nNk32`` ``.f32.e4m3/.e5m2`` (precision "fast", or "precise" with the float32 promotion of
``lower_wgmma``) and ``.s32.s8.s8``.

The fragment of A for k32 step ``kk`` of a 64-row slab: lane ``4 g + t`` holds (row g, k 4t..4t+3) in a0, (row
g + 8, same k) in a1, (row g, k 16 + 4t..) in a2, (row g + 8, k 16 + 4t..) in a3, one byte per k (PTX ISA
9.7.15.5.1, 8-bit A of m64nNk32; rows from 16 * warp). In the K x MN tile those four k bytes lie in four rows, so
the gather is a 4 x 4 byte transpose: write ``g = 4 q + i``; for register r, the lanes ``16 q + 4 i + t`` (i =
0..3) need the block of rows ``m0 = 16 warp + 8 (r & 1) + 4 q`` .. m0 + 3 and k ``k0 = 16 (r >> 1) + 4 t`` ..
k0 + 3. Lane i loads the 32-bit word (k0 + i, m0 .. m0 + 3) (four MN-consecutive bytes of one k row: one 16-byte
chunk holds them); then two butterfly rounds: ``__shfl_xor_sync`` 8 (i ^ 2) with ``__byte_perm`` keeping the two
columns 2 (i >> 1) .. + 1 of rows i and i ^ 2, and ``__shfl_xor_sync`` 4 (i ^ 1) keeping column i of all four
rows, leave lane i with (k0 .. k0 + 3, m0 + i): the fragment word. Per instruction and lane: 4 shared loads
(32-bit), 8 shuffles, 8 byte permutes (plus the 4 moves into the fragment buffer, which the compiler folds).
Byte loads would cost 16 shared loads per instruction.

Bank conflicts: a load of a warp reads 16 k rows (4 t x 4 i) at two words (q) of one 16-byte chunk of each, which
the 128-byte swizzle places at 8 chunk positions: 16 banks, two rows each (k and k + 8), a 2-way conflict (as the
tf32 gather's). ``tests/backend/test_wgmma_mn_major_8bit.py`` replays the loads, shuffles and permutes lane by lane
against the real layout and counts the banks.

The loads and shuffles of an instruction's fragment are issued before the wait that frees its buffer (into
``tj_w``, then moved into the buffer after the wait), so their latency overlaps the instructions in flight; a
promoted gemm (precision "precise") waits first, keeping a third fragment's registers out of its temporaries'
room (its bands beside a 128-register accumulator are 64 columns: ``GATHER_REGISTERS``). A slab of 64 MN bytes
is half a 128-byte panel: one offset a lane is hoisted per half-panel (``Emitter.hoist``); the four registers, a
k step (32 rows) and whole panels add constants to it.

Pinning ``TILEJIT_GEMM_LOWERING=wgmma_m64nNk32_fp8`` (or ``wgmma_m64nNk32_int8``) keeps the transposing
shared-memory copy (``passes/transpose_operands.py``) instead, for comparison.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op
from ..ir.layouts import CExpr, SharedLayout, WgmmaLayout, c_text
from ..target import REGISTRY, Target
from .emitter import Emitter
from .lower_gemm import _acc_f32, _acc_i32, _mnk, _operand_dtypes
from .lower_wgmma import promoted
from .lower_wgmma_mn import (_FRAGMENT_REGS, GATHER_REGISTERS, WgmmaRegisterMN, _instruction_mn, one_operand_mn_major,
                             shapes_fit)

#: ``__byte_perm`` selectors of the first butterfly round (partner lane ^ 8), for i >> 1 = 0 and 1: keep the
#: columns 2 (i >> 1), 2 (i >> 1) + 1 of the lower row of {i, i ^ 2} then of the higher.
ROUND_A_SELECT = (0x5410, 0x3276)
#: ... of the second round (partner lane ^ 4), for i & 1 = 0 and 1: column i of rows 0..3, from the lane's own
#: word (rows of its parity) and the partner's.
ROUND_B_SELECT = (0x6240, 0x3715)


def gather_coords(tid, r: int):
    """(k, mn) of the first byte of the word thread ``tid`` loads for fragment register ``r`` (a0..a3) at k step
    0 of its warpgroup's first slab; bytes 1..3 are mn + 1..3."""
    wg, warp, lane = tid >> 7, (tid >> 5) & 3, tid & 31
    q, i, t = lane >> 4, (lane >> 2) & 3, lane & 3
    return 16 * (r >> 1) + 4 * t + i, wg * 64 + warp * 16 + 8 * (r & 1) + 4 * q


def gather_offset(lay: SharedLayout, r: int, shift: int = 0):
    """Byte offset in ``lay`` (a K x MN tile) of the word thread ``tid`` loads for register ``r``, ``shift``
    columns further (a C expression)."""
    k, mn = gather_coords(CExpr("tid"), r)
    return lay.elem_offset(k, mn + shift)


class WgmmaRegisterMN8(WgmmaRegisterMN):
    """``wgmma.mma_async.m64nNk32`` (e4m3 / e5m2 into f32, s8 into s32) with A's fragment gathered from an
    MN-major shared tile by a 4 x 4 byte transpose across lanes (module docstring)."""

    fragment_type = "unsigned"
    promotion_beside = GATHER_REGISTERS

    def load_fragment(self, em: Emitter, op: Op, lay: SharedLayout, kk: int, s: int, layout: WgmmaLayout,
                      first: int, wait: bool) -> None:
        shift = s * layout.groups * 64  # MN columns from the warpgroup's first slab
        panel_cols = lay.row_pitch // lay.elem_bytes
        at = kk * 32 * lay.row_pitch + shift // panel_cols * lay.panel_bytes
        half = shift % panel_cols  # 0, or 64: the other half of each panel (offsets hoisted apart)
        sel_a = em.hoist("unsigned", f"((tid >> 3) & 1) ? {ROUND_A_SELECT[1]:#x}u : {ROUND_A_SELECT[0]:#x}u",
                         key="wgmma_mn8_round_a")
        sel_b = em.hoist("unsigned", f"((tid >> 2) & 1) ? {ROUND_B_SELECT[1]:#x}u : {ROUND_B_SELECT[0]:#x}u",
                         key="wgmma_mn8_round_b")
        early = not promoted(op)  # (module docstring: a promoted gemm waits first)
        if wait and not early:
            self.wait_for_buffer(em, op, layout)
        em.open("")
        em.line(f"unsigned tj_w[{_FRAGMENT_REGS}];  // words of 4 MN-consecutive bytes of one k row, transposed "
                "4 x 4 across the lanes ^ 4, ^ 8")
        # one offset a lane: register r is 8 bytes further in the same 16-byte chunk (r & 1), 16 rows further
        # (r >> 1), which the swizzle (8-row period) leaves in the same chunk position
        off = em.hoist("unsigned", c_text(gather_offset(lay, 0, half)), key=("wgmma_mn8_a", lay, half))
        for r in range(_FRAGMENT_REGS):
            plus = at + 8 * (r & 1) + 16 * (r >> 1) * lay.row_pitch
            em.line(f"tj_w[{r}] = *reinterpret_cast<const unsigned*>(tj_fsrc + {off}{f' + {plus}' if plus else ''});")
        for partner, sel in ((8, sel_a), (4, sel_b)):
            em.line("#pragma unroll")
            em.line(f"for (int r = 0; r < {_FRAGMENT_REGS}; ++r) "
                    f"tj_w[r] = __byte_perm(tj_w[r], __shfl_xor_sync(0xffffffffu, tj_w[r], {partner}), {sel});")
        if wait and early:
            self.wait_for_buffer(em, op, layout)
        for r in range(_FRAGMENT_REGS):
            em.line(f"tj_fa[{first + r}] = tj_w[{r}];")
        em.close()


def _not_pingpong_beyond_a_slab(op: Op, target: Target) -> bool:
    """Not a pingpong kernel whose group owns more than one 64-row slab of the tile's M: there the gather's
    registers spilled (1,832 bytes at 128x128 on 4 warps, under the 168 registers a pingpong thread gets; 64x256
    on 4 warps spilled nothing); the copy takes it (``configs.promotion_fits``, the same rule)."""
    return not (target.pingpong and _mnk(op)[0] > 64 * (target.num_warps // 4))


def _int8_n(op: Op, target: Target) -> bool:
    n = _instruction_mn(op)[1]
    return n % 16 == 0 or n in (8, 24)


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
