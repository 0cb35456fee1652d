"""Pingpong kernels on sm_90a: a persistent block with two groups of math warps, each running every other program
of the walk from one TMA ring the producer warpgroup fills in the walk's order. Checked against float64
references (int64 for int8) on ragged shapes with NaN-poisoned outputs: more and fewer programs than SMs (a group
with no program, a group with one more than the other), per-program trip counts that differ (zero included), a 3-D
grid, fused epilogues, every dtype family, and many launches back to back.

Run on an sm_90 GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_pingpong.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from gemm_checks import check_close, check_linear_relu_launches, check_lowp_launch
from kernels import bmm_grid3

pytestmark = [pytest.mark.gpu, pytest.mark.sm90a("pingpong kernels")]



def _pingpong(compiled) -> None:
    """Two groups of num_warps math warps and the producer warpgroup, no spills, no serialized wgmma."""
    assert compiled.meta["groups"] == 2, compiled.meta
    assert compiled.threads == 2 * 32 * compiled.meta["num_warps"] + 128
    assert compiled.meta["spills"] == 0 and not compiled.meta["wgmma_serialized"], compiled.meta
    programs = torch.cuda.get_device_properties(0).multi_processor_count
    assert f"tj_prog += {2 * programs})" in compiled.asm["cuda"]


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1000, 3000, 776), (128, 11008, 4096), (8192, 2048, 1024),
                                   (64, 64, 64), (200, 130, 8), (2000, 4000, 200)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("config", [(128, 128, 64, 4, 4), (128, 128, 64, 4, 5), (64, 256, 64, 4, 4),
                                    (128, 64, 64, 4, 6)],
                         ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_benchmark_kernel(dtype, shape, config):
    """The grouped-order DESIGN matmul: 1 program (a group runs none), odd and even program counts per block,
    K below one step, many programs per block."""
    from benchmarks.kernels import matmul

    m, n, k = shape
    bm, bn, bk, warps, stages = config
    torch.manual_seed(m + 3 * n + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    kw = dict(BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages, pingpong=True)
    compiled = matmul.kernel.compile(a, b, c, **kw)
    if k >= bk:
        _pingpong(compiled)
    else:  # K under one step: the pipeline is not TMA-fed, so the kernel runs as a plain one
        assert compiled.meta["groups"] == 1
    matmul.kernel[(tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double())


@tilejit.kernel
def mm_prefix(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Row block i sums the first (i % 5) * 3 * BK columns of K only (none for i % 5 == 0): each program's trip
    count differs from its neighbours', so a group skips a varying number of the other group's ring slots."""
    M, K = A.shape
    N = B.shape[1]
    pm = T.program_id(0) // T.cdiv(N, BN)
    m0 = pm * BM
    n0 = (T.program_id(0) % T.cdiv(N, BN)) * BN
    k_end = min(K, (pm % 5) * 3 * BK)
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, k_end, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@pytest.mark.parametrize("shape", [(3000, 1000, 1000), (640, 384, 200), (20000, 128, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_trip_counts_differ_per_program(shape):
    m, n, k = shape
    torch.manual_seed(m + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = dict(BM=128, BN=128, BK=64, num_warps=4, num_stages=4, pingpong=True)
    _pingpong(mm_prefix.compile(a, b, c, **kw))
    mm_prefix[(tilejit.cdiv(m, 128) * tilejit.cdiv(n, 128),)](a, b, c, **kw)
    torch.cuda.synchronize()
    ref = torch.empty(m, n, dtype=torch.float64)
    ad, bd = a.double().cpu(), b.double().cpu()
    for i in range(tilejit.cdiv(m, 128)):
        k_end = min(k, (i % 5) * 3 * 64)
        ref[i * 128:(i + 1) * 128] = ad[i * 128:(i + 1) * 128, :k_end] @ bd[:k_end]
    check_close(c.cpu(), ref)


@pytest.mark.parametrize("batch,m,n,k", [(3, 1000, 520, 264), (41, 256, 256, 128)])
def test_3d_grid(batch, m, n, k):
    torch.manual_seed(batch + m)
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(batch, k, n, device="cuda", dtype=torch.float16)
    c = torch.full((batch, m, n), float("nan"), device="cuda", dtype=torch.float16)
    kw = dict(BM=128, BN=128, BK=64, num_warps=4, num_stages=4, pingpong=True)
    _pingpong(bmm_grid3.compile(a, b, c, **kw))
    bmm_grid3[(tilejit.cdiv(n, 128), tilejit.cdiv(m, 128), batch)](a, b, c, **kw)
    torch.cuda.synchronize()
    check_close(c, a.double() @ b.double(), rel=2e-3)


def test_fused_epilogue_and_repeated_launches():
    """The same kernel launched many times back to back: the ring's barriers and each group's count start afresh."""
    check_linear_relu_launches((2000, 1000, 1000), dict(num_warps=4, num_stages=4, pingpong=True), _pingpong)


@pytest.mark.parametrize("shape", [(1000, 300, 784), (4096, 2048, 1024), (100, 72, 4000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["fp8", "int8", "tf32"])
def test_other_dtypes(kind, shape):
    """A @ Bt.T with Bt given N x K (K-major, as 8- and 32-bit wgmma read it)."""
    check_lowp_launch(kind, shape, dict(num_warps=4, num_stages=4, pingpong=True), _pingpong)


def test_autotuned_pingpong_config():
    """A pingpong Config in an autotune space is timed and, when chosen, launched through the tuned path."""
    from benchmarks.kernels import matmul_grid
    from tilejit.autotuner import Config

    configs = [Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=4, num_stages=4, pingpong=True),
               Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=4, num_stages=4, persistent=True)]
    from benchmarks.kernels import matmul

    tuned = tilejit.autotune(configs=configs, key=["A", "B"])(tilejit.kernel(matmul.fn))
    m, n, k = 1500, 2500, 512
    torch.manual_seed(3)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    tuned[matmul_grid](a, b, c)
    c.fill_(float("nan"))
    tuned[matmul_grid](a, b, c)
    torch.cuda.synchronize()
    assert len(tuned.stats.timed) == 2
    check_close(c, a.double() @ b.double())
