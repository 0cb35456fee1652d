"""The kernels behind ``tilejit.ops.linear``, ``swiglu_linear`` and ``linear_cross_entropy``, and their launches.

- ``gemm``: C (M, N) = op(A) @ op(B) (+ op(A2) @ op(B2) with ``TWO``; + C with ``ACC_IN``), where op(X) is X or
  X.T (``TRANS_A``/``TRANS_B``): every operand is read in the layout it is stored in and ``T.gemm``'s transposes
  make the product, so no transposed copy is made. Tiles walk C in groups of GROUP_M rows (a 1-D grid, as
  benchmarks/kernels.py's matmul does).
- ``swiglu_fwd``: both products of a tile of x (x @ w_gate.T and x @ w_up.T, two accumulators over one K loop),
  silu(gate) * up in the epilogue; ``STORE_GU`` also stores the two products (what the backward reads).
- ``swiglu_bwd``: dGate and dUp of a tile from dOut and the two products, recomputed (``RECOMPUTE``, the same
  K loop) or loaded.
- ``cross_entropy_rows``: per row of a logits chunk, the float32 log-sum-exp and the loss, then the logits
  overwritten in place by their gradient (softmax - onehot) * scale; rows whose target is ``ignore_index`` get
  loss 0 and gradient 0.

On a GPU the GEMMs are autotuned over ``tilejit.configs.matmul_configs`` without split-K, persistent, pingpong,
stream-K or warp-specialized launches (``_plain``; swiglu's two accumulators take the subset whose registers and
shared memory hold both); under ``TILEJIT_INTERPRET=1`` they run fixed small tiles.
"""
from __future__ import annotations

import functools

import tilejit
import tilejit.language as T
from tilejit import knobs
from tilejit.autotuner import Config
from tilejit.configs import SMEM_BUDGET_BYTES, matmul_configs, matmul_prune, matmul_shared_bytes

#: Tiles under the interpreter (speed there is not the point; every path is exercised).
INTERPRET_TILES = {"BM": 32, "BN": 32, "BK": 32}
#: Columns per step and warps of ``cross_entropy_rows`` on a GPU (one program per row).
CE_BLOCK_V, CE_WARPS = 4096, 8


@tilejit.func
def _operand(X, r0, c0, ROWS, COLS, TRANS):
    """The (ROWS x COLS) tile of op(X) at (r0, c0) as stored: X.T's tile is read from X and transposed by the gemm."""
    if TRANS:
        t = X[c0:c0 + COLS, r0:r0 + ROWS]
    else:
        t = X[r0:r0 + ROWS, c0:c0 + COLS]
    return t


@tilejit.func
def _tile_origin(M, N, BM, BN, GROUP_M):
    """(m0, n0) of this program's output tile, the 1-D grid walked in groups of GROUP_M tile rows."""
    pid = T.program_id(0)
    grid_m = T.cdiv(M, BM)
    grid_n = T.cdiv(N, BN)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(grid_m - first_m, GROUP_M)
    m0 = (first_m + (pid % per_group) % rows) * BM
    n0 = ((pid % per_group) // rows) * BN
    return m0, n0


@tilejit.kernel
def gemm(A, B, C, A2, B2, TRANS_A: T.constexpr, TRANS_B: T.constexpr, ACC_IN: T.constexpr, TWO: T.constexpr,
         BM: T.constexpr, BN: T.constexpr, BK: T.constexpr, GROUP_M: T.constexpr = 8):
    M, N = C.shape
    K = A.shape[1]
    if TRANS_A:
        K = A.shape[0]
    m0, n0 = _tile_origin(M, N, BM, BN, GROUP_M)
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        a = _operand(A, m0, k0, BM, BK, TRANS_A)
        b = _operand(B, k0, n0, BK, BN, TRANS_B)
        acc = T.gemm(a, b, acc, transpose_a=TRANS_A, transpose_b=TRANS_B)
    if TWO:
        K2 = A2.shape[1]
        if TRANS_A:
            K2 = A2.shape[0]
        for k0 in T.range(0, K2, BK):
            a = _operand(A2, m0, k0, BM, BK, TRANS_A)
            b = _operand(B2, k0, n0, BK, BN, TRANS_B)
            acc = T.gemm(a, b, acc, transpose_a=TRANS_A, transpose_b=TRANS_B)
    if ACC_IN:
        acc = acc + C[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.func
def _gate_up(X, Wg, Wu, m0, n0, BM, BN, BK):
    """(x @ w_gate.T, x @ w_up.T) of one tile, float32, over one K loop."""
    K = X.shape[1]
    acc_g = T.zeros((BM, BN), T.float32)
    acc_u = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        x = X[m0:m0 + BM, k0:k0 + BK]
        acc_g = T.gemm(x, Wg[n0:n0 + BN, k0:k0 + BK], acc_g, transpose_b=True)
        acc_u = T.gemm(x, Wu[n0:n0 + BN, k0:k0 + BK], acc_u, transpose_b=True)
    return acc_g, acc_u


@tilejit.kernel
def swiglu_fwd(X, Wg, Wu, Out, G, U, STORE_GU: T.constexpr, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr,
               GROUP_M: T.constexpr = 8):
    M = X.shape[0]
    F = Wg.shape[0]
    m0, n0 = _tile_origin(M, F, BM, BN, GROUP_M)
    g, u = _gate_up(X, Wg, Wu, m0, n0, BM, BN, BK)
    if STORE_GU:
        G[m0:m0 + BM, n0:n0 + BN] = g.to(G.dtype)
        U[m0:m0 + BM, n0:n0 + BN] = u.to(U.dtype)
    Out[m0:m0 + BM, n0:n0 + BN] = (g / (1.0 + T.exp(-g)) * u).to(Out.dtype)


@tilejit.kernel
def swiglu_bwd(X, Wg, Wu, G, U, dOut, dG, dU, RECOMPUTE: T.constexpr, BM: T.constexpr, BN: T.constexpr,
               BK: T.constexpr, GROUP_M: T.constexpr = 8):
    """dG = dOut * up * silu'(gate), dU = dOut * silu(gate), with silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)."""
    M, F = dOut.shape
    m0, n0 = _tile_origin(M, F, BM, BN, GROUP_M)
    if RECOMPUTE:
        g, u = _gate_up(X, Wg, Wu, m0, n0, BM, BN, BK)
    else:
        g = G[m0:m0 + BM, n0:n0 + BN].to(T.float32)
        u = U[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    do = dOut[m0:m0 + BM, n0:n0 + BN].to(T.float32)
    s = 1.0 / (1.0 + T.exp(-g))
    dU[m0:m0 + BM, n0:n0 + BN] = (do * g * s).to(dU.dtype)
    dG[m0:m0 + BM, n0:n0 + BN] = (do * u * s * (1.0 + g * (1.0 - s))).to(dG.dtype)


@tilejit.kernel
def cross_entropy_rows(Logits, Targets, Loss, Scale, ignore_index, BV: T.constexpr):
    """One program per row r of a (R, V) logits chunk: Loss[r] = lse - logit[target] (float32; 0 when the target
    is ``ignore_index``), then Logits[r] = (softmax - onehot) * Scale[0] in place (0 for an ignored row)."""
    r = T.program_id(0)
    V = Logits.shape[1]
    target = Targets[r].to(T.int32)
    m = float("-inf")
    total = 0.0
    picked = 0.0
    for v0 in range(0, V, BV):
        cols = v0 + T.arange(0, BV)
        x = T.where(cols < V, Logits[r, v0:v0 + BV].to(T.float32), float("-inf"))
        m_new = T.maximum(m, T.max(x, 0))
        total = total * T.exp(m - m_new) + T.sum(T.exp(x - m_new), 0)
        picked = picked + T.sum(T.where(cols == target, x, 0.0), 0)
        m = m_new
    lse = m + T.log(total)
    valid = Targets[r] != ignore_index
    Loss[r] = T.where(valid, lse - picked, 0.0)
    scale = T.where(valid, Scale[0], 0.0)
    for v0 in range(0, V, BV):
        cols = v0 + T.arange(0, BV)
        x = Logits[r, v0:v0 + BV].to(T.float32)
        grad = (T.exp(x - lse) - T.where(cols == target, 1.0, 0.0)) * scale
        Logits[r, v0:v0 + BV] = grad.to(Logits.dtype)


#: The launch options the ops' kernels are not tuned over (``_plain``): split-K would sum partial products through
#: an epilogue that is not linear (SwiGLU) or add C once per split (the accumulating form); a persistent or
#: pingpong walk of the grid would bypass the grouped tile order of ``_tile_origin``; and a warp-specialized
#: 128x256x64 config of ``gemm`` failed to launch (CUDA_ERROR_LAUNCH_FAILED) in the example model's training on an
#: H100, not yet explained, so no config of these kernels takes a producer warpgroup.


def _plain(configs):
    """``configs`` without split-K, persistent, pingpong, stream-K or warp-specialized launches."""
    return [c for c in configs if c.split_k == 1 and not (c.persistent or c.pingpong or c.stream_k
                                                          or c.warp_specialize)]


def _gemm_prune(configs, named_args, **kwargs):
    """``matmul_prune`` on the logical operands op(A) (M x K) and op(B) (K x N) (transposed views, no copies).
    Only ``_plain`` configs; the accumulating form also reads C's tile in its epilogue (held in shared memory
    beside the ring), so its configs must fit with that tile."""
    a, b = named_args["A"], named_args["B"]
    logical = {"A": a.T if named_args.get("TRANS_A") else a, "B": b.T if named_args.get("TRANS_B") else b}
    configs = _plain(configs)
    if named_args.get("ACC_IN"):
        c_bytes = named_args["C"].element_size()
        configs = [c for c in configs if matmul_shared_bytes(c, a.element_size()) +
                   c.kwargs["BM"] * c.kwargs["BN"] * c_bytes <= SMEM_BUDGET_BYTES]
    return matmul_prune(configs, {**named_args, **logical}, **kwargs)


def swiglu_configs(elem_bytes: int) -> list[Config]:
    """``matmul_configs`` whose ring holds two B tiles (``SMEM_BUDGET_BYTES``) and whose two float32 accumulators
    take at most 128 registers a thread (BM * BN * 2 / (32 * num_warps))."""
    def fits(c: Config) -> bool:
        k = c.kwargs
        two_b = matmul_shared_bytes(c, elem_bytes) + c.num_stages * k["BK"] * k["BN"] * elem_bytes
        return two_b <= SMEM_BUDGET_BYTES and 2 * k["BM"] * k["BN"] <= 128 * 32 * c.num_warps
    return [c for c in _plain(matmul_configs(elem_bytes=elem_bytes)) if fits(c)]


#: (BM, BN, BK, num_warps, num_stages, warp_specialize) of ``swiglu_bwd`` recomputing the products: its epilogue
#: holds dOut and both products too, so the accumulators get 64 registers a thread (at 128 they spill: 1.7 KB at
#: 128x128 on 8 warps, sm_90a).
_SWIGLU_RECOMPUTE_TILES = [(64, 64, 64, 4, 3, False), (64, 64, 64, 4, 4, False), (128, 64, 64, 8, 3, False),
                           (128, 64, 64, 8, 4, False), (64, 128, 64, 8, 3, False), (64, 128, 64, 8, 4, False)]


def swiglu_recompute_configs(elem_bytes: int) -> list[Config]:
    """The configs ``swiglu_bwd`` with ``RECOMPUTE`` tunes over (``_SWIGLU_RECOMPUTE_TILES``, BK in bytes of K)."""
    return [Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s,
                   **({"warp_specialize": True} if ws else {})) for bm, bn, bk, w, s, ws in _SWIGLU_RECOMPUTE_TILES]


def _swiglu_prune(configs, named_args, **kwargs):
    """``matmul_prune`` on the problem x (M x K) @ w_gate.T (K x F)."""
    return matmul_prune(configs, {**named_args, "A": named_args["X"], "B": named_args["Wg"].T}, **kwargs)


def _tuned(kernel, configs, key, prune, restore=()):
    return tilejit.autotune(configs=configs, key=key, prune_configs_by={"early_config_prune": prune},
                            restore_value=list(restore))(tilejit.kernel(kernel.fn))


_GEMM_KEY = ["A", "B", "C", "A2", "TRANS_A", "TRANS_B", "ACC_IN", "TWO"]


@functools.cache
def tuned_gemm(elem_bytes: int, trans_a: bool, trans_b: bool, accumulate: bool, two: bool):
    """The autotuned ``gemm`` of one operand size (2: fp16/bf16; 4: float32 on tf32) and one form, a kernel object
    of its own (a model's few forms and shapes stay under the respecialization warning of one kernel). An
    accumulating form (C += ...) restores C after every timed run, so tuning adds nothing twice."""
    return _tuned(gemm, matmul_configs(elem_bytes=elem_bytes), _GEMM_KEY, _gemm_prune,
                  restore=["C"] if accumulate else ())


TUNED_SWIGLU_FWD = {size: _tuned(swiglu_fwd, swiglu_configs(size), ["X", "Wg", "Out", "STORE_GU"], _swiglu_prune)
                    for size in (2, 4)}
TUNED_SWIGLU_BWD = {size: _tuned(swiglu_bwd, swiglu_recompute_configs(size), ["X", "Wg", "dOut", "RECOMPUTE"],
                                  _swiglu_prune) for size in (2, 4)}
#: The elementwise backward (``RECOMPUTE=False``: no K loop, nothing to tune).
SWIGLU_BWD_LOADED = {"BM": 32, "BN": 128, "BK": 32, "num_warps": 4}


def _tiles_grid(rows: int, cols: int):
    return lambda meta: (tilejit.cdiv(rows, meta["BM"]) * tilejit.cdiv(cols, meta["BN"]),)


def _launch(tuned, kernel, rows: int, cols: int, args: tuple, constexprs: dict) -> None:
    """``kernel`` over the tiles of a (rows x cols) output: fixed tiles under the interpreter, else the autotuned
    kernel ``tuned()`` returns."""
    if knobs.interpret():
        kernel[_tiles_grid(rows, cols)](*args, **constexprs, **INTERPRET_TILES, num_warps=4)
    else:
        tuned()[_tiles_grid(rows, cols)](*args, **constexprs)


def matmul(a, b, c, *, trans_a: bool = False, trans_b: bool = False, accumulate: bool = False, a2=None,
           b2=None) -> None:
    """c = op(a) @ op(b) [+ op(a2) @ op(b2)] [+ c], written into ``c``; op(x) = x.T where ``trans_*``. All 2-D;
    a, b (a2, b2) of one dtype; c of any float dtype."""
    two = a2 is not None
    args = (a, b, c, a2 if two else a, b2 if two else b)
    flags = dict(TRANS_A=trans_a, TRANS_B=trans_b, ACC_IN=accumulate, TWO=two)
    _launch(lambda: tuned_gemm(a.element_size(), trans_a, trans_b, accumulate, two), gemm, c.shape[0], c.shape[1],
            args, flags)


def swiglu_forward(x, w_gate, w_up, out, gate, up) -> None:
    """out = silu(x @ w_gate.T) * (x @ w_up.T); ``gate``/``up`` (or None) also receive the two products."""
    store = gate is not None
    args = (x, w_gate, w_up, out, gate if store else out, up if store else out)
    _launch(lambda: TUNED_SWIGLU_FWD[x.element_size()], swiglu_fwd, out.shape[0], out.shape[1], args,
            {"STORE_GU": store})


def swiglu_backward_gates(x, w_gate, w_up, gate, up, d_out, d_gate, d_up) -> None:
    """d_gate, d_up from d_out and the products: loaded from ``gate``/``up``, or recomputed when they are None."""
    rows, cols = d_out.shape
    if gate is not None:
        args = (x, w_gate, w_up, gate, up, d_out, d_gate, d_up)
        config = INTERPRET_TILES if knobs.interpret() else SWIGLU_BWD_LOADED
        swiglu_bwd[_tiles_grid(rows, cols)](*args, RECOMPUTE=False, **{"num_warps": 4, **config})
        return
    args = (x, w_gate, w_up, d_out, d_out, d_out, d_gate, d_up)
    _launch(lambda: TUNED_SWIGLU_BWD[x.element_size()], swiglu_bwd, rows, cols, args, {"RECOMPUTE": True})


def cross_entropy_chunk(logits, targets, loss_rows, scale, ignore_index: int) -> None:
    """``cross_entropy_rows`` over every row of ``logits`` (gradient written in place)."""
    block = 64 if knobs.interpret() else CE_BLOCK_V
    warps = 4 if knobs.interpret() else CE_WARPS
    cross_entropy_rows[(logits.shape[0],)](logits, targets, loss_rows, scale, int(ignore_index), BV=block,
                                           num_warps=warps)
