"""Kernels the tests of every layer share: the matmul of examples/matmul.py and its variants, a batched matmul
with a fused epilogue, a row softmax and the single mma atom.

A test that needs a kernel object of its own (fresh in-memory caches, specialization counters or warnings) builds
one from these with ``tilejit.kernel(kernels.matmul.fn)``. The error corpus keeps its own kernels.
"""
from __future__ import annotations

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
