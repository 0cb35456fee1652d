"""Kernels the tests of several layers share, and the specializations the pass-pipeline tests compile."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import tilejit
import tilejit.language as T


@tilejit.kernel
def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """The matmul of examples/matmul.py (a 3-stage pipelined K loop)."""
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def matmul_staged(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """That matmul with the pipeline depth left to the launch's num_stages."""
    M, K = A.shape
    N = B.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def matmul_nt(A, Bt, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C = A @ Bt.T with Bt stored N x K."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], Bt[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def matmul_tn(At, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C = At.T @ B with At stored K x M."""
    K = At.shape[0]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += At[k0:k0 + BK, m0:m0 + BM].T @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def bmm_epilogue(A, B, bias, C, scale, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C[b] = relu(scale * A[b] @ B[b] + bias[None, :]) in the output dtype."""
    b = T.program_id(2)
    K = A.shape[2]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=2):
        acc += A[b, m0:m0 + BM, k0:k0 + BK] @ B[b, k0:k0 + BK, n0:n0 + BN]
    y = acc * scale + bias[n0:n0 + BN].to(T.float32)[None, :]
    C[b, m0:m0 + BM, n0:n0 + BN] = T.maximum(y, 0.0).to(C.dtype)


@tilejit.kernel
def softmax_rows(X, Y, BN: T.constexpr):
    r = T.program_id(0)
    N = X.shape[1]
    cols = T.arange(0, BN)
    x = X[r, 0:BN].to(T.float32)
    x = T.where(cols < N, x, float("-inf"))
    e = T.exp(x - T.max(x, 0))
    Y[r, 0:BN] = (e / T.sum(e, 0)).to(Y.dtype)


@tilejit.kernel
def atom(A, B, C):
    """One warp computing a single 16x8x16 mma atom (the seeds' first program)."""
    C[0:16, 0:8] = A[0:16, 0:16] @ B[0:16, 0:8]


# matmul_any's (TA, TB) for each operand major-ness: A given K x M ("t" first), B given N x K ("t" second)
MAJORS = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "tt": (True, True)}


@tilejit.kernel
def matmul_any(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, TA: T.constexpr, TB: T.constexpr,
               ACC: T.constexpr, PRECISION: T.constexpr = None):
    """C = op(A) @ op(B) with A given K x M when TA and B given N x K when TB, any operand dtype: the kernel the
    dtype tests (fp8, int8, tf32) compile and run for every operand major-ness."""
    M = C.shape[0]
    N = C.shape[1]
    K = A.shape[0] if TA else A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), ACC)
    for k0 in T.range(0, K, BK, stages=3):
        if TA:
            a = A[k0:k0 + BK, m0:m0 + BM]
        else:
            a = A[m0:m0 + BM, k0:k0 + BK]
        if TB:
            b = B[n0:n0 + BN, k0:k0 + BK]
        else:
            b = B[k0:k0 + BK, n0:n0 + BN]
        acc = T.gemm(a, b, acc, transpose_a=TA, transpose_b=TB, precision=PRECISION)
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def fixed_b(A, B, C, D, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """One B tile (K x N, N-major) loaded before a loop over row blocks of A and read by two gemms."""
    b = B[0:BK, 0:BN]
    acc = T.zeros((BM, BN), T.float32)
    acc2 = T.zeros((BM, BN), T.float32)
    for r in T.range(0, A.shape[0] // BM):
        acc += A[r * BM:r * BM + BM, 0:BK] @ b
        acc2 += D[r * BM:r * BM + BM, 0:BK] @ b
    C[0:BM, 0:BN] = acc + acc2


@tilejit.kernel
def linear_relu(X, W, bias, Y, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Y = relu(X @ W + bias), the epilogue fused after a warp-specialized main loop (2-D grid: M tiles, N tiles)."""
    M, K = X.shape
    N = W.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, warp_specialize=True):
        acc += X[m0:m0 + BM, k0:k0 + BK] @ W[k0:k0 + BK, n0:n0 + BN]
    y = T.maximum(acc + bias[n0:n0 + BN][None, :].to(T.float32), 0.0)
    Y[m0:m0 + BM, n0:n0 + BN] = y.to(Y.dtype)


@tilejit.kernel
def bmm_grid3(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C[z] = A[z] @ B[z] on a 3-D grid (x: N tiles, y: M tiles, z: batch), T.num_programs read too."""
    K = A.shape[2]
    z = T.program_id(2)
    m0 = T.program_id(1) * BM
    n0 = (T.num_programs(0) - 1 - T.program_id(0)) * BN  # the x order reversed: num_programs must be the grid's
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[z, m0:m0 + BM, k0:k0 + BK] @ B[z, k0:k0 + BK, n0:n0 + BN]
    C[z, m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


# A test that needs a kernel object of its own (fresh in-memory caches, specialization counters or warnings)
# builds one from the kernels above with ``tilejit.kernel(kernels.matmul.fn)``. The error corpus keeps its own
# kernels. The line numbers of the kernels above appear in the generated code (scripts/codegen_digest.py
# compiles them): add new kernels below, not above.


# -- the pass-pipeline cases -------------------------------------------------------------------------------------
# tests/passes/test_passes.py checks the IR the passes leave for these specializations,
# tests/backend/test_pass_codegen.py the CUDA and PTX made from it.

REPO = Path(__file__).resolve().parents[1]


def _load_example_matmul():
    spec = importlib.util.spec_from_file_location("tilejit_examples_matmul", REPO / "examples" / "matmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.matmul


example_matmul = _load_example_matmul()  # the kernel of examples/matmul.py: T.range(0, K, BK, stages=3)


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@tilejit.kernel
def matmul_nt_view(A, Bt, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ Bt[n0:n0 + BN, k0:k0 + BK].T
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def softmax_2d(X, Y, BM: T.constexpr, BN: T.constexpr):
    m0 = T.program_id(0) * BM
    x = X[m0:m0 + BM, 0:BN].to(T.float32)
    e = T.exp(x - T.max(x, 1)[:, None])
    Y[m0:m0 + BM, 0:BN] = (e / T.sum(e, 1)[:, None]).to(Y.dtype)


@tilejit.kernel
def bias_epilogue(A, B, bias, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=2):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    y = acc + bias[n0:n0 + BN][None, :]
    C[m0:m0 + BM, n0:n0 + BN] = T.maximum(y, 0.0).to(C.dtype)


@tilejit.kernel
def row_max_epilogue(A, B, C, R, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """A reduction of the accumulator broadcast back over it: slice of #mma, free broadcast."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    mx = T.max(acc, 1)
    C[m0:m0 + BM, n0:n0 + BN] = (acc - mx[:, None]).to(C.dtype)
    R[m0:m0 + BM] = mx


@tilejit.kernel
def copy_rows(X, Y, BM: T.constexpr, BN: T.constexpr):
    """A register tile loaded and stored whole: BM x BN / 128 registers per thread."""
    m0 = T.program_id(0) * BM
    Y[m0:m0 + BM, 0:BN] = X[m0:m0 + BM, 0:BN]


@tilejit.kernel
def matmul_stages1(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=1):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def register_operand(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """The A operand is computed in registers, so it has to be written to shared memory for ldmatrix."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        a = (A[m0:m0 + BM, k0:k0 + BK] * 2.0).to(T.float16)
        acc += a @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def staged_and_elementwise(A, B, C, D, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """One load feeds a gemm (staged in shared memory) and an elementwise op (read back to registers)."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    a = A[m0:m0 + BM, 0:BK]
    acc = T.zeros((BM, BN), T.float32)
    acc += a @ B[0:BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)
    D[m0:m0 + BM, 0:BK] = a + 1.0


@tilejit.kernel
def carried_offsets(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """A's window moves with a loop-carried offset: it cannot be prefetched; B's can."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    off = 0
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, off:off + BK] @ B[k0:k0 + BK, n0:n0 + BN]
        off = off + BK
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def carried_only(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Both windows move with a loop-carried offset: nothing is prefetched."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    off = 0
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, off:off + BK] @ B[off:off + BK, n0:n0 + BN]
        off = off + BK
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def induction_arith(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """Window starts computed from the induction variable inside the body are still prefetchable."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for i in T.range(0, K // BK, 1, stages=4):
        k0 = i * BK
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def acc_from_load(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C += A @ B with the accumulator initialised from C."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = C[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def _mm(kernel, bm, bn, bk, arch, warps=4, dtype=torch.float16, a=(256, 256), b=(256, 256), **extra):
    return kernel, (meta(*a, dtype=dtype), meta(*b, dtype=dtype), meta(256, 256, dtype=dtype)), \
        dict(BM=bm, BN=bn, BK=bk, num_warps=warps, arch=arch, **extra)


PASS_CASES = {
    "mm80": lambda: _mm(example_matmul, 128, 128, 32, "sm_80"),
    "mm80_bf16": lambda: _mm(example_matmul, 64, 64, 32, "sm_80", dtype=torch.bfloat16),
    "mm90": lambda: _mm(example_matmul, 128, 128, 64, "sm_90a"),
    "mm90_wg2": lambda: _mm(example_matmul, 128, 256, 64, "sm_90a", warps=8),
    "mm90_bk32": lambda: _mm(example_matmul, 128, 128, 32, "sm_90a"),
    "nt": lambda: _mm(matmul_nt_view, 128, 128, 32, "sm_80"),
    "nt_gemm": lambda: _mm(matmul_nt, 64, 128, 32, "sm_80"),
    "tn": lambda: _mm(matmul_tn, 128, 64, 32, "sm_80"),
    "softmax_rows": lambda: (softmax_rows, (meta(64, 1000), meta(64, 1000)),
                             dict(BN=1024, arch="sm_80")),
    "softmax_2d": lambda: (softmax_2d, (meta(64, 100), meta(64, 100)), dict(BM=4, BN=128, arch="sm_80")),
    "softmax_2d_f32": lambda: (softmax_2d, (meta(64, 100, dtype=torch.float32), meta(64, 100, dtype=torch.float32)),
                               dict(BM=4, BN=128, arch="sm_80")),
    "softmax_strided": lambda: (softmax_rows, (meta(64, 2000)[:, ::2], meta(64, 1000)),
                                dict(BN=1024, arch="sm_80")),
    "bias": lambda: (bias_epilogue, (meta(256, 256), meta(256, 256), meta(256, dtype=torch.float32),
                                     meta(256, 256)), dict(BM=64, BN=64, BK=32, arch="sm_80")),
    "rowmax": lambda: (row_max_epilogue, (meta(256, 256), meta(256, 256), meta(256, 256),
                                          meta(256, dtype=torch.float32)), dict(BM=64, BN=64, BK=32, arch="sm_80")),
    "num_stages1": lambda: _mm(matmul_staged, 64, 64, 32, "sm_80", num_stages=1),
    "stages1": lambda: _mm(matmul_stages1, 64, 64, 32, "sm_80"),
    "register_operand": lambda: _mm(register_operand, 64, 64, 32, "sm_80"),
    "staged_elementwise": lambda: (staged_and_elementwise, (meta(256, 256), meta(256, 256), meta(256, 256),
                                                           meta(256, 256)), dict(BM=64, BN=64, BK=32, arch="sm_80")),
    "carried": lambda: _mm(carried_offsets, 64, 64, 32, "sm_80"),
    "carried_only": lambda: _mm(carried_only, 64, 64, 32, "sm_80"),
    "induction": lambda: _mm(induction_arith, 64, 64, 32, "sm_80"),
    "acc_from_load": lambda: _mm(acc_from_load, 64, 64, 32, "sm_80"),
}
# Kernels with no loop, gemm or layout conversion (nothing for the layout invariants of tests/passes to check).
PLAIN_PASS_CASES = {
    "copy_i8": lambda: (copy_rows, (meta(64, 256, dtype=torch.int8), meta(64, 256, dtype=torch.int8)),
                        dict(BM=16, BN=256, arch="sm_80")),
    "copy_f32": lambda: (copy_rows, (meta(64, 256, dtype=torch.float32), meta(64, 256, dtype=torch.float32)),
                         dict(BM=16, BN=256, arch="sm_86")),
    "copy_f32_sm90": lambda: (copy_rows, (meta(64, 256, dtype=torch.float32), meta(64, 256, dtype=torch.float32)),
                              dict(BM=16, BN=256, arch="sm_90a")),
}


@tilejit.kernel
def ragged_exp_row_sum(X, Out, BM: T.constexpr, BN: T.constexpr):
    """Out[i] = sum_j exp(X[i, j]) in blocks of BN columns, the ragged last block masked by ``T.where`` (without the
    mask the out-of-bounds columns, read as 0, would add exp(0) = 1 each)."""
    m0 = T.program_id(0) * BM
    N = X.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for n0 in T.range(0, N, BN):
        cols = n0 + T.arange(0, BN)
        x = X[m0:m0 + BM, n0:n0 + BN].to(T.float32)
        acc += T.where(cols[None, :] < N, T.exp(x), 0.0)
    Out[m0:m0 + BM] = T.sum(acc, 1)


@tilejit.kernel
def masked_from_start(X, Out, start, BN: T.constexpr):
    """Out[0] = sum of X[j] for j >= start, in blocks of BN, the mask a lower bound on the loop (masked iterations
    first, then unmasked ones); and, mask by mask, forms that are not affine in the loop index (left unsplit)."""
    N = X.shape[0]
    acc = T.zeros((BN,), T.float32)
    for n0 in T.range(0, N, BN):
        cols = n0 + T.arange(0, BN)
        acc += T.where(cols >= start, X[n0:n0 + BN], 0.0)
    Out[0] = T.sum(acc, 0)


@tilejit.kernel
def unpeelable_masks(X, Out, BN: T.constexpr):
    """Masks no split can drop: on loaded data, on a product of the loop index with itself, and an equality."""
    N = X.shape[0]
    acc = T.zeros((BN,), T.float32)
    for n0 in T.range(0, N, BN):
        cols = n0 + T.arange(0, BN)
        x = X[n0:n0 + BN]
        acc += T.where(x > 0.0, x, 1.0)
        acc += T.where(cols * cols < N, x, 2.0)
        acc += T.where(cols == N - 1, x, 3.0)
    Out[0] = T.sum(acc, 0)


# -- tile atomic adds of gemm accumulators (TMA bulk reductions on sm_90+: lower_atomic._bulk_reduction) ----------

@tilejit.kernel
def splitk_atomic(A, B, C, K_SPLIT, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, SEM: T.constexpr = "relaxed",
                  SCOPE: T.constexpr = "gpu", ACC: T.constexpr = T.float32):
    """C += A @ B, program (i, j, s) adding its BM x BN tile's product over K chunk s into C by one tile
    atomic_add: the split-K of examples/splitk_matmul.py, with the atomic's sem and scope given."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    k_begin = T.program_id(2) * K_SPLIT
    acc = T.zeros((BM, BN), ACC)
    for k0 in T.range(k_begin, T.minimum(k_begin + K_SPLIT, K), BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    T.atomic_add(C[m0:m0 + BM, n0:n0 + BN], acc, sem=SEM, scope=SCOPE)


@tilejit.kernel
def accumulate_blocks(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, STAGES: T.constexpr = 2,
                      TB: T.constexpr = False, ACC: T.constexpr = T.float32):
    """C[0:BM, 0:BN] += A[p] @ B[p] for every program p (B[p] given N x K when TB): each K block's product is
    added into the same window inside the pipelined loop, so the reductions of every program and iteration land
    on the same lines."""
    p = T.program_id(0)
    for k0 in T.range(0, A.shape[2], BK, stages=STAGES):
        if TB:
            b = B[p, 0:BN, k0:k0 + BK]
        else:
            b = B[p, k0:k0 + BK, 0:BN]
        part = T.gemm(A[p, 0:BM, k0:k0 + BK], b, T.zeros((BM, BN), ACC), transpose_b=TB)
        T.atomic_add(C[0:BM, 0:BN], part, sem="relaxed")
