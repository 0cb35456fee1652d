"""sm_100a (data-center Blackwell): gemm on tcgen05.mma with the accumulator in tensor memory. No Blackwell GPU is
available, so everything here is below running it: the bit-level encoders against the PTX ISA tables, which
lowering each dtype / shape / arch gets, the structure of the generated code (TMEM allocation, the MMA issue,
the commit to the ring's mbarriers, the TMEM reads), cubins built by NVRTC, and their SASS when cuobjdump is
installed (``pip install -e '.[sass]'``)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import matmul_any
from tilejit import dtypes as D
from tilejit.backend_cuda.headers import header_text
from tilejit.backend_cuda import lower_tcgen05 as tc
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ir import Op, OpKind
from tilejit.ir.layouts import TmemLayout, coords_table

pytestmark = pytest.mark.skipif(not nvrtc_supports("sm_100a"), reason="NVRTC cannot target sm_100a")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _field(value: int, lo: int, hi: int) -> int:
    return (value >> lo) & ((1 << (hi - lo + 1)) - 1)


# -- encoders ----------------------------------------------------------------------------------------

def test_instruction_descriptor_matches_the_checked_anchor():
    # HARDWARE.md: bf16 -> f32, M = 128, N = 256, both K-major = 0x08400490 (PTX ISA Table 42)
    assert tc.instr_desc(D.float32, D.bfloat16, D.bfloat16, 128, 256) == 0x08400490


@pytest.mark.parametrize("d, a, b, codes", [
    (D.float32, D.float16, D.float16, (1, 0, 0)),
    (D.float32, D.float32, D.float32, (1, 2, 2)),        # kind::tf32
    (D.float32, D.float8_e4m3fn, D.float8_e5m2, (1, 0, 1)),  # kind::f8f6f4
    (D.int32, D.int8, D.int8, (2, 1, 1)),                # kind::i8: S32, signed
])
@pytest.mark.parametrize("m, n, tb", [(128, 16, False), (128, 136, True), (64, 256, False)])
def test_instruction_descriptor_fields(d, a, b, codes, m, n, tb):
    desc = tc.instr_desc(d, a, b, m, n, transpose_b=tb)
    assert (_field(desc, 4, 5), _field(desc, 7, 9), _field(desc, 10, 12)) == codes
    assert _field(desc, 15, 15) == 0 and _field(desc, 16, 16) == int(tb)
    assert _field(desc, 17, 22) == n >> 3 and _field(desc, 24, 28) == m >> 4
    # sparsity, saturate, negate, the reserved bits and the shift stay 0
    for lo, hi in ((0, 3), (6, 6), (13, 14), (23, 23), (29, 31)):
        assert _field(desc, lo, hi) == 0


def test_instruction_descriptor_for_every_m_and_n():
    """Table 42 written out independently: bf16 x bf16 -> f32 for M = 64 (N 8..256 by 8) and M = 128 (N 16..256
    by 16), B K-major and N-major."""
    for m, step in ((64, 8), (128, 16)):
        for n in range(step, 257, step):
            for tb in (False, True):
                expected = (1 << 4) + (1 << 7) + (1 << 10) + (int(tb) << 16) + ((n // 8) << 17) + ((m // 16) << 24)
                assert tc.instr_desc(D.float32, D.bfloat16, D.bfloat16, m, n, transpose_b=tb) == expected


def test_shared_memory_descriptor_fields():
    desc = tc.smem_desc(0x12340, 16, 1024)
    assert _field(desc, 0, 13) == 0x12340 >> 4 and _field(desc, 16, 29) == 1 and _field(desc, 32, 45) == 64
    assert _field(desc, 46, 48) == 1 and _field(desc, 49, 52) == 0 and _field(desc, 53, 60) == 0
    assert _field(desc, 61, 63) == 2  # 128-byte swizzle
    # the device function (include/tilejit/tcgen05.cuh) ORs in the same constant part
    assert f"0x{tc.UMMA_DESC_FIXED:x}ull" in header_text("tcgen05")
    # and it is the sm_90 descriptor (swizzle 1 << 62) with the version bit added
    assert tc.UMMA_DESC_FIXED == (1 << 62) | (1 << 46)


@pytest.mark.parametrize("shape, warps", [((128, 256), 8), ((128, 64), 4), ((256, 128), 8)])
def test_tmem_layout_is_the_32x32b_access_for_every_lane_and_register(shape, warps):
    """Independently of TmemLayout.coords: ``tcgen05.ld.32x32b.xN`` by warp w gives lane l of that warp TMEM
    lane 32 (w % 4) + l, columns in register order; TmemLayout's register s * C + j is the column
    (w / 4) * C + j of slab s (TMEM column s * N + (w / 4) * C + j)."""
    layout = TmemLayout(shape, warps)
    m, n = shape
    cols = n // (warps // 4)
    for tid in range(32 * warps):
        w, lane = tid // 32, tid % 32
        for i in range(layout.regs):
            s, j = divmod(i, cols)
            tmem_lane, tmem_col = 32 * (w % 4) + lane, s * n + (w // 4) * cols + j
            assert layout.coords(tid, i) == [s * 128 + tmem_lane, tmem_col - s * n]


@pytest.mark.parametrize("shape, warps", [((128, 256), 8), ((128, 128), 4), ((256, 64), 8), ((256, 128), 16)])
def test_tmem_register_layout_covers_each_element_once(shape, warps):
    layout = TmemLayout(shape, warps)
    table = coords_table(layout, 32 * warps)
    assert len(table) == shape[0] * shape[1] and all(len(v) == 1 for v in table.values())
    # warp w reads TMEM lanes 32 (w % 4) ..: row within a slab = 32 (w % 4) + lane
    for tid in (0, 37, 32 * warps - 1):
        for i in (0, layout.regs - 1):
            row, _ = layout.coords(tid, i)
            assert row % 128 == 32 * ((tid >> 5) % 4) + (tid & 31)


# -- M = 64: data-path Layout F, read with .16x32bx2 ------------------------------------------------------------

def _layout_f_lane(row: int) -> int:
    """PTX ISA 9.7.16.10.5, Layout F (M = 64, cta_group::1; CUTLASS tmem_frg_1sm's M = 64 atom, ((16, 4), N) :
    ((1, 32 lanes), 1 column)): rows 16 q .. 16 q + 15 in lanes 32 q .. 32 q + 15, column c in column c."""
    return 32 * (row // 16) + row % 16


def _access_16x32bx2(lane_id: int, reg: int, base_lane: int, base_col: int, split: int) -> tuple[int, int]:
    """tcgen05.ld/st.16x32bx2.xN (PTX ISA 9.7.16.2.3.1, matrix fragment of .16x32bx2; CUTLASS
    SM100_TMEM_LOAD_16dp32b*): threads 0-15 move lanes base .. base + 15 at the address's columns, threads 16-31
    the same lanes ``split`` (immHalfSplitoff) columns further; register j is the j-th column."""
    return base_lane + lane_id % 16, base_col + (split if lane_id >= 16 else 0) + reg


@pytest.mark.parametrize("n, warps", [(16, 4), (64, 4), (128, 4), (256, 4), (64, 8), (256, 8), (128, 16),
                                      # N % 16 == 8: C / 2 odd or not a multiple of 8
                                      (8, 4), (24, 4), (40, 4), (72, 4), (136, 4), (200, 4), (248, 4), (24, 8),
                                      (8, 16), (72, 16)])
def test_tmem_layout_m64_is_layout_f_read_with_16x32bx2_for_every_lane_and_register(n, warps):
    """TmemLayout(mma_m=64) against the two PTX tables written out here: every register of every thread is the
    .16x32bx2 access of its warp (lane quarter 32 (w % 4), column block (w / 4) * C, split C / 2), and holds the
    element Layout F puts there; the MMA's 64 x N TMEM cells are read exactly once, the tile covered once."""
    layout = TmemLayout((64, n), warps, mma_m=64)
    cols = n // (warps // 4)
    assert layout.access == "16x32bx2" and layout.half_split == cols // 2 and layout.regs == cols // 2
    row_of_lane = {_layout_f_lane(r): r for r in range(64)}
    cells = {}
    for tid in range(32 * warps):
        w, lane = divmod(tid, 32)
        for i in range(layout.regs):
            tmem = _access_16x32bx2(lane, i, 32 * (w % 4), (w // 4) * cols, cols // 2)
            assert tuple(layout.tmem_coords(tid, i)) == tmem
            assert layout.coords(tid, i) == [row_of_lane[tmem[0]], tmem[1]]
            assert layout.tile_coords(*tmem) == layout.coords(tid, i)
            cells[tmem] = cells.get(tmem, 0) + 1
    written = {(_layout_f_lane(r), c) for r in range(64) for c in range(n)}
    assert set(cells) == written and set(cells.values()) == {1}
    table = coords_table(layout, 32 * warps)
    assert len(table) == 64 * n and all(len(v) == 1 for v in table.values())


@pytest.mark.parametrize("shape, warps", [((128, 256), 8), ((256, 64), 4)])
def test_tmem_layout_m128_composes_layout_d_and_32x32b(shape, warps):
    """The same decomposition for M = 128: .32x32b gives lane l of warp w TMEM lane 32 (w % 4) + l, and Layout D
    puts slab s's row r in lane r, column c in column s * N + c."""
    layout = TmemLayout(shape, warps)
    assert layout.access == "32x32b" and layout.half_split == 0
    for tid in range(32 * warps):
        for i in range(layout.regs):
            lane, col = layout.tmem_coords(tid, i)
            assert lane == 32 * ((tid // 32) % 4) + tid % 32
            assert layout.coords(tid, i) == [col // shape[1] * 128 + lane, col % shape[1]]


def test_tmem_layout_rejects_what_no_access_reads():
    # a 128-row M = 64 tile, an odd column count per warp (no even .16x32bx2 split), 6 warps, M = 32
    for shape, warps, m in (((128, 64), 4, 64), ((64, 24), 32, 64), ((64, 6), 8, 64), ((64, 64), 6, 64),
                            ((64, 64), 4, 32)):
        with pytest.raises(ValueError):
            TmemLayout(shape, warps, mma_m=m)


@pytest.mark.parametrize("n, warps, vec", [(128, 4, 8), (24, 4, 4), (40, 4, 4), (8, 4, 4), (24, 8, 2), (72, 16, 1)])
def test_tmem_layout_m64_vector_width_divides_each_half_warp_run(n, warps, vec):
    """The epilogue moves ``vec`` registers per vector access: they must be consecutive columns starting at a
    multiple of ``vec``, in a half-warp's run of C / 2 columns."""
    layout = TmemLayout((64, n), warps, mma_m=64)
    assert layout.vec == vec
    for tid in range(32 * warps):
        for i in range(0, layout.regs, vec):
            row, col = layout.coords(tid, i)
            assert col % vec == 0
            assert [layout.coords(tid, i + j) for j in range(vec)] == [[row, col + j] for j in range(vec)]


@pytest.mark.parametrize("dtypes, acc", [((torch.float16, torch.float16), T.float32),
                                         ((E4M3, E4M3), T.float32), ((torch.int8, torch.int8), T.int32)])
@pytest.mark.parametrize("bn, warps", [(64, 4), (128, 4), (256, 8), (24, 4), (200, 8)])
def test_m64_instruction_descriptor_in_the_generated_code(dtypes, acc, bn, warps):
    """A 64-row tile issues M = 64 MMAs: the descriptor the kernel passes has M >> 4 = 4 in bits 24-28, N >> 3 in
    17-22 (Table 42), one MMA per k step (no 128-row slabs), columns 0..N-1 of TMEM."""
    cuda = _mm(*dtypes, acc, bm=64, bn=bn, warps=warps).cuda
    descs = {int(d, 16) for d in re.findall(r'"r"\((0x[0-9a-f]+)u\), "r"\(1\)', cuda)}
    assert len(descs) == 1, descs
    desc = descs.pop()
    assert _field(desc, 24, 28) == 4 and _field(desc, 17, 22) == bn >> 3
    assert desc == tc.instr_desc(D.int32 if acc == T.int32 else D.float32, D.from_torch(dtypes[0]),
                                 D.from_torch(dtypes[1]), 64, bn)  # B given N x K: K-major, bit 16 clear
    assert cuda.count("tcgen05.mma.cta_group::1") == 128 // 32  # BK = 128 bytes: 4 k steps, one slab
    assert f"(1 slab(s) of 64 rows, TMEM columns 0..{bn - 1})" in cuda


_ACCESS = re.compile(r'tcgen05\.(ld|st)\.sync\.aligned\.16x32bx2\.x(\d+)\.b32 [^"]*?(\d+)(?:, \{[^}]*\})?;" '
                     r'([^\n]*)')


def _accesses(cuda: str):
    """(ld or st, .num, immHalfSplitoff, TMEM column offset, accumulator register of each value) of every
    .16x32bx2 access in the generated code."""
    out = []
    for kind, num, split, rest in _ACCESS.findall(cuda):
        col = int(re.search(r'"r"\(tj_t \+ (\d+)\)', rest).group(1))
        regs = [int(r) for r in re.findall(r'"=?f"\(\w+\[(\d+)\]\)', rest)]
        out.append((kind, int(num), int(split), col, regs))
    return out


@pytest.mark.parametrize("n, warps", [(8, 4), (24, 4), (40, 4), (72, 4), (136, 4), (200, 4), (248, 4), (24, 8),
                                      (8, 16), (128, 4)])
def test_m64_tmem_accesses_of_the_generated_code_for_every_lane_and_register(n, warps):
    """The tcgen05.st before and tcgen05.ld after the main loop, read from the generated CUDA and run through the
    .16x32bx2 semantics written out here (``_access_16x32bx2``, from each warp's base: lane quarter 32 (w % 4),
    column block (w / 4) * C): .num a power of 2 (.x1 .. .x128), every register of every thread moved exactly
    once, to the TMEM cell TmemLayout names and Layout F puts its element in; the 64 x N cells each moved once,
    none at a column >= N. The instruction descriptor is Table 42 written out: D = F32 (1 in bits 4-5), A = B =
    F16 (0), both K-major (bits 15, 16 clear), N >> 3 in bits 17-22, M >> 4 = 4 in bits 24-28."""
    cuda = _mm(torch.float16, torch.float16, T.float32, bm=64, bn=n, warps=warps).cuda
    layout = TmemLayout((64, n), warps, mma_m=64)
    cols = n // (warps // 4)
    assert f"(unsigned)((tid >> 7) * {cols})" in cuda  # each warp's column block
    descs = {int(d, 16) for d in re.findall(r'"r"\((0x[0-9a-f]+)u\), "r"\(1\)', cuda)}
    assert descs == {(1 << 4) | (0 << 7) | (0 << 10) | ((n >> 3) << 17) | ((64 >> 4) << 24)}, [hex(d) for d in descs]
    accesses = _accesses(cuda)
    assert {a[0] for a in accesses} == {"ld", "st"}
    row_of_lane = {_layout_f_lane(r): r for r in range(64)}
    for kind in ("ld", "st"):
        mine = [a for a in accesses if a[0] == kind]
        cells = {}
        for tid in range(32 * warps):
            w, lane = divmod(tid, 32)
            moved = {}
            for _, num, split, col, regs in mine:
                assert num in (1, 2, 4, 8, 16, 32, 64, 128) and len(regs) == num and split == cols // 2
                for j, reg in enumerate(regs):
                    tmem = _access_16x32bx2(lane, j, 32 * (w % 4), (w // 4) * cols + col, split)
                    assert reg not in moved
                    moved[reg] = tmem
                    cells[tmem] = cells.get(tmem, 0) + 1
            assert sorted(moved) == list(range(layout.regs))
            for reg, tmem in moved.items():
                assert tuple(layout.tmem_coords(tid, reg)) == tmem
                assert layout.coords(tid, reg) == [row_of_lane[tmem[0]], tmem[1]]
        assert set(cells) == {(_layout_f_lane(r), c) for r in range(64) for c in range(n)}
        assert set(cells.values()) == {1}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, E4M3])
@pytest.mark.parametrize("bn", [8, 24, 40, 72])
def test_bm64_matmul_with_n_an_odd_multiple_of_8_builds_on_tcgen05(dtype, bn):
    """M = 64 takes N in steps of 8: the DESIGN matmul's loop with B given N x K (K-major; the DESIGN matmul
    itself gives B K x N, see below), BK = 128 bytes, 4 warps, to cubin: tcgen05.mma of N = BN in the PTX, no
    mma.sync, no spills; the SASS has UTCHMMA (UTCQMMA for fp8) and moves the tail of each half-warp's run with
    a narrower LDTM/STTM, and no HMMA."""
    from tilejit.backend_cuda.sass import disassemble

    st = matmul_any.compile(_meta(1000, 512, dtype=dtype), _meta(1024, 512, dtype=dtype),
                            _meta(1000, 1024, dtype=torch.float32), BM=64, BN=bn, BK=128 // dtype.itemsize, TA=False,
                            TB=True, ACC=T.float32, num_warps=4, arch="sm_100a")
    ptx = st.asm["ptx"]
    kind = "f8f6f4" if dtype == E4M3 else "f16"
    assert f"tcgen05.mma.cta_group::1.kind::{kind}" in ptx and "mma.sync" not in ptx
    assert f"TMEM columns 0..{bn - 1})" in st.asm["cuda"]
    assert st.meta["spills"] == 0, st.meta
    sass = disassemble(st.asm["cubin"])
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm is not installed (pip install -e '.[sass]')")
    assert ("UTCQMMA" if dtype == E4M3 else "UTCHMMA") in sass and "UTCBAR" in sass and "UTMALDG" in sass
    assert re.search(r"LDTM\.16dp32bit_t16_t31\.x4\b", sass) and re.search(r"STTM\.16dp32bit_t0_t15\.x4\b", sass)
    assert not re.search(r"\b[HQ]MMA\.", sass)


def test_bm64_bn24_ragged_shapes_build_on_tcgen05():
    """Ragged M, N and K with BN = 24: K = 777 (rows not 16-byte aligned: cp.async, no TMA) and K = 776 (TMA)."""
    for k, copy in ((777, "cp_async"), (776, "tma_bulk_tensor")):
        st = matmul_any.compile(_meta(1000, k), _meta(3000, k), _meta(1000, 3000, dtype=torch.float32), BM=64, BN=24,
                                BK=64, TA=False, TB=True, ACC=T.float32, num_warps=4, arch="sm_100a")
        assert f"copy = {copy}" in st.asm["ir"] and "impl = tcgen05_mma_f16" in st.asm["ir"]
        assert "tcgen05.mma.cta_group::1.kind::f16" in st.asm["ptx"] and "mma.sync" not in st.asm["ptx"]
        assert st.meta["spills"] == 0, st.meta


def test_n_tcgen05_cannot_take_falls_back_to_mma_sync_and_says_why(monkeypatch):
    """M = 128 with N % 16 == 8 and M = 64 with N % 8 != 0 are no tcgen05.mma shape; the DESIGN matmul's B (K x N,
    N-major) needs N % 64 == 0 (the 128-byte-swizzle N-major atom); each keeps mma.sync (or FMA) with the
    registry's reason, and pinning tcgen05 is a DispatchError listing it."""
    from kernels import matmul
    from tilejit.target import REGISTRY, Target

    impl = REGISTRY.get("gemm", "tcgen05_mma_f16")
    for bm, bn, warps in ((128, 24, 4), (128, 40, 8), (64, 20, 4)):
        st = _mm(torch.float16, torch.float16, T.float32, bm=bm, bn=bn, warps=warps, stop_after="passes")
        assert not _impl(st).startswith("tcgen05")
        gemm = next(op for op in st.fn.walk() if op.kind.name == "GEMM")
        assert impl.rejection(gemm, Target.of("sm_100a", num_warps=warps)) == tc._MMA_SHAPE
    assert "M = 64 with N % 8 == 0" in tc._MMA_SHAPE and "M a multiple of 128 with N % 16 == 0" in tc._MMA_SHAPE
    # the DESIGN matmul's N-major B with N = 24 is refused as given, and taken through a transposing copy (K-major)
    st = matmul.compile(_meta(1000, 512), _meta(512, 1024), _meta(1000, 1024), BM=64, BN=24, BK=64, num_warps=4,
                        arch="sm_100a", stop_after="passes")
    assert _impl(st) == "tcgen05_mma_f16"
    gemm = next(op for op in st.fn.walk() if op.kind.name == "GEMM")
    copy = gemm.operands[1].owner
    assert copy.kind.name == "TRANSPOSE_COPY" and gemm.attrs.transpose_b
    given = Op(OpKind.GEMM, [gemm.operands[0], copy.operands[0], gemm.operands[2]], [gemm.result.type],
               replace(gemm.attrs, transpose_b=False))
    assert impl.rejection(given, Target.of("sm_100a", num_warps=4)) == "B is K-major, or N-major with N % 64 == 0"
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "tcgen05_mma_f16")
    with pytest.raises(tilejit.DispatchError) as info:
        _mm(torch.float16, torch.float16, T.float32, bm=128, bn=24, warps=4, stop_after="passes")
    assert re.search(r"tcgen05_mma_f16 +rejected: " + re.escape(tc._MMA_SHAPE), str(info.value)), str(info.value)


def test_design_matmul_bm64_runs_tcgen05_m64_and_its_sass_reads_16_lanes():
    """The DESIGN matmul with BM = 64: tcgen05.mma (M = 64) in the main loop, no mma.sync; the accumulator goes
    in and out of TMEM with .16x32bx2 (immHalfSplitoff = half the warp's columns), which ptxas turns into LDTM /
    STTM over threads 0-15 and 16-31; no spills."""
    from kernels import matmul
    from tilejit.backend_cuda.sass import disassemble

    st = matmul.compile(_meta(1000, 512), _meta(512, 1024), _meta(1000, 1024), BM=64, BN=128, BK=64, num_warps=4,
                        arch="sm_100a")
    assert re.search(r"tj\.gemm .*impl = tcgen05_mma_f16", st.asm["ir"])
    assert "#tmem<warps=4, m=64>" in st.asm["ir"]
    ptx = st.asm["ptx"]
    assert "mma.sync" not in ptx and "tcgen05.mma.cta_group::1.kind::f16" in ptx
    assert "tcgen05.ld.sync.aligned.16x32bx2.x16.b32" in ptx and "tcgen05.st.sync.aligned.16x32bx2.x16.b32" in ptx
    assert ", 64;" in st.asm["cuda"].split("tcgen05.ld.sync.aligned.16x32bx2", 1)[1].split("\n", 1)[0]
    assert st.meta["spills"] == 0, st.meta
    sass = disassemble(st.asm["cubin"])
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm is not installed (pip install -e '.[sass]')")
    assert "UTCHMMA" in sass and "UTCBAR" in sass and "UTMALDG" in sass
    assert re.search(r"LDTM\.16dp32bit_t0_t15", sass) and re.search(r"LDTM\.16dp32bit_t16_t31", sass)
    assert not re.search(r"\bHMMA\.", sass)


# -- dispatch ----------------------------------------------------------------------------------------

def _mm(da, db, acc, tb=True, arch="sm_100a", bm=128, bn=128, bk_bytes=128, warps=8, stop_after="cuda", precision=None):
    out = torch.int32 if acc == T.int32 else torch.float32
    b = _meta(512, 1024, dtype=db) if tb else _meta(1024, 512, dtype=db)
    return matmul_any.compile(_meta(512, 1024, dtype=da), b, _meta(512, 512, dtype=out), BM=bm, BN=bn,
                              BK=bk_bytes // da.itemsize, TA=False, TB=tb, ACC=acc, PRECISION=precision,
                              num_warps=warps, arch=arch, stop_after=stop_after)


def _impl(stages) -> str:
    return re.search(r"impl = \"?(\w+)", stages.final_ir).group(1)


@pytest.mark.parametrize("dtypes, acc, kind, tb", [
    ((torch.float16, torch.float16), T.float32, "f16", True),
    ((torch.bfloat16, torch.bfloat16), T.float32, "f16", False),  # N-major B through the transpose bit
    ((torch.float32, torch.float32), T.float32, "tf32", True),
    ((E4M3, E5M2), T.float32, "f8f6f4", True),
    ((torch.int8, torch.int8), T.int32, "i8", True),
])
def test_each_kind_lowers_to_tcgen05_on_sm_100a(dtypes, acc, kind, tb):
    st = _mm(*dtypes, acc, tb=tb, stop_after="ptx")
    assert _impl(st) == f"tcgen05_mma_{kind}"
    assert f"tcgen05.mma.cta_group::1.kind::{kind}" in st.ptx
    assert "mma.sync" not in st.ptx and "wgmma" not in st.ptx
    for instr in ("tcgen05.alloc", "tcgen05.relinquish_alloc_permit", "tcgen05.commit", "tcgen05.ld.sync.aligned.32x32b",
                  "tcgen05.st.sync.aligned.32x32b", "tcgen05.dealloc", "cp.async.bulk.tensor"):
        assert instr in st.ptx, instr


def test_what_tcgen05_does_not_take_keeps_mma_sync():
    # M = 32 (tcgen05.mma has M = 64 and 128) and sm_120a (consumer Blackwell: no tcgen05, no wgmma)
    assert _impl(_mm(torch.float16, torch.float16, T.float32, bm=32, warps=4, stop_after="passes")).startswith("mma_sync")
    # (fp8 with N-major B reaches tcgen05 through a transposing copy: test_transpose_copy / test_gemm_dtypes)
    assert _impl(_mm(torch.float16, torch.float16, T.float32, arch="sm_120a", stop_after="passes")).startswith("mma_sync")
    assert _impl(_mm(torch.float16, torch.float16, T.float32, arch="sm_103a", stop_after="passes")) == "tcgen05_mma_f16"
    # tf32x3 and ieee products are not tcgen05's
    assert not _impl(_mm(torch.float32, torch.float32, T.float32, precision="tf32x3", stop_after="passes")).startswith("tcgen05")


def test_sm_120a_says_why_tcgen05_does_not_apply():
    """Consumer Blackwell (sm_120a) has neither tcgen05 nor wgmma: the registry's reason is the arch range."""
    from tilejit.target import REGISTRY, Target

    st = _mm(torch.float16, torch.float16, T.float32, arch="sm_120a", stop_after="passes")
    gemm = next(op for op in st.fn.walk() if op.kind.name == "GEMM")
    why = REGISTRY.get("gemm", "tcgen05_mma_f16").rejection(gemm, Target.of("sm_120a", num_warps=8))
    assert why == "arch sm_120a outside sm_100..sm_103"
    assert REGISTRY.get("gemm", "tcgen05_mma_f16").rejection(gemm, Target.of("sm_100a", num_warps=8)) is None


# -- structure ---------------------------------------------------------------------------------------

def _design_cuda(arch="sm_100a", warps=8, bn=256):
    a = _meta(1000, 512)
    return matmul_any.compile(a, _meta(1024, 512), _meta(1000, 1024, dtype=torch.float32), BM=128, BN=bn, BK=64,
                              TA=False, TB=True, ACC=T.float32, num_warps=warps, arch=arch, stop_after="cuda").cuda


def _between(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i:text.index(end, i)]


def test_main_loop_keeps_the_accumulator_in_tmem():
    cuda = _design_cuda()
    body = cuda[cuda.index('extern "C" __global__'):]
    # allocated by warp 0 before anything else, given back at the very end
    assert body.index("tj_tmem_alloc(") < body.index("blockIdx")
    assert body.rstrip().endswith("if (tid < 32) tj_tmem_dealloc(tj_tmem, 256);\n}") or \
        body.rstrip().splitlines()[-2].strip() == "if (tid < 32) tj_tmem_dealloc(tj_tmem, 256);"
    # the loop-carried accumulator goes into TMEM once, before the loop
    pre = _between(body, "one mbarrier per ring slot", "for (int64_t")
    assert "tcgen05.st.sync.aligned.32x32b.x16.b32" in pre and "tj_tc_wait_st();" in pre
    assert "tj_mbar_init(tj_smem_u32 + " in pre and ", 1); }" in pre  # the empty barriers: one arrival (commit)
    loop = _between(body, "for (int64_t", "// the last iteration's MMAs completed")
    assert "__syncthreads" not in loop and "tcgen05.ld" not in loop and "tcgen05.st" not in loop
    assert "if (tid == 0) tj_mbar_wait(" in loop  # only the issuing thread waits for the TMA
    assert loop.count("tcgen05.mma.cta_group::1.kind::f16") == 4  # 4 k16 steps x 1 slab
    commit = loop.index("tj_tc_commit(")
    refill = loop.index("tj_mbar_expect_tx(")
    assert loop.index("tcgen05.mma") < commit < refill
    assert "((tj_it - 1) / 4) & 1);" in loop or "((tj_it - 1) / 3) & 1);" in loop  # refill waits on the commit
    # after the loop: the last slot's commit (no commit may arrive once the ring's barriers are invalidated)
    end = body.index("// the last iteration's MMAs completed")
    post = body[body.rindex("if (tj_it > 0) tj_mbar_wait(", 0, end):body.index("tj_mbar_inval", end)]
    assert re.match(r"if \(tj_it > 0\) tj_mbar_wait\(tj_smem_u32 \+ \d+ \+ 8 \* \(\(tj_it - 1\) % 3\), "
                    r"\(\(tj_it - 1\) / 3\) & 1\);", post), post[:200]
    assert "tj_tc_commit" not in post
    assert post.index("tj_tc_fence_after();") < post.index("tcgen05.ld.sync.aligned.32x32b.x16.b32") < \
        post.index("tj_tc_wait_ld();")


def test_the_accumulator_carried_through_the_main_loop_has_scope_tmem():
    """In the IR the loop-carried accumulator is a TMEM tile inside the body (the gemm's operand and result, in
    their TmemLayout), a register tile where it enters and leaves; sm_90a's wgmma accumulator stays in registers."""
    from kernels import matmul

    args = (_meta(1000, 512), _meta(512, 1024), _meta(1000, 1024))
    for bm, layout in ((128, "#tmem<warps=4>"), (64, "#tmem<warps=4, m=64>")):
        ir = matmul.compile(*args, BM=bm, BN=128, BK=64, num_warps=4, arch="sm_100a", stop_after="passes").final_ir
        tmem, reg = f"tile<{bm}x128xf32, tmem, {layout}>", f"tile<{bm}x128xf32, reg, {layout}>"
        loop = next(line for line in ir.splitlines() if "tj.for" in line)
        assert f"iter_args(%acc_2: {tmem} = %acc) -> ({reg})" in loop and "async_mma = tcgen05" in loop
        gemm = next(line for line in ir.splitlines() if "tj.gemm" in line)
        assert gemm.endswith(f": {tmem}"), gemm
        assert f"tj.splat %4 {{shape = [{bm}, 128]}} : {reg}" in ir
    hopper = matmul.compile(*args, BM=128, BN=128, BK=64, num_warps=4, arch="sm_90a", stop_after="passes").final_ir
    assert "tmem" not in hopper and "async_mma = wgmma" in hopper


def test_a_gemm_outside_a_main_loop_round_trips_through_tmem():
    @tilejit.kernel
    def one_product(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        acc = T.full((BM, BN), 1.0, T.float32)
        acc = T.gemm(A[0:BM, 0:BK], B[0:BN, 0:BK], acc, transpose_b=True)
        C[0:BM, 0:BN] = acc

    cuda = one_product.compile(_meta(128, 64), _meta(128, 64), _meta(128, 128, dtype=torch.float32), BM=128, BN=128,
                               BK=64, num_warps=4, arch="sm_100a", stop_after="cuda").cuda
    gemm = _between(cuda, "on tcgen05.mma.kind::f16", "store into")
    order = ["tcgen05.st.sync", "tj_tc_wait_st();", "tj_tc_sync();", "if (tid == 0)", "tcgen05.mma.cta_group::1",
             "tj_tc_commit(tj_tc_bar);", "tj_mbar_wait(tj_tc_bar, tj_tc_phase);", "tj_tc_phase ^= 1;",
             "tj_tc_fence_after();", "tcgen05.ld.sync", "tj_tc_wait_ld();", "tj_tc_sync();"]
    at = 0
    for needle in order:
        at = gemm.index(needle, at) + len(needle)


@pytest.mark.parametrize("warps, bn, dtype, mma", [(8, 256, torch.float16, "UTCHMMA"), (4, 128, torch.float16, "UTCHMMA"),
                                                  (8, 128, E4M3, "UTCQMMA")])
def test_cubin_builds_and_its_sass_has_the_tcgen05_instructions(warps, bn, dtype, mma):
    st = matmul_any.compile(_meta(1000, 512, dtype=dtype), _meta(1024, 512, dtype=dtype),
                            _meta(1000, 1024, dtype=torch.float32), BM=128, BN=bn, BK=128 // dtype.itemsize, TA=False,
                            TB=True, ACC=T.float32, num_warps=warps, arch="sm_100a")
    cubin = st.asm["cubin"]
    assert cubin[:4] == b"\x7fELF"
    assert st.meta["spills"] == 0, st.meta
    tool = shutil.which("cuobjdump") or _wheel_tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install -e '.[sass]')")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    assert mma in sass  # tcgen05.mma: kind::f16 (UTCHMMA), kind::f8f6f4 (UTCQMMA)
    assert "UTCBAR" in sass  # tcgen05.commit to an mbarrier
    assert "LDTM" in sass and "STTM" in sass  # tcgen05.ld / tcgen05.st
    assert "UTMALDG" in sass  # the TMA ring
    assert not re.search(r"\bHMMA\.", sass)  # no mma.sync left


def _wheel_tool(name: str) -> str | None:
    try:
        import nvidia.cu13  # type: ignore
    except ImportError:
        return None
    for root in getattr(nvidia.cu13, "__path__", []):
        candidate = Path(root) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return None


# -- a pinned lowering (TILEJIT_GEMM_LOWERING) -----------------------------------------------------------

def test_a_tcgen05_request_on_sm_120a_is_a_clear_dispatch_error(monkeypatch):
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "tcgen05_mma_f16")
    with pytest.raises(tilejit.DispatchError) as info:
        _mm(torch.float16, torch.float16, T.float32, arch="sm_120a", stop_after="passes")
    text = str(info.value)
    assert "the pinned gemm lowering 'tcgen05_mma_f16' does not fit on sm_120a" in text
    assert "arch sm_120a outside sm_100..sm_103" in text and "TILEJIT_GEMM_LOWERING" in text
    # where it fits, the pin is what runs
    assert _impl(_mm(torch.float16, torch.float16, T.float32, stop_after="passes")) == "tcgen05_mma_f16"


def test_pinning_another_lowering_and_a_wrong_name(monkeypatch):
    from tilejit.compiler import target_text
    from tilejit.target import Target

    unpinned = target_text(Target.of("sm_90a"))
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_m16n8k16")
    st = _mm(torch.float16, torch.float16, T.float32, arch="sm_90a", stop_after="ptx")
    assert _impl(st) == "mma_sync_m16n8k16" and "wgmma" not in st.ptx and "mma.sync" in st.ptx
    assert target_text(Target.of("sm_90a")) != unpinned  # a pinned compile never reuses an unpinned cubin
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "wgmma_typo")
    with pytest.raises(tilejit.DispatchError, match="no gemm lowering is named 'wgmma_typo'"):
        _mm(torch.float16, torch.float16, T.float32, arch="sm_90a", stop_after="passes")
