"""``gemm`` on sm_90a wgmma with operand A in registers (``wgmma.mma_async`` ... ``{a0, a1, a2, a3}, b-desc``).

A 16-bit tile that holds a wgmma accumulator's layout (``WgmmaLayout`` over the same warpgroups and rows, e.g.
attention's ``p = exp2(s - m).to(bf16)`` after ``s = q @ k.T``) is already operand A's register fragment: for
k16 step ``kk`` of a slab, a thread's elements ``8 kk .. 8 kk + 7`` are (row g, k 2t..2t+1), (row g + 8, same k),
(row g, k 8 + 2t..), (row g + 8, k 8 + 2t..) (PTX ISA 9.7.15.5.1, "Register fragment for matrix A" of
m64nNk16), which are the four 32-bit registers a0..a3 in order. The tile is fed to the tensor cores without
the round trip through shared memory (and the block-wide barrier) that staging it would cost.

A float8 tile in that layout (``p.to(T.float8_e4m3fn)``) feeds ``m64nNk32`` (``wgmma_rs_m64nNk32_fp8``), whose
A fragment for k32 step ``kk`` wants (row g, k 4t..4t+3), (row g + 8, same k), (row g, k 16 + 4t..), (row g + 8,
k 16 + 4t..) in a0..a3, four bytes each (PTX ISA 9.7.15.5.1, the 8-bit A fragment of m64nNk32, as m16n8k32's).
A thread holds (row g, k 2t, 2t + 1, 8 + 2t, 9 + 2t, ...) instead: each word is gathered from two lanes of its
quad (``fp8_a_word_sources``): lanes (2t) % 4 and (2t + 1) % 4 send their byte pairs of k 0..15 (or 16..31) of
the row, and ``__byte_perm`` keeps the low halves (t < 2) or the high ones (t >= 2): two shuffles per word.

The layout pass offers a gemm this lowering when scope inference staged its A operand into shared memory
from registers (``passes.layouts.keep_register_operands``); operand B stays a shared-memory descriptor.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, Scope
from ..ir.layouts import WgmmaLayout
from ..target import REGISTRY, Target
from .emitter import Emitter
from .lower_gemm import _acc_f32, _mnk, _operand_dtypes
from .lower_wgmma import _SHAPES, Wgmma, _b_k_major, _tile_shapes_fit, swizzled_rows


class WgmmaRegisterA(Wgmma):
    """``wgmma.mma_async.m64nNk16`` with A's fragment taken from the registers of a 16-bit tile."""

    register_a = True  # the layout pass may hand this lowering a register operand A
    a_note = ", A from registers"

    def setup_a(self, em: Emitter, op: Op, a, layout: WgmmaLayout, mn_major: bool) -> None:
        # Packed before the fence: a register written between two wgmma that read it makes ptxas insert a
        # fence of its own before each of them (C7519).
        if a.id in em.packed_a:
            return  # packed when it was made (a deferred gemm's A, carried to the next iteration)
        what = "four float8 elements gathered across the quad" if a.dtype.itemsize == 1 else "two 16-bit elements"
        em.line(f"unsigned tj_pa[{packed_words(a)}];  // A's fragment, {what} per register")
        pack_a(em, a, "tj_pa")

    def a_operands(self, em: Emitter, op: Op, a, kk: int, s: int, layout: WgmmaLayout,
                   mn_major: bool = False, index: int = 0) -> list[tuple[str, str]]:
        base = (s * a.type.layout.regs // a.type.layout.slabs + 8 * kk) // 2
        words = em.packed_a.get(a.id, "tj_pa")
        return [("r", f"{words}[{base + i}]") for i in range(4)]


class WgmmaRegisterAFp8(WgmmaRegisterA):
    """``wgmma.mma_async.m64nNk32`` with A's fragment gathered from the registers of a float8 tile in the
    accumulator layout (module docstring)."""

    def a_operands(self, em: Emitter, op: Op, a, kk: int, s: int, layout: WgmmaLayout,
                   mn_major: bool = False, index: int = 0) -> list[tuple[str, str]]:
        base = (s * a.type.layout.regs // a.type.layout.slabs + 16 * kk) // 4
        words = em.packed_a.get(a.id, "tj_pa")
        return [("r", f"{words}[{base + i}]") for i in range(4)]


def packed_words(a) -> int:
    """32-bit words of register tile ``a``'s packed A fragment."""
    return a.type.layout.regs * a.dtype.itemsize // 4


#: ``__byte_perm`` selectors of the float8 A fragment: the low byte pairs of both sources (t < 2), the high ones.
FP8_A_SELECT = (0x5410, 0x7632)


def fp8_a_word_sources(lane: int, word: int) -> list[tuple[int, int]]:
    """(source lane, source element) of the four bytes of float8 A fragment word ``word`` on ``lane``, as
    ``pack_a`` gathers them: word ``4 c + 2 h + r`` is register a_{2h + r} of k32 step ``c`` (elements ``16 c``..
    of the tile's registers); each source lane packs elements ``e, e + 1, e + 4, e + 5`` (e = 16 c + 8 h + 2 r)
    into one word, of which two bytes are kept."""
    t = lane & 3
    e = 16 * (word >> 2) + 8 * ((word >> 1) & 1) + 2 * (word & 1)
    sources = [(lane & ~3) | ((2 * t) & 3), (lane & ~3) | ((2 * t + 1) & 3)]
    high = 4 if t >= 2 else 0  # the source word's bytes 2, 3 (elements e + 4, e + 5)
    return [(sources[byte >> 1], e + high + (byte & 1)) for byte in range(4)]


def pack_a(em: Emitter, a, dst: str) -> None:
    """``dst[i]`` = the A fragment words of register tile ``a``: 16-bit elements ``2i`` and ``2i + 1``; float8
    elements gathered across the quad (``fp8_a_word_sources``)."""
    x = em.name(a)
    if a.dtype.itemsize == 1:
        em.open("")  # its own scope: a deferred gemm's A is packed again in the loop body
        em.line("const int tj_q0 = (tid & 28) | ((2 * tid) & 3), tj_q1 = (tid & 28) | ((2 * tid + 1) & 3);")
        em.line(f"const unsigned tj_sel = (tid & 2) ? {FP8_A_SELECT[1]:#x}u : {FP8_A_SELECT[0]:#x}u;")
        em.line("#pragma unroll")
        em.open(f"for (int w = 0; w < {packed_words(a)}; ++w)")
        em.line("const int e = 16 * (w >> 2) + 8 * ((w >> 1) & 1) + 2 * (w & 1);")
        em.line(f"const unsigned x = (unsigned){x}[e].bits | ((unsigned){x}[e + 1].bits << 8) "
                f"| ((unsigned){x}[e + 4].bits << 16) | ((unsigned){x}[e + 5].bits << 24);")
        em.line(f"{dst}[w] = __byte_perm(__shfl_sync(0xffffffffu, x, tj_q0), __shfl_sync(0xffffffffu, x, tj_q1), "
                "tj_sel);")
        em.close()
        em.close()
        return
    em.line("#pragma unroll")
    em.line(f"for (int i = 0; i < {a.type.layout.regs // 2}; ++i) "
            f"{dst}[i] = (unsigned){x}[2 * i].bits | ((unsigned){x}[2 * i + 1].bits << 16);")


def _a_in_accumulator_layout(op: Op, target: Target) -> bool:
    a = op.operands[0]
    m, _, k = _mnk(op)
    layout = getattr(a.type, "layout", None)
    return (a.type.scope is Scope.REGISTER and not op.attrs.transpose_a and isinstance(layout, WgmmaLayout)
            and tuple(layout.shape) == (m, k) and layout.groups == target.num_warps // 4)


def _b_rows_fit(op: Op, target: Target) -> bool:
    """B's shared rows in a wgmma swizzle mode (A has no shared rows here: any K in whole k16 steps)."""
    _, n, k = _mnk(op)
    size = op.operands[1].dtype.itemsize
    return swizzled_rows((k if _b_k_major(op) else n) * size, n * k * size)


REGISTRY.register("gemm", "wgmma_rs_m64nNk16", min_sm=90, max_sm=90, priority=25, predicates={
    "A is a register tile in a wgmma accumulator layout of the same rows (M x K)": _a_in_accumulator_layout,
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    _SHAPES: _tile_shapes_fit,
    "B's shared rows (along K when K-major, N when N-major) are 128-byte panels, or one 64- or 32-byte row in a "
    "tile of >= 1024 bytes: a wgmma swizzle mode": _b_rows_fit,
})(WgmmaRegisterA())

REGISTRY.register("gemm", "wgmma_rs_m64nNk32_fp8", min_sm=90, max_sm=90, priority=25, predicates={
    "A is a register tile in a wgmma accumulator layout of the same rows (M x K)": _a_in_accumulator_layout,
    "operands are float8 (e4m3fn, e5m2)": _operand_dtypes(D.float8_e4m3fn, D.float8_e5m2),
    "accumulator is f32": _acc_f32,
    _SHAPES: _tile_shapes_fit,
    "B is K-major (given N x K, transpose_b)": lambda op, target: _b_k_major(op),
    "B's shared rows are 128-byte panels, or one 64- or 32-byte row in a tile of >= 1024 bytes: a wgmma "
    "swizzle mode": _b_rows_fit,
})(WgmmaRegisterAFp8())
