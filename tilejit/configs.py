"""Default autotuning spaces for common kernels (the README's matmul, examples/matmul.py).

``matmul_configs()`` is a small hand-picked set: BM=64 tiles for skinny problems (LLM decode shapes), 128x128
for the middle, 128x256 / 256x128 on 8 warps for large squares. BK=64 tiles with 4 or 8 warps are the ones
the sm_90a wgmma lowering takes (BK=32 ones run on mma.sync everywhere); split-K variants (``split_k=2/4``,
sm_90+) serve problems with fewer output tiles than SMs; warp-specialized variants of the wgmma tiles
(``warp_specialize=True``, sm_90a) take most large problems. Every config's multi-buffered operand tiles fit the
shared-memory budget below. ``matmul_prune`` is an ``early_config_prune`` that drops tiles much
larger than the problem before anything is compiled.

    @tilejit.autotune(configs=matmul_configs(), key=["A", "B"],
                      prune_configs_by={"early_config_prune": matmul_prune})
    @tilejit.kernel
    def matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr): ...
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

from .autotuner import Config
from .errors import UsageValueError
from .target import Arch

__all__ = ["SMEM_BUDGET_BYTES", "cluster_sm_count", "is_sm90", "matmul_configs", "matmul_prune",
           "matmul_shared_bytes", "shared_memory_per_block"]

# H100/H200 allow 227 KB of dynamic shared memory per block; stay under 200 KB to leave room for scratch
# (layout conversions, reductions) that a fused epilogue may add.
SMEM_BUDGET_BYTES = 200 * 1024

# (BM, BN, BK, num_warps, num_stages). 8 warps wherever the f32 accumulator would exceed 128 registers per
# thread on 4 warps (BM * BN / (32 * num_warps) floats each).
_MATMUL_TILES = [
    (64, 64, 32, 4, 3), (64, 64, 64, 4, 4),
    (64, 128, 32, 4, 4), (64, 128, 64, 4, 3),
    (64, 256, 32, 8, 3),
    (128, 64, 32, 4, 4), (128, 64, 64, 4, 3),
    (128, 128, 32, 4, 4), (128, 128, 64, 4, 3),
    (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
    (256, 128, 32, 8, 3), (256, 128, 64, 8, 3), (256, 128, 64, 8, 4),
]

# (BM, BN, BK, num_warps, num_stages, split_k; split_k 1 = not split): 16-row tiles for decode-like problems (M <= 16,
# ``matmul_prune`` keeps them only there). Under 64 rows the gemm runs on mma.sync (wgmma's smallest M is 64), which is
# no limit where the time is streaming B; the point is the ring: a 64-row tile spends a third to a half of each stage on
# A's mostly out-of-bounds rows, a 16-row tile 6-20%, so the same shared memory keeps up to 1.9x more of B in flight, in
# rings of 10 to 16 stages. Measured (benchmarks/configs.py, NVIDIA H200, 2026-11-26, cuBLAS in the same run;
# benchmarks/history/results/configs_thin_tiles_h200.log), against the 64x64x64 s8 tile in the same mode and cuBLAS:
# 1x4096x4096 17.8 us (16x64x128 s8) against 27.6 and 18.5; 1x8192x28672 122.6 (16x64x64 s12) against 197.3 and 118.6;
# 16x4096x11008 34.9 (16x64x128 s8 split-K 2) against 40.5 and 36.2. The rings here are the deepest that fit the budget.
_THIN_TILES = [
    (16, 64, 128, 4, 10, 1), (16, 64, 64, 4, 16, 1), (16, 128, 128, 4, 5, 1), (16, 256, 64, 4, 5, 1),
    (16, 64, 128, 4, 10, 2), (16, 64, 64, 4, 16, 2), (16, 128, 128, 4, 5, 2), (16, 256, 64, 4, 5, 4),
]

# (BM, BN, BK, num_warps, num_stages, split_k): the K loop of each output tile cut over a cluster of split_k
# programs (sm_90+, ``passes/split_k.py``), for problems with fewer output tiles than SMs (M <= 128 LLM shapes,
# small squares). ``matmul_prune`` keeps them only there. The 8-stage 64x128 one: 1x4096x4096 1.7 TFLOP/s against
# 1.6 for 4 stages (NVIDIA H200, 2026-11-26).
_SPLIT_K_TILES = [
    (64, 64, 64, 4, 4, 2), (64, 64, 64, 4, 4, 4), (64, 64, 64, 4, 8, 2), (64, 64, 64, 4, 8, 4),
    (64, 128, 64, 4, 4, 2), (64, 128, 64, 4, 4, 4), (64, 128, 64, 4, 8, 2),
    (128, 64, 64, 4, 4, 2), (128, 64, 64, 4, 4, 4),
    (128, 128, 64, 8, 4, 2), (128, 128, 64, 8, 4, 4),
]


# (BM, BN, BK, num_warps, num_stages) run with ``warp_specialize=True`` (sm_90a: a producer warpgroup fills the TMA
# ring). Measured on an H100 against the same tiles without it (benchmarks/configs.py, RESULTS.md): 128x128 +10-20%,
# 256x128 +1-11%, 128x256 3 stages +2-7%, 128x256 4 stages within +-1.5% (so both stay). ``matmul_prune`` keeps
# them on sm_90 GPUs only (elsewhere the option means nothing and they would repeat the plain configs).
#
# The deep 64x64 rings (8 and 12 stages, 128 and 192 KB) keep many loads in flight per SM where there are few tiles and
# long K: measured on an H100 (benchmarks/configs.py, 2026-11-26, each config's first timing over its own grid:
# benchmarks/history/investigations.md) against cuBLAS in the same run, 128x4096x4096 188 vs 187 TFLOP/s (12 stages;
# 160-166 for the 4-stage 64x128 / 128x64 tiles), 128x4096x11008 243 vs 248 (231-234).
#
# Deeper rings for the 64x128 / 128x64 (8 stages) and 128x128 (6 stages) tiles, 192 KB each, where the problem is short
# in K or streams one operand from memory: more bytes in flight per SM (benchmarks/configs.py, NVIDIA H200, 2026-11-26,
# cuBLAS in the same run; benchmarks/history/results/configs_deep_rings_h200.log): 1024^3 64x128 226.0 TFLOP/s
# persistent (195.1 with 4 stages; cuBLAS 224.4), 128x11008x4096 128x128 325.6 (284.0; 329.1), 16x11008x4096 64x128 41.9
# (31.4 on an H100 with 4 stages; 42.4), 128x4096x4096 128x64 194.8. ``matmul_prune`` drops them (and every ring deeper
# than 4) on large problems.
#
# A 64x64 tile with 128-element K steps (4 stages, 128 KB) for small squares: fewer, larger TMA copies in flight per
# program where every program loads its whole K at once: 512^3 38.8 TFLOP/s against 37.3 for 64x64x64 s8 and
# cuBLAS 39.0 (NVIDIA H100 80GB HBM3, 2026-11-26, benchmarks/history/results/configs_n192_tile_and_512_square_h100.log).
_WARP_SPECIALIZED_TILES = [
    (64, 64, 64, 4, 8), (64, 64, 64, 4, 12), (64, 64, 128, 4, 4),
    (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 8), (128, 64, 64, 4, 8),
    (128, 128, 64, 4, 4), (128, 128, 64, 4, 6), (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 3), (256, 128, 64, 8, 4),
]


# (BM, BN, BK, num_warps, num_stages) run with ``persistent=True`` (one program per SM walking the grid, the producer
# loading the next program's tiles during this one's epilogue). Measured on an H100 (benchmarks/configs.py,
# RESULTS.md): 128x128 tiles gain 5-8% over warp specialization alone (4096^3 602 vs 565 TFLOP/s, 8192x8192x1024
# 505 vs 468). Since the TMA store stages through 128-byte panels (2779cae) the 128x256 / 256x128 tiles keep their
# 4-deep ring too: 256x128 persistent 679 against 618 plain / 626 warp-specialized at 4096^3, 128x256 on par
# (648 / 642 / 650); before, they lost 10-15% and were not offered.
# The deep-ring tiles of ``_WARP_SPECIALIZED_TILES`` persistent too (the deeper rings above): there the producer
# fills the next tile's ring during this one's epilogue, which matters where K is short (1024^3: 226.0 persistent
# against 211.7 warp-specialized for 64x128 s8) and costs nothing where tiles are fewer than SMs.
#
# 64x192 (6 stages, 192 KB) gives 128 x 11008 problems 116 programs on 132 SMs where 128x128 gives 86 and 64x128
# 172 (cuBLAS's pick there has 96 columns and 115 programs): 254.2 TFLOP/s against 245.9 for 128x128 s6
# persistent and cuBLAS 256.4 (NVIDIA H100 80GB HBM3, benchmarks/configs.py, 2026-11-26).
_PERSISTENT_TILES = [(128, 128, 64, 8, 4), (256, 128, 64, 8, 4), (128, 256, 64, 8, 4),
                     (64, 128, 64, 4, 8), (128, 64, 64, 4, 8), (128, 128, 64, 4, 6), (64, 64, 64, 4, 12),
                     (64, 192, 64, 4, 6)]

# (BM, BN, BK, num_warps, num_stages) run with ``pingpong=True`` (persistent, two groups of num_warps math warps
# taking the walk's programs in turn, one group's epilogue under the other's main loop). Measured on an H100
# (benchmarks/configs.py, RESULTS.md): where the epilogue weighs, they lead, e.g. 8192x8192x1024 598 (128x128) and
# 605 (64x256) TFLOP/s against 560 / 569 persistent and 596 for the best persistent tile (256x128 w8); at 4096^3
# 128x128 pingpong is on par with persistent 128x128 (631-634 vs 614-636) and behind 256x128 w8 persistent (709).
# Groups of 8 warps do not fit: 640 threads leave 96 registers a thread, under a 128x128 accumulator's need.
_PINGPONG_TILES = [(128, 128, 64, 4, 4), (64, 256, 64, 4, 4)]

# (BM, BN, BK, num_warps, num_stages) run with ``stream_k=True`` (persistent, the last wave's tiles cut into equal
# runs of K iterations over every SM; passes/split_k.stream_k). Measured on an H200 against the same tiles
# persistent (benchmarks/configs.py, RESULTS.md): with fewer tiles than SMs they gain, e.g. 128x4096x11008 261 vs
# 170 TFLOP/s (128x128), 16x4096x4096 23.5 vs 18.3 (64x128); on large problems they lose (4096^3 128x256 623 vs
# 696: runs at different K offsets share less of A and B in L2, and each cut tile costs a workspace round trip),
# so ``matmul_prune`` keeps them for few tiles only.
#
# Not in the default space (``matmul_configs(stream_k=True)`` adds them): in the fp16 sweeps of 2026-11-26 (NVIDIA H100
# 80GB HBM3, benchmarks/history/results/matmul_sweep_fp16_rotating_rounds_h100.json) the tuner never picked one, the
# deep 64x64 rings won every few-tile shape, so they only cost tuning time. (They had left the space while a stream-K
# launch intermittently left tiles unwritten; the cause was the workspace's zero fill on a stream other than the
# launch's, fixed in runtime/launch.py.)
_STREAM_K_TILES = [(64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 4, 4)]


def matmul_shared_bytes(config: Config, elem_bytes: int = 2, scratch_bytes: int = 0) -> int:
    """Shared memory of the pipelined A and B tiles: stages * (BM*BK + BK*BN) * element size, plus scratch."""
    k = config.kwargs
    return config.num_stages * (k["BM"] * k["BK"] + k["BK"] * k["BN"]) * elem_bytes + scratch_bytes


def matmul_configs(smem_budget: int = SMEM_BUDGET_BYTES, elem_bytes: int = 2, stream_k: bool = False) -> list[Config]:
    """The default matmul search space for operands of ``elem_bytes`` bytes, limited to configs that fit
    ``smem_budget``; ``stream_k``: with the stream-K tiles too (not by default: see ``_STREAM_K_TILES``).

    The tiles are those of 16-bit operands with BK scaled to keep the bytes of K per stage: 8-bit operands (fp8,
    int8) take BK = 64 and 128 (128 bytes of K is one wgmma panel), float32 (tf32) takes BK = 16 and 32.
    """
    if elem_bytes not in (1, 2, 4):
        raise ValueError(f"elem_bytes must be 1, 2 or 4, got {elem_bytes}")
    configs = [Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s)
               for bm, bn, bk, w, s in _MATMUL_TILES]
    configs += [Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s, split_k=sk)
                for bm, bn, bk, w, s, sk in _SPLIT_K_TILES + _THIN_TILES]
    configs += [Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s,
                       warp_specialize=True) for bm, bn, bk, w, s in _WARP_SPECIALIZED_TILES]
    configs += [Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s,
                       persistent=True) for bm, bn, bk, w, s in _PERSISTENT_TILES]
    configs += [Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s,
                       pingpong=True) for bm, bn, bk, w, s in _PINGPONG_TILES]
    configs += [Config({"BM": bm, "BN": bn, "BK": bk * 2 // elem_bytes}, num_warps=w, num_stages=s,
                       stream_k=True) for bm, bn, bk, w, s in (_STREAM_K_TILES if stream_k else ())]
    return [c for c in configs if matmul_shared_bytes(c, elem_bytes) <= smem_budget]


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def matmul_problem(named_args: dict[str, Any]) -> tuple[int, int, int]:
    """(M, N, K) of a call ``matmul(A, B, C, ...)`` with A of shape M x K and B of shape K x N."""
    a, b = named_args["A"], named_args["B"]
    return int(a.shape[0]), int(b.shape[1]), int(a.shape[1])


def matmul_prune(configs: Sequence[Config], named_args: dict[str, Any], **kwargs: Any) -> list[Config]:
    """Drop configs that would waste most of their tile or their tuning time on this problem.

    - a tile larger than the power-of-2 rounded extent of M, N or K computes mostly zeros: keep
      ``BM <= max(64, next_pow2(M))`` and likewise for N and K (BK against 32);
    - a tile under 64 rows (``_THIN_TILES``) serves only problems of at most that many rows (M <= BM): on more
      rows it would re-read B once per 16 rows;
    - on large problems (M * N >= 4096^2, where a 128x128 grid already fills every SM many times) small tiles
      and deep rings (more than 4 stages, for few tiles or short K) only cost tuning time, or worse: drop tiles
      below 128x128 and rings deeper than 4 (the 6-stage 128x128 tile won a noisy 4096^3 tuning on an H100 and
      then ran at 610 TFLOP/s against 652 for the 128x256 one of the run before);
    - split-K configs run only on GPUs with thread-block clusters (sm_90+), and only where the plain grid leaves
      SMs idle: fewer output tiles than SMs, at most two programs per SM once split, and at least 4 K steps per
      program;
    - stream-K configs likewise, and only with at most half as many output tiles as SMs (each tile cut over two
      programs or more) and at least 8 K steps per program;
    - warp-specialized, persistent, pingpong and stream-K configs run only on sm_90 GPUs (the only arch where
      those options change the kernel);
    - a config whose ring (``matmul_shared_bytes``) exceeds the GPU's shared memory per block
      (``shared_memory_per_block``) is dropped: the compiler would run it with fewer stages than it names (e.g. the 192 KB rings on an A100's 163 KB), a
      duplicate of another config under a wrong name;
    - fp8 products at precision "precise" (``PRECISION`` absent or not "fast") drop the configs
      ``promotion_fits`` refuses, and so do 8-bit products with B stored K x N (N contiguous: sm_90a gathers it
      into registers, ``backend_cuda/lower_wgmma_mn8.py``, which leaves such pingpong groups no room either).
    Never returns an empty list: if nothing survives, the config with the smallest tile (not split) is kept.
    """
    m, n, k = matmul_problem(named_args)
    sms = cluster_sm_count(named_args["A"])
    hopper = is_sm90(named_args["A"])
    smem = shared_memory_per_block(named_args["A"])
    elem = named_args["A"].element_size()
    promoted = (elem == 1 and named_args["A"].dtype.is_floating_point
                and named_args.get("PRECISION", "precise") != "fast")
    b = named_args["B"]
    gathered = elem == 1 and b.dim() == 2 and b.stride(1) == 1 and b.shape[1] > 1  # B stored K x N

    def fits(c: Config) -> bool:
        bm, bn, bk = c.kwargs["BM"], c.kwargs["BN"], c.kwargs["BK"]
        if _hopper_only(c) and not hopper:
            return False
        if smem and matmul_shared_bytes(c, elem) > smem:
            return False
        if (promoted or gathered) and not promotion_fits(c):
            return False
        if bm > max(64, _next_pow2(m)) or bn > max(64, _next_pow2(n)) or bk > max(32, _next_pow2(k)):
            return False
        if bm < 64 and m > bm:
            return False
        tiles = -(-m // bm) * -(-n // bn)
        if c.split_k > 1:
            return bool(sms) and tiles < sms and tiles * c.split_k <= 2 * sms and -(-k // bk) >= 4 * c.split_k
        if c.stream_k:
            return bool(sms) and 2 * tiles <= sms and tiles * -(-k // bk) >= 8 * sms
        return not (m * n >= 4096 * 4096 and (bm * bn < 128 * 128 or c.num_stages > 4))

    kept = [c for c in configs if fits(c)]
    if kept or not configs:
        return kept
    plain = [c for c in configs
             if c.split_k == 1 and not _hopper_only(c) and (c.kwargs["BM"] >= 64 or m <= c.kwargs["BM"])] or configs
    return [min(plain, key=lambda c: (c.kwargs["BM"] * c.kwargs["BN"], c.kwargs["BK"], c.num_stages))]


def promotion_fits(c: Config) -> bool:
    """Whether a precise fp8 product (sm_90a wgmma sums promoted into float32 through temporary registers), or an
    8-bit one with an operand gathered into registers from its MN-major tile, fits ``c``'s registers: not a
    pingpong config whose warpgroup owns more than one 64-row slab (its accumulator and the epilogue state a
    pingpong group keeps leave no room for a temporary: ptxas spills even a 16-register one; the gather spilled
    1,832 bytes at 128x128 on 4 warps)."""
    return not (c.pingpong and c.kwargs["BM"] > 64 * (c.num_warps // 4))


def _hopper_only(c: Config) -> bool:
    """Whether ``c`` asks for a launch option that changes the kernel on sm_90 only (``OptionSpec.sm90a_only``)."""
    return c.options.sm90a_only


def cluster_sm_count(tensor: Any) -> int:
    """The SM count of ``tensor``'s GPU when it has thread-block clusters (sm_90+, what split-K needs), else 0
    (CPU and meta tensors, older GPUs)."""
    index = _cuda_index(tensor)
    return 0 if index is None else _cluster_sms(index)


def is_sm90(tensor: Any) -> bool:
    """Whether ``tensor`` lives on an sm_90 GPU (H100/H200), where warp-specialized configs mean something."""
    index = _cuda_index(tensor)
    return index is not None and _capability(index) == (9, 0)


def shared_memory_per_block(tensor: Any) -> int:
    """The dynamic shared memory one block may use on ``tensor``'s GPU, the bound the compiler fits a kernel's rings
    into (``Arch.max_shared_bytes``: 227 KB on an H100, 163 KB on an A100); 0 when it is not on a GPU tilejit
    compiles for (CPU and meta tensors; an unsupported GPU, which the compile itself reports)."""
    index = _cuda_index(tensor)
    if index is None:
        return 0
    try:
        return Arch.for_capability(*_capability(index)).max_shared_bytes
    except UsageValueError:
        return 0


def _cuda_index(tensor: Any) -> int | None:
    """The index of ``tensor``'s CUDA device, or None when it is not on one (CPU and meta tensors)."""
    device = getattr(tensor, "device", None)
    if getattr(device, "type", None) != "cuda":
        return None
    return device.index if device.index is not None else _current_device()


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(index))


def _current_device() -> int:
    import torch

    return torch.cuda.current_device()


@functools.cache
def _cluster_sms(index: int) -> int:
    import torch

    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count if props.major >= 9 else 0
