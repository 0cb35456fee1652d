"""``gemm`` on sm_100a / sm_103a: ``tcgen05.mma`` with the accumulator in tensor memory (TMEM).

Compiled and disassembled only: no Blackwell GPU has run this code (see README.md). It is built on what the
sm_90a path runs on H100s: the same 128-byte-swizzled shared tiles, TMA ring and descriptors (the sm_100
shared-memory descriptor is the sm_90 one with the version field, bits 46-48, set to 1; swizzle mode 2 in
bits 61-63 is the sm_90 value 1 in bits 62-63), so what is new is the MMA issue and the TMEM traffic.

* TMEM: 128 lanes x 512 columns of 32 bits per CTA. The kernel allocates the columns its accumulators need
  once (warp 0, ``tcgen05.alloc`` + ``relinquish_alloc_permit``) and gives them back at its end; each
  tcgen05 gemm owns a column range (slab ``s`` of 128 rows at columns ``s * N``).
* The MMA: one thread issues ``tcgen05.mma.cta_group::1.kind::{f16,tf32,f8f6f4,i8}`` per 128-row slab (M = 128;
  a 64-row tile: one M = 64 MMA) and 32-byte k step from shared-memory descriptors, with a 32-bit instruction
  descriptor (PTX ISA Table 42: D type in bits 4-5, A/B types in 7-9 / 10-12, transpose A/B in 15/16, N >> 3 in
  17-22, M >> 4 in 24-28), then ``tcgen05.commit`` arrives on an mbarrier when they complete. Shapes: M = 64
  takes N = 8..256 in steps of 8, M = 128 N = 16..256 in steps of 16 (CUTLASS's SM100_MMA_* shape asserts;
  PTX ISA 9.7.16.2.1 lists steps of 8 for both in its newer editions, which is not relied on here).
* Registers <-> TMEM: ``tcgen05.st`` / ``tcgen05.ld`` (layout ``TmemLayout``: warp ``w`` reaches lanes
  ``32 (w % 4) ..``): ``.32x32b`` for M = 128 (data-path Layout D, row r in lane r), ``.16x32bx2`` for M = 64
  (Layout F: 16 rows in the first 16 lanes of each quarter), each followed by its ``wait``, with the thread-sync
  fences around barriers.
* A float16 accumulator (``out_dtype=T.float16``): D type F16 (0) in the instruction descriptor; TMEM keeps one
  16-bit element in the low half of each 32-bit word (PTX ISA 9.7.16.10.4.1, not packed), so the same columns
  and ``32x32b`` accesses serve, through 32-bit words the registers' bits are copied to and from.

A gemm outside a plain MMA main loop moves its accumulator registers -> TMEM, runs its MMAs, waits, and reads
the result back. In a TMA-pipelined main loop (``lower_loops``) the accumulator stays in TMEM for the whole
loop: thread 0 issues each iteration's MMAs and commits them to the ring slot's "empty" mbarrier, which is what
the producer waits on before refilling the slot; the registers are written once, after the loop.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, OpKind, is_block_scaled
from ..passes.software_pipeline import in_flight_gemms
from ..ir.layouts import TmemLayout
from ..target import REGISTRY, GemmLowering, Target
from .emitter import KERNEL_HOOKS, Emitter
from .lower_gemm import _acc_f16, _acc_f32, _acc_i32, _mnk, _operand_dtypes, _precision
from .lower_wgmma import b_fields, k_step_offset


def smem_desc(addr: int, lbo: int, sbo: int) -> int:
    """The sm_100 shared-memory matrix descriptor (PTX ISA 9.7.16.4.1): start address >> 4 in bits 0-13,
    leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, version 1 in 46-48, base offset 0
    in 49-51, LBO mode 0 (bit 52), swizzle mode 2 = 128-byte in bits 61-63. ``tj_umma_desc`` computes the
    same at run time with the constant part below."""
    return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) & 0x3FFF) << 16 | ((sbo >> 4) & 0x3FFF) << 32 | UMMA_DESC_FIXED


UMMA_DESC_FIXED = 1 << 46 | 2 << 61  # version 1, 128-byte swizzle

# PTX ISA Table 42 (instruction descriptor of .kind::f16 / tf32 / f8f6f4 / i8): D and A/B type codes.
_D_TYPE = {D.float16: 0, D.float32: 1, D.int32: 2}
_AB_TYPE = {D.float16: 0, D.bfloat16: 1, D.float32: 2, D.float8_e4m3fn: 0, D.float8_e5m2: 1, D.int8: 1}
_KIND = {D.float16: "f16", D.bfloat16: "f16", D.float32: "tf32", D.float8_e4m3fn: "f8f6f4",
         D.float8_e5m2: "f8f6f4", D.int8: "i8"}
MMA_M = 128  # rows per tcgen05.mma (cta_group::1) of a tile of 128-row slabs
TMEM_COLS = 512


def instr_desc(d_dtype, a_dtype, b_dtype, m: int, n: int, transpose_a: bool = False, transpose_b: bool = False) -> int:
    """The 32-bit instruction descriptor of a dense tcgen05.mma (no negation, no saturation)."""
    return (_D_TYPE[d_dtype] << 4 | _AB_TYPE[a_dtype] << 7 | _AB_TYPE[b_dtype] << 10 | int(transpose_a) << 15
            | int(transpose_b) << 16 | (n >> 3) << 17 | (m >> 4) << 24)


def _gemms(fn) -> list[Op]:
    return [op for op in fn.walk() if op.kind is OpKind.GEMM and (op.attrs.impl or "").startswith("tcgen05")]


def mma_m(op: Op) -> int:
    """The M of ``op``'s tcgen05.mma instructions: 64 for a 64-row tile (its D in data-path Layout F, half the
    lanes), else 128 per 128-row slab (Layout D)."""
    return 64 if _mnk(op)[0] == 64 else MMA_M


def scale_columns(op: Op) -> int:
    """TMEM columns of a block-scaled gemm's e8m0 scales (lower_tcgen05_mx): 4 per atom of 128 rows and 128
    elements of K, for A's rows and B's columns (one atom of N); 0 for any other gemm."""
    if not is_block_scaled(op):
        return 0
    m, _, k = _mnk(op)
    return 4 * (m // MMA_M + 1) * (k // 128)


def _columns(op: Op) -> int:
    m, n, _ = _mnk(op)
    return (m // mma_m(op)) * n + scale_columns(op)


def _kernel_setup(em: Emitter):
    """Allocate the kernel's TMEM (and the mbarrier standalone gemms wait on) before its body."""
    gemms = _gemms(em.fn)
    if not gemms:
        return None
    total = sum(_columns(g) for g in gemms)
    # Each gemm its own columns when they all fit; else all at column 0 (a loop keeps an accumulator in TMEM
    # only when its body holds nothing but loads and its own gemms, so no two live ranges overlap then).
    offsets, at = {}, 0
    for g in gemms:
        offsets[id(g)] = at if total <= TMEM_COLS else 0
        at += _columns(g)
    need = total if total <= TMEM_COLS else max(_columns(g) for g in gemms)
    ncols = 32
    while ncols < need:
        ncols *= 2
    em.tmem_offsets = offsets
    em.require_header("tma")
    em.require_header("tcgen05")
    slot = em.allocate_shared(16, 16)  # the allocated address, then the completion mbarrier
    em.line(f"// tensor memory: {ncols} columns for {len(gemms)} tcgen05 accumulator(s), allocated by warp 0")
    # gemms that keep their accumulator in TMEM through a loop wait on the ring's barriers; the others on one
    # barrier of their own
    resident = {id(g) for loop in em.fn.walk() if loop.kind is OpKind.FOR and loop.attrs.async_mma == "tcgen05"
                for g in in_flight_gemms(loop.regions[0])}
    standalone = any(id(g) not in resident for g in gemms)
    em.line(f"if (tid < 32) tj_tmem_alloc(tj_smem_u32 + {slot}, {ncols});")
    if standalone:
        em.line(f"if (tid == 0) tj_mbar_init(tj_smem_u32 + {slot + 8}, 1);")
        em.line("tj_fence_proxy_async();")
    em.line("tj_tc_sync();")
    em.line(f"const unsigned tj_tmem = *reinterpret_cast<volatile unsigned*>(tj_smem + {slot});")
    if standalone:
        em.line(f"const unsigned tj_tc_bar = tj_smem_u32 + {slot + 8};")
        em.line("unsigned tj_tc_phase = 0;  // parity of tj_tc_bar's next completion")

    def teardown() -> None:
        em.line("tj_tc_sync();  // every warp's TMEM reads are done")
        em.line(f"if (tid < 32) tj_tmem_dealloc(tj_tmem, {ncols});")
    return teardown


KERNEL_HOOKS.append(_kernel_setup)


def _lane_base(layout: TmemLayout, col0: int) -> str:
    """This thread's TMEM address of its first register: its warp's lane quarter, its column block."""
    return (f"tj_tmem + {col0} + ((unsigned)(((tid >> 5) & 3) * 32) << 16) + "
            f"(unsigned)((tid >> 7) * {layout.cols_per_warp})")


# Registers per tcgen05.ld / tcgen05.st: with .x32, ptxas 13.0 spills the first access's 32 registers to local
# memory and back when two of them fill one 64-register array (a 128x64 or 64x128 tile over 4 warps: 124 bytes
# each way); .x16 moves the same registers with no spill and fewer registers on every bench-space tile.
ACCESS_REGS = 16


def _chunks(layout: TmemLayout):
    """(first register, TMEM column offset, count) of each access (``layout.access``): ``ACCESS_REGS`` at a
    time, then the rest in falling powers of 2 (tcgen05.ld/st take ``.num`` = .x1, .x2, .. .x128), so a
    thread's run of 12 registers (M = 64, N = 24 over 4 warps) is an .x8 and an .x4 and no access reaches a
    column past its run."""
    n, per_slab = layout.shape[1], layout.regs // layout.slabs
    for s in range(layout.slabs):
        j = 0
        while j < per_slab:
            count = ACCESS_REGS
            while count > per_slab - j:
                count //= 2
            yield s * per_slab + j, s * n + j, count
            j += count


def move(em: Emitter, op: Op, regs: str, load: bool) -> None:
    """Registers ``regs`` (``op``'s accumulator layout) to (``load=False``) or from its TMEM columns, waiting for
    the accesses to finish."""
    layout: TmemLayout = op.result.type.layout
    f16 = op.result.dtype == D.float16
    con = "r" if op.result.dtype == D.int32 or f16 else "f"
    em.open("")
    em.line(f"const unsigned tj_t = {_lane_base(layout, em.tmem_offsets[id(op)])};")
    shape = f"{layout.access}"
    # .16x32bx2: threads 16-31 move the columns immHalfSplitoff further (TmemLayout, M = 64)
    split = f", {layout.half_split}" if layout.half_split else ""
    for first, col, count in _chunks(layout):
        ops = ", ".join(f"%{r + (0 if load else 1)}" for r in range(count))
        if f16:
            # A 16-bit D element sits in the low half of its 32-bit TMEM word, unpacked (PTX ISA 9.7.16.10.4.1).
            em.open("")
            em.line(f"unsigned tj_w[{count}];")
            if not load:
                em.line(f"for (int i = 0; i < {count}; ++i) tj_w[i] = {regs}[{first} + i].bits;")
            vals = ", ".join(f'"{"=" if load else ""}r"(tj_w[{r}])' for r in range(count))
        else:
            vals = ", ".join(f'"{"=" if load else ""}{con}"({regs}[{first + r}])' for r in range(count))
        if load:
            em.line(f'asm volatile("tcgen05.ld.sync.aligned.{shape}.x{count}.b32 {{{ops}}}, [%{count}]{split};" '
                    f': {vals} : "r"(tj_t + {col}) : "memory");')
        else:
            em.line(f'asm volatile("tcgen05.st.sync.aligned.{shape}.x{count}.b32 [%0]{split}, {{{ops}}};" '
                    f':: "r"(tj_t + {col}), {vals} : "memory");')
        if f16:
            if load:  # the words are read once the load has completed
                em.line("tj_tc_wait_ld();")
                em.line(f"for (int i = 0; i < {count}; ++i) {regs}[{first} + i].bits = (unsigned short)tj_w[i];")
            em.close()
    em.line("tj_tc_wait_ld();" if load else "tj_tc_wait_st();")
    em.close()


class Tcgen05(GemmLowering):
    """``tcgen05.mma.cta_group::1`` M = 128 per slab (or M = 64 for a 64-row tile), N = the tile's columns, 32
    bytes of K per instruction."""

    def acc_layout(self, op: Op, target: Target) -> TmemLayout:
        m, n, _ = _mnk(op)
        return TmemLayout((m, n), target.num_warps, mma_m=mma_m(op))

    def emit(self, em: Emitter, op: Op) -> None:
        a, b, acc = op.operands
        out = op.result
        m, n, k = _mnk(op)
        k_atom = 32 // a.dtype.itemsize
        sa, sb = em.shared[a.id], em.shared[b.id]
        kind = _KIND[a.dtype]
        b_k_major = op.attrs.transpose_b
        rows = mma_m(op)
        idesc = instr_desc(out.dtype, a.dtype, b.dtype, rows, n, transpose_b=not b_k_major)
        col0 = em.tmem_offsets[id(op)]
        ring = em.async_mma if em.async_mma is not None and em.async_mma.owns(op) else None
        if ring is not None:  # the accumulator stays in TMEM for the whole loop
            name = em.name(acc)
            em.alias(out, name)
        else:
            name = em.declare_tile(out)
        em.comment(op, f"gemm {m}x{n}x{k} on tcgen05.mma.kind::{kind} ({m // rows} slab(s) of {rows} rows, TMEM "
                       f"columns {col0}..{col0 + _columns(op) - 1})" + (", accumulator kept in TMEM" if ring else ""))
        em.open("")
        if ring is None:
            move(em, op, em.name(acc), load=False)
            em.line("tj_tc_sync();  // every warp's accumulator is in TMEM, and the operand tiles are ready")
        em.open("if (tid == 0)")
        em.line(f"const unsigned tj_a = {sa.base()}, tj_b = {sb.base()};")
        for kk in range(k // k_atom):
            b_off, b_lbo = b_fields(sb.layout, kk, b_k_major)
            b_desc = f"tj_umma_desc(tj_b + {b_off}, {b_lbo}, 1024)"
            for s in range(m // rows):
                a_desc = (f"tj_umma_desc(tj_a + {k_step_offset(sa.layout, kk)} + "
                          f"{s * rows * sa.layout.row_pitch}, 16, 1024)")
                em.line(f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, %4, 0; tcgen05.mma.cta_group::1.kind::{kind} '
                        f'[%0], %1, %2, %3, p; }}" :: "r"(tj_tmem + {col0 + s * n}), "l"({a_desc}), "l"({b_desc}), '
                        f'"r"({idesc:#x}u), "r"(1) : "memory");')
        if ring is not None:
            last = op is ring.gemms[-1]
            if last:
                em.line(f"tj_tc_commit({ring.empty});  // the slot is free once these MMAs completed")
            em.close()
            if last:
                ring.release()
            em.close()
            return
        em.line("tj_tc_commit(tj_tc_bar);")
        em.close()
        em.run_overlap_hook()  # e.g. the next tiles' copies, while the tensor cores work
        em.line("tj_mbar_wait(tj_tc_bar, tj_tc_phase);")
        em.line("tj_tc_phase ^= 1;")
        em.line("tj_tc_fence_after();")
        move(em, op, name, load=True)
        em.line("tj_tc_sync();  // every warp has read the accumulator before the columns are reused")
        em.close()


def store_accumulators(em: Emitter, gemms: list[Op], names: list[str]) -> None:
    """Before a loop that keeps its accumulators in TMEM: the loop-carried registers into their columns."""
    for gemm, name in zip(gemms, names):
        move(em, gemm, name, load=False)
    em.line("tj_tc_sync();")


def load_accumulators(em: Emitter, gemms: list[Op], names: list[str], last_bar: str, last_phase: str) -> None:
    """After such a loop: wait for the last iteration's commit (``last_bar`` completing phase ``last_phase``; a
    commit covers every MMA thread 0 issued before it), then the accumulators back into the registers. Waiting
    on the ring's own barrier leaves no commit arriving after the loop, when its barriers are invalidated."""
    em.line(f"if (tj_it > 0) tj_mbar_wait({last_bar}, {last_phase});  // the last iteration's MMAs completed")
    em.line("tj_tc_fence_after();")
    for gemm, name in zip(gemms, names):
        move(em, gemm, name, load=True)
    em.line("tj_tc_sync();")


def _mma_shape(op: Op, target: Target) -> bool:
    """The tcgen05.mma cta_group::1 dense shapes (all four kinds): M = 64 with N % 8 == 0, 8 <= N <= 256; M = 128
    (per slab) with N % 16 == 0, 16 <= N <= 256."""
    m, n, _ = _mnk(op)
    if mma_m(op) == 64:
        return n % 8 == 0 and 8 <= n <= 256
    return m % MMA_M == 0 and n % 16 == 0 and 16 <= n <= 256


def _resources_fit(op: Op, target: Target) -> bool:
    m, n, k = _mnk(op)
    rows = mma_m(op)
    if target.num_warps % 4 or (m // rows) * n > TMEM_COLS:
        return False
    if (k * op.operands[0].dtype.itemsize) % 128:  # K spans whole 128-byte panels (128-byte swizzle)
        return False
    groups = target.num_warps // 4
    cols = n // groups if n % groups == 0 else 0
    if rows == 64:  # .16x32bx2: each half-warp takes half of the warp's columns
        return cols % 2 == 0 and cols > 0 and cols // 2 <= 128
    return cols % 8 == 0 and cols > 0 and (m // rows) * cols <= 128  # accumulator registers per thread


def _a_k_major(op: Op, target: Target) -> bool:
    return not op.attrs.transpose_a


def _b_layout(sixteen_bit: bool):
    def check(op: Op, target: Target) -> bool:
        _, n, _ = _mnk(op)
        return op.attrs.transpose_b or (sixteen_bit and n % 64 == 0)
    return check


_MMA_SHAPE = ("a tcgen05.mma cta_group::1 shape: M = 64 with N % 8 == 0 and 8 <= N <= 256, or M a multiple of 128 "
              "with N % 16 == 0 and 16 <= N <= 256")
_RESOURCES = ("num_warps % 4 == 0, (M / 128) x N <= 512 TMEM columns, K spans whole 128-byte panels, N splits "
              "evenly over the warps sharing a lane quarter (into an even count for M = 64), accumulator <= 128 "
              "registers per thread")

for _name, _dtypes, _acc, _extra in (
    ("tcgen05_mma_f16", (D.float16, D.bfloat16), ("accumulator is f32", _acc_f32), {}),
    ("tcgen05_mma_f16_f16acc", (D.float16,), ("accumulator is f16", _acc_f16), {}),
    ("tcgen05_mma_tf32", (D.float32,), ("accumulator is f32", _acc_f32), {"precision is tf32": _precision("tf32")}),
    ("tcgen05_mma_f8f6f4", (D.float8_e4m3fn, D.float8_e5m2), ("accumulator is f32", _acc_f32), {}),
    ("tcgen05_mma_i8", (D.int8,), ("accumulator is i32", _acc_i32), {}),
):
    REGISTRY.register("gemm", _name, min_sm=100, max_sm=103, priority=30, predicates={
        f"operands are {' or '.join(str(d) for d in _dtypes)}": _operand_dtypes(*_dtypes),
        _acc[0]: _acc[1],
        **_extra,
        _MMA_SHAPE: _mma_shape,
        _RESOURCES: _resources_fit,
        "A is K-major (not transposed)": _a_k_major,
        ("B is K-major, or N-major with N % 64 == 0" if _name.startswith("tcgen05_mma_f16") else
         "B is K-major (given N x K, transpose_b)"): _b_layout(_name.startswith("tcgen05_mma_f16")),
    })(Tcgen05())
