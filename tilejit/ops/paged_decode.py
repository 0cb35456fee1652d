"""Attention of one query token per sequence over a (paged) KV cache, written in tilejit's language: the decode step
of serving (flash-decoding).

``decode_fwd``: one program per (batch, KV head, split). The ``GROUP`` query heads that read one KV head are the
rows of one (BM x D) query tile (BM = the group rounded up to a power of two, at least 16, as the tensor-core
products need), so each key and value is read from memory once per KV head. The program walks its share of the
batch's keys in blocks of BN rows with the online softmax of ``fused_attention``. A block always lies in one page
(BN divides the page size), so it is one strided slice of the cache; page sizes that no block size of 16 or more
divides (1, 8, 24, ...) gather the block's rows one by one (``GATHER``). The loads of a ``T.range`` loop are
prefetched only when their addresses do not depend on data the loop loads, so the numbers of four pages are
loaded before each pipelined loop (those of the next four too, to hide their latency) and the loop picks its
block's page among them by arithmetic: the ring stays full across four pages.

Split-KV: when batch x KV heads leaves SMs idle, the keys [start, len) of a batch are cut into (grid z) equal
runs of whole blocks, one per program; each writes its normalized partial output and base-2 log-sum-exp to a
workspace, and ``decode_combine`` weighs the partials into the output. The split count and the ring's depth come
from shapes only (the cache's capacity, the SM count, the blocks an SM holds of the compiled kernel:
``choose_pipeline``), never from ``cache_seqlens``, so a call needs no host sync; the workspace is
kept per (device, shape), so steady-state calls allocate nothing but their output and CUDA graphs can capture
them (one workspace per shape: calls of one shape on two streams at once must not overlap).

Masks: only a block that holds the batch's last key or the window's first one is masked (its keys outside
[start, len) get no weight, and its values there are zeroed, as stale cache slots may hold anything). A left window
of ``w`` keeps keys ``len - 1 - w .. len - 1`` (the query is the token at position ``len - 1``). ``SOFTCAP`` > 0
caps the scaled scores to ``c * tanh(s / c)``. An fp8 e4m3 cache is widened to the query's dtype in registers; its
``k_scale`` multiplies the scores and ``v_scale`` the output.
"""
from __future__ import annotations

import math

import torch

import tilejit
import tilejit.language as T
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, decode_config, encode_config, namespace, sm_count
from tilejit.ops.fused_attention import _score_scales

MAX_SPLITS = 64
#: a split gets at least this many key blocks, so the combine stays small next to the keys it saves waiting for
MIN_BLOCKS_PER_SPLIT = 4
#: ring depths ``choose_pipeline`` picks from where the launch gives no STAGES
STAGE_CHOICES = (2, 3, 4, 6)
#: keys and values in flight per SM (resident programs x ring depth x a stage's bytes) that keep an H200's HBM busy:
#: 3 stages of 16-key blocks at 3.9 programs per SM (93 KiB) read 3.8-4.3 TB/s where 2 stages (62 KiB) read 3.5-3.9
#: (``scripts/probes/decode_variants.py --grid``; benchmarks/RESULTS.md)
IN_FLIGHT_BYTES = 90 * 1024
#: a grid of several waves counts as whole when its last wave is at least this full: a last wave filled to 11%
#: or 55% (3 stages, 7 blocks per SM, 1,024 programs) read 3.4 TB/s where the grid of 0.97 waves read 4.1-4.2
WHOLE_WAVE = 0.9
#: warps an SM should hold on average: about one per warp scheduler, most SMs holding 4 (a 1-warp program at 1.9
#: programs per SM read 2.8-3.0 TB/s with 93 KiB in flight; at 3.9 per SM, 3.8-4.3)
MIN_WARPS_PER_SM = 3.5


@tilejit.func
def _decode_step(q, K, V, BlockTable, b, kv, page, n0, start, L, m_i, l_i, acc, qk_scale, tanh_scale, BN, D,
                 PAGE, PAGED, GATHER, MASK, SOFTCAP, WIDEN):
    """One block of BN keys from ``n0`` (``PAGED``: in cache page ``page``): scores, running max and sum
    rescaled, values accumulated. ``MASK``: keys outside [start, L) get no weight and their values are zeroed (a
    stale slot may hold NaN)."""
    if GATHER:  # K, V flattened to (pages * PAGE, Hkv, D): the block's rows from their pages one by one
        cols = n0 + T.arange(0, BN)
        slots = BlockTable[b, cols // PAGE] * PAGE + cols % PAGE
        k = K[slots, kv, 0:D]
        v = V[slots, kv, 0:D]
    elif PAGED:  # the block lies in one page
        off = n0 % PAGE
        k = K[page, off:off + BN, kv, 0:D]
        v = V[page, off:off + BN, kv, 0:D]
    else:
        k = K[b, n0:n0 + BN, kv, 0:D]
        v = V[b, n0:n0 + BN, kv, 0:D]
    if WIDEN:  # an fp8 cache: widened here, its scale is in qk_scale / tanh_scale
        k = k.to(q.dtype)
        v = v.to(q.dtype)
    s = T.gemm(q, k, T.zeros((q.shape[0], BN), T.float32), transpose_b=True)
    if SOFTCAP > 0.0:
        s = T.tanh(s * tanh_scale) * (SOFTCAP * 1.4426950408889634)
    if MASK:
        cols = n0 + T.arange(0, BN)
        seen = (cols >= start) & (cols < L)
        s = T.where(seen[None, :], s, float("-inf"))
        v = T.where(seen[:, None], v, 0.0).to(q.dtype)
    m_new = T.maximum(m_i, T.max(s, 1) * qk_scale)
    m_exp = T.where(m_new == float("-inf"), 0.0, m_new)  # a masked block may be a row's first: no key seen yet
    p = T.exp2(s * qk_scale - m_exp[:, None])
    alpha = T.exp2(m_i - m_exp)
    l_i = l_i * alpha + T.sum(p, 1)
    acc = acc * alpha[:, None]
    acc += p.to(q.dtype) @ v
    return m_new, l_i, acc


@tilejit.func
def _page_of(BlockTable, b, n0, PAGE, PAGED, GATHER):
    """The cache page of key ``n0`` of batch ``b`` (unused without pages or when the step gathers)."""
    page = b
    if PAGED and not GATHER:
        page = BlockTable[b, n0 // PAGE]
    return page


@tilejit.func
def _four_pages(BlockTable, b, pg):
    """The cache pages of batch ``b``'s pages pg .. pg + 3 (0 past the table's end)."""
    return BlockTable[b, pg], BlockTable[b, pg + 1], BlockTable[b, pg + 2], BlockTable[b, pg + 3]


@tilejit.kernel
def decode_fwd(Q, K, V, Lens, BlockTable, O, OPart, LsePart, KScale, VScale, sm_scale, k_scale, v_scale,
               GROUP: T.constexpr, BM: T.constexpr, BN: T.constexpr, D: T.constexpr, PAGE: T.constexpr,
               PAGED: T.constexpr, GATHER: T.constexpr, SPLIT: T.constexpr, STAGES: T.constexpr = 3,
               WINDOW_LEFT: T.constexpr = -1, SOFTCAP: T.constexpr = 0.0, WIDEN: T.constexpr = False,
               K_SCALE_TENSOR: T.constexpr = False, V_SCALE_TENSOR: T.constexpr = False):
    """Grid (KV heads, batch, splits). Q (B, Hq, D); K, V (B, S, Hkv, D), (pages, PAGE, Hkv, D) or, ``GATHER``,
    (pages * PAGE, Hkv, D). Not ``SPLIT`` (one split): the output goes to O; else to OPart (B, Hq, splits, D)
    float32 and LsePart (B, Hq, splits) float32 (base 2; -inf for a split without keys). ``WIDEN``: an fp8
    cache, widened to Q's dtype. ``K_SCALE_TENSOR``/``V_SCALE_TENSOR``: the fp8 scale is KScale[0] / VScale[0]
    (a device scalar: no host sync) instead of k_scale / v_scale."""
    kv = T.program_id(0)
    b = T.program_id(1)
    split = T.program_id(2)
    h0 = kv * GROUP
    L = Lens[b]
    start = 0
    if WINDOW_LEFT >= 0:
        start = T.maximum(L - 1 - WINDOW_LEFT, 0)
    if K_SCALE_TENSOR:
        k_scale = KScale[0]
    if V_SCALE_TENSOR:
        v_scale = VScale[0]
    qk_scale, tanh_scale = _score_scales(sm_scale * k_scale, SOFTCAP)
    # this split's run of whole blocks of [start, L)
    first = start // BN
    per_split = T.cdiv(T.cdiv(L, BN) - first, T.num_programs(2))
    lo = (first + split * per_split) * BN
    hi = T.minimum(lo + per_split * BN, T.cdiv(L, BN) * BN)
    # masked blocks: the one holding `start` (a window) and the one holding the last key; the rest run unmasked
    head_hi = T.maximum(lo, T.minimum(hi, T.cdiv(start, BN) * BN))
    mid_hi = T.maximum(head_hi, T.minimum(hi, (L // BN) * BN))
    q = Q[b, h0:h0 + BM, 0:D]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    for n0 in range(lo, head_hi, BN):
        page = _page_of(BlockTable, b, n0, PAGE, PAGED, GATHER)
        m_i, l_i, acc = _decode_step(q, K, V, BlockTable, b, kv, page, n0, start, L, m_i, l_i, acc, qk_scale,
                                     tanh_scale, BN, D, PAGE, PAGED, GATHER, True, SOFTCAP, WIDEN)
    if PAGED and not GATHER:
        # four pages per pipelined loop: their numbers are loaded before it (the loop's loads may depend on them,
        # not on data the loop loads), the next four's too, so that their latency hides under these pages' keys
        p0, p1, p2, p3 = _four_pages(BlockTable, b, head_hi // PAGE)
        for pg in range(head_hi // PAGE, T.cdiv(mid_hi, PAGE), 4):
            q0, q1, q2, q3 = _four_pages(BlockTable, b, pg + 4)
            for n0 in T.range(T.maximum(head_hi, pg * PAGE), T.minimum(mid_hi, pg * PAGE + 4 * PAGE), BN,
                              stages=STAGES):
                j = n0 // PAGE - pg
                page = T.where(j == 0, p0, T.where(j == 1, p1, T.where(j == 2, p2, p3)))
                m_i, l_i, acc = _decode_step(q, K, V, BlockTable, b, kv, page, n0, start, L, m_i, l_i, acc,
                                             qk_scale, tanh_scale, BN, D, PAGE, PAGED, GATHER, False, SOFTCAP,
                                             WIDEN)
            p0, p1, p2, p3 = q0, q1, q2, q3
    else:
        for n0 in T.range(head_hi, mid_hi, BN, stages=STAGES):
            m_i, l_i, acc = _decode_step(q, K, V, BlockTable, b, kv, b, n0, start, L, m_i, l_i, acc, qk_scale,
                                         tanh_scale, BN, D, PAGE, PAGED, GATHER, False, SOFTCAP, WIDEN)
    for n0 in range(mid_hi, hi, BN):
        page = _page_of(BlockTable, b, n0, PAGE, PAGED, GATHER)
        m_i, l_i, acc = _decode_step(q, K, V, BlockTable, b, kv, page, n0, start, L, m_i, l_i, acc, qk_scale,
                                     tanh_scale, BN, D, PAGE, PAGED, GATHER, True, SOFTCAP, WIDEN)
    seen = l_i > 0.0
    out = acc * (v_scale / T.where(seen, l_i, 1.0))[:, None]
    if not SPLIT:
        Ob = T.bounded(O, (O.shape[0], h0 + GROUP, D))  # the tile's rows past the group are another head's
        Ob[b, h0:h0 + BM, 0:D] = out
    else:
        OPb = T.bounded(OPart, (OPart.shape[0], h0 + GROUP, OPart.shape[2], D))
        OPb[b, h0:h0 + BM, split, 0:D] = out
        LPb = T.bounded(LsePart, (LsePart.shape[0], h0 + GROUP, LsePart.shape[2]))
        LPb[b, h0:h0 + BM, split] = T.where(seen, m_i + T.log2(T.where(seen, l_i, 1.0)), float("-inf"))


@tilejit.kernel
def decode_combine(OPart, LsePart, O, NSPLIT: T.constexpr, D: T.constexpr):
    """O[b, h] = the partials of its splits weighted by 2^lse (0 where no split saw a key). Grid (Hq, batch): a
    head a program, its partials loaded before the log-sum-exps are reduced, so both loads are in flight at once
    (``combine_warps`` sizes the program to its tile)."""
    h = T.program_id(0)
    b = T.program_id(1)
    part = OPart[b, h, 0:NSPLIT, 0:D]
    lse = LsePart[b, h, 0:NSPLIT]
    top = T.max(lse, 0)
    top = T.where(top == float("-inf"), 0.0, top)
    weight = T.exp2(lse - top)
    total = T.sum(weight, 0)
    acc = T.sum(part * weight[:, None], 0)
    O[b, h, 0:D] = acc / T.where(total > 0.0, total, 1.0)


# ----------------------------------------------------------------------------------------------- configs

def default_config(head_dim: int, fp8: bool = False, page_size: int | None = None, fp32: bool = False) -> dict:
    """BN (keys per block, before the page size caps it: ``block_size``), STAGES (blocks in flight) and warps.
    Decode reads each key once, so the aim is bytes in flight: 3 stages of 64 keys x D=128 x 2 bytes x (K, V)
    keep 64 KB of loads outstanding per program while it computes on the third, in 100 KB of shared memory (two
    programs per H100 SM); the tensor-core products are a few percent of the time at any BN. Where the page caps
    the block below 64 keys the ring is 4 deep (its blocks are small); the warps are ``block_warps`` of the
    block the page leaves. ``fp32``: a float32 cache, half the keys per block (the same bytes)."""
    bn = 64 if head_dim <= 128 else 32
    if fp8:
        bn *= 2  # half the bytes per key
    if fp32:
        bn //= 2
    size, gather = block_size(page_size, bn)
    # the masked blocks (at most one before and one after the unmasked run) are split off by hand: no peeling
    return dict(BN=bn, STAGES=4 if size < bn and not gather else 3, num_warps=block_warps(size, head_dim),
                peel_masks=False)


def block_warps(size: int, head_dim: int) -> int:
    """Warps of a program whose blocks hold ``size`` keys. The (16 x size) score tile is cut into m16n8
    tensor-core atoms along the keys, one column of atoms per warp: 4 warps need 32 keys or more; a 16-key block
    (two atoms) gets one warp (two for D > 128: the (16 x D) float32 accumulator in one warp's registers would
    be 128 a thread), whose scores then feed the value product from registers. More warps than the tile has
    columns of atoms leave the product to scalar multiply-adds from shared memory, many times slower than the
    loads it waits on."""
    if size >= 32:
        return 4
    return 1 if head_dim <= 128 else 2


def block_size(page_size: int | None, bn: int) -> tuple[int, bool]:
    """(keys per block, gather): the largest of bn, bn / 2, ... >= 16 that divides the page size (a block in one
    page is one strided slice), else bn with the rows gathered one by one (pages of 1, 8, 24 keys...)."""
    if page_size is None:
        return bn, False
    size = bn
    while size >= 16:
        if page_size % size == 0:
            return size, False
        size //= 2
    return bn, True


def most_splits(max_keys: int, bn: int) -> int:
    """The most programs one (batch, KV head)'s keys may be split over: each gets ``MIN_BLOCKS_PER_SPLIT`` blocks of
    the longest possible sequence (``max_keys``: the cache's capacity, or the window), at most ``MAX_SPLITS``."""
    return max(1, min(MAX_SPLITS, tilejit.cdiv(max_keys, bn * MIN_BLOCKS_PER_SPLIT)))


def num_splits(batch: int, kv_heads: int, max_keys: int, bn: int, sm_count: int,
               programs_per_sm: int = 2) -> int:
    """How many programs share one (batch, KV head)'s keys: a power of two that brings the grid to at least
    ``programs_per_sm`` programs per SM, no more than the longest possible sequence (``max_keys``: the cache's
    capacity, or the window) gives ``MIN_BLOCKS_PER_SPLIT`` blocks each, at most ``MAX_SPLITS``. From shapes
    only: no host sync."""
    most = most_splits(max_keys, bn)
    splits = 1
    while batch * kv_heads * splits < programs_per_sm * sm_count and splits * 2 <= most:
        splits *= 2
    return splits


def choose_pipeline(pairs: int, max_splits: int, sm_count: int, stage_bytes: int, warps: int, resident,
                    stages: int | None = None, splits: int | None = None) -> tuple[int, int]:
    """(ring depth, split count) of a decode launch of ``pairs`` (batch x KV heads) programs per split of
    ``warps`` warps, from the blocks an SM holds at each depth (``resident(stages)``, the occupancy of the compiled
    kernel) rather than from a fixed programs-per-SM aim. A decode program is latency-bound (a ring of a few
    blocks; one warp where the page caps the block at 16 keys): the HBM stays busy when every SM keeps
    ``IN_FLIGHT_BYTES`` of keys and values in flight and at least ``MIN_WARPS_PER_SM`` warps (one per scheduler),
    and a grid whose last wave is mostly empty pays a whole wave for a few programs. So, over the depths of
    ``STAGE_CHOICES`` and the powers of two up to ``max_splits`` (a given ``stages`` or ``splits`` is kept):

    1. a candidate is *whole* when its grid fits one wave (programs <= blocks per SM x SMs) or its last wave is at
       least ``WHOLE_WAVE`` full;
    2. per SM, it keeps the programs of one wave / SMs x ``warps`` warps and x depth x ``stage_bytes`` in flight;
    3. among whole candidates with ``MIN_WARPS_PER_SM`` warps, the fewest bytes in flight that reach
       ``IN_FLIGHT_BYTES`` (ties: fewer splits, then a shallower ring), else the most; with none, the whole
       candidate of the most warps (then bytes); with no whole candidate, the fullest last wave.

    Measured on an H200 (pages of 16 keys, 8 KV heads, D = 128, ``scripts/probes/decode_variants.py --grid``):
    batch 32 x 4k takes 3 stages, 2 splits (3.85 TB/s against 3.72 for the fixed plan of 4 stages); batch 128 x
    4k 2 stages, 1 split (4.11 against 3.68)."""
    depths = (stages,) if stages is not None else STAGE_CHOICES
    most = max(1, max_splits)
    counts = (splits,) if splits is not None else [1 << i for i in range(most.bit_length()) if 1 << i <= most]
    whole, partial = [], []
    for depth in depths:
        slots = resident(depth) * sm_count
        if not slots:  # this ring does not fit an SM
            continue
        for count in counts:
            programs = pairs * count
            waves = -(-programs // slots)
            per_sm = programs / waves / sm_count
            row = (per_sm * depth * stage_bytes, min(per_sm * warps, MIN_WARPS_PER_SM), count, depth,
                   programs / (waves * slots))
            (whole if waves == 1 or row[4] >= WHOLE_WAVE else partial).append(row)
    if not whole and not partial:  # no depth fits: launch as given, where the launch says what does not fit
        return depths[0], counts[0]
    busy = [row for row in whole if row[1] >= MIN_WARPS_PER_SM]
    enough = [row for row in busy if row[0] >= IN_FLIGHT_BYTES]
    if enough:
        best = min(enough, key=lambda row: (row[0], row[2], row[3]))
    elif whole:
        best = max(whole, key=lambda row: (row[1], row[0], -row[2], -row[3]))
    else:
        best = max(partial, key=lambda row: (row[4], -row[2], -row[3]))
    return best[3], best[2]


def programs_per_sm(gather: bool) -> int:
    """Programs per SM the split count aims for: 2 where blocks are slices of the cache (also where a page of 16
    keys caps the block: its 4-deep ring keeps as many bytes in flight, and at batch 32, 8 KV heads, an H200 read
    3.5 TB/s with 2 splits against 3.1 with 4 at context 4k, 4.1 against 3.6 at 32k:
    ``scripts/probes/decode_variants.py``); 8 where rows are gathered (loads go element by element,
    unpipelined)."""
    return 8 if gather else 2


#: the SM count the interpreter plans for (CPU tensors), so that CPU runs take the split path too
INTERPRETER_SM_COUNT = 8


def _sm_count(device: torch.device) -> int:
    return sm_count(device) if device.type == "cuda" else INTERPRETER_SM_COUNT


_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, batch: int, heads: int, splits: int, dim: int):
    """The split kernel's partial outputs (B, Hq, splits, D) and log-sum-exps (B, Hq, splits), float32, kept per
    device and shape for the life of the process, so steady-state calls allocate nothing and a captured CUDA
    graph's workspace is never freed under it. Each is small: splits > 1 only while B x Hkv x splits stays
    under a few programs per SM."""
    key = (str(device), batch, heads, splits, dim)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = (torch.empty(batch, heads, splits, dim, dtype=torch.float32, device=device),
                            torch.empty(batch, heads, splits, dtype=torch.float32, device=device))
    return _WORKSPACES[key]


# ----------------------------------------------------------------------------------------------- checks

_FP8 = torch.float8_e4m3fn


def _need(cond: bool, message: str, kind: type = ValueError) -> None:
    """Raises, when ``cond`` fails, the typed error of ``kind``: an ArgumentError (a TypeError) or an
    ArgumentValueError (a ValueError)."""
    if not cond:
        typed = arg_checks.ArgumentError if kind is TypeError else arg_checks.ArgumentValueError
        raise typed(f"decode_attention: {message}")


def _check_tensors(q, k_cache, v_cache, cache_seqlens, block_table) -> None:
    """Shapes, dtypes and devices of the operands (TypeError for a non-tensor or a wrong dtype, ValueError for a
    wrong shape or device)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)):
        _need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
    _need(block_table is None or isinstance(block_table, torch.Tensor),
          f"block_table must be a torch.Tensor or None, got {type(block_table).__name__}", TypeError)
    _need(q.dim() == 3, f"q must be (batch, heads, head_dim), got shape {tuple(q.shape)}")
    _need(q.dtype in (torch.float16, torch.bfloat16, torch.float32),
          f"q must be float16, bfloat16 or float32, got {q.dtype}", TypeError)
    batch, heads, dim = q.shape
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        layout = "(num_pages, page_size, kv_heads, head_dim)" if block_table is not None else \
            "(batch, max_seqlen, kv_heads, head_dim)"
        _need(t.dim() == 4, f"{name} must be {layout}, got shape {tuple(t.shape)}")
        _need(t.dtype in (q.dtype, _FP8), f"{name} must have q's dtype ({q.dtype}) or be float8_e4m3fn, got "
              f"{t.dtype}", TypeError)
        _need(t.shape[3] == dim, f"{name}'s head_dim is {t.shape[3]}, q's is {dim}")
        _need(t.stride(3) == 1 or t.shape[3] == 1, f"{name}'s last dimension must be contiguous (stride 1)")
    _need(k_cache.shape == v_cache.shape and k_cache.dtype == v_cache.dtype,
          f"k_cache and v_cache must match: {tuple(k_cache.shape)} {k_cache.dtype} vs {tuple(v_cache.shape)} "
          f"{v_cache.dtype}")
    kv_heads = k_cache.shape[2]
    _need(kv_heads > 0 and heads % kv_heads == 0, f"q's {heads} heads are not a multiple of the cache's "
          f"{kv_heads} kv_heads")
    _need(dim % 16 == 0 and 16 <= dim <= 256, f"head_dim must be a multiple of 16 from 16 to 256, got {dim}")
    _need(cache_seqlens.dtype == torch.int32, f"cache_seqlens must be int32, got {cache_seqlens.dtype}", TypeError)
    _need(tuple(cache_seqlens.shape) == (batch,), f"cache_seqlens must be ({batch},), got "
          f"{tuple(cache_seqlens.shape)}")
    if block_table is None:
        _need(k_cache.shape[0] == batch, f"without a block_table the cache is (batch, max_seqlen, kv_heads, "
              f"head_dim): its first dimension is {k_cache.shape[0]}, q's batch is {batch}")
    else:
        _need(block_table.dtype == torch.int32, f"block_table must be int32, got {block_table.dtype}", TypeError)
        _need(block_table.dim() == 2 and block_table.shape[0] == batch,
              f"block_table must be (batch={batch}, max_pages), got shape {tuple(block_table.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens),
                    ("block_table", block_table)):
        _need(t is None or t.device == q.device, f"{name} is on {t.device if t is not None else ''}, q on "
              f"{q.device}: every operand must be on one device")


def _scale(value, name: str, fp8: bool, device: torch.device) -> tuple[float, torch.Tensor | None]:
    """(float, tensor or None) of a k_scale / v_scale argument: a number, or a float32 one-element tensor on the
    device (read in the kernel, so no host sync)."""
    if value is None:
        return 1.0, None
    _need(fp8, f"{name} is for a float8_e4m3fn cache; this cache is not fp8")
    if isinstance(value, torch.Tensor):
        _need(value.dtype == torch.float32 and value.numel() == 1,
              f"{name} must be a float or a float32 tensor of one element, got {value.dtype} of shape "
              f"{tuple(value.shape)}", TypeError)
        _need(value.device == device, f"{name} is on {value.device}, q on {device}")
        return 1.0, value.reshape(1)
    _need(not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value),
          f"{name} must be a finite float or a float32 tensor, got {value!r}", TypeError)
    return float(value), None


def _masking(window, softcap) -> tuple[int, float]:
    """(left window, softcap) from flash_attn's ``window=(left, right)``: decode's query is the last token, so only
    the left bound keeps keys out (keys len - 1 - left .. len - 1); a right bound has nothing to exclude."""
    left, _ = arg_checks.window("decode_attention", window)
    return left, arg_checks.softcap("decode_attention", softcap)


# ----------------------------------------------------------------------------------------------- launching

def plan(q, k_cache, block_table=None, window_left: int = -1, config: dict | None = None):
    """(config with BN fitted to the page, gather, split count) of a call: from shapes, the device's SM count and
    the given config over ``default_config`` (without num_warps: ``block_warps`` of the fitted BN); never from
    the lengths (no host sync)."""
    batch, _, dim = q.shape
    given = config or {}
    kv_heads = k_cache.shape[2]
    page_size = k_cache.shape[1] if block_table is not None else None
    config = {**default_config(dim, k_cache.dtype == _FP8, page_size, k_cache.dtype == torch.float32), **given}
    bn, gather = block_size(page_size, config["BN"])
    if "num_warps" not in given:  # a BN given without warps: the warps its blocks fit
        config["num_warps"] = block_warps(bn, dim)
    splits = num_splits(batch, kv_heads, _capacity(k_cache, block_table, window_left), bn, _sm_count(q.device),
                        programs_per_sm(gather))
    return {**config, "BN": bn}, gather, splits


def _fwd_call(q, k_cache, v_cache, cache_seqlens, block_table, out, sm_scale, left, softcap, scales, config,
              splits):
    """(grid, args, keywords, splits) of the ``decode_fwd`` launch writing ``out`` (or its split partials).
    ``scales``: (k_scale, k tensor, v_scale, v tensor); ``splits``: None picks ``num_splits``."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    fp8 = k_cache.dtype == _FP8
    page_size = k_cache.shape[1] if block_table is not None else None
    given = config or {}
    config, gather, planned = plan(q, k_cache, block_table, left, config)
    bn = config.pop("BN")
    paged = page_size is not None
    k, v = (k_cache.flatten(0, 1), v_cache.flatten(0, 1)) if gather else (k_cache, v_cache)
    k_scale, k_tensor, v_scale, v_tensor = scales
    masking = {}
    if left >= 0:
        masking["WINDOW_LEFT"] = left
    if softcap > 0:
        masking["SOFTCAP"] = softcap
    keywords = dict(GROUP=group, BM=max(16, 1 << (group - 1).bit_length()), BN=bn, D=dim, PAGE=page_size or 1,
                    PAGED=paged, GATHER=gather, WIDEN=fp8, K_SCALE_TENSOR=k_tensor is not None,
                    V_SCALE_TENSOR=v_tensor is not None, **masking, **config)

    def call(count):
        part, lse = _workspace(q.device, batch, heads, count, dim) if count > 1 else (out, out)
        args = (q, k, v, cache_seqlens, block_table if paged else cache_seqlens, out, part, lse,
                k_tensor if k_tensor is not None else cache_seqlens,
                v_tensor if v_tensor is not None else cache_seqlens, sm_scale, k_scale, v_scale)
        return args, {**keywords, "SPLIT": count > 1}

    if q.is_cuda and not gather and not fp8 and ("STAGES" not in given or splits is None):
        key = (q.device.index, batch, kv_heads, _capacity(k_cache, block_table, left), splits,
               tuple(keywords.items()), "STAGES" in given)
        chosen = _PIPELINES.get(key)
        if chosen is None:
            args, probe = call(planned if splits is None else splits)
            chosen = _PIPELINES[key] = _residency_plan(q, k_cache, block_table, left, args, probe, bn,
                                                       given.get("STAGES"), splits)
        keywords["STAGES"], splits = chosen
    splits = planned if splits is None else splits
    args, keywords = call(splits)
    return (kv_heads, batch, splits), args, keywords, splits


#: (stages, splits) ``choose_pipeline`` chose, per device, shape and config (computed once: it loads a kernel)
_PIPELINES: dict[tuple, tuple[int, int]] = {}


def _capacity(k_cache, block_table, window_left: int) -> int:
    """The most keys a sequence can have: the cache's capacity, or the window."""
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    return min(capacity, window_left + 1) if window_left >= 0 else capacity


def _residency_plan(q, k_cache, block_table, left, args, keywords, bn, stages, splits) -> tuple[int, int]:
    """``choose_pipeline`` for a launch whose ring is in shared memory: the blocks an SM holds at each ring depth
    from the occupancy of the kernel compiled at the default depth, its shared memory grown or shrunk by a stage's
    bytes (BN keys and values of the cache's dtype) per stage."""
    from tilejit.runtime.launch import resident_blocks

    compiled = decode_fwd.compile(*args, **keywords)
    stage_bytes = 2 * bn * q.shape[2] * k_cache.element_size()
    base = keywords["STAGES"]
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()

    def resident(depth):
        return resident_blocks(compiled, index, compiled.shared_bytes + (depth - base) * stage_bytes)

    return choose_pipeline(q.shape[0] * k_cache.shape[2], most_splits(_capacity(k_cache, block_table, left), bn),
                           _sm_count(q.device), stage_bytes, keywords["num_warps"], resident, stages, splits)


def _launch(q, k_cache, v_cache, cache_seqlens, block_table, out, sm_scale, left, softcap, scales, config,
            splits):
    """Launch ``decode_fwd`` (and ``decode_combine`` when split) writing ``out`` (see ``_fwd_call``); an empty
    ``out`` (no batch entry or head) launches nothing."""
    if out.numel() == 0:
        return out
    grid, args, keywords, splits = _fwd_call(q, k_cache, v_cache, cache_seqlens, block_table, out, sm_scale, left,
                                             softcap, scales, config, splits)
    decode_fwd[grid](*args, **keywords)
    if splits > 1:
        batch, heads, dim = q.shape
        decode_combine[(heads, batch)](args[6], args[7], out, NSPLIT=splits, D=dim,
                                       num_warps=combine_warps(splits, dim))
    return out


def combine_warps(splits: int, dim: int) -> int:
    """Warps of a ``decode_combine`` program: one per 256 partial values, 1 to 4. On an H200 (64 heads, D = 128,
    ``scripts/probes/decode_combine.py``) one warp a head combined 2 splits in 3.6-3.7 us at batch 32 where four
    took 4.5-4.7 (and four heads a program of 4 warps, the earlier launch, 6.0-6.4); four warps combined 64 splits
    in 4.3 us where one took 16-18."""
    return max(1, min(4, splits * dim // 256))


def _prepare(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, window, softcap, k_scale, v_scale):
    """Every argument checked; (sm_scale, left window, softcap, scales)."""
    _check_tensors(q, k_cache, v_cache, cache_seqlens, block_table)
    left, cap = _masking(window, softcap)
    sm_scale = arg_checks.sm_scale("decode_attention", sm_scale, q.shape[2])
    fp8 = k_cache.dtype == _FP8
    scales = (*_scale(k_scale, "k_scale", fp8, q.device), *_scale(v_scale, "v_scale", fp8, q.device))
    arg_checks.runs_on("decode_attention", "q", q)
    return sm_scale, left, cap, scales


def _check_launch(num_splits, config: dict) -> None:
    """A plain launch's ``num_splits`` (a power of two or None) and config keys, checked."""
    _need(num_splits is None or (isinstance(num_splits, int) and num_splits >= 1
                                 and num_splits & (num_splits - 1) == 0),
          f"num_splits must be a power of two >= 1 or None, got {num_splits!r}")
    encode_config(config, "decode_attention")


def decode_attention_forward(q, k_cache, v_cache, cache_seqlens, block_table=None, *, sm_scale=None,
                             window=None, softcap=None, k_scale=None, v_scale=None, out=None, num_splits=None,
                             **config) -> torch.Tensor:
    """``decode_attention`` as a plain launch: into ``out`` (preallocated like q) when given, with ``num_splits``
    (a power of two; None: from the shapes and SM count) and ``config`` (BN, STAGES, launch options such as
    num_warps) overriding the defaults."""
    _check_launch(num_splits, config)
    sm_scale, left, cap, scales = _prepare(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, window,
                                           softcap, k_scale, v_scale)
    if out is None:
        out = torch.empty_like(q)
    arg_checks.like("decode_attention_forward", "out", out, q.shape, (q.dtype,), q.device, "like q")
    return _launch(q, k_cache, v_cache, cache_seqlens, block_table, out, sm_scale, left, cap, scales, config,
                   num_splits)


def chosen_pipeline(q, k_cache, v_cache, cache_seqlens, block_table=None, *, window=None, softcap=None,
                    k_scale=None, v_scale=None, num_splits=None, **config) -> tuple[int, int]:
    """(ring depth, split count) that ``decode_attention_forward`` with these arguments launches with."""
    _check_launch(num_splits, config)
    sm_scale, left, cap, scales = _prepare(q, k_cache, v_cache, cache_seqlens, block_table, None, window, softcap,
                                           k_scale, v_scale)
    _, _, keywords, splits = _fwd_call(q, k_cache, v_cache, cache_seqlens, block_table, q, sm_scale, left, cap,
                                       scales, config, num_splits)
    return keywords["STAGES"], splits


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                     block_table: torch.Tensor | None = None, *, sm_scale: float | None = None,
                     window: tuple[int, int] | None = None, softcap: float | None = None,
                     k_scale=None, v_scale=None) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v of one query token per sequence over its cached keys [0, cache_seqlens[b]).

    q (B, Hq, D) fp16/bf16, or float32 (its products in tf32 on tensor cores). Without ``block_table``: k_cache,
    v_cache (B, max_seqlen, Hkv, D); with it (int32 (B, max_pages), the pages of each sequence in order):
    (num_pages, page_size, Hkv, D), as ``flash_attn_with_kvcache`` and vLLM lay them out, any page size. Hq a multiple of Hkv (GQA). The cache has
    q's dtype or is float8_e4m3fn with ``k_scale``/``v_scale`` (a float or a float32 one-element device tensor)
    multiplying its keys and values. ``sm_scale`` defaults to 1/sqrt(D); ``window=(left, right)`` keeps the
    ``left + 1`` most recent keys (-1: all; the right bound excludes nothing at decode); ``softcap=c`` caps the
    scaled scores to c * tanh(s / c). A sequence of length 0 gives 0; a batch of 0 gives an empty output without a
    launch. The PyTorch operator ``tilejit::decode_attention`` (forward only): no host sync and, after the first
    call of a shape, no allocation but the output, so CUDA graphs capture it and ``torch.compile(fullgraph=True)``
    traces it.
    """
    sm_scale, left, cap, scales = _prepare(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, window,
                                           softcap, k_scale, v_scale)
    k_value, k_tensor, v_value, v_tensor = scales
    return _OP(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, left, cap, k_value, k_tensor, v_value,
               v_tensor, [])


def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
               block_table: torch.Tensor | None, sm_scale: float, window_left: int, softcap: float,
               k_scale: float, k_scale_tensor: torch.Tensor | None, v_scale: float,
               v_scale_tensor: torch.Tensor | None, config: list[int]) -> torch.Tensor:
    return _launch(q, k_cache, v_cache, cache_seqlens, block_table, torch.empty_like(q), sm_scale, window_left,
                   softcap, (k_scale, k_scale_tensor, v_scale, v_scale_tensor), decode_config(config), None)


_OP = Operator(f"{namespace(__name__, 'tilejit.ops.paged_decode')}::decode_attention", _decode_op,
               fake=lambda q, *_: torch.empty_like(q))


# ----------------------------------------------------------------------------------------------- reference

def reference(q, k_cache, v_cache, cache_seqlens, block_table=None, *, sm_scale=None, window=None, softcap=None,
              k_scale=1.0, v_scale=1.0) -> torch.Tensor:
    """float64 decode attention, sequence by sequence: the keys [0, len) (with a left window, the last left + 1)
    gathered from the pages, scores of each KV head's query heads (capped), softmax, values; 0 for no key.
    Computed on q's device, returned on the CPU. Scales are floats or one-element tensors."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    sm_scale = 1.0 / math.sqrt(dim) if sm_scale is None else sm_scale
    left = -1 if window is None else window[0]
    k_scale, v_scale = (float(s) for s in (k_scale, v_scale))
    out = torch.zeros(batch, heads, dim, dtype=torch.float64)
    for b, length in enumerate(cache_seqlens.tolist()):
        keys = torch.arange(max(0, length - 1 - left) if left >= 0 else 0, length, device=q.device)
        if keys.numel() == 0:
            continue
        if block_table is None:
            k, v = k_cache[b, keys], v_cache[b, keys]
        else:
            pages = block_table[b].to(q.device).long()[keys // k_cache.shape[1]]
            k, v = k_cache[pages, keys % k_cache.shape[1]], v_cache[pages, keys % k_cache.shape[1]]
        k = k.double() * k_scale                                     # (keys, Hkv, D)
        v = v.double() * v_scale
        qg = q[b].double().view(kv_heads, heads // kv_heads, dim)    # the query heads of each KV head
        s = torch.einsum("hgd,nhd->hgn", qg, k) * sm_scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        out[b] = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), v).reshape(heads, dim).cpu()
    return out


def paged_cache(k: torch.Tensor, v: torch.Tensor, page_size: int, *, spare_pages: int = 0,
                generator: torch.Generator | None = None, fill: float = 0.0):
    """A contiguous cache (B, S, Hkv, D) cut into pages of ``page_size`` keys placed in random order:
    (k_pages, v_pages, block_table int32 (B, cdiv(S, page_size))) in ``decode_attention``'s page layout, plus
    ``spare_pages`` pages no sequence uses. Slots past S and the spare pages hold ``fill``. For tests and
    benchmarks."""
    batch, seq, kv_heads, dim = k.shape
    per_seq = tilejit.cdiv(seq, page_size)
    total = batch * per_seq + spare_pages
    order = torch.randperm(total, generator=generator)[:batch * per_seq].to(k.device)
    block_table = order.view(batch, per_seq).to(torch.int32)
    pages = []
    for t in (k, v):
        padded = t.new_full((batch, per_seq * page_size, kv_heads, dim), fill)
        padded[:, :seq] = t
        paged = t.new_full((total, page_size, kv_heads, dim), fill)
        paged[order] = padded.view(batch * per_seq, page_size, kv_heads, dim)
        pages.append(paged)
    return pages[0], pages[1], block_table
