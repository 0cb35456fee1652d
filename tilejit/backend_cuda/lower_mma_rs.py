"""``gemm`` on mma.sync m16n8k16 with operand A in registers (sm_80+, and sm_90a where mma.sync is the lowering).

A 16-bit register tile whose layout renames into m16n8k16's A fragment (:class:`MmaOperandALayout`: warps along M,
every warp holding all of K) is operand A as the instructions read it. An f32 (or f16) accumulator with the warps
along M only, ``MmaLayout((M, K), num_warps, 1)``, is such a tile once cast to 16 bits: c0 c1 (row g, cols 2t,
2t + 1) and c2 c3 (row g + 8) of the n8 atom ``2 kk`` are a0..a3 of k step ``kk``, those of atom ``2 kk + 1`` are
a4..a7 (PTX ISA 9.7.14.5.8), packed two per 32-bit register. So attention's ``p = exp2(s - m).to(bf16)`` after
``s = q @ k.T`` feeds ``p @ v`` without the round trip through shared memory (st.shared, a block-wide barrier,
ldmatrix) that staging it costs. Operand B is read with ldmatrix (``.trans`` for a K x N tile) from shared memory
as in :class:`~tilejit.backend_cuda.lower_gemm.MmaSync`.

The layout pass (``passes.layouts``) gives a gemm and the gemms its staged operand A is computed from (element by
element) accumulators with the warps along M (``MmaSync.rows_acc_layout``) when this lowering's layout-free
conditions hold (``fits_rows``), then offers it the register tile (``keep_register_operands``). A tile in any other
layout (warps split along N, a blocked load, M not a multiple of 16 x num_warps, 8- or 32-bit elements) keeps
the staging through shared memory. A pinned ``mma_sync_m16n8k16`` (``TILEJIT_GEMM_LOWERING``) admits this form
(``register_a_of``): it is the same instruction.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, Scope
from ..ir.layouts import CExpr, MmaLayout, MmaOperandALayout, c_text, thread_local_permutation
from ..target import REGISTRY, Target
from .emitter import Emitter
from .lower_gemm import MmaSync, _acc_f16, _acc_f32, _mma_shapes_fit, _mnk, _operand_dtypes


def a_fragment_registers(layout, m: int, k: int, warps: int, threads: int) -> tuple[int, ...] | None:
    """For each element of the A fragment (``MmaOperandALayout((m, k), warps)``, in its register order), the
    register of a tile in ``layout`` that holds it on every thread; None when ``layout`` does not rename into it
    (an element on another thread, or at register indices that differ between threads)."""
    if m % (16 * warps) or k % 16:
        return None
    return thread_local_permutation(layout, MmaOperandALayout((m, k), warps), threads)


def fragment_word(am, kk, r, k_steps: int):
    """The packed register (``tj_pa``) holding A fragment register ``a_r`` of m16 atom ``am`` at k step ``kk``:
    elements ``2 w, 2 w + 1`` of ``MmaOperandALayout`` are word ``w`` (ints, or CExprs for the emitted text)."""
    return (am * k_steps + kk) * 4 + r


class MmaSyncRegisterA(MmaSync):
    """``mma.sync.m16n8k16`` with A's fragments packed from the registers of a 16-bit tile."""

    register_a = True  # the layout pass may hand this lowering a register operand A

    def __init__(self, register_a_of: str, f16_acc: bool = False) -> None:
        super().__init__(2, 32, f16_acc=f16_acc)
        self.register_a_of = register_a_of  # the shared-A lowering a pin may name for this one

    def fits_rows(self, op: Op, target: Target) -> bool:
        """Whether this lowering fits ``op`` once its accumulator and its operand A give each warp whole rows:
        its conditions that do not depend on layouts (operand A may still be the staged shared tile)."""
        m, n, k = _mnk(op)
        w = target.num_warps
        acc = _acc_f16 if self.f16_acc else _acc_f32
        dtypes = (D.float16,) if self.f16_acc else (D.float16, D.bfloat16)
        return (not op.attrs.transpose_a and _operand_dtypes(*dtypes)(op, target) and acc(op, target)
                and m % (16 * w) == 0 and n % 8 == 0 and k % 16 == 0)

    def _declare_fragments(self, em: Emitter, op: Op, layout: MmaLayout, sa, sb) -> None:
        a = op.operands[0]
        m, _, k = _mnk(op)
        perm = a_fragment_registers(a.type.layout, m, k, layout.warps_m, em.target.threads)
        assert perm is not None and layout.warps_n == 1, "lowering chosen for an A tile it cannot read"
        x, words = em.name(a), len(perm) // 2
        em.line(f"const unsigned tj_b = {sb.base()};")
        em.line(f"unsigned tj_pa[{words}];  // A's fragments from registers: a0..a3 per m16 atom and k16 step, "
                f"two 16-bit elements each")
        if perm == tuple(range(len(perm))):
            em.line("#pragma unroll")
            em.line(f"for (int i = 0; i < {words}; ++i) "
                    f"tj_pa[i] = (unsigned){x}[2 * i].bits | ((unsigned){x}[2 * i + 1].bits << 16);")
        else:  # the tile's registers in another order (a renaming): one line per fragment register
            for w in range(words):
                lo, hi = perm[2 * w], perm[2 * w + 1]
                em.line(f"tj_pa[{w}] = (unsigned){x}[{lo}].bits | ((unsigned){x}[{hi}].bits << 16);")
        em.line(f"unsigned tj_bf[2][{layout.atoms[1]}][{self.b_regs}];")

    def _a_fragment(self, op: Op, fa: str, buf: int, kk: int) -> list[str]:
        steps = _mnk(op)[2] // 16
        return [f"tj_pa[{c_text(fragment_word(CExpr('tj_am'), kk, r, steps))}]" for r in range(4)]


def _a_renames_into_fragment(op: Op, target: Target) -> bool:
    a = op.operands[0]
    layout = getattr(a.type, "layout", None)
    if a.type.scope is not Scope.REGISTER or layout is None or op.attrs.transpose_a:
        return False
    m, _, k = _mnk(op)
    return a_fragment_registers(layout, m, k, target.num_warps, target.threads) is not None


def _acc_rows_per_warp(op: Op, target: Target) -> bool:
    m, n, _ = _mnk(op)
    layout = getattr(op.result.type, "layout", None)
    return isinstance(layout, MmaLayout) and layout == MmaLayout((m, n), target.num_warps, 1)


_A_IN_REGISTERS = ("A is a register tile whose layout renames into the m16n8k16 A fragment (warps along M only, "
                   "M % (16 x num_warps) == 0, K % 16 == 0, not transposed)")
_ROWS = "the accumulator gives each warp whole rows (warps along M only)"

REGISTRY.register("gemm", "mma_sync_rs_m16n8k16", min_sm=80, priority=11, predicates={
    _A_IN_REGISTERS: _a_renames_into_fragment,
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    "K % 16 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(16),
    _ROWS: _acc_rows_per_warp,
})(MmaSyncRegisterA("mma_sync_m16n8k16"))

REGISTRY.register("gemm", "mma_sync_rs_m16n8k16_f16acc", min_sm=80, priority=11, predicates={
    _A_IN_REGISTERS: _a_renames_into_fragment,
    "operands are f16": _operand_dtypes(D.float16),
    "accumulator is f16": _acc_f16,
    "K % 16 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(16),
    _ROWS: _acc_rows_per_warp,
})(MmaSyncRegisterA("mma_sync_m16n8k16_f16acc", f16_acc=True))
