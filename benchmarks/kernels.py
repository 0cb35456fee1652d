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


@tilejit.autotune(configs=matmul_configs(elem_bytes=1), key=["A", "Bt", "PRECISION"],
                  prune_configs_by={"early_config_prune": nt_prune})
@tilejit.kernel
def scaled_mm(A, Bt, a_scale, b_scale, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr,
              GROUP_M: T.constexpr = 8, PRECISION: T.constexpr = "precise"):
    """C = (A @ Bt.T) * a_scale[:, None] * b_scale[None, :] for fp8 A (M x K) and Bt (N x K, K-major, as
    ``torch._scaled_mm`` takes it), float32 row and column scales (in the epilogue), any output dtype; PRECISION
    "precise" or "fast" (pass it: it is part of the tuning key), as ``_scaled_mm``'s ``use_fast_accum``."""
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
        acc = T.gemm(A[m0:m0 + BM, k0:k0 + BK], Bt[n0:n0 + BN, k0:k0 + BK], acc, transpose_b=True, precision=PRECISION)
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
"""The DESIGN matmul on fp8 or int8 operands (``ACC=T.int32`` for int8), B given K x N: on sm_90a B is gathered
into registers as the transposed product's A (``backend_cuda/lower_wgmma_mn8.py``)."""

lowp_mm_nn_copy = tilejit.autotune(configs=matmul_configs(elem_bytes=1), key=["A", "B"],
                                   prune_configs_by={"early_config_prune": matmul_prune})(tilejit.kernel(matmul.fn))
"""``lowp_mm_nn`` for launches made with ``LOWP_COPY_PINS`` set (sm_90a): B through a transposing shared-memory copy
to the descriptor lowering, the form the register one replaced, for comparison."""

LOWP_COPY_PINS = {"fp8": {"TILEJIT_GEMM_LOWERING": "wgmma_m64nNk32_fp8"},
                  "int8": {"TILEJIT_GEMM_LOWERING": "wgmma_m64nNk32_int8"}}
"""The knobs that keep an MN-major fp8 or int8 operand on the transposing copy (sm_90a)."""


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


@tilejit.kernel
def attention_one_loop(Q, K, V, O, sm_scale, BM: T.constexpr, BN: T.constexpr, D: T.constexpr,
                       CAUSAL: T.constexpr):
    """A FlashAttention-2 forward written the obvious way (what ``benchmarks/attention.py`` times beside
    ``attention()``): one ``T.range`` loop over the key blocks, the keys' ragged end and the causal diagonal masked
    by ``T.where`` in every block, no launch options but tiles and warps: the compiler peels the blocks whose mask
    is all true (``passes/peel_masks.py``) and chooses the pipeline (``passes/launch_model.py``; what
    ``benchmarks/launch_model.py`` times). Grid: (cdiv(S, BM), H, B)."""
    b = T.program_id(2)
    h = T.program_id(1)
    m0 = T.program_id(0) * BM
    S = Q.shape[2]
    q = Q[b, h, m0:m0 + BM, 0:D]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    qk_scale = sm_scale * 1.4426950408889634
    rows = m0 + T.arange(0, BM)
    hi = S
    if CAUSAL:
        hi = T.minimum(S, m0 + BM)
    for n0 in T.range(0, hi, BN):
        s = q @ K[b, h, n0:n0 + BN, 0:D].T
        cols = n0 + T.arange(0, BN)
        valid = cols[None, :] < S
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = T.where(valid, s, float("-inf"))
        m_new = T.maximum(m_i, T.max(s, 1) * qk_scale)
        p = T.exp2(s * qk_scale - m_new[:, None])
        alpha = T.exp2(m_i - m_new)
        l_i = l_i * alpha + T.sum(p, 1)
        acc = acc * alpha[:, None] + p.to(V.dtype) @ V[b, h, n0:n0 + BN, 0:D]
        m_i = m_new
    O[b, h, m0:m0 + BM, 0:D] = (acc / l_i[:, None]).to(O.dtype)
