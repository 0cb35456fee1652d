"""Lowerings of ``gemm``, registered in the dispatch registry.

* ``mma_sync_m16n8k16`` (sm_80+): operands in swizzled shared memory are read with ldmatrix (``.trans``
  for the other major-ness) into m16n8k16 fragments; the accumulator is an :class:`MmaLayout` spread over
  the warps; per k16 step each warp loads its A fragments (x4) and B fragments (x4 for two n8 atoms)
  and issues ``atoms_m x atoms_n`` mma.sync instructions.
* ``fma_fallback``: any dtype and shape; each thread computes its accumulator elements with scalar FMAs
  from shared memory. Slow, but it makes every valid program run.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, OpKind
from ..ir.layouts import CExpr, MmaLayout, c_text, pick_warp_grid
from .emitter import Emitter, c_type, convert, emits
from ..target import REGISTRY, Target


def _mnk(op: Op) -> tuple[int, int, int]:
    a, b = op.operands[0].type.shape, op.operands[1].type.shape
    m, k = a[::-1] if op.attrs.transpose_a else a
    n = b[0] if op.attrs.transpose_b else b[1]
    return m, n, k


def _operand_dtypes(*dtypes):
    allowed = set(dtypes)
    return lambda op, t: op.operands[0].dtype in allowed and op.operands[1].dtype in allowed


class MmaSync:
    """ldmatrix + mma.sync.m16n8k{16,8} (PTX 9.7.14.5.8 / 9.7.14.5.7 fragments; 9.7.14.5.15 ldmatrix).

    ``k_atom`` is the instruction's K: 16 (A: 4 registers, B: 2) or 8 (A: 2, B: 1), for tiles whose K is a
    multiple of 8 but not of 16. The accumulator layout is the same m16n8 one either way.
    """

    def __init__(self, k_atom: int) -> None:
        self.k_atom = k_atom
        self.a_regs, self.b_regs = k_atom // 4, k_atom // 8

    def acc_layout(self, op: Op, target: Target) -> MmaLayout:
        m, n, _ = _mnk(op)
        wm, wn = pick_warp_grid(m, n, target.num_warps)
        return MmaLayout((m, n), wm, wn)

    def emit(self, em: Emitter, op: Op) -> None:
        a, b, acc = op.operands
        out = op.result
        layout: MmaLayout = out.type.layout
        m, n, k = _mnk(op)
        tm, tn = layout.atoms
        kind = "bf16" if a.dtype == D.bfloat16 else "f16"
        sa, sb = em.shared[a.id], em.shared[b.id]
        name = em.declare_tile(out)
        em.comment(op, f"gemm {m}x{n}x{k} on mma.sync.m16n8k{self.k_atom} ({layout.warps_m}x{layout.warps_n} warps, "
                       f"{tm}x{tn} atoms per warp)")
        src = em.name(acc)
        em.reg_loop(layout, lambda i: em.line(f"{name}[{i}] = {src}[{i}];"))
        em.open("")
        em.line(f"const int tj_lane = tid & 31, tj_wm = (tid >> 5) / {layout.warps_n}, tj_wn = (tid >> 5) % {layout.warps_n};")
        em.line(f"const unsigned tj_a = {sa.base()}, tj_b = {sb.base()};")
        # Fragments are double-buffered over the k steps, which are unrolled here: step kk+1's
        # ldmatrix is issued before step kk's mma. Work the enclosing loop hands over (the prefetch of
        # a later iteration's tiles) goes right after step 0's fragments, so the mma of step 0 can
        # overlap it (ptxas does not move shared-memory loads across the cp.async, but moves mma).
        em.line(f"unsigned tj_af[2][{tm}][{self.a_regs}], tj_bf[2][{tn}][{self.b_regs}];")
        steps = k // self.k_atom
        self._load_fragments(em, op, layout, sa, sb, 0, 0)
        hook = em.take_overlap_hook()
        if hook is not None:
            hook()
        for kk in range(steps):
            if kk + 1 < steps:
                self._load_fragments(em, op, layout, sa, sb, kk + 1, (kk + 1) % 2)
            em.line("#pragma unroll")
            em.open(f"for (int tj_am = 0; tj_am < {tm}; ++tj_am)")
            em.line("#pragma unroll")
            em.open(f"for (int tj_an = 0; tj_an < {tn}; ++tj_an)")
            em.line(f"float* tj_d = &{name}[(tj_am * {tn} + tj_an) * 4];")
            buf = kk % 2
            frags = [f"tj_af[{buf}][tj_am][{r}]" for r in range(self.a_regs)]
            frags += [f"tj_bf[{buf}][tj_an][{r}]" for r in range(self.b_regs)]
            em.line(f"tj_mma_m16n8k{self.k_atom}_{kind}(tj_d[0], tj_d[1], tj_d[2], tj_d[3], {', '.join(frags)});")
            em.close()
            em.close()
        em.close()

    def _load_fragments(self, em: Emitter, op: Op, layout: MmaLayout, sa, sb, kk: int, buf: int) -> None:
        """ldmatrix of k step ``kk``'s A and B fragments into fragment buffer ``buf``."""
        tm, tn = layout.atoms
        wtm, wtn = layout.warp_tile
        lane, j = CExpr("tj_lane"), CExpr("(tj_lane >> 3)")
        half = (lane >> 3) & 1  # which of two matrices lanes 0-15 address (x2 forms)
        k16 = self.k_atom == 16
        # A fragments: one ldmatrix per m16 atom (x4 for k16, x2 for k8).
        em.line("#pragma unroll")
        em.open(f"for (int tj_am = 0; tj_am < {tm}; ++tj_am)")
        mbase = CExpr(f"(tj_wm * {wtm} + tj_am * 16)")
        regs = ", ".join(f"tj_af[{buf}][tj_am][{r}]" for r in range(self.a_regs))
        width = "x4" if k16 else "x2"
        if not op.attrs.transpose_a:  # stored m x k: rows m, 16-byte chunks along k
            row = mbase + (lane & 15)
            chunk = ((lane >> 4) + kk * 2) if k16 else kk
            em.line(f"tj_ldmatrix_{width}({regs}, tj_a + {c_text(sa.layout.chunk_offset(row, chunk))});")
        else:  # stored k x m: transpose while loading
            if k16:
                row, chunk = (lane & 7) + (j >> 1) * 8 + kk * 16, (mbase + (j & 1) * 8) // 8
            else:
                row, chunk = (lane & 7) + kk * 8, (mbase + half * 8) // 8
            em.line(f"tj_ldmatrix_{width}_trans({regs}, tj_a + {c_text(sa.layout.chunk_offset(row, chunk))});")
        em.close()
        # B fragments: one ldmatrix covers two n8 atoms (x4 for k16, x2 for k8); an odd one out takes half.
        pairs = tn // 2
        if pairs:
            em.line("#pragma unroll")
            em.open(f"for (int tj_p = 0; tj_p < {pairs}; ++tj_p)")
            nbase = CExpr(f"(tj_wn * {wtn} + tj_p * 16)")
            regs = ", ".join(f"tj_bf[{buf}][2 * tj_p + {p}][{r}]" for p in range(2) for r in range(self.b_regs))
            self._load_b(em, op, sb, nbase, lane, kk, regs, pair=True)
            em.close()
        if tn % 2:
            nbase = CExpr(f"(tj_wn * {wtn} + {(tn - 1) * 8})")
            regs = ", ".join(f"tj_bf[{buf}][{tn - 1}][{r}]" for r in range(self.b_regs))
            self._load_b(em, op, sb, nbase, lane, kk, regs, pair=False)

    def _load_b(self, em: Emitter, op: Op, sb, nbase: CExpr, lane: CExpr, kk: int, regs: str, pair: bool) -> None:
        """B fragments of one n8 atom (``pair``: two adjacent ones) at k step ``kk``.

        Matrix order in the ldmatrix result is (atom, k half): k16 pairs load 4 matrices (n-atom, k 0-7 |
        8-15), k16 singles and k8 pairs 2, k8 singles 1.
        """
        k16 = self.k_atom == 16
        count = (2 if k16 else 1) * (2 if pair else 1)
        width = {4: "x4", 2: "x2", 1: "x1"}[count]
        j = CExpr("(tj_lane >> 3)") & (count - 1) if count > 1 else CExpr("0")
        khalf = (j & 1) if k16 else CExpr("0")          # which 8 of the step's 16 k values
        atom = ((j >> 1) if k16 else j) if pair else CExpr("0")  # which of the two n8 atoms
        if not op.attrs.transpose_b:  # stored k x n: rows k, transpose to the col-major B fragment
            row = (lane & 7) + khalf * 8 + kk * self.k_atom
            chunk = (nbase + atom * 8) // 8
            em.line(f"tj_ldmatrix_{width}_trans({regs}, tj_b + {c_text(sb.layout.chunk_offset(row, chunk))});")
        else:  # stored n x k: rows n already hold k-pairs
            row = nbase + (lane & 7) + atom * 8
            chunk = khalf + kk * (self.k_atom // 8)
            em.line(f"tj_ldmatrix_{width}({regs}, tj_b + {c_text(sb.layout.chunk_offset(row, chunk))});")


class FmaFallback:
    """Scalar multiply-adds from shared memory into a blocked accumulator."""

    def acc_layout(self, op: Op, target: Target):
        from ..passes.layouts import default_layout

        return default_layout(op.result.type.shape, target.threads)

    def emit(self, em: Emitter, op: Op) -> None:
        a, b, acc = op.operands
        out = op.result
        layout = out.type.layout
        _, _, k = _mnk(op)
        sa, sb = em.shared[a.id], em.shared[b.id]
        name = em.declare_tile(out)
        em.comment(op, f"gemm on scalar FMAs ({a.dtype} operands; no tensor-core lowering fits)")
        cd = out.dtype
        ta, tb = c_type(a.dtype), c_type(b.dtype)

        def body(i: str) -> None:
            row, col = em.coords(layout, i)
            em.line(f"{c_type(cd)} tj_s = {em.name(acc)}[{i}];")
            em.line("#pragma unroll 4")
            em.open(f"for (int tj_k = 0; tj_k < {k}; ++tj_k)")
            ar, ac = (CExpr("tj_k"), CExpr(row)) if op.attrs.transpose_a else (CExpr(row), CExpr("tj_k"))
            br, bc = (CExpr(col), CExpr("tj_k")) if op.attrs.transpose_b else (CExpr("tj_k"), CExpr(col))
            av = f"*reinterpret_cast<const {ta}*>({sa.pointer()} + {c_text(sa.elem_offset(ar, ac))})"
            bv = f"*reinterpret_cast<const {tb}*>({sb.pointer()} + {c_text(sb.elem_offset(br, bc))})"
            em.line(f"tj_s += {convert(av, a.dtype, cd)} * {convert(bv, b.dtype, cd)};")
            em.close()
            em.line(f"{name}[{i}] = tj_s;")

        em.reg_loop(layout, body)


def _mma_shapes_fit(k_atom: int):
    def fits(op: Op, target: Target) -> bool:
        m, n, k = _mnk(op)
        return k % k_atom == 0 and pick_warp_grid(m, n, target.num_warps) is not None
    return fits


def _acc_f32(op: Op, target: Target) -> bool:
    return op.operands[2].dtype == D.float32


REGISTRY.register("gemm", "mma_sync_m16n8k16", min_sm=80, priority=10, predicates={
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    "K % 16 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(16),
})(MmaSync(16))

REGISTRY.register("gemm", "mma_sync_m16n8k8", min_sm=80, priority=9, predicates={
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    "K % 8 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(8),
})(MmaSync(8))

REGISTRY.register("gemm", "fma_fallback", min_sm=70, priority=0)(FmaFallback())


@emits(OpKind.GEMM)
def _gemm(em: Emitter, op: Op) -> None:
    impl = next(i for i in REGISTRY.candidates("gemm") if i.name == op.attrs.impl)
    impl.payload.emit(em, op)
