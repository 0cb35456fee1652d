"""Kernels of the matrix-product features: ``out_dtype`` (float16 accumulation), batched products of 3-D
tiles, and the multiply-broadcast-sum form of a product. Shared by the interpreter tests (tests/frontend), the
compile tests (tests/backend) and the GPU tests (tests/gpu)."""
from __future__ import annotations

import tilejit
import tilejit.language as T


@tilejit.kernel
def matmul_out_dtype(A, B, C, OUT: T.constexpr, TRANS_B: T.constexpr, BM: T.constexpr, BN: T.constexpr,
                     BK: T.constexpr):
    """C = A @ B accumulated in ``OUT`` (B given N x K with ``TRANS_B``); C's dtype is the caller's."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), OUT)
    for k0 in T.range(0, A.shape[1], BK):
        a = A[m0:m0 + BM, k0:k0 + BK]
        if TRANS_B:
            acc = T.gemm(a, B[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True, out_dtype=OUT)
        else:
            acc = T.gemm(a, B[k0:k0 + BK, n0:n0 + BN], acc, out_dtype=OUT)
    C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def single_gemm_out_dtype(A, B, C, OUT: T.constexpr, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """One product of a whole (BM, BK) x (BK, BN) block, outside any loop, accumulating in ``OUT``."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    c = T.gemm(A[m0:m0 + BM, 0:BK], B[0:BK, n0:n0 + BN], None, out_dtype=OUT)
    C[m0:m0 + BM, n0:n0 + BN] = c


@tilejit.kernel
def batched_matmul(A, B, C, COMPUTED: T.constexpr, BT: T.constexpr, BM: T.constexpr, BN: T.constexpr,
                   BK: T.constexpr):
    """C[b] = A[b] @ B[b] for BT batches per program (program axis 2), a K loop carrying a 3-D accumulator.
    ``COMPUTED`` scales the loaded operands by 2 first, so the products read computed (register) tiles; the
    result is halved twice back (exact)."""
    b0 = T.program_id(2) * BT
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BT, BM, BN), T.float32)
    for k0 in range(0, A.shape[2], BK):
        a = A[b0:b0 + BT, m0:m0 + BM, k0:k0 + BK]
        b = B[b0:b0 + BT, k0:k0 + BK, n0:n0 + BN]
        if COMPUTED:
            acc = T.gemm(a * 2.0, b * 2.0, acc)
        else:
            acc = T.gemm(a, b, acc)
    if COMPUTED:
        acc = acc * 0.25
    C[b0:b0 + BT, m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def batched_dot(A, B, C, BT: T.constexpr, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C[b] = A[b] @ B[b] with the whole K in one (BT, BM, BK) tile: ``a @ b`` on 3-D tiles."""
    b0 = T.program_id(2) * BT
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    a = A[b0:b0 + BT, m0:m0 + BM, 0:BK]
    b = B[b0:b0 + BT, 0:BK, n0:n0 + BN]
    C[b0:b0 + BT, m0:m0 + BM, n0:n0 + BN] = a @ b


@tilejit.kernel
def broadcast_sum_dot(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """C = A @ B written as a multiply-broadcast-sum, the whole K in one tile (K <= BK)."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    a = A[m0:m0 + BM, 0:BK]
    b = B[0:BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = T.sum(a[:, :, None] * b[None, :, :], 1)
