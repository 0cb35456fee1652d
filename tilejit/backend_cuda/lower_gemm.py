"""Lowerings of ``gemm``, registered in the dispatch registry.

* ``mma_sync_m16n8k16`` (sm_80+): operands in swizzled shared memory are read with ldmatrix (``.trans``
  for the other major-ness) into m16n8k16 fragments; the accumulator is an :class:`MmaLayout` spread over
  the warps; per k16 step each warp loads its A fragments (x4) and B fragments (x4 for two n8 atoms)
  and issues ``atoms_m x atoms_n`` mma.sync instructions.
* ``mma_sync_m16n8k16_f16acc`` (sm_80+): f16 operands accumulating in f16 (``out_dtype=T.float16``), the
  same fragments with the accumulator packed two elements per register (f16.f16.f16.f16).
* (``lower_mma_rs``: both of the above with operand A packed from registers instead of ldmatrix.)
* ``mma_sync_m16n8k32_fp8`` (sm_89+), ``mma_sync_m16n8k32_int8`` (sm_80+), ``mma_sync_m16n8k8_tf32`` and
  ``..._tf32x3`` (sm_80+): the same instruction family and fragments for 8- and 32-bit operands.
* ``fma_fallback``: any dtype and shape; each thread computes its accumulator elements with scalar FMAs
  from shared memory. Slow, but it makes every valid program run. A float16 accumulator sums 16 K values at a
  time in float32 and rounds to float16 after each (as the interpreter does).
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, OpKind
from ..ir.layouts import CExpr, MmaLayout, c_text, pick_warp_grid
from .emitter import Emitter, c_type, convert, emits
from ..target import REGISTRY, GemmLowering, Target


def _mnk(op: Op) -> tuple[int, int, int]:
    a, b = op.operands[0].type.shape, op.operands[1].type.shape
    m, k = a[::-1] if op.attrs.transpose_a else a
    n = b[0] if op.attrs.transpose_b else b[1]
    return m, n, k


def _operand_dtypes(*dtypes):
    allowed = set(dtypes)
    return lambda op, t: op.operands[0].dtype in allowed and op.operands[1].dtype in allowed


#: PTX operand type of each dtype a tensor-core instruction reads (float32 is read as tf32).
PTX_TYPES = {D.float16: "f16", D.bfloat16: "bf16", D.float8_e4m3fn: "e4m3", D.float8_e5m2: "e5m2",
             D.int8: "s8", D.float32: "tf32"}


class MmaSync(GemmLowering):
    """ldmatrix + mma.sync.m16n8k{K} (PTX 9.7.14.5: the m16n8k8/k16/k32 fragments).

    One instruction covers 32 bytes of K per row: k16 for 16-bit operands, k32 for int8 and fp8, k8 for tf32.
    Counted in bytes, the A and B fragments of all of them are the same (A: registers 0-3 hold rows g and g+8
    at byte columns 4*t..4*t+3 of the first and second 16 bytes; B: registers 0-1 hold column g at those
    bytes; g = lane / 4, t = lane % 4), so one ldmatrix addressing serves every dtype when the operand is
    K-major. ``k_bytes`` = 16 is the half-width m16n8k8 of 16-bit operands, for tiles whose K is a multiple
    of 8 but not of 16. The accumulator layout is the same m16n8 one for every form.

    An MN-major operand (A given K x M, B given K x N) is transposed by ``ldmatrix.trans`` for 16-bit
    elements; ldmatrix has no transpose for 8- or 32-bit elements, so those fragments are gathered with
    ordinary shared loads (one per tf32 value, four bytes packed per 8-bit register): correct everywhere,
    slower than the K-major form. ``tf32x3`` splits every fragment into a tf32 high part and the remainder
    and issues three mma per atom.
    """

    register_a = False  # operand A is read from shared memory (lower_mma_rs reads it from registers)

    def __init__(self, elem_bytes: int, k_bytes: int = 32, tf32x3: bool = False, f16_acc: bool = False) -> None:
        self.elem_bytes, self.k_bytes, self.tf32x3, self.f16_acc = elem_bytes, k_bytes, tf32x3, f16_acc
        self.k_atom = k_bytes // elem_bytes
        self.a_regs, self.b_regs = k_bytes // 8, k_bytes // 16

    def acc_layout(self, op: Op, target: Target) -> MmaLayout:
        m, n, _ = _mnk(op)
        wm, wn = pick_warp_grid(m, n, target.num_warps)
        return MmaLayout((m, n), wm, wn)

    def rows_acc_layout(self, op: Op, target: Target) -> MmaLayout | None:
        """The accumulator with the warps along M only (each warp owns whole rows), or None when M does not
        split so; the layout pass asks for it where the result (after elementwise math) feeds another gemm's
        operand A from registers (``lower_mma_rs``), which needs whole rows per warp."""
        m, n, _ = _mnk(op)
        w = target.num_warps
        return MmaLayout((m, n), w, 1) if m % (16 * w) == 0 and n % 8 == 0 else None

    def _mma_function(self, em: Emitter, op: Op) -> str:
        """The name of the device function issuing one mma of ``op``'s operand types (d += a @ b in place)."""
        a, b, acc = op.operands
        ta, tb = PTX_TYPES[a.dtype], PTX_TYPES[b.dtype]
        if self.f16_acc:
            name = f"tj_mma_m16n8k{self.k_atom}_f16_f16acc"
            em.require_support(name, f"""
/// mma.sync m16n8k{self.k_atom} row.col f16 x f16 + f16, in place (PTX 9.7.14.5.8): the accumulator is two f16x2
/// registers, d0 = (c0, c1) of row g and d1 = (c2, c3) of row g + 8 (the f32 form's elements, packed).
TJ_DEVICE void {name}(unsigned& d0, unsigned& d1,
                      unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {{
  asm volatile("mma.sync.aligned.m16n8k{self.k_atom}.row.col.f16.f16.f16.f16 {{%0, %1}}, {{%2, %3, %4, %5}}, {{%6, %7}}, {{%0, %1}};"
               : "+r"(d0), "+r"(d1) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}""")
            return name
        if a.dtype in (D.float16, D.bfloat16):
            return f"tj_mma_m16n8k{self.k_atom}_{ta}"  # in the prelude
        name = f"tj_mma_m16n8k{self.k_atom}_{ta}_{tb}"
        td = "s32" if acc.dtype == D.int32 else "f32"
        cd, con = ("int", "r") if acc.dtype == D.int32 else ("float", "f")
        em.require_support(name, f"""
/// mma.sync m16n8k{self.k_atom} row.col {ta} x {tb} + {td}, in place (PTX 9.7.14.5).
TJ_DEVICE void {name}({cd}& d0, {cd}& d1, {cd}& d2, {cd}& d3,
                      unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {{
  asm volatile("mma.sync.aligned.m16n8k{self.k_atom}.row.col.{td}.{ta}.{tb}.{td} {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+{con}"(d0), "+{con}"(d1), "+{con}"(d2), "+{con}"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}}""")
        return name

    def emit(self, em: Emitter, op: Op) -> None:
        a, b, acc = op.operands
        out = op.result
        layout: MmaLayout = out.type.layout
        m, n, k = _mnk(op)
        tm, tn = layout.atoms
        mma = self._mma_function(em, op)
        sa, sb = (None if self.register_a else em.shared[a.id]), em.shared[b.id]
        name = em.declare_tile(out)
        split = ", tf32x3: three products per atom" if self.tf32x3 else ", f16 accumulator" if self.f16_acc else ""
        em.comment(op, f"gemm {m}x{n}x{k} on mma.sync.m16n8k{self.k_atom} ({layout.warps_m}x{layout.warps_n} warps, "
                       f"{tm}x{tn} atoms per warp{split})")
        src = em.name(acc)
        em.reg_loop(layout, lambda i: em.line(f"{name}[{i}] = {src}[{i}];"))
        carry, em.fragment_carry = em.fragment_carry, None
        carry = carry if carry is not None and carry.gemm is op else None
        em.open("")
        if self.elem_bytes != 2 and (op.attrs.transpose_a or not op.attrs.transpose_b):  # gathered fragments
            em.line(f"const int tj_lane = tid & 31, tj_wm = (tid >> 5) / {layout.warps_n}, tj_wn = (tid >> 5) % {layout.warps_n};")
        # Fragments are double-buffered over the k steps, which are unrolled here: step kk+1's
        # ldmatrix is issued before step kk's mma. Work the enclosing loop hands over (the prefetch of
        # a later iteration's tiles) goes right after step 0's fragments, so the mma of step 0 can
        # overlap it (ptxas does not move shared-memory loads across the cp.async, but moves mma).
        if carry is None:
            self._declare_fragments(em, op, layout, sa, sb)
        else:  # the fragments live across the loop's iterations; step 0's are loaded (lower_loops.FragmentCarry)
            self._bases(em, sa, sb)
        if self.tf32x3:
            em.line(f"unsigned tj_al[2][{tm}][{self.a_regs}], tj_bl[2][{tn}][{self.b_regs}];")
        steps = k // self.k_atom
        if self.f16_acc:  # the f16 accumulator as the instruction's f16x2 registers, two elements each
            em.line(f"unsigned tj_h[{tm * tn * 2}];")
            em.line("#pragma unroll")
            em.line(f"for (int i = 0; i < {tm * tn * 2}; ++i) "
                    f"tj_h[i] = (unsigned){name}[2 * i].bits | ((unsigned){name}[2 * i + 1].bits << 16);")
        if carry is None:
            self._load_fragments(em, op, layout, sa, sb, 0, 0)
            em.run_overlap_hook()
        acc_type = c_type(out.dtype)
        for kk in range(steps):
            if kk + 1 < steps:
                self._load_fragments(em, op, layout, sa, sb, kk + 1, (kk + 1) % 2)
            if kk == 0 and carry is not None:  # the loop's prefetch, after step 1's fragment loads
                em.run_overlap_hook()
            if kk == steps - 1 and carry is not None:
                carry.next_iteration()
            em.line("#pragma unroll")
            em.open(f"for (int tj_am = 0; tj_am < {tm}; ++tj_am)")
            em.line("#pragma unroll")
            em.open(f"for (int tj_an = 0; tj_an < {tn}; ++tj_an)")
            if self.f16_acc:
                em.line(f"unsigned* tj_d = &tj_h[(tj_am * {tn} + tj_an) * 2];")
            else:
                em.line(f"{acc_type}* tj_d = &{name}[(tj_am * {tn} + tj_an) * 4];")
            buf = kk % 2
            products = [("tj_af", "tj_bf")]
            if self.tf32x3:  # the small cross terms first, then the main product
                products = [("tj_al", "tj_bf"), ("tj_af", "tj_bl"), ("tj_af", "tj_bf")]
            for fa, fb in products:
                frags = self._a_fragment(op, fa, buf, kk)
                frags += [f"{fb}[{buf}][tj_an][{r}]" for r in range(self.b_regs)]
                d = "tj_d[0], tj_d[1]" if self.f16_acc else "tj_d[0], tj_d[1], tj_d[2], tj_d[3]"
                em.line(f"{mma}({d}, {', '.join(frags)});")
            em.close()
            em.close()
        if self.f16_acc:
            em.line("#pragma unroll")
            em.open(f"for (int i = 0; i < {tm * tn * 2}; ++i)")
            em.line(f"{name}[2 * i].bits = (unsigned short)(tj_h[i] & 0xffffu);")
            em.line(f"{name}[2 * i + 1].bits = (unsigned short)(tj_h[i] >> 16);")
            em.close()
        em.close()

    def carries(self, op: Op) -> bool:
        """Whether a pipelined loop may carry this gemm's fragments across iterations (lower_loops.FragmentCarry):
        ldmatrix fragments of 16-bit operands from shared memory, over an even number (>= 2) of k steps, so
        that step 0's buffer is free during the last step."""
        steps = _mnk(op)[2] // self.k_atom
        return self.elem_bytes == 2 and not self.register_a and not self.tf32x3 and steps >= 2 and steps % 2 == 0

    def declare_carried(self, em: Emitter, op: Op) -> None:
        """The double-buffered fragment registers, declared before the loop that carries them."""
        tm, tn = op.result.type.layout.atoms
        em.line(f"unsigned tj_af[2][{tm}][{self.a_regs}], tj_bf[2][{tn}][{self.b_regs}];")

    def load_first(self, em: Emitter, op: Op) -> None:
        """Step 0's fragments into buffer 0, from the slots the operands' shared tiles point at now."""
        sa, sb = em.shared[op.operands[0].id], em.shared[op.operands[1].id]
        em.open("")
        self._bases(em, sa, sb)
        self._load_fragments(em, op, op.result.type.layout, sa, sb, 0, 0)
        em.close()

    def _declare_fragments(self, em: Emitter, op: Op, layout: MmaLayout, sa, sb) -> None:
        """The operands' shared addresses and the double-buffered fragment registers."""
        self._bases(em, sa, sb)
        self.declare_carried(em, op)

    @staticmethod
    def _bases(em: Emitter, sa, sb) -> None:
        """``tj_a`` / ``tj_b``: the operands' shared addresses (the slots read now) the fragment loads count from."""
        em.line(f"const unsigned tj_a = {sa.base()}, tj_b = {sb.base()};")

    def _a_fragment(self, op: Op, fa: str, buf: int, kk: int) -> list[str]:
        """The A registers of k step ``kk`` of m16 atom ``tj_am`` (a loop variable of the issuing code)."""
        return [f"{fa}[{buf}][tj_am][{r}]" for r in range(self.a_regs)]

    def _load_fragments(self, em: Emitter, op: Op, layout: MmaLayout, sa, sb, kk: int, buf: int) -> None:
        """The A and B fragments of k step ``kk`` into fragment buffer ``buf``.

        Each ldmatrix reads at the slot's base plus a lane's share of the offset (set up once per kernel,
        ``_ldmatrix``) plus a constant: no address arithmetic but one add per distinct share in the loop.
        """
        if not self.register_a:
            self._load_a(em, op, layout, sa, kk, buf)
        self._load_b_fragments(em, op, layout, sb, kk, buf)
        if self.tf32x3:
            self._split_tf32(em, buf, *layout.atoms)

    def _load_a(self, em: Emitter, op: Op, layout: MmaLayout, sa, kk: int, buf: int) -> None:
        """A's fragments of k step ``kk``: one ldmatrix per m16 atom, or gathered shared loads."""
        tm, tn = layout.atoms
        wtm, wtn = layout.warp_tile
        k16 = self.k_bytes == 32
        gathered = self.elem_bytes != 2  # ldmatrix.trans moves 16-bit elements only
        # A fragments: one ldmatrix per m16 atom (x4 for a 32-byte k step, x2 for 16 bytes).
        width = "x4" if k16 else "x2"
        if op.attrs.transpose_a and gathered:  # stored k x m: register r holds row g + 8 * (r & 1), k bytes 16 * (r >> 1) + 4 * t ..
            lane = CExpr("tj_lane")
            em.line("#pragma unroll")
            em.open(f"for (int tj_am = 0; tj_am < {tm}; ++tj_am)")
            mbase = CExpr(f"(tj_wm * {wtm} + tj_am * 16)")
            for r in range(self.a_regs):
                m_at = mbase + (lane >> 2) + (r & 1) * 8
                self._gather(em, sa, f"tj_af[{buf}][tj_am][{r}]", kk * self.k_atom + (r >> 1) * (16 // self.elem_bytes),
                             m_at)
            em.close()
        else:
            for am in range(tm):
                def a_offset(lane, wm, wn, am=am):
                    mbase = wm * wtm + am * 16
                    j = lane >> 3
                    if not op.attrs.transpose_a:  # stored m x k: rows m, 16-byte chunks along k
                        return sa.layout.chunk_offset(mbase + (lane & 15), ((lane >> 4) + kk * 2) if k16 else kk)
                    if k16:  # stored k x m: transpose while loading
                        return sa.layout.chunk_offset((lane & 7) + (j >> 1) * 8 + kk * 16, (mbase + (j & 1) * 8) // 8)
                    return sa.layout.chunk_offset((lane & 7) + kk * 8, (mbase + (j & 1) * 8) // 8)

                regs = ", ".join(f"tj_af[{buf}][{am}][{r}]" for r in range(self.a_regs))
                self._ldmatrix(em, layout, "tj_a", width, op.attrs.transpose_a, regs, a_offset)

    def _load_b_fragments(self, em: Emitter, op: Op, layout: MmaLayout, sb, kk: int, buf: int) -> None:
        """B's fragments of k step ``kk``: one ldmatrix covers two n8 atoms (x4 for k16, x2 for k8); an odd one
        out takes half."""
        tm, tn = layout.atoms
        wtm, wtn = layout.warp_tile
        gathered = self.elem_bytes != 2
        if gathered and not op.attrs.transpose_b:  # stored k x n: register r holds column g, k bytes 16 * r + 4 * t ..
            lane = CExpr("tj_lane")
            em.line("#pragma unroll")
            em.open(f"for (int tj_an = 0; tj_an < {tn}; ++tj_an)")
            n_at = CExpr(f"(tj_wn * {wtn} + tj_an * 8)") + (lane >> 2)
            for r in range(self.b_regs):
                self._gather(em, sb, f"tj_bf[{buf}][tj_an][{r}]", kk * self.k_atom + r * (16 // self.elem_bytes), n_at)
            em.close()
        else:
            for p in range(tn // 2):
                regs = ", ".join(f"tj_bf[{buf}][{2 * p + q}][{r}]" for q in range(2) for r in range(self.b_regs))
                self._load_b(em, op, layout, sb, wtn, p * 16, kk, regs, pair=True)
            if tn % 2:
                regs = ", ".join(f"tj_bf[{buf}][{tn - 1}][{r}]" for r in range(self.b_regs))
                self._load_b(em, op, layout, sb, wtn, (tn - 1) * 8, kk, regs, pair=False)

    def _ldmatrix(self, em: Emitter, layout: MmaLayout, base: str, width: str, trans: bool, regs: str, offset) -> None:
        """ldmatrix ``width`` (``.trans`` when ``trans``) into ``regs`` from byte ``offset(lane, wm, wn)`` past
        shared address ``base`` (``wm``, ``wn``: the warp's place in the grid; ints or CExprs).

        The offset is split into its value at lane 0 of warp 0, a constant that becomes the instruction's
        immediate, and the rest, a per-thread register set up once (``Emitter.hoist``) and shared by every site
        whose rest is the same for all lanes and warps (the sites of other atoms and k steps, mostly).
        """
        wn = layout.warps_n
        table = [offset(lane, w // wn, w % wn) for w in range(layout.warps_m * wn) for lane in range(32)]
        const = table[0]
        warp = CExpr("(tid >> 5)")
        expr = c_text(offset(CExpr("(tid & 31)"), warp // wn, warp % wn))
        share = em.hoist("unsigned", f"{expr} - {const}" if const else expr, key=("ldmatrix", tuple(t - const for t in table)))
        fn = f"tj_ldmatrix_{width}{'_trans' if trans else ''}_at"
        em.require_support(fn, _ldmatrix_at(width, trans))
        em.line(f"{fn}<{const}>({regs}, {base} + {share});")

    def _gather(self, em: Emitter, st, reg: str, k_first: int, mn: CExpr) -> None:
        """One fragment register of an MN-major operand (stored K x MN) from ordinary shared loads: the
        ``4 / elem_bytes`` consecutive K values from ``k_first + (4 / elem_bytes) * t`` at column ``mn``."""
        per_reg = 4 // self.elem_bytes
        k0 = CExpr("(tj_lane & 3)") * per_reg + k_first
        if per_reg == 1:
            em.line(f"{reg} = *reinterpret_cast<const unsigned*>({st.pointer()} + {c_text(st.elem_offset(k0, mn))});")
            return
        parts = [f"((unsigned)*reinterpret_cast<const unsigned char*>({st.pointer()} + "
                 f"{c_text(st.elem_offset(k0 + e, mn))}) << {8 * e})" for e in range(per_reg)]
        em.line(f"{reg} = {' | '.join(parts)};")

    def _split_tf32(self, em: Emitter, buf: int, tm: int, tn: int) -> None:
        """tf32x3: each fragment register becomes its tf32 part (the low 13 mantissa bits cleared) and the
        remainder x - tf32(x) (exact in float32; the tensor core truncates it to tf32 in turn)."""
        for frag, low, count, regs in (("tj_af", "tj_al", tm, self.a_regs), ("tj_bf", "tj_bl", tn, self.b_regs)):
            em.line("#pragma unroll")
            em.open(f"for (int tj_s = 0; tj_s < {count * regs}; ++tj_s)")
            em.line(f"unsigned& tj_x = (&{frag}[{buf}][0][0])[tj_s];")
            em.line("const unsigned tj_hi = tj_x & 0xffffe000u;")
            em.line(f"(&{low}[{buf}][0][0])[tj_s] = __float_as_uint(__uint_as_float(tj_x) - __uint_as_float(tj_hi));")
            em.line("tj_x = tj_hi;")
            em.close()

    def _load_b(self, em: Emitter, op: Op, layout: MmaLayout, sb, wtn: int, n_first: int, kk: int, regs: str,
                pair: bool) -> None:
        """B fragments of the n8 atom at column ``n_first`` of the warp's tile (``pair``: and the next one) at k
        step ``kk``.

        Matrix order in the ldmatrix result is (atom, k half): k16 pairs load 4 matrices (n-atom, k 0-7 |
        8-15), k16 singles and k8 pairs 2, k8 singles 1.
        """
        k16 = self.k_bytes == 32
        count = (2 if k16 else 1) * (2 if pair else 1)
        width = {4: "x4", 2: "x2", 1: "x1"}[count]

        def b_offset(lane, wm, wn):
            nbase = wn * wtn + n_first
            j = (lane >> 3) & (count - 1) if count > 1 else 0
            khalf = (j & 1) if k16 else 0           # which 8 of the step's 16 k values
            atom = ((j >> 1) if k16 else j) if pair else 0  # which of the two n8 atoms
            if not op.attrs.transpose_b:  # stored k x n: rows k, transpose to the col-major B fragment
                # 16-bit elements only: 8 per chunk
                return sb.layout.chunk_offset((lane & 7) + khalf * 8 + kk * self.k_atom, (nbase + atom * 8) // 8)
            # stored n x k: rows n already hold k-pairs
            return sb.layout.chunk_offset(nbase + (lane & 7) + atom * 8, khalf + kk * (self.k_bytes // 16))

        self._ldmatrix(em, layout, "tj_b", width, not op.attrs.transpose_b, regs, b_offset)


def _ldmatrix_at(width: str, trans: bool) -> str:
    """``tj_ldmatrix_<width>[_trans]_at<OFF>(regs..., base)``: ldmatrix at shared address ``base + OFF``, the
    constant as the instruction's immediate offset (PTX 9.7.14.5.15)."""
    n = {"x1": 1, "x2": 2, "x4": 4}[width]
    regs = ", ".join(f"unsigned& r{i}" for i in range(n))
    outs = ", ".join(f"%{i}" for i in range(n))
    return f"""
/// ldmatrix .{width}{' .trans' if trans else ''} at shared address base + OFF (OFF: the immediate).
template <int OFF> TJ_DEVICE void tj_ldmatrix_{width}{'_trans' if trans else ''}_at({regs}, unsigned base) {{
  asm volatile("ldmatrix.sync.aligned.m8n8.{width}{'.trans' if trans else ''}.shared.b16 {{{outs}}}, [%{n}+%{n + 1}];"
               : {', '.join(f'"=r"(r{i})' for i in range(n))} : "r"(base), "n"(OFF) : "memory");
}}"""


class FmaFallback(GemmLowering):
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
        if cd == D.float16:  # float16 accumulation: float32 sums of 16 K values, rounded to f16 after each
            cd = D.float32

        def body(i: str) -> None:
            row, col = em.coords(layout, i)
            em.line(f"{c_type(cd)} tj_s = {convert(f'{em.name(acc)}[{i}]', out.dtype, cd)};")
            ar, ac = (CExpr("tj_k"), CExpr(row)) if op.attrs.transpose_a else (CExpr(row), CExpr("tj_k"))
            br, bc = (CExpr(col), CExpr("tj_k")) if op.attrs.transpose_b else (CExpr("tj_k"), CExpr(col))
            av = f"*reinterpret_cast<const {ta}*>({sa.pointer()} + {c_text(sa.elem_offset(ar, ac))})"
            bv = f"*reinterpret_cast<const {tb}*>({sb.pointer()} + {c_text(sb.elem_offset(br, bc))})"
            product = f"{convert(av, a.dtype, cd)} * {convert(bv, b.dtype, cd)}"
            if out.dtype == D.float16:
                em.open(f"for (int tj_k0 = 0; tj_k0 < {k}; tj_k0 += 16)")
                em.line("float tj_t = 0.0f;")
                em.line("#pragma unroll 4")
                em.open(f"for (int tj_k = tj_k0; tj_k < tj_k0 + 16 && tj_k < {k}; ++tj_k)")
                em.line(f"tj_t += {product};")
                em.close()
                em.line("tj_s = tj_to_f32(tj_from_f32<tj_half>(tj_s + tj_t));")
                em.close()
                em.line(f"{name}[{i}] = tj_from_f32<tj_half>(tj_s);")
                return
            em.line("#pragma unroll 4")
            em.open(f"for (int tj_k = 0; tj_k < {k}; ++tj_k)")
            em.line(f"tj_s += {product};")
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


def _acc_f16(op: Op, target: Target) -> bool:
    return op.operands[2].dtype == D.float16


def _acc_i32(op: Op, target: Target) -> bool:
    return op.operands[2].dtype == D.int32


def _precision(*choices: str):
    return lambda op, t: op.attrs.precision in choices


_FP8 = (D.float8_e4m3fn, D.float8_e5m2)

REGISTRY.register("gemm", "mma_sync_m16n8k16", min_sm=80, priority=10, predicates={
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    "K % 16 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(16),
})(MmaSync(2, 32))

REGISTRY.register("gemm", "mma_sync_m16n8k16_f16acc", min_sm=80, priority=10, predicates={
    "operands are f16": _operand_dtypes(D.float16),
    "accumulator is f16": _acc_f16,
    "K % 16 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(16),
})(MmaSync(2, 32, f16_acc=True))

REGISTRY.register("gemm", "mma_sync_m16n8k8", min_sm=80, priority=9, predicates={
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    "K % 8 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(8),
})(MmaSync(2, 16))

REGISTRY.register("gemm", "mma_sync_m16n8k32_fp8", min_sm=89, priority=10, predicates={
    "operands are float8 (e4m3fn, e5m2)": _operand_dtypes(*_FP8),
    "accumulator is f32": _acc_f32,
    "K % 32 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(32),
})(MmaSync(1, 32))

REGISTRY.register("gemm", "mma_sync_m16n8k32_int8", min_sm=80, priority=10, predicates={
    "operands are int8": _operand_dtypes(D.int8),
    "accumulator is i32": _acc_i32,
    "K % 32 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(32),
})(MmaSync(1, 32))

REGISTRY.register("gemm", "mma_sync_m16n8k8_tf32", min_sm=80, priority=10, predicates={
    "operands are f32": _operand_dtypes(D.float32),
    "precision is tf32": _precision("tf32"),
    "K % 8 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(8),
})(MmaSync(4, 32))

REGISTRY.register("gemm", "mma_sync_m16n8k8_tf32x3", min_sm=80, priority=10, predicates={
    "operands are f32": _operand_dtypes(D.float32),
    "precision is tf32x3": _precision("tf32x3"),
    "K % 8 == 0 and M x N splits into m16n8 atoms over num_warps": _mma_shapes_fit(8),
})(MmaSync(4, 32, tf32x3=True))

REGISTRY.register("gemm", "fma_fallback", min_sm=70, priority=0)(FmaFallback())


@emits(OpKind.GEMM)
def _gemm(em: Emitter, op: Op) -> None:
    impl = next(i for i in REGISTRY.candidates("gemm") if i.name == op.attrs.impl)
    impl.payload.emit(em, op)
