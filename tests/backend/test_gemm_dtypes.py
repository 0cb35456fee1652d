"""Tensor cores for every dtype (fp8, int8, tf32): which lowering each operand dtype, major-ness and arch gets, the
instructions in the PTX and cubin, the fragment layouts of the k32 / k8 atoms against the PTX ISA formulas, the
precision choices of float32 products, and the dtype-aware autotune space. All on CPU (NVRTC without a GPU)."""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import matmul_any
from tilejit.configs import matmul_configs, matmul_shared_bytes

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
LAYOUTS = {"nn": (False, False), "nt": (False, True), "tn": (True, False)}


def _meta(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _compile(da, db, acc, layout, arch, precision=None, stop_after="ptx", tile=(128, 128, 128, 8)):
    ta, tb = LAYOUTS[layout]
    bm, bn, bk_bytes, warps = tile
    out = torch.int32 if acc == T.int32 else torch.float32
    return matmul_any.compile(_meta(1024, 1024, dtype=da), _meta(1024, 1024, dtype=db), _meta(1024, 1024, dtype=out),
                              BM=bm, BN=bn, BK=bk_bytes // da.itemsize, TA=ta, TB=tb, ACC=acc, PRECISION=precision,
                              num_warps=warps, arch=arch, stop_after=stop_after)


def _impl(stages) -> str:
    return re.search(r'impl = "?([A-Za-z0-9_]+)', str(stages.final_ir)).group(1)


# (operand dtypes, accumulator, precision, layout, arch) -> (lowering, the instruction in the PTX)
DISPATCH = [
    ((E4M3, E4M3), T.float32, None, "nt", "sm_90a", "wgmma_m64nNk32_fp8", "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"),
    ((E4M3, E5M2), T.float32, None, "nt", "sm_90a", "wgmma_m64nNk32_fp8", "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2"),
    # one MN-major 8-bit operand: gathered into registers on sm_90a (lower_wgmma_mn8); both MN-major, and tcgen05:
    # a transposing copy (transpose_operands)
    ((E5M2, E5M2), T.float32, None, "nn", "sm_90a", "wgmma_mn_m64nNk32_fp8", "wgmma.mma_async.sync.aligned.m64n128k32.f32.e5m2.e5m2"),
    ((E4M3, E4M3), T.float32, None, "tn", "sm_90a", "wgmma_m64nNk32_fp8", "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"),
    ((E4M3, E4M3), T.float32, None, "tn", "sm_89", "mma_sync_m16n8k32_fp8", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ((E4M3, E4M3), T.float32, None, "nt", "sm_100a", "tcgen05_mma_f8f6f4", "tcgen05.mma.cta_group::1.kind::f8f6f4"),
    ((E4M3, E4M3), T.float32, None, "nn", "sm_100a", "tcgen05_mma_f8f6f4", "tcgen05.mma.cta_group::1.kind::f8f6f4"),
    ((E4M3, E4M3), T.float32, None, "nn", "sm_89", "mma_sync_m16n8k32_fp8", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    ((E4M3, E4M3), T.float32, None, "nt", "sm_80", "fma_fallback", None),  # no fp8 tensor cores before sm_89
    ((torch.int8, torch.int8), T.int32, None, "nt", "sm_90a", "wgmma_m64nNk32_int8", "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"),
    ((torch.int8, torch.int8), T.int32, None, "nn", "sm_90a", "wgmma_mn_m64nNk32_int8", "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"),
    ((torch.int8, torch.int8), T.int32, None, "tn", "sm_90a", "wgmma_m64nNk32_int8", "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"),
    ((torch.int8, torch.int8), T.int32, None, "nt", "sm_80", "mma_sync_m16n8k32_int8", "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"),
    ((torch.int8, torch.int8), T.int32, None, "tn", "sm_80", "mma_sync_m16n8k32_int8", "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"),
    ((torch.float32,) * 2, T.float32, None, "nt", "sm_90a", "wgmma_m64nNk8_tf32", "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"),
    # an MN-major f32 operand is read into registers as the instruction's A (lower_wgmma_mn); both MN-major: copied
    ((torch.float32,) * 2, T.float32, "tf32", "nn", "sm_90a", "wgmma_mn_m64nNk8_tf32", "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"),
    ((torch.float32,) * 2, T.float32, "tf32", "tn", "sm_90a", "wgmma_m64nNk8_tf32", "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"),
    ((torch.float32,) * 2, T.float32, "tf32", "nn", "sm_80", "mma_sync_m16n8k8_tf32", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ((torch.float32,) * 2, T.float32, "tf32", "tn", "sm_80", "mma_sync_m16n8k8_tf32", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ((torch.float32,) * 2, T.float32, "tf32x3", "nt", "sm_90a", "mma_sync_m16n8k8_tf32x3", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ((torch.float32,) * 2, T.float32, "ieee", "nt", "sm_90a", "fma_fallback", None),
]


@pytest.mark.parametrize("case", DISPATCH, ids=lambda c: f"{c[0][0]}-{c[0][1]}-{c[2]}-{c[3]}-{c[4]}".replace("torch.", ""))
def test_dispatch_and_ptx(case):
    (da, db), acc, precision, layout, arch, impl, instruction = case
    stages = _compile(da, db, acc, layout, arch, precision)
    assert _impl(stages) == impl
    found = set(re.findall(r"(?:wgmma\.mma_async|mma\.sync|tcgen05\.mma)[\w.:]*", stages.ptx))
    if instruction is None:
        assert not found, f"{impl} should use no tensor-core instruction: {found}"
    else:
        assert found == {instruction}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype,acc", [(E4M3, T.float32), (torch.int8, T.int32), (torch.float32, T.float32)],
                         ids=["fp8", "int8", "tf32"])
def test_cubins_build_with_no_spills(dtype, acc, arch):
    """ptxas accepts every new form (K-major and gathered MN-major fragments) and spills nothing."""
    for layout in ("nt", "nn"):
        compiled = _compile(dtype, dtype, acc, layout, arch, stop_after=None)
        assert compiled.asm["cubin"][:4] == b"\x7fELF"
        assert compiled.meta["spills"] in (0, None), compiled.meta


def test_tf32x3_issues_three_products_per_atom():
    one = _compile(torch.float32, torch.float32, T.float32, "nt", "sm_80", "tf32", stop_after="cuda").cuda
    three = _compile(torch.float32, torch.float32, T.float32, "nt", "sm_80", "tf32x3", stop_after="cuda").cuda
    assert one.count("tj_mma_m16n8k8_tf32_tf32(tj_d[0]") == 4  # one per k8 step (BK = 32, unrolled)
    assert three.count("tj_mma_m16n8k8_tf32_tf32(tj_d[0]") == 12
    assert "0xffffe000u" in three and "0xffffe000u" not in one


# -- fragments: one ldmatrix addressing serves f16 k16, 8-bit k32 and tf32 k8 (PTX ISA 9.7.14.5) -----------------

def _ptx_a_fragment(fmt: str, lane: int, reg: int, byte: int) -> tuple[int, int]:
    """(row, byte of K) of byte ``byte`` of A register ``reg`` in lane ``lane``, from the PTX ISA's formulas."""
    g, t = lane // 4, lane % 4
    if fmt == "f16_k16":   # a_i, i = 0..7: row g + 8*((i//2)%2), col 2t + i%2 + 8*(i//4); 2 bytes each
        i = reg * 2 + byte // 2
        return g + 8 * ((i // 2) % 2), 2 * (2 * t + i % 2 + 8 * (i // 4)) + byte % 2
    if fmt == "b8_k32":    # a_i, i = 0..15: row g + 8*((i//4)%2), col 4t + i%4 + 16*(i//8); 1 byte each
        i = reg * 4 + byte
        return g + 8 * ((i // 4) % 2), 4 * t + i % 4 + 16 * (i // 8)
    assert fmt == "tf32_k8"  # a_i, i = 0..3: row g + 8*(i%2), col t + 4*(i//2); 4 bytes each
    return g + 8 * (reg % 2), 4 * (t + 4 * (reg // 2)) + byte


def _ptx_b_fragment(fmt: str, lane: int, reg: int, byte: int) -> tuple[int, int]:
    """(column n, byte of K) of byte ``byte`` of B register ``reg`` in lane ``lane``."""
    g, t = lane // 4, lane % 4
    if fmt == "f16_k16":   # b_i, i = 0..3: k 2t + i%2 + 8*(i//2), n g
        i = reg * 2 + byte // 2
        return g, 2 * (2 * t + i % 2 + 8 * (i // 2)) + byte % 2
    if fmt == "b8_k32":    # b_i, i = 0..7: k 4t + i%4 + 16*(i//4), n g
        i = reg * 4 + byte
        return g, 4 * t + i % 4 + 16 * (i // 4)
    return g, 4 * (t + 4 * reg) + byte  # tf32 b_i, i = 0..1: k t + 4i, n g


def _ldmatrix_k_major(lane: int, reg: int, byte: int) -> tuple[int, int]:
    """What the K-major ldmatrix.x4 of lower_gemm delivers: lanes 8j..8j+7 address matrix j at rows (lane & 15),
    16-byte chunk lane >> 4; thread T gets, in register j, bytes 4*(T%4)..+3 of row T//4 of matrix j."""
    addressing_lane = 8 * reg + lane // 4
    row, chunk = addressing_lane & 15, addressing_lane >> 4
    return row, 16 * chunk + 4 * (lane % 4) + byte


@pytest.mark.parametrize("fmt", ["f16_k16", "b8_k32", "tf32_k8"])
def test_k_major_fragments_match_the_ptx_formulas(fmt):
    for lane in range(32):
        for reg in range(4):
            for byte in range(4):
                assert _ptx_a_fragment(fmt, lane, reg, byte) == _ldmatrix_k_major(lane, reg, byte), (lane, reg, byte)
        for reg in range(2):  # B given N x K: the same addressing, n in place of the row, two registers
            for byte in range(4):
                row, kbyte = _ldmatrix_k_major(lane, reg * 2, byte)
                assert _ptx_b_fragment(fmt, lane, reg, byte) == (row, kbyte), (lane, reg, byte)


# -- the precision of float32 products ------------------------------------------------------------------------------

@tilejit.kernel
def _f32_product(A, B, C, BM: T.constexpr, PRECISION: T.constexpr = None):
    C[0:BM, 0:BM] = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], T.zeros((BM, BM), T.float32), precision=PRECISION)


@tilejit.kernel
def _at_operator(A, B, C, BM: T.constexpr):
    C[0:BM, 0:BM] = A[0:BM, 0:BM] @ B[0:BM, 0:BM]


def test_precision_is_in_the_ir_and_defaults_to_tf32():
    a = _meta(64, 64, dtype=torch.float32)
    assert 'precision = tf32' in str(_at_operator.ir(a, a, a, BM=64))
    assert 'precision = ieee' in str(_f32_product.ir(a, a, a, BM=64, PRECISION="ieee"))
    h = _meta(64, 64, dtype=torch.float16)
    assert "precision" not in str(_f32_product.ir(h, h, a, BM=64, PRECISION="tf32"))  # f16: one way to multiply


def test_unknown_precision_is_a_located_error():
    a = _meta(64, 64, dtype=torch.float32)
    with pytest.raises(tilejit.CompilationError) as info:
        _f32_product.ir(a, a, a, BM=64, PRECISION="fp64")
    text = str(info.value)
    assert "unknown precision 'fp64'" in text and "tf32x3" in text and "test_gemm_dtypes.py" in text


def test_interpreter_follows_each_precision(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    torch.manual_seed(0)
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    exact = a.double() @ b.double()
    trunc = lambda x: (x.view(torch.int32) & -8192).view(torch.float32).double()  # noqa: E731
    results = {}
    for precision in ("tf32", "tf32x3", "ieee"):
        c = torch.full((32, 32), float("nan"))
        _f32_product[(1,)](a, b, c, BM=32, PRECISION=precision)
        results[precision] = c.double()
    torch.testing.assert_close(results["tf32"], trunc(a) @ trunc(b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results["ieee"], exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results["tf32x3"], exact, rtol=1e-5, atol=1e-5)
    assert (results["tf32"] - exact).abs().max() > 1e-3  # the default really rounds


def test_fp8_formats_mix_and_other_dtypes_do_not():
    e4, e5 = _meta(64, 64, dtype=E4M3), _meta(64, 64, dtype=E5M2)
    c = _meta(64, 64, dtype=torch.float32)
    assert "tj.gemm" in str(_at_operator.ir(e4, e5, c, BM=64))
    with pytest.raises(tilejit.CompilationError, match="different dtypes"):
        _at_operator.ir(e4, _meta(64, 64, dtype=torch.float16), c, BM=64)


# -- the autotune space ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("elem_bytes,bks", [(1, {64, 128}), (2, {32, 64}), (4, {16, 32})])
def test_matmul_configs_keep_the_bytes_of_k_per_stage(elem_bytes, bks):
    """64 and 128 bytes of K per stage; the 16-row tiles (decode-like problems) and one 64x64 tile (small squares)
    also take 256."""
    configs = matmul_configs(elem_bytes=elem_bytes)
    wide = {2 * max(bks)}
    assert configs and {c.kwargs["BK"] for c in configs if c.kwargs["BM"] >= 64} == bks | wide
    assert {(c.kwargs["BM"], c.kwargs["BN"]) for c in configs if c.kwargs["BK"] in wide and c.kwargs["BM"] >= 64} \
        == {(64, 64)}
    assert {c.kwargs["BK"] for c in configs if c.kwargs["BM"] < 64} == {max(bks), 2 * max(bks)}
    assert all(matmul_shared_bytes(c, elem_bytes) <= 200 * 1024 for c in configs)
    with pytest.raises(ValueError):
        matmul_configs(elem_bytes=3)
