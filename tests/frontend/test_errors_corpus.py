"""A corpus of malformed kernels and launches: each must fail with the right public error, at the right place.

Every malformed kernel marks its offending line with a ``# ERR`` comment; the test finds that line through
``inspect`` and checks that the error points at it (``err.lineno``), that ``str(err)`` starts with this file's
path, shows the source line and a caret under the expected token, and says what went wrong. Compile errors are
raised by ``kernel.ir(...)`` on ``meta`` tensors; launch errors run with ``TILEJIT_INTERPRET=1`` on CPU tensors.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit import (CompilationError, NameResolutionError, SharedMemoryError, TypeCheckError,
                     UnsupportedSyntaxError)
from tilejit.language import LanguageUsageError
from tilejit.passes.split_k import SplitKError

THIS_FILE = inspect.getsourcefile(lambda: None)
MUTABLE_TABLE = [1, 2, 3]
MUTABLE_DICT = {"block": 64}


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def plain_python_helper(x):
    return x + 1


# -- unsupported syntax -----------------------------------------------------------------------------------------

@tilejit.kernel
def k_try(X, BN: T.constexpr):
    try:  # ERR
        X[0:BN] = 0.0
    except Exception:
        pass


@tilejit.kernel
def k_with(X, BN: T.constexpr):
    with open("f"):  # ERR
        X[0:BN] = 0.0


@tilejit.kernel
def k_while(X, n, BN: T.constexpr):
    acc = T.zeros((BN,), T.float32)
    i = 0
    while i < n:  # ERR
        acc = acc + 1.0
        i = i + 1
    X[0:BN] = acc


@tilejit.kernel
def k_lambda(X, BN: T.constexpr):
    f = lambda v: v + 1  # ERR  # noqa: E731
    X[0:BN] = f(1.0)


@tilejit.kernel
def k_nested_def(X, BN: T.constexpr):
    def inner(v):  # ERR
        return v
    X[0:BN] = inner(1.0)


@tilejit.kernel
def k_break(X, n, BN: T.constexpr):
    for i in range(n):
        break  # ERR


@tilejit.kernel
def k_continue(X, n, BN: T.constexpr):
    for i in range(n):
        continue  # ERR


@tilejit.kernel
def k_early_return(X, n, BN: T.constexpr):
    if n > 0:
        return  # ERR
    X[0:BN] = 0.0


@tilejit.kernel
def k_return_value(X, BN: T.constexpr):
    x = X[0:BN]
    return x  # ERR


@tilejit.kernel
def k_varargs(X, *rest):  # ERR
    X[0:16] = 0.0


@tilejit.kernel
def k_strided_slice(X, BN: T.constexpr):
    X[0:BN] = X[0:BN:2]  # ERR


@tilejit.kernel
def k_for_else(X, n, BN: T.constexpr):
    for i in range(n):  # ERR
        X[0:BN] = 0.0
    else:
        pass


@tilejit.kernel
def k_for_over_list(X, BN: T.constexpr):
    for i in [1, 2]:  # ERR
        X[0:BN] = 0.0


@tilejit.kernel
def k_list_comp(X, BN: T.constexpr):
    s = [i for i in range(4)]  # ERR
    X[0:BN] = 0.0


# -- names and globals ---------------------------------------------------------------------------------------

@tilejit.kernel
def k_mutable_global(X, BN: T.constexpr):
    X[0:BN] = MUTABLE_TABLE[0]  # ERR


@tilejit.kernel
def k_mutable_global_dict(X, BN: T.constexpr):
    X[0:BN] = MUTABLE_DICT["block"]  # ERR


def _make_closure_kernel():
    sizes = [16, 32]

    @tilejit.kernel
    def k_closure(X, BN: T.constexpr):
        X[0:BN] = sizes[0]  # ERR

    return k_closure


k_closure = _make_closure_kernel()


@tilejit.kernel
def k_plain_python_call(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = plain_python_helper(x)  # ERR


@tilejit.func
def recursive_helper(x):
    return recursive_helper(x)  # ERR


@tilejit.kernel
def k_recursion(X, BN: T.constexpr):
    X[0:BN] = recursive_helper(X[0:BN])


@tilejit.kernel
def k_undefined_name(X, BN: T.constexpr):
    X[0:BN] = undefined_thing + 1  # ERR  # noqa: F821


@tilejit.kernel
def k_one_branch(X, n, BN: T.constexpr):
    if n > 0:
        y = 1.0
    X[0:BN] = y  # ERR


@tilejit.kernel
def k_defined_in_loop(X, n, BN: T.constexpr):
    for i in range(n):
        last = X[i:i + BN]
    X[0:BN] = last  # ERR


@tilejit.kernel
def k_tensor_attr(X, BN: T.constexpr):
    X[0:BN] = X.numel  # ERR


@tilejit.kernel
def k_tile_attr(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = x.mean  # ERR


# -- slices and stores ---------------------------------------------------------------------------------------

@tilejit.kernel
def k_runtime_slice_length(X, m0, n0):
    X[0:16] = X[m0:n0]  # ERR


@tilejit.kernel
def k_open_slice(X, m0):
    X[0:16] = X[m0:]  # ERR


@tilejit.kernel
def k_too_many_indices(X, BN: T.constexpr):
    X[0:BN] = X[0:BN, 0]  # ERR


@tilejit.kernel
def k_store_wrong_shape(X, BN: T.constexpr):
    X[0:BN, 0:BN] = T.zeros((BN, 2 * BN), T.float32)  # ERR


@tilejit.kernel
def k_stride_runtime(X, d, BN: T.constexpr):
    X[0:BN] = X.stride(d)  # ERR


@tilejit.kernel
def k_all_int_indices(X, BN: T.constexpr):
    X[1, 2] = X[0:BN, 0]  # ERR


# -- types and shapes ----------------------------------------------------------------------------------------

@tilejit.kernel
def k_gemm_inner(A, B, C, BM: T.constexpr, BK: T.constexpr):
    a = A[0:BM, 0:BK]
    b = B[0:2 * BK, 0:BM]
    C[0:BM, 0:BM] = a @ b  # ERR


@tilejit.kernel
def k_gemm_dtypes(A, B, C, BM: T.constexpr):
    a = A[0:BM, 0:BM]
    b = B[0:BM, 0:BM]
    C[0:BM, 0:BM] = a @ b  # ERR


@tilejit.kernel
def k_gemm_acc_dtype(A, B, C, BM: T.constexpr):
    acc = T.zeros((BM, BM), T.float16)
    acc = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], acc)  # ERR
    C[0:BM, 0:BM] = acc


@tilejit.kernel
def k_broadcast(X, BN: T.constexpr):
    a = X[0:BN, 0:BN]
    b = X[0:BN, 0:2 * BN]
    X[0:BN, 0:BN] = a + b  # ERR


@tilejit.kernel
def k_floordiv_float(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = x // 2  # ERR


@tilejit.kernel
def k_loop_changes_shape(X, n, BN: T.constexpr):
    acc = T.zeros((BN,), T.float32)
    for i in range(n):
        acc = T.zeros((2 * BN,), T.float32)  # ERR
    X[0:BN] = acc


@tilejit.kernel
def k_if_on_tile(X, BN: T.constexpr):
    x = X[0:BN]
    if x > 0:  # ERR
        X[0:BN] = x


@tilejit.kernel
def k_and_on_tiles(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = T.where((x > 0) and (x < 1), x, 0.0)  # ERR


@tilejit.kernel
def k_arange_runtime(X, n):
    X[0:16] = T.arange(0, n)  # ERR


@tilejit.kernel
def k_zeros_runtime(X, n):
    X[0:16] = T.zeros((n,), T.float32)  # ERR


@tilejit.kernel
def k_stages_zero(X, n, BN: T.constexpr):
    for i in T.range(0, n, 1, stages=0):  # ERR
        X[0:BN] = 0.0


@tilejit.kernel
def k_static_range_runtime(X, n, BN: T.constexpr):
    for i in T.static_range(n):  # ERR
        X[0:BN] = 0.0


@tilejit.kernel
def k_program_id_axis(X, BN: T.constexpr):
    X[0:BN] = T.program_id(3)  # ERR


@tilejit.kernel
def k_program_id_float_axis(X, BN: T.constexpr):
    X[0:BN] = T.num_programs(0.0)  # ERR


@tilejit.kernel
def k_math_domain(X, BN: T.constexpr):
    X[0:BN] = math.log(-1.0)  # ERR


@tilejit.kernel
def k_float_of_text(X, BN: T.constexpr):
    X[0:BN] = float("one")  # ERR


@tilejit.kernel
def k_negated_mask(X, BN: T.constexpr):
    X[0:BN] = (-(X[0:BN] > 0)).to(T.float16)  # ERR


@tilejit.kernel
def k_runtime_pow(X, n, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = x ** n  # ERR


@tilejit.kernel
def k_math_on_runtime(X, n, BN: T.constexpr):
    X[0:BN] = math.log(n)  # ERR


@tilejit.kernel
def k_reduce_axis(X, BN: T.constexpr):
    x = X[0:BN, 0:BN]
    X[0:BN, 0] = T.sum(x, 2)  # ERR


@tilejit.kernel
def k_to_not_dtype(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = x.to("float16")  # ERR


@tilejit.kernel
def k_compile_time_assert(X, BN: T.constexpr):
    assert BN % 32 == 0, "BN must be a multiple of 32"  # ERR
    X[0:BN] = 0.0


@tilejit.func
def two_args(a, b):
    return a + b


@tilejit.kernel
def k_helper_arity(X, BN: T.constexpr):
    X[0:BN] = two_args(X[0:BN])  # ERR


@tilejit.kernel
def k_matmul_1d(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = x @ x  # ERR


@tilejit.kernel
def k_full_of_tile(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = T.full((BN,), x, T.float32)  # ERR


@tilejit.kernel
def k_float_slice_start(X, f, BN: T.constexpr):
    X[0:BN] = X[f:f + BN]  # ERR


@tilejit.kernel
def k_exp_of_tensor(X, BN: T.constexpr):
    X[0:BN] = T.exp(X)  # ERR




@tilejit.func
def helper_with_try(x, SAFE):
    if SAFE:
        try:  # ERR
            x = x + 1
        finally:
            pass
    return x


@tilejit.kernel
def k_try_in_helper(X, BN: T.constexpr):
    X[0:BN] = helper_with_try(X[0:BN], False)


@tilejit.func
def helper_early_return(x, FLAG):
    if FLAG:
        return x * 2  # ERR
    return x


@tilejit.kernel
def k_helper_early_return(X, BN: T.constexpr, FLAG: T.constexpr):
    X[0:BN] = helper_early_return(X[0:BN], FLAG)


@dataclass
class Case:
    kernel: Any
    args: Callable[[], tuple]
    kwargs: dict
    error: type
    phrase: str
    at: str                       # the source text the caret must point at
    marked: Callable | None = None  # the function holding '# ERR' (default: the kernel)
    trigger: Callable | None = None  # how to provoke it (default: case.kernel.ir(*args, **kwargs))
    hint: str | None = None       # a phrase the hint must hold
    id: str = field(default="")


def X1():
    return (meta(64),)


def X2():
    return (meta(64, 64),)


# -- language constructs: atomics, index tiles, math, bounded views ------------------------------------------------

@tilejit.kernel
def k_atomic_on_bool(X, BN: T.constexpr):
    T.atomic_add(X[0:BN], True)  # ERR


@tilejit.kernel
def k_atomic_bad_sem(X, BN: T.constexpr):
    T.atomic_max(X[0:BN], 1.0, sem="seq_cst")  # ERR


@tilejit.kernel
def k_float_index_tile(X, BN: T.constexpr):
    X[0:BN] = X[X[0:BN]]  # ERR


@tilejit.kernel
def k_cumsum_bad_axis(X, BN: T.constexpr):
    X[0:BN] = T.cumsum(X[0:BN], 2)  # ERR


@tilejit.kernel
def k_bounded_wrong_rank(X, BN: T.constexpr):
    Xv = T.bounded(X, (4, 4))  # ERR
    X[0:BN] = Xv[0:BN]


@tilejit.kernel
def k_to_with_extra_keyword(X, BN: T.constexpr):
    x = X[0:BN]
    X[0:BN] = x.to(T.float16, rounding="rn")  # ERR


CASES = [
    Case(k_try, X1, dict(BN=16), UnsupportedSyntaxError, "a 'try' statement is not supported", "try:"),
    Case(k_with, X1, dict(BN=16), UnsupportedSyntaxError, "a 'with' statement is not supported", "with open"),
    Case(k_while, lambda: (meta(64), 4), dict(BN=16), UnsupportedSyntaxError,
         "a while loop cannot carry the tile 'acc'", "while i < n", hint="docs/language.md#while-loops"),
    Case(k_lambda, X1, dict(BN=16), UnsupportedSyntaxError, "a 'lambda' expression is not supported", "lambda v",
         hint="@tilejit.func"),
    Case(k_nested_def, X1, dict(BN=16), UnsupportedSyntaxError,
         "a function defined inside a kernel ('def' in its body) is not supported", "def inner",
         hint="define helpers at module level with @tilejit.func"),
    Case(k_break, lambda: (meta(64), 4), dict(BN=16), UnsupportedSyntaxError, "'break' is not supported", "break"),
    Case(k_continue, lambda: (meta(64), 4), dict(BN=16), UnsupportedSyntaxError, "'continue' is not supported",
         "continue"),
    Case(k_early_return, lambda: (meta(64), 4), dict(BN=16), UnsupportedSyntaxError, "an early 'return' is not supported",
         "return"),
    Case(k_return_value, X1, dict(BN=16), UnsupportedSyntaxError, "a kernel cannot return a value", "return x"),
    # checked on the parsed source: kernel.ir()/launch bind the arguments first (see test_varargs_on_launch)
    Case(k_varargs, X1, {}, UnsupportedSyntaxError, "kernels cannot take *args", "rest",
         trigger=lambda case: case.kernel.parsed),
    Case(k_strided_slice, X1, dict(BN=16), UnsupportedSyntaxError, "strided slices are not supported", "0:BN:2"),
    Case(k_for_else, lambda: (meta(64), 4), dict(BN=16), UnsupportedSyntaxError, "for/else", "for i"),
    Case(k_for_over_list, X1, dict(BN=16), UnsupportedSyntaxError, "must iterate over range", "[1, 2]"),
    Case(k_list_comp, X1, dict(BN=16), UnsupportedSyntaxError, "a list comprehension ([... for ...]) is not supported", "[i for"),
    Case(k_mutable_global, X1, dict(BN=16), NameResolutionError, "global 'MUTABLE_TABLE' (list) cannot be used",
         "MUTABLE_TABLE"),
    Case(k_mutable_global_dict, X1, dict(BN=16), NameResolutionError, "global 'MUTABLE_DICT' (dict) cannot be used",
         "MUTABLE_DICT"),
    Case(k_closure, X1, dict(BN=16), NameResolutionError, "'sizes' (list) cannot be used", "sizes"),
    Case(k_to_with_extra_keyword, X1, dict(BN=16), TypeCheckError, ".to() takes exactly one argument", "x.to("),
    Case(k_plain_python_call, X1, dict(BN=16), NameResolutionError, "'plain_python_helper' (function) cannot be used",
         "plain_python_helper", hint="decorate it with @tilejit.func"),
    Case(k_recursion, X1, dict(BN=16), UnsupportedSyntaxError, "recursion is not supported", "recursive_helper(x)",
         marked=recursive_helper.fn),
    Case(k_undefined_name, X1, dict(BN=16), NameResolutionError, "name 'undefined_thing' is not defined",
         "undefined_thing"),
    Case(k_one_branch, lambda: (meta(64), 4), dict(BN=16), NameResolutionError,
         "'y' is not defined here: it is assigned in only one branch", "y  #"),
    Case(k_defined_in_loop, lambda: (meta(64), 4), dict(BN=16), NameResolutionError,
         "'last' is not defined here: it is first assigned inside a loop", "last  #"),
    Case(k_tensor_attr, X1, dict(BN=16), NameResolutionError, "tensor X has no attribute 'numel'", "X.numel"),
    Case(k_tile_attr, X1, dict(BN=16), NameResolutionError, "has no attribute 'mean'", "x.mean"),
    Case(k_runtime_slice_length, lambda: (meta(64), 0, 16), {}, TypeCheckError,
         "the length of a slice must be a compile-time constant", "m0:n0"),
    Case(k_open_slice, lambda: (meta(64), 0), {}, TypeCheckError, "a slice needs an end", "m0:]"),
    Case(k_too_many_indices, X1, dict(BN=16), TypeCheckError, "too many indices (2) for tensor 'X' of rank 1",
         "X[0:BN, 0]  #"),
    Case(k_store_wrong_shape, X2, dict(BN=16), TypeCheckError,
         "cannot store a tile of shape (16, 32) into a window of shape (16, 16)", "X[0:BN, 0:BN] ="),
    Case(k_stride_runtime, lambda: (meta(64), 0), dict(BN=16), TypeCheckError, "stride() takes one compile-time int",
         "X.stride(d)"),
    Case(k_all_int_indices, X2, dict(BN=16), TypeCheckError, "cannot store a tile of shape (16,) into one element",
         "X[1, 2]"),
    Case(k_gemm_inner, lambda: (meta(64, 64), meta(64, 64), meta(64, 64)), dict(BM=16, BK=16), TypeCheckError,
         "matrix product inner dimensions differ: 16x16 @ 32x16", "a @ b"),
    Case(k_gemm_dtypes, lambda: (meta(64, 64), meta(64, 64, dtype=torch.bfloat16), meta(64, 64)), dict(BM=16),
         TypeCheckError, "different dtypes f16 and bf16", "a @ b"),
    Case(k_gemm_acc_dtype, lambda: (meta(64, 64), meta(64, 64), meta(64, 64)), dict(BM=16), TypeCheckError,
         "accumulator must be f32 for f16 operands, got f16", "T.gemm", hint="out_dtype=T.float16"),
    Case(k_broadcast, X2, dict(BN=16), TypeCheckError, "cannot broadcast shapes (16, 16) and (16, 32)", "a + b"),
    Case(k_floordiv_float, X1, dict(BN=16), TypeCheckError, "operator 'floordiv' needs integer operands, got f16",
         "x // 2"),
    Case(k_loop_changes_shape, lambda: (meta(64), 4), dict(BN=16), TypeCheckError,
         "'acc' is a tile of shape (16,) on one path and (32,) on the other", "acc = T.zeros((2"),
    Case(k_if_on_tile, X1, dict(BN=16), TypeCheckError, "'if' needs a scalar condition", "x > 0"),
    Case(k_and_on_tiles, X1, dict(BN=16), TypeCheckError, "'and'/'or' need scalars", "(x > 0) and"),
    Case(k_arange_runtime, lambda: (meta(64), 16), {}, TypeCheckError, "T.arange needs compile-time integer bounds",
         "T.arange"),
    Case(k_zeros_runtime, lambda: (meta(64), 16), {}, TypeCheckError, "a tile shape must be a tuple of compile-time ints",
         "T.zeros"),
    Case(k_stages_zero, lambda: (meta(64), 4), dict(BN=16), TypeCheckError, "stages must be a compile-time int >= 1",
         "T.range"),
    Case(k_static_range_runtime, lambda: (meta(64), 4), dict(BN=16), TypeCheckError,
         "T.static_range needs compile-time bounds", "T.static_range"),
    Case(k_program_id_axis, X1, dict(BN=16), TypeCheckError, "grid axis must be 0, 1 or 2, got 3", "T.program_id"),
    Case(k_program_id_float_axis, X1, dict(BN=16), TypeCheckError, "grid axis must be 0, 1 or 2, got 0.0",
         "T.num_programs"),
    Case(k_math_domain, X1, dict(BN=16), TypeCheckError, "cannot fold math.log(-1.0) at compile time: math domain error",
         "math.log"),
    Case(k_float_of_text, X1, dict(BN=16), TypeCheckError, "cannot fold float('one') at compile time", "float("),
    Case(k_negated_mask, X1, dict(BN=16), TypeCheckError, "negation is not defined on bool values", "-(X"),
    Case(k_runtime_pow, lambda: (meta(64), 3), dict(BN=16), TypeCheckError, "'**' on runtime values", "x ** n"),
    Case(k_math_on_runtime, lambda: (meta(64), 3), dict(BN=16), TypeCheckError,
         "math.log runs at compile time on constants only", "math.log"),
    Case(k_reduce_axis, X2, dict(BN=16), TypeCheckError, "axis must be a constant int in [-2, 2), got 2", "T.sum"),
    Case(k_to_not_dtype, X1, dict(BN=16), TypeCheckError, ".to() takes a dtype such as T.float16", "x.to"),
    Case(k_compile_time_assert, X1, dict(BN=16), TypeCheckError,
         "assertion failed at compile time: BN must be a multiple of 32", "assert"),
    Case(k_helper_arity, X1, dict(BN=16), TypeCheckError, "two_args() is missing arguments ['b']", "two_args("),
    Case(k_full_of_tile, X1, dict(BN=16), TypeCheckError, "the fill value must be a scalar, got tile", "T.full"),
    Case(k_float_slice_start, lambda: (meta(64), 1.5), dict(BN=16), TypeCheckError,
         "slice bounds must be integers, got scalar of type f32", "f:f + BN"),
    Case(k_exp_of_tensor, X1, dict(BN=16), TypeCheckError, "expected a scalar or tile, got tensor 'X'", "T.exp"),
    # rejected although DEBUG=False prunes the branch: kernels are checked whole, whatever the arguments
    Case(k_try_in_helper, X1, dict(BN=16), UnsupportedSyntaxError, "a 'try' statement is not supported", "try:",
         marked=helper_with_try.fn),
    Case(k_matmul_1d, X1, dict(BN=16), TypeCheckError, "matrix product operand a must be a 2-D tile", "x @ x"),
    Case(k_atomic_on_bool, lambda: (meta(64, dtype=torch.bool),), dict(BN=16), TypeCheckError,
         "T.atomic_add on a bool tensor is not supported", "T.atomic_add"),
    Case(k_atomic_bad_sem, X1, dict(BN=16), TypeCheckError,
         "sem must be one of 'relaxed', 'acquire', 'release', 'acq_rel', got 'seq_cst'", '"seq_cst"'),
    Case(k_float_index_tile, X1, dict(BN=16), TypeCheckError, "an index tile must be a 1-D integer tile", "X[0:BN]]"),
    Case(k_cumsum_bad_axis, X1, dict(BN=16), TypeCheckError, "axis must be a constant int in [-1, 1), got 2",
         "T.cumsum"),
    Case(k_bounded_wrong_rank, X1, dict(BN=16), TypeCheckError, "T.bounded of the rank-1 tensor 'X' needs 1 extent, got 2",
         "T.bounded"),
]


# -- close names and hints that fit -------------------------------------------------------------------------

@tilejit.kernel
def k_undefined_close(X, alpha, BN: T.constexpr):
    X[0:BN] = X[0:BN] * alpah  # ERR  # noqa: F821


@tilejit.kernel
def k_language_typo(X, BN: T.constexpr):
    X[0:BN] = T.zeroes((BN,), T.float32)  # ERR


@tilejit.kernel
def k_builtin_keyword_typo(X, BN: T.constexpr):
    X[0:BN] = T.zeros((BN,), dtyp=T.float32)  # ERR


@tilejit.kernel
def k_loop_keyword_typo(X, n, BN: T.constexpr):
    for i in T.range(0, n, 1, stage=2):  # ERR
        X[0:BN] = 0.0


@tilejit.kernel
def k_helper_keyword_typo(X, BN: T.constexpr):
    X[0:BN] = two_args(X[0:BN], bb=1.0)  # ERR


@tilejit.kernel
def k_tensor_attr_typo(X, BN: T.constexpr):
    M = X.shap[0]  # ERR
    X[0:BN] = 0.0


@tilejit.kernel
def k_tile_method(X, BN: T.constexpr):
    x = X[0:BN, 0:BN]
    X[0:BN, 0] = x.sum(1)  # ERR


@tilejit.kernel
def k_broadcast_transposed(X, BN: T.constexpr):
    a = X[0:BN, 0:2 * BN]
    b = X[0:2 * BN, 0:BN]
    X[0:BN, 0:2 * BN] = a + b  # ERR


@tilejit.kernel
def k_gemm_transposed(A, B, C, BM: T.constexpr, BK: T.constexpr):
    a = A[0:BM, 0:BK]
    b = B[0:BM, 0:BK]
    C[0:BM, 0:BM] = a @ b  # ERR


@tilejit.kernel
def k_store_transposed(X, BN: T.constexpr):
    X[0:BN, 0:2 * BN] = X[0:2 * BN, 0:BN]  # ERR


@tilejit.kernel
def k_while_tile_condition(X, BN: T.constexpr):
    x = X[0:BN]
    while x > 0:  # ERR
        x = x - 1.0
    X[0:BN] = x


@tilejit.kernel
def k_tuple_append(X, BN: T.constexpr):
    parts = ()
    parts.append(X[0:BN])  # ERR


@tilejit.kernel
def k_dict_literal(X, BN: T.constexpr):
    sizes = {"a": BN}  # ERR
    X[0:BN] = 0.0


@tilejit.kernel
def k_list_literal(X, BN: T.constexpr):
    sizes = [BN, X.shape[0]]  # ERR
    X[0:BN] = 0.0


@tilejit.kernel
def k_fstring(X, BN: T.constexpr):
    name = f"block{BN}"  # ERR
    X[0:BN] = 0.0


@tilejit.kernel
def k_walrus(X, BN: T.constexpr):
    X[0:BN] = (y := 1.0)  # ERR


@tilejit.kernel
def k_matmul_augassign(A, C, BM: T.constexpr):
    acc = T.zeros((BM, BM), T.float32)
    acc @= A[0:BM, 0:BM]  # ERR
    C[0:BM, 0:BM] = acc


@tilejit.kernel
def k_assign_attribute(X, BN: T.constexpr):
    x = X[0:BN]
    x.dtype = T.float32  # ERR


NEW_CASES = [
    Case(k_undefined_close, lambda: (meta(64), 2.0), dict(BN=16), NameResolutionError,
         "name 'alpah' is not defined (did you mean 'alpha'?)", "alpah"),
    Case(k_language_typo, X1, dict(BN=16), NameResolutionError,
         "module 'tilejit.language' has no attribute 'zeroes' (did you mean 'T.zeros'?)", "T.zeroes",
         hint="docs/language.md#reference"),
    Case(k_builtin_keyword_typo, X1, dict(BN=16), TypeCheckError,
         "unexpected keyword argument 'dtyp' (did you mean 'dtype'?)", "T.zeros", hint="T.zeros(shape, dtype)"),
    Case(k_loop_keyword_typo, lambda: (meta(64), 4), dict(BN=16), TypeCheckError,
         "unexpected keyword 'stage' for this loop (did you mean 'stages'?)", "T.range"),
    Case(k_helper_keyword_typo, X1, dict(BN=16), TypeCheckError,
         "two_args() got an unexpected or repeated argument 'bb' (did you mean 'b'?)", "two_args(",
         hint="two_args(a, b)"),
    Case(k_tensor_attr_typo, X1, dict(BN=16), NameResolutionError,
         "tensor X has no attribute 'shap' in a kernel (did you mean 'shape'?)", "X.shap"),
    Case(k_tile_method, X2, dict(BN=16), NameResolutionError, "has no attribute 'sum'", "x.sum",
         hint="write T.sum(x, ...)"),
    Case(k_broadcast_transposed, X2, dict(BN=16), TypeCheckError, "cannot broadcast shapes (16, 32) and (32, 16)",
         "a + b", hint="each other's transpose"),
    Case(k_gemm_transposed, lambda: (meta(64, 64), meta(64, 64), meta(64, 64)), dict(BM=16, BK=32), TypeCheckError,
         "matrix product inner dimensions differ: 16x32 @ 16x32", "a @ b", hint="a @ b.T"),
    Case(k_store_transposed, X2, dict(BN=16), TypeCheckError,
         "cannot store a tile of shape (32, 16) into a window of shape (16, 32)", "X[0:BN, 0:2", hint="value.T"),
    # the condition is the mistake, although the loop also carries the tile x
    Case(k_while_tile_condition, X1, dict(BN=16), TypeCheckError, "a while condition must be a scalar, not a tile",
         "x > 0", hint="reduce the tile first"),
    Case(k_tuple_append, X1, dict(BN=16), NameResolutionError, "tuple () has no attribute 'append'", "parts.append",
         hint="tiles are values, not lists"),
    Case(k_dict_literal, X1, dict(BN=16), UnsupportedSyntaxError, "a dict literal ({...}) is not supported", "{"),
    Case(k_list_literal, X1, dict(BN=16), UnsupportedSyntaxError,
         "a list literal ([...]) of run-time values is not supported", "[BN", hint="a list of constants"),
    Case(k_fstring, X1, dict(BN=16), UnsupportedSyntaxError, "an f-string is not supported", 'f"block'),
    Case(k_matmul_augassign, lambda: (meta(64, 64), meta(64, 64)), dict(BM=16), UnsupportedSyntaxError,
         "'@=' is not supported in kernels", "acc @=", hint="acc = T.gemm(a, b, acc)"),
    Case(k_assign_attribute, X1, dict(BN=16), UnsupportedSyntaxError,
         "cannot assign to an attribute (x.name = ...) in a kernel", "x.dtype"),
    Case(k_walrus, X1, dict(BN=16), UnsupportedSyntaxError, "an assignment expression (:=) is not supported",
         "y := 1.0"),
]


# -- matrix products: out_dtype, batched products ----------------------------------------------------------------

@tilejit.kernel
def k_out_dtype_f16_bf16(A, B, C, BM: T.constexpr):
    acc = T.zeros((BM, BM), T.float16)
    acc = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], acc, out_dtype=T.float16)  # ERR
    C[0:BM, 0:BM] = acc


@tilejit.kernel
def k_out_dtype_f16_int8(A, B, C, BM: T.constexpr):
    C[0:BM, 0:BM] = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], None, out_dtype=T.float16)  # ERR


@tilejit.kernel
def k_out_dtype_f16_fp8(A, B, C, BM: T.constexpr):
    C[0:BM, 0:BM] = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], None, out_dtype=T.float16)  # ERR


@tilejit.kernel
def k_out_dtype_acc_disagrees(A, B, C, BM: T.constexpr):
    acc = T.zeros((BM, BM), T.float32)
    acc = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], acc, out_dtype=T.float16)  # ERR
    C[0:BM, 0:BM] = acc


@tilejit.kernel
def k_out_dtype_not_a_dtype(A, B, C, BM: T.constexpr):
    C[0:BM, 0:BM] = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], None, out_dtype="float16")  # ERR


@tilejit.kernel
def k_out_dtype_int8_float32(A, B, C, BM: T.constexpr):
    C[0:BM, 0:BM] = T.gemm(A[0:BM, 0:BM], B[0:BM, 0:BM], None, out_dtype=T.float32)  # ERR


@tilejit.kernel
def k_batched_batch_differs(A, B, C, BM: T.constexpr):
    a = A[0:2, 0:BM, 0:BM]
    b = B[0:4, 0:BM, 0:BM]
    C[0:2, 0:BM, 0:BM] = a @ b  # ERR


@tilejit.kernel
def k_batched_rank_mismatch(A, B, C, BM: T.constexpr):
    a = A[0:2, 0:BM, 0:BM]
    b = B[0, 0:BM, 0:BM]
    C[0:2, 0:BM, 0:BM] = a @ b  # ERR


@tilejit.kernel
def k_batched_inner_differs(A, B, C, BM: T.constexpr):
    a = A[0:2, 0:BM, 0:BM]
    b = B[0:2, 0:2 * BM, 0:BM]
    C[0:2, 0:BM, 0:BM] = a @ b  # ERR


@tilejit.kernel
def k_batched_acc_shape(A, B, C, BM: T.constexpr):
    acc = T.zeros((2, BM, 2 * BM), T.float32)
    acc = T.gemm(A[0:2, 0:BM, 0:BM], B[0:2, 0:BM, 0:BM], acc)  # ERR
    C[0:2, 0:BM, 0:BM] = acc


def _abc(dtype, rank=2):
    return lambda: tuple(meta(*(4,) * (rank - 2), 64, 64, dtype=dtype) for _ in range(2)) + (meta(4, 64, 64),)


DOT_CASES = [
    Case(k_out_dtype_f16_bf16, _abc(torch.bfloat16), dict(BM=16), TypeCheckError,
         "out_dtype=float16 is not supported for bf16 operands", "T.gemm", hint="out_dtype=T.float32"),
    Case(k_out_dtype_f16_int8, _abc(torch.int8), dict(BM=16), TypeCheckError,
         "out_dtype=float16 is not supported for i8 operands", "T.gemm", hint="out_dtype=T.int32"),
    Case(k_out_dtype_f16_fp8, _abc(torch.float8_e4m3fn), dict(BM=16), TypeCheckError,
         "float16 accumulation needs float16 operands", "T.gemm"),
    Case(k_out_dtype_acc_disagrees, _abc(torch.float16), dict(BM=16), TypeCheckError,
         "accumulator dtype f32 disagrees with out_dtype=float16", "T.gemm", hint="T.zeros(..., T.float16)"),
    Case(k_out_dtype_not_a_dtype, _abc(torch.float16), dict(BM=16), TypeCheckError,
         "out_dtype must be a dtype such as T.float32", "T.gemm"),
    Case(k_out_dtype_int8_float32, _abc(torch.int8), dict(BM=16), TypeCheckError,
         "i8 operands accumulate in i32", "T.gemm"),
    Case(k_batched_batch_differs, _abc(torch.float16, 3), dict(BM=16), TypeCheckError,
         "batched matrix product batch dims differ: (2, 16, 16) @ (4, 16, 16)", "a @ b"),
    Case(k_batched_rank_mismatch, _abc(torch.float16, 3), dict(BM=16), TypeCheckError,
         "a batched matrix product needs two 3-D tiles", "a @ b", hint="x[None, :, :]"),
    Case(k_batched_inner_differs, _abc(torch.float16, 3), dict(BM=16), TypeCheckError,
         "batched matrix product inner dimensions differ: 2x16x16 @ 2x32x16", "a @ b"),
    Case(k_batched_acc_shape, _abc(torch.float16, 3), dict(BM=16), TypeCheckError,
         "accumulator shape (2, 16, 32) does not match the batched product 2x16x16", "T.gemm"),
]

# -- errors found by the backend's passes, located all the same ------------------------------------------------

@tilejit.kernel
def k_split_k_without_clusters(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]  # ERR
    C[0:BM, 0:BN] = acc.to(C.dtype)


@tilejit.kernel
def k_reduction_scratch_too_large(X, Y, BM: T.constexpr, BN: T.constexpr):
    x = X[0:BM, 0:BN]
    Y[0:BM] = T.sum(x, 1)  # ERR


def _compile_for(arch: str, **options):
    """A trigger: compile the case's kernel for ``arch`` with launch ``options``, up to the CUDA source."""
    return lambda case: case.kernel.compile(*case.args(), **case.kwargs, **options, arch=arch, stop_after="cuda")


BACKEND_CASES = [
    Case(k_split_k_without_clusters, lambda: (meta(256, 256), meta(256, 256), meta(256, 256)),
         dict(BM=64, BN=64, BK=32), SplitKError,
         "split_k=2 needs thread-block clusters (sm_90 or newer); sm_80 has none", "A[0:BM, k0",
         trigger=_compile_for("sm_80", split_k=2, num_warps=4), hint="launch with split_k=1"),
    # a (256, 256) tile summed along its rows goes through 263,168 B of scratch, more than sm_80's 166,912
    Case(k_reduction_scratch_too_large, lambda: (meta(512, 512), meta(512, dtype=torch.float32)),
         dict(BM=256, BN=256), SharedMemoryError,
         "scratch for layout conversions and reductions: 263,168 B (for this reduction)", "T.sum(x, 1)",
         trigger=_compile_for("sm_80", num_warps=16), hint="give this reduction a smaller tile"),
]
# The public error classes that live beside the pass that raises them, not in tilejit.errors.
PASS_ERRORS = (SplitKError,)

# -- tensor lists (a list or tuple of tensors given for a parameter) ----------------------------------------------

@tilejit.kernel
def k_list_sliced(Xs, Y, BN: T.constexpr):
    Y[0:BN] = Xs[0:BN]  # ERR


@tilejit.kernel
def k_list_stored(Xs, Y, BN: T.constexpr):
    Xs[0:BN] = Y[0:BN]  # ERR


@tilejit.kernel
def k_tensor_indexed_twice(X, Y, BN: T.constexpr):
    Y[0:BN] = X[1][0:BN]  # ERR


@tilejit.kernel
def k_len_of_tensor(X, Y, BN: T.constexpr):
    Y[0:BN] = T.full((BN,), len(X), T.float32)  # ERR


@tilejit.kernel
def k_list_item_full_slice(Xs, Y, BN: T.constexpr):
    Y[0:BN] = Xs[0][:]  # ERR


@tilejit.kernel
def k_list_float_index(Xs, Y, BN: T.constexpr):
    Y[0:BN] = Xs[1.5][0:BN]  # ERR


@tilejit.kernel
def k_list_shape(Xs, Y, BN: T.constexpr):
    Y[0:BN] = T.full((BN,), Xs.shape[0], T.float32)  # ERR


def _list_and_tensor():
    return ([meta(64), meta(32)], meta(64))


LIST_CASES = [
    Case(k_list_sliced, _list_and_tensor, dict(BN=16), TypeCheckError,
         "'Xs' is a list of tensors: pick one with a single integer index before slicing it", "Xs[0:BN]",
         hint="Xs[g][m0:m0 + BM"),
    Case(k_list_stored, _list_and_tensor, dict(BN=16), TypeCheckError,
         "'Xs' is a list of tensors: pick one with a single integer index", "Xs[0:BN]", hint="Xs[g][m0:m0 + BM"),
    Case(k_tensor_indexed_twice, lambda: (meta(4, 64), meta(64)), dict(BN=16), TypeCheckError,
         "tensor 'X' is indexed twice (X[...][...])", "X[1][0:BN]", hint="pass a list or tuple of tensors"),
    Case(k_len_of_tensor, lambda: (meta(64), meta(64)), dict(BN=16), TypeCheckError,
         "len() of tensor 'X': use X.shape[0]", "len(X)", hint="tensor list"),
    Case(k_list_item_full_slice, _list_and_tensor, dict(BN=16), TypeCheckError,
         "the tensors of list 'Xs' have run-time extents", ":", hint="start:start + BLOCK"),
    Case(k_list_float_index, _list_and_tensor, dict(BN=16), TypeCheckError,
         "a tensor list is indexed by an integer scalar, got float 1.5", "1.5"),
    Case(k_list_shape, _list_and_tensor, dict(BN=16), NameResolutionError,
         "tensor list 'Xs' has no attribute 'shape'", "Xs.shape", hint="Xs[g].shape"),
]
CASES += NEW_CASES + DOT_CASES + LIST_CASES + BACKEND_CASES
for c in CASES:
    c.id = c.kernel.__name__[2:]


def marked_line(fn: Callable) -> tuple[int, str]:
    """(line number, text) of the single line of ``fn``'s source marked '# ERR'."""
    lines, first = inspect.getsourcelines(fn)
    hits = [(first + i, line.rstrip("\n")) for i, line in enumerate(lines) if "# ERR" in line]
    assert len(hits) == 1, f"{fn.__name__} must mark exactly one line with '# ERR', found {len(hits)}"
    return hits[0]


def test_corpus_is_large_and_every_marker_is_used():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    kernels = {name for name, obj in globals().items() if isinstance(obj, tilejit.Kernel) and name.startswith("k_")}
    assert kernels - {"k_helper_early_return"} == {c.kernel.__name__ for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_kernel(case: Case):
    with pytest.raises(CompilationError) as info:
        if case.trigger is not None:
            case.trigger(case)
        else:
            case.kernel.ir(*case.args(), **case.kwargs)
    err = info.value
    # the public class, not an internal exception wrapped or leaking
    assert type(err) is case.error, f"{type(err).__name__}: {err}"
    assert type(err).__module__ == "tilejit.errors" or case.error in PASS_ERRORS
    lineno, line = marked_line(case.marked or case.kernel.fn)
    assert err.filename == THIS_FILE
    assert err.lineno == lineno, str(err)
    text = str(err)
    assert case.phrase in err.message or case.phrase in "\n".join(err._detail_lines()), text
    assert text.startswith(f"{THIS_FILE}:{lineno}:{err.col + 1}: error: "), text
    # the source line right after the message (a message may list details on lines of its own)
    shown, caret = text.split("\n")[1 + err.message.count("\n"):][:2]
    assert shown == "    " + line.expandtabs(4)
    assert caret.strip() == "^" and set(caret) <= {" ", "^"}
    assert shown[caret.index("^"):].startswith(case.at), f"caret at {shown[caret.index('^'):]!r}\n{text}"
    if case.hint is not None:
        assert err.hint and case.hint in err.hint, text
        assert text.split("\n")[-1] == f"hint: {err.hint}"


def test_varargs_on_launch():
    with pytest.raises(UnsupportedSyntaxError, match=r"kernels cannot take \*args"):
        k_varargs.ir(meta(64))


def test_early_return_inside_a_helper_branch_is_rejected():
    with pytest.raises(UnsupportedSyntaxError, match="an early 'return'") as info:
        k_helper_early_return.ir(meta(64), BN=16, FLAG=True)
    assert info.value.lineno == marked_line(helper_early_return.fn)[0]


def test_errors_are_raised_before_anything_runs_on_launch(monkeypatch):
    """A launch surfaces the same located CompilationError (interpreter mode, CPU tensors)."""
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    with pytest.raises(UnsupportedSyntaxError) as info:
        k_try[(1,)](torch.zeros(64), BN=16)
    assert info.value.lineno == marked_line(k_try.fn)[0]
    assert str(info.value).startswith(THIS_FILE)


def test_error_is_raised_again_on_a_second_call():
    for _ in range(2):
        with pytest.raises(TypeCheckError, match="stages must be"):
            k_stages_zero.ir(meta(64), 4, BN=16)


# -- launch errors ----------------------------------------------------------------------------------------------

@tilejit.kernel
def add_one(X, Y, n, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] + n


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def cpu(n=64):
    return torch.zeros(n)


def test_launch_wrong_number_of_arguments(interpret):
    with pytest.raises(TypeError) as info:
        add_one[(1,)](cpu(), cpu(), BLOCK=16)
    msg = str(info.value)
    assert "missing a required argument: 'n'" in msg
    assert "kernel signature: add_one(X, Y, n, BLOCK" in msg
    with pytest.raises(TypeError, match=r"too many positional arguments.*kernel signature: add_one\("):
        add_one[(1,)](cpu(), cpu(), 1, 16, 5)


def test_launch_unknown_keyword(interpret):
    with pytest.raises(TypeError) as info:
        add_one[(1,)](cpu(), cpu(), 1, BLOCK=16, BLOKC=3)
    msg = str(info.value)
    assert "BLOKC" in msg and "kernel signature: add_one(X, Y, n, BLOCK" in msg
    assert "num_warps" in msg  # the launch options are listed too


def test_launch_list_instead_of_tensor(interpret):
    with pytest.raises(TypeError) as info:
        add_one[(1,)]([0.0] * 64, cpu(), 1, BLOCK=16)
    msg = str(info.value)
    assert "argument 'X'" in msg and "list" in msg


def test_launch_tensors_on_different_devices(interpret):
    with pytest.raises(ValueError) as info:
        add_one[(1,)](cpu(), torch.empty(64, device="meta"), 1, BLOCK=16)
    msg = str(info.value)
    assert "different devices" in msg
    assert "X on cpu" in msg and "Y on meta" in msg


@pytest.mark.parametrize("grid, phrase", [
    ((1, 1, 1, 1), "grid must be a tuple of 1 to 3 ints"),
    ((), "grid must be a tuple of 1 to 3 ints"),
    ((0,), "has a dimension <= 0"),
    ((4, 0), "has a dimension <= 0"),
    (lambda meta: (1, 2, 3, 4), "grid must be a tuple of 1 to 3 ints"),
])
def test_launch_bad_grid(interpret, grid, phrase):
    with pytest.raises(ValueError, match="add_one") as info:
        add_one[grid](cpu(), cpu(), 1, BLOCK=16)
    assert phrase in str(info.value)


def test_launch_bad_num_warps(interpret):
    with pytest.raises(ValueError) as info:
        add_one[(1,)](cpu(), cpu(), 1, BLOCK=16, num_warps=3)
    assert "num_warps must be one of" in str(info.value) and "got 3" in str(info.value)


def test_launch_without_grid(interpret):
    with pytest.raises(TypeError, match=r"launch a kernel with a grid: add_one\[grid\]"):
        add_one(cpu(), cpu(), 1, BLOCK=16)


@pytest.mark.parametrize("call", [
    lambda: T.program_id(0),
    lambda: T.zeros((16,), T.float32),
    lambda: T.exp(1.0),
    lambda: T.range(0, 4),
    lambda: T.static_range(4),
    lambda: two_args(1, 2),
])
def test_language_outside_a_kernel(call):
    with pytest.raises(LanguageUsageError, match="inside a"):
        call()


def test_cdiv_works_on_the_host():
    assert T.cdiv(100, 16) == 7 and tilejit.cdiv(96, 16) == 6



# -- what a user sees: tracebacks of user errors start and end in their own code ---------------------------------

TRACEBACK_SCRIPT = '''
import sys
import torch, tilejit
import tilejit.language as T

@tilejit.kernel
def scale(X, Y, alpha, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * alpah

@tilejit.kernel
def fine(X, Y, alpha, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * alpha

x = torch.randn(1000)
y = torch.empty_like(x)
what = sys.argv[1]
if what == "launch":
    scale[(8,)](x, y, 2.0, BLOCK=128)
elif what == "ir":
    scale.ir(x, y, 2.0, BLOCK=128)
elif what == "compile":
    scale.compile(x, y, 2.0, BLOCK=128, arch="sm_90a")
elif what == "argument":
    fine[(8,)](x, [1.0], 2.0, BLOCK=128)
elif what == "grid":
    fine[(8.0,)](x, y, 2.0, BLOCK=128)
elif what == "autotune":
    tuned = tilejit.autotune(configs=[tilejit.Config({"BLOCK": 128})], key=[])(scale)
    tuned[(8,)](x, y, 2.0)
elif what == "user_callback":
    fine[lambda meta: (tilejit.cdiv(1000, meta["BLOKC"]),)](x, y, 2.0, BLOCK=128)
elif what == "bug":
    import tilejit.frontend.semantic as S
    S.Semantic.binary = staticmethod(divmod)  # an internal TypeError, raised inside tilejit
    fine[(8,)](x, y, 2.0, BLOCK=128)
'''


def run_script(tmp_path, what: str, **env: str):
    import os
    import subprocess
    import sys

    script = tmp_path / "user_script.py"
    script.write_text(TRACEBACK_SCRIPT)
    environ = {k: v for k, v in os.environ.items() if k != "TILEJIT_TRACEBACK"}
    environ.update(TILEJIT_INTERPRET="1", TILEJIT_CACHE_DIR=str(tmp_path / "cache"), **env)
    done = subprocess.run([sys.executable, str(script), what], capture_output=True, text=True, env=environ,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    return script, done.stderr


def traceback_lines(stderr: str) -> list[str]:
    """The lines of the (last) traceback, from 'Traceback' to the line before the exception's own."""
    lines = stderr.rstrip("\n").split("\n")
    start = max(i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    return lines[start:end]


@pytest.mark.parametrize("what, error, phrase", [
    ("launch", "NameResolutionError", "name 'alpah' is not defined"),
    ("ir", "NameResolutionError", "name 'alpah' is not defined"),
    ("compile", "NameResolutionError", "name 'alpah' is not defined"),
    ("autotune", "NameResolutionError", "name 'alpah' is not defined"),
    ("argument", "ArgumentError", "argument 'Y' has type list"),
    ("grid", "ArgumentError", "grid entries must be ints, got 8.0"),
])
def test_user_errors_show_a_short_traceback(tmp_path, what, error, phrase):
    script, stderr = run_script(tmp_path, what)
    shown = traceback_lines(stderr)
    assert 2 <= len(shown) <= 9, stderr
    assert stderr.count("Traceback (most recent call last):") == 1, stderr
    assert f'File "{script}"' in shown[1], stderr  # it starts at the user's call ...
    assert not any("/tilejit/" in line for line in shown[:-2]), stderr  # ... and shows one frame of tilejit's
    assert f"tilejit.errors.{error}: " in stderr and phrase in stderr, stderr
    assert len(stderr.rstrip("\n").split("\n")) <= 14, stderr


def test_full_traceback_knob_keeps_every_frame(tmp_path):
    _, short = run_script(tmp_path, "launch")
    _, full = run_script(tmp_path, "launch", TILEJIT_TRACEBACK="full")
    assert len(traceback_lines(full)) > 20
    assert "tilejit/frontend/expressions.py" in full and "tilejit/frontend/expressions.py" not in short
    assert full.rstrip().endswith(short.rstrip().split("\n")[-1])  # the same message


def test_an_error_of_the_users_own_code_called_by_tilejit_is_theirs(tmp_path):
    """A grid function that raises: its own exception, from its own frame, not a tilejit bug."""
    script, stderr = run_script(tmp_path, "user_callback")
    shown = traceback_lines(stderr)
    last = stderr.rstrip().splitlines()[-2:]  # the error, then the note saying where tilejit called it
    assert last[0] == "KeyError: 'BLOKC'" and "tilejit bug" not in stderr, stderr
    assert last[1].startswith("tilejit: raised inside the grid function (<lambda> at ") and "BLOCK" in last[1]
    assert any(line.endswith("in <lambda>") for line in shown), stderr
    assert len(shown) <= 9 and sum("/tilejit/" in line for line in shown) == 1, stderr  # the entry point's frame


def test_internal_errors_say_they_are_bugs_and_keep_every_frame(tmp_path):
    _, stderr = run_script(tmp_path, "bug")
    assert "TypeError: divmod expected 2 arguments" in stderr
    assert "tilejit/frontend/expressions.py" in stderr  # the original's full traceback, chained
    assert "The above exception was the direct cause of the following exception" in stderr
    last = stderr.rstrip("\n").split("\n")
    assert last[-2].startswith("tilejit.errors.InternalError: TypeError: divmod expected 2 arguments")
    assert last[-1].startswith("this is a tilejit bug; please report it with the traceback above")


def test_internal_error_is_still_an_instance_of_the_original_class():
    err = tilejit.errors.InternalError.wrapping(KeyError("k"))
    assert isinstance(err, KeyError) and isinstance(err, tilejit.errors.InternalError)
    assert str(err).startswith("KeyError: 'k'\nthis is a tilejit bug")
    odd = tilejit.errors.InternalError.wrapping(UnicodeDecodeError("utf-8", b"x", 0, 1, "bad"))
    assert type(odd) is tilejit.errors.InternalError
    import pickle

    for original in (err, odd):
        copy = pickle.loads(pickle.dumps(original))
        assert type(copy) is type(original) and str(copy) == str(original)


def test_launch_argument_errors_are_usage_errors_and_builtin_errors(interpret):
    with pytest.raises(TypeError) as info:
        add_one[(1,)]([0.0] * 64, cpu(), 1, BLOCK=16)
    assert isinstance(info.value, tilejit.errors.UsageError)
    with pytest.raises(ValueError) as info:
        add_one[(0,)](cpu(), cpu(), 1, BLOCK=16)
    assert isinstance(info.value, tilejit.errors.UsageError)


def test_every_construct_the_frontend_lacks_has_plain_words():
    """Each statement and expression node without a visit_ method is named in words, with a hint."""
    import ast

    from tilejit.frontend.constructs import CONSTRUCTS
    from tilejit.frontend.visitor import CodeGenerator

    nodes = {cls.__name__ for base in (ast.stmt, ast.expr) for cls in base.__subclasses__()}
    lacking = {name for name in nodes if not hasattr(CodeGenerator, f"visit_{name}")}
    assert lacking, "ast changed shape"
    assert lacking <= set(CONSTRUCTS), sorted(lacking - set(CONSTRUCTS))
    for words, hint in CONSTRUCTS.values():
        assert words and hint and not any(ch.isupper() for ch in words.replace("T.", "")), words


def test_launch_keyword_typo_suggests_the_parameter(interpret):
    with pytest.raises(TypeError) as info:
        add_one[(1,)](cpu(), cpu(), 1, BLOKC=16)
    assert "missing a required argument: 'BLOCK' ('BLOKC' is not a parameter: did you mean 'BLOCK'?)" \
        in str(info.value)
    with pytest.raises(TypeError, match=r"'num_wraps' is not a parameter: did you mean 'num_warps'\?"):
        add_one[(1,)](cpu(), cpu(), 1, BLOCK=16, num_wraps=4)


def test_float_grid_suggests_cdiv(interpret):
    with pytest.raises(TypeError) as info:
        add_one[(64 / 16,)](cpu(), cpu(), 1, BLOCK=16)
    assert "grid entries must be ints, got 4.0" in str(info.value)
    assert "tilejit.cdiv(n, BLOCK)" in str(info.value) and "n // BLOCK" in str(info.value)


def test_tensor_as_constexpr_suggests_item(interpret):
    with pytest.raises(TypeError) as info:
        add_one[(1,)](cpu(), cpu(), 1, BLOCK=torch.tensor(16))
    msg = str(info.value)
    assert "constexpr argument 'BLOCK' must be an int" in msg and "got Tensor" in msg
    assert "pass BLOCK=t.item()" in msg and "drop T.constexpr" in msg


def test_autotune_key_typo_suggests_the_parameter():
    with pytest.raises(ValueError, match=r"names \['BLOKC'\].*did you mean 'BLOCK'\?"):
        tilejit.autotune(configs=[tilejit.Config({"BLOCK": 16})], key=["BLOKC"])(add_one)
