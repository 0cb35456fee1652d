"""Kernels where one product's accumulator, after elementwise math and a cast, is the next product's operand A
(``lower_mma_rs``: mma.sync reads it from registers), and kernels where it cannot be. Shared by the compile
tests (tests/backend/test_mma_register_a.py), the interpreter runs there and the GPU tests
(tests/gpu/test_gpu_mma_register_a.py)."""
from __future__ import annotations

import tilejit
import tilejit.language as T


@tilejit.kernel
def chain_once(A, B, C, O, scale, BM: T.constexpr, N1: T.constexpr, K: T.constexpr, N2: T.constexpr,
               TB: T.constexpr, ACC: T.constexpr):
    """O = ((A @ B) * scale).to(A.dtype) @ C, one BM-row block per program; C given N2 x N1 with ``TB``; the
    second product accumulates in ``ACC`` (float16 only with float16 operands)."""
    m0 = T.program_id(0) * BM
    s = A[m0:m0 + BM, 0:K] @ B[0:K, 0:N1]
    p = (s * scale).to(A.dtype)
    if TB:
        o = T.gemm(p, C[0:N2, 0:N1], None, transpose_b=True, out_dtype=ACC)
    else:
        o = T.gemm(p, C[0:N1, 0:N2], None, out_dtype=ACC)
    O[m0:m0 + BM, 0:N2] = o


@tilejit.kernel
def chain_loop(A, B, C, O, scale, BM: T.constexpr, BN: T.constexpr, K: T.constexpr, N2: T.constexpr):
    """O = sum over BN-column blocks n of (relu(A @ B[:, n]) * scale).to(A.dtype) @ C[n, :] (attention's shape
    without the softmax: a pipelined loop whose second product reads the first one's result from registers).
    B's columns and C's rows past N read as zeros, so a ragged last block adds nothing."""
    m0 = T.program_id(0) * BM
    N = B.shape[1]
    a = A[m0:m0 + BM, 0:K]
    o = T.zeros((BM, N2), T.float32)
    for n0 in T.range(0, N, BN, stages=2):
        s = a @ B[0:K, n0:n0 + BN]
        p = (T.maximum(s, 0.0) * scale).to(A.dtype)
        o += p @ C[n0:n0 + BN, 0:N2]
    O[m0:m0 + BM, 0:N2] = o


@tilejit.kernel
def chain_transposed(A, B, C, O, BM: T.constexpr, N1: T.constexpr, K: T.constexpr, N2: T.constexpr):
    """O = (A @ B).to(A.dtype).T @ C: the product's result is operand A transposed (N1 x BM), which is not
    m16n8k16's A fragment in any warp arrangement: staged through shared memory."""
    m0 = T.program_id(0) * BM
    p = (A[m0:m0 + BM, 0:K] @ B[0:K, 0:N1]).to(A.dtype)
    O[0:N1, 0:N2] = p.T @ C[m0:m0 + BM, 0:N2]


@tilejit.kernel
def chain_after_k_loop(A, B, C, O, BM: T.constexpr, N1: T.constexpr, BK: T.constexpr, N2: T.constexpr):
    """O = (A @ B).to(A.dtype) @ C with the first product summed over a K loop (a two-layer MLP block): its
    accumulator keeps the main loop's warp grid (warps split along N too), which the second product cannot read
    from registers; the result is staged once, after the loop."""
    m0 = T.program_id(0) * BM
    acc = T.zeros((BM, N1), T.float32)
    for k0 in T.range(0, A.shape[1], BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:N1]
    O[m0:m0 + BM, 0:N2] = acc.to(A.dtype) @ C[0:N1, 0:N2]
