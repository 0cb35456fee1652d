"""Block-scaled float8 matrix products (DeepSeek-V3's training and serving form, DeepGEMM's kernels' contract),
written in tilejit's language.

The operands are e4m3 with float32 scales: activations A (M, K) with one scale per 1x128 block
(``a_scales`` (M, cdiv(K, 128))), weights B given N x K with one scale per 128x128 block (``b_scales``
(cdiv(N, 128), cdiv(K, 128))). The product is ``C[m, n] = sum over k-blocks kb of a_scales[m, kb] *
b_scales[n // 128, kb] * sum_{k in kb} A[m, k] B[n, k]``, out in bfloat16.

Each program computes a BM x BN tile (BN divides 128, so the tile's columns share one weight scale per k-block, or
is 256, whose two column halves each take their own block's scale) and walks K in blocks of 128: ``T.gemm(..., scale_a=, scale_b=)`` sums each block's products fresh in the tensor
cores' accumulator, then adds them into the float32 accumulator scaled by the row's activation scale and the
tile's weight scale (one FMA per element: the promotion of the precise fp8 loop, with the scales applied at
it). The per-row scales are loaded by each thread for the rows it holds, no shared-memory broadcast. M, N and K
are ragged (the scales index with ceil); the scale tensors may have any strides.

Grouped (``fp8_blockscaled_grouped_matmul``, MoE): experts' problems in one launch. The rows of A are the
experts' tokens concatenated, expert ``e`` owning rows ``group_offsets[e]:group_offsets[e + 1]``; B is
(E, N, K) with scales (E, cdiv(N, 128), cdiv(K, 128)). The grid covers the most row tiles the experts can need
(``cdiv(M, BM) + E``: each expert's ragged tail adds at most one). A one-warp kernel first finds each row tile's
expert and rows from the offsets (``grouped_row_tiles``, a search over the experts per tile); the product's
programs read theirs with three independent scalar loads instead of each searching, in its producer and its math
warps alike, two dependent loads an expert (8 experts on an H200: the same TFLOP/s either way, within the
runs' spread; the search grows with the expert count, the loads do not). Programs past the last tile run no
k-steps and store nothing. No host sync: the offsets are read on the GPU, and CUDA graphs capture both launches.

``fp8_blockscaled_matmul`` / ``fp8_blockscaled_grouped_matmul`` run as the PyTorch operators
``tilejit::fp8_blockscaled_mm`` / ``tilejit::fp8_blockscaled_grouped_mm``; ``reference`` /
``grouped_reference`` are the float64 dequantized products the tests check against.
"""
from __future__ import annotations

import torch

import tilejit
import tilejit.language as T
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, decode_config, encode_config, namespace, sm_count
from tilejit.ops.linear_kernels import grouped_tile_order

#: Elements of K (and of N, for the weights) that one scale covers.
BLOCK = 128


@tilejit.kernel
def blockscaled_mm(A, SA, B, SB, C, BM: T.constexpr, BN: T.constexpr, STAGES: T.constexpr,
                   GROUP_M: T.constexpr = 8):
    """C = (A @ B^T) with A's 1x128 and B's 128x128 block scales applied per k-block; one BM x BN tile of a 1-D
    grid of cdiv(M, BM) x cdiv(N, BN) programs, in ``grouped_tile_order``."""
    M, K = A.shape
    # (tile counts as int32, as T.program_id is: the tile's origin and every address derived from it stay 32-bit)
    row, col = grouped_tile_order(T.cdiv(M, BM).to(T.int32), T.cdiv(C.shape[1], BN).to(T.int32), GROUP_M)
    m0 = row * BM
    n0 = col * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, 128, stages=STAGES):
        kb = k0 // 128
        if BN > 128:  # two weight blocks across the tile: each column takes its own block's scale
            acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                         scale_a=SA[m0:m0 + BM, kb],
                         scale_b=T.where(T.arange(0, BN) < 128, SB[n0 // 128, kb], SB[n0 // 128 + 1, kb]))
        else:
            acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                         scale_a=SA[m0:m0 + BM, kb], scale_b=SB[n0 // 128, kb])
    C[m0:m0 + BM, n0:n0 + BN] = acc


@tilejit.kernel
def grouped_row_tiles(Offsets, Tiles, E, BM: T.constexpr):
    """Row tile t (program t) of the grouped product, the experts' rows Offsets[e]:Offsets[e + 1] cut into BM-row
    tiles in expert order: Tiles[t] = (expert, first row, end of the expert's rows); (0, 0, 0) past the last
    tile (its programs store nothing)."""
    tile = T.program_id(0)
    expert = 0
    m0 = 0
    rows_end = 0
    first = 0  # row tiles of the experts before e
    for e in range(E):
        lo = Offsets[e]
        hi = Offsets[e + 1]
        tiles = (hi - lo + BM - 1) // BM
        if tile >= first and tile < first + tiles:
            expert = e
            m0 = lo + (tile - first) * BM
            rows_end = hi
        first = first + tiles
    Tiles[tile, 0] = expert
    Tiles[tile, 1] = m0
    Tiles[tile, 2] = rows_end


@tilejit.kernel
def blockscaled_grouped_mm(A, SA, B, SB, C, Tiles, BM: T.constexpr, BN: T.constexpr, STAGES: T.constexpr,
                           GROUP_M: T.constexpr = 8):
    """Expert e's rows of C = their rows of A times B[e]^T, block-scaled; a 1-D grid of Tiles.shape[0] x
    cdiv(N, BN) programs, each computing row tile t (its expert and rows read from ``Tiles``, as
    ``grouped_row_tiles`` finds them) and column tile j, (t, j) in ``grouped_tile_order``."""
    K = A.shape[1]
    tile, col = grouped_tile_order(Tiles.shape[0].to(T.int32), T.cdiv(C.shape[1], BN).to(T.int32), GROUP_M)
    n0 = col * BN
    expert = Tiles[tile, 0]
    m0 = Tiles[tile, 1]
    rows_end = Tiles[tile, 2]  # 0 for a program past the last tile: it stores nothing
    k_end = K if rows_end > 0 else 0
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, k_end, 128, stages=STAGES):
        kb = k0 // 128
        # rows past the expert's end are the next expert's (or past A: 0); their results are not stored
        if BN > 128:  # two weight blocks across the tile: each column takes its own block's scale
            acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[expert, n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                         scale_a=SA[m0:m0 + BM, kb], scale_b=T.where(T.arange(0, BN) < 128, SB[expert, n0 // 128, kb],
                                                                     SB[expert, n0 // 128 + 1, kb]))
        else:
            acc = T.gemm(A[m0:m0 + BM, k0:k0 + 128], B[expert, n0:n0 + BN, k0:k0 + 128], acc, transpose_b=True,
                         scale_a=SA[m0:m0 + BM, kb], scale_b=SB[expert, n0 // 128, kb])
    Cv = T.bounded(C, (rows_end, C.shape[1]))
    Cv[m0:m0 + BM, n0:n0 + BN] = acc


#: How much faster a 128x256 tile computes than a 128x128 one, per FLOP, where both fill their last wave (H200,
#: graph-timed, both persistent: 1.09-1.15x at 4096x4096x7168, 4096x7168x2048, 8192x7168x2048 and
#: 8192x4096x7168; ``scripts/probes/blockscaled_configs.py --widths``).
WIDE_TILE_SPEEDUP = 1.15


def default_config(m: int, n: int, arch_major: int = 9, k: int | None = None, sms: int = 132) -> dict:
    """Tile and launch options for an (m, n) output over ``k`` (None: not known) on a GPU of compute capability
    ``arch_major`` with ``sms`` multiprocessors. On Hopper (graph-timed on an H100 and an H200,
    ``scripts/probes/blockscaled_configs.py``):

    * 128-row tiles in a persistent warp-specialized kernel (the producer loads the next tile's operands during
      this one's epilogue; the grouped kernel too):
      885-909 TFLOP/s at 4096x4096x7168 on an H100 against 794-836 specialized alone. 256 columns where that
      takes less time than 128 by a count of waves (the tiles the busiest SM computes, times each one's work,
      the wider tile ``WIDE_TILE_SPEEDUP`` faster): 4096x4096x7168 (4 waves of 128x256 against 8 of 128x128;
      1,009 TFLOP/s against 922 on an H200), not 4096x2112x7168 (3 waves of 256 columns against 5 of 128:
      2112 is 8.25 wide tiles but 16.5 narrow ones; 784 against 827). The grouped kernel keeps 128 columns
      (256 measured 0.74-0.85x on every grouped shape);
    * where 128x128 leaves most of the 132 SMs idle (small M: decode and small batches), 64-row tiles of 4 warps:
      64x128 specialized while that still makes 100 tiles (128x7168x2048: 416 TFLOP/s on an H200), or 128x64
      tiles of 8 warps where those take fewer waves (512x2112x7168: 132 of them in one wave against 136 of
      64x128 in two; 730 TFLOP/s against 394, torch 651, H200); below that, a
      K of 32 blocks or more is split over 2 programs of a cluster (``split_k``), with 128 columns while that
      makes 100 programs (128x4096x7168: 459 against 347 for unsplit 64x64 tiles) and 64 otherwise (128x2112x7168, 6 stages: 307
      against 174); a short K keeps unsplit 64x64 tiles.

    On compute capability 8.x (mma.sync or FMAs): 64 columns and 3 stages, no split (no clusters)."""
    def tiles(bm: int, bn: int) -> int:
        return tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn)

    config = dict(BM=128, BN=128, STAGES=4, num_warps=8)
    if tiles(128, 128) < 100:
        config.update(BM=64, num_warps=4)
        long_k = k is not None and tilejit.cdiv(k, BLOCK) >= 32 and arch_major >= 9
        if tiles(64, 128) >= 100:
            if arch_major == 9:
                config["warp_specialize"] = True
                if _waves(tiles(128, 64), sms) < _waves(tiles(64, 128), sms):
                    config.update(BM=128, BN=64, num_warps=8)
        elif long_k:
            config["split_k"] = 2
            if 2 * tiles(64, 128) < 100:
                config.update(BN=64, STAGES=6)
        else:
            config["BN"] = 64
    elif arch_major == 9:
        config["persistent"] = True
        if _waves(tiles(128, 256), sms) * 256 < _waves(tiles(128, 128), sms) * 128 * WIDE_TILE_SPEEDUP:
            config["BN"] = 256
    if arch_major == 8:  # 128x128 spilled 608 bytes a thread on sm_80; sm_86 / sm_89 allow 99 KiB of shared memory
        config.update(BN=64, STAGES=3)
    return config


def grouped_config(m: int, n: int, experts: int, arch_major: int = 9, sms: int = 132) -> dict:
    """Tile and launch options of the grouped product of ``m`` rows over ``experts`` experts' (n, k) weights:
    ``default_config``'s for the whole output, at most 128 columns (256 ran 0.74-0.85x of 128 on every grouped
    shape measured, H200)."""
    config = default_config(m, n * experts, arch_major, sms=sms)
    config["BN"] = min(config["BN"], BLOCK)
    return config


def _waves(tiles: int, sms: int) -> int:
    """Tiles the busiest SM computes when ``tiles`` are dealt round-robin to ``sms`` SMs."""
    return -(-tiles // sms)


#: What the products can be written as (``out_dtype``, and ``out``'s dtype).
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(a, a_scales, b, b_scales, grouped: bool) -> None:
    """Types, shapes, dtypes and devices of a block-scaled product's operands, or a typed error naming the one to
    fix (ArgumentError for a non-tensor, ArgumentValueError, a ValueError, for the rest)."""
    what = "fp8_blockscaled_grouped_matmul" if grouped else "fp8_blockscaled_matmul"
    bad = arg_checks.ArgumentValueError
    arg_checks.tensors(what, a=a, a_scales=a_scales, b=b, b_scales=b_scales)
    arg_checks.same_device(what, a=a, a_scales=a_scales, b=b, b_scales=b_scales)
    if a.dim() != 2 or b.dim() != (3 if grouped else 2):
        raise bad(f"{what}: a must be 2-D (M, K) and b {'3-D (E, N, K)' if grouped else '2-D (N, K)'}, got "
                  f"a {tuple(a.shape)}, b {tuple(b.shape)}")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise bad(f"{what}: {name} must be float8 (e4m3fn or e5m2), got {t.dtype}")
    m, k = a.shape
    n = b.shape[-2]
    if b.shape[-1] != k:
        raise bad(f"{what}: a is {m}x{k} but b's rows have {b.shape[-1]} elements; b is given N x K")
    kb = tilejit.cdiv(k, BLOCK)
    want_a = (m, kb)
    want_b = (*b.shape[:-2], tilejit.cdiv(n, BLOCK), kb)
    for name, t, want, block in (("a_scales", a_scales, want_a, "1x128"), ("b_scales", b_scales, want_b, "128x128")):
        if tuple(t.shape) != want or t.dtype != torch.float32:
            raise bad(f"{what}: {name} must be float32 of shape {want} (one scale per {block} block, ceil of the "
                      f"ragged edges), got {t.dtype} {tuple(t.shape)}")


def _check_call(out, out_dtype, a: torch.Tensor, shape: tuple[int, int], config: dict, what: str,
                launches: bool) -> list[int]:
    """``out_dtype`` one of ``OUT_DTYPES``; ``out`` None or a tensor of ``shape`` and one of them on a's device;
    ``config``'s keys and BN; then a's device, where the kernels run (``launches``: whether they do). Returns the
    config encoded for the operator."""
    arg_checks.out_dtype(what, out_dtype, OUT_DTYPES)
    if out is not None:
        arg_checks.like(what, "out", out, shape, OUT_DTYPES, a.device)
    encoded = encode_config(config, what)
    if "BN" in config:
        _check_bn(config["BN"], what)
    arg_checks.runs_on(what, "a", a, launches)
    return encoded


def _device(t: torch.Tensor) -> tuple[int, int]:
    """(compute capability major, multiprocessors) of ``t``'s GPU; an H100's for a tensor elsewhere."""
    if not t.is_cuda:
        return 9, 132
    return torch.cuda.get_device_capability(t.device)[0], sm_count(t.device)


def _check_bn(bn: int, what: str) -> None:
    if BLOCK % bn and bn != 2 * BLOCK:
        raise arg_checks.ArgumentValueError(f"{what}: BN must divide {BLOCK} (a tile's columns share one weight scale "
                                            f"per k-block) or be {2 * BLOCK} (two column halves, a scale each), got "
                                            f"{bn}")


def _dense(a, a_scales, b, b_scales, out, config: dict) -> torch.Tensor:
    m, n = a.shape[0], b.shape[0]
    if out.numel() == 0 or a.shape[1] == 0:  # no rows or columns; or K = 0, a sum of nothing (as torch.mm)
        return out.zero_()
    major, sms = _device(a)
    cfg = {**default_config(m, n, major, a.shape[1], sms), **config}
    _check_bn(cfg["BN"], "fp8_blockscaled_matmul")
    blockscaled_mm[(tilejit.cdiv(m, cfg["BM"]) * tilejit.cdiv(n, cfg["BN"]),)](a, a_scales, b, b_scales, out, **cfg)
    return out


def _grouped(a, a_scales, b, b_scales, group_offsets, out, config: dict) -> torch.Tensor:
    m, experts, n = a.shape[0], b.shape[0], b.shape[1]
    if out.numel() == 0:  # no rows or no columns
        return out
    cfg = {**grouped_config(m, n, experts, *_device(a)), **config}
    _check_bn(cfg["BN"], "fp8_blockscaled_grouped_matmul")
    row_tiles = tilejit.cdiv(m, cfg["BM"]) + experts  # (each expert's ragged tail adds at most one)
    tiles = torch.empty((row_tiles, 3), dtype=torch.int32, device=a.device)
    grouped_row_tiles[(row_tiles,)](group_offsets, tiles, experts, BM=cfg["BM"], num_warps=1)
    blockscaled_grouped_mm[(row_tiles * tilejit.cdiv(n, cfg["BN"]),)](a, a_scales, b, b_scales, out, tiles, **cfg)
    return out


def fp8_blockscaled_matmul(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                           out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
                           **config) -> torch.Tensor:
    """(a @ b^T) with block scales: a (M, K) float8 with ``a_scales`` float32 (M, cdiv(K, 128)) (1x128 blocks),
    b (N, K) float8 with ``b_scales`` float32 (cdiv(N, 128), cdiv(K, 128)) (128x128 blocks); (M, N) of
    ``out_dtype`` (or written into ``out``, (M, N)), bfloat16, float16 or float32, on a's device. ``config`` (BM,
    BN (dividing 128), STAGES, launch options) overrides ``default_config``. M, N or K of 0: no launch (K = 0
    gives zeros)."""
    _check(a, a_scales, b, b_scales, grouped=False)
    config = _check_call(out, out_dtype, a, (a.shape[0], b.shape[0]), config, "fp8_blockscaled_matmul",
                         a.numel() > 0 and b.shape[0] > 0)
    if out is None:
        return _OPS.dense(a, a_scales, b, b_scales, out_dtype, config)
    _OPS.dense_into(a, a_scales, b, b_scales, out, config)
    return out


def fp8_blockscaled_grouped_matmul(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                                   group_offsets: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                                   out: torch.Tensor | None = None, **config) -> torch.Tensor:
    """Every expert's block-scaled product in one launch: rows ``group_offsets[e]:group_offsets[e + 1]`` of a
    (M, K) times b[e]^T (b (E, N, K), ``b_scales`` (E, cdiv(N, 128), cdiv(K, 128))); ``group_offsets`` int32
    (E + 1,), nondecreasing from 0 to at most M, on a's device (never read on the host). Rows outside every
    expert's range are not written (uninitialized unless ``out``, (M, N), is given). ``out_dtype`` and ``out``:
    bfloat16, float16 or float32."""
    what = "fp8_blockscaled_grouped_matmul"
    _check(a, a_scales, b, b_scales, grouped=True)
    arg_checks.tensors(what, group_offsets=group_offsets)
    if group_offsets.dtype != torch.int32 or tuple(group_offsets.shape) != (b.shape[0] + 1,):
        raise arg_checks.ArgumentValueError(f"{what}: group_offsets must be int32 of shape ({b.shape[0] + 1},) (E + "
                                            f"1 row offsets into a), got {group_offsets.dtype} "
                                            f"{tuple(group_offsets.shape)}")
    arg_checks.same_device(what, a=a, group_offsets=group_offsets)
    config = _check_call(out, out_dtype, a, (a.shape[0], b.shape[1]), config, what, a.shape[0] > 0 and b.shape[1] > 0)
    if out is None:
        return _OPS.grouped(a, a_scales, b, b_scales, group_offsets, out_dtype, config)
    _OPS.grouped_into(a, a_scales, b, b_scales, group_offsets, out, config)
    return out


def reference(a, a_scales, b, b_scales) -> torch.Tensor:
    """The float64 product of the dequantized operands (each scale broadcast over its block)."""
    def dequantize(t, scales, rows_per_scale):
        s = scales.double().repeat_interleave(rows_per_scale, 0)[:t.shape[0]]
        return t.double() * s.repeat_interleave(BLOCK, 1)[:, :t.shape[1]]
    return dequantize(a, a_scales, 1) @ dequantize(b, b_scales, BLOCK).T


def grouped_reference(a, a_scales, b, b_scales, group_offsets) -> torch.Tensor:
    """float64 (M, N): each expert's rows by ``reference``; rows outside every expert's range are NaN."""
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.float64, device=a.device)
    offsets = group_offsets.tolist()
    for e in range(b.shape[0]):
        lo, hi = offsets[e], offsets[e + 1]
        out[lo:hi] = reference(a[lo:hi], a_scales[lo:hi], b[e], b_scales[e])
    return out


def _dense_op(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
              out_dtype: torch.dtype, config: list[int]) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[0], dtype=out_dtype, device=a.device)
    return _dense(a, a_scales, b, b_scales, out, decode_config(config))


def _grouped_op(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                group_offsets: torch.Tensor, out_dtype: torch.dtype, config: list[int]) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    return _grouped(a, a_scales, b, b_scales, group_offsets, out, decode_config(config))


def _dense_out_op(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                  out: torch.Tensor, config: list[int]) -> None:
    _dense(a, a_scales, b, b_scales, out, decode_config(config))


def _grouped_out_op(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                    group_offsets: torch.Tensor, out: torch.Tensor, config: list[int]) -> None:
    _grouped(a, a_scales, b, b_scales, group_offsets, out, decode_config(config))


class _Operators:
    """The PyTorch operators of this module, in ``namespace``: ``fp8_blockscaled_mm`` and
    ``fp8_blockscaled_grouped_mm`` (functional, not differentiable), and their ``_out`` forms (writing ``out``)."""

    def __init__(self, namespace: str):
        self.dense = Operator(f"{namespace}::fp8_blockscaled_mm", _dense_op, fake=lambda a, sa, b, sb, out_dtype,
                              config: a.new_empty(a.shape[0], b.shape[0], dtype=out_dtype))
        self.grouped = Operator(f"{namespace}::fp8_blockscaled_grouped_mm", _grouped_op,
                                fake=lambda a, sa, b, sb, offsets, out_dtype, config:
                                a.new_empty(a.shape[0], b.shape[1], dtype=out_dtype))
        self.dense_into = Operator(f"{namespace}::fp8_blockscaled_mm_out", _dense_out_op, mutates_args=("out",))
        self.grouped_into = Operator(f"{namespace}::fp8_blockscaled_grouped_mm_out", _grouped_out_op,
                                     mutates_args=("out",))


_OPS = _Operators(namespace(__name__, "tilejit.ops.fp8_blockscaled"))
