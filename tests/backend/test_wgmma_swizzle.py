"""wgmma and TMA with the 64- and 32-byte swizzles: shared tiles whose rows are 64 or 32 bytes (fp16 BK = 32 or
16, fp8 BK = 64, tf32 BK = 16, N-major B with N = 32 or 16) stay on wgmma on sm_90a instead of falling to
mma.sync. Checked here on CPU: the shared layout against the swizzle of the canonical layouts (PTX ISA
9.7.15.5.1.2.1.3), the descriptor bits against the matrix-descriptor table and examples (9.7.15.5.1.2.2), the
tensor maps' swizzle modes, the generated code and NVRTC cubins. The products themselves are checked on an H100 by
``tests/gpu/test_gpu_wgmma_swizzle.py``.
"""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
from _lowering import kernel_body, lower
from filecheck import filecheck
from kernels import matmul, matmul_any
from tilejit.backend_cuda import lower_tma
from tilejit.backend_cuda import lower_wgmma as wg
from tilejit.ir.layouts import SharedLayout
from tilejit.runtime import libcuda, tma
from tilejit.target import REGISTRY, Target


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def field(value: int, lo: int, hi: int) -> int:
    """Bits lo..hi (inclusive) of a descriptor."""
    return (value >> lo) & ((1 << (hi - lo + 1)) - 1)


# -- the shared layout is the hardware swizzle --------------------------------------------------------------------

def hardware_swizzle(addr: int, bits: int) -> int:
    """Swizzle<bits, 4, 3> of a byte address: bits [4, 4 + bits) XOR bits [7, 7 + bits) (PTX 9.7.15.5.1.2.1.3)."""
    return addr ^ (((addr >> 7) & ((1 << bits) - 1)) << 4)


@pytest.mark.parametrize("row_bytes, bits", [(128, 3), (64, 2), (32, 1)])
@pytest.mark.parametrize("elem", [1, 2, 4])
def test_shared_layout_is_the_wgmma_and_tma_swizzle(row_bytes, bits, elem):
    """Chunk c of row r of a tile starting on a 1024-byte boundary sits where the 128B / 64B / 32B swizzle puts the
    unswizzled byte r * row_bytes + 16 c; one atom is 8 rows."""
    lay = SharedLayout(64, row_bytes // elem, elem)
    assert lay.swizzle_bytes == row_bytes and lay.atom_bytes == 8 * row_bytes == {128: 1024, 64: 512, 32: 256}[row_bytes]
    for r in range(64):
        for c in range(row_bytes // 16):
            assert lay.chunk_offset(r, c) == hardware_swizzle(r * row_bytes + 16 * c, bits)


def test_unswizzled_rows_have_no_swizzle_mode():
    assert SharedLayout(64, 8, 2).swizzle_bytes == 0 and SharedLayout(64, 48, 2).swizzle_bytes == 0


# -- descriptor bits (PTX 9.7.15.5.1.2.2) -------------------------------------------------------------------------

def test_descriptor_layout_type_values():
    """Bits 62-63: 1 = 128-byte, 2 = 64-byte, 3 = 32-byte swizzle."""
    assert [field(wg.encode_descriptor(0, 16, 1024, s), 62, 63) for s in (128, 64, 32)] == [1, 2, 3]
    assert wg.LAYOUT_TYPES == {128: 1, 64: 2, 32: 3}


def test_descriptor_matches_the_ptx_examples():
    """PTX 9.7.15.5.1.2.1.3's examples: MN-major 64B swizzle bf16, LBO 256 * 2 bytes (encoded 32), SBO 512 * 2
    (encoded 64); MN-major 32B swizzle bf16, LBO 128 * 2 (16), SBO 256 * 2 (32); K-major 32B swizzle tf32, LBO
    unused (1 assumed), SBO 64 * 4 (16)."""
    d = wg.encode_descriptor(0x4400, 512, 1024, 64)
    assert (field(d, 0, 13), field(d, 16, 29), field(d, 32, 45), field(d, 49, 51), field(d, 62, 63)) == \
        (0x440, 32, 64, 0, 2)
    d = wg.encode_descriptor(0x4400, 256, 512, 32)
    assert (field(d, 16, 29), field(d, 32, 45), field(d, 62, 63)) == (16, 32, 3)
    d = wg.encode_descriptor(0x4400, 16, 256, 32)
    assert (field(d, 16, 29), field(d, 32, 45), field(d, 62, 63)) == (1, 16, 3)


@pytest.mark.parametrize("rows, cols, k_major, lbo, sbo, swizzle", [
    # K-major A 128 x 32 f16 (64-byte rows): SBO = 8 rows = 512 (encoded 32), LBO unused (16, encoded 1)
    (128, 32, True, 16, 512, 64),
    # K-major B 128 x 16 f16 (32-byte rows): SBO = 256 (encoded 16)
    (128, 16, True, 16, 256, 32),
    # fp8 K-major 128 x 64 (64-byte rows)
    (128, 64, True, 16, 512, 64),
    # N-major B 32 x 32 f16 (K x N, 64-byte rows): SBO = 8 k-rows = 512, LBO = the whole tile (one 32-column atom)
    (32, 32, False, 32 * 64, 512, 64),
    # N-major B 64 x 16 f16 (32-byte rows): SBO = 256
    (64, 16, False, 64 * 32, 256, 32),
    # the 128-byte swizzle as before: N-major B 64 x 128 f16, two panels of 64 rows x 128 bytes
    (64, 128, False, 64 * 128, 1024, 128),
])
def test_descriptor_fields_of_a_tile(rows, cols, k_major, lbo, sbo, swizzle):
    elem = 1 if (rows, cols) == (128, 64) else 2
    lay = SharedLayout(rows, cols, elem)
    assert (wg.b_fields(lay, 0, k_major)[1], lay.atom_bytes, lay.swizzle_bytes) == (lbo, sbo, swizzle)
    d = wg.encode_descriptor(1024, lbo, sbo, swizzle)
    assert (field(d, 16, 29), field(d, 32, 45), field(d, 62, 63)) == (lbo >> 4, sbo >> 4, wg.LAYOUT_TYPES[swizzle])
    text = wg.descriptor_call("tj_b", lay, lbo)
    assert text == (f"tj_wgmma_desc(tj_b, {lbo}, {sbo})" if swizzle == 128 else
                    f"tj_wgmma_desc(tj_b, {lbo}, {sbo}, {wg.LAYOUT_TYPES[swizzle]})")


def test_k_steps_inside_a_short_row():
    """A k step is 32 bytes of K: inside a 64-byte row at 0 and 32; N-major, 16 rows further."""
    lay64, lay32 = SharedLayout(128, 32, 2), SharedLayout(128, 16, 2)
    assert [wg.k_step_offset(lay64, kk) for kk in range(2)] == [0, 32]
    assert wg.k_step_offset(lay32, 0) == 0
    assert [wg.b_fields(SharedLayout(64, 32, 2), kk, False)[0] for kk in range(4)] == [0, 1024, 2048, 3072]
    assert [wg.k_step_offset(SharedLayout(64, 128, 2), kk) for kk in range(8)] == \
        [0, 32, 64, 96, 64 * 128, 64 * 128 + 32, 64 * 128 + 64, 64 * 128 + 96]


# -- the DESIGN matmul ----------------------------------------------------------------------------------------------

def _design(bm, bn, bk, warps=4, m=1000, n=3000, k=512, dtype=torch.float16, **kw):
    return matmul.compile(meta(m, k, dtype=dtype), meta(k, n, dtype=dtype), meta(m, n, dtype=dtype), BM=bm, BN=bn,
                          BK=bk, num_warps=warps, arch="sm_90a", **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_design_matmul_bk32_takes_wgmma_with_the_64_byte_swizzle(dtype):
    st = _design(128, 128, 32, dtype=dtype)
    filecheck(st.asm["ir"], r"""
        CHECK: tj.load %A{{.*}}copy = tma_bulk_tensor} : tile<128x32x{{.*}}, shared, #shared<128x32, swizzle=64B, stages=3>>
        CHECK: tj.load %B{{.*}}copy = tma_bulk_tensor} : tile<32x128x{{.*}}, shared, #shared<32x128, swizzle=128B, panels=2, stages=3>>
        CHECK: tj.gemm {{.*}}impl = wgmma_m64nNk16} : tile<128x128xf32, reg, #wgmma<warpgroups=1>>
    """)
    body = kernel_body(st.asm["cuda"])
    # A: 64-byte swizzle (layout type 2), SBO 512, a slab is 64 rows x 64 bytes; its k16 steps 32 bytes apart
    filecheck(body, r"""
        CHECK: const uint64_t tj_adesc = tj_wgmma_desc(tj_a + tj_wg * 4096, 16, 512, 2);
        CHECK: const uint64_t tj_bdesc = tj_wgmma_desc(tj_b, 4096, 1024);
    """)
    assert "(tj_adesc + 2ull)" in body and "(tj_bdesc + 128ull)" in body
    # one box per tile of A: its 32-element (64-byte) rows, which the runtime encodes as SWIZZLE_64B
    assert {"tensor": "A", "box": [32, 128], "elem_bytes": 2} in st.meta["tensor_maps"]
    assert {"tensor": "B", "box": [64, 32], "elem_bytes": 2} in st.meta["tensor_maps"]
    assert "mma.sync" not in st.asm["ptx"] and st.asm["ptx"].count("wgmma.mma_async") == 4
    assert st.meta["spills"] == 0


@pytest.mark.parametrize("bn, bk, sbo, layout", [(32, 64, 512, 2), (32, 32, 512, 2), (16, 64, 256, 3)])
def test_design_matmul_narrow_n_major_b_takes_wgmma(bn, bk, sbo, layout):
    """B given K x N with N = 32 (64-byte rows) or 16 (32-byte rows): the MN-major 64B / 32B atom; a k16 step
    moves 16 rows of B."""
    st = _design(128, bn, bk)
    assert "impl = wgmma_m64nNk16}" in st.asm["ir"] and "transpose_copy" not in st.asm["ir"]
    body = kernel_body(st.asm["cuda"])
    assert f"const uint64_t tj_bdesc = tj_wgmma_desc(tj_b, {bk * bn * 2}, {sbo}, {layout});" in body
    assert f"(tj_bdesc + {16 * bn * 2 >> 4}ull)" in body
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn}k16\.f32\.f16\.f16 .*p, 1, 1, 0, 1;", body)
    assert {"tensor": "B", "box": [bn, bk], "elem_bytes": 2} in st.meta["tensor_maps"]
    assert "mma.sync" not in st.asm["ptx"] and st.meta["spills"] == 0


def test_bk16_takes_wgmma_with_the_32_byte_swizzle():
    st = _design(128, 128, 16)
    assert "#shared<128x16, swizzle=32B, stages=3>" in st.asm["ir"] and "impl = wgmma_m64nNk16}" in st.asm["ir"]
    assert "tj_wgmma_desc(tj_a + tj_wg * 2048, 16, 256, 3);" in kernel_body(st.asm["cuda"])
    assert {"tensor": "A", "box": [16, 128], "elem_bytes": 2} in st.meta["tensor_maps"]
    assert "mma.sync" not in st.asm["ptx"] and st.meta["spills"] == 0


@pytest.mark.parametrize("how", ["loop", "launch"])
def test_warp_specialized_bk32(how):
    st = _design(128, 128, 32, warps=8, **({"warp_specialize": True} if how == "launch" else {}))
    if how == "launch":
        assert "producer_warpgroup = true" in st.asm["ir"]
    assert "impl = wgmma_m64nNk16}" in st.asm["ir"] and st.meta["spills"] == 0
    assert "tj_wgmma_desc(tj_a + tj_wg * 4096, 16, 512, 2);" in kernel_body(st.asm["cuda"])


@pytest.mark.parametrize("dtype, acc, impl, kwargs", [
    (torch.float8_e4m3fn, T.float32, "wgmma_m64nNk32_fp8", {}),
    (torch.int8, T.int32, "wgmma_m64nNk32_int8", {}),
    (torch.float32, T.float32, "wgmma_m64nNk8_tf32", {"PRECISION": "tf32"}),
], ids=["fp8", "int8", "tf32"])
def test_k_major_64_byte_rows_of_other_dtypes(dtype, acc, impl, kwargs):
    """fp8 / int8 BK = 64 and tf32 BK = 16: 64-byte K rows for A and B (given N x K), both K-major."""
    bk = 64 // dtype.itemsize
    out = torch.int32 if dtype == torch.int8 else torch.float32
    st = matmul_any.compile(meta(1000, 512, dtype=dtype), meta(768, 512, dtype=dtype), meta(1000, 768, dtype=out),
                            BM=128, BN=128, BK=bk, TA=False, TB=True, ACC=acc, num_warps=4, arch="sm_90a", **kwargs)
    assert f"impl = {impl}}}" in st.asm["ir"] and "transpose_copy" not in st.asm["ir"]
    body = kernel_body(st.asm["cuda"])
    assert "tj_wgmma_desc(tj_a + tj_wg * 4096, 16, 512, 2);" in body
    assert "tj_wgmma_desc(tj_b, 16, 512, 2);" in body
    assert {"tensor": "A", "box": [bk, 128], "elem_bytes": dtype.itemsize} in st.meta["tensor_maps"]
    assert "mma.sync" not in st.asm["ptx"] and st.meta["spills"] == 0


# -- what stays off -------------------------------------------------------------------------------------------------

def _gemm(fn):
    return next(op for op in fn.walk() if op.kind.mnemonic == "gemm")


def test_a_tile_too_small_for_its_alignment_is_refused_with_the_reason():
    """B given N x K with N = 8 and 64-byte rows is 512 bytes, which the allocator aligns to 128 bytes only (the
    64-byte swizzle repeats every 512): wgmma refuses it, naming the rule."""
    fn, _ = lower(matmul_any, meta(1000, 512), meta(8, 512), meta(1000, 8, dtype=torch.float32), BM=64, BN=8, BK=32,
                  TA=False, TB=True, ACC=T.float32, num_warps=4, arch="sm_90a")
    gemm = _gemm(fn)
    assert not gemm.attrs.impl.startswith("wgmma")
    assert REGISTRY.get("gemm", "wgmma_m64nNk16").rejection(gemm, Target.of("sm_90a", num_warps=4)) == wg._ROWS


def test_rows_in_no_swizzle_mode_are_refused():
    """96-byte K rows (BK = 48) and 96-byte N rows (B given K x N with N = 48) are in no swizzle mode. (The DESIGN
    matmul with BK = 48 still reaches wgmma: passes/transpose_operands.py copies A into an M-major tile.)"""
    target = Target.of("sm_90a", num_warps=4)
    assert not wg._rows_fit(_fake_gemm(128, 128, 48, transpose_b=False), target)
    assert not wg._rows_fit(_fake_gemm(128, 48, 64, transpose_b=False), target)
    assert wg._rows_fit(_fake_gemm(128, 128, 32, transpose_b=False), target)
    assert wg._rows_fit(_fake_gemm(128, 16, 64, transpose_b=False), target)


def _fake_gemm(m, n, k, transpose_b):
    """A gemm of the DESIGN matmul's shapes, taken from its lowered IR."""
    fn, _ = lower(matmul_any, meta(1000, 512), meta(n, 512) if transpose_b else meta(512, n),
                  meta(1000, n, dtype=torch.float32), BM=m, BN=n, BK=k, TA=False, TB=transpose_b, ACC=T.float32,
                  num_warps=4, arch="sm_80")
    return _gemm(fn)


def test_rs_lowering_takes_any_k_and_b_in_any_swizzle_mode():
    """wgmma_rs_m64nNk16 (A from registers) has no rule on K beyond whole k16 steps (A has no shared rows), and B
    may be in any swizzle mode: 128-byte panels, or one 64- or 32-byte row."""
    from tilejit.backend_cuda import lower_wgmma_rs as rs
    target = Target.of("sm_90a", num_warps=4)
    assert rs._tile_shapes_fit(_fake_gemm(128, 128, 32, False), target)
    assert rs._b_rows_fit(_fake_gemm(128, 128, 32, False), target)   # N-major B: 256-byte rows
    assert rs._b_rows_fit(_fake_gemm(128, 32, 64, False), target)    # N-major B: one 64-byte row
    assert rs._b_rows_fit(_fake_gemm(128, 64, 32, True), target)     # K-major B: one 64-byte row
    assert not rs._b_rows_fit(_fake_gemm(128, 24, 64, False), target)  # 48-byte rows: no swizzle mode


# -- TMA ------------------------------------------------------------------------------------------------------------

def test_tensor_map_swizzle_follows_the_box():
    assert lower_tma.TensorMapSpec("A", (32, 128), 2).swizzle_bytes == 64
    assert lower_tma.TensorMapSpec("A", (64, 128), 1).swizzle_bytes == 64
    assert lower_tma.TensorMapSpec("B", (16, 64), 2).swizzle_bytes == 32
    assert lower_tma.TensorMapSpec("B", (64, 64), 2).swizzle_bytes == 128
    assert [tma.swizzle_bytes(box, 2) for box in ([64, 8], [32, 8], [16, 8])] == [128, 64, 32]
    with pytest.raises(tilejit.LaunchError, match="no swizzle mode"):
        tma.swizzle_bytes([24, 8], 2)


def test_the_encoder_passes_the_swizzle_enum(monkeypatch):
    """cuTensorMapEncodeTiled gets CU_TENSOR_MAP_SWIZZLE_64B (2) for a box of 64-byte rows, _32B (1) for 32-byte
    rows, _128B (3) for 128-byte rows (cuda.h's CUtensorMapSwizzle)."""
    calls = []

    def fake(name):
        assert name == "cuTensorMapEncodeTiled"
        return lambda *args: calls.append(args) or 0

    monkeypatch.setattr(libcuda, "function", fake)
    for box, enum in (([32, 128], 2), ([16, 64], 1), ([64, 64], 3)):
        tma.encode(0x7000_0000 + 4096 * len(calls), [1000, 512], [512, 1], 2, box)
        assert calls[-1][9] == enum
    assert libcuda.TENSOR_MAP_SWIZZLES == {32: 1, 64: 2, 128: 3}


def test_tma_refuses_a_ring_too_small_for_the_swizzle_alignment():
    """A 64-byte-row tile whose ring holds less than 1024 bytes would start on a 128-byte boundary only."""
    fn, _ = lower(matmul, meta(1000, 512), meta(512, 3000), meta(1000, 3000), BM=64, BN=64, BK=32, num_warps=4,
                  arch="sm_90a")
    loads = [op for op in fn.walk() if op.kind.mnemonic == "load" and op.result.is_tile]
    assert all(op.attrs.copy == "tma_bulk_tensor" for op in loads)
    assert not lower_tma.swizzled_rows(64, 512) and lower_tma.swizzled_rows(64, 1024)
    assert lower_tma.swizzled_rows(128, 1024) and not lower_tma.swizzled_rows(96, 4096)


def test_sm100a_keeps_cp_async_for_short_rows():
    """TMA with the 64- and 32-byte swizzles has run on an H100 only: sm_100a keeps cp.async for such tiles."""
    fn, _ = lower(matmul, meta(1000, 512), meta(512, 3000), meta(1000, 3000), BM=128, BN=128, BK=32, num_warps=4,
                  arch="sm_100a")
    copies = {op.result.type.shape[1]: op.attrs.copy for op in fn.walk() if op.kind.mnemonic == "load"
              and op.result.is_tile}
    assert copies == {32: "cp_async", 128: "tma_bulk_tensor"}
