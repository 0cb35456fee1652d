"""What a Triton user writes by habit: each mistake fails with a message in tilejit's words, at the user's line,
in at most 12 lines of traceback, and never as a tilejit bug; each shape hint, applied, compiles."""
from __future__ import annotations

import inspect
import traceback

import numpy as np
import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit import CompilationError, NameResolutionError, TypeCheckError, UnsupportedSyntaxError
from tilejit.errors import InternalError, UsageTypeError

THIS_FILE = inspect.getsourcefile(lambda: None)


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def line_of(fn, marker: str = "# ERR") -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


def failure(call) -> tuple[BaseException, str]:
    with pytest.raises(Exception) as info:
        call()
    error = info.value
    text = "".join(traceback.format_exception(error))
    assert not isinstance(error, InternalError), text
    assert "tilejit bug" not in text, text
    assert len(text.splitlines()) <= 13, text  # 12, and a callback's note saying where tilejit called it
    return error, text


@tilejit.kernel
def copy_kernel(X, Y, N, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK]


def _vectors():
    x = torch.arange(100, dtype=torch.float32)
    return x, torch.empty_like(x)


# -- user functions that tilejit calls back -------------------------------------------------------------------

def test_grid_without_meta_is_the_users_mistake():
    x, y = _vectors()
    grid = lambda: (4,)  # noqa: E731  # ERR
    error, text = failure(lambda: copy_kernel[grid](x, y, 100, BLOCK=32))
    assert isinstance(error, UsageTypeError) and isinstance(error, TypeError)
    assert "grid function" in str(error) and "takes 0 positional arguments but 1 was given" in str(error)
    assert f"{THIS_FILE}:{line_of(test_grid_without_meta_is_the_users_mistake)}" in str(error)
    assert "lambda meta:" in str(error)


def test_grid_with_two_parameters_is_the_users_mistake():
    x, y = _vectors()
    grid = lambda meta, n: (4,)  # noqa: E731  # ERR
    error, _ = failure(lambda: copy_kernel[grid](x, y, 100, BLOCK=32))
    assert isinstance(error, UsageTypeError)
    assert "is missing 1 required positional argument: 'n'" in str(error)
    assert f"{THIS_FILE}:{line_of(test_grid_with_two_parameters_is_the_users_mistake)}" in str(error)


def _raising_grid(meta):
    return (tilejit.cdiv(meta["n"], meta["BLOCK"]),)  # ERR


def test_exception_in_grid_function_shows_the_users_line():
    x, y = _vectors()
    error, text = failure(lambda: copy_kernel[_raising_grid](x, y, 100, BLOCK=32))
    assert isinstance(error, KeyError)
    assert f'File "{THIS_FILE}", line {line_of(_raising_grid)}, in _raising_grid' in text


def _two_configs(**config_kwargs):
    return [tilejit.Config({"BLOCK": 32}, **config_kwargs), tilejit.Config({"BLOCK": 64}, **config_kwargs)]


def _failing_hook(args):
    raise ValueError("hook refuses")  # ERR


@pytest.mark.parametrize("pre_hook", [lambda: None, _failing_hook], ids=["arity", "raises"])
def test_pre_hook_mistakes_are_the_users(pre_hook):
    tuned = tilejit.autotune(configs=_two_configs(pre_hook=pre_hook), key=["N"])(copy_kernel)
    x, y = _vectors()
    error, text = failure(lambda: tuned[(4,)](x, y, 100))
    if pre_hook is _failing_hook:
        assert isinstance(error, ValueError) and "hook refuses" in str(error)
        assert f'line {line_of(_failing_hook)}, in _failing_hook' in text
    else:
        assert isinstance(error, UsageTypeError) and "pre_hook" in str(error) and THIS_FILE in str(error)


def test_prune_function_with_wrong_parameters_is_the_users_mistake():
    prune = lambda configs: configs  # noqa: E731  # ERR
    tuned = tilejit.autotune(configs=_two_configs(), key=["N"], prune_configs_by={"early_config_prune": prune})(
        copy_kernel)
    x, y = _vectors()
    error, _ = failure(lambda: tuned[(4,)](x, y, 100))
    assert isinstance(error, UsageTypeError) and "early_config_prune" in str(error)
    assert f"{THIS_FILE}:{line_of(test_prune_function_with_wrong_parameters_is_the_users_mistake)}" in str(error)


def test_heuristic_mistakes_are_the_users():
    wrong_arity = tilejit.heuristics({"BLOCK": lambda: 32})(copy_kernel)
    x, y = _vectors()
    error, _ = failure(lambda: wrong_arity[(4,)](x, y, 100))
    assert isinstance(error, UsageTypeError) and "heuristic computing 'BLOCK'" in str(error)
    raising = tilejit.heuristics({"BLOCK": lambda args: args["n"]})(copy_kernel)  # ERR
    error, text = failure(lambda: raising[(4,)](x, y, 100))
    assert isinstance(error, KeyError)
    assert f"line {line_of(test_heuristic_mistakes_are_the_users)}" in text


def test_fake_mistake_is_not_called_a_tilejit_bug():
    op = tilejit.torch_op("tilejit_habits::scaled", fake=lambda x: x.new_empty(x.shape[5]))(_scaled)  # ERR
    with pytest.raises(Exception) as info:
        with torch._subclasses.fake_tensor.FakeTensorMode():
            op(torch.empty(4))
    text = "".join(traceback.format_exception(info.value))
    assert "tilejit bug" not in text and not isinstance(info.value, InternalError)
    assert f"line {line_of(test_fake_mistake_is_not_called_a_tilejit_bug)}" in text


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


# -- launch arguments -----------------------------------------------------------------------------------------

def test_numpy_array_argument_says_torch_from_numpy():
    _, y = _vectors()
    error, _ = failure(lambda: copy_kernel[(4,)](np.zeros(100, np.float32), y, 100, BLOCK=32))
    assert "torch.from_numpy" in str(error)


def test_autotune_key_suggestion_ignores_case():
    error, _ = failure(lambda: tilejit.autotune(configs=_two_configs(), key=["n"])(copy_kernel))
    assert "(did you mean 'N'?)" in str(error)


# -- Triton's names -------------------------------------------------------------------------------------------

@tilejit.kernel
def k_tl_load(X, Y, N, BLOCK: T.constexpr):
    offs = T.program_id(0) * BLOCK + T.arange(0, BLOCK)
    x = T.load(X + offs, mask=offs < N)  # ERR
    Y[0:BLOCK] = x


@tilejit.kernel
def k_tl_store(X, Y, BLOCK: T.constexpr):
    T.store(Y, X[0:BLOCK])  # ERR


@tilejit.kernel
def k_tl_dot(A, B, C, BM: T.constexpr):
    C[0:BM, 0:BM] = T.dot(A[0:BM, 0:BM], B[0:BM, 0:BM])  # ERR


@tilejit.kernel
def k_tl_trans(A, C, BM: T.constexpr):
    C[0:BM, 0:BM] = T.trans(A[0:BM, 0:BM])  # ERR


@tilejit.kernel
def k_tl_block_ptr(A, C, BM: T.constexpr):
    p = T.make_block_ptr(A, (BM, BM), (BM, 1), (0, 0), (BM, BM), (1, 0))  # ERR
    C[0:BM, 0:BM] = p


@pytest.mark.parametrize("kernel, name, spelling", [
    (k_tl_load, "load", "X[i:i + BLOCK]"),
    (k_tl_store, "store", "Y[i:i + BLOCK] = y"),
    (k_tl_dot, "dot", "a @ b"),
    (k_tl_trans, "trans", "x.T"),
    (k_tl_block_ptr, "make_block_ptr", "A[m0:m0 + BM, k0:k0 + BK]"),
], ids=lambda v: v if isinstance(v, str) and "[" not in v and " " not in v else None)
def test_triton_names_get_the_tilejit_spelling(kernel, name, spelling):
    args = [meta(64, 64) if p in ("A", "B", "C", "X", "Y") else 64 for p in kernel.arg_names[:-1]]
    error, text = failure(lambda: kernel.ir(*args, **{kernel.arg_names[-1]: 16}))
    assert isinstance(error, NameResolutionError)
    assert error.lineno == line_of(kernel.fn) and error.filename == THIS_FILE
    assert f"has no attribute '{name}'" in error.message and "did you mean" not in error.message
    assert f"Triton's tl.{name}" in error.hint and spelling in error.hint
    assert "coming-from-triton" in error.hint


def test_every_triton_spelling_names_the_docs_section():
    from tilejit.frontend.triton_names import TRITON_SPELLINGS

    docs = open(tilejit.docs(), encoding="utf-8").read()
    section = docs[docs.index("## Coming from Triton"):]
    for name in ("load", "store", "dot", "trans", "make_block_ptr", "advance", "multiple_of", "arange", "where",
                 "program_id", "autotune", "heuristics", "do_bench", "TRITON_INTERPRET"):
        assert name in section, name
    assert not hasattr(T, "load") and all(not hasattr(T, n) for n in TRITON_SPELLINGS)


# -- lists of constants ---------------------------------------------------------------------------------------

@tilejit.kernel
def k_constant_list(X, Y, BLOCK: T.constexpr):
    w = [0.25, 0.5, 0.25]
    Y[1:1 + BLOCK] = w[0] * X[0:BLOCK] + w[1] * X[1:1 + BLOCK] + w[2] * X[2:2 + BLOCK]


def test_list_of_constants_is_accepted_as_a_tuple():
    x = torch.arange(10, dtype=torch.float32)
    y = torch.zeros(10)
    k_constant_list[(1,)](x, y, BLOCK=8)
    expected = torch.zeros(10)
    expected[1:9] = 0.25 * x[0:8] + 0.5 * x[1:9] + 0.25 * x[2:10]
    torch.testing.assert_close(y, expected)


# -- hints that are right, applied ----------------------------------------------------------------------------

@tilejit.kernel
def k_add_transposed(X, Y, LEFT_T: T.constexpr, RIGHT_T: T.constexpr):
    a = X[0:64, 0:32]
    b = Y[0:32, 0:64]
    if LEFT_T:
        a = a.T
    if RIGHT_T:
        b = b.T
    c = a + b  # ERR
    X[0:c.shape[0], 0:c.shape[1]] = c


def test_broadcast_hint_names_both_operands_and_either_fix_compiles():
    error, _ = failure(lambda: k_add_transposed.ir(meta(64, 64), meta(64, 64), LEFT_T=False, RIGHT_T=False))
    assert isinstance(error, TypeCheckError) and error.lineno == line_of(k_add_transposed.fn)
    assert "left operand (64, 32)" in error.hint and "right operand (32, 64)" in error.hint
    k_add_transposed.ir(meta(64, 64), meta(64, 64), LEFT_T=True, RIGHT_T=False)
    k_add_transposed.ir(meta(64, 64), meta(64, 64), LEFT_T=False, RIGHT_T=True)


@tilejit.kernel
def k_product_short_slice(A, B, C, BK: T.constexpr, B_ROWS: T.constexpr):
    a = A[0:64, 0:BK]
    b = B[0:B_ROWS, 0:64]
    C[0:64, 0:64] = a @ b  # ERR


def test_product_hint_without_accumulator_names_both_shapes():
    # B sliced with the wrong length: no transpose is prescribed, the fix is the slice's length
    error, _ = failure(lambda: k_product_short_slice.ir(meta(64, 64), meta(64, 64), meta(64, 64), BK=32, B_ROWS=64))
    assert isinstance(error, TypeCheckError) and error.lineno == line_of(k_product_short_slice.fn)
    assert "a is 64x32 and b is 64x64" in error.hint and "looks transposed" not in error.hint
    k_product_short_slice.ir(meta(64, 64), meta(64, 64), meta(64, 64), BK=32, B_ROWS=32)  # the slice fixed


@tilejit.kernel
def k_gemm_transposed_b(A, B, C, TRANSPOSE_B: T.constexpr):
    acc = T.zeros((64, 32), T.float32)
    acc = T.gemm(A[0:64, 0:16], B[0:32, 0:16], acc, transpose_b=TRANSPOSE_B)  # ERR
    C[0:64, 0:32] = acc


def test_gemm_hint_with_accumulator_prescribes_the_one_transpose_and_it_compiles():
    error, _ = failure(lambda: k_gemm_transposed_b.ir(meta(64, 64), meta(64, 64), meta(64, 64), TRANSPOSE_B=False))
    assert error.lineno == line_of(k_gemm_transposed_b.fn)
    assert "transpose_b=True" in error.hint
    k_gemm_transposed_b.ir(meta(64, 64), meta(64, 64), meta(64, 64), TRANSPOSE_B=True)


@tilejit.kernel
def k_gemm_transposed_acc(A, B, C, SWAP: T.constexpr):
    acc = T.zeros((64, 32), T.float32)
    if SWAP:
        acc = T.gemm(B[0:16, 0:64], A[0:32, 0:16], acc, transpose_a=True, transpose_b=True)
    else:
        acc = T.gemm(A[0:32, 0:16], B[0:16, 0:64], acc)  # ERR
    C[0:64, 0:32] = acc


def test_transposed_accumulator_hint_applied_compiles():
    error, _ = failure(lambda: k_gemm_transposed_acc.ir(meta(64, 64), meta(64, 64), meta(64, 64), SWAP=False))
    assert error.lineno == line_of(k_gemm_transposed_acc.fn)
    assert "T.gemm(b, a, acc, transpose_a=True, transpose_b=True)" in error.hint
    k_gemm_transposed_acc.ir(meta(64, 64), meta(64, 64), meta(64, 64), SWAP=True)


@tilejit.kernel
def k_store_transposed(X, TRANSPOSE: T.constexpr):
    v = X[0:32, 0:16]
    if TRANSPOSE:
        v = v.T
    X[0:16, 0:32] = v  # ERR


def test_store_hint_applied_compiles():
    error, _ = failure(lambda: k_store_transposed.ir(meta(64, 64), TRANSPOSE=False))
    assert error.lineno == line_of(k_store_transposed.fn) and "value.T" in error.hint
    k_store_transposed.ir(meta(64, 64), TRANSPOSE=True)


def test_list_of_run_time_values_is_still_refused():
    @tilejit.kernel
    def k(X, BN: T.constexpr):
        sizes = [BN, X.shape[0]]  # noqa: F841  # ERR
        X[0:BN] = 0.0

    error, _ = failure(lambda: k.ir(meta(64), BN=16))
    assert isinstance(error, UnsupportedSyntaxError) and "a list of constants" in error.hint
    assert isinstance(error, CompilationError) and error.lineno == line_of(k.fn)
