"""The IR interpreter (TILEJIT_INTERPRET=1) against torch: float64 references, fresh random inputs, NaN-poisoned
outputs; checks that every in-bounds element is written and that nothing outside a store's window is."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tilejit
import tilejit.language as T
from tilejit.interpreter import InterpreterError

NAN = float("nan")


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def tol(dtype: torch.dtype) -> dict:
    """rtol/atol for a result rounded once to ``dtype`` (plus float32 accumulation noise)."""
    return {torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
            torch.float32: dict(rtol=1e-5, atol=1e-4)}[dtype]


def check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    assert not out.isnan().any(), "some in-bounds elements were not written"
    torch.testing.assert_close(out.double(), ref.double(), **tol(dtype or out.dtype))


def operand(x: torch.Tensor) -> torch.Tensor:
    """A matmul operand as the kernel multiplies it, in float64: float32 is truncated to tf32 (the default
    precision of ``a @ b`` on float32 tiles), other dtypes are exact."""
    if x.dtype == torch.float32:
        x = (x.contiguous().view(torch.int32) & -8192).view(torch.float32)
    return x.double()


def poisoned(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, NAN, dtype=dtype)


# -- matmul -------------------------------------------------------------------------------------------------

from kernels import matmul  # noqa: E402  (the matmul of examples/matmul.py, shared by the test layers)


@tilejit.kernel
def matmul_nt_view(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    # B is N x K; its tile is loaded as BN x BK and transposed
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[n0:n0 + BN, k0:k0 + BK].T
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def matmul_nt_gemm(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], B[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    T.copy(acc.to(C.dtype), C[m0:m0 + BM, n0:n0 + BN])


def launch_matmul(kernel, A, B, C, BM, BN, BK):
    M, N = C.shape
    kernel[(tilejit.cdiv(M, BM), tilejit.cdiv(N, BN))](A, B, C, BM=BM, BN=BN, BK=BK)


DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,N,K,BM,BN,BK", [(100, 70, 50, 32, 32, 16), (64, 64, 64, 32, 32, 32), (1, 3, 5, 16, 16, 16)])
def test_matmul_nn(dtype, M, N, K, BM, BN, BK):
    torch.manual_seed(0)
    A = torch.randn(M, K).to(dtype)
    B = torch.randn(K, N).to(dtype)
    # C is a view inside a poisoned buffer: what lies around it must stay untouched
    buf = poisoned(M + 5, N + 7, dtype=dtype)
    C = buf[2:2 + M, 3:3 + N]
    launch_matmul(matmul, A, B, C, BM, BN, BK)
    check(C, operand(A) @ operand(B))
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[2:2 + M, 3:3 + N] = False
    assert buf[outside].isnan().all(), "a store wrote outside its tensor"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", [matmul_nt_view, matmul_nt_gemm], ids=["dot_T", "gemm_transpose_b"])
def test_matmul_nt(dtype, kernel):
    torch.manual_seed(1)
    M, N, K = 100, 70, 50
    A = torch.randn(M, K).to(dtype)
    Bt = torch.randn(N, K).to(dtype)
    C = poisoned(M, N, dtype=dtype)
    launch_matmul(kernel, A, Bt, C, 32, 32, 16)
    check(C, operand(A) @ operand(Bt).T)


@tilejit.kernel
def bmm(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[2]
    b = T.program_id(2)
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[b, m0:m0 + BM, k0:k0 + BK] @ B[b, k0:k0 + BK, n0:n0 + BN]
    C[b, m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_batched_matmul(dtype):
    torch.manual_seed(2)
    Bt, M, N, K = 3, 45, 37, 40
    A = torch.randn(Bt, M, K).to(dtype)
    B = torch.randn(Bt, K, N).to(dtype)
    C = poisoned(Bt, M, N, dtype=dtype)
    bmm[(tilejit.cdiv(M, 32), tilejit.cdiv(N, 16), Bt)](A, B, C, BM=32, BN=16, BK=16)
    check(C, operand(A) @ operand(B))


@tilejit.kernel
def matmul_epilogue(A, B, bias, C, scale, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=2):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    y = scale * acc + bias[n0:n0 + BN][None, :]
    y = T.maximum(y, 0)
    C[m0:m0 + BM, n0:n0 + BN] = y.to(T.float16)


def test_fused_epilogue():
    torch.manual_seed(3)
    M, N, K = 90, 75, 60
    A = torch.randn(M, K, dtype=torch.float16)
    B = torch.randn(K, N, dtype=torch.float16)
    bias = torch.randn(N, dtype=torch.float32)
    C = poisoned(M, N, dtype=torch.float16)
    matmul_epilogue[(tilejit.cdiv(M, 32), tilejit.cdiv(N, 32))](A, B, bias, C, 0.5, BM=32, BN=32, BK=16)
    ref = torch.relu(0.5 * (operand(A) @ operand(B)) + bias.double()[None, :])
    check(C, ref)
    assert (C == 0).any() and (C > 0).any()


def test_noncontiguous_inputs():
    torch.manual_seed(4)
    M, N, K = 70, 50, 40
    A = torch.randn(K, M).T                    # transposed view: strides (1, M)
    B = torch.randn(K, 2 * N)[:, ::2]          # strided view: strides (2N, 2)
    assert not A.is_contiguous() and not B.is_contiguous()
    C = poisoned(N, M).T                       # transposed output
    launch_matmul(matmul, A, B, C, 32, 32, 16)
    check(C, operand(A) @ operand(B))


def test_int8_gemm_is_exact():
    torch.manual_seed(5)
    M, N, K = 40, 24, 1100
    A = torch.randint(-128, 128, (M, K), dtype=torch.int8)
    B = torch.randint(-128, 128, (K, N), dtype=torch.int8)
    A[0] = -128  # |C[0, 0]| passes 2^24, beyond float32's exact integers
    B[:, 0] = 127
    B[0, 0] = 1
    C = torch.full((M, N), -1, dtype=torch.int32)

    @tilejit.kernel
    def igemm(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        K = A.shape[1]
        m0 = T.program_id(0) * BM
        n0 = T.program_id(1) * BN
        acc = T.zeros((BM, BN), T.int32)
        for k0 in range(0, K, BK):
            acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
        C[m0:m0 + BM, n0:n0 + BN] = acc

    igemm[(tilejit.cdiv(M, 16), tilejit.cdiv(N, 16))](A, B, C, BM=16, BN=16, BK=64)
    ref = A.long() @ B.long()
    assert abs(int(ref[0, 0])) > 2**24
    assert torch.equal(C.long(), ref)


@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 200), N=st.integers(1, 200), K=st.integers(1, 200),
       BM=st.sampled_from([16, 32, 64]), BN=st.sampled_from([16, 32, 64]), BK=st.sampled_from([16, 32, 64]),
       seed=st.integers(0, 2**31 - 1))
def test_matmul_property(M, N, K, BM, BN, BK, seed):
    torch.manual_seed(seed)
    A = torch.randn(M, K)
    B = torch.randn(K, N)
    C = poisoned(M, N)
    with pytest.MonkeyPatch.context() as mp:  # hypothesis runs examples outside the function-scoped fixture
        mp.setenv("TILEJIT_INTERPRET", "1")
        launch_matmul(matmul, A, B, C, BM, BN, BK)
    check(C, operand(A) @ operand(B))


# -- softmax: masking and full-extent slices ----------------------------------------------------------------

@tilejit.kernel
def softmax_masked(X, Y, BN: T.constexpr):
    r = T.program_id(0)
    x = X[r, 0:BN].to(T.float32)
    cols = T.arange(0, BN)
    x = T.where(cols < X.shape[1], x, float("-inf"))
    e = T.exp(x - T.max(x, 0))
    Y[r, 0:BN] = e / T.sum(e, 0)


@tilejit.kernel
def softmax_full(X, Y):
    r = T.program_id(0)
    x = X[r, :].to(T.float32)   # the full extent: specialized on X.shape[1]
    e = T.exp(x - T.max(x, 0))
    Y[r, :] = e / T.sum(e, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_masked(dtype):
    torch.manual_seed(6)
    R, N = 7, 100
    X = (3 * torch.randn(R, N)).to(dtype)
    buf = poisoned(R, N + 28, dtype=dtype)
    Y = buf[:, :N]
    softmax_masked[(R,)](X, Y, BN=128)
    check(Y, torch.softmax(X.double(), dim=1))
    assert buf[:, N:].isnan().all(), "the masked tail was written"


def test_softmax_full_extent_specializes():
    torch.manual_seed(7)
    for N in (100, 37):
        X = torch.randn(5, N)
        Y = poisoned(5, N)
        softmax_full[(5,)](X, Y)
        check(Y, torch.softmax(X.double(), dim=1))
    assert "tile<37xf32>" in softmax_full.ir(X, Y)


# -- reductions ---------------------------------------------------------------------------------------------

@tilejit.kernel
def reduce2d(X, S0, S1, MX0, MX1, MN0, MN1, TOT, BM: T.constexpr, BN: T.constexpr):
    x = X[0:BM, 0:BN]
    S0[0:BN] = T.sum(x, 0)
    S1[0:BM] = T.sum(x, axis=1)
    MX0[0:BN] = T.max(x, 0)
    MX1[0:BM] = T.max(x, 1)
    MN0[0:BN] = T.min(x, 0)
    MN1[0:BM] = T.min(x, -1)
    TOT[0:1] = T.sum(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reductions_each_axis(dtype):
    torch.manual_seed(8)
    BM, BN = 16, 32
    X = torch.randn(BM, BN).to(dtype)
    outs = [poisoned(n) for n in (BN, BM, BN, BM, BN, BM, 1)]
    outs[2:6] = [o.to(dtype) for o in outs[2:6]]  # max/min keep the dtype; sums are float32
    reduce2d[(1,)](X, *outs, BM=BM, BN=BN)
    x = X.double()
    refs = [x.sum(0), x.sum(1), x.amax(0), x.amax(1), x.amin(0), x.amin(1), x.sum().reshape(1)]
    for out, ref in zip(outs, refs):
        check(out, ref, torch.float32)
    for out, ref in zip(outs[2:6], refs[2:6]):  # max/min are exact
        assert torch.equal(out.double(), ref)


@tilejit.kernel
def reduce_int(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:1] = T.sum(x > 0)
    Y[1:2] = T.sum(x)
    Y[2:3] = T.max(x)
    Y[3:4] = T.min(x)


def test_reductions_of_ints_and_bools():
    torch.manual_seed(9)
    X = torch.randint(-100, 100, (50,), dtype=torch.int8)
    Y = torch.full((4,), -999, dtype=torch.int32)
    reduce_int[(1,)](X, Y, BN=64)  # the 14 out-of-bounds elements read as 0
    x = [int(v) for v in X] + [0] * 14
    assert Y.tolist() == [sum(v > 0 for v in x), sum(x), max(x), min(x)]


# -- control flow -------------------------------------------------------------------------------------------

@tilejit.kernel
def loops(X, Y, Z, n, BN: T.constexpr):
    acc = T.zeros((BN,), T.float32)
    total = 0
    for i in range(n):
        x = X[i, 0:BN]
        if i % 3 == 0:
            acc = acc + x
            total = total + i
        elif i % 3 == 1:
            acc = acc - 2 * x
        else:
            total = total - 1
    down = 0
    for j in range(n - 1, -1, -2):   # negative step
        down = down * 10 + j
    Y[0:BN] = acc
    Z[0:1] = total
    Z[1:2] = down


@pytest.mark.parametrize("n", [0, 1, 5, 8])
def test_for_and_if_carry_scalars_and_tiles(n):
    torch.manual_seed(10)
    BN = 16
    X = torch.randn(max(n, 1), BN)
    Y = poisoned(BN)
    Z = torch.full((2,), -7, dtype=torch.int64)
    loops[(1,)](X, Y, Z, n, BN=BN)
    acc = torch.zeros(BN, dtype=torch.float64)
    total = 0
    for i in range(n):
        if i % 3 == 0:
            acc += X[i].double()
            total += i
        elif i % 3 == 1:
            acc -= 2 * X[i].double()
        else:
            total -= 1
    down = 0
    for j in range(n - 1, -1, -2):
        down = down * 10 + j
    check(Y, acc)
    assert Z.tolist() == [total, down]


@tilejit.kernel
def branch_on_program(X, Y, BN: T.constexpr):
    p = T.program_id(0)
    x = X[p, 0:BN]
    if p >= T.num_programs(0) - 1:
        y = x * 100.0
    else:
        y = T.abs(x)
    Y[p, 0:BN] = y


def test_if_on_runtime_scalar():
    torch.manual_seed(11)
    X = torch.randn(4, 8)
    Y = poisoned(4, 8)
    branch_on_program[(4,)](X, Y, BN=8)
    ref = X.abs().double()
    ref[3] = X[3].double() * 100
    check(Y, ref)


@tilejit.kernel
def static_rows(X, Y, ROWS: T.constexpr, BN: T.constexpr):
    acc = T.zeros((BN,), T.float32)
    for i in T.static_range(ROWS):
        acc += X[i, 0:BN] * (i + 1)
    Y[0:BN] = acc


def test_static_range():
    torch.manual_seed(12)
    X = torch.randn(4, 20)
    Y = poisoned(20)
    static_rows[(1,)](X, Y, ROWS=4, BN=32)
    assert "tj.for" not in static_rows.ir(X, Y, ROWS=4, BN=32)
    check(Y, sum((i + 1) * X[i].double() for i in range(4)))


@tilejit.func
def relu(x, floor=0.0):
    return T.maximum(x, floor)


@tilejit.func
def scaled_relu(x, s):
    return relu(x) * s


@tilejit.kernel
def use_helpers(X, Y, BN: T.constexpr):
    i = T.program_id(0) * BN
    Y[i:i + BN] = scaled_relu(X[i:i + BN], 3.0) + relu(X[i:i + BN], floor=-0.5)


def test_func_helpers():
    torch.manual_seed(13)
    X = torch.randn(100)
    Y = poisoned(100)
    use_helpers[(tilejit.cdiv(100, 32),)](X, Y, BN=32)
    x = X.double()
    check(Y, 3 * x.clamp(min=0) + x.clamp(min=-0.5))


# -- integer and float semantics ----------------------------------------------------------------------------

@tilejit.kernel
def int_divmod(X, D, Q, R, SQ, a, b, BN: T.constexpr):
    i = T.program_id(0) * BN
    x = X[i:i + BN]
    d = D[i:i + BN]
    Q[i:i + BN] = x // d
    R[i:i + BN] = x % d
    SQ[0:1] = a // b
    SQ[1:2] = a % b
    SQ[2:3] = a // 4 + a % 4


@pytest.mark.parametrize("a,b", [(-7, 2), (7, -2), (-7, -2), (6, -3), (-1, 5)])
def test_integer_floordiv_mod_follow_python(a, b):
    torch.manual_seed(14)
    X = torch.randint(-50, 51, (70,), dtype=torch.int32)
    D = torch.randint(1, 8, (70,), dtype=torch.int32) * (torch.randint(0, 2, (70,), dtype=torch.int32) * 2 - 1)
    Q = torch.zeros(70, dtype=torch.int32)
    R = torch.zeros(70, dtype=torch.int32)
    SQ = torch.zeros(3, dtype=torch.int64)
    int_divmod[(3,)](X, D, Q, R, SQ, a, b, BN=32)  # 70 of 96 lanes: the padded divisors are 0 and must not trap
    assert Q.tolist() == [x // d for x, d in zip(X.tolist(), D.tolist())]
    assert R.tolist() == [x % d for x, d in zip(X.tolist(), D.tolist())]
    assert SQ.tolist() == [a // b, a % b, a // 4 + a % 4]


@tilejit.kernel
def casts(X, I, Bo, BN: T.constexpr):
    x = X[0:BN]
    I[0:BN] = x.to(T.int32)
    Bo[0:BN] = x.to(T.bool)


def test_casts_truncate_and_test_nonzero():
    X = torch.tensor([-2.7, -0.5, 0.0, 0.5, 2.7, 1e10, -1e10, NAN])
    I = torch.zeros(8, dtype=torch.int32)
    Bo = torch.zeros(8, dtype=torch.bool)
    casts[(1,)](X, I, Bo, BN=8)
    assert I.tolist() == [-2, 0, 0, 0, 2, 2**31 - 1, -2**31, 0]  # truncation, saturation, NaN -> 0
    assert Bo.tolist() == [True, True, False, True, True, True, True, True]


@tilejit.kernel
def half_ops(X, Y, BN: T.constexpr):
    x = X[0:BN]
    Y[0:BN] = (x + 1e-4) - x   # f16 + f16 rounds to f16 before the subtraction


def test_half_arithmetic_rounds_after_each_op():
    X = torch.ones(8, dtype=torch.float16)
    Y = poisoned(8, dtype=torch.float16)
    half_ops[(1,)](X, Y, BN=8)
    assert torch.equal(Y, torch.zeros(8, dtype=torch.float16))


@tilejit.kernel
def float_math(X, Y, BN: T.constexpr):
    x = X[0:BN]
    a = T.abs(x)
    Y[0, 0:BN] = -x
    Y[1, 0:BN] = T.exp2(x)
    Y[2, 0:BN] = T.log(a)
    Y[3, 0:BN] = T.sqrt(a)
    Y[4, 0:BN] = T.rsqrt(a)
    Y[5, 0:BN] = T.minimum(x, 0.25)
    Y[6, 0:BN] = T.where((x <= 0.5) & (x != 1.0), x, -x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float_math(dtype):
    torch.manual_seed(17)
    n = 50
    X = (torch.randn(n).sign() * (0.5 + torch.rand(n))).to(dtype)
    X[0] = 1.0
    Y = poisoned(7, n, dtype=dtype)
    float_math[(1,)](X, Y, BN=64)
    x = X.double()
    refs = [-x, torch.exp2(x), x.abs().log(), x.abs().sqrt(), x.abs().rsqrt(), x.clamp(max=0.25),
            torch.where((x <= 0.5) & (x != 1.0), x, -x)]
    check(Y, torch.stack(refs))


@tilejit.kernel
def int_ops(X, Y, Z, BN: T.constexpr):
    x = X[0:BN]
    y = Y[0:BN]
    Z[0, 0:BN] = x & y
    Z[1, 0:BN] = x | y
    Z[2, 0:BN] = x ^ y
    Z[3, 0:BN] = x << 3
    Z[4, 0:BN] = x >> 2
    Z[5, 0:BN] = ~x
    Z[6, 0:BN] = T.minimum(x, y)
    Z[7, 0:BN] = (~(x < y)).to(T.int32) + (x >= y).to(T.int32) * 10
    Z[8, 0:BN] = x * 3000000           # int32 wraps
    Z[9, 0:BN] = T.abs(x)


def test_integer_ops_and_wrapping():
    torch.manual_seed(18)
    X = torch.randint(-1000, 1000, (40,), dtype=torch.int32)
    Y = torch.randint(-1000, 1000, (40,), dtype=torch.int32)
    Z = torch.zeros(10, 40, dtype=torch.int32)
    int_ops[(1,)](X, Y, Z, BN=64)

    def wrap(v):
        return (v + 2**31) % 2**32 - 2**31

    xs, ys = X.tolist(), Y.tolist()
    ref = [[x & y for x, y in zip(xs, ys)], [x | y for x, y in zip(xs, ys)], [x ^ y for x, y in zip(xs, ys)],
           [x << 3 for x in xs], [x >> 2 for x in xs], [~x for x in xs], [min(x, y) for x, y in zip(xs, ys)],
           [int(not x < y) + 10 * int(x >= y) for x, y in zip(xs, ys)], [wrap(x * 3000000) for x in xs],
           [abs(x) for x in xs]]
    assert Z.tolist() == ref


@tilejit.kernel
def tensor_meta(X, Out):
    Out[0:1] = X.stride(0)
    Out[1:2] = X.stride(1)
    Out[2:3] = X.shape[0]
    Out[3:4] = X.shape[1]


def test_tensor_shape_and_strides():
    X = torch.zeros(12, 30)[1:, ::3]
    Out = torch.zeros(4, dtype=torch.int64)
    tensor_meta[(1,)](X, Out)
    assert Out.tolist() == [30, 3, 11, 10]


@tilejit.kernel
def shifted_copy(X, Y, s, BN: T.constexpr):
    Y[s:s + BN] = X[s:s + BN] + 1.0


def test_negative_and_ragged_windows():
    X = torch.arange(10, dtype=torch.float32)
    Y = poisoned(10)
    shifted_copy[(1,)](X, Y, -5, BN=8)   # window [-5, 3): reads 0 outside, writes only [0, 3)
    assert Y[:3].tolist() == [1.0, 2.0, 3.0] and Y[3:].isnan().all()
    shifted_copy[(1,)](X, Y, 7, BN=8)    # window [7, 15): only [7, 10) exists
    assert Y[7:].tolist() == [8.0, 9.0, 10.0] and Y[3:7].isnan().all()
    shifted_copy[(1,)](X, Y, 40, BN=8)   # entirely outside: nothing read or written
    assert Y[3:7].isnan().all()


# -- errors ---------------------------------------------------------------------------------------------------

@tilejit.kernel
def store_then_loop(X, Y, step, BN: T.constexpr):
    Y[0:BN] = X[0:BN]
    acc = T.zeros((BN,), T.int32)
    for i in range(0, 4, step):
        acc += X[0:BN]
    Y[0:BN] = acc


def test_runtime_error_names_the_op_and_undoes_stores():
    X = torch.arange(8, dtype=torch.int32)
    Y = torch.full((8,), -1, dtype=torch.int32)
    store_then_loop[(1,)](X, Y, 2, BN=8)
    assert torch.equal(Y, 2 * X)
    Y.fill_(-1)
    with pytest.raises(InterpreterError) as info:
        store_then_loop[(1,)](X, Y, 0, BN=8)
    message = str(info.value)
    assert isinstance(info.value, tilejit.TilejitError)
    assert "test_interpreter.py:" in message and "tj.for" in message and "program (0, 0, 0)" in message
    assert "step is zero" in message
    assert "for i in range(0, 4, step):" in message  # the source line is shown
    assert torch.equal(Y, torch.full((8,), -1, dtype=torch.int32)), "the first store was not undone"


def test_rejects_tensors_not_on_cpu():
    X = torch.zeros(8, device="meta")
    with pytest.raises(InterpreterError, match="CPU"):
        shifted_copy[(1,)](X, X, 0, BN=8)


def test_fp8_load_cast_store():
    torch.manual_seed(15)
    X = torch.randn(40).to(torch.float8_e4m3fn)
    Y = poisoned(40)
    Z = torch.zeros(40, dtype=torch.float8_e5m2)

    @tilejit.kernel
    def fp8(X, Y, Z, BN: T.constexpr):
        x = X[0:BN]
        Y[0:BN] = x.to(T.float32) * 2.0
        Z[0:BN] = x.to(T.float8_e5m2)

    fp8[(1,)](X, Y, Z, BN=64)
    assert torch.equal(Y, X.float() * 2)
    assert torch.equal(Z.float(), X.float().to(torch.float8_e5m2).float())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_matmul_uses_exact_operands(dtype):
    torch.manual_seed(19)
    M, N, K = 50, 40, 70
    A = torch.randn(M, K).to(dtype)
    B = torch.randn(K, N).to(dtype)
    C = poisoned(M, N)
    launch_matmul(matmul, A, B, C, 32, 32, 32)
    check(C, operand(A) @ operand(B))


def test_interpreter_speed_is_reasonable():
    import time

    torch.manual_seed(16)
    A = torch.randn(200, 200, dtype=torch.float16)
    B = torch.randn(200, 200, dtype=torch.float16)
    C = poisoned(200, 200, dtype=torch.float16)
    launch_matmul(matmul, A, B, C, 32, 32, 16)  # builds the IR
    best = math.inf
    for _ in range(3):  # best of three: the machine may be shared
        start = time.perf_counter()
        launch_matmul(matmul, A, B, C, 32, 32, 16)
        best = min(best, time.perf_counter() - start)
    assert best < 1.0, f"a 200^3 matmul with 32x32x16 tiles took {best:.2f} s in the interpreter"
    check(C, operand(A) @ operand(B))


@tilejit.kernel
def while_gcd(A, B, Out, Steps):
    i = T.program_id(0)
    a = A[i:i + 1]
    b = B[i:i + 1]
    x = T.sum(a, 0)
    y = T.sum(b, 0)
    steps = 0
    while y != 0:
        x, y = y, x % y
        steps += 1
    Out[i:i + 1] = x
    Steps[i:i + 1] = steps


def test_while_loop_over_scalars(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    import math as _math

    a = torch.tensor([12, 35, 17, 0, 81, 1000000], dtype=torch.int32)
    b = torch.tensor([18, 14, 5, 9, 0, 35], dtype=torch.int32)
    out = torch.full((6,), -1, dtype=torch.int32)
    steps = torch.full((6,), -1, dtype=torch.int32)
    while_gcd[(6,)](a, b, out, steps)
    assert out.tolist() == [_math.gcd(x, y) for x, y in zip(a.tolist(), b.tolist())]
    ref_steps = []
    for x, y in zip(a.tolist(), b.tolist()):
        n = 0
        while y:
            x, y, n = y, x % y, n + 1
        ref_steps.append(n)
    assert steps.tolist() == ref_steps


# Marked here, at the end, so that the kernels above keep the source lines their generated code cites.
test_interpreter_speed_is_reasonable = pytest.mark.timing(test_interpreter_speed_is_reasonable)


@pytest.mark.parametrize("dtype, biggest", [(torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)])
def test_fp8_casts_saturate_to_the_largest_finite_value(dtype, biggest):
    # as cvt.rn.satfinite on the GPU (tests/gpu/test_gpu_dtypes.py): out-of-range values and infinities to +-max,
    # NaN stays NaN (torch's own e5m2 conversion overflows to inf)
    @tilejit.kernel
    def to_fp8(X, Y, Z, BN: T.constexpr):
        x = X[0:BN]
        Y[0:BN] = x.to(Z.dtype).to(T.float32)  # a cast
        Z[0:BN] = x  # a store's cast

    X = torch.tensor([1e6, -1e6, math.inf, -math.inf, 3 * biggest, 1.5, math.nan, -0.25])
    Y, Z = poisoned(8), torch.zeros(8, dtype=dtype)
    to_fp8[(1,)](X, Y, Z, BN=8)
    want = torch.tensor([biggest, -biggest, biggest, -biggest, biggest, 1.5, math.nan, -0.25])
    assert torch.equal(Y[:6], want[:6]) and Y[6].isnan() and Y[7] == -0.25, Y
    assert torch.equal(Z.float()[:6], want[:6]) and Z.float()[6].isnan(), Z.float()


def test_launches_with_an_input_that_requires_grad_leave_no_autograd_graph():
    # a kernel's writes are not autograd ops: the output stays out of the input's graph, so it can be written again
    @tilejit.kernel
    def scaled(X, Y, BLOCK: T.constexpr):
        i = T.program_id(0) * BLOCK
        Y[i:i + BLOCK] = X[i:i + BLOCK] * 3.0

    X = torch.randn(32, requires_grad=True)
    Y = poisoned(32)
    scaled[(2,)](X, Y, BLOCK=16)
    assert Y.grad_fn is None and not Y.requires_grad
    scaled[(2,)](X, Y, BLOCK=16)  # the second launch: Y must not have joined X's graph
    assert Y.grad_fn is None and X.grad is None
    torch.testing.assert_close(Y, X.detach() * 3.0)
