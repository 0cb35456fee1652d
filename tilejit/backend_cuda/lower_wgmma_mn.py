"""``gemm`` on sm_90a wgmma with an MN-major tf32 operand read into registers as the instruction's A.

wgmma reads 32-bit operands from shared memory K-major only, but its A may come from registers, and a register
fragment does not care how the shared tile it was loaded from is laid out. So the MN-major operand becomes the
instruction's A, loaded per lane with ordinary shared loads out of its swizzled K x MN tile, and the K-major
operand stays a shared-memory descriptor (the instruction's B):

* A given K x M (``transpose_a``), B given N x K: the MN-major operand is already A. The accumulator is the
  usual ``WgmmaLayout``. (With both operands MN-major, ``passes/transpose_operands.py`` copies both K-major for
  the descriptor lowering instead: a copy beside the gathered fragment spills at 128x256.)
* A given M x K, B given K x N (the DESIGN matmul's own layout): the product is computed transposed,
  ``C^T = B^T A^T``: the instruction's A is ``B^T`` (N x K, from B's K x N tile), its B is ``A`` (its M rows of
  K, K-major: exactly wgmma's K-major B), and the instruction's N is the tile's M. The accumulator holds ``C^T``
  in ``WgmmaLayout((N, M))``; the gemm's result is that layout with its dims swapped (``PermutedLayout``), so
  element-wise ops, casts and stores see the same logical M x N tile in a different per-lane layout.

A thread's fragment of k8 step ``kk`` of a 64-row slab holds (row g, k t), (row g + 8, k t), (row g, k t + 4),
(row g + 8, k t + 4) in a0..a3 (g = lane / 4, t = lane % 4, rows from 16 * warp; PTX ISA 9.7.15.5.1, register
fragment of A for ``.tf32`` m64nNk8, the 32-bit form of the 16-bit fragment ``lower_wgmma_rs`` reads). Element
(k, mn) of the K x MN tile sits at ``SharedLayout.elem_offset(k, mn)``: a thread's four offsets for k step 0 of
slab 0 are computed once per kernel (``Emitter.hoist``); a k step adds 8 rows, a slab 64 columns (whole 128-byte
panels). In a warp the 8 lanes of one t read 32 consecutive bytes of one row; the 4 rows a load touches fall on
2 pairs of equal swizzle phase, a 2-way bank conflict.

The fragments are double-buffered by instruction (8 registers per thread): instruction ``j``'s (k step, then
slab) is loaded just before it, behind a ``wgmma.fence``, while instruction ``j - 1`` runs. A register an issued
wgmma reads must not be written before a wait covers that wgmma (PTX ISA 9.7.15.5.2), so each instruction
commits its own group, and before loading instruction ``j`` the gemm waits until at most one group is pending:
the one that last read that buffer (``j - 2``, or in a loop that leaves its gemms in flight,
``Emitter.async_mma``, the previous iteration's) is then complete, while the one after it keeps the tensor cores
busy, across the iteration boundary too. In such a loop the wait before the second instruction leaves no group of
the previous iteration pending, so its slot is handed back (``AsyncMma.release``) with no further wait;
elsewhere the loop waits for the gemm's last group as for any wgmma. (A buffer per k step, all slabs at once,
spilled in the 128x128 pingpong kernel: 16 registers beside a 128-register accumulator under its 168.)

Pinning ``TILEJIT_GEMM_LOWERING=wgmma_m64nNk8_tf32`` keeps the transposing shared-memory copy
(``passes/transpose_operands.py``) instead, for comparison.

fp8 and int8 (``lower_wgmma_mn8``) share all of this but the gather (``load_fragment``): m64nNk32, whose 8-bit
fragment is gathered by ldmatrix.trans, byte permutes and shuffles; a float8 gemm of precision "precise" issues its
instructions in promotion chunks (``Wgmma.emit_promoted``), each still committing its own group.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, Scope
from ..ir.layouts import CExpr, PermutedLayout, SharedLayout, WgmmaLayout, c_text
from ..target import REGISTRY, Target
from .emitter import Emitter
from .lower_gemm import _mnk, _operand_dtypes, _precision
from .lower_wgmma import Wgmma, promoted, promotion_chunks, swizzled_rows, wait_group

#: Fragment registers of one instruction's A (a0..a3: 32-bit elements of tf32, four bytes of fp8 / int8).
_FRAGMENT_REGS = 4
#: Registers the 8-bit gather holds beside a promoted gemm's accumulator and temporaries: two fragments and the
#: words being transposed (``lower_wgmma_mn8``; with them, a 64x128 band's 64-register temporary beside a
#: 128-register accumulator spilled, 456-1360 bytes, where 64-column bands spill nothing).
GATHER_REGISTERS = 3 * _FRAGMENT_REGS


def _swapped(op: Op) -> bool:
    """B given K x N (MN-major) with A K-major: computed as C^T = B^T A^T."""
    return not op.attrs.transpose_b and not op.attrs.transpose_a


def _instruction_mn(op: Op) -> tuple[int, int]:
    m, n, _ = _mnk(op)
    return (n, m) if _swapped(op) else (m, n)


class WgmmaRegisterMN(Wgmma):
    """``wgmma.mma_async.m64nNk8.f32.tf32.tf32`` with A's fragment gathered from an MN-major shared tile. The
    8-bit forms (``lower_wgmma_mn8``) share everything but the gather (``load_fragment``)."""

    gathers_mn_major = True  # with both operands MN-major, both are copied K-major instead (passes.transpose_operands)
    a_note = ", A from registers (gathered from its MN-major tile)"
    #: The C type of the fragment registers.
    fragment_type = "float"

    def acc_layout(self, op: Op, target: Target):
        inst = WgmmaLayout(_instruction_mn(op), target.num_warps // 4)
        return PermutedLayout(inst, (1, 0)) if _swapped(op) else inst

    def instruction_layout(self, acc_layout) -> WgmmaLayout:
        return acc_layout.base if isinstance(acc_layout, PermutedLayout) else acc_layout

    def instruction_operands(self, op: Op):
        a, b = op.operands[0], op.operands[1]
        return (b, a, True) if _swapped(op) else (a, b, True)

    def setup_a(self, em: Emitter, op: Op, a, layout: WgmmaLayout, mn_major: bool) -> None:
        """The fragment registers (two instructions' worth) and the first instruction's loads."""
        em.line(f"const unsigned char* const tj_fsrc = {em.shared[a.id].pointer()};")
        em.line(f"{self.fragment_type} tj_fa[{_buffers(op, layout) * _FRAGMENT_REGS}];  // A's fragment, "
                "double-buffered by instruction")
        self._start(em, op, a, 0, 0, 0, layout)

    def a_operands(self, em: Emitter, op: Op, a, kk: int, s: int, layout: WgmmaLayout,
                   mn_major: bool = False, index: int = 0) -> list[tuple[str, str]]:
        if index:
            self._start(em, op, a, index, kk, s, layout)
            em.line("tj_wgmma_fence();  // this instruction's A registers were written by ordinary loads")
        first = _first_register(op, index, layout)
        word = "__float_as_uint(tj_fa[{}])" if self.fragment_type == "float" else "tj_fa[{}]"
        return [("r", word.format(first + r)) for r in range(_FRAGMENT_REGS)]

    def after_instruction(self, em: Emitter, op: Op, index: int, count: int) -> None:
        if index < count - 1:  # (the last one's group is committed after the loop)
            em.line("tj_wgmma_commit();  // one group per instruction: its registers are free once it completes")

    def chunk_groups(self, instructions: int) -> int:
        return instructions

    def settle(self, em: Emitter, ring, name: str, layout: WgmmaLayout, integer: bool) -> None:
        # the wait before this iteration's second instruction (its first, when it has one) left no group of the
        # previous iteration pending
        ring.release()

    def _start(self, em: Emitter, op: Op, a, index: int, kk: int, s: int, layout: WgmmaLayout) -> None:
        """Load the fragment of instruction ``index`` (k step ``kk``, slab ``s``) into its buffer, once the
        instruction that last read that buffer is complete (one group committed after it may stay pending): two
        instructions back in this gemm, or in a loop left in flight in the previous iteration."""
        buffers = _buffers(op, layout)
        wait = index >= buffers or _in_flight(em, op)
        self.load_fragment(em, op, em.shared[a.id].layout, kk, s, layout, _first_register(op, index, layout),
                           wait)

    def wait_for_buffer(self, em: Emitter, op: Op, layout: WgmmaLayout) -> None:
        """The wait before a fragment buffer is written (``_start``)."""
        wait_group(em, _buffers(op, layout) - 1, em.name(op.result), layout.regs, op.result.dtype == D.int32)

    def load_fragment(self, em: Emitter, op: Op, lay: SharedLayout, kk: int, s: int, layout: WgmmaLayout,
                      first: int, wait: bool) -> None:
        """tf32: one 32-bit shared load per register, after the wait (when ``wait``)."""
        if wait:
            self.wait_for_buffer(em, op, layout)
        # 64 columns further per slab: whole 128-byte panels (the shape rule keeps slabs on panel boundaries)
        at = kk * 8 * lay.row_pitch + s * layout.groups * 64 * lay.elem_bytes // lay.row_pitch * lay.panel_bytes
        for r in range(_FRAGMENT_REGS):
            off = em.hoist("unsigned", c_text(fragment_offset(lay, r)), key=("wgmma_mn_a", lay, r))
            em.line(f"tj_fa[{first + r}] = "
                    f"*reinterpret_cast<const float*>(tj_fsrc + {off}{f' + {at}' if at else ''});")


def _steps(op: Op) -> int:
    """k steps of the gemm: 32 bytes of K each."""
    return _mnk(op)[2] * op.operands[0].dtype.itemsize // 32


def _instructions(op: Op, layout: WgmmaLayout) -> int:
    """Instructions the gemm issues: one per k step and slab, and per column band of a promoted gemm."""
    # (only float8 gemms are promoted: the 8-bit gather's registers sit beside the temporaries)
    width = promotion_chunks(layout.regs, layout.shape[1], GATHER_REGISTERS)[0] if promoted(op) else layout.shape[1]
    bands = layout.shape[1] // width
    return _steps(op) * layout.slabs * bands


def _buffers(op: Op, layout: WgmmaLayout) -> int:
    """Instructions whose fragments are held at once: two (one loading while the other runs), or the only one."""
    return min(2, _instructions(op, layout))


def _first_register(op: Op, index: int, layout: WgmmaLayout) -> int:
    """The first fragment register of instruction ``index`` (in issue order: k step major, then slab)."""
    return (index % _buffers(op, layout)) * _FRAGMENT_REGS


def _in_flight(em: Emitter, op: Op) -> bool:
    """The gemm is left in flight by its loop (``Emitter.async_mma``): its last groups stay pending into the next
    iteration, whose first loads must wait for them too (a promoted gemm waits for all of its own)."""
    return em.async_mma is not None and em.async_mma.owns(op) and not promoted(op)


def fragment_coords(tid, r: int):
    """(k, mn) of fragment register ``r`` (a0..a3) of thread ``tid`` at k step 0 of its warpgroup's first slab."""
    wg, warp, lane = tid >> 7, (tid >> 5) & 3, tid & 31
    g, t = lane >> 2, lane & 3
    return t + 4 * (r >> 1), wg * 64 + warp * 16 + g + 8 * (r & 1)


def fragment_offset(lay: SharedLayout, r: int):
    """Byte offset in ``lay`` (a K x MN tile) of fragment register ``r`` of thread ``tid`` (a C expression)."""
    k, mn = fragment_coords(CExpr("tid"), r)
    return lay.elem_offset(k, mn)


def shapes_fit(op: Op, target: Target) -> bool:
    """Shapes: the instruction's M (the MN-major operand's extent) in 64-row slabs per warpgroup, its N <= 256
    and a multiple of 8, K in whole instructions (32 bytes of K each), <= 128 accumulator registers; the MN-major
    tile's rows whole 128-byte panels or one 64-byte row (a slab moves by whole or, 8-bit, half panels; a
    192-byte row is not swizzled); the K-major tile's rows in a wgmma swizzle mode."""
    if target.num_warps % 4 or any(v.type.scope is not Scope.SHARED for v in op.operands[:2]):
        return False
    groups = target.num_warps // 4
    mi, ni = _instruction_mn(op)
    k = _mnk(op)[2]
    size = op.operands[0].dtype.itemsize
    if mi % (64 * groups) or ni % 8 or ni > 256 or (k * size) % 32:
        return False
    if (mi // (64 * groups)) * ni // 2 > 128:
        return False
    return ((mi * size) % 128 == 0 or mi * size == 64) and swizzled_rows(k * size, ni * k * size)


def one_operand_mn_major(op: Op, target: Target) -> bool:
    return _swapped(op) or (op.attrs.transpose_a and op.attrs.transpose_b)


REGISTRY.register("gemm", "wgmma_mn_m64nNk8_tf32", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are f32": _operand_dtypes(D.float32),
    "precision is tf32": _precision("tf32"),
    "exactly one operand is MN-major (A given K x M, or B given K x N)": one_operand_mn_major,
    "the MN-major operand's extent in 64-row slabs per warpgroup and whole 128-byte panels, the other's <= 256 "
    "and a multiple of 8, K in whole k8 steps, accumulator <= 128 registers, the K-major tile's rows in a wgmma "
    "swizzle mode": shapes_fit,
})(WgmmaRegisterMN())
