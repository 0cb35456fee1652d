"""MN-major tf32 operands on sm_90a wgmma read into registers as the instruction's A (``lower_wgmma_mn``): the DESIGN
matmul in float32 with B given K x N (computed transposed, C^T = B^T A^T), A given K x M (with B given N x K),
each loop form (plain ring, warp-specialized, persistent), ragged shapes with and without
TMA-aligned rows, NaN-poisoned outputs, against float64 references of the tf32-truncated inputs. Each test checks
that the kernel it ran took the register form and no mma.sync, so it tests the path it is named for. The same for
fp8 (e4m3 / e5m2, precision "precise" and "fast") and int8 (``lower_wgmma_mn8``: the fragment gathered by ldmatrix.trans,
byte permutes and shuffles), against float64 references (int8 exactly).

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_mn_major.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import matmul, matmul_any, matmul_staged

pytestmark = pytest.mark.gpu

# ragged against every tile: rows of 1531 floats are not 16-byte multiples (no TMA: cp.async fills the ring), rows of
# 1000 / 1040 floats are
SHAPES = [(1000, 777, 1531), (1000, 1040, 1000), (80, 400, 4096)]
FORMS = {"ring": {}, "ws": {"warp_specialize": True}, "persistent": {"persistent": True}}
# (BM, BN, BK, warps): two warpgroups with two and one slabs of the instruction's M, one warpgroup
TILES = [(128, 256, 32, 8), (256, 128, 32, 8), (128, 128, 32, 4)]


def _sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the register form feeds wgmma, an sm_90a instruction")


def _tf32(x: torch.Tensor) -> torch.Tensor:
    return (x.contiguous().view(torch.int32) & -8192).view(torch.float32)


def _check(c, am, bm_):
    """tf32: the product of truncated inputs, to float32 summation error (as in test_gpu_dtypes)."""
    assert not c.isnan().any(), "some outputs were never written"
    ref = _tf32(am).double() @ _tf32(bm_).double()
    bound = (am.double().abs() @ bm_.double().abs()) * 2.0 ** -15 + 1e-6
    err = (c.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}"


def _took_register_form(kernel, *args, **kwargs):
    compiled = kernel.compile(*args, **kwargs)
    assert "wgmma_mn_m64nNk8_tf32" in compiled.asm["ir"], "the kernel did not take the register form"
    assert "mma.sync.aligned" not in compiled.asm["ptx"]
    return compiled


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("tile", TILES, ids=lambda t: "{}x{}x{}-w{}".format(*t))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_design_matmul_with_b_given_k_by_n(shape, tile, form):
    _sm90()
    m, n, k = shape
    bm, bn, bk, warps = tile
    torch.manual_seed(m + 3 * n + 7 * k)
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.full((m, n), float("nan"), device="cuda")
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=3, **FORMS[form])
    matmul[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, **kw)
    torch.cuda.synchronize()
    compiled = _took_register_form(matmul, a, b, c, **kw)
    assert "transpose_copy" not in compiled.asm["ir"]
    _check(c, a, b)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(map(str, s)))
def test_a_given_k_by_m(shape, form):
    """A given K x M (transpose_a), B given N x K: A read into registers without swapping, no copy. (Both operands
    MN-major take two transposing copies: test_gpu_transpose_copy.py.)"""
    _sm90()
    m, n, k = shape
    torch.manual_seed(m + n + k)
    a, b = torch.randn(k, m, device="cuda"), torch.randn(n, k, device="cuda")
    c = torch.full((m, n), float("nan"), device="cuda")
    kw = dict(BM=128, BN=256, BK=32, TA=True, TB=True, ACC=T.float32, PRECISION="tf32", num_warps=8, num_stages=3,
              **FORMS[form])
    matmul_any[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))](a, b, c, **kw)
    torch.cuda.synchronize()
    compiled = _took_register_form(matmul_any, a, b, c, **kw)
    assert "transpose_copy" not in compiled.asm["ir"]
    _check(c, a.T, b.T)


@pytest.mark.parametrize("views", ["a", "b", "both"])
def test_transposed_views(views):
    """The DESIGN matmul on ``.T`` views of stored-transposed tensors: staged into the same tiles, same product."""
    _sm90()
    m, n, k = 1000, 777, 1531
    torch.manual_seed(len(views))
    a = torch.randn(k, m, device="cuda").T if views in ("a", "both") else torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda").T if views in ("b", "both") else torch.randn(k, n, device="cuda")
    c = torch.full((m, n), float("nan"), device="cuda")
    matmul[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))](a, b, c, BM=128, BN=256, BK=32, num_warps=8)
    torch.cuda.synchronize()
    _check(c, a, b)


def test_agrees_with_the_transposing_copy(monkeypatch):
    """The register form and the transposing copy (pinned) on the same inputs: both within the tf32 bound."""
    _sm90()
    m, n, k = 1000, 1040, 1000
    torch.manual_seed(2)
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    for pin in (None, "wgmma_m64nNk8_tf32"):
        if pin:
            monkeypatch.setenv("TILEJIT_GEMM_LOWERING", pin)
        c = torch.full((m, n), float("nan"), device="cuda")
        matmul[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))](a, b, c, BM=128, BN=256, BK=32, num_warps=8)
        torch.cuda.synchronize()
        ir = matmul.compile(a, b, c, BM=128, BN=256, BK=32, num_warps=8).asm["ir"]
        assert ("transpose_copy" in ir) == (pin is not None)
        _check(c, a, b)


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_unpipelined_and_other_ring_depths(stages):
    """One stage (the gemm commits one group and completes in its iteration) and rings of 2 and 4 slots (left in
    flight: one group per instruction, each waited for before its registers are loaded again)."""
    _sm90()
    m, n, k = 333, 520, 1000
    torch.manual_seed(stages)
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.full((m, n), float("nan"), device="cuda")
    kw = dict(BM=128, BN=256, BK=32, num_warps=8, num_stages=stages)
    matmul_staged[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 256))](a, b, c, **kw)
    torch.cuda.synchronize()
    _took_register_form(matmul_staged, a, b, c, **kw)
    _check(c, a, b)


# 8-bit: rows of 16-byte multiples (TMA), ragged against every tile
LOWP_SHAPES = [(1000, 1040, 1008), (80, 400, 4096)]
LOWP = {"e4m3-precise": (torch.float8_e4m3fn, None), "e5m2-fast": (torch.float8_e5m2, "fast"),
        "e4m3-fast": (torch.float8_e4m3fn, "fast"), "int8": (torch.int8, None)}
# (BM, BN, BK, warps): the swapped instruction's M is BN: two warpgroups with two and one slabs, one warpgroup with
# four slabs (half-panel steps), one 64-byte row
LOWP_TILES = [(128, 256, 128, 8), (128, 128, 128, 8), (64, 256, 128, 4), (128, 64, 64, 4)]


def _lowp(rows: int, cols: int, dtype):
    """Random operands: int8 over its range, float8 from a normal distribution (scaled into e4m3's range)."""
    if dtype == torch.int8:
        return torch.randint(-128, 128, (rows, cols), device="cuda", dtype=torch.int8)
    return (torch.randn(rows, cols, device="cuda") * 4).to(dtype)


def _lowp_run(a, b, m, n, dtype, precision, ta, tile, **options):
    """C (NaN- or sentinel-poisoned) = op(A) @ op(B) through ``matmul_any``; asserts the gathered form ran."""
    bm, bn, bk, warps = tile
    integer = dtype == torch.int8
    c = torch.full((m, n), -(2 ** 31), dtype=torch.int32, device="cuda") if integer else \
        torch.full((m, n), float("nan"), device="cuda")
    kw = dict(BM=bm, BN=bn, BK=bk, TA=ta, TB=ta, ACC=T.int32 if integer else T.float32, PRECISION=precision,
              num_warps=warps, **options)
    matmul_any[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, **kw)
    torch.cuda.synchronize()
    return c, matmul_any.compile(a, b, c, **kw).asm["ir"]


def _lowp_check(c, am, bm_):
    """int8: exact. fp8: the products of the fp8 values are exact; the tensor cores' sums keep fewer bits than
    float32 (within each promoted chunk of 128 products for "precise"), so the bound is relative to sum |a||b|,
    far below what a misplaced fragment byte produces (as test_gpu_dtypes)."""
    ref = am.double() @ bm_.double()
    if c.dtype == torch.int32:
        assert (c != -(2 ** 31)).all(), "some outputs were never written"
        assert torch.equal(c.double(), ref), f"max error {(c.double() - ref).abs().max().item():.3g}"
        return
    assert not c.isnan().any(), "some outputs were never written"
    bound = (am.double().abs() @ bm_.double().abs()) * 2.0 ** -7 + 1e-3
    err = (c.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}"


@pytest.mark.parametrize("dtype", ["e4m3-precise", "e5m2-fast", "int8"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("tile", LOWP_TILES, ids=lambda t: "{}x{}x{}-w{}".format(*t))
@pytest.mark.parametrize("shape", LOWP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_8bit_with_b_given_k_by_n(shape, tile, form, dtype):
    _sm90()
    m, n, k = shape
    dt, precision = LOWP[dtype]
    torch.manual_seed(m + 3 * n + 7 * k + tile[1])
    a, b = _lowp(m, k, dt), _lowp(k, n, dt)
    c, ir = _lowp_run(a, b, m, n, dt, precision, False, tile, num_stages=3, **FORMS[form])
    assert "wgmma_mn_m64nNk32" in ir and "transpose_copy" not in ir
    _lowp_check(c, a, b)


@pytest.mark.parametrize("dtype", LOWP)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("tile", [(128, 256, 128, 8), (64, 128, 128, 4)], ids=lambda t: "{}x{}x{}-w{}".format(*t))
def test_8bit_with_a_given_k_by_m(tile, form, dtype):
    """A given K x M, B given N x K: A gathered without swapping (the 128x256 precise tile in two 64-column bands
    per 64x128 chunk)."""
    _sm90()
    m, n, k = 1040, 1000, 1008
    dt, precision = LOWP[dtype]
    torch.manual_seed(tile[0] + len(form))
    a, b = _lowp(k, m, dt), _lowp(n, k, dt)
    c, ir = _lowp_run(a, b, m, n, dt, precision, True, tile, num_stages=3, **FORMS[form])
    assert "wgmma_mn_m64nNk32" in ir and "transpose_copy" not in ir
    _lowp_check(c, a.T, b.T)


@pytest.mark.parametrize("dtype", ["e4m3-fast", "int8"])
def test_8bit_pingpong(dtype):
    """Pingpong groups of one slab of M (64x256 on 4 warps) gather; 128x128 groups keep the copy."""
    _sm90()
    m, n, k = 1000, 1040, 1008
    dt, precision = LOWP[dtype]
    torch.manual_seed(5)
    a, b = _lowp(m, k, dt), _lowp(k, n, dt)
    for tile, gathered in (((64, 256, 128, 4), True), ((128, 128, 128, 4), False)):
        c, ir = _lowp_run(a, b, m, n, dt, precision, False, tile, num_stages=4, pingpong=True)
        assert ("wgmma_mn_m64nNk32" in ir) == gathered and ("transpose_copy" in ir) != gathered
        _lowp_check(c, a, b)


@pytest.mark.parametrize("dtype", ["e4m3-precise", "int8"])
def test_8bit_agrees_with_the_transposing_copy(monkeypatch, dtype):
    """The gathered form and the copy (pinned) on the same inputs: int8 equal, fp8 both within the bound."""
    _sm90()
    m, n, k = 1000, 1040, 1008
    dt, precision = LOWP[dtype]
    torch.manual_seed(3)
    a, b = _lowp(m, k, dt), _lowp(k, n, dt)
    results = []
    for pin in (None, "wgmma_m64nNk32_int8" if dt == torch.int8 else "wgmma_m64nNk32_fp8"):
        if pin:
            monkeypatch.setenv("TILEJIT_GEMM_LOWERING", pin)
        c, ir = _lowp_run(a, b, m, n, dt, precision, False, (128, 256, 128, 8), num_stages=3)
        assert ("transpose_copy" in ir) == (pin is not None)
        _lowp_check(c, a, b)
        results.append(c)
    if dt == torch.int8:
        assert torch.equal(results[0], results[1])
