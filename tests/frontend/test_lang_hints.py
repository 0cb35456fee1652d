"""T.multiple_of and T.max_contiguous in the frontend: the promise recorded on the value and printed with the IR,
located errors for misuse, the IR verifier's check, and the interpreter running hinted kernels unchanged."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from filecheck import filecheck
from lang_kernels import hinted_copy, hinted_matmul, hinted_segments
from tilejit.ir import IRVerificationError, MultipleOf, verify


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


# -- the promise in the IR --------------------------------------------------------------------------------------

@tilejit.kernel
def promises(X, Out, n, B: T.constexpr):
    i0 = T.multiple_of(T.program_id(0) * B, 48)
    k = T.multiple_of(n, (16,))
    offs = T.multiple_of(T.arange(0, B)[:, None] * 16 + T.arange(0, B)[None, :], (16, 1))
    grid = T.multiple_of(T.arange(0, B)[:, None] * 32 + T.zeros((B, B), T.int32), 32)
    T.multiple_of(X.shape[0], 8)
    Out[i0:i0 + B, 0:B] = X[i0:i0 + B, 0:B] + (offs + grid + k).to(T.float32)


def test_promises_are_printed_where_values_are_defined():
    filecheck(promises.ir(meta(64, 16), meta(64, 16), 5, B=16), r"""
        CHECK: tj.func @promises(%X: tensor<2d x f32>, %Out: tensor<2d x f32>, %n: i64 {multiple_of = 16})
        CHECK: %X_size0 {multiple_of = 8} = tj.tensor_dim %X {axis = 0} : i64
        CHECK: %i0 {multiple_of = 48} = tj.binary {{%[0-9]+}}, {{%[0-9]+}} {op = mul} : i32
        CHECK: %offs {multiple_of = [16, 1]} = tj.binary
        CHECK: %grid {multiple_of = [32, 32]} = tj.binary
    """)
    # an int argument that is not a multiple of 16 carries only the promise made in the kernel (16, the same)
    text = promises.ir(meta(64, 16), meta(64, 16), 32, B=16)
    assert "%n: i64 {multiple_of = 16}" in text


def test_a_promise_on_an_unused_extent_survives_cleanup():
    """The promise is about the tensor: the value is kept although nothing reads it (accesses read the extent
    directly)."""
    text = promises.ir(meta(64, 16), meta(64, 16), 5, B=16)
    assert "%X_size0 {multiple_of = 8} = tj.tensor_dim %X" in text


def test_the_verifier_checks_a_promise_fits_its_value():
    fn = promises.compile(meta(64, 16), meta(64, 16), 5, B=16, arch="sm_80", stop_after="ir").fn
    verify(fn)
    x = fn.params[0].value  # a tensor cannot carry a promise
    x.multiple_of = MultipleOf((16,))
    with pytest.raises(IRVerificationError, match="a promise of 1 divisor"):
        verify(fn)
    x.multiple_of = None
    tile = next(r for op in fn.walk() for r in op.results if r.name == "offs")
    tile.multiple_of = MultipleOf((16,))  # one divisor for a rank-2 tile
    with pytest.raises(IRVerificationError, match="a promise of 1 divisor"):
        verify(fn)


# -- misuse: located errors -------------------------------------------------------------------------------------

@tilejit.kernel
def not_a_multiple(X, B: T.constexpr):
    X[0:B] = T.multiple_of(12, B)


@tilejit.kernel
def promise_on_arg(X, n, B: T.constexpr):
    k = T.multiple_of(n, 16)
    X[k:k + B] = 1.0


@tilejit.kernel
def too_many_values(X, n, B: T.constexpr):
    X[0:B] = T.multiple_of(n, (16, 16)) + T.arange(0, B).to(T.float32)


@tilejit.kernel
def wrong_rank(X, B: T.constexpr):
    X[0:B] = T.max_contiguous(T.arange(0, B), (B, 1)).to(T.float32)


@tilejit.kernel
def float_hint(X, B: T.constexpr):
    X[0:B] = T.multiple_of(1.5, 16)


@tilejit.kernel
def zero_divisor(X, B: T.constexpr):
    X[0:B] = T.max_contiguous(T.arange(0, B), 0).to(T.float32)


@pytest.mark.parametrize("kernel, args, message, at", [
    (not_a_multiple, (), "T.multiple_of: 12 is not a multiple of 16", "T.multiple_of(12, B)"),
    # an int argument equal to 1 is folded to the constant 1, which the promise then contradicts
    (promise_on_arg, (1,), "T.multiple_of: 1 is not a multiple of 16", "T.multiple_of(n, 16)"),
    (too_many_values, (3,), "the hint gives 2 values for a scalar", "T.multiple_of(n, (16, 16))"),
    (wrong_rank, (), "the hint gives 2 values for a rank-1 tile", "T.max_contiguous(T.arange(0, B), (B, 1))"),
    (float_hint, (), "hints apply to integer scalars or tiles", "T.multiple_of(1.5, 16)"),
    (zero_divisor, (), "the hint needs a positive compile-time int", "T.max_contiguous(T.arange(0, B), 0)"),
])
def test_misuse_is_a_located_error(kernel, args, message, at):
    with pytest.raises(tilejit.CompilationError) as info:
        kernel.ir(meta(64), *args, B=16)
    err = info.value
    assert message in err.message, str(err)
    assert err.filename.endswith("test_lang_hints.py") and at in err.source_line, str(err)
    assert err.source_line[err.col:].startswith(at.split("(")[0]), str(err)


def test_a_promise_that_holds_on_a_constant_is_accepted():
    @tilejit.kernel
    def fine(X, n, B: T.constexpr):
        X[0:B] = T.multiple_of(48, B) + T.multiple_of(n, 16) + T.arange(0, B).to(T.float32)

    text = fine.ir(meta(64), 32, B=16)
    assert "%n: i64 {multiple_of = 16}" in text and "tj.constant {value = 48}" in text


# -- the interpreter ignores promises ----------------------------------------------------------------------------

def test_interpreter_runs_hinted_copy(interpret):
    x = torch.randn(1008, dtype=torch.float64).float()
    for hint in (False, True):
        for off in (0, 16, 5):
            y = torch.full((1008,), float("nan"))
            hinted_copy[(tilejit.cdiv(1008 - off, 256),)](x, y, off, BLOCK=256, HINT=hint)
            expected = torch.full((1008,), float("nan"))
            expected[off:] = x[off:] * 2 + 1
            torch.testing.assert_close(y, expected, equal_nan=True)


def test_interpreter_runs_hinted_matmul(interpret):
    a = torch.randn(40, 56).half()
    b = torch.randn(56, 24).half()
    ref = (a.double() @ b.double()).float()
    for hint in (False, True):
        c = torch.full((40, 24), float("nan"), dtype=torch.float32)
        hinted_matmul[(2, 2)](a, b, c, BM=32, BN=16, BK=16, HINT=hint)
        torch.testing.assert_close(c, ref, atol=1e-2, rtol=1e-3)


def test_interpreter_runs_hinted_segments(interpret):
    x = torch.randn(200)
    starts = torch.tensor([0, 32, 160, 96], dtype=torch.int32)
    for hint in (False, True):
        y = torch.full((200,), float("nan"))
        hinted_segments[(4,)](x, y, starts, BLOCK=32, HINT=hint)
        expected = torch.full((200,), float("nan"))
        for g, s in enumerate(starts.tolist()):
            expected[s:s + 32] = x[s:s + 32] + g
        torch.testing.assert_close(y, expected, equal_nan=True)
