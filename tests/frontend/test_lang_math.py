"""T.log2, T.sin, T.cos, T.tanh, T.erf, T.sigmoid, T.fma and T.cumsum: the interpreter against torch, IR and
CUDA text, compile-time folding, located errors."""
from __future__ import annotations

import math

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.headers import expand_includes
from filecheck import filecheck
import lang_kernels as lk

TORCH_FN = {"log2": torch.log2, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "erf": torch.erf,
            "sigmoid": torch.sigmoid}


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def inputs(fn: str, shape, dtype):
    x = torch.randn(shape, dtype=torch.float64) * 4
    if fn == "log2":
        x = x.abs() + 1e-3
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fn", sorted(TORCH_FN) + ["fma"])
def test_math_interpreter(interpret, fn, dtype):
    x, y, z = (inputs(fn, (33, 40), dtype) for _ in range(3))
    out = torch.full((33, 40), float("nan"), dtype=dtype)
    lk.math_fns[(2, 2)](x, y, z, out, FN=fn, BM=32, BN=32)
    if fn == "fma":
        expected = (x.double() * y.double() + z.double())
    else:
        expected = TORCH_FN[fn](x.double())
    tol = {torch.float32: 2e-6, torch.float64: 1e-12, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(out.double(), expected.to(dtype).double(), rtol=tol, atol=tol)


def test_fma_rounds_once(interpret):
    # a * b + c with a * b = 1 + 2^-12 + 2^-24 exactly: separate rounding loses the 2^-24 term, fma keeps it
    a = torch.tensor([1 + 2 ** -12], dtype=torch.float32)
    b = torch.tensor([1 + 2 ** -12], dtype=torch.float32)
    c = torch.tensor([-1.0], dtype=torch.float32)

    @tilejit.kernel
    def k(A, B, C, Out):
        Out[0:1] = T.fma(A[0:1], B[0:1], C[0:1])

    out = torch.zeros(1)
    k[(1,)](a, b, c, out)
    assert out.item() == 2 ** -11 + 2 ** -24


def test_math_on_integers_and_constants(interpret):
    @tilejit.kernel
    def k(X, Out, BN: T.constexpr):
        x = X[0:BN]
        Out[0:BN] = T.sin(x) + T.sigmoid(0.0) + T.fma(x, 2, 1) + T.log2(8.0) + T.erf(0.0) + T.tanh(0.0) + T.cos(0.0)

    x = torch.arange(16, dtype=torch.int32)
    out = torch.zeros(16)
    k[(1,)](x, out, BN=16)
    expected = torch.sin(x.float()) + 0.5 + (2 * x + 1).float() + 3.0 + 1.0
    torch.testing.assert_close(out, expected)
    ir = k.ir(meta(16, dtype=torch.int32), meta(16), BN=16)
    assert "sigmoid" not in ir and "log2" not in ir  # constants fold at compile time
    filecheck(ir, r"""
        CHECK: tj.unary {{%[0-9]+}} {op = sin} : tile<16xf32>
        CHECK: tj.fma {{.*}} : tile<16xf32>
    """)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype, out_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                              (torch.int8, torch.int32), (torch.int64, torch.int64),
                                              (torch.float64, torch.float64)])
def test_cumsum_interpreter(interpret, axis, dtype, out_dtype):
    if dtype.is_floating_point:
        x = torch.randn(45, 20).to(dtype)
    else:
        x = torch.randint(-100, 100, (45, 20), dtype=dtype)
    out = torch.full((45, 32), 0, dtype=out_dtype)
    lk.cumsum_2d[(2,)](x, out, AXIS=axis, BM=32, BN=32)
    for m0 in (0, 32):  # each block scans its own 32 rows (zeros past X's end)
        block = torch.zeros(32, 32, dtype=torch.float64)
        rows = x[m0:m0 + 32].double()
        block[:rows.shape[0], :20] = rows
        expected = block.cumsum(axis)[:45 - m0].to(out_dtype)
        torch.testing.assert_close(out[m0:m0 + 32], expected, rtol=1e-5, atol=1e-4)


def test_cumsum_of_a_reduction(interpret):
    x = torch.randn(20, 50)
    out = torch.full((20,), float("nan"))
    lk.cumsum_of_reduction[(1,)](x, out, BM=32, BN=64)
    s = x.double().sum(1)
    torch.testing.assert_close(out.double(), s.cumsum(0) - s, rtol=1e-5, atol=1e-4)


def test_cumsum_ir_and_cuda():
    ir = lk.cumsum_2d.ir(meta(45, 20, dtype=torch.float16), meta(45, 32), AXIS=-1, BM=32, BN=32)
    filecheck(ir, r"""
        CHECK: tj.cast {{%[0-9]+}} {dtype = f32} : tile<32x32xf32>
        CHECK: tj.cumsum {{%[0-9]+}} {axis = 1} : tile<32x32xf32>
    """)
    cuda = lk.cumsum_2d.compile(meta(45, 20), meta(45, 32), AXIS=1, BM=32, BN=32, arch="sm_80",
                                stop_after="cuda").cuda
    filecheck(cuda, r"""
        CHECK: // cumsum along axis 1 through shared memory
        CHECK: for (int tj_l = tid; tj_l < 32; tj_l += 128)
        CHECK: tj_acc = tj_acc + tj_line[tj_j * 1];
    """)
    cuda = lk.math_fns.compile(meta(33, 40), meta(33, 40), meta(33, 40), meta(33, 40), FN="erf", BM=32, BN=32,
                               arch="sm_80", stop_after="cuda").cuda
    # the wrapper is the prelude's (an included header), the call the kernel's
    assert "TJ_DEVICE float tj_erf(float x) { return erff(x); }" in expand_includes(cuda) and "= tj_erf(" in cuda


# -- misuse ---------------------------------------------------------------------------------------------------

@tilejit.kernel
def k_cumsum_axis(X, B: T.constexpr):
    X[0:B] = T.cumsum(X[0:B], 1)  # ERR


@tilejit.kernel
def k_cumsum_scalar(X, B: T.constexpr):
    X[0] = T.cumsum(X[1], 0)  # ERR


@tilejit.kernel
def k_fma_arity(X, B: T.constexpr):
    x = X[0:B]
    X[0:B] = T.fma(x, x)  # ERR


@pytest.mark.parametrize("kernel, phrase", [
    (k_cumsum_axis, "axis must be a constant int in [-1, 1), got 1"),
    (k_cumsum_scalar, "T.cumsum needs a tile, got scalar"),
    (k_fma_arity, "wrong arguments for T.fma"),
], ids=["cumsum_axis", "cumsum_scalar", "fma_arity"])
def test_math_misuse_is_located(kernel, phrase):
    import inspect

    with pytest.raises(tilejit.CompilationError) as info:
        kernel.ir(meta(64), B=16)
    err = info.value
    lines, first = inspect.getsourcelines(kernel.fn)
    (lineno, line), = [(first + i, l.rstrip("\n")) for i, l in enumerate(lines) if "# ERR" in l]
    assert err.lineno == lineno and phrase in err.message, str(err)
