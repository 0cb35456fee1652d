"""Attention forward on float8 (e4m3) queries, keys and values, written in tilejit's language.

``attention_fp8(q, k, v, q_scale=..., k_scale=..., v_scale=...)`` computes softmax(q k^T * sm_scale) v of the
dequantized inputs ``q * q_scale``, ``k * k_scale``, ``v * v_scale``, forward only:

- Scales are float32 tensors, each either one per tensor (shape ``()`` or ``(1,)``) or one per block
  (``SCALE_BLOCK`` = 128): ``q_scale`` (B, H, cdiv(S, 128)), one per 128 query rows of a (batch, head);
  ``k_scale`` and ``v_scale`` (B, H // G, cdiv(S, 128)), one per 128 keys of a (batch, key/value head). Each
  picks its form independently; scales must be positive and finite.
- The first product, ``q @ k^T``, is one wgmma group per key block (K = D: the tensor cores' own float8 sum,
  precision "fast"; at D = 128 that is exactly the interval a promoted gemm would sum before promoting). Its
  scale (sm_scale * log2 e * q's * the block's k) is one float per block, applied with the max as in the bf16
  forward.
- P is quantized to e4m3 for the second product, scaled so that its range lands in e4m3's normal range: the
  exponent subtracts the running max less 8 (``P_SHIFT``), so each row's largest weight is 2^8 = 256 (e4m3 holds
  up to 448 and is normal down to 2^-6: weights down to 2^-14 of the row's max keep e4m3's full 3-bit mantissa).
  The row sum ``l`` adds the same scaled weights in float32 before rounding, so the 2^8 cancels in ``acc / l``.
  Each weight's rounding is a relative error of at most 2^-4, so an output element is off by at most 2^-4 times
  its column's largest |v| from P alone (tests/backend/test_attention_fp8.py's bound); random errors average
  down over many keys of similar weight.
- ``p @ v`` accumulates in the tensor cores across key blocks (precision "fast"): P's rounding dominates its
  error. Per-block v scales ride in the accumulator's rescaling: it is kept in units of the current block's
  scale (multiplied by ``alpha * v_prev / v_new`` before each block's product), and the last block's scale is
  applied at the end, so no second accumulator is needed.
- The softmax statistics (running max, row sum) are float32. The unmasked/masked loop split (blocks wholly
  inside the keys, and left of the diagonal when causal, run without a mask) and the warp specialization of the
  bf16 forward (``fused_attention.attn_fwd``) are kept.
- wgmma reads 8-bit operands K-major only, so ``p @ v`` wants V transposed, (D, S) per head: ``attention_fp8``
  transposes v once into (B, H // G, D, S16) (S16: S rounded up to 16 keys, the padding zeroed, so each row's
  stride is a multiple of TMA's 16 bytes), which costs one read and one write of v (at S = 4096, D = 128, B = 4,
  H = 16: 67 MB, about 25 us at 3 TB/s, 2-4% of the attention at 600-900 TFLOP/s). ``v_transposed=True`` takes v
  already laid out as (B, H // G, D, S) (its row stride a multiple of 16 bytes). The compiler's transposing copy
  (MN-major 8-bit operands, transposed in shared memory) is the slower route and is not used.
- On sm_90a P feeds the second wgmma from registers (``wgmma_rs_m64nNk32_fp8``: the e4m3 fragment gathered
  across each quad of lanes, two shuffles per 32-bit word, in place of a round trip through shared memory and a
  barrier of both consumer warpgroups), so the bf16 forward's overlap holds: warp-specialized with a 3-deep
  ring, each block's ``p @ v`` is issued under the next block's ``q @ k^T``. On sm_89 and sm_100a P is staged
  through shared memory for ``p @ v`` (mma.sync).

Float8 products need sm_89+ (mma.sync m16n8k32), sm_90a (wgmma) or sm_100a (tcgen05 for ``q @ k^T``); for
sm_80/86 the kernel compiles to the compiler's FMA fallback (correct, minutes to compile, far slower than bf16
attention), so ``attention_fp8`` refuses those GPUs up front.
"""
from __future__ import annotations

import math

import torch

import tilejit
import tilejit.language as T
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, decode_config, encode_config, namespace
from tilejit.ops.fused_attention import _hopper, _visible

#: Rows (queries) or keys per per-block scale.
SCALE_BLOCK = 128
#: The exponent's shift that scales P before it is rounded to e4m3: each row's largest weight is 2^P_SHIFT.
P_SHIFT = 8.0


@tilejit.func
def _fp8_step(q, K, Vt, KS, VS, b, kv, n0, S, rows, m_i, l_i, acc, v_scale, qk_base, BN, D, MASK, CAUSAL,
              K_BLOCKED, V_BLOCKED):
    """One key block: scores, the running max and sum, P rounded to e4m3, and ``acc`` (in units of the block's v
    scale) accumulated. Returns the block's v scale with the statistics."""
    k = K[b, kv, n0:n0 + BN, 0:D]
    s = T.gemm(q, k, T.zeros((q.shape[0], BN), T.float32), transpose_b=True, precision="fast")
    qk_scale = qk_base
    if K_BLOCKED:
        qk_scale = qk_base * KS[b, kv, n0 // SCALE_BLOCK]
    v_new = v_scale
    if V_BLOCKED:
        v_new = VS[b, kv, n0 // SCALE_BLOCK]
    if MASK:
        valid = _visible(rows, n0 + T.arange(0, BN), S, CAUSAL, -1, -1)
        s = T.where(valid, s, float("-inf"))
    m_new = T.maximum(m_i, T.max(s, 1) * qk_scale)
    p = T.exp2(s * qk_scale - (m_new[:, None] - P_SHIFT))  # each row's largest weight is 2^P_SHIFT
    alpha = T.exp2(m_i - m_new)
    l_i = l_i * alpha + T.sum(p, 1)
    if V_BLOCKED:
        alpha = alpha * (v_scale / v_new)
    acc = acc * alpha[:, None]
    vt = Vt[b, kv, 0:D, n0:n0 + BN]
    acc = T.gemm(p.to(T.float8_e4m3fn), vt, acc, transpose_b=True, precision="fast")
    return m_new, l_i, acc, v_new


@tilejit.kernel
def attn_fwd_fp8(Q, K, Vt, O, QS, KS, VS, sm_scale, H, GROUP: T.constexpr, BM: T.constexpr, BN: T.constexpr,
                 D: T.constexpr, CAUSAL: T.constexpr, Q_BLOCKED: T.constexpr, K_BLOCKED: T.constexpr,
                 V_BLOCKED: T.constexpr, STAGES: T.constexpr = 2):
    """O = softmax(Q K^T * scales) V of one BM-row block of one (batch, head); Vt is V transposed, (B, HKV, D, S).
    QS, KS, VS: float32 scales, (B, H | HKV, cdiv(S, 128)) when ``*_BLOCKED``, else one element read at [0]."""
    assert SCALE_BLOCK % BM == 0 and SCALE_BLOCK % BN == 0, "attn_fwd_fp8: BM and BN must divide SCALE_BLOCK (128)"
    pid_bh = T.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kv = h // GROUP
    m0 = T.program_id(0) * BM
    if CAUSAL:  # the last query blocks attend to the most keys: start them first
        m0 = (T.num_programs(0) - 1 - T.program_id(0)) * BM
    S = Q.shape[2]
    q = Q[b, h, m0:m0 + BM, 0:D]
    if Q_BLOCKED:
        q_scale = QS[b, h, m0 // SCALE_BLOCK]
    else:
        q_scale = QS[0]
    qk_base = sm_scale * 1.4426950408889634 * q_scale  # exp(x) = exp2(x * log2(e))
    if not K_BLOCKED:
        qk_base = qk_base * KS[0]
    if V_BLOCKED:
        v_scale = VS[b, kv, 0]
    else:
        v_scale = VS[0]
    m_i = T.full((BM,), float("-inf"), T.float32)
    l_i = T.zeros((BM,), T.float32)
    acc = T.zeros((BM, D), T.float32)
    rows = m0 + T.arange(0, BM)
    # Blocks wholly before the end of the keys (and, causal, left of the diagonal) run unmasked; the rest masked.
    lo = (S // BN) * BN
    if CAUSAL:
        lo = T.minimum(m0, lo) if BM % BN == 0 else 0
    for n0 in T.range(0, lo, BN, stages=STAGES):
        m_i, l_i, acc, v_scale = _fp8_step(q, K, Vt, KS, VS, b, kv, n0, S, rows, m_i, l_i, acc, v_scale, qk_base,
                                           BN, D, False, False, K_BLOCKED, V_BLOCKED)
    hi = S
    if CAUSAL:
        hi = T.minimum(S, m0 + BM)
    for n0 in T.range(lo, hi, BN, stages=2):
        m_i, l_i, acc, v_scale = _fp8_step(q, K, Vt, KS, VS, b, kv, n0, S, rows, m_i, l_i, acc, v_scale, qk_base,
                                           BN, D, True, CAUSAL, K_BLOCKED, V_BLOCKED)
    O[b, h, m0:m0 + BM, 0:D] = (acc * (v_scale / l_i)[:, None]).to(O.dtype)


# The config space the tests compile and the benchmark times: (BM, BN, num_warps); BM and BN divide SCALE_BLOCK.
CONFIGS = {64: [(128, 128, 8), (128, 64, 8), (64, 128, 4), (64, 64, 4)],
           128: [(128, 128, 8), (128, 64, 8), (64, 128, 4), (64, 64, 4)],
           256: [(64, 64, 4), (128, 64, 8)]}


def default_config(head_dim: int, hopper: bool = False) -> dict:
    """The largest tiles whose registers hold on every GPU with float8 products; on Hopper (``hopper``) the bf16
    forward's measured-best form at the same tiles: 128 query rows (a 64-row slab per consumer warpgroup) against
    128 keys, the key/value loop warp-specialized with a 3-deep ring. 8-bit tiles halve the bytes per stage, but
    the S tile (64 float32 registers per thread per 64x128 slab) and the output accumulator (64 more at D = 128) are
    what bound the tiles: 128 keys per block keeps both under a consumer warpgroup's 240 registers (256 keys would
    need 192 for them alone)."""
    if head_dim > 128:
        return dict(BM=64, BN=64, num_warps=4, **(dict(warp_specialize=True, STAGES=3) if hopper else {}))
    if hopper:
        return dict(BM=128, BN=128, num_warps=8, warp_specialize=True, STAGES=3)
    return dict(BM=128, BN=64, num_warps=8)


def require_fp8_mma(capability: tuple[int, int]) -> None:
    """Refuse a GPU without float8 tensor-core products (before sm_89): the kernel would compile to the compiler's
    FMA fallback there (correct, but slower than bf16 attention and minutes to compile)."""
    if tuple(capability) < (8, 9):
        raise RuntimeError(f"attention_fp8 needs float8 tensor-core products (sm_89 or newer); this GPU is "
                           f"sm_{capability[0]}{capability[1]}: use tilejit.ops.attention on bf16 inputs")


def _check_inputs(q, k, v, v_transposed):
    arg_checks.tensors("attention_fp8", q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.float8_e4m3fn or t.dim() != 4:
            raise arg_checks.ArgumentError(f"attention_fp8: {name} must be a 4-d torch.float8_e4m3fn tensor, got "
                                           f"{t.dtype} {tuple(t.shape)}")
        if t.device != q.device:
            raise arg_checks.ArgumentValueError(f"attention_fp8: {name} is on {t.device}, q on {q.device}")
    batch, heads, seq, dim = q.shape
    want_v = (k.shape[0], k.shape[1], dim, seq) if v_transposed else tuple(k.shape)
    if k.shape[0] != batch or k.shape[2:] != (seq, dim) or tuple(v.shape) != want_v:
        form = "(B, H // G, D, S) (v_transposed)" if v_transposed else "(B, H // G, S, D)"
        raise arg_checks.ArgumentValueError(f"attention_fp8: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                                            f"{tuple(v.shape)}: k must be (B, H // G, S, D) and v {form}, with q "
                                            f"(B, H, S, D)")
    if dim % 32 or not 0 < dim <= 256:
        raise arg_checks.ArgumentValueError(f"attention_fp8: head dim {dim} must be a multiple of 32 (one float8 k "
                                            f"step), at most 256")
    kv_heads = k.shape[1]
    if kv_heads == 0 and heads or kv_heads and heads % kv_heads:  # (no heads at all: an empty output)
        raise arg_checks.ArgumentValueError(f"attention_fp8: query heads {heads} must be a multiple of key/value "
                                            f"heads {kv_heads}")
    if v_transposed and v.is_cuda and (v.stride(3) != 1 or v.stride(2) % 16):
        raise arg_checks.ArgumentValueError(f"attention_fp8: a transposed v needs unit stride along S and a row "
                                            f"stride that is a multiple of 16 bytes (pad S to a multiple of 16), got "
                                            f"strides {v.stride()}")
    return heads // kv_heads if kv_heads else 1


def _scale(scale, name: str, heads: int, q) -> tuple[torch.Tensor, bool]:
    """(the kernel's scale argument, per block): a float32 tensor of one element, or (B, heads, cdiv(S, 128))."""
    batch, _, seq, _ = q.shape
    blocks = (batch, heads, -(-seq // SCALE_BLOCK))
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        got = scale.dtype if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise arg_checks.ArgumentError(f"attention_fp8: {name} must be a float32 tensor (one scale, or one per block "
                                       f"of {SCALE_BLOCK}), got {got}")
    if scale.device != q.device:
        raise arg_checks.ArgumentValueError(f"attention_fp8: {name} is on {scale.device}, q on {q.device}")
    if scale.numel() == 1 and scale.dim() <= 1:
        return scale.reshape(1), False
    if tuple(scale.shape) != blocks:
        raise arg_checks.ArgumentValueError(f"attention_fp8: {name} must have shape () or (1,) (per tensor) or "
                                            f"{blocks} (one per {SCALE_BLOCK} "
                                            f"{'rows' if name == 'q_scale' else 'keys'} of each (batch, head)), got "
                                            f"{tuple(scale.shape)}")
    return scale, True


def transpose_v(v: torch.Tensor) -> torch.Tensor:
    """v (B, HKV, S, D) as (B, HKV, D, S): a view of a (B, HKV, D, S16) tensor whose padding is zeroed, S16 = S
    rounded up to 16, so that each row's stride is a multiple of 16 bytes (TMA's requirement)."""
    batch, heads, seq, dim = v.shape
    padded = torch.empty(batch, heads, dim, -(-seq // 16) * 16, dtype=v.dtype, device=v.device)
    padded[..., seq:].zero_()  # never read as keys (out of bounds), but no NaN bytes left in memory either
    out = padded[..., :seq]
    out.copy_(v.transpose(2, 3))
    return out


def _forward(q, k, v, q_scale, k_scale, v_scale, causal, sm_scale, v_transposed, out, config):
    group = _check_inputs(q, k, v, v_transposed)
    batch, heads, seq, dim = q.shape
    qs, q_blocked = _scale(q_scale, "q_scale", heads, q)
    ks, k_blocked = _scale(k_scale, "k_scale", k.shape[1], q)
    vs, v_blocked = _scale(v_scale, "v_scale", k.shape[1], q)
    if q.is_cuda:
        require_fp8_mma(torch.cuda.get_device_capability(q.device))
    config = {**default_config(dim, not config and _hopper(q)), **config}
    if SCALE_BLOCK % config["BM"] or SCALE_BLOCK % config["BN"]:
        raise arg_checks.ArgumentValueError(f"attention_fp8: BM and BN must divide {SCALE_BLOCK} (the scale block), "
                                            f"got {config['BM']} and {config['BN']}")
    if q.numel() == 0:  # no batch, head or row: nothing to attend
        return out
    vt = v if v_transposed else transpose_v(v)
    grid = (tilejit.cdiv(seq, config["BM"]), batch * heads)
    attn_fwd_fp8[grid](q, k, vt, out, qs, ks, vs, sm_scale, heads, GROUP=group, D=dim, CAUSAL=bool(causal),
                       Q_BLOCKED=q_blocked, K_BLOCKED=k_blocked, V_BLOCKED=v_blocked, **config)
    return out


_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_scale: torch.Tensor,
                  k_scale: torch.Tensor, v_scale: torch.Tensor, causal: bool = False, sm_scale: float | None = None,
                  out_dtype: torch.dtype = torch.bfloat16, v_transposed: bool = False,
                  out: torch.Tensor | None = None, **config) -> torch.Tensor:
    """softmax((q q_scale) (k k_scale)^T * sm_scale [causal]) (v v_scale) for float8_e4m3fn q (B, H, S, D) and
    k, v (B, H // G, S, D) (or v (B, H // G, D, S) with ``v_transposed``), forward only; ``out_dtype`` bf16, fp16
    or float32. Scales: float32, per tensor (shape () or (1,)) or per block of ``SCALE_BLOCK`` rows / keys (q_scale
    (B, H, cdiv(S, 128)); k_scale, v_scale (B, H // G, cdiv(S, 128))). ``config`` (BM, BN, STAGES, launch
    options; BM and BN dividing 128) overrides ``default_config``. ``out`` (preallocated, ``out_dtype``) is
    written in place. The PyTorch operator ``tilejit::attention_fp8`` (usable under ``torch.compile``); the module
    docstring gives the quantization of P and its error bound."""
    arg_checks.tensors("attention_fp8", q=q, k=k, v=v)
    arg_checks.optional_tensors("attention_fp8", out=out)
    arg_checks.out_dtype("attention_fp8", out_dtype, _OUT_DTYPES)
    if out is not None and (out.dtype != out_dtype or out.shape != q.shape or out.device != q.device):
        raise arg_checks.ArgumentValueError(f"attention_fp8: out must be {out_dtype} {tuple(q.shape)} on {q.device}, "
                                            f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    dim = q.shape[-1]
    sm_scale = arg_checks.number("attention_fp8", "sm_scale", sm_scale, default=1.0 / math.sqrt(max(dim, 1)))
    if not 0.0 < sm_scale < math.inf:  # the running max is taken of unscaled scores: the scale must keep order
        raise arg_checks.ArgumentValueError(f"attention_fp8: sm_scale must be a finite number > 0, got {sm_scale}")
    encoded = encode_config(config, "attention_fp8")
    _check_inputs(q, k, v, v_transposed)  # the user's mistakes named here, before the operator's schema sees them
    for name, scale, heads in (("q_scale", q_scale, q.shape[1]), ("k_scale", k_scale, k.shape[1]),
                               ("v_scale", v_scale, k.shape[1])):
        _scale(scale, name, heads, q)
    arg_checks.runs_on("attention_fp8", "q", q)
    if out is None:
        return _OPS.forward(q, k, v, q_scale, k_scale, v_scale, bool(causal), sm_scale, bool(v_transposed),
                            out_dtype, encoded)
    _OPS.forward_into(q, k, v, q_scale, k_scale, v_scale, out, bool(causal), sm_scale, bool(v_transposed),
                      encoded)
    return out


def dequantize(x: torch.Tensor, scale: torch.Tensor, rows_dim: int = 2) -> torch.Tensor:
    """float64 ``x * scale`` with a per-tensor scale or one per ``SCALE_BLOCK`` entries of dimension
    ``rows_dim`` (the scale layout ``attention_fp8`` takes; 3 for a transposed v)."""
    x = x.double()
    if scale.numel() == 1 and scale.dim() <= 1:
        return x * scale.double().reshape(())
    per_entry = scale.double().repeat_interleave(SCALE_BLOCK, dim=2)[:, :, :x.shape[rows_dim]]
    return x * (per_entry[..., None] if rows_dim == 2 else per_entry[:, :, None, :])


def quantize(x: torch.Tensor, per_block: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, float32 scales) of a (B, H, S, D) tensor: per tensor, or one scale per ``SCALE_BLOCK`` rows
    of each (batch, head), each block's largest magnitude mapped to e4m3's 448."""
    x = x.float()
    if not per_block:
        scale = (x.abs().amax() / 448.0).clamp_min(1e-12).reshape(())
        return (x / scale).to(torch.float8_e4m3fn), scale
    batch, heads, seq, dim = x.shape
    blocks = -(-seq // SCALE_BLOCK)
    padded = torch.nn.functional.pad(x, (0, 0, 0, blocks * SCALE_BLOCK - seq))
    amax = padded.reshape(batch, heads, blocks, SCALE_BLOCK * dim).abs().amax(-1)
    scale = (amax / 448.0).clamp_min(1e-12)
    per_row = scale.repeat_interleave(SCALE_BLOCK, dim=2)[:, :, :seq, None]
    return (x / per_row).to(torch.float8_e4m3fn), scale.contiguous()


def reference(q, k, v, q_scale, k_scale, v_scale, causal=False, sm_scale=None, v_transposed=False):
    """float64 attention of the dequantized inputs (no rounding of P): what ``attention_fp8`` approximates."""
    from tilejit.ops.fused_attention import reference as exact

    v64 = dequantize(v, v_scale, 3 if v_transposed else 2)
    if v_transposed:
        v64 = v64.transpose(2, 3)
    return exact(dequantize(q, q_scale), dequantize(k, k_scale), v64, causal, sm_scale)


class _Operators:
    """``attention_fp8`` (functional) and ``attention_fp8_out`` (writes ``out``), in ``namespace``."""

    def __init__(self, namespace: str):
        self.forward = Operator(f"{namespace}::attention_fp8", _fp8_op,
                                fake=lambda q, *args: torch.empty(q.shape, dtype=args[-2], device=q.device))
        self.forward_into = Operator(f"{namespace}::attention_fp8_out", _fp8_out_op, mutates_args=("out",))


def _fp8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor,
            v_scale: torch.Tensor, causal: bool, sm_scale: float, v_transposed: bool, out_dtype: torch.dtype,
            config: list[int]) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    return _forward(q, k, v, q_scale, k_scale, v_scale, causal, sm_scale, v_transposed, out, decode_config(config))


def _fp8_out_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_scale: torch.Tensor, k_scale: torch.Tensor,
                v_scale: torch.Tensor, out: torch.Tensor, causal: bool, sm_scale: float, v_transposed: bool,
                config: list[int]) -> None:
    _forward(q, k, v, q_scale, k_scale, v_scale, causal, sm_scale, v_transposed, out, decode_config(config))


_OPS = _Operators(namespace(__name__, "tilejit.ops.fp8_attention"))
