"""Rotary position embedding (half-split, as Llama and Hugging Face's ``rotate_half``) of q and k, written in
tilejit's language.

``rotary_kernel``: a program rotates BT consecutive tokens of one batch entry, of q (``program_id(1)`` = 0) or
of k (1). It reads the tokens' positions (``Positions[b, s0:s0 + BT]``, or s), gathers their rows of cos and sin
(float32, D/2 each) once, then rotates the heads BH at a time (all of them in one step for Llama-like shapes, so
each program issues all its loads before any store); a step issues its loads, then spreads cos and sin over its
heads (through shared memory, while the loads are in flight): with ``x1 = x[..., :D/2]``
and ``x2 = x[..., D/2:]``, ``out = (x1 cos - x2 sin, x2 cos + x1 sin)`` in float32, stored in the input's dtype.
The kernel sees a head as (2, D/2) (a view of the last dim), so the two halves are two loads whose columns past
D/2 are masked, whatever D/2 is. It reads and writes each element once; the outputs may be the inputs (in
place). ``INVERSE`` rotates by -angle: the backward, since the rotation is orthogonal (the gradient of x is the
transposed rotation of the output's gradient).

``rotary_embedding(q, k, cos, sin, positions=...)`` rotates q and k in place (the operator
``tilejit::rotary_embedding_``, which declares both as mutated) when no gradient is recorded, and otherwise
returns fresh tensors from the differentiable operator ``tilejit::rotary_embedding`` (autograd cannot record a
custom operator that writes its inputs): callers use the returned tensors either way. ``reference`` is the
float64 definition the tests check against.
"""
from __future__ import annotations

import functools

import torch

import tilejit
import tilejit.language as T
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, namespace

#: The largest head dim the kernel takes (a head's two halves live in registers, a few heads at a time).
MAX_HEAD_DIM = 1024
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@tilejit.func
def _rotate_heads(X, Out, b, s0, c, sn, BT, BH, BHALF):
    """Rotate every head of tokens (b, s0 .. s0 + BT) of X (B, S, H, 2, D/2) into Out, BH heads at a time."""
    zero = T.zeros((BT, BH, BHALF), T.float32)
    for h0 in range(0, X.shape[2], BH):
        x1 = X[b, s0:s0 + BT, h0:h0 + BH, 0, 0:BHALF].to(T.float32)
        x2 = X[b, s0:s0 + BT, h0:h0 + BH, 1, 0:BHALF].to(T.float32)
        # cos and sin (BT, BHALF) spread over the heads (a broadcast goes through shared memory) after the loads
        # are issued, so that the heads' loads and the gathers of cos and sin are in flight together (one step for
        # Llama-like shapes: one broadcast each)
        cb = zero + c[:, None, :]
        sb = zero + sn[:, None, :]
        Out[b, s0:s0 + BT, h0:h0 + BH, 0, 0:BHALF] = x1 * cb - x2 * sb
        Out[b, s0:s0 + BT, h0:h0 + BH, 1, 0:BHALF] = x2 * cb + x1 * sb


@tilejit.kernel
def rotary_kernel(Q, K, QOut, KOut, Cos, Sin, Positions, BT: T.constexpr, BHQ: T.constexpr, BHK: T.constexpr,
                  BHALF: T.constexpr, HALF_DIVISOR: T.constexpr, POSITIONS: T.constexpr, INVERSE: T.constexpr):
    """Rotate tokens s0 .. s0 + BT of batch entry b (``program_id(0)`` = b * cdiv(S, BT) + s0 / BT) of Q
    (``program_id(1)`` = 0) or of K (1), each (B, S, H, 2, D/2), into QOut or KOut. HALF_DIVISOR: a power of 2
    that divides D/2 (at most 8), so that the vector accesses need no run-time test and no element-wise variant."""
    T.multiple_of(Q.shape[4], HALF_DIVISOR)
    T.multiple_of(K.shape[4], HALF_DIVISOR)
    T.multiple_of(QOut.shape[4], HALF_DIVISOR)
    T.multiple_of(KOut.shape[4], HALF_DIVISOR)
    S = Q.shape[1]
    blocks = T.cdiv(S, BT)
    b = T.program_id(0) // blocks
    s0 = T.program_id(0) % blocks * BT
    if POSITIONS:
        pos = Positions[b, s0:s0 + BT]
    else:
        pos = s0 + T.arange(0, BT)
    c = Cos[pos, 0:BHALF]  # tokens past the sequence's end (never stored) gather row 0 or zeros
    sn = Sin[pos, 0:BHALF]
    if INVERSE:
        sn = -sn
    if T.program_id(1) == 0:
        _rotate_heads(Q, QOut, b, s0, c, sn, BT, BHQ, BHALF)
    else:
        _rotate_heads(K, KOut, b, s0, c, sn, BT, BHK, BHALF)


def launch_config(head_dim: int, q_heads: int, k_heads: int, seq: int) -> dict:
    """BHALF: half a head rounded up to a power of 2; BH heads per step, at most 2048 elements per half (all of q's
    heads for Llama-like shapes: one step); BT tokens per program such that q's step holds about 2048 elements
    per half, at most ``seq`` rounded up to a power of 2 (and 64): at 4 warps a thread holds 16 elements of each
    half (two 16-byte loads of a 16-bit type), so each program keeps 8 KB (q) of loads in flight, issued together
    before any store."""
    bhalf = 1 << max(2, (head_dim // 2 - 1).bit_length())
    limit = max(1, 2048 // bhalf)

    def heads(n):
        return min(limit, 1 << max(0, (n - 1).bit_length()))

    bhq = heads(q_heads)
    bt = max(1, min(2048 // (bhq * bhalf), 1 << max(0, (seq - 1).bit_length()), 64))
    half = head_dim // 2
    return dict(BT=bt, BHQ=bhq, BHK=heads(k_heads), BHALF=bhalf, HALF_DIVISOR=min(8, half & -half), num_warps=4)


@functools.lru_cache(maxsize=256)
def _launch_config(head_dim: int, q_heads: int, k_heads: int, seq: int) -> dict:
    """``launch_config``, made once per shape: the ops' launches read it (never change it) on every call."""
    return launch_config(head_dim, q_heads, k_heads, seq)


def _check(q, k, cos, sin, positions) -> None:
    bad, wrong = arg_checks.ArgumentValueError, arg_checks.ArgumentError
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise wrong(f"rotary_embedding: {name} must be a tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.dim() != 4:
        raise bad(f"rotary_embedding: q and k must be (B, S, H, D), got q {tuple(q.shape)} and k "
                  f"{tuple(k.shape)}")
    if q.dtype not in DTYPES or k.dtype != q.dtype:
        raise wrong(f"rotary_embedding: q and k must share one dtype of float16, bfloat16 or float32, got "
                    f"{q.dtype} and {k.dtype}")
    batch, seq, _, dim = q.shape
    if k.shape[:2] != q.shape[:2] or k.shape[3] != dim:
        raise bad(f"rotary_embedding: k must be (B, S, Hkv, D) with q's B, S and D, got q {tuple(q.shape)} "
                  f"and k {tuple(k.shape)}")
    if dim % 2 or not 2 <= dim <= MAX_HEAD_DIM:
        raise bad(f"rotary_embedding: the head dim must be even and in 2..{MAX_HEAD_DIM}, got {dim}")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise bad(f"rotary_embedding: q and k must have a last stride of 1 (call .contiguous()), got "
                  f"strides {q.stride()} and {k.stride()}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32 or t.dim() != 2 or t.shape[1] != dim // 2 or t.shape[0] == 0:
            raise bad(f"rotary_embedding: {name} must be float32 (max_positions, {dim // 2}), got {t.dtype} "
                      f"{tuple(t.shape)}")
    if cos.shape != sin.shape:
        raise bad(f"rotary_embedding: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have one shape")
    if positions is None:
        if seq > cos.shape[0]:
            raise bad(f"rotary_embedding: {seq} positions but cos and sin have {cos.shape[0]} rows")
    elif not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64) \
            or positions.shape != (batch, seq):
        what = f"{positions.dtype} {tuple(positions.shape)}" if isinstance(positions, torch.Tensor) else \
            type(positions).__name__
        raise bad(f"rotary_embedding: positions must be an int32 or int64 tensor ({batch}, {seq}), got {what}")
    devices = {t.device for t in (q, k, cos, sin) + (() if positions is None else (positions,))}
    if len(devices) > 1:
        raise bad(f"rotary_embedding: all tensors must be on one device, got {sorted(map(str, devices))}")
    arg_checks.runs_on("rotary_embedding", "q", q, q.shape[0] * q.shape[1] > 0)


def _halves(t: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) as (B, S, H, 2, D/2): a view, the two halves of a head on their own axis."""
    batch, seq, heads, dim = t.shape
    return t.view(batch, seq, heads, 2, dim // 2)


def rotary_forward(q, k, cos, sin, positions=None, *, q_out=None, k_out=None, inverse: bool = False):
    """(q_out, k_out): q and k rotated, into ``q_out``/``k_out`` (fresh when None; q and k themselves for in
    place; any strides with a last stride of 1). ``inverse``: by -angle (the backward). Positions must lie in
    [0, max_positions): they are not checked on the host, which would synchronize."""
    _check(q, k, cos, sin, positions)
    q_out = torch.empty_like(q) if q_out is None else q_out
    k_out = torch.empty_like(k) if k_out is None else k_out
    batch, seq, q_heads, dim = q.shape
    if batch * seq == 0:
        return q_out, k_out
    config = _launch_config(dim, q_heads, k.shape[2], seq)
    positions_arg = cos if positions is None else positions  # a placeholder the kernel does not read
    grid = (batch * tilejit.cdiv(seq, config["BT"]), 2)  # q's programs, then k's
    rotary_kernel[grid](_halves(q), _halves(k), _halves(q_out), _halves(k_out), cos, sin, positions_arg,
                        POSITIONS=positions is not None, INVERSE=bool(inverse), **config)
    return q_out, k_out


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                     positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (B, S, Hq, D) and k (B, S, Hkv, D) (last stride 1, D even, float16/bfloat16/float32) by the
    angles of cos, sin (float32 (max_positions, D/2)) at ``positions`` (int32/int64 (B, S); None: 0 .. S-1 in
    every batch entry). Returns (q, k): q and k themselves, rotated in place, when no gradient is recorded (no
    grad mode, or neither requires grad); otherwise fresh tensors, differentiable in q and k (not in cos and
    sin), and q and k unchanged. Use the returned tensors."""
    _check(q, k, cos, sin, positions)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return _OPS.rotate(q, k, cos, sin, positions, False)
    _OPS.rotate_(q, k, cos, sin, positions)
    return q, k


def reference(q, k, cos, sin, positions=None):
    """The float64 definition (differentiable): (q, k) rotated, half-split."""
    seq = q.shape[1]
    positions = torch.arange(seq, device=q.device).expand(q.shape[0], seq) if positions is None else positions
    c = cos.double()[positions.long()][:, :, None, :]
    s = sin.double()[positions.long()][:, :, None, :]

    def rotate(x):
        x1, x2 = x.double().chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    return rotate(q), rotate(k)


def _rotate_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor | None, inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # checked again: rotary_embedding checked its own call, but the operator is also called directly
    return rotary_forward(q, k, cos, sin, positions, inverse=inverse)


def _rotate_in_place_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        positions: torch.Tensor | None) -> None:
    rotary_forward(q, k, cos, sin, positions, q_out=q, k_out=k)  # checked again, as _rotate_op


def _setup_context(ctx, inputs, output):
    _, _, cos, sin, positions, inverse = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.inverse = inverse


class _Operators:
    """The PyTorch operators of this module, in ``namespace``: ``rotary_embedding`` (functional (q, k);
    differentiable, its backward itself with ``inverse`` flipped) and ``rotary_embedding_`` (in place on q and
    k)."""

    def __init__(self, namespace: str):
        self.rotate = Operator(f"{namespace}::rotary_embedding", _rotate_op, fake=lambda q, k, cos, sin, positions,
                               inverse: (torch.empty_like(q), torch.empty_like(k)), backward=self._backward,
                               setup_context=_setup_context)
        self.rotate_ = Operator(f"{namespace}::rotary_embedding_", _rotate_in_place_op, mutates_args=("q", "k"))

    def _backward(self, ctx, grad_q, grad_k):
        cos, sin, positions = ctx.saved_tensors
        grad_q, grad_k = (g if g.stride(-1) == 1 else g.contiguous() for g in (grad_q, grad_k))
        dq, dk = self.rotate(grad_q, grad_k, cos, sin, positions, not ctx.inverse)
        return dq, dk, None, None, None, None


_OPS = _Operators(namespace(__name__, "tilejit.ops.rotary"))
