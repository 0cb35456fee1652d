"""Less common but valid programs, compiled and run on the GPU: gemms under a runtime `if`, two gemms in
one loop, reductions and transposes of an accumulator, fp8 operands, scalar-driven fills and a global to
global copy. Float64 references, NaN-poisoned outputs, ragged shapes."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T

pytestmark = pytest.mark.gpu


@tilejit.kernel
def two_gemms(A, B, C, D, Out, use_second, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, A.shape[1], BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
        if use_second:
            acc = T.gemm(C[m0:m0 + BM, k0:k0 + BK], D[k0:k0 + BK, n0:n0 + BN], acc)
    Out[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def acc_reductions(A, B, RowSum, ColMax, OutT, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    pm = T.program_id(0)
    pn = T.program_id(1)
    m0 = pm * BM
    n0 = pn * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in range(0, A.shape[1], BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    rows = T.arange(0, BM)
    cols = T.arange(0, BN)
    inside = (m0 + rows[:, None] < A.shape[0]) & (n0 + cols[None, :] < B.shape[1])
    RowSum[pn, m0:m0 + BM] = T.sum(T.where(inside, acc, 0.0), 1)
    ColMax[pm, n0:n0 + BN] = T.max(T.where(inside, acc, float("-inf")), 0)
    OutT[n0:n0 + BN, m0:m0 + BM] = acc.T.to(OutT.dtype)


@tilejit.kernel
def fp8_gemm(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in range(0, A.shape[1], BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], B[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def fill_and_copy(Src, Dst, Fill, value, n, BLOCK: T.constexpr):
    i0 = T.program_id(0) * BLOCK
    T.copy(Src[i0:i0 + BLOCK], Dst[i0:i0 + BLOCK])
    idx = i0 + T.arange(0, BLOCK)
    Fill[i0:i0 + BLOCK] = T.where(idx < n // 2, T.full((BLOCK,), value, T.float32), -value)


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


@pytest.mark.parametrize("use_second", [True, False])
def test_two_gemms_and_a_gemm_under_a_runtime_if(use_second):
    torch.manual_seed(1)
    m, n, k = 150, 130, 100
    a, c = (torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(2))
    b, d = (torch.randn(k, n, device="cuda", dtype=torch.float16) for _ in range(2))
    out = _nan(m, n)
    two_gemms[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64))](a, b, c, d, out, use_second, BM=64, BN=64, BK=32)
    ref = a.double() @ b.double() + (c.double() @ d.double() if use_second else 0)
    torch.testing.assert_close(out.double(), ref, rtol=1e-3, atol=1e-2)


def test_reductions_and_transposed_store_of_an_accumulator():
    torch.manual_seed(2)
    m, n, k = 100, 90, 70
    bm, bn = 64, 64
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    gm, gn = tilejit.cdiv(m, bm), tilejit.cdiv(n, bn)
    row_sum, col_max, out_t = _nan(gn, gm * bm), _nan(gm, gn * bn), _nan(n, m, dtype=torch.float16)
    acc_reductions[(gm, gn)](a, b, row_sum, col_max, out_t, BM=bm, BN=bn, BK=32)
    full = a.double() @ b.double()
    torch.testing.assert_close(out_t.double(), full.T, rtol=2e-2, atol=2e-2)
    for j in range(gn):
        ref = full[:, j * bn:(j + 1) * bn].sum(1)
        torch.testing.assert_close(row_sum[j, :m].double(), ref, rtol=1e-3, atol=1e-2)
    for i in range(gm):
        ref = full[i * bm:(i + 1) * bm].max(0).values
        torch.testing.assert_close(col_max[i, :n].double(), ref, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_gemm(dtype):
    torch.manual_seed(3)
    m, n, k = 70, 40, 96
    a = (torch.randn(m, k, device="cuda") * 2).to(dtype)
    b = (torch.randn(n, k, device="cuda") * 2).to(dtype)
    c = _nan(m, n)
    fp8_gemm[(tilejit.cdiv(m, 32), tilejit.cdiv(n, 32))](a, b, c, BM=32, BN=32, BK=32)
    ref = a.double() @ b.double().T
    torch.testing.assert_close(c.double(), ref, rtol=1e-4, atol=1e-3)


def test_scalar_fill_and_global_copy():
    torch.manual_seed(4)
    n = 1000
    src = torch.randn(n, device="cuda")
    dst, fill = _nan(n), _nan(n)
    fill_and_copy[(tilejit.cdiv(n, 256),)](src, dst, fill, 2.5, n, BLOCK=256)
    assert torch.equal(dst, src)
    idx = torch.arange(n, device="cuda")
    assert torch.equal(fill, torch.where(idx < n // 2, 2.5, -2.5))
