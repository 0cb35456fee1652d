"""MN-major tf32 operands on sm_90a wgmma read into registers as the instruction's A (``lower_wgmma_mn``): the DESIGN
matmul in float32 with B given K x N (computed transposed, C^T = B^T A^T), A given K x M (with B given N x K),
each loop form (plain ring, warp-specialized, persistent), ragged shapes with and without
TMA-aligned rows, NaN-poisoned outputs, against float64 references of the tf32-truncated inputs. Each test checks
that the kernel it ran took the register form and no mma.sync, so it tests the path it is named for.

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
