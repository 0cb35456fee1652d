"""Compiled kernels on the GPU against float64 references (fresh random inputs, NaN-poisoned outputs).

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_kernels.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T

pytestmark = pytest.mark.gpu


from kernels import atom, bmm_epilogue, matmul_nt, matmul_tn, softmax_rows
from kernels import matmul_staged as matmul


def _ref(a, b):
    return a.double() @ b.double()


def _check(out, ref, dtype):
    tol = {torch.float16: 2e-2, torch.bfloat16: 6e-2, torch.float32: 1e-4}[dtype]
    assert not torch.isnan(out).any(), "some outputs were never written"
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * max(1.0, ref.abs().max().item()) * 0.05)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mnk", [(1000, 3000, 777), (17, 129, 33), (128, 8, 4096), (256, 256, 256)])
def test_matmul_nn(dtype, mnk):
    m, n, k = mnk
    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 128))](a, b, c, BM=128, BN=128, BK=32, num_warps=4)
    _check(c, _ref(a, b), dtype)


@pytest.mark.parametrize("num_warps", [1, 2, 4, 8])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_matmul_warps_stages(num_warps, stages):
    m, n, k = 300, 200, 200
    torch.manual_seed(num_warps * 10 + stages)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    matmul[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64))](a, b, c, BM=64, BN=64, BK=32, num_warps=num_warps,
                                                       num_stages=stages)
    _check(c, _ref(a, b), torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_nt_tn(dtype):
    m, n, k = 333, 190, 160
    torch.manual_seed(7)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    bt = torch.randn(n, k, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul_nt[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 128))](a, bt, c, BM=64, BN=128, BK=32, num_warps=4)
    _check(c, _ref(a, bt.T), dtype)
    at = torch.randn(k, m, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c2 = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul_tn[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 64))](at, b, c2, BM=128, BN=64, BK=32, num_warps=4)
    _check(c2, _ref(at.T, b), dtype)


def test_matmul_non_contiguous_and_fp32_out():
    torch.manual_seed(3)
    base = torch.randn(300, 500, device="cuda", dtype=torch.float16)
    a = base[:, ::2]  # unit stride broken along K: element-wise staging path
    b = torch.randn(250, 130, device="cuda", dtype=torch.float16).T.contiguous().T  # column-major
    c = torch.full((300, 130), float("nan"), device="cuda", dtype=torch.float32)
    matmul[(tilejit.cdiv(300, 64), tilejit.cdiv(130, 64))](a, b, c, BM=64, BN=64, BK=32, num_warps=4)
    _check(c, _ref(a, b), torch.float16)


def test_batched_fused_epilogue():
    torch.manual_seed(11)
    bsz, m, n, k = 3, 100, 90, 70
    a = torch.randn(bsz, m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(bsz, k, n, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((bsz, m, n), float("nan"), device="cuda", dtype=torch.float16)
    bmm_epilogue[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64), bsz)](a, b, bias, c, 0.5, BM=64, BN=64, BK=32)
    ref = torch.relu(0.5 * (a.double() @ b.double()) + bias.double()[None, None, :])
    _check(c, ref, torch.float16)


@pytest.mark.parametrize("n", [100, 128, 1000])
def test_softmax_rows(n):
    torch.manual_seed(n)
    x = torch.randn(37, n, device="cuda", dtype=torch.float16) * 4
    y = torch.full_like(x, float("nan"))
    bn = 1 << (n - 1).bit_length()
    softmax_rows[(37,)](x, y, BN=bn)
    ref = torch.softmax(x.double(), dim=1)
    _check(y, ref, torch.float16)


def test_single_atom_one_warp():
    torch.manual_seed(0)
    a = torch.randn(16, 16, device="cuda", dtype=torch.float16)
    b = torch.randn(16, 8, device="cuda", dtype=torch.float16)
    c = torch.full((16, 8), float("nan"), device="cuda", dtype=torch.float16)
    atom[(1,)](a, b, c, num_warps=1)
    _check(c, _ref(a, b), torch.float16)


def test_large_square_4096():
    torch.manual_seed(1)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    c = torch.full((4096, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    matmul[(32, 32)](a, b, c, BM=128, BN=128, BK=32, num_warps=4, num_stages=3)
    _check(c, _ref(a, b), torch.bfloat16)


@pytest.mark.requires_sm(90)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tiles", [(128, 128, 64, 4), (128, 256, 64, 8), (64, 128, 64, 4), (128, 64, 128, 8)])
def test_matmul_wgmma_tiles(dtype, tiles):
    """Tile shapes the sm_90a wgmma lowering takes (BK % 64 == 0, 64-row slabs per warpgroup)."""
    bm, bn, bk, warps = tiles
    m, n, k = 1000, 700, 333
    torch.manual_seed(bm + bn + bk)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=3)
    _check(c, _ref(a, b), dtype)
    bt = torch.randn(n, k, device="cuda", dtype=dtype)
    c2 = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul_nt[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, bt, c2, BM=bm, BN=bn, BK=bk, num_warps=warps)
    _check(c2, _ref(a, bt.T), dtype)


@pytest.mark.requires_sm(90)
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
def test_matmul_wgmma_stages(stages):
    """Every pipeline depth, including the in-flight-accumulator form (stages >= 3) and short K loops."""
    torch.manual_seed(stages)
    for m, n, k in ((777, 640, 1000), (130, 128, 64), (200, 256, 129)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        matmul[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 128))](a, b, c, BM=128, BN=128, BK=64, num_warps=4,
                                                             num_stages=stages)
        _check(c, _ref(a, b), torch.bfloat16)


@pytest.mark.parametrize("bk", [8, 24])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_m16n8k8_tiles(bk, dtype):
    """K tiles that are multiples of 8 but not 16 run on mma.sync.m16n8k8, in all three majorness forms."""
    m, n, k = 200, 150, 100
    torch.manual_seed(bk)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    grid = (tilejit.cdiv(m, 64), tilejit.cdiv(n, 64))
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul[grid](a, b, c, BM=64, BN=64, BK=bk, num_warps=4)
    _check(c, _ref(a, b), dtype)
    bt = b.T.contiguous()
    c2 = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul_nt[grid](a, bt, c2, BM=64, BN=64, BK=bk, num_warps=4)
    _check(c2, _ref(a, b), dtype)
    at = a.T.contiguous()
    c3 = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    matmul_tn[grid](at, b, c3, BM=64, BN=64, BK=bk, num_warps=2)
    _check(c3, _ref(a, b), dtype)


@pytest.mark.requires_sm(90)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tiles", [(128, 256, 64, 8), (128, 128, 64, 4), (64, 128, 64, 4)])
def test_matmul_tma_store_epilogue(dtype, tiles):
    """C's rows are 16-byte multiples, so the sm_90a epilogue stores through a swizzled shared tile and TMA;
    the ragged edges (M = 1000, N = 904) are clipped by the TMA, and a C that is a column window of a wider
    tensor is written inside the window only (its neighbours keep their sentinel)."""
    bm, bn, bk, warps = tiles
    m, n, k = 1000, 904, 333
    torch.manual_seed(bm + bn + warps)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    wide = torch.full((m, n + 16), 7.0, device="cuda", dtype=dtype)
    c = wide[:, 8:8 + n]
    c.fill_(float("nan"))
    grid = (tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))
    matmul[grid](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=3)
    assert "window by TMA" in matmul.compile(a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=3,
                                             stop_after="cuda").cuda
    _check(c, _ref(a, b), dtype)
    assert (wide[:, :8] == 7).all() and (wide[:, 8 + n:] == 7).all()


@pytest.mark.requires_sm(90)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("tiles", [(128, 256), (256, 128)], ids=["128x256", "256x128"])
def test_persistent_big_tiles_store_through_panel_buffers(dtype, tiles):
    """Persistent 128x256 / 256x128 tiles keep a 4-deep ring and store C through one or two 128-byte panel
    buffers (not a whole staging tile), program after program; ragged edges clipped by the TMA."""
    bm, bn = tiles
    m, n, k = 1000, 904, 520
    torch.manual_seed(bm + (dtype == torch.float32))
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    grid = (tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))
    options = dict(BM=bm, BN=bn, BK=64, num_warps=8, num_stages=4, persistent=True)
    matmul[grid](a, b, c, **options)
    cuda = matmul.compile(a, b, c, stop_after="cuda", **options).cuda
    assert "window by TMA" in cuda and "tj_prog" in cuda
    if dtype == torch.float32:  # the tensor cores' float32 sums are not IEEE-exact
        assert not torch.isnan(c).any()
        torch.testing.assert_close(c.double(), _ref(a, b), rtol=1e-3, atol=1e-3)
    else:
        _check(c, _ref(a, b), dtype)


@pytest.mark.requires_sm(90)
def test_float32_accumulator_stored_by_tma_twice():
    """An f32 accumulator stored as it is, two windows in a row from one program (the second store waits for
    the first one's reads of the staging tile)."""
    @tilejit.kernel
    def two_stores(A, B, C, D, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        m0 = T.program_id(0) * BM
        n0 = T.program_id(1) * BN
        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, A.shape[1], BK, stages=2):
            acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
        C[m0:m0 + BM, n0:n0 + BN] = acc
        D[m0:m0 + BM, n0:n0 + BN] = acc * 2.0

    m, n, k = 300, 260, 128
    torch.manual_seed(5)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda")
    d = torch.full((m, n), float("nan"), device="cuda")
    two_stores[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 64))](a, b, c, d, BM=128, BN=64, BK=64, num_warps=4)
    assert two_stores.compile(a, b, c, d, BM=128, BN=64, BK=64, num_warps=4,
                              stop_after="cuda").cuda.count("window by TMA") == 2
    ref = _ref(a, b)
    torch.testing.assert_close(c.double(), ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(d.double(), 2 * ref, rtol=1e-3, atol=2e-3)
