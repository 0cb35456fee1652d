"""The frontend's IR for every construct of the language, checked FileCheck-style on the printed IR.

Each test builds one specialization with ``kernel.ir(...)`` on ``meta`` tensors (no GPU, no data); that
also runs dead-code cleanup and the IR verifier, so every kernel here is verified IR as well.
"""
from __future__ import annotations

import math
import sys

import torch

import tilejit
import tilejit.language as T
from filecheck import filecheck


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def check(kernel, args, kwargs, checks: str) -> str:
    text = kernel.ir(*args, **kwargs)
    filecheck(text, checks)
    return text


SCALE = T.constexpr(4)
OFFSET = 3


# -- parameters ---------------------------------------------------------------------------------------------

@tilejit.kernel
def tensor_params(A, Y, BN: T.constexpr):
    M, N = A.shape
    s0 = A.stride(0)
    s1 = A.stride(1)
    x = A[0, 0:BN]
    Y[0, 0:BN] = T.full((BN,), M * s0 + N * s1, T.float32).to(A.dtype) + x


def test_tensor_params_shape_stride_dtype():
    check(tensor_params, (meta(100, 70), meta(100, 70)), dict(BN=32), """
        CHECK-LABEL: tj.func @tensor_params(%A: tensor<2d x f16>, %Y: tensor<2d x f16>) constexprs {BN = 32} {
        CHECK: [[M:%A_size0]] = tj.tensor_dim %A {axis = 0} : i64
        CHECK: [[N:%A_size1]] = tj.tensor_dim %A {axis = 1} : i64
        CHECK: [[S0:%A_stride0]] = tj.tensor_stride %A {axis = 0} : i64
        CHECK: [[S1:%A_stride1]] = tj.tensor_stride %A {axis = 1} : i64
        CHECK: %x = tj.load %A[{{%[0-9]+}}, {{%[0-9]+}}] {shape = [1, 32], dropped = [0]} : tile<32xf16>
        CHECK: [[P:%[0-9]+]] = tj.binary [[M]], [[S0]] {op = mul} : i64
        CHECK-NEXT: [[Q:%[0-9]+]] = tj.binary [[N]], [[S1]] {op = mul} : i64
        CHECK-NEXT: [[SUM:%[0-9]+]] = tj.binary [[P]], [[Q]] {op = add} : i64
        CHECK-NEXT: [[F:%[0-9]+]] = tj.cast [[SUM]] {dtype = f32} : f32
        CHECK-NEXT: [[T:%[0-9]+]] = tj.splat [[F]] {shape = [32]} : tile<32xf32>
        # .to(A.dtype): A.dtype is the compile-time f16
        CHECK-NEXT: [[H:%[0-9]+]] = tj.cast [[T]] {dtype = f16} : tile<32xf16>
        CHECK-NEXT: [[R:%[0-9]+]] = tj.binary [[H]], %x {op = add} : tile<32xf16>
        CHECK: tj.store [[R]], %Y[{{.*}}] {shape = [1, 32], dropped = [0]}
        CHECK-NEXT: }
    """)


@tilejit.kernel
def scalar_params(Y, n, alpha, flag, BN: T.constexpr = 64):
    i = n * BN
    v = Y[i:i + BN] * alpha
    if flag:
        v = v + 1.0
    Y[i:i + BN] = v


def test_scalar_params_int_float_bool_and_constexpr_default():
    check(scalar_params, (meta(1000), 5, 0.5, True), {}, """
        CHECK-LABEL: tj.func @scalar_params(%Y: tensor<1d x f16>, %n: i64, %alpha: f32, %flag: i1)
        CHECK-SAME: constexprs {BN = 64} {
        CHECK: [[C:%[0-9]+]] = tj.constant {value = 64} : i64
        CHECK-NEXT: %i = tj.binary %n, [[C]] {op = mul} : i64
        CHECK-NEXT: [[L:%[0-9]+]] = tj.load %Y[%i] {shape = [64]} : tile<64xf16>
        CHECK: tj.splat %alpha {shape = [64]} : tile<64xf32>
        CHECK: tj.if %flag -> (tile<64xf32>) {
        CHECK: tj.store {{%[0-9]+}}, %Y[%i] {shape = [64]}
    """)


def test_int_argument_equal_to_one_is_folded():
    text = check(scalar_params, (meta(1000), 1, 0.5, False), dict(BN=16), """
        CHECK-LABEL: tj.func @scalar_params(%Y: tensor<1d x f16>, %n: i64, %alpha: f32, %flag: i1)
        CHECK-SAME: constexprs {BN = 16}
        CHECK-NOT: %n
        # i = 1 * 16 folds to the constant start 16 (of n's type)
        CHECK: %i = tj.constant {value = 16} : i64
        CHECK-NEXT: tj.load %Y[%i] {shape = [16]} : tile<16xf16>
        CHECK-NOT: %n
        CHECK: tj.store
    """)
    assert "tj.binary %n" not in text


@tilejit.kernel
def joins_on_an_int(X, Y, n, BN: T.constexpr):
    x = X[0:BN]
    if n > 3:
        r = x
    else:
        r = T.full((BN,), 0.5, T.float16)
    Y[0:BN] = r + T.where(n == 1, 0.0, x) + (x if n > 3 else 0.0)


def test_int_argument_equal_to_one_keeps_the_types_of_any_other_value():
    # The constant 1 is a value, not a Python int: `if n > 3` still joins its branches' types (float16 with
    # float32 -> float32), `T.where(n == 1, 0.0, x)` is still a tile, and `x if n > 3 else 0.0` a float32 tile.
    for n in (1, 2):
        text = check(joins_on_an_int, (meta(64, dtype=torch.float32), meta(64, dtype=torch.float32), n), dict(BN=16),
                     """
            CHECK: tj.if {{%[0-9]+}} -> (tile<16xf32>)
            CHECK: tj.select
            CHECK: tj.store {{%[0-9]+}}, %Y[{{%[0-9]+}}] {shape = [16]}
        """)
        assert "tile<16xf16>" in text  # the float16 branch, cast at its yield


@tilejit.kernel
def uses_globals(Y, BN: T.constexpr):
    Y[0:BN] = T.full((BN,), SCALE * OFFSET, T.float32)


def test_constexpr_globals_are_folded_and_changes_are_seen(monkeypatch):
    check(uses_globals, (meta(100),), dict(BN=8), """
        CHECK: tj.constant {value = 12.0} : f32
        CHECK-NOT: tj.constant {value = 4}
    """)
    monkeypatch.setattr(sys.modules[__name__], "OFFSET", 5)
    check(uses_globals, (meta(100),), dict(BN=8), """
        CHECK: tj.constant {value = 20.0} : f32
    """)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", T.constexpr(2))
    check(uses_globals, (meta(100),), dict(BN=8), """
        CHECK: tj.constant {value = 10.0} : f32
    """)


# -- scalar arithmetic ----------------------------------------------------------------------------------------

@tilejit.kernel
def scalar_arith(Y, n, m):
    a, b = n + 1, n - 2
    Y[0:1] = T.full((1,), a, T.float32)
    Y[1:2] = T.full((1,), b, T.float32)
    Y[2:3] = T.full((1,), n * 3, T.float32)
    Y[3:4] = T.full((1,), n / 2, T.float32)
    Y[4:5] = T.full((1,), n // 4, T.float32)
    Y[5:6] = T.full((1,), n % 5, T.float32)
    Y[6:7] = T.full((1,), n ** 2, T.float32)
    Y[7:8] = T.full((1,), min(n, 7), T.float32)
    Y[8:9] = T.full((1,), max(n, m), T.float32)
    Y[9:10] = T.full((1,), (n < m) and not (n == 3) or n >= 9, T.float32)
    Y[10:11] = T.full((1,), 0 < n <= 10, T.float32)
    Y[11:12] = T.full((1,), 2 ** 3 + 7 // 2 - 9 % 4, T.float32)
    Y[12:13] = T.full((1,), (n != m) or (n > m), T.float32)


def test_scalar_arithmetic_and_logic():
    check(scalar_arith, (meta(100, dtype=torch.float32), 5, 6), {}, """
        CHECK-LABEL: tj.func @scalar_arith(%Y: tensor<1d x f32>, %n: i64, %m: i64) {
        # tuple unpacking of two expressions
        CHECK: [[ONE:%[0-9]+]] = tj.constant {value = 1} : i64
        CHECK-NEXT: %a = tj.binary %n, [[ONE]] {op = add} : i64
        CHECK: %b = tj.binary %n, {{%[0-9]+}} {op = sub} : i64
        CHECK: tj.cast %a {dtype = f32} : f32
        CHECK: tj.binary %n, {{%[0-9]+}} {op = mul} : i64
        # '/' is true division: the int becomes f32
        CHECK: [[NF:%[0-9]+]] = tj.cast %n {dtype = f32} : f32
        CHECK-NEXT: [[TWO:%[0-9]+]] = tj.constant {value = 2.0} : f32
        CHECK-NEXT: tj.binary [[NF]], [[TWO]] {op = div} : f32
        CHECK: tj.binary %n, {{%[0-9]+}} {op = floordiv} : i64
        CHECK: tj.binary %n, {{%[0-9]+}} {op = mod} : i64
        # n ** 2 is n * n
        CHECK: tj.binary %n, %n {op = mul} : i64
        CHECK: [[SEVEN:%[0-9]+]] = tj.constant {value = 7} : i64
        CHECK-NEXT: tj.binary %n, [[SEVEN]] {op = min} : i64
        CHECK: tj.binary %n, %m {op = max} : i64
        # (n < m) and not (n == 3) or n >= 9
        CHECK: [[LT:%[0-9]+]] = tj.cmp %n, %m {op = lt} : i1
        CHECK: [[EQ:%[0-9]+]] = tj.cmp %n, {{%[0-9]+}} {op = eq} : i1
        CHECK-NEXT: [[NOT:%[0-9]+]] = tj.unary [[EQ]] {op = not} : i1
        CHECK-NEXT: [[AND:%[0-9]+]] = tj.binary [[LT]], [[NOT]] {op = and} : i1
        CHECK: [[GE:%[0-9]+]] = tj.cmp %n, {{%[0-9]+}} {op = ge} : i1
        CHECK-NEXT: tj.binary [[AND]], [[GE]] {op = or} : i1
        # chained comparison 0 < n <= 10 is (0 < n) and (n <= 10)
        CHECK: [[C1:%[0-9]+]] = tj.cmp {{%[0-9]+}}, %n {op = lt} : i1
        CHECK: [[C2:%[0-9]+]] = tj.cmp %n, {{%[0-9]+}} {op = le} : i1
        CHECK-NEXT: tj.binary [[C1]], [[C2]] {op = and} : i1
        # 2 ** 3 + 7 // 2 - 9 % 4 folds to 10 at compile time
        CHECK: tj.constant {value = 10.0} : f32
        CHECK: tj.cmp %n, %m {op = ne} : i1
        CHECK: tj.cmp %n, %m {op = gt} : i1
        CHECK: {op = or}
    """)


@tilejit.kernel
def grid_queries(Y, n, BN: T.constexpr):
    pid = T.program_id(0)
    npg = T.num_programs(1)
    nb = T.cdiv(n, BN)
    Y[pid * BN:pid * BN + BN] = T.full((BN,), npg + nb + T.cdiv(100, BN), T.float32) + \
        T.arange(0, BN).to(T.float32) + T.arange(BN).to(T.float32)


def test_program_id_num_programs_cdiv_arange():
    check(grid_queries, (meta(100, dtype=torch.float32), 5), dict(BN=16), """
        CHECK: %pid = tj.program_id {axis = 0} : i32
        CHECK: %npg = tj.num_programs {axis = 1} : i32
        # cdiv(n, 16) = (n + 15) // 16
        CHECK: [[K:%[0-9]+]] = tj.constant {value = 15} : i64
        CHECK-NEXT: [[S:%[0-9]+]] = tj.binary %n, [[K]] {op = add} : i64
        CHECK-NEXT: [[D:%[0-9]+]] = tj.constant {value = 16} : i64
        CHECK-NEXT: %nb = tj.binary [[S]], [[D]] {op = floordiv} : i64
        # cdiv(100, 16) folds to 7
        CHECK: tj.constant {value = 7} : i64
        CHECK: tj.arange {start = 0, end = 16} : tile<16xi32>
        CHECK: tj.arange {start = 0, end = 16} : tile<16xi32>
        # the start pid * BN written twice is recognised as one value: the length 16 is constant
        CHECK: [[START:%[0-9]+]] = tj.binary %pid, {{%[0-9]+}} {op = mul} : i32
        CHECK-NEXT: tj.store {{%[0-9]+}}, %Y[[[START]]] {shape = [16]}
    """)


# -- loads and stores -----------------------------------------------------------------------------------------

@tilejit.kernel
def windows(A, X, Y, b, BM: T.constexpr):
    m0 = T.program_id(0) * BM
    t = A[b, m0:m0 + BM, :]
    Y[b, m0:m0 + BM, :] = t
    r = X[m0:m0 + BM, 3]
    X[m0:m0 + BM, 0] = r + A.shape[2]
    X[m0 + 1:m0 + 1 + BM, 1] = 0.5


def test_slice_loads_integer_indices_full_slices_and_stores():
    check(windows, (meta(4, 100, 64), meta(100, 8), meta(4, 100, 64), 2), dict(BM=32), """
        CHECK-LABEL: tj.func @windows(%A: tensor<3d x f16>, %X: tensor<2d x f16>, %Y: tensor<3d x f16>, %b: i64)
        CHECK: %m0 = tj.binary {{%[0-9]+}}, {{%[0-9]+}} {op = mul} : i32
        # an integer index drops the dim; ':' covers the whole (now compile-time) extent 64
        CHECK: [[Z:%[0-9]+]] = tj.constant {value = 0} : i32
        CHECK-NEXT: %t = tj.load %A[%b, %m0, [[Z]]] {shape = [1, 32, 64], dropped = [0]} : tile<32x64xf16>
        CHECK: tj.store %t, %Y[%b, %m0, {{%[0-9]+}}] {shape = [1, 32, 64], dropped = [0]}
        CHECK: [[THREE:%[0-9]+]] = tj.constant {value = 3} : i32
        CHECK-NEXT: %r = tj.load %X[%m0, [[THREE]]] {shape = [32, 1], dropped = [1]} : tile<32xf16>
        # A.shape[2] is the compile-time 64 once ':' needed it
        CHECK-NEXT: [[E:%[0-9]+]] = tj.constant {value = 64.0} : f16
        CHECK: tj.store {{%[0-9]+}}, %X[%m0, {{%[0-9]+}}] {shape = [32, 1], dropped = [1]}
        # m0 + 1 : m0 + 1 + BM has the constant length BM; a constant is stored through a splat
        CHECK: [[ST:%[0-9]+]] = tj.binary %m0, {{%[0-9]+}} {op = add} : i32
        CHECK: [[HALF:%[0-9]+]] = tj.constant {value = 0.5} : f16
        CHECK-NEXT: [[SPL:%[0-9]+]] = tj.splat [[HALF]] {shape = [32]} : tile<32xf16>
        CHECK-NEXT: tj.store [[SPL]], %X[[[ST]], {{%[0-9]+}}] {shape = [32, 1], dropped = [1]}
        CHECK-NOT: tensor_dim
    """)


@tilejit.kernel
def aug_store(X, BN: T.constexpr):
    X[0:BN] += 1.0


def test_augmented_store_loads_and_stores_the_window():
    check(aug_store, (meta(64),), dict(BN=16), """
        CHECK: [[L:%[0-9]+]] = tj.load %X[[[S:%[0-9]+]]] {shape = [16]} : tile<16xf16>
        CHECK: [[V:%[0-9]+]] = tj.binary [[L]], {{%[0-9]+}} {op = add} : tile<16xf16>
        CHECK: tj.store [[V]], %X[[[S]]] {shape = [16]}
    """)


# -- tile ops -------------------------------------------------------------------------------------------------

@tilejit.kernel
def tile_ops(X, Y, Z, BN: T.constexpr):
    x = X[0:BN, 0:BN].to(T.float32)
    z = T.zeros((BN, BN), T.float32)
    f = T.full((BN, BN), 2.0, T.float32)
    w = T.where(x > 0, x, z)
    u = T.exp(w) + T.exp2(w) + T.log(f) + T.sqrt(f) + T.rsqrt(f) + T.abs(x)
    u = T.maximum(u, z) + T.minimum(u, f)
    rows = T.sum(u, 1)
    cols = T.max(u, 0)
    lo = T.min(u)
    tot = T.sum(u)
    v = u - rows[:, None] + cols[None, :] + lo + tot
    Y[0:BN, 0:BN] = v.T
    Z[0:BN] = T.min(v, axis=1) * -1


def test_elementwise_reductions_broadcast_transpose():
    check(tile_ops, (meta(64, 64), meta(64, 64), meta(64)), dict(BN=16), """
        CHECK: [[LX:%[0-9]+]] = tj.load %X[{{.*}}] {shape = [16, 16]} : tile<16x16xf16>
        CHECK-NEXT: %x = tj.cast [[LX]] {dtype = f32} : tile<16x16xf32>
        CHECK: %z = tj.splat {{%[0-9]+}} {shape = [16, 16]} : tile<16x16xf32>
        CHECK: [[TWO:%[0-9]+]] = tj.constant {value = 2.0} : f32
        CHECK-NEXT: %f = tj.splat [[TWO]] {shape = [16, 16]} : tile<16x16xf32>
        CHECK: [[GT:%[0-9]+]] = tj.cmp %x, {{%[0-9]+}} {op = gt} : tile<16x16xi1>
        CHECK-NEXT: %w = tj.select [[GT]], %x, %z : tile<16x16xf32>
        CHECK-NEXT: tj.unary %w {op = exp} : tile<16x16xf32>
        CHECK-NEXT: tj.unary %w {op = exp2} : tile<16x16xf32>
        CHECK: tj.unary %f {op = log} : tile<16x16xf32>
        CHECK: tj.unary %f {op = sqrt} : tile<16x16xf32>
        CHECK: tj.unary %f {op = rsqrt} : tile<16x16xf32>
        CHECK: tj.unary %x {op = abs} : tile<16x16xf32>
        CHECK: %u = tj.binary
        CHECK: tj.binary %u, %z {op = max} : tile<16x16xf32>
        CHECK-NEXT: tj.binary %u, %f {op = min} : tile<16x16xf32>
        CHECK-NEXT: [[U:%u_1]] = tj.binary
        CHECK-NEXT: %rows = tj.reduce [[U]] {axis = 1, kind = sum} : tile<16xf32>
        CHECK-NEXT: %cols = tj.reduce [[U]] {axis = 0, kind = max} : tile<16xf32>
        # reductions over all axes end in a scalar
        CHECK-NEXT: [[M1:%[0-9]+]] = tj.reduce [[U]] {axis = 1, kind = min} : tile<16xf32>
        CHECK-NEXT: %lo = tj.reduce [[M1]] {axis = 0, kind = min} : f32
        CHECK-NEXT: [[S1:%[0-9]+]] = tj.reduce [[U]] {axis = 1, kind = sum} : tile<16xf32>
        CHECK-NEXT: %tot = tj.reduce [[S1]] {axis = 0, kind = sum} : f32
        # rows[:, None] and cols[None, :]
        CHECK-NEXT: [[E1:%[0-9]+]] = tj.expand_dims %rows {axis = 1} : tile<16x1xf32>
        CHECK-NEXT: tj.broadcast [[E1]] {shape = [16, 16]} : tile<16x16xf32>
        CHECK: [[E0:%[0-9]+]] = tj.expand_dims %cols {axis = 0} : tile<1x16xf32>
        CHECK-NEXT: tj.broadcast [[E0]] {shape = [16, 16]} : tile<16x16xf32>
        # scalars broadcast by splat
        CHECK: tj.splat %lo {shape = [16, 16]} : tile<16x16xf32>
        CHECK: tj.splat %tot {shape = [16, 16]} : tile<16x16xf32>
        CHECK: [[VT:%[0-9]+]] = tj.trans %v {perm = [1, 0]} : tile<16x16xf32>
        CHECK: [[VH:%[0-9]+]] = tj.cast [[VT]] {dtype = f16} : tile<16x16xf16>
        CHECK-NEXT: tj.store [[VH]], %Y
        CHECK: tj.reduce %v {axis = 1, kind = min} : tile<16xf32>
        CHECK: tj.constant {value = -1.0} : f32
        CHECK: tj.store {{%[0-9]+}}, %Z
    """)


@tilejit.kernel
def half_sum(X, Y, BN: T.constexpr):
    x = X[0:BN, 0:BN]
    Y[0:BN, 0] = T.sum(x, 0) + T.max(x, axis=-1)


def test_sum_of_f16_accumulates_in_f32_and_max_keeps_dtype():
    check(half_sum, (meta(64, 64), meta(64, 64)), dict(BN=16), """
        CHECK: [[XF:%[0-9]+]] = tj.cast %x {dtype = f32} : tile<16x16xf32>
        CHECK-NEXT: [[S:%[0-9]+]] = tj.reduce [[XF]] {axis = 0, kind = sum} : tile<16xf32>
        CHECK-NEXT: [[M:%[0-9]+]] = tj.reduce %x {axis = 1, kind = max} : tile<16xf16>
        CHECK-NEXT: [[MF:%[0-9]+]] = tj.cast [[M]] {dtype = f32} : tile<16xf32>
        CHECK-NEXT: tj.binary [[S]], [[MF]] {op = add} : tile<16xf32>
    """)


@tilejit.kernel
def gemms(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    a = A[0:BM, 0:BK]
    b = B[0:BK, 0:BN]
    acc = T.zeros((BM, BN), T.float32)
    acc = T.gemm(a, b, acc)
    acc = T.gemm(a.T, b, acc, transpose_a=True)
    bt = B[0:BN, 0:BK]
    acc = T.gemm(a, bt, acc, transpose_b=True)
    acc = acc + a @ b
    T.copy(acc, C[0:BM, 0:BN])
    T.copy(A[0:BM, 0:BN], C[0:BM, 0:BN])


def test_gemm_matmul_transposes_and_copy():
    check(gemms, (meta(64, 64), meta(64, 64), meta(64, 64)), dict(BM=64, BN=32, BK=16), """
        CHECK: %a = tj.load %A[{{.*}}] {shape = [64, 16]} : tile<64x16xf16>
        CHECK: %b = tj.load %B[{{.*}}] {shape = [16, 32]} : tile<16x32xf16>
        CHECK: %acc = tj.splat {{%[0-9]+}} {shape = [64, 32]} : tile<64x32xf32>
        CHECK-NEXT: %acc_1 = tj.gemm %a, %b, %acc {transpose_a = false, transpose_b = false} : tile<64x32xf32>
        CHECK-NEXT: [[AT:%[0-9]+]] = tj.trans %a {perm = [1, 0]} : tile<16x64xf16>
        CHECK-NEXT: %acc_2 = tj.gemm [[AT]], %b, %acc_1 {transpose_a = true, transpose_b = false} : tile<64x32xf32>
        CHECK: %bt = tj.load %B[{{.*}}] {shape = [32, 16]} : tile<32x16xf16>
        CHECK-NEXT: %acc_3 = tj.gemm %a, %bt, %acc_2 {transpose_a = false, transpose_b = true} : tile<64x32xf32>
        # a @ b: a fresh f32 accumulator, then the add
        CHECK: [[Z:%[0-9]+]] = tj.splat {{%[0-9]+}} {shape = [64, 32]} : tile<64x32xf32>
        CHECK-NEXT: [[P:%[0-9]+]] = tj.gemm %a, %b, [[Z]] {transpose_a = false, transpose_b = false} : tile<64x32xf32>
        CHECK-NEXT: %acc_4 = tj.binary %acc_3, [[P]] {op = add} : tile<64x32xf32>
        # T.copy stores, casting to the tensor's dtype
        CHECK: [[H:%[0-9]+]] = tj.cast %acc_4 {dtype = f16} : tile<64x32xf16>
        CHECK-NEXT: tj.store [[H]], %C[{{.*}}] {shape = [64, 32]}
        # T.copy from a tensor slice: a load, then a store
        CHECK: [[L:%[0-9]+]] = tj.load %A[{{.*}}] {shape = [64, 32]} : tile<64x32xf16>
        CHECK: tj.store [[L]], %C[{{.*}}] {shape = [64, 32]}
    """)


@tilejit.kernel
def int8_gemm(A, B, C, BM: T.constexpr):
    C[0:BM, 0:BM] = A[0:BM, 0:BM] @ B[0:BM, 0:BM]


def test_int8_matmul_accumulates_in_int32():
    check(int8_gemm, (meta(32, 32, dtype=torch.int8), meta(32, 32, dtype=torch.int8),
                      meta(32, 32, dtype=torch.int32)), dict(BM=32), """
        CHECK: tj.splat {{%[0-9]+}} {shape = [32, 32]} : tile<32x32xi32>
        CHECK-NEXT: tj.gemm {{%[0-9]+}}, {{%[0-9]+}}, {{%[0-9]+}} {{{.*}}} : tile<32x32xi32>
    """)


# -- control flow ---------------------------------------------------------------------------------------------

@tilejit.kernel
def loops(A, Y, n, BN: T.constexpr):
    acc = T.zeros((BN,), T.float32)
    total = 0
    s = 0
    for i in range(n):
        acc += A[i * BN:i * BN + BN]
        total = total + i
    for k in T.range(0, n, 2, stages=4):
        s = s + A[k:k + BN]
    for j in T.static_range(3):
        acc = acc * (j + 1)
    Y[0:BN] = acc + s + total


def test_loops_carry_tiles_and_scalars():
    check(loops, (meta(1000), meta(1000), 5), dict(BN=16), """
        CHECK: %acc = tj.splat {{%[0-9]+}} {shape = [16]} : tile<16xf32>
        CHECK: [[LO:%[0-9]+]] = tj.constant {value = 0} : i64
        CHECK-NEXT: [[STEP:%[0-9]+]] = tj.constant {value = 1} : i64
        CHECK-NEXT: [[T0:%[0-9]+]] = tj.constant {value = 0} : i64
        CHECK-NEXT: %acc_1, %total = tj.for %i = [[LO]] to %n step [[STEP]]
        CHECK-SAME: iter_args([[ACC:%acc_[0-9]+]] = %acc, [[TOT:%total_[0-9]+]] = [[T0]]) -> (tile<16xf32>, i64)
        CHECK-SAME: {kind = range} {
        CHECK: tj.load %A[{{%[0-9]+}}] {shape = [16]} : tile<16xf16>
        CHECK: [[ACC2:%acc_[0-9]+]] = tj.binary [[ACC]], {{%[0-9]+}} {op = add} : tile<16xf32>
        CHECK-NEXT: [[TOT2:%total_[0-9]+]] = tj.binary [[TOT]], %i {op = add} : i64
        CHECK-NEXT: tj.yield [[ACC2]], [[TOT2]]
        CHECK-NEXT: }
        # s = 0 becomes a tile inside the loop: it is carried as an f16 tile from a splat of 0
        CHECK: [[Z:%[0-9]+]] = tj.constant {value = 0.0} : f16
        CHECK-NEXT: [[ZS:%[0-9]+]] = tj.splat [[Z]] {shape = [16]} : tile<16xf16>
        CHECK-NEXT: %s = tj.for %k = {{%[0-9]+}} to %n step {{%[0-9]+}} iter_args([[S:%s_[0-9]+]] = [[ZS]])
        CHECK-SAME: -> (tile<16xf16>) {kind = pipelined, stages = 4} {
        CHECK-NEXT: [[L:%[0-9]+]] = tj.load %A[%k] {shape = [16]} : tile<16xf16>
        CHECK-NEXT: [[S2:%s_[0-9]+]] = tj.binary [[S]], [[L]] {op = add} : tile<16xf16>
        CHECK-NEXT: tj.yield [[S2]]
        CHECK-NEXT: }
        # T.static_range is unrolled: j = 0, 1, 2 give the factors 1, 2, 3
        CHECK-NOT: tj.for
        CHECK: tj.constant {value = 1.0} : f32
        CHECK: %acc_4 = tj.binary %acc_1, {{%[0-9]+}} {op = mul}
        CHECK: tj.constant {value = 2.0} : f32
        CHECK: tj.constant {value = 3.0} : f32
        CHECK: %acc_6 = tj.binary %acc_5, {{%[0-9]+}} {op = mul}
        CHECK-NOT: tj.for
        CHECK: tj.cast %s {dtype = f32}
        CHECK: tj.cast %total {dtype = f32} : f32
        CHECK: tj.store
    """)


@tilejit.kernel
def pipelined_default(A, Y, n, BN: T.constexpr):
    acc = T.zeros((BN,), T.float32)
    for k in T.range(n):
        acc += A[k:k + BN]
    Y[0:BN] = acc


def test_t_range_without_stages_takes_the_launch_default():
    text = check(pipelined_default, (meta(1000), meta(1000), 5), dict(BN=16, num_stages=2), """
        CHECK: %acc_1 = tj.for %k = {{%[0-9]+}} to %n step {{%[0-9]+}} iter_args(%acc_2 = %acc)
        CHECK-SAME: {kind = pipelined} {
    """)
    assert "stages =" not in text


@tilejit.kernel
def branches(A, Y, n, USE_EXP: T.constexpr, BN: T.constexpr):
    x = A[0:BN].to(T.float32)
    if n > 3:
        y = x * 2.0
        c = 1
    else:
        y = x + 1.0
        c = n
    if USE_EXP:
        y = T.exp(y)
    else:
        y = T.log(y)
    Y[0:BN] = y + c


def test_runtime_if_yields_values_of_both_branches_and_constexpr_if_is_pruned():
    check(branches, (meta(1000), meta(1000), 5), dict(BN=16, USE_EXP=True), """
        CHECK-LABEL: constexprs {USE_EXP = true, BN = 16}
        CHECK: [[C:%[0-9]+]] = tj.cmp %n, {{%[0-9]+}} {op = gt} : i1
        CHECK-NEXT: %y, %c = tj.if [[C]] -> (tile<16xf32>, i64) {
        CHECK: [[Y1:%y_[0-9]+]] = tj.binary %x, {{%[0-9]+}} {op = mul} : tile<16xf32>
        CHECK-NEXT: [[ONE:%[0-9]+]] = tj.constant {value = 1} : i64
        CHECK-NEXT: tj.yield [[Y1]], [[ONE]]
        CHECK-NEXT: } else {
        CHECK: [[Y2:%y_[0-9]+]] = tj.binary %x, {{%[0-9]+}} {op = add} : tile<16xf32>
        CHECK-NEXT: tj.yield [[Y2]], %n
        CHECK-NEXT: }
        CHECK-NOT: log
        CHECK-NOT: tj.if
        CHECK: tj.unary %y {op = exp}
        CHECK-NOT: log
        CHECK: tj.store
    """)
    check(branches, (meta(1000), meta(1000), 5), dict(BN=16, USE_EXP=False), """
        CHECK-LABEL: constexprs {USE_EXP = false, BN = 16}
        CHECK: tj.if
        CHECK-NOT: exp
        CHECK: tj.unary %y {op = log}
        CHECK-NOT: exp
    """)


@tilejit.kernel
def if_without_else(A, Y, n, BN: T.constexpr):
    x = A[0:BN]
    if n == 0:
        x = x * 0.0
    Y[0:BN] = x


def test_if_without_else_yields_the_old_value():
    check(if_without_else, (meta(64), meta(64), 3), dict(BN=16), """
        CHECK: %x_1 = tj.if {{%[0-9]+}} -> (tile<16xf16>) {
        CHECK: tj.yield [[X:%x_[0-9]+]]
        CHECK-NEXT: } else {
        CHECK-NEXT: tj.yield %x
        CHECK-NEXT: }
        CHECK: tj.store %x_1
    """)


# -- helpers and folding --------------------------------------------------------------------------------------

@tilejit.func
def scale_shift(x, scale=2.0, shift=1.0):
    return x * scale + shift


@tilejit.func
def max_and_min(x):
    return T.max(x, 0), T.min(x, 0)


@tilejit.kernel
def with_helpers(A, Y, BN: T.constexpr):
    x = scale_shift(A[0:BN].to(T.float32), shift=3.0)
    hi, lo = max_and_min(x)
    Y[0:BN] = x - lo + hi


def test_helpers_are_inlined_with_defaults_and_tuple_returns():
    text = check(with_helpers, (meta(100), meta(100)), dict(BN=16), """
        CHECK-LABEL: tj.func @with_helpers
        CHECK: [[XF:%[0-9]+]] = tj.cast {{%[0-9]+}} {dtype = f32} : tile<16xf32>
        # scale defaults to 2.0, shift is passed as 3.0
        CHECK-NEXT: [[SC:%[0-9]+]] = tj.constant {value = 2.0} : f32
        CHECK-NEXT: [[SCS:%[0-9]+]] = tj.splat [[SC]] {shape = [16]} : tile<16xf32>
        CHECK-NEXT: [[M:%[0-9]+]] = tj.binary [[XF]], [[SCS]] {op = mul} : tile<16xf32>
        CHECK-NEXT: [[SH:%[0-9]+]] = tj.constant {value = 3.0} : f32
        CHECK-NEXT: [[SHS:%[0-9]+]] = tj.splat [[SH]] {shape = [16]} : tile<16xf32>
        CHECK-NEXT: %x = tj.binary [[M]], [[SHS]] {op = add} : tile<16xf32>
        CHECK-NEXT: %hi = tj.reduce %x {axis = 0, kind = max} : f32
        CHECK-NEXT: %lo = tj.reduce %x {axis = 0, kind = min} : f32
        CHECK: tj.store
    """)
    assert "call" not in text and "scale_shift" not in text


@tilejit.kernel
def folding(A, Y, BM: T.constexpr, BN: T.constexpr):
    B = min(BM, BN)
    C = max(BM, BN)
    L = int(math.log2(C))
    x = A[0:B]
    Y[0:B] = T.where(x > 0, x, float("-inf")) + L + abs(-2) + float(B)


def test_python_builtins_on_constants_are_folded():
    text = check(folding, (meta(100), meta(100)), dict(BM=16, BN=64), """
        CHECK-LABEL: constexprs {BM = 16, BN = 64}
        # min(BM, BN) = 16 is the load length
        CHECK: %x = tj.load %A[{{%[0-9]+}}] {shape = [16]} : tile<16xf16>
        CHECK: tj.constant {value = -inf} : f16
        CHECK: tj.select
        # int(math.log2(64)) = 6
        CHECK: tj.constant {value = 6.0} : f16
        # abs(-2)
        CHECK: tj.constant {value = 2.0} : f16
        # float(B)
        CHECK: tj.constant {value = 16.0} : f16
        CHECK: tj.store {{%[0-9]+}}, %Y[{{%[0-9]+}}] {shape = [16]}
    """)
    assert "log" not in text.replace("@folding", "")


from kernels import matmul  # noqa: E402  (the matmul of examples/matmul.py, shared by the test layers)


def test_design_matmul():
    check(matmul, (meta(100, 70), meta(70, 50), meta(100, 50)), dict(BM=64, BN=64, BK=32), """
        CHECK-LABEL: tj.func @matmul(%A: tensor<2d x f16>, %B: tensor<2d x f16>, %C: tensor<2d x f16>)
        CHECK-SAME: constexprs {BM = 64, BN = 64, BK = 32} {
        CHECK: %A_size1 = tj.tensor_dim %A {axis = 1} : i64
        CHECK: %acc_1 = tj.for %k0 = {{%[0-9]+}} to %A_size1 step {{%[0-9]+}} iter_args(%acc_2 = %acc)
        CHECK-SAME: -> (tile<64x64xf32>) {kind = pipelined, stages = 3} {
        CHECK-NEXT: [[A:%[0-9]+]] = tj.load %A[%m0, %k0] {shape = [64, 32]} : tile<64x32xf16>
        CHECK-NEXT: [[B:%[0-9]+]] = tj.load %B[%k0, %n0] {shape = [32, 64]} : tile<32x64xf16>
        CHECK: [[P:%[0-9]+]] = tj.gemm [[A]], [[B]], {{%[0-9]+}}
        CHECK-NEXT: [[ACC:%acc_[0-9]+]] = tj.binary %acc_2, [[P]] {op = add} : tile<64x64xf32>
        CHECK-NEXT: tj.yield [[ACC]]
        CHECK: [[H:%[0-9]+]] = tj.cast %acc_1 {dtype = f16} : tile<64x64xf16>
        CHECK-NEXT: tj.store [[H]], %C[%m0, %n0] {shape = [64, 64]}
    """)


def test_ir_is_cached_per_specialization():
    args = (meta(100, 70), meta(70, 50), meta(100, 50))
    first = matmul.ir(*args, BM=64, BN=64, BK=32)
    assert matmul.ir(*args, BM=64, BN=64, BK=32) == first
    other = matmul.ir(*args, BM=32, BN=64, BK=32)
    assert other != first and "BM = 32" in other


def test_kernel_ir_runs_the_verifier(monkeypatch):
    import tilejit.ir

    verified = []
    real_verify = tilejit.ir.verify

    def recording_verify(fn):
        verified.append(fn.name)
        real_verify(fn)

    monkeypatch.setattr(tilejit.ir, "verify", recording_verify)
    fresh = tilejit.kernel(matmul.fn)  # a new Kernel: nothing cached yet
    fresh.ir(meta(100, 70), meta(70, 50), meta(100, 50), BM=64, BN=64, BK=32)
    assert verified == ["matmul"]


@tilejit.kernel
def k_while_scalar(X, n, BN: T.constexpr):
    i = 0
    total = 0.0
    while i < n:
        total = total + i * 0.5
        i += 2
    X[0:BN] = total


def test_while_loop_carries_scalars():
    ir = k_while_scalar.ir(torch.empty(64, device="meta"), 10, BN=16)
    filecheck(ir, r"""
        CHECK: %total, %i = tj.while (%total_1 = {{%[0-9]+}}, %i_1 = {{%[0-9]+}}) -> (f32, i32) {
        CHECK: tj.cmp {{.*}} {op = lt} : i1
        CHECK-NEXT: tj.yield
        CHECK-NEXT: } do (%total_2, %i_2) {
        CHECK: tj.yield %total_3, %i_3
        CHECK: tj.splat %total {shape = [16]}
    """)
