"""Warp-specialized wgmma main loops (a producer warpgroup fills the TMA ring) on sm_90a: every operand
major-ness and dtype family, fused epilogues, the grouped-order benchmark kernel, trip counts below the ring
depth, against float64 references on ragged shapes with NaN-poisoned outputs.

Run on an sm_90 GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_warp_specialize.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from gemm_checks import check_benchmark_matmul, check_linear_relu_launches, check_lowp_launch
from kernels import MAJORS as LAYOUTS, bmm_grid3, linear_relu, matmul_any

pytestmark = [pytest.mark.gpu, pytest.mark.sm90a("warp specialization")]



def _specialized(compiled) -> None:
    assert "producer_warpgroup = true" in compiled.asm["ir"]
    assert compiled.threads == 32 * compiled.meta["num_warps"] + 128
    assert "setmaxnreg.inc" in compiled.asm["cuda"] or "tj_setmaxnreg_inc" in compiled.asm["cuda"]


@pytest.mark.parametrize("tile", [(64, 64, 4, 4), (128, 128, 8, 3), (128, 256, 8, 4), (256, 128, 8, 3)],
                         ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("shape", [(1000, 300, 777), (256, 512, 4096), (7, 129, 64), (130, 200, 40)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_majors(dtype, layout, shape, tile):
    m, n, k = shape
    bm, bn, warps, stages = tile
    ta, tb = LAYOUTS[layout]
    torch.manual_seed(m + n + k + 3 * ta + tb)
    a = torch.randn(k, m, device="cuda", dtype=dtype) if ta else torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype) if tb else torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    kw = dict(BM=bm, BN=bn, BK=64, TA=ta, TB=tb, ACC=T.float32, num_warps=warps, num_stages=stages,
              warp_specialize=True)
    compiled = matmul_any.compile(a, b, c, **kw)
    if all(t.stride(0) * t.element_size() % 16 == 0 for t in (a, b)):
        _specialized(compiled)
    else:  # rows TMA cannot address (e.g. 777 halves): the ring is filled by cp.async, never specialized
        assert "producer_warpgroup" not in compiled.asm["ir"]
    matmul_any[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, **kw)
    torch.cuda.synchronize()
    ref = (a.double().T if ta else a.double()) @ (b.double().T if tb else b.double())
    assert not torch.isnan(c).any()
    err = (c.double() - ref).abs().max().item()
    assert err <= 1e-5 * k ** 0.5 * ref.abs().max().item() + 1e-3, err


@pytest.mark.parametrize("shape", [(1000, 300, 784), (256, 512, 1024), (100, 72, 4000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["fp8", "int8", "tf32"])
def test_other_dtypes(kind, shape):
    check_lowp_launch(kind, shape, dict(num_warps=8, num_stages=4, warp_specialize=True), _specialized)


@pytest.mark.parametrize("shape", [(333, 504, 1000), (4096, 1024, 512), (64, 64, 8)], ids=lambda s: "x".join(map(str, s)))
def test_fused_epilogue(shape):
    m, n, k = shape
    torch.manual_seed(k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kw = dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=4)
    _specialized(linear_relu.compile(x, w, bias, y, **kw))
    linear_relu[(tilejit.cdiv(m, 128), tilejit.cdiv(n, 128))](x, w, bias, y, **kw)
    torch.cuda.synchronize()
    ref = torch.relu(x.double() @ w.double() + bias.double())
    assert not torch.isnan(y).any()
    err = (y.double() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item() + 1e-2, err


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1000, 3000, 776), (128, 11008, 4096), (1, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", [(128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4)],
                         ids=lambda c: "x".join(map(str, c)))
def test_benchmark_kernel(shape, config):
    """The grouped-order kernel the benchmarks time (scalar tile-order math before the loop runs on the producer
    warpgroup too), with the launch option."""
    from benchmarks.kernels import matmul

    m, n, k = shape
    bm, bn, bk, warps, stages = config
    torch.manual_seed(m ^ n)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, warp_specialize=True)
    _specialized(matmul.kernel.compile(a, b, c, **kw))
    matmul.kernel[(tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)](a, b, c, **kw)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    assert not torch.isnan(c).any()
    err = (c.double() - ref).abs().max().item()
    assert err <= 2e-3 * ref.abs().max().item() + 1e-2, err


def test_autotuned_config():
    """A Config with warp_specialize=True reaches the compile (and its record key)."""
    from benchmarks.kernels import matmul

    cfgs = [tilejit.Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=4, warp_specialize=True),
            tilejit.Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=4)]
    tuner = tilejit.autotune(configs=cfgs, key=["A", "B"])(matmul.kernel)
    m, n, k = 1024, 768, 512
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    tuner[lambda meta: (tilejit.cdiv(m, meta["BM"]) * tilejit.cdiv(n, meta["BN"]),)](a, b, c)
    torch.cuda.synchronize()
    assert len(tuner.stats.timed) == 2
    err = (c.double() - a.double() @ b.double()).abs().max().item()
    assert err <= 2e-3 * 64 + 1e-2, err


# -- persistent kernels: one program per SM walking the grid ---------------------------------------------------

@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1000, 3000, 776), (128, 11008, 4096), (8192, 8192, 1024),
                                   (64, 64, 64), (3000, 200, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", [(128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4)],
                         ids=lambda c: "x".join(map(str, c)))
def test_persistent_benchmark_kernel(shape, config):
    """More programs than SMs (each persistent one runs several), fewer, and one; the grouped order's scalar math
    runs per program in both the producer's walk and the math warps'."""
    from benchmarks.kernels import matmul

    m, n, k = shape
    bm, bn, bk, warps, stages = config
    torch.manual_seed(m + 3 * n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, persistent=True)
    compiled = matmul.kernel.compile(a, b, c, **kw)
    _specialized(compiled)
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    assert f"tj_prog += {programs})" in compiled.asm["cuda"]
    matmul.kernel[(tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)](a, b, c, **kw)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    assert not torch.isnan(c).any()
    err = (c.double() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item() + 1e-2, err


@pytest.mark.parametrize("batch,m,n,k", [(3, 1000, 520, 264), (40, 256, 256, 128)])
def test_persistent_3d_grid(batch, m, n, k):
    torch.manual_seed(batch + m)
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(batch, k, n, device="cuda", dtype=torch.float16)
    c = torch.full((batch, m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=3, persistent=True)
    compiled = bmm_grid3.compile(a, b, c, **kw)
    assert "tj_first" in compiled.asm["cuda"]
    bmm_grid3[(tilejit.cdiv(n, 128), tilejit.cdiv(m, 128), batch)](a, b, c, **kw)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    assert not torch.isnan(c).any()
    err = (c.double() - ref).abs().max().item()
    assert err <= 2e-3 * ref.abs().max().item() + 1e-2, err


def test_persistent_fused_epilogue_and_repeated_launches():
    """The same persistent kernel launched many times back to back (the ring's barriers start afresh each launch)."""
    check_linear_relu_launches((2000, 1000, 1000), dict(num_warps=8, num_stages=4, persistent=True), _specialized)


def _deep_ring_configs():
    from tilejit.configs import matmul_configs

    return [c for c in matmul_configs() if c.num_stages > 4 and (c.warp_specialize or c.persistent)]


@pytest.mark.parametrize("config", _deep_ring_configs(), ids=lambda c: c.identity.replace(" ", ""))
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (128, 4104, 776), (16, 3000, 2056), (1, 520, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_default_deep_rings(dtype, shape, config):
    """The default space's deep rings (6 to 12 stages, 192 KB of shared memory): K shorter than the ring, K not a
    multiple of BK, a single row, grids smaller and larger than the GPU."""
    def check(compiled):
        _specialized(compiled)
        assert compiled.meta["spills"] == 0 and compiled.shared_bytes <= 227 * 1024

    check_benchmark_matmul(dtype, shape, config.all_kwargs(), check)
