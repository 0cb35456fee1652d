"""``gemm`` on sm_90a warpgroup MMA: ``wgmma.mma_async`` reading both operands from shared memory.

The operands are the same swizzled shared tiles the mma.sync path uses (a 128-byte panel of 8 rows with
chunk ^ (row % 8) is wgmma's 128-byte-swizzle atom), described by 64-bit matrix descriptors (PTX ISA
9.7.15.5.1.2.2: start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29, stride byte offset
>> 4 in 32-45, swizzle mode in 62-63 with 1 = 128B; HARDWARE.md checked bit 62 on an H100):

* K-major operand (A, or B given N x K): 128-byte rows along K, so SBO = 1024 (8 rows) and LBO is unused;
  a k16 step moves 32 bytes inside the panel, the next 64 k-elements are the next panel.
* N-major B (given K x N, ``imm-trans-b`` = 1): 128-byte rows along N, 8 k-rows per atom (SBO = 1024),
  LBO = the distance between 64-column panels; a k16 step moves 16 rows (2048 bytes).

Each warpgroup issues one ``m64nNk16`` per 64-row slab it owns and k16 step, commits the group, lets the
enclosing pipelined loop issue its prefetch while the tensor cores work, then waits for the group.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op
from ..ir.layouts import SharedLayout, WgmmaLayout
from .emitter import Emitter
from .lower_gemm import _acc_f32, _mnk, _operand_dtypes
from ..target import REGISTRY, Target

SUPPORT = r"""
/// wgmma shared-memory matrix descriptor, 128-byte swizzle (PTX 9.7.15.5.1.2.2).
TJ_DEVICE uint64_t tj_wgmma_desc(unsigned smem_addr, unsigned lbo, unsigned sbo) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16)
       | ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
TJ_DEVICE void tj_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
TJ_DEVICE void tj_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
"""


def _b_k_major(op: Op) -> bool:
    return op.attrs.transpose_b


def _shapes_fit(op: Op, target: Target) -> bool:
    m, n, k = _mnk(op)
    if target.num_warps % 4:
        return False
    groups = target.num_warps // 4
    if m % (64 * groups) or n % 8 or n > 256 or k % 64:
        return False
    slabs = m // (64 * groups)
    return slabs * n // 2 <= 128


def _a_k_major(op: Op, target: Target) -> bool:
    return not op.attrs.transpose_a


def _b_layout_fits(op: Op, target: Target) -> bool:
    _, n, _ = _mnk(op)
    return _b_k_major(op) or n % 64 == 0


class WgmmaM64NK16:
    def acc_layout(self, op: Op, target: Target) -> WgmmaLayout:
        m, n, _ = _mnk(op)
        return WgmmaLayout((m, n), target.num_warps // 4)

    def emit(self, em: Emitter, op: Op) -> None:
        a, b, acc = op.operands
        out = op.result
        layout: WgmmaLayout = out.type.layout
        m, n, k = _mnk(op)
        kind = "bf16" if a.dtype == D.bfloat16 else "f16"
        sa, sb = em.shared[a.id], em.shared[b.id]
        em.require_support("wgmma", SUPPORT)
        name = em.declare_tile(out)
        em.comment(op, f"gemm {m}x{n}x{k} on wgmma.m64n{n}k16 ({layout.groups} warpgroup(s), "
                       f"{layout.slabs} slab(s) of 64 rows each)")
        src = em.name(acc)
        em.reg_loop(layout, lambda i: em.line(f"{name}[{i}] = {src}[{i}];"))
        em.open("")
        em.line("const int tj_wg = tid >> 7;")
        em.line(f"const unsigned tj_a = {sa.base()}, tj_b = {sb.base()};")
        em.line("tj_wgmma_fence();  // the accumulator registers were written by ordinary instructions")
        half = n // 2
        for kk in range(k // 16):
            a_off = self._k_major_offset(sa.layout, kk)
            if _b_k_major(op):
                b_desc = f"tj_wgmma_desc(tj_b + {self._k_major_offset(sb.layout, kk)}, 16, 1024)"
            else:
                b_desc = f"tj_wgmma_desc(tj_b + {kk * 16 * sb.layout.row_pitch}, {sb.layout.panel_bytes}, 1024)"
            for s in range(layout.slabs):
                slab = f"({s * layout.groups} + tj_wg)"
                a_desc = f"tj_wgmma_desc(tj_a + {a_off} + {slab} * {64 * sa.layout.row_pitch}, 16, 1024)"
                regs = ", ".join(f"%{r}" for r in range(half))
                operands = ", ".join(f'"+f"({name}[{s * half + r}])' for r in range(half))
                trans_b = 0 if _b_k_major(op) else 1
                em.line(f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{half + 2}, 0; '
                        f'wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} {{{regs}}}, %{half}, %{half + 1}, '
                        f'p, 1, 1, 0, {trans_b}; }}"')
                em.line(f'    : {operands}')
                em.line(f'    : "l"({a_desc}), "l"({b_desc}), "r"(1));')
        em.line("tj_wgmma_commit();")
        hook = em.take_overlap_hook()
        if hook is not None:
            hook()  # e.g. the next tiles' cp.async, while the tensor cores work
        # Wait for the group; the accumulator registers are operands so nothing reads them earlier.
        for start in range(0, layout.regs, 64):
            chunk = range(start, min(start + 64, layout.regs))
            operands = ", ".join(f'"+f"({name}[{r}])' for r in chunk)
            em.line(f'asm volatile("wgmma.wait_group.sync.aligned 0;" : {operands} :: "memory");')
        em.close()

    @staticmethod
    def _k_major_offset(lay: SharedLayout, kk: int) -> int:
        """Byte offset of k16 step ``kk`` in a K-major tile (128-byte panels along K)."""
        per_panel = 128 // (16 * lay.elem_bytes)  # k16 steps per 128-byte panel
        return (kk // per_panel) * lay.panel_bytes + (kk % per_panel) * 16 * lay.elem_bytes


REGISTRY.register("gemm", "wgmma_m64nNk16", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    "num_warps % 4 == 0, M splits into 64-row slabs per warpgroup, N <= 256, K % 64 == 0, "
    "accumulator <= 128 registers": _shapes_fit,
    "A is K-major (not transposed)": _a_k_major,
    "B is K-major, or N-major with N % 64 == 0": _b_layout_fits,
})(WgmmaM64NK16())
