"""The tilejit kernels the benchmarks time.

``matmul`` is the DESIGN.md matmul under ``@tilejit.autotune`` with the default space of
``tilejit.configs``. Two changes from DESIGN.md: the loop is ``T.range(0, K, BK)`` without ``stages=3`` so that
each config's ``num_stages`` sets the pipeline depth, and the programs walk C's tiles in groups of GROUP_M
rows (a 1-D grid, as Triton's matmul tutorial does) so that concurrently running tiles share A and B panels
in L2. The autotune key is the tensors ``A`` and ``B`` (the
autotuner keys a tensor by dtype and shape), so the kernel keeps DESIGN.md's signature without extra M, N, K
parameters. ``matmul.kernel`` is the plain kernel, launched with explicit tiles.
"""
from __future__ import annotations

import tilejit
import tilejit.language as T
from tilejit.configs import matmul_configs, matmul_prune


@tilejit.autotune(configs=matmul_configs(), key=["A", "B"], prune_configs_by={"early_config_prune": matmul_prune})
@tilejit.kernel
def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, GROUP_M: T.constexpr = 8,
           ACC: T.constexpr = T.float32):
    M, K = A.shape
    N = B.shape[1]
    pid = T.program_id(0)
    grid_m = T.cdiv(M, BM)
    grid_n = T.cdiv(N, BN)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(grid_m - first_m, GROUP_M)
    m0 = (first_m + (pid % per_group) % rows) * BM
    n0 = ((pid % per_group) // rows) * BN
    acc = T.zeros((BM, BN), ACC)  # int32 for int8 operands
    for k0 in T.range(0, K, BK):  # pipelined num_stages deep (a launch option, set per config)
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def matmul_grid(meta):
    """Grid of ``matmul`` for the autotuner: one program per BM x BN tile of C (1-D, grouped order)."""
    return (tilejit.cdiv(meta["A"].shape[0], meta["BM"]) * tilejit.cdiv(meta["B"].shape[1], meta["BN"]),)


@tilejit.kernel
def tiny(X, Y, Z, W, n, m, BLOCK: T.constexpr):
    """Four tensors and two ints, almost no work: what a launch costs on the host."""
    i = T.program_id(0) * BLOCK
    W[i:i + BLOCK] = X[i:i + BLOCK] * Y[i:i + BLOCK] + Z[i:i + BLOCK] + (n - m)


def nt_prune(configs, named_args, **kwargs):
    """``matmul_prune`` for kernels taking B as Bt (N x K)."""
    return matmul_prune(configs, {**named_args, "B": named_args["Bt"].T}, **kwargs)


@tilejit.autotune(configs=matmul_configs(elem_bytes=1), key=["A", "Bt"],
                  prune_configs_by={"early_config_prune": nt_prune})
@tilejit.kernel
def scaled_mm(A, Bt, a_scale, b_scale, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr,
              GROUP_M: T.constexpr = 8):
    """C = (A @ Bt.T) * a_scale[:, None] * b_scale[None, :] for fp8 A (M x K) and Bt (N x K, K-major as fp8
    tensor cores want it and as ``torch._scaled_mm`` takes it), float32 row and column scales, any output
    dtype; the scales are applied in the epilogue, as written here."""
    M, K = A.shape
    N = Bt.shape[0]
    pid = T.program_id(0)
    grid_m = T.cdiv(M, BM)
    grid_n = T.cdiv(N, BN)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(grid_m - first_m, GROUP_M)
    m0 = (first_m + (pid % per_group) % rows) * BM
    n0 = ((pid % per_group) // rows) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], Bt[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    y = acc * a_scale[m0:m0 + BM][:, None] * b_scale[n0:n0 + BN][None, :]
    C[m0:m0 + BM, n0:n0 + BN] = y.to(C.dtype)


@tilejit.autotune(configs=matmul_configs(elem_bytes=1), key=["A", "Bt"],
                  prune_configs_by={"early_config_prune": nt_prune})
@tilejit.kernel
def int8_mm(A, Bt, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, GROUP_M: T.constexpr = 8):
    """C (int32) = A @ Bt.T for int8 A (M x K) and Bt (N x K), exact int32 sums."""
    M, K = A.shape
    N = Bt.shape[0]
    pid = T.program_id(0)
    grid_m = T.cdiv(M, BM)
    grid_n = T.cdiv(N, BN)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(grid_m - first_m, GROUP_M)
    m0 = (first_m + (pid % per_group) % rows) * BM
    n0 = ((pid % per_group) // rows) * BN
    acc = T.zeros((BM, BN), T.int32)
    for k0 in T.range(0, K, BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], Bt[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.autotune(configs=matmul_configs(elem_bytes=4), key=["A", "Bt"],
                  prune_configs_by={"early_config_prune": nt_prune})
@tilejit.kernel
def tf32_mm_nt(A, Bt, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, GROUP_M: T.constexpr = 8):
    """C = A @ Bt.T on float32 operands at the default precision (tf32), Bt given N x K (K-major)."""
    M, K = A.shape
    N = Bt.shape[0]
    pid = T.program_id(0)
    grid_m = T.cdiv(M, BM)
    grid_n = T.cdiv(N, BN)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(grid_m - first_m, GROUP_M)
    m0 = (first_m + (pid % per_group) % rows) * BM
    n0 = ((pid % per_group) // rows) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], Bt[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True)
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


tf32_mm_nn = tilejit.autotune(configs=matmul_configs(elem_bytes=4), key=["A", "B"],
                              prune_configs_by={"early_config_prune": matmul_prune})(tilejit.kernel(matmul.fn))
"""The DESIGN matmul (B given K x N) on float32 operands: tf32 by default; on sm_90a B is read into registers as
the transposed product's A (``backend_cuda/lower_wgmma_mn.py``: wgmma reads tf32 K-major only from shared memory)."""

tf32_mm_nn_copy = tilejit.autotune(configs=matmul_configs(elem_bytes=4), key=["A", "B"],
                                   prune_configs_by={"early_config_prune": matmul_prune})(tilejit.kernel(matmul.fn))
"""``tf32_mm_nn`` for launches made with ``TF32_COPY_PINS`` set (``pinned(TF32_COPY_PINS)``, sm_90a): B through a
transposing shared-memory copy to the descriptor lowering, the form the register one replaced, for comparison."""

TF32_COPY_PINS = {"TILEJIT_GEMM_LOWERING": "wgmma_m64nNk8_tf32"}
"""The knob that keeps MN-major tf32 operands on the transposing copy (sm_90a)."""

lowp_mm_nn = tilejit.autotune(configs=matmul_configs(elem_bytes=1), key=["A", "B"],
                              prune_configs_by={"early_config_prune": matmul_prune})(tilejit.kernel(matmul.fn))
"""The DESIGN matmul on fp8 or int8 operands (``ACC=T.int32`` for int8), B given K x N: on wgmma through a
transposing copy of B."""


SM80_PINS = {"TILEJIT_GEMM_LOWERING": "mma_sync_m16n8k16", "TILEJIT_COPY_LOWERING": "cp_async"}
"""The knobs that compile the sm_80 path (cp.async ring, ldmatrix, mma.sync) for a Hopper GPU."""

matmul_sm80 = tilejit.autotune(
    configs=[c for c in matmul_configs() if c.split_k == 1 and not c.options.sm90a_only],
    key=["A", "B"], prune_configs_by={"early_config_prune": matmul_prune})(tilejit.kernel(matmul.fn))
"""The DESIGN matmul over the config space an sm_80 GPU tunes (no cluster, no TMA or Hopper launch options), for
launches made with ``SM80_PINS`` set (``sm80_path``): the sm_80 path, run and tuned on a Hopper GPU."""


def sm80_path():
    """``with sm80_path():`` ``SM80_PINS`` set in the environment for the duration (the previous values restored
    after)."""
    return pinned(SM80_PINS)


def pinned(pins: dict[str, str]):
    """``with pinned(pins):`` the knobs ``pins`` set in the environment for the duration (restored after)."""
    import os
    from unittest import mock

    return mock.patch.dict(os.environ, pins)


def nt_grid(meta):
    """Grid of the N x K-operand kernels above: one program per BM x BN tile of C (1-D, grouped order)."""
    return (tilejit.cdiv(meta["A"].shape[0], meta["BM"]) * tilejit.cdiv(meta["Bt"].shape[0], meta["BN"]),)
