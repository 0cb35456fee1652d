"""Block-scaled ``gemm`` on sm_100a / sm_103a: ``tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32``,
the microscaled (OCP MX) form of ``T.gemm`` (float8 operands, an e8m0 scale per 32 elements of K for each row of
A and each column of B) on the tensor cores, scales and all.

Compiled and disassembled only: no Blackwell GPU has run this code; the scale layout below follows the PTX ISA's
description of tcgen05 block scaling (9.7.16.10.7) and the layout block-scaled libraries copy scales in with, not
a measurement. It is the standalone form of ``lower_tcgen05.Tcgen05`` (operands in 128-byte-swizzled shared
tiles read through descriptors, the accumulator moved into tensor memory and back around one commit) plus:

* The scales (register tiles, loaded like any tile) are written by the threads that hold them into shared
  memory in the 32 x 16-byte layout ``tcgen05.cp`` reads: for 128 rows r and 4 blocks c of K, byte
  ``(r % 32) * 16 + (r / 32) * 4 + c`` of a 512-byte atom (one atom per 128 rows and 128 elements of K);
  then ``fence.proxy.async`` and a barrier.
* Thread 0 copies each atom into 4 TMEM columns with ``tcgen05.cp.cta_group::1.32x128b.warpx4`` (the 32 lanes
  repeated in each warp's lane quarter: lane l, column j, byte c holds row 32 j + l's scale of K block c), then
  issues one MMA per 32 elements of K (K = 32 per instruction for kind::mxf8f6f4) and 128-row slab, naming the
  scale columns of its rows' atom and, in the instruction descriptor, the byte (K block) each reads.
  A ``tcgen05.cp`` and the ``tcgen05.mma`` after it, issued by one thread, execute in order (an implicitly
  pipelined pair in the PTX ISA's tcgen05 memory-consistency rules), so no wait sits between them.
* Instruction descriptor (PTX ISA 9.7.16.4.2, the table of the block-scaled kinds; CUTLASS's
  ``UMMA::InstrDescriptorBlockScaled`` agrees): B scale-factor ID (byte) in bits 4-5, A/B
  types in 7-9 / 10-12 (E4M3 = 0, E5M2 = 1), transpose A/B in 15/16 (0: K-major), N >> 3 in 17-22, scale
  type in bit 23 (UE8M0 = 1), M >> 4 in 24-28, A scale-factor ID in 29-30, bit 31 0 (K = 32). No D type field:
  D is float32.

Shapes: M a multiple of 128 (slabs of 128 rows), 16 <= N <= 128 with N % 16 == 0 (one atom of B's scales per K
group), K a multiple of 128, both operands K-major (B given N x K, ``transpose_b=True``). Other shapes take the
portable form (``passes.microscaled``). Loops keep no block-scaled accumulator in tensor memory across
iterations (``software_pipeline.in_flight_gemms`` refuses them): each step's MMAs are committed and waited for.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import MX_BLOCK, Op, is_block_scaled
from ..ir.layouts import CExpr, c_text
from ..target import REGISTRY, Target
from .emitter import Emitter
from .lower_gemm import _acc_f32, _mnk, _operand_dtypes
from .lower_tcgen05 import MMA_M, TMEM_COLS, Tcgen05, _a_k_major, _resources_fit, move, scale_columns
from .lower_wgmma import b_fields, k_step_offset

# PTX ISA 9.7.16.4.2: the A/B type codes of kind::mxf8f6f4
_MX_TYPE = {D.float8_e4m3fn: 0, D.float8_e5m2: 1}
SCALE_ATOM_ROWS = 128   # rows of one tcgen05.cp 32x128b.warpx4 scale atom
SCALE_ATOM_K = 4 * MX_BLOCK  # elements of K one atom covers (4 scales per row)
SCALE_ATOM_BYTES = 512
# sm_100 shared-memory descriptor of an atom: no swizzle, 8-row core matrices 128 bytes apart (LBO = SBO = 128),
# version 1 in bits 46-48 (PTX ISA 9.7.16.4.1)
_ATOM_DESC_FIXED = (128 >> 4) << 16 | (128 >> 4) << 32 | 1 << 46


def block_scaled_instr_desc(a_dtype, b_dtype, m: int, n: int, a_scale_id: int = 0, b_scale_id: int = 0,
                            transpose_a: bool = False, transpose_b: bool = False) -> int:
    """The 32-bit instruction descriptor of ``tcgen05.mma ... kind::mxf8f6f4.block_scale`` with e8m0 scales (PTX
    ISA 9.7.16.4.2): ``a_scale_id``/``b_scale_id`` pick the byte of each scale column the instruction reads."""
    if not (0 <= a_scale_id < 4 and 0 <= b_scale_id < 4):
        raise ValueError(f"scale-factor IDs are bytes 0..3 of a TMEM column, got {a_scale_id}, {b_scale_id}")
    return (b_scale_id << 4 | _MX_TYPE[a_dtype] << 7 | _MX_TYPE[b_dtype] << 10 | int(transpose_a) << 15
            | int(transpose_b) << 16 | (n >> 3) << 17 | 1 << 23 | (m >> 4) << 24 | a_scale_id << 29)


def scale_atom_offset(row: int, k_block: int, k_blocks: int) -> int:
    """The byte of the staged scales holding ``row``'s scale of K block ``k_block`` (of ``k_blocks``): atoms of
    128 rows x 4 blocks, K-group-minor, 512 bytes each, in ``tcgen05.cp``'s 32 x 16-byte order. Evaluated on ints
    (tests) and on ``CExpr`` (the emitted staging)."""
    atom = (row // SCALE_ATOM_ROWS) * (k_blocks // 4) + k_block // 4
    return atom * SCALE_ATOM_BYTES + (row % 32) * 16 + (row % SCALE_ATOM_ROWS) // 32 * 4 + k_block % 4


def _stage_scales(em: Emitter, scales, offset: int, k_blocks: int) -> None:
    """Each thread writes the scale bytes it holds to their places in the atoms at ``offset``."""
    layout = em.layout(scales)
    name = em.name(scales)

    def body(i: str) -> None:
        row, block = layout.coords(CExpr("tid"), CExpr(i))
        store = f"tj_smem[{offset} + {c_text(scale_atom_offset(row, block, k_blocks))}] = {name}[{i}].bits;"
        valid = em.valid(layout, i)
        em.line(f"if ({valid}) {store}" if valid else store)
    em.reg_loop(layout, body)


class Tcgen05BlockScaled(Tcgen05):
    """``tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32``: M = 128 per slab, N = the tile's columns,
    K = 32 (one scale per row and column) per instruction, the scales in tensor memory."""

    block_scaled = True

    def emit(self, em: Emitter, op: Op) -> None:
        a, b, acc, sa, sb = op.operands
        out = op.result
        m, n, k = _mnk(op)
        k_blocks = k // MX_BLOCK
        groups = k // SCALE_ATOM_K
        shared_a, shared_b = em.shared[a.id], em.shared[b.id]
        col0 = em.tmem_offsets[id(op)]
        acc_cols = (m // MMA_M) * n
        a_atoms = (m // SCALE_ATOM_ROWS) * groups
        sfa_col, sfb_col = col0 + acc_cols, col0 + acc_cols + 4 * a_atoms
        name = em.declare_tile(out)
        em.comment(op, f"gemm {m}x{n}x{k} on tcgen05.mma.kind::mxf8f6f4.block_scale.block32 ({m // MMA_M} slab(s) "
                       f"of 128 rows, TMEM columns {col0}..{col0 + acc_cols - 1}, e8m0 scales in columns "
                       f"{sfa_col}..{sfb_col + 4 * groups - 1})")
        em.open("")
        move(em, op, em.name(acc), load=False)
        sfa_smem = em.allocate_shared(a_atoms * SCALE_ATOM_BYTES, 128)
        sfb_smem = em.allocate_shared(groups * SCALE_ATOM_BYTES, 128)
        _stage_scales(em, sa, sfa_smem, k_blocks)
        _stage_scales(em, sb, sfb_smem, k_blocks)
        em.line("tj_fence_proxy_async();  // the scales written here are read by tcgen05.cp (the async proxy)")
        em.line("tj_tc_sync();  // accumulator and scales in place, operand tiles ready")
        em.open("if (tid == 0)")
        # A's atoms then B's, in consecutive groups of 4 columns from sfa_col
        atoms = [sfa_smem + j * SCALE_ATOM_BYTES for j in range(a_atoms)] + \
                [sfb_smem + j * SCALE_ATOM_BYTES for j in range(groups)]
        for atom, smem in enumerate(atoms):
            em.line(f'asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" :: "r"(tj_tmem + '
                    f'{sfa_col + 4 * atom}), "l"((unsigned long long)(((tj_smem_u32 + {smem}) & 0x3FFFF) >> 4) | '
                    f'{_ATOM_DESC_FIXED:#x}ull) : "memory");')
        em.line(f"const unsigned tj_a = {shared_a.base()}, tj_b = {shared_b.base()};")
        for kk in range(k // MX_BLOCK):
            b_off, b_lbo = b_fields(shared_b.layout, kk, True)
            b_desc = f"tj_umma_desc(tj_b + {b_off}, {b_lbo}, 1024)"
            sfb = sfb_col + 4 * (kk // 4)
            for s in range(m // MMA_M):
                a_desc = (f"tj_umma_desc(tj_a + {k_step_offset(shared_a.layout, kk)} + "
                          f"{s * MMA_M * shared_a.layout.row_pitch}, 16, 1024)")
                sfa = sfa_col + 4 * (s * groups + kk // 4)
                idesc = block_scaled_instr_desc(a.dtype, b.dtype, MMA_M, n, kk % 4, kk % 4)
                em.line(f'asm volatile("{{ .reg .pred p; setp.ne.b32 p, %6, 0; tcgen05.mma.cta_group::1.'
                        f'kind::mxf8f6f4.block_scale.block32 [%0], %1, %2, %3, [%4], [%5], p; }}" :: '
                        f'"r"(tj_tmem + {col0 + s * n}), "l"({a_desc}), "l"({b_desc}), "r"({idesc:#x}u), '
                        f'"r"(tj_tmem + {sfa}), "r"(tj_tmem + {sfb}), "r"(1) : "memory");')
        em.line("tj_tc_commit(tj_tc_bar);")
        em.close()
        em.line("tj_mbar_wait(tj_tc_bar, tj_tc_phase);")
        em.line("tj_tc_phase ^= 1;")
        em.line("tj_tc_fence_after();")
        move(em, op, name, load=True)
        em.line("tj_tc_sync();  // every warp has read the accumulator before the columns are reused")
        em.close()


def _shape(op: Op, target: Target) -> bool:
    m, n, k = _mnk(op)
    return m % MMA_M == 0 and n % 16 == 0 and 16 <= n <= SCALE_ATOM_ROWS and k % SCALE_ATOM_K == 0


def _columns_fit(op: Op, target: Target) -> bool:
    m, n, _ = _mnk(op)
    return (m // MMA_M) * n + scale_columns(op) <= TMEM_COLS


REGISTRY.register("gemm", "tcgen05_mma_mxf8f6f4_block32", min_sm=100, max_sm=103, priority=40, predicates={
    "block-scaled (e8m0 scales per 32 of K)": lambda op, t: is_block_scaled(op),
    "operands are f8e4m3 or f8e5m2": _operand_dtypes(D.float8_e4m3fn, D.float8_e5m2),
    "accumulator is f32": _acc_f32,
    "M a multiple of 128, N % 16 == 0 and 16 <= N <= 128, K a multiple of 128": _shape,
    "num_warps % 4 == 0, accumulator registers and TMEM columns fit": _resources_fit,
    "accumulator and scale columns fit in 512 TMEM columns": _columns_fit,
    "A is K-major (not transposed)": _a_k_major,
    "B is K-major (given N x K, transpose_b)": lambda op, t: op.attrs.transpose_b,
})(Tcgen05BlockScaled())
