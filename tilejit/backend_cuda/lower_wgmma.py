"""``gemm`` on sm_90a warpgroup MMA: ``wgmma.mma_async`` reading both operands from shared memory.

The operands are the same swizzled shared tiles the mma.sync path uses (:class:`~tilejit.ir.layouts.SharedLayout`:
8 rows of 128, 64 or 32 bytes with 16-byte chunks XOR-swizzled are wgmma's 128-, 64- and 32-byte swizzle atoms),
described by 64-bit matrix descriptors (PTX ISA 9.7.15.5.1.2.2: start address >> 4 in bits 0-13, leading byte
offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, layout type in 62-63 with 1 = 128B, 2 = 64B, 3 = 32B
swizzle; HARDWARE.md checked bit 62 on an H100). The tile's row (of a 128-byte panel when wider) is the swizzle
span; the stride byte offset is always 8 rows (``SharedLayout.atom_bytes``: 1024, 512 or 256 bytes), the
distance between 8-row groups of the canonical layouts (PTX 9.7.15.5.1.2.1.3):

* K-major operand (A, or B given N x K): rows along K of 128-byte panels, or a single row of 64 or 32 bytes
  (fp16 BK = 32 or 16, fp8 / int8 BK = 64 or 32, tf32 BK = 16 or 8); LBO is unused (16); a k step (32 bytes of
  K) moves 32 bytes inside the row, the next 128 bytes of K are the next panel.
* N-major B (given K x N, ``imm-trans-b`` = 1): rows along N, 128-byte panels or one 64- or 32-byte row (N = 32
  or 16 for 16-bit types); 8 k-rows per atom; LBO = the distance between panels (unused when N is one row); a
  k16 step moves 16 rows.
* M-major A (given K x M, ``transpose_a``, ``imm-trans-a`` = 1): the same form as N-major B, read as A; a
  64-row slab of A is one 64-column panel of the K x M tile (always 128-byte panels: M >= 64), so the slab
  moves by whole panels.
  Only 16-bit operands have the transpose immediates.

A 64- or 32-byte swizzled tile must start on its pattern's repeat (512 or 256 bytes; base offset 0): tiles of
1024 bytes or more are allocated 1024-byte aligned (``lower_memory.stage_shared``), so those are what the
predicates admit.

Each warpgroup issues one ``m64nNk16`` per 64-row slab it owns and k16 step, commits the group, lets the
enclosing pipelined loop issue its prefetch while the tensor cores work, then waits for the group.

Promotion (float8 operands, precision "precise", the default): wgmma sums float8 products in an accumulator of
about 14 significant bits (DeepSeek-V3's report, section 3.5.2), so its error grows with K when the accumulator
stays in the tensor cores for the whole loop (precision "fast", the code emitted above). A precise gemm runs each
chunk of at most ``PROMOTION_K`` = 128 products of K (4 k32 steps: DeepSeek-V3's interval, whose error matches
cuBLAS's default fp8 mode), one 64-row slab and a band of columns, into fresh temporary registers (scale-d = 0 on
the chunk's first step), then adds them into the float32 accumulator with ordinary FADDs. The band is as wide as
fits beside the accumulator in ``PROMOTION_REGISTERS``: a warpgroup's 64x128 whole (64 + 64 registers, and two
temporaries alternate: chunk c + 1 is issued before chunk c is waited for and added), a 64x256 in two 64x128
halves through one temporary (128 + 64 registers: two would not fit in the 232 a consumer warpgroup gets),
where the other warpgroup's wgmma keep the tensor cores busy during each warpgroup's adds, as in DeepGEMM. The
accumulator is never handed to wgmma, so nothing of a precise gemm is left in flight across iterations: its loop
waits for every chunk before the iteration ends (the ring's slot of the iteration before is released as usual).

A float16 accumulator (``out_dtype=T.float16``, ``wgmma_m64nNk16_f16acc``) holds two f16 per register (the f32
form's elements, packed in pairs): packed before the fence, unpacked after the wait, never kept in flight.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, OpKind
from ..ir.rewrite import defining_op, use_counts
from ..ir.layouts import SharedLayout, WgmmaLayout
from .emitter import Emitter
from .lower_gemm import PTX_TYPES, _acc_f16, _acc_f32, _acc_i32, _mnk, _operand_dtypes, _precision
from ..target import REGISTRY, GemmLowering, Target

#: The descriptor's layout type (bits 62-63) for each swizzle span in bytes (PTX 9.7.15.5.1.2.2).
LAYOUT_TYPES = {128: 1, 64: 2, 32: 3}



def wait_group(em: Emitter, pending: int, name: str, regs: int, integer: bool) -> None:
    """``wgmma.wait_group pending``, with the accumulator registers ``name[0..regs)`` as in/out operands so that
    the compiler reads none of them before the wait."""
    con = "r" if integer else "f"
    for start in range(0, regs, 64):
        operands = ", ".join(f'"+{con}"({name}[{r}])' for r in range(start, min(start + 64, regs)))
        em.line(f'asm volatile("wgmma.wait_group.sync.aligned {pending};" : {operands} :: "memory");')


def encode_descriptor(addr: int, lbo: int, sbo: int, swizzle_bytes: int) -> int:
    """The 64 bits ``tj_wgmma_desc`` computes (PTX 9.7.15.5.1.2.2), for tests and tools."""
    return (((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32)
            | (LAYOUT_TYPES[swizzle_bytes] << 62))


def descriptor_call(addr: str, lay: SharedLayout, lbo: int) -> str:
    """C expression of the descriptor of ``lay``'s tile at shared address ``addr``: its swizzle mode, and 8 rows as
    the stride byte offset (the layout type is left to the helper's default for the 128-byte swizzle)."""
    layout = LAYOUT_TYPES[lay.swizzle_bytes]
    return f"tj_wgmma_desc({addr}, {lbo}, {lay.atom_bytes}" + (f", {layout})" if layout != 1 else ")")


def desc_plus(desc: str, offset: int) -> str:
    """The descriptor ``desc`` moved ``offset`` bytes (a multiple of 16) further in shared memory."""
    assert offset % 16 == 0, offset
    return f"({desc} + {offset >> 4}ull)" if offset else desc


def k_step_offset(lay: SharedLayout, kk: int) -> int:
    """Byte offset of k step ``kk`` (32 bytes of K) in a K-major tile: 128-byte panels along K, or one row of 64
    or 32 bytes (then ``kk`` < 2 or 1, inside the row)."""
    steps = lay.row_pitch // 32
    return (kk // steps) * lay.panel_bytes + (kk % steps) * 32


def b_fields(lay: SharedLayout, kk: int, k_major: bool) -> tuple[int, int]:
    """(byte offset, leading byte offset) of operand B's descriptor for k step ``kk``: K-major, 32 bytes along
    the row (LBO unused: 16); N-major, 16 k-rows further (LBO = the distance between 128-byte panels). The
    stride byte offset is 8 rows (``lay.atom_bytes``) either way; sm_90 and sm_100 descriptors agree on all
    three."""
    return (k_step_offset(lay, kk), 16) if k_major else (kk * 16 * lay.row_pitch, lay.panel_bytes)


#: Products of K summed by the tensor cores before a precise float8 gemm promotes them into float32 (4 k32 steps;
#: DeepSeek-V3's N_C, the interval cuBLAS's default fp8 mode matches).
PROMOTION_K = 128
#: Registers per thread a promoted gemm's accumulator and temporaries may take together (of the 232 a consumer
#: warpgroup gets beside a producer; the rest holds descriptors, addresses and the loop).
PROMOTION_REGISTERS = 192


def promoted(op: Op) -> bool:
    """Whether ``op`` is a float8 gemm whose wgmma partial sums are promoted into float32 (precision "precise")."""
    return op.operands[0].dtype.is_fp8 and op.attrs.precision == "precise"


def promotion_chunks(acc_regs: int, n: int, beside: int = 0) -> tuple[int, int]:
    """(columns, temporaries) of a promoted gemm's chunks: the widest of N, N/2, N/4, ... (multiples of 8) whose
    temporary fits beside an accumulator of ``acc_regs`` registers (and ``beside`` more: an A fragment gathered
    into registers, ``lower_wgmma_mn8``) in ``PROMOTION_REGISTERS``, and two of them (alternating, so that the
    next chunk runs while one is added) when two fit."""
    width = n
    while acc_regs + beside + width // 2 > PROMOTION_REGISTERS and width % 16 == 0:
        width //= 2
    return width, 2 if acc_regs + beside + width <= PROMOTION_REGISTERS else 1


def _scaled_in_place(em: Emitter, op: Op) -> bool:
    """Whether a scaled gemm (``passes/scaled_promotion.py``) may add into its accumulator's own registers: the
    accumulator is read by it alone and owns its registers (a loop-carried argument or a splat, not an alias of
    another value's registers)."""
    if len(op.operands) != 4:
        return False
    acc = op.operands[2]
    maker = defining_op(acc)
    return (maker is None or maker.kind is OpKind.SPLAT) and use_counts(em.fn).get(acc.id) == 1


def _fresh_float8_product(op: Op) -> bool:
    """Whether ``op`` is a float8 gemm of precision "fast" whose accumulator is a splat of 0 (a block-scaled
    loop's fresh product, ``T.gemm(..., scale_a=, scale_b=)``): its first k step writes the registers with
    scale-d = 0 instead of copying zeros into them. (16-bit products with a zero accumulator, such as
    attention's scores, still copy: their generated code is left as it was.)"""
    producer = defining_op(op.operands[2])
    if not (op.operands[0].dtype.is_fp8 and op.attrs.precision == "fast" and producer is not None
            and producer.kind is OpKind.SPLAT):
        return False
    value = defining_op(producer.operands[0])
    return value is not None and value.kind is OpKind.CONSTANT and value.attrs.value == 0


def _b_k_major(op: Op) -> bool:
    return op.attrs.transpose_b


def _tile_shapes_fit(op: Op, target: Target) -> bool:
    m, n, k = _mnk(op)
    if target.num_warps % 4:
        return False
    groups = target.num_warps // 4
    # K in whole instructions: each covers 32 bytes of K
    if m % (64 * groups) or n % 8 or n > 256 or (k * op.operands[0].dtype.itemsize) % 32:
        return False
    slabs = m // (64 * groups)
    return slabs * n // 2 <= 128


def swizzled_rows(row_bytes: int, tile_bytes: int) -> bool:
    """Whether a shared tile of ``row_bytes`` rows (``tile_bytes`` a stage) is in a wgmma swizzle mode from a start
    its allocation guarantees: 128-byte panels (the tile has 8 rows or more, 1024 bytes, allocated 1024-byte
    aligned), or a 64- or 32-byte row when the tile holds 1024 bytes (1024-byte aligned too: a multiple of the 512-
    or 256-byte repeat; ``lower_memory.stage_shared`` aligns smaller tiles to 128 bytes only)."""
    return row_bytes % 128 == 0 or (row_bytes in (32, 64) and tile_bytes >= 1024)


def _rows_fit(op: Op, target: Target) -> bool:
    """Each operand's shared rows: along K when K-major, along M / N when MN-major."""
    m, n, k = _mnk(op)
    size = op.operands[0].dtype.itemsize
    a_row = (m if op.attrs.transpose_a else k) * size
    b_row = (k if _b_k_major(op) else n) * size
    return swizzled_rows(a_row, m * k * size) and swizzled_rows(b_row, n * k * size)


def _a_k_major(op: Op, target: Target) -> bool:
    return not op.attrs.transpose_a


def _a_layout_fits(op: Op, target: Target) -> bool:
    """K-major A, or M-major A (given K x M) of 16-bit operands: M is whole 64-row slabs by the shape rule, and
    each slab is one 64-column panel."""
    return not op.attrs.transpose_a or op.operands[0].dtype in (D.float16, D.bfloat16)


def _b_k_major_pred(op: Op, target: Target) -> bool:
    return _b_k_major(op)


def int8_n_fits(n: int) -> bool:
    """Whether the int8 wgmma takes an instruction N of ``n``: a multiple of 16, or 8 or 24."""
    return n % 16 == 0 or n in (8, 24)


def _int8_n(op: Op, target: Target) -> bool:
    return int8_n_fits(_mnk(op)[1])


class Wgmma(GemmLowering):
    """``wgmma.mma_async`` m64nNk{K} with both operands in shared memory; one instruction covers 32 bytes of K
    (k16 for 16-bit operands, k32 for fp8 and int8, k8 for tf32). Only 16-bit operands may be MN-major (the
    instruction's transpose immediates exist for them alone)."""

    def acc_layout(self, op: Op, target: Target) -> WgmmaLayout:
        m, n, _ = _mnk(op)
        return WgmmaLayout((m, n), target.num_warps // 4)

    def emit(self, em: Emitter, op: Op) -> None:
        a, b, acc = op.operands[:3]
        out = op.result
        # the instruction's operands: A (whatever setup_a makes of it), B's tile (a descriptor), and the
        # accumulator's layout as the instruction writes it (M x N of the instruction)
        a, b, b_k_major = self.instruction_operands(op)
        layout: WgmmaLayout = self.instruction_layout(out.type.layout)
        n, k = layout.shape[1], _mnk(op)[2]
        k_atom = 32 // a.dtype.itemsize
        integer = out.dtype == D.int32
        f16_acc = out.dtype == D.float16  # two f16 per accumulator register (f16x2)
        con = "r" if integer or f16_acc else "f"
        sb = em.shared[b.id]
        em.require_header("wgmma")
        ring = em.async_mma if em.async_mma is not None and em.async_mma.owns(op) else None
        assert not (ring and f16_acc), "f16 accumulators are not kept in flight (passes.software_pipeline.mma_family)"
        if ring is not None or _scaled_in_place(em, op):
            # accumulate into the loop-carried registers in place (a scaled gemm's accumulator read by it alone, too)
            name = em.name(acc)
            em.alias(out, name)
        else:
            name = em.declare_tile(out)
        em.comment(op, f"gemm {'x'.join(map(str, _mnk(op)))} on wgmma.m64n{n}k{k_atom} ({layout.groups} warpgroup(s), "
                       f"{layout.slabs} slab(s) of 64 rows each)" + self.a_note
                   + (", left in flight" if ring and not promoted(op) else ""))
        fresh = ring is None and _fresh_float8_product(op)
        if ring is None and not fresh and name != em.name(acc):
            src = em.name(acc)
            em.reg_loop(layout, lambda i: em.line(f"{name}[{i}] = {src}[{i}];"))
        em.open("")
        a_mn_major = op.attrs.transpose_a
        self.setup_a(em, op, a, layout, a_mn_major)
        em.line(f"const unsigned tj_b = {sb.base()};")
        # One descriptor per operand; each k step adds its offset >> 4 to the start-address field (the field
        # cannot carry: shared addresses stay below 2^18), instead of encoding a descriptor per instruction.
        em.line(f"const uint64_t tj_bdesc = {descriptor_call('tj_b', sb.layout, b_fields(sb.layout, 0, b_k_major)[1])};")
        d_name, d_regs = name, layout.regs
        if f16_acc:  # the accumulator as f16x2 registers, packed before the fence and unpacked after the wait
            d_name, d_regs = "tj_h", layout.regs // 2
            em.line(f"unsigned tj_h[{d_regs}];")
            em.line("#pragma unroll")
            em.line(f"for (int i = 0; i < {d_regs}; ++i) "
                    f"tj_h[i] = (unsigned){name}[2 * i].bits | ((unsigned){name}[2 * i + 1].bits << 16);")
        em.line("tj_wgmma_fence();  // the accumulator registers were written by ordinary instructions")
        if promoted(op):
            self.emit_promoted(em, op, name, ring)
            return
        half = n // 4 if f16_acc else n // 2  # accumulator registers per slab
        for kk in range(k // k_atom):
            b_desc = desc_plus("tj_bdesc", b_fields(sb.layout, kk, b_k_major)[0])
            for s in range(layout.slabs):
                a_ins = self.a_operands(em, op, a, kk, s, layout, a_mn_major, index=kk * layout.slabs + s)
                operands = [f"{d_name}[{s * half + r}]" for r in range(half)]
                self.issue(em, a, b, n, operands, con, a_ins, b_desc, scale_d=int(kk > 0 or not fresh),
                           f16_acc=f16_acc, integer=integer, b_k_major=b_k_major, a_mn_major=a_mn_major)
                self.after_instruction(em, op, kk * layout.slabs + s, k // k_atom * layout.slabs)
        em.line("tj_wgmma_commit();")
        if ring is not None:
            if op is ring.gemms[-1] and ring.settle:
                self.settle(em, ring, name, layout, integer)
            em.close()
            return
        # e.g. the next tiles' cp.async while the tensor cores work; a deferred gemm's issue leaves its group pending
        pending = em.run_overlap_hook() or 0
        wait_group(em, pending, d_name, d_regs, integer or f16_acc)
        if f16_acc:
            em.line("#pragma unroll")
            em.open(f"for (int i = 0; i < {d_regs}; ++i)")
            em.line(f"{name}[2 * i].bits = (unsigned short)(tj_h[i] & 0xffffu);")
            em.line(f"{name}[2 * i + 1].bits = (unsigned short)(tj_h[i] >> 16);")
            em.close()
        em.close()

    @staticmethod
    def issue(em: Emitter, a, b, n: int, d_regs: list[str], con: str, a_ins: list[tuple[str, str]], b_desc: str,
              scale_d: int, *, f16_acc: bool = False, integer: bool = False, b_k_major: bool = True,
              a_mn_major: bool = False) -> None:
        """One ``wgmma.mma_async`` m64{n}k of the instruction's operands ``a`` and ``b``: D in the registers
        ``d_regs``, A as ``a_ins``, B at ``b_desc``; ``scale_d`` 0 makes D = A B (D's registers are outputs only),
        1 makes D += A B (in/out)."""
        ta, tb = PTX_TYPES[a.dtype], PTX_TYPES[b.dtype]
        half = len(d_regs)
        a_text = "{" + ", ".join(f"%{half + i}" for i in range(len(a_ins))) + "}" if len(a_ins) > 1 else f"%{half}"
        nb, np = half + len(a_ins), half + len(a_ins) + 1  # B descriptor, scale-d predicate source
        regs = ", ".join(f"%{r}" for r in range(half))
        shape = f"m64n{n}k{32 // a.dtype.itemsize}"
        if a.dtype in (D.float16, D.bfloat16):
            trans_b = 0 if b_k_major else 1
            # register A has no transpose immediate
            trans = f"{int(a_mn_major)}, {trans_b}" if len(a_ins) == 1 else f"{trans_b}"
            td = "f16" if f16_acc else "f32"
            instr = f"wgmma.mma_async.sync.aligned.{shape}.{td}.{ta}.{tb} {{{regs}}}, {a_text}, %{nb}, p, 1, 1, {trans};"
        elif integer:
            instr = f"wgmma.mma_async.sync.aligned.{shape}.s32.{ta}.{tb} {{{regs}}}, {a_text}, %{nb}, p;"
        else:  # fp8 and tf32: scale-d and the two input scales, no transpose immediates
            instr = f"wgmma.mma_async.sync.aligned.{shape}.f32.{ta}.{tb} {{{regs}}}, {a_text}, %{nb}, p, 1, 1;"
        ins = ", ".join(f'"{c}"({e})' for c, e in a_ins)
        em.line(f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{np}, 0; {instr} }}"')
        inout = "+" if scale_d else "="  # scale-d 0: D is written only, so its registers' old values are dead
        em.line(f'    : {", ".join(f""""{inout}{con}"({r})""" for r in d_regs)}')
        em.line(f'    : {ins}, "l"({b_desc}), "r"({scale_d}));')

    def emit_promoted(self, em: Emitter, op: Op, main: str, ring) -> None:
        """The k steps of a precise float8 gemm, promoted (module docstring, "Promotion"): each chunk (a k group
        of up to ``PROMOTION_K`` products, one 64-row slab, ``chunk_n`` columns) runs into a fresh temporary,
        which FADDs then add into the float32 accumulator ``main`` (FMAs by the scale tile, for a scaled gemm:
        ``passes/scaled_promotion.py``); with two temporaries, chunk ``c + 1`` is issued before chunk ``c`` is
        waited for and added."""
        a, b, _ = self.instruction_operands(op)
        layout: WgmmaLayout = self.instruction_layout(op.result.type.layout)
        n, k = layout.shape[1], _mnk(op)[2]
        k_atom = 32 // a.dtype.itemsize
        sb = em.shared[b.id]
        # a scaled gemm (passes/scaled_promotion.py): each chunk is added by an FMA with the scale tile, whose
        # registers line up with the accumulator's (one layout)
        scale = em.name(op.operands[3]) if len(op.operands) == 4 else None
        width, buffers = promotion_chunks(layout.regs, n, self.promotion_beside)
        per_group = PROMOTION_K // k_atom
        chunks = [(g, s, n0) for g in range(0, k // k_atom, per_group) for s in range(layout.slabs)
                  for n0 in range(0, n, width)]
        buffers = min(buffers, len(chunks))
        temps = [f"tj_p{j}" for j in range(buffers)]
        em.line(f"// promoted every {min(PROMOTION_K, k)} products of K: {len(chunks)} chunk(s) of 64x{width} into "
                f"{buffers} temporar{'ies' if buffers > 1 else 'y'}, added to the float32 accumulator")
        for t in temps:
            em.line(f"float {t}[{width // 2}];")
        half = n // 2
        issued = 0  # instructions issued so far

        def steps(g: int) -> range:
            return range(g, min(g + per_group, k // k_atom))

        def add(c: int) -> None:
            _, s, n0 = chunks[c]
            t = temps[c % buffers]
            # the groups committed after chunk c's (chunk c + 1's) may stay pending
            after = self.chunk_groups(len(steps(chunks[c + 1][0]))) if buffers > 1 and c + 1 < len(chunks) else 0
            wait_group(em, after, t, width // 2, False)
            at = f"{s * half + n0 // 2} + i"
            em.line("#pragma unroll")
            em.line(f"for (int i = 0; i < {width // 2}; ++i) " + (
                f"{main}[{at}] = fmaf({t}[i], {scale}[{at}], {main}[{at}]);" if scale else f"{main}[{at}] += {t}[i];"))

        for c, (g, s, n0) in enumerate(chunks):
            if c:
                em.line("tj_wgmma_fence();  // the temporary was read by the additions")
            t = temps[c % buffers]
            for i, kk in enumerate(steps(g)):
                offset, _ = b_fields(sb.layout, kk, True)
                b_desc = desc_plus("tj_bdesc", offset + n0 * sb.layout.row_pitch)
                self.issue(em, a, b, width, [f"{t}[{r}]" for r in range(width // 2)], "f",
                           self.a_operands(em, op, a, kk, s, layout, index=issued), b_desc, scale_d=int(kk > g))
                self.after_instruction(em, op, i, len(steps(g)))
                issued += 1
            em.line("tj_wgmma_commit();")
            if c == 0 and ring is None:
                em.run_overlap_hook()  # e.g. the next tiles' cp.async while the tensor cores work
            if buffers == 1:
                add(c)
            elif c:
                add(c - 1)
        if buffers > 1:
            add(len(chunks) - 1)
        if ring is not None and op is ring.gemms[-1] and ring.settle:
            ring.release()  # every group of this iteration and the ones before are complete
        em.close()

    def after_instruction(self, em: Emitter, op: Op, index: int, count: int) -> None:
        """After instruction ``index`` of the gemm's (or a promoted chunk's) ``count``: one commit group for them
        all, after the last, here."""

    def chunk_groups(self, instructions: int) -> int:
        """Commit groups of a promoted chunk of ``instructions`` instructions (``after_instruction``): one here."""
        return 1

    def settle(self, em: Emitter, ring, name: str, layout: WgmmaLayout, integer: bool) -> None:
        """The last gemm of a loop left in flight: wait until only this iteration's groups are pending (one per
        gemm), then hand iteration -1's slot back (``ring.release``)."""
        # this iteration's groups may stay pending; the previous iteration's are complete
        wait_group(em, len(ring.gemms), name, layout.regs, integer)
        ring.release()

    # -- operand A: a shared-memory descriptor here; registers in lower_wgmma_rs ---------------------------
    a_note = ""
    #: Registers a promoted gemm's operand A holds beside its accumulator and temporaries (``promotion_chunks``).
    promotion_beside = 0

    def instruction_operands(self, op: Op):
        """(operand A, operand B's shared tile, whether B is K-major) as the instruction reads them."""
        return op.operands[0], op.operands[1], _b_k_major(op)

    def instruction_layout(self, acc_layout) -> WgmmaLayout:
        """The accumulator as the instruction writes it, from the gemm's result layout (the same here)."""
        return acc_layout

    def setup_a(self, em: Emitter, op: Op, a, layout: WgmmaLayout, mn_major: bool) -> None:
        """The descriptor of this warpgroup's first slab of A (``tj_adesc``); slabs and k steps add to it."""
        sa = em.shared[a.id]
        # warp-uniform by construction; through a shuffle ptxas can prove it and keep the descriptors in uniform
        # registers (no per-instruction R2UR moves)
        em.line("const int tj_wg = __shfl_sync(0xffffffffu, tid >> 7, 0);")
        em.line(f"const unsigned tj_a = {sa.base()};")
        lbo = b_fields(sa.layout, 0, k_major=False)[1] if mn_major else 16
        em.line(f"const uint64_t tj_adesc = "
                f"{descriptor_call(f'tj_a + tj_wg * {self._slab_bytes(sa.layout, mn_major)}', sa.layout, lbo)};")

    @staticmethod
    def _slab_bytes(lay: SharedLayout, mn_major: bool) -> int:
        """Bytes from one 64-row slab of A to the next: a 64-column panel (M-major), or 64 rows (K-major)."""
        return lay.panel_bytes if mn_major else 64 * lay.row_pitch

    def a_operands(self, em: Emitter, op: Op, a, kk: int, s: int, layout: WgmmaLayout,
                   mn_major: bool = False, index: int = 0) -> list[tuple[str, str]]:
        """(constraint, C expression) of operand A for k step ``kk`` of slab ``s`` (``mn_major``: A's tile is
        K x M, each 64-row slab one 64-column panel); ``index`` counts the gemm's instructions issued before."""
        sa = em.shared[a.id]
        off = b_fields(sa.layout, kk, k_major=False)[0] if mn_major else k_step_offset(sa.layout, kk)
        return [("l", desc_plus("tj_adesc", off + s * layout.groups * self._slab_bytes(sa.layout, mn_major)))]


_SHAPES = ("num_warps % 4 == 0, M splits into 64-row slabs per warpgroup, N <= 256, K in whole 32-byte steps, "
           "accumulator <= 128 registers")
_ROWS = ("each operand's shared rows (along K when K-major, M or N when MN-major) are 128-byte panels, or one 64- or "
         "32-byte row in a tile of >= 1024 bytes: a wgmma swizzle mode")

REGISTRY.register("gemm", "wgmma_m64nNk16", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are f16 or bf16": _operand_dtypes(D.float16, D.bfloat16),
    "accumulator is f32": _acc_f32,
    _SHAPES: _tile_shapes_fit,
    "A is K-major or M-major (16-bit)": _a_layout_fits,
    _ROWS: _rows_fit,
})(Wgmma())

REGISTRY.register("gemm", "wgmma_m64nNk16_f16acc", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are f16": _operand_dtypes(D.float16),
    "accumulator is f16": _acc_f16,
    _SHAPES: _tile_shapes_fit,
    "A is K-major or M-major (16-bit)": _a_layout_fits,
    _ROWS: _rows_fit,
})(Wgmma())

REGISTRY.register("gemm", "wgmma_m64nNk32_fp8", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are float8 (e4m3fn, e5m2)": _operand_dtypes(D.float8_e4m3fn, D.float8_e5m2),
    "accumulator is f32": _acc_f32,
    _SHAPES: _tile_shapes_fit,
    "A is K-major (not transposed)": _a_k_major,
    "B is K-major (given N x K, transpose_b)": _b_k_major_pred,
    _ROWS: _rows_fit,
})(Wgmma())

REGISTRY.register("gemm", "wgmma_m64nNk32_int8", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are int8": _operand_dtypes(D.int8),
    "accumulator is i32": _acc_i32,
    _SHAPES: _tile_shapes_fit,
    "N % 16 == 0 or N in (8, 24)": _int8_n,
    "A is K-major (not transposed)": _a_k_major,
    "B is K-major (given N x K, transpose_b)": _b_k_major_pred,
    _ROWS: _rows_fit,
})(Wgmma())

REGISTRY.register("gemm", "wgmma_m64nNk8_tf32", min_sm=90, max_sm=90, priority=20, predicates={
    "operands are f32": _operand_dtypes(D.float32),
    "precision is tf32": _precision("tf32"),
    _SHAPES: _tile_shapes_fit,
    "A is K-major (not transposed)": _a_k_major,
    "B is K-major (given N x K, transpose_b)": _b_k_major_pred,
    _ROWS: _rows_fit,
})(Wgmma())
