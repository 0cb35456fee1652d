"""wgmma and TMA with the 64- and 32-byte swizzles on sm_90a: 16-bit BK = 32 (64-byte K rows) and BK = 16 (32-byte
rows) in every operand major-ness, N-major B with BN = 32 or 16 (64- or 32-byte N rows), fp8 / int8 BK = 64 and
tf32 BK = 16 K-major, pipelined (stages 2-4) with and without a warp-specialized producer, and mma.sync pinned on
the same TMA-filled 64-byte-swizzled tiles; against float64 references on ragged shapes with NaN-poisoned outputs.
The generated code is checked on CPU by ``tests/backend/test_wgmma_swizzle.py``.

Run on an sm_90 GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_wgmma_swizzle.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import MAJORS as LAYOUTS, matmul_any

pytestmark = [pytest.mark.gpu, pytest.mark.sm90a("wgmma")]

# (M, N, K): ragged in every dim, a K below one tile, 16-byte-aligned rows (TMA) and 777 (cp.async fallback)
SHAPES = [(1000, 300, 784), (256, 512, 1024), (7, 129, 40), (130, 200, 777)]



def _operands(m, n, k, ta, tb, make):
    a = make(k, m) if ta else make(m, k)
    b = make(n, k) if tb else make(k, n)
    return a, b, (a.T if ta else a), (b.T if tb else b)


def _check(c, ref, k):
    assert not torch.isnan(c).any(), "some outputs were never written"
    err = (c.double() - ref).abs().max().item()
    assert err <= 1e-5 * k ** 0.5 * ref.abs().max().item() + 1e-3, err


def _launch(a, b, c, m, n, **kw):
    compiled = matmul_any.compile(a, b, c, **kw)
    matmul_any[(tilejit.cdiv(m, kw["BM"]), tilejit.cdiv(n, kw["BN"]))](a, b, c, **kw)
    torch.cuda.synchronize()
    return compiled


# (BM, BN, BK, num_warps, stages)
TILES_16 = [(128, 128, 32, 4, 3), (64, 128, 32, 4, 2), (128, 256, 32, 8, 4), (128, 64, 16, 4, 3)]


@pytest.mark.parametrize("ws", [False, True], ids=["plain", "ws"])
@pytest.mark.parametrize("tile", TILES_16, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_short_k_rows(dtype, layout, shape, tile, ws):
    """BK = 32 (64-byte swizzle) or 16 (32-byte) for K-major operands; MN-major ones keep 128-byte panels."""
    m, n, k = shape
    bm, bn, bk, warps, stages = tile
    ta, tb = LAYOUTS[layout]
    torch.manual_seed(m + n + k + 3 * ta + tb + bk)
    a, b, am, bm_ = _operands(m, n, k, ta, tb, lambda *s: torch.randn(*s, device="cuda", dtype=dtype))
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    compiled = _launch(a, b, c, m, n, BM=bm, BN=bn, BK=bk, TA=ta, TB=tb, ACC=T.float32, num_warps=warps,
                       num_stages=stages, warp_specialize=ws)
    assert "impl = wgmma_m64nNk16" in compiled.asm["ir"]
    swizzle = f"swizzle={bk * 2}B"
    assert swizzle in compiled.asm["ir"] or (ta and not tb)  # TN: both operands MN-major, no K row in shared memory
    _check(c, am.double() @ bm_.double(), k)


# (BM, BN, BK, num_warps, stages): BN = 32 (64-byte N rows) and 16 (32-byte)
TILES_N = [(128, 32, 64, 4, 3), (64, 32, 32, 4, 2), (128, 16, 64, 4, 4), (256, 32, 64, 8, 3), (128, 16, 32, 4, 3)]


@pytest.mark.parametrize("ws", [False, True], ids=["plain", "ws"])
@pytest.mark.parametrize("tile", TILES_N, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("ta", [False, True], ids=["NN", "TN"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_narrow_n_major_b(dtype, ta, shape, tile, ws):
    """B given K x N with BN = 32 or 16: the MN-major 64B / 32B atom (``imm-trans-b`` = 1)."""
    m, n, k = shape
    bm, bn, bk, warps, stages = tile
    torch.manual_seed(m + n + k + bn + bk + ta)
    a, b, am, bm_ = _operands(m, n, k, ta, False, lambda *s: torch.randn(*s, device="cuda", dtype=dtype))
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    compiled = _launch(a, b, c, m, n, BM=bm, BN=bn, BK=bk, TA=ta, TB=False, ACC=T.float32, num_warps=warps,
                       num_stages=stages, warp_specialize=ws)
    assert "impl = wgmma_m64nNk16" in compiled.asm["ir"] and "transpose_copy" not in compiled.asm["ir"]
    assert f"#shared<{bk}x{bn}, swizzle={bn * 2}B" in compiled.asm["ir"]
    _check(c, am.double() @ bm_.double(), k)


def test_design_matmul_bk32_and_bn32():
    """The DESIGN matmul as written (3 stages), with BK = 32 and with BN = 32, fp16 out."""
    from kernels import matmul

    m, n, k = 1000, 3000, 1024
    torch.manual_seed(5)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    ref = a.double() @ b.double()
    for bm, bn, bk in ((128, 128, 32), (128, 32, 64), (128, 32, 32)):
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        compiled = matmul.compile(a, b, c, BM=bm, BN=bn, BK=bk, num_warps=4)
        assert "impl = wgmma_m64nNk16" in compiled.asm["ir"] and "mma.sync" not in compiled.asm["ptx"]
        matmul[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=4)
        torch.cuda.synchronize()
        assert not torch.isnan(c).any()
        err = (c.double() - ref).abs().max().item()
        assert err <= 2e-3 * ref.abs().max().item() + 1e-2, (bm, bn, bk, err)


@pytest.mark.parametrize("ws", [False, True], ids=["plain", "ws"])
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["e4m3", "e5m2", "int8", "tf32"])
def test_k_major_64_byte_rows_of_other_dtypes(kind, shape, stages, ws):
    """fp8 / int8 BK = 64 and tf32 BK = 16, A given M x K and B given N x K (both K-major, 64-byte rows)."""
    m, n, k = shape
    torch.manual_seed(m + n + k + stages)
    if kind == "int8":
        make = lambda *s: torch.randint(-8, 8, s, device="cuda", dtype=torch.int8)  # noqa: E731
        acc, out, impl, bk = T.int32, torch.int32, "wgmma_m64nNk32_int8", 64
    elif kind == "tf32":
        make = lambda *s: torch.randn(*s, device="cuda")  # noqa: E731
        acc, out, impl, bk = T.float32, torch.float32, "wgmma_m64nNk8_tf32", 16
    else:
        dtype = torch.float8_e4m3fn if kind == "e4m3" else torch.float8_e5m2
        make = lambda *s: torch.randn(*s, device="cuda").to(dtype)  # noqa: E731
        acc, out, impl, bk = T.float32, torch.float32, "wgmma_m64nNk32_fp8", 64
    a, b, am, bm_ = _operands(m, n, k, False, True, make)
    c = torch.full((m, n), -(2 ** 31) if out == torch.int32 else float("nan"), device="cuda", dtype=out)
    compiled = _launch(a, b, c, m, n, BM=128, BN=128, BK=bk, TA=False, TB=True, ACC=acc,
                       PRECISION="tf32" if kind == "tf32" else None, num_warps=4, num_stages=stages,
                       warp_specialize=ws)
    assert f"impl = {impl}" in compiled.asm["ir"] and "swizzle=64B" in compiled.asm["ir"]
    ref = am.double() @ bm_.double()
    if kind == "int8":
        assert torch.equal(c.long(), ref.long())
        return
    assert not torch.isnan(c).any(), "some outputs were never written"
    # fp8 products are exact and tf32 rounds each operand to 10 mantissa bits: bound by sum |a||b|
    bound = (am.double().abs() @ bm_.double().abs()) * (2.0 ** -7 if kind != "tf32" else 2.0 ** -9) + 1e-3
    assert ((c.double() - ref).abs() <= bound).all(), f"max error {(c.double() - ref).abs().max().item():.3g}"


@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(map(str, s)))
def test_mma_sync_reads_tma_filled_64_byte_tiles(shape, monkeypatch):
    """mma.sync pinned on sm_90a with BK = 32: the same 64-byte-swizzled tiles, filled by TMA with SWIZZLE_64B,
    read by ldmatrix through the shared layout's formula."""
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_m16n8k16")
    m, n, k = shape
    torch.manual_seed(m + n + k)
    a, b, am, bm_ = _operands(m, n, k, False, False, lambda *s: torch.randn(*s, device="cuda", dtype=torch.float16))
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    compiled = _launch(a, b, c, m, n, BM=128, BN=128, BK=32, TA=False, TB=False, ACC=T.float32, num_warps=4,
                       num_stages=3)
    assert "impl = mma_sync_m16n8k16" in compiled.asm["ir"]
    assert "swizzle=64B" in compiled.asm["ir"]
    if k % 8 == 0:
        assert "copy = tma_bulk_tensor" in compiled.asm["ir"]
    _check(c, am.double() @ bm_.double(), k)
