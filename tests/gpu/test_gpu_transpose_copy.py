"""MN-major fp8, int8 and tf32 operands on wgmma through the transposing shared-memory copy (sm_90a; with the
descriptor lowering pinned, since by default one MN-major operand is gathered into registers, test_gpu_mn_major.py):
every
operand major-ness, each loop form (plain in-flight ring, warp-specialized, persistent, unpipelined), ragged shapes,
NaN-poisoned outputs, against float64 (int64 for int8) references. Each test also checks that the kernel it ran
holds a ``transpose_copy`` and no mma.sync, so it tests the path it is named for.

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_transpose_copy.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import fixed_b, matmul_any, matmul_staged

pytestmark = pytest.mark.gpu

LAYOUTS = {"nn": (False, False), "tn": (True, False), "tt": (True, True)}
# ragged against every tile, row strides multiples of 16 bytes (TMA); test_rows_not_tma_aligned... covers the rest
SHAPES = [(1000, 784, 1040), (128, 256, 384), (80, 400, 4096)]
# launch options of each loop form
FORMS = {"ring": {}, "ws": {"warp_specialize": True}, "persistent": {"persistent": True}}


def _sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the transposing copy feeds wgmma, an sm_90a instruction")


def _operands(m, n, k, ta, tb, make):
    a = make(k, m) if ta else make(m, k)
    b = make(n, k) if tb else make(k, n)
    return a, b, (a.T if ta else a), (b.T if tb else b)


def _launch(kernel, a, b, c, m, n, tile, **kwargs):
    bm, bn, bk, warps = tile
    grid = (tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))
    kernel[grid](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps, **kwargs)
    torch.cuda.synchronize()
    compiled = kernel.compile(a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps, **kwargs)
    assert "transpose_copy" in compiled.asm["ir"], "the kernel did not take the transposing copy"
    assert "mma.sync.aligned" not in compiled.asm["ptx"]


def _fp8(*shape):
    return (torch.randn(*shape, device="cuda") * 2).to(torch.float8_e4m3fn)


def _int8(*shape):
    return torch.randint(-128, 128, shape, device="cuda", dtype=torch.int8)


def _f32(*shape):
    return torch.randn(*shape, device="cuda")


def _tf32(x: torch.Tensor) -> torch.Tensor:
    return (x.contiguous().view(torch.int32) & -8192).view(torch.float32)


def _check(dtype, c, am, bm_):
    if dtype == torch.int8:
        assert torch.equal(c.cpu().long(), am.cpu().long() @ bm_.cpu().long())
        return
    assert not c.isnan().any(), "some outputs were never written"
    if dtype == torch.float32:  # tf32: the product of truncated inputs, to float32 summation error
        ref = _tf32(am).double() @ _tf32(bm_).double()
        bound = (am.double().abs() @ bm_.double().abs()) * 2.0 ** -15 + 1e-6
    else:
        ref = am.double() @ bm_.double()
        bound = (am.double().abs() @ bm_.double().abs()) * 2.0 ** -7 + 1e-3
    err = (c.double() - ref).abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g}"


#: the descriptor lowerings, pinned: they take the copy (by default one MN-major operand is gathered into registers:
#: lower_wgmma_mn, lower_wgmma_mn8)
COPIED = {"fp8": "wgmma_m64nNk32_fp8", "int8": "wgmma_m64nNk32_int8", "tf32": "wgmma_m64nNk8_tf32"}
DTYPES = {"fp8": (torch.float8_e4m3fn, _fp8, 128), "int8": (torch.int8, _int8, 128), "tf32": (torch.float32, _f32, 32)}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("tile", [(128, 128, 8), (128, 256, 8), (64, 128, 4)], ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", DTYPES)
def test_mn_major_operands_on_wgmma(name, shape, layout, tile, form, monkeypatch):
    _sm90()
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", COPIED[name])
    dtype, make, bk = DTYPES[name]
    m, n, k = shape
    ta, tb = LAYOUTS[layout]
    torch.manual_seed(m + 3 * n + 7 * k)
    a, b, am, bm_ = _operands(m, n, k, ta, tb, make)
    out = torch.int32 if dtype == torch.int8 else torch.float32
    c = torch.full((m, n), -(2 ** 31) if out == torch.int32 else float("nan"), device="cuda", dtype=out)
    extra = dict(PRECISION="tf32") if dtype == torch.float32 else {}
    acc = T.int32 if dtype == torch.int8 else T.float32
    _launch(matmul_any, a, b, c, m, n, (tile[0], tile[1], bk, tile[2]), TA=ta, TB=tb, ACC=acc, **extra,
            **FORMS[form])
    _check(dtype, c, am, bm_)


@pytest.mark.parametrize("stages", [1, 4])
@pytest.mark.parametrize("name", ["fp8", "tf32"])
def test_unpipelined_and_deep_rings(name, stages, monkeypatch):
    """One stage (the copy waits for the previous gemm's readers with a barrier) and a 4-deep TMA ring."""
    _sm90()
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", COPIED[name])
    dtype, make, bk = DTYPES[name]
    m, n, k = 333, 520, 1000
    torch.manual_seed(stages)
    a, b = make(m, k), make(k, n)
    c = torch.full((m, n), float("nan"), device="cuda")
    _launch(matmul_staged, a, b, c, m, n, (128, 128, bk, 8), num_stages=stages)
    _check(dtype, c, a, b)


def test_rows_not_tma_aligned_take_the_per_thread_copy(monkeypatch):
    """B given K x N with N * 1 byte not a multiple of 16: cp.async fills the staging ring (no TMA), the loop's
    wgmma is not left in flight, and the transposing copy keeps one tile with barriers around it."""
    _sm90()
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", COPIED["fp8"])
    m, n, k = 256, 200, 512
    torch.manual_seed(5)
    a, b = _fp8(m, k), _fp8(k, n)
    c = torch.full((m, n), float("nan"), device="cuda")
    _launch(matmul_any, a, b, c, m, n, (128, 64, 128, 4), TA=False, TB=False, ACC=T.float32)
    _check(torch.float8_e4m3fn, c, a, b)


def test_a_tile_loaded_before_the_loop_is_transposed_once(monkeypatch):
    """B (K x N) loaded once before a loop over row blocks; its transposing copy runs there, before the loop."""
    _sm90()
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", COPIED["fp8"])
    torch.manual_seed(11)
    a, d = _fp8(384, 128), _fp8(384, 128)
    b = _fp8(128, 128)
    c = torch.full((128, 128), float("nan"), device="cuda")
    fixed_b[(1,)](a, b, c, d, BM=128, BN=128, BK=128, num_warps=8)
    torch.cuda.synchronize()
    ref = sum(a[r:r + 128].double() @ b.double() + d[r:r + 128].double() @ b.double() for r in range(0, 384, 128))
    bound = sum((a[r:r + 128].double().abs() + d[r:r + 128].double().abs()) @ b.double().abs()
                for r in range(0, 384, 128)) * 2.0 ** -7 + 1e-3
    assert not c.isnan().any() and ((c.double() - ref).abs() <= bound).all()
