"""The language beyond matmul, compiled and run on the GPU against float64 references.

Elementwise math with broadcasting, reductions over each axis, control flow with carried tiles, scalar
arguments, helpers, 1-D and 3-D tensors, and an attention block (two gemms with an online softmax between
them, the second gemm reading a register tile through shared memory). Outputs are NaN-poisoned.
"""
from __future__ import annotations

import math

import pytest
import torch

import tilejit
import tilejit.language as T

pytestmark = pytest.mark.gpu


@tilejit.func
def gelu_tanh(x):
    return 0.5 * x * (1.0 + T.where(x > 10.0, 1.0, (T.exp(2.0 * 0.7978845608 * (x + 0.044715 * x * x * x)) - 1.0)
                                    / (T.exp(2.0 * 0.7978845608 * (x + 0.044715 * x * x * x)) + 1.0)))


@tilejit.kernel
def elementwise(X, Y, bias, Out, alpha, BM: T.constexpr, BN: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    x = X[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    y = Y[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    b = bias[n0:n0 + BN].to(T.float32)
    z = alpha * x * y + b[None, :] - T.sqrt(T.abs(y)) + T.log(1.0 + T.exp(x)) + T.maximum(x, y) / 4
    Out[m0:m0 + BM, n0:n0 + BN] = gelu_tanh(z)


@tilejit.kernel
def reduce_axes(X, RowSum, ColMax, RowMin, BM: T.constexpr, BN: T.constexpr):
    m0 = T.program_id(0) * BM
    x = X[m0:m0 + BM, 0:BN].to(T.float32)
    cols = T.arange(0, BN)
    valid = cols[None, :] < X.shape[1]
    RowSum[m0:m0 + BM] = T.sum(T.where(valid, x, 0.0), 1)
    RowMin[m0:m0 + BM] = T.min(T.where(valid, x, float("inf")), 1)
    rows = T.arange(0, BM)
    ok = (m0 + rows[:, None] < X.shape[0]) & valid
    ColMax[T.program_id(0), 0:BN] = T.max(T.where(ok, x, float("-inf")), 0)


@tilejit.kernel
def control_flow(X, Out, n_iter, flag, scale, BLOCK: T.constexpr, UNROLL: T.constexpr):
    i0 = T.program_id(0) * BLOCK
    x = X[i0:i0 + BLOCK].to(T.float32)
    acc = T.zeros((BLOCK,), T.float32)
    total = 0.0
    for it in range(n_iter):
        acc = acc + x * (it + 1)
        total = total + it
    for u in T.static_range(UNROLL):
        acc = acc * 0.5 + u
    if flag:
        out = acc * scale + total
    else:
        out = acc - total
    if UNROLL > 2:
        out = out + 1000.0
    Out[i0:i0 + BLOCK] = out


@tilejit.kernel
def batched_rows(X, Out, BN: T.constexpr):
    b = T.program_id(1)
    r = T.program_id(0)
    row = X[b, r, 0:BN].to(T.float32)
    Out[b, r, 0:BN] = (row - T.sum(row, 0) / BN).to(Out.dtype)


@tilejit.kernel
def int_math(A, B, Out, BLOCK: T.constexpr):
    i0 = T.program_id(0) * BLOCK
    a = A[i0:i0 + BLOCK]
    b = B[i0:i0 + BLOCK]
    q = a // b
    r = a % b
    Out[i0:i0 + BLOCK] = q * 1000 + r + (a & 7) + T.where(a > b, 1, 0)


@tilejit.kernel
def copy_transpose(X, Out, BM: T.constexpr, BN: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    T.copy(X[m0:m0 + BM, n0:n0 + BN].T, Out[n0:n0 + BN, m0:m0 + BM])


@tilejit.kernel
def attention(Q, K, V, O, seq_len, sm_scale, BM: T.constexpr, BN: T.constexpr, D: T.constexpr):
    """One (batch*head, query block) program of attention with an online softmax (FlashAttention style)."""
    bh = T.program_id(1)
    m0 = T.program_id(0) * BM
    q = Q[bh, m0:m0 + BM, 0:D]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    cols = T.arange(0, BN)
    for n0 in range(0, seq_len, BN):
        k = K[bh, n0:n0 + BN, 0:D]
        s = T.gemm(q, k, T.zeros((BM, BN), T.float32), transpose_b=True) * sm_scale
        s = T.where(n0 + cols[None, :] < seq_len, s, float("-inf"))
        m_new = T.maximum(m_i, T.max(s, 1))
        p = T.exp(s - m_new[:, None])
        alpha = T.exp(m_i - m_new)
        l_i = l_i * alpha + T.sum(p, 1)
        acc = acc * alpha[:, None] + p.to(V.dtype) @ V[bh, n0:n0 + BN, 0:D]
        m_i = m_new
    O[bh, m0:m0 + BM, 0:D] = (acc / l_i[:, None]).to(O.dtype)


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def test_elementwise_broadcast_and_math():
    torch.manual_seed(0)
    m, n = 300, 200
    x = torch.randn(m, n, device="cuda", dtype=torch.float16)
    y = torch.randn(m, n, device="cuda", dtype=torch.float16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = _nan(m, n)
    elementwise[(tilejit.cdiv(m, 64), tilejit.cdiv(n, 64))](x, y, bias, out, 1.5, BM=64, BN=64)
    xd, yd, bd = x.double(), y.double(), bias.double()
    z = 1.5 * xd * yd + bd[None, :] - yd.abs().sqrt() + torch.log1p(xd.exp()) + torch.maximum(xd, yd) / 4
    ref = 0.5 * z * (1.0 + torch.tanh(0.7978845608 * (z + 0.044715 * z ** 3)))
    torch.testing.assert_close(out.double(), ref, rtol=2e-4, atol=2e-4)


def test_reductions_over_each_axis():
    torch.manual_seed(1)
    m, n, bm, bn = 150, 100, 32, 128
    x = torch.randn(m, n, device="cuda", dtype=torch.float16)
    row_sum, row_min = _nan(m), _nan(m)
    grid_m = tilejit.cdiv(m, bm)
    col_max = _nan(grid_m, bn)
    reduce_axes[(grid_m,)](x, row_sum, col_max, row_min, BM=bm, BN=bn)
    xd = x.double()
    torch.testing.assert_close(row_sum.double(), xd.sum(1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(row_min.double(), xd.min(1).values, rtol=0, atol=0)
    ref_max = torch.stack([xd[i * bm:(i + 1) * bm].max(0).values for i in range(grid_m)])
    torch.testing.assert_close(col_max[:, :n].double(), ref_max, rtol=0, atol=0)
    assert torch.isneginf(col_max[:, n:]).all()


@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.parametrize("n_iter", [0, 1, 5])
def test_control_flow_with_carried_tiles(flag, n_iter):
    torch.manual_seed(2)
    x = torch.randn(1000, device="cuda")
    out = _nan(1000)
    control_flow[(tilejit.cdiv(1000, 256),)](x, out, n_iter, flag, 2.0, BLOCK=256, UNROLL=3)
    xd = x.double()
    acc = torch.zeros_like(xd)
    for it in range(n_iter):
        acc = acc + xd * (it + 1)
    total = sum(range(n_iter))
    for u in range(3):
        acc = acc * 0.5 + u
    ref = (acc * 2.0 + total) if flag else (acc - total)
    torch.testing.assert_close(out.double(), ref + 1000.0, rtol=1e-5, atol=1e-4)


def test_three_d_rows_with_full_slices():
    torch.manual_seed(3)
    x = torch.randn(4, 33, 96, device="cuda", dtype=torch.bfloat16)
    out = _nan(4, 33, 96, dtype=torch.bfloat16)
    batched_rows[(33, 4)](x, out, BN=96)
    ref = x.double() - x.double().mean(2, keepdim=True)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


def test_integer_floor_division_and_modulo_follow_python():
    torch.manual_seed(4)
    a = torch.randint(-1000, 1000, (777,), device="cuda", dtype=torch.int32)
    b = torch.randint(1, 50, (777,), device="cuda", dtype=torch.int32) * torch.where(
        torch.rand(777, device="cuda") < 0.5, -1, 1).to(torch.int32)
    out = torch.full((777,), -12345, device="cuda", dtype=torch.int32)
    int_math[(tilejit.cdiv(777, 128),)](a, b, out, BLOCK=128)
    al, bl = a.cpu().tolist(), b.cpu().tolist()
    ref = [(x // y) * 1000 + (x % y) + (x & 7) + (1 if x > y else 0) for x, y in zip(al, bl)]
    assert out.cpu().tolist() == ref


def test_copy_of_a_transposed_tile():
    torch.manual_seed(5)
    x = torch.randn(130, 70, device="cuda")
    out = _nan(70, 130)
    copy_transpose[(tilejit.cdiv(130, 32), tilejit.cdiv(70, 32))](x, out, BM=32, BN=32)
    assert torch.equal(out, x.T)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq_len", [64, 200])
def test_attention_online_softmax(dtype, seq_len):
    torch.manual_seed(6)
    bh, d = 3, 64
    q = torch.randn(bh, seq_len, d, device="cuda", dtype=dtype)
    k = torch.randn(bh, seq_len, d, device="cuda", dtype=dtype)
    v = torch.randn(bh, seq_len, d, device="cuda", dtype=dtype)
    o = _nan(bh, seq_len, d, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    attention[(tilejit.cdiv(seq_len, 64), bh)](q, k, v, o, seq_len, scale, BM=64, BN=64, D=d, num_warps=4)
    ref = torch.softmax(q.double() @ k.double().transpose(1, 2) * scale, dim=-1) @ v.double()
    tol = 2e-2 if dtype == torch.float16 else 4e-2
    torch.testing.assert_close(o.double(), ref, rtol=tol, atol=tol)


@tilejit.kernel
def small_gemm(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, ACC: T.constexpr,
               PRECISION: T.constexpr = None):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), ACC)
    for k0 in range(0, A.shape[1], BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], B[k0:k0 + BK, n0:n0 + BN], acc, precision=PRECISION)
    C[m0:m0 + BM, n0:n0 + BN] = acc


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_gemm_without_a_tensor_core_lowering_runs_on_the_fallback(dtype):
    """fp32 products asked for in exact float32 (precision="ieee") and int8 tiles whose K is no multiple of 32
    take the FMA fallback: slow, but every valid program runs."""
    torch.manual_seed(7)
    m, n, k = 70, 50, 90
    if dtype == torch.int8:
        a = torch.randint(-100, 100, (m, k), device="cuda", dtype=dtype)
        b = torch.randint(-100, 100, (k, n), device="cuda", dtype=dtype)
        c = torch.full((m, n), -1, device="cuda", dtype=torch.int32)
        acc = T.int32
    else:
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n, device="cuda")
        c = _nan(m, n)
        acc = T.float32
    small_gemm[(tilejit.cdiv(m, 32), tilejit.cdiv(n, 32))](a, b, c, BM=32, BN=32, BK=16, ACC=acc,
                                                            PRECISION="ieee" if dtype == torch.float32 else None)
    ref = a.double() @ b.double()
    if dtype == torch.int8:
        assert torch.equal(c.cpu().long(), ref.cpu().long())
    else:
        torch.testing.assert_close(c.double(), ref, rtol=1e-4, atol=1e-4)


@tilejit.kernel
def sum_middle_axis(X, Out, B0: T.constexpr, B1: T.constexpr, B2: T.constexpr):
    i0 = T.program_id(0) * B0
    x = X[i0:i0 + B0, 0:B1, 0:B2]
    Out[i0:i0 + B0, 0:B2] = T.sum(x, 1) * 2.0


def test_three_d_tile_reduction():
    torch.manual_seed(8)
    x = torch.randn(10, 6, 40, device="cuda")
    out = _nan(10, 40)
    sum_middle_axis[(tilejit.cdiv(10, 4),)](x, out, B0=4, B1=8, B2=64)
    torch.testing.assert_close(out.double(), x.double().sum(1) * 2.0, rtol=1e-5, atol=1e-5)
