"""Split-K on the GPU (the ``split_k`` launch option; passes/split_k.py): the K loop of each output tile cut over
a thread-block cluster, partial accumulators summed in distributed shared memory, the epilogue run once.

Against float64 references (int64 for int8) on fresh random inputs with NaN-poisoned outputs, on shapes that are
not multiples of the tiles, including K shorter than the splits (programs with no K steps), every split 2..8,
the wgmma and mma.sync lowerings, a batched kernel with a fused non-linear epilogue (``program_id(2)`` and the
epilogue must see the full sum), bitwise determinism, and the autotuned benchmark kernel on LLM decode shapes.

Run on a machine with an sm_90+ GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_split_k.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import bmm_epilogue, matmul, matmul_any

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_clusters():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("split-K runs on thread-block clusters (sm_90+)")


def _check(c, ref, k, dtype):
    assert not torch.isnan(c.float()).any(), "unwritten output elements"
    err = (c.double() - ref).abs().max().item()
    # inputs are exact in the operand dtype; f32 accumulation error grows ~sqrt(K); the output rounds once
    out_ulp = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7, torch.float32: 2 ** -20}[dtype]
    bound = ref.abs().max().item() * out_ulp + 1e-5 * k ** 0.5 * ref.abs().max().item() + 1e-3
    assert err <= bound, (err, bound)


@pytest.mark.parametrize("splits", [2, 3, 4, 8])
@pytest.mark.parametrize("shape", [(1, 8, 16), (77, 300, 1000), (128, 512, 4096), (200, 136, 777)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("tile", [(64, 64, 64, 4), (128, 128, 64, 8), (64, 64, 32, 4)],
                         ids=["wgmma64", "wgmma128", "mma_sync"])
def test_design_matmul_split_k_matches_float64(tile, shape, splits):
    m, n, k = shape
    bm, bn, bk, warps = tile
    torch.manual_seed(m + 3 * n + 7 * k + splits)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    matmul[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=warps,
                                                       num_stages=3, split_k=splits)
    torch.cuda.synchronize()
    _check(c, a.double() @ b.double(), k, torch.bfloat16)


def test_results_are_bitwise_deterministic():
    torch.manual_seed(1)
    a = torch.randn(96, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 1000, device="cuda", dtype=torch.float16)
    outs = []
    for _ in range(3):
        c = torch.full((96, 1000), float("nan"), device="cuda", dtype=torch.float32)
        matmul[(2, 16)](a, b, c, BM=64, BN=64, BK=64, num_warps=4, split_k=8)
        outs.append(c)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    _check(outs[0], a.double() @ b.double(), 4096, torch.float32)


def test_int8_with_int32_accumulators_is_exact():
    torch.manual_seed(2)
    m, n, k = 100, 200, 3000
    a = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
    b = torch.randint(-128, 128, (k, n), device="cuda", dtype=torch.int8)
    c = torch.full((m, n), -(2 ** 31), device="cuda", dtype=torch.int32)
    matmul_any[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64))](a, b, c, BM=64, BN=64, BK=128, TA=False, TB=False,
                                                          ACC=T.int32, num_warps=4, split_k=3)
    torch.cuda.synchronize()
    assert torch.equal(c.long(), (a.double() @ b.double()).long())  # exact: |sums| < 2^53 (CUDA has no int64 mm)


def test_batched_fused_epilogue_sees_the_full_sum():
    """relu(scale * A[b] @ B[b] + bias): wrong if any program ran the epilogue on its partial sum, or if
    program_id(2) (the batch) were mixed up with the split index."""
    torch.manual_seed(3)
    nb, m, n, k = 3, 100, 200, 900
    a = torch.randn(nb, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(nb, k, n, device="cuda", dtype=torch.float16)
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    c = torch.full((nb, m, n), float("nan"), device="cuda", dtype=torch.float16)
    bmm_epilogue[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64), nb)](a, b, bias, c, 0.5, BM=64, BN=64, BK=64,
                                                                num_warps=4, split_k=4)
    torch.cuda.synchronize()
    ref = torch.relu(0.5 * (a.double() @ b.double()) + bias.double()[None, None, :])
    _check(c, ref, k, torch.float16)


def test_a_grid_too_tall_for_its_split_is_a_launch_error():
    a = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    c = torch.empty(3, 64, 64, device="cuda", dtype=torch.float16)
    bias = torch.zeros(64, device="cuda", dtype=torch.float16)
    with pytest.raises(tilejit.errors.LaunchError, match="exceeds CUDA's 65535"):
        bmm_epilogue[(1, 1, 40000)](a[None], b[None], bias, c, 1.0, BM=64, BN=64, BK=64, split_k=2)


@pytest.mark.parametrize("shape", [(16, 4096, 4096), (128, 4096, 4096), (1, 11008, 4096), (512, 512, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_autotuned_benchmark_kernel_on_skinny_shapes(shape, tmp_path, monkeypatch):
    """The benchmark's autotuned matmul (split-K configs in its space) gives correct results on the shapes
    split-K is for, whichever config wins."""
    from benchmarks import kernels

    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    m, n, k = shape
    torch.manual_seed(m + n)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    kernels.matmul[kernels.matmul_grid](a, b, c)
    torch.cuda.synchronize()
    _check(c, a.double() @ b.double(), k, torch.float16)
