"""The kernels behind ``tilejit.ops.linear``, ``swiglu_linear`` and ``linear_cross_entropy``, and their launches.

- ``gemm``: C (M, N) = op(A) @ op(B) (+ op(A2) @ op(B2) with ``TWO``; + C with ``ACC_IN``), where op(X) is X or
  X.T (``TRANS_A``/``TRANS_B``): every operand is read in the layout it is stored in and ``T.gemm``'s transposes
  make the product, so no transposed copy is made. Tiles walk C in groups of GROUP_M rows (a 1-D grid, as
  benchmarks/kernels.py's matmul does).
- ``swiglu_fwd``: both products of a tile of x (x @ w_gate.T and x @ w_up.T, two accumulators over one K loop),
  silu(gate) * up in the epilogue; ``STORE_GU`` also stores the two products (what the backward reads).
- ``swiglu_bwd``: dGate and dUp of a tile from dOut and the two products, recomputed (``RECOMPUTE``, the same
  K loop) or loaded.
- ``cross_entropy_rows``: per block of rows of a logits chunk, the float32 log-sum-exp and the loss, then the
  logits overwritten in place by their gradient (softmax - onehot) * scale; rows whose target is ``ignore_index``
  get loss 0 and gradient 0.

On a GPU each GEMM form is autotuned over a short curated list of plain tiles (``GEMM_TILES``,
``ACCUMULATE_TILES``, ``SWIGLU_TILES``, ``_SWIGLU_RECOMPUTE_TILES``; at most 8 each, then ``matmul_prune``): a
model's first training step tunes every form and shape it meets, and the plain part of ``matmul_configs`` (19
configs a GEMM form at 16 bits) made that step, and each GPU test of these ops, spend over a minute compiling and
timing candidates. Where each tile comes from is written beside its list. No persistent, pingpong or stream-K
launch (``_plain``, below); split-K only for ``gemm``'s one-loop forms (``GEMM_SPLIT_TILES``); a few
warp-specialized tiles (``GEMM_WS_TILES``, ``SWIGLU_WS_TILES``).
Under ``TILEJIT_INTERPRET=1`` they run fixed small tiles.
"""
from __future__ import annotations

import functools

import tilejit
import tilejit.language as T
from tilejit import knobs
from tilejit.autotuner import Config
from tilejit.configs import SMEM_BUDGET_BYTES, matmul_prune, matmul_shared_bytes

#: Tiles under the interpreter (speed there is not the point; every path is exercised).
INTERPRET_TILES = {"BM": 32, "BN": 32, "BK": 32}
#: ``cross_entropy_rows``' blocks: at most CE_MAX_BLOCK_V columns, and rows packed into a block of about CE_TILE
#: elements while a row fits one block (a longer row gets a program of its own: a chunk of long rows has few rows).
CE_MAX_BLOCK_V, CE_TILE = 1024, 2048


@tilejit.func
def _operand(X, r0, c0, ROWS, COLS, TRANS):
    """The (ROWS x COLS) tile of op(X) at (r0, c0) as stored: X.T's tile is read from X and transposed by the gemm."""
    if TRANS:
        t = X[c0:c0 + COLS, r0:r0 + ROWS]
    else:
        t = X[r0:r0 + ROWS, c0:c0 + COLS]
    return t


@tilejit.func
def grouped_tile_order(grid_m, grid_n, GROUP_M):
    """(row tile, column tile) of this program on a 1-D grid of ``grid_m`` x ``grid_n`` tiles walked in groups of
    ``GROUP_M`` row tiles, each group's column tiles in turn: the A rows a group reads stay in L2 while its
    programs sweep B (A read from memory about once, not once per column tile as a row-first walk does where A
    outgrows L2)."""
    pid = T.program_id(0)
    per_group = GROUP_M * grid_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(grid_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % rows, (pid % per_group) // rows


@tilejit.func
def _tile_origin(M, N, BM, BN, GROUP_M):
    """(m0, n0) of this program's output tile, the 1-D grid walked in groups of GROUP_M tile rows."""
    row, col = grouped_tile_order(T.cdiv(M, BM), T.cdiv(N, BN), GROUP_M)
    return row * BM, col * BN


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


@tilejit.func
def _logits_block(Logits, m0, v0, BM, BV):
    """Rows m0 .. m0 + BM, columns v0 .. v0 + BV of the logits in float32 (-inf past the vocabulary), and the
    column indices."""
    cols = v0 + T.arange(0, BV)
    x = T.where(cols[None, :] < Logits.shape[1], Logits[m0:m0 + BM, v0:v0 + BV].to(T.float32), float("-inf"))
    return x, cols


@tilejit.kernel
def cross_entropy_rows(Logits, Targets, Loss, Scale, ignore_index, BM: T.constexpr, BV: T.constexpr):
    """Rows m0 .. m0 + BM of a (R, V) logits chunk, walked in blocks of BV columns: Loss[r] = lse - logit[target]
    (float32; 0 where the target is ``ignore_index``), then Logits[r] = (softmax - onehot) * Scale[0] in place (0
    for an ignored row). The walk keeps a running maximum, sum of exponentials and picked logit per element of
    the block (no reduction inside the loop); the rows are reduced once, after it."""
    m0 = T.program_id(0) * BM
    V = Logits.shape[1]
    target = Targets[m0:m0 + BM]
    m = T.full((BM, BV), -1e30, T.float32)  # finite: exp(m - m_new) of a column never seen is exp(0), not NaN
    total = T.zeros((BM, BV), T.float32)
    picked = T.zeros((BM, BV), T.float32)
    for v0 in range(0, V, BV):
        x, cols = _logits_block(Logits, m0, v0, BM, BV)
        m_new = T.maximum(m, x)
        total = total * T.exp(m - m_new) + T.exp(x - m_new)
        picked = picked + T.where(cols[None, :] == target[:, None], x, 0.0)
        m = m_new
    row_max = T.max(m, 1)
    lse = row_max + T.log(T.sum(total * T.exp(m - row_max[:, None]), 1))
    valid = target != ignore_index
    Loss[m0:m0 + BM] = T.where(valid, lse - T.sum(picked, 1), 0.0)
    scale = T.where(valid, Scale[0], 0.0)
    for v0 in range(0, V, BV):
        x, cols = _logits_block(Logits, m0, v0, BM, BV)
        grad = (T.exp(x - lse[:, None]) - T.where(cols[None, :] == target[:, None], 1.0, 0.0)) * scale[:, None]
        Logits[m0:m0 + BM, v0:v0 + BV] = grad.to(Logits.dtype)


#: The launch options the ops' kernels are not tuned over (``_plain``): a persistent or pingpong walk of the grid
#: would bypass the grouped tile order of ``_tile_origin``. Split-K (a cluster's programs share the K loop and sum
#: in registers before the epilogue, which program 0 alone runs: ``passes/split_k.py``) needs one K loop: ``gemm``
#: takes it except in its two-product form (``TWO``), from ``GEMM_SPLIT_TILES``. Warp specialization (a producer
#: warpgroup filling the TMA ring, sm_90a) from ``GEMM_WS_TILES`` and ``SWIGLU_WS_TILES``.


def _plain(configs, split: bool = False):
    """``configs`` without persistent, pingpong or stream-K launches, and without split-K unless ``split``."""
    return [c for c in configs if (split or c.split_k == 1) and not (c.persistent or c.pingpong or c.stream_k)]


#: (BM, BN, BK, num_warps, num_stages) of ``gemm``'s forms that write C (x @ W^T, dY @ W, dY^T @ X, and the
#: two-product dGate @ Wg + dUp @ Wu): the best plain (not warp-specialized, persistent or split) configs of the
#: fp16/bf16 matmul sweeps (``benchmarks/results/matmul_*.json``, ``benchmarks/history/results/matmul_sweep_*``;
#: B stored K x N there, the MN-major layout of dY @ W) and of ``configs_{ws,persistent}_h100.json``'s plain rows
#: (B N x K, the K-major layout of x @ W^T), NVIDIA H100 and H200:
#:
#: - 128x256x64 w8 s4: the plain winner of most large problems (M*N >= 2048^2; e.g. 4096x4096x11008 664 TFLOP/s,
#:   2048^3 576-621, 8192x8192x1024 536-538), and first of the plain rows of ``configs_ws_h100`` at 4096^3 (652);
#: - 256x128x64 w8 s4: the plain runner-up there, and the plain winner at 8192^3 in three sweeps (597-656);
#: - 128x128x64 w4 s3: the quick set's plain winner on the H200 (4096^3 573-580, 8192x8192x1024 453), and a
#:   middle-sized tile for the grids the 128x256 tiles leave short of SMs;
#: - 64x256x32 w8 s3: the ragged 1000x3000x777's winner in every sweep (70-90 TFLOP/s, cuBLAS 76);
#: - 64x128x64 w4 s3: the winner of the M = 1 and 16 shapes of the H200 sweep (``matmul_sweep_h200.json``, before
#:   the 16-row tiles), the 64-row tile for 17 <= M <= 64 (decode batches);
#: - 16x64x64 w4 s16, 16x64x128 w4 s10, 16x256x64 w4 s5 (``configs._THIN_TILES``, not split): the M = 1 and 16
#:   winners of the H100 sweeps (1x4096x4096 / 16x4096x4096; 16x8192x8192; 1 and 16 x 11008/28672 x K), within
#:   6% of cuBLAS; ``matmul_prune`` offers them only where M <= 16.
#:
#: After ``matmul_prune`` a problem tunes over 2 to 5 of them (4 where M*N >= 4096^2, 5 where M <= 16).
GEMM_TILES = [(128, 256, 64, 8, 4), (256, 128, 64, 8, 4), (128, 128, 64, 4, 3), (64, 256, 32, 8, 3),
              (64, 128, 64, 4, 3), (16, 64, 64, 4, 16), (16, 64, 128, 4, 10), (16, 256, 64, 4, 5)]

#: (BM, BN, BK, num_warps, num_stages, split_k) of ``gemm``'s one-loop forms where its output has fewer tiles than
#: the GPU has SMs and K is long (``matmul_prune`` offers split configs only there): a weight's gradient dW = dY^T @ X
#: of a 1024 x 1024 or 1536 x 1024 weight over 8192 tokens makes 64 to 96 tiles of 128 x 128 for 132 SMs. The
#: 128x128x64 w8 s4 tile cut in 2 or 4 is ``configs._SPLIT_K_TILES``' largest.
GEMM_SPLIT_TILES = [(128, 128, 64, 8, 4, 2), (128, 128, 64, 8, 4, 4)]

#: (BM, BN, BK, num_warps, num_stages) of ``gemm`` run warp-specialized (sm_90a; elsewhere ``matmul_prune`` drops
#: them). ``scripts/probes/gemm_ws_forms.py`` on an H200, every form correct (8192x1024x1024 and a ragged
#: 1000x904x520), TFLOP/s plain -> warp-specialized: 128x256 x @ W^T 502 -> 530, the other forms within 1%; 128x128
#: w8 428 -> 457 (x @ W^T), 412 -> 456 (dY @ W), 394 -> 455 (dY^T @ X), 472 -> 506 (two products).
GEMM_WS_TILES = [(128, 256, 64, 8, 4), (128, 128, 64, 8, 4)]

#: (BM, BN, BK, num_warps, num_stages) of the accumulating form (dW += dLogits^T @ h with a float32 dW): its
#: epilogue holds C's float32 tile in shared memory beside the ring, so the 128x256 / 256x128 tiles (128 KB of C)
#: do not fit. 128x128x64 w8 s4 (192 KB with C; its plain rows in ``configs_{ws,persistent}_h100``: 482-489 TFLOP/s
#: at 4096^3) for the large vocab x dim problems (on 4 warps it spills 248 bytes here, sm_90a: the C tile's
#: registers beside the accumulator), and the 64x256 / 64x128 / 128x64 tiles above for smaller ones. M is the
#: vocabulary or a weight's rows here, never a handful, so no 16-row tile.
ACCUMULATE_TILES = [(128, 128, 64, 8, 4), (64, 256, 32, 8, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3)]

#: (BM, BN, BK, num_warps, num_stages) of ``swiglu_fwd``: two float32 accumulators (at most 128 registers a
#: thread: 2 * BM * BN <= 128 * 32 * num_warps) and a ring of one x tile and two weight tiles. 128x128 on 8 warps
#: (the largest tile whose two accumulators fit: 128x256 / 256x128 would need 256 registers a thread), the 64x256
#: and 64x128 tiles of ``GEMM_TILES``, 128x64 and 64x64 for the grids of small F, and 16-row tiles for decode with
#: the deepest two-weight ring that fits the budget (11 and 5 stages: the rule ``configs._THIN_TILES`` measured for
#: one weight).
SWIGLU_TILES = [(128, 128, 64, 8, 4), (64, 256, 32, 8, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3),
                (64, 64, 64, 4, 4), (16, 64, 64, 4, 11), (16, 128, 64, 4, 5)]


def _configs(tiles, elem_bytes: int, warp_specialize: bool = False) -> list[Config]:
    """``tiles`` ((BM, BN, BK, warps, stages[, split_k])) as configs for operands of ``elem_bytes`` bytes (BK keeps
    the bytes of K a stage: float32 takes half the 16-bit BK, as ``matmul_configs`` does)."""
    return _plain([Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s,
                          split_k=split[0] if split else 1, warp_specialize=warp_specialize)
                   for bm, bn, bk, w, s, *split in tiles], split=True)


def gemm_configs(elem_bytes: int, accumulate: bool = False) -> list[Config]:
    """The configs one form of ``gemm`` tunes over: ``ACCUMULATE_TILES`` for C += ..., else ``GEMM_TILES``; both
    with ``GEMM_SPLIT_TILES`` (``_gemm_prune`` drops them for the two-product form) and ``GEMM_WS_TILES`` (the
    accumulating form: those that fit beside its C tile)."""
    specialized = [c for c in _configs(GEMM_WS_TILES, elem_bytes, warp_specialize=True)
                   if not accumulate or _fits_beside_c(c, elem_bytes, 4)]
    return _configs((ACCUMULATE_TILES if accumulate else GEMM_TILES) + GEMM_SPLIT_TILES, elem_bytes) + specialized


def _fits_beside_c(config: Config, elem_bytes: int, c_bytes: int, tiles: int = 1) -> bool:
    """Whether ``config``'s ring and ``tiles`` of C's tile (of ``c_bytes`` an element) fit ``SMEM_BUDGET_BYTES``
    together."""
    c_tile = config.kwargs["BM"] * config.kwargs["BN"] * c_bytes
    return matmul_shared_bytes(config, elem_bytes) + tiles * c_tile <= SMEM_BUDGET_BYTES


def _gemm_prune(configs, named_args, **kwargs):
    """``matmul_prune`` on the logical operands op(A) (M x K) and op(B) (K x N) (transposed views, no copies).
    Only ``_plain`` configs that fit shared memory as the compiler lays them out, so that none is cut to fewer
    stages (with a warning) at compile time:
    - the accumulating form also reads C's tile in its epilogue, held in shared memory beside the ring;
    - float32 (tf32) operands with A stored K x M (``TRANS_A``: dW = dY^T @ X) hold C's tile beside the ring too,
      and twice when accumulating: on sm_90a a 128x256x32 4-stage ring then needs 345,088 bytes (cut to one
      stage), a 128x128x32 4-stage accumulating one 295,936 (the compiled sizes ``test_linear_ops`` checks)."""
    a, b = named_args["A"], named_args["B"]
    logical = {"A": a.T if named_args.get("TRANS_A") else a, "B": b.T if named_args.get("TRANS_B") else b}
    configs = _plain(configs, split=not named_args.get("TWO"))
    elem = a.element_size()
    tiles = int(bool(named_args.get("ACC_IN"))) + int(elem == 4 and bool(named_args.get("TRANS_A")))
    if tiles:
        c_bytes = named_args["C"].element_size()
        configs = [c for c in configs if _fits_beside_c(c, elem, c_bytes, tiles)]
    return matmul_prune(configs, {**named_args, **logical}, **kwargs)


#: ``swiglu_fwd``'s 128x128 tile warp-specialized (sm_90a): the two accumulators then take 168 registers a
#: thread on its two math warpgroups, against 254 on eight plain warps; no spill either way.
SWIGLU_WS_TILES = [(128, 128, 64, 8, 4)]


def swiglu_configs(elem_bytes: int) -> list[Config]:
    """The configs ``swiglu_fwd`` tunes over (``SWIGLU_TILES``, ``SWIGLU_WS_TILES``)."""
    return _configs(SWIGLU_TILES, elem_bytes) + _configs(SWIGLU_WS_TILES, elem_bytes, warp_specialize=True)


def swiglu_ring_bytes(config: Config, elem_bytes: int) -> int:
    """Shared memory of the swiglu kernels' ring: a tile of x and one of each weight a stage."""
    k = config.kwargs
    return matmul_shared_bytes(config, elem_bytes) + config.num_stages * k["BK"] * k["BN"] * elem_bytes


#: (BM, BN, BK, num_warps, num_stages) of ``swiglu_bwd`` recomputing the products: its epilogue holds dOut and
#: both products too, so the accumulators get 64 registers a thread (at 128 they spill: 1.7 KB at 128x128 on 8
#: warps, sm_90a); the 16-row tile of ``SWIGLU_TILES`` for decode-sized batches.
_SWIGLU_RECOMPUTE_TILES = [(64, 64, 64, 4, 3), (64, 64, 64, 4, 4), (128, 64, 64, 8, 3), (128, 64, 64, 8, 4),
                           (64, 128, 64, 8, 3), (64, 128, 64, 8, 4), (16, 64, 64, 4, 11)]


def swiglu_recompute_configs(elem_bytes: int) -> list[Config]:
    """The configs ``swiglu_bwd`` with ``RECOMPUTE`` tunes over (``_SWIGLU_RECOMPUTE_TILES``)."""
    return _configs(_SWIGLU_RECOMPUTE_TILES, elem_bytes)


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
    return _tuned(gemm, gemm_configs(elem_bytes, accumulate), _GEMM_KEY, _gemm_prune,
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


def cross_entropy_config(vocab: int, max_block_v: int = CE_MAX_BLOCK_V, tile: int = CE_TILE) -> dict:
    """BM rows by BV columns of ``cross_entropy_rows`` and its warps: BV the row rounded up to a power of 2, at
    most ``max_block_v``; rows packed to about ``tile`` elements (at most 32) when a row fits one block, else one
    row a program; warps so that a thread holds 8 elements of a block (each keeps five block-sized float32 tiles
    live). Its reductions go through shared memory once per program, after the walk over the vocabulary."""
    block_v = min(max_block_v, 1 << max(4, (vocab - 1).bit_length()))
    rows = max(1, min(32, tile // block_v)) if vocab <= block_v else 1
    return dict(BM=rows, BV=block_v, num_warps=max(1, min(8, rows * block_v // (32 * 8))))


def cross_entropy_chunk(logits, targets, loss_rows, scale, ignore_index: int) -> None:
    """``cross_entropy_rows`` over every row of ``logits`` (gradient written in place)."""
    config = cross_entropy_config(logits.shape[1], max_block_v=64, tile=256) if knobs.interpret() else \
        cross_entropy_config(logits.shape[1])
    grid = (tilejit.cdiv(logits.shape[0], config["BM"]),)
    cross_entropy_rows[grid](logits, targets, loss_rows, scale, int(ignore_index), **config)
