"""2-CTA clusters with TMA multicast on sm_90a (the ``cluster=2`` launch option): the two programs of a cluster
along x load a ring tile whose window they share once, into both, each issuing half of its panels. Checked
against float64 references (int64 for int8) on ragged shapes with NaN-poisoned outputs: grids whose x extent is
even (clusters) and odd (launched without), windows shared statically (the DESIGN matmul's B, a 3-D grid's A)
and at run time only (a grouped launch order: most pairs share B, the pairs across a group's edge do not),
warp-specialized, persistent and pingpong kernels, every dtype family, attention, and many launches back to back.

Run on an sm_90 GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_cluster.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
from gemm_checks import check_close, check_linear_relu_launches, check_lowp_launch
from kernels import bmm_grid3, matmul_staged as matmul

pytestmark = [pytest.mark.gpu, pytest.mark.sm90a("TMA multicast clusters")]

MODES = {"ws": {}, "persistent": {"persistent": True}, "pingpong": {"pingpong": True}}



def _clustered(compiled) -> None:
    assert compiled.meta["cluster"] == 2, compiled.meta
    assert compiled.meta["spills"] == 0 and not compiled.meta["wgmma_serialized"], compiled.meta
    assert "tj_tma_load_2d_mc(" in compiled.asm["cuda"] or "tj_tma_load_3d_mc(" in compiled.asm["cuda"]


def _tiles(mode):
    return (128, 128, 64, 4, 4) if mode == "pingpong" else (128, 256, 64, 8, 4)


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1000, 3000, 776), (1100, 520, 320), (128, 11008, 4096),
                                   (200, 136, 8), (2000, 4000, 200)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_design_matmul(dtype, mode, shape):
    """2-D grid, pid 0 along M: B is the same in both programs of a pair (multicast at every launch where the
    grid's x extent is even; 1100 rows give 9 row blocks, odd: no clusters)."""
    m, n, k = shape
    bm, bn, bk, warps, stages = _tiles(mode)
    torch.manual_seed(m + 7 * n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, cluster=2, **MODES[mode])
    if k >= bk:
        _clustered(matmul.compile(a, b, c, **kw))
    matmul[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double())


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1000, 3000, 776), (3000, 1000, 1000), (64, 64, 64),
                                   (8192, 2048, 1024)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mode", list(MODES))
def test_grouped_order(mode, shape):
    """The benchmark kernel's grouped order (1-D grid): whether a pair shares B is decided at run time per program
    (both compute the other's window); 64x64 is one program (an odd grid)."""
    from benchmarks.kernels import matmul as tuned

    m, n, k = shape
    bm, bn, bk, warps, stages = _tiles(mode)
    torch.manual_seed(m + 3 * n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, cluster=2, **MODES[mode])
    compiled = tuned.kernel.compile(a, b, c, **kw)
    _clustered(compiled)
    assert "tj_mine0" in compiled.asm["cuda"]  # the windows are compared with the other program's
    tuned.kernel[(tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double())


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("batch,m,n,k", [(3, 1000, 520, 264), (41, 256, 512, 128)])
def test_3d_grid_shares_a(mode, batch, m, n, k):
    """pid 0 along N: A is the tile the pair shares."""
    torch.manual_seed(batch + m)
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(batch, k, n, device="cuda", dtype=torch.float16)
    c = torch.full((batch, m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = dict(BM=128, BN=128, BK=64, num_warps=4, num_stages=4, cluster=2, **MODES[mode])
    _clustered(bmm_grid3.compile(a, b, c, **kw))
    bmm_grid3[(tilejit.cdiv(n, 128), tilejit.cdiv(m, 128), batch)](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double(), rel=2e-3)


@pytest.mark.parametrize("mode", list(MODES))
def test_fused_epilogue_and_repeated_launches(mode):
    check_linear_relu_launches((2048, 1000, 1000), dict(num_warps=4, num_stages=4, cluster=2, **MODES[mode]),
                               _clustered)


@pytest.mark.parametrize("shape", [(1000, 300, 784), (4096, 2048, 1024), (100, 72, 4000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["fp8", "int8", "tf32"])
@pytest.mark.parametrize("mode", ["ws", "persistent"])
def test_other_dtypes(mode, kind, shape):
    # One warpgroup owning all 128 rows of a warp-specialized fp8 tile has no registers left for the precise mode's
    # promotion temporaries (it spills; the autotune space leaves that config out of precise fp8, see
    # configs.promotion_fits): the clusters are checked on the fast loop there. test_gpu_fp8_precision checks the
    # precise loop's forms.
    fast = dict(PRECISION="fast") if kind == "fp8" and mode == "ws" else {}
    check_lowp_launch(kind, shape, dict(num_warps=4, num_stages=4, cluster=2, **MODES[mode], **fast), _clustered)


@pytest.mark.parametrize("causal", [False, True])
def test_attention(causal):
    """The attention forward's key/value tiles depend on the batch and head (program 1), not on the query block:
    the pair loads them once. Causal: the loop's bound depends on the query block, so no clusters."""
    from attention_checks import check, inputs

    from tilejit.ops import fused_attention as attention
    q, k, v = inputs(2, 4, 1000, 128, 2, seed=11 + causal)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=128, BN=128, num_warps=8, warp_specialize=True,
                        STAGES=2, cluster=2)
    check(out, attention.reference(q, k, v, causal))
