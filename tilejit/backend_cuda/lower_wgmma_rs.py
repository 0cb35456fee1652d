"""``gemm`` on sm_90a wgmma with operand A in registers (``wgmma.mma_async`` ... ``{a0, a1, a2, a3}, b-desc``).

A 16-bit tile that holds a wgmma accumulator's layout (``WgmmaLayout`` over the same warpgroups and rows, e.g.
attention's ``p = exp2(s - m).to(bf16)`` after ``s = q @ k.T``) is already operand A's register fragment: for
k16 step ``kk`` of a slab, a thread's elements ``8 kk .. 8 kk + 7`` are (row g, k 2t..2t+1), (row g + 8, same k),
(row g, k 8 + 2t..), (row g + 8, k 8 + 2t..) (PTX ISA 9.7.15.5.1, "Register fragment for matrix A" of
m64nNk16), which are the four 32-bit registers a0..a3 in order. The tile is fed to the tensor cores without
the round trip through shared memory (and the block-wide barrier) that staging it would cost.

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
        em.line(f"unsigned tj_pa[{a.type.layout.regs // 2}];  // A's fragment, two 16-bit elements per register")
        pack_a(em, a, "tj_pa")

    def a_operands(self, em: Emitter, op: Op, a, kk: int, s: int, layout: WgmmaLayout,
                   mn_major: bool = False) -> list[tuple[str, str]]:
        base = (s * a.type.layout.regs // a.type.layout.slabs + 8 * kk) // 2
        words = em.packed_a.get(a.id, "tj_pa")
        return [("r", f"{words}[{base + i}]") for i in range(4)]


def pack_a(em: Emitter, a, dst: str) -> None:
    """``dst[i]`` = the 16-bit elements ``2i`` and ``2i + 1`` of register tile ``a``: its A fragment words."""
    x = em.name(a)
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
