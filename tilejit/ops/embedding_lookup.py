"""Embedding lookup, forward and backward, written in tilejit's language.

Forward (``embedding_fwd``): a program copies BM token rows of BD columns, ``Out[i] = W[tokens[i]]`` (a gather
of whole rows).

Backward, two kernels:

- ``embedding_bwd`` (atomic): a program adds BM rows of dOut into dW's rows ``tokens[i]`` with float32 atomic
  adds (``T.atomic_add``, relaxed), so repeated tokens accumulate; a float16/bfloat16 weight's gradient is summed
  in a zeroed float32 buffer and cast once. The order of the adds is not fixed, so dW of a repeated token may
  differ in its last bits from run to run. Its cost is one float32 red per element of dOut, but the reds of one
  row serialize: with few rows (a byte-level vocabulary, V = 256) thousands of tokens land on each row.
- ``embedding_bwd_onehot`` (a GEMM): ``dW (V, D) = onehot(tokens)^T (V, N) @ dOut (N, D)``, on tensor cores. A
  program owns one (BV, BD) tile of dW; per k step it builds the (BV, BK) one-hot tile from BK token ids in
  registers (1.0 where the id is the row's, else 0.0, in dOut's dtype), multiplies it with the (BK, BD) tile of
  dOut and sums in float32; the tile is written once (no atomics, no zero fill), so dW is deterministic. Each
  product 1.0 x a 16-bit value is exact; the sums are float32, k step after k step in token order (within a
  step in the tensor cores' own order), where the atomic path sums float32 in arrival order: the two agree to
  float32 rounding, not bit for bit.

Which backward runs (``uses_onehot_gemm``): the GEMM for float16/bfloat16 dOut and V <= ``ONEHOT_MAX_VOCAB``
(1024), the atomic kernel otherwise. float32 dOut keeps the atomic path (the tensor cores would round it to
tf32). The bound: per element of dOut the GEMM does 2 x V flops (2 x V x N x D in all) where the atomic path
does one red, so the GEMM wins while 2 x V tensor-core flops take less time than one red. At V = 1024 that is
2048 flops a red: if the tensor cores ran at 600 TFLOP/s (an H100's dense 16-bit peak is ~990; these small
tiles, whose one-hot operand is rebuilt every k step, reach less) the GEMM wins unless reds run faster than
~300 G/s (1.2 TB/s of float32 adds), 15 times the 19 G/s of the contended V = 256 case (8192 x 1024 reds in
446 us on an H100). The bound is this estimate, not a measured crossover: only V = 256 was timed, and how fast
reds run with little contention (large V) was not measured.

Token ids are not range-checked (that would cost a host sync): an id outside [0, V) reads a row of zeros and
adds to no row of dW, on either backward.

``embedding(tokens, weight)`` is the PyTorch operator ``tilejit::embedding_fwd`` (backward
``tilejit::embedding_bwd``), differentiable in weight, usable under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import torch

import tilejit
import tilejit.language as T
from tilejit import knobs
from tilejit.errors import UsageTypeError, UsageValueError
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, namespace

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TOKEN_DTYPES = (torch.int32, torch.int64)
#: The largest vocabulary whose backward runs as the one-hot GEMM (the module docstring says why).
ONEHOT_MAX_VOCAB = 1024
ONEHOT_DTYPES = (torch.float16, torch.bfloat16)


@tilejit.kernel
def embedding_fwd(Tokens, W, Out, BM: T.constexpr, BD: T.constexpr):
    """Out[m0 .. m0 + BM, d0 .. d0 + BD] = W[Tokens[m0 .. m0 + BM], d0 .. d0 + BD]."""
    m0 = T.program_id(0) * BM
    d0 = T.program_id(1) * BD
    Out[m0:m0 + BM, d0:d0 + BD] = W[Tokens[m0:m0 + BM], d0:d0 + BD]


@tilejit.kernel
def embedding_bwd(Tokens, DOut, DW, BM: T.constexpr, BD: T.constexpr):
    """DW[Tokens[m], d0 .. d0 + BD] += DOut[m, d0 .. d0 + BD] for m in m0 .. m0 + BM (atomic: tokens repeat)."""
    m0 = T.program_id(0) * BM
    d0 = T.program_id(1) * BD
    rows = m0 + T.arange(0, BM)
    ids = T.where(rows < Tokens.shape[0], Tokens[m0:m0 + BM], -1)  # lanes past the end would read id 0: skip them
    T.atomic_add(DW[ids, d0:d0 + BD], DOut[m0:m0 + BM, d0:d0 + BD].to(T.float32), sem="relaxed")


@tilejit.kernel
def embedding_bwd_onehot(Tokens, DOut, DW, BV: T.constexpr, BD: T.constexpr, BK: T.constexpr):
    """DW[v0 .. v0 + BV, d0 .. d0 + BD] = onehot(Tokens)^T @ DOut[:, d0 .. d0 + BD], the one-hot tile built per
    k step in registers (row v of it is 1.0 where Tokens[k] == v0 + v); written once, no atomics."""
    v0 = T.program_id(0) * BV
    d0 = T.program_id(1) * BD
    n = Tokens.shape[0]
    rows = T.arange(0, BV)[:, None] + T.zeros((BV, BK), T.int32)  # broadcast once, outside the loop
    acc = T.zeros((BV, BD), T.float32)
    for k0 in T.range(0, n, BK):
        # the id's row in this tile, -1 for lanes past n and other tiles' ids (checked before the int32 cast,
        # which would wrap an int64 id onto a row)
        local = Tokens[k0:k0 + BK] - v0
        local = T.where((k0 + T.arange(0, BK) < n) & (local >= 0) & (local < BV), local, -1).to(T.int32)
        onehot = T.where(rows == local[None, :], 1.0, 0.0).to(DOut.dtype)
        acc = T.gemm(onehot, DOut[k0:k0 + BK, d0:d0 + BD], acc)
    DW[v0:v0 + BV, d0:d0 + BD] = acc


def uses_onehot_gemm(vocab: int, d_out_dtype: torch.dtype) -> bool:
    """Whether the backward runs as the one-hot GEMM: 16-bit dOut and at most ``ONEHOT_MAX_VOCAB`` rows."""
    return d_out_dtype in ONEHOT_DTYPES and vocab <= ONEHOT_MAX_VOCAB


def onehot_launch_config(vocab: int, dim: int) -> dict:
    """BV = 64 rows of dW (one wgmma slab), BK = 64 tokens a k step; BD the widest of 128, 64, 32 columns that
    still gives 128 programs (an H100 has 132 SMs and each program reads all N tokens), else 32."""
    if knobs.interpret():
        return dict(BV=16, BD=16, BK=8, num_warps=4)
    blocks = tilejit.cdiv(vocab, 64)
    bd = next((b for b in (128, 64) if blocks * tilejit.cdiv(dim, b) >= 128), 32)
    return dict(BV=64, BD=bd, BK=64, num_warps=4, num_stages=3)


def launch_config(dim: int) -> dict:
    """BD: the row rounded up to a power of 2, at most 512 columns; BM token rows so that a program moves 4096
    elements (at most 64 rows); 4 warps (8 to 32 elements a thread)."""
    if knobs.interpret():
        return dict(BM=8, BD=16, num_warps=4)
    bd = min(512, 1 << max(4, (dim - 1).bit_length()))
    return dict(BM=min(64, 4096 // bd), BD=bd, num_warps=4)


def _grid(tokens: int, dim: int, config: dict) -> tuple[int, int]:
    return tilejit.cdiv(tokens, config["BM"]), tilejit.cdiv(dim, config["BD"])


def _check(tokens, weight) -> None:
    if not isinstance(tokens, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise UsageTypeError(f"embedding: tokens and weight must be tensors, got {type(tokens).__name__} and "
                             f"{type(weight).__name__}")
    if tokens.dtype not in TOKEN_DTYPES:
        raise UsageTypeError(f"embedding: tokens are {tokens.dtype}; pass int32 or int64 token ids")
    if weight.dtype not in DTYPES:
        raise UsageTypeError(f"embedding: weight is {weight.dtype}; the kernels take float16, bfloat16 or float32")
    if weight.dim() != 2:
        raise UsageValueError(f"embedding: weight must be 2-D (num_embeddings, dim), got shape {tuple(weight.shape)}")
    if tokens.device != weight.device:
        raise UsageValueError(f"embedding: tokens are on {tokens.device} but weight is on {weight.device}")
    arg_checks.runs_on("embedding", "weight", weight, tokens.numel() > 0 and weight.shape[1] > 0)


def _forward(tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    flat = tokens.reshape(-1)
    out = weight.new_empty(*tokens.shape, weight.shape[1])
    if out.numel():
        config = launch_config(weight.shape[1])
        rows = out.view(flat.shape[0], weight.shape[1])
        embedding_fwd[_grid(flat.shape[0], weight.shape[1], config)](flat, weight, rows, **config)
    return out


def _backward(d_out: torch.Tensor, tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    dim = weight.shape[1]
    flat = tokens.reshape(-1)
    d_rows = d_out.reshape(-1, dim)
    d_rows = d_rows if d_rows.stride(-1) == 1 else d_rows.contiguous()
    if d_rows.numel() and uses_onehot_gemm(weight.shape[0], d_rows.dtype):
        d_weight = torch.empty_like(weight)  # every element is written once, in weight's dtype
        config = onehot_launch_config(*weight.shape)
        grid = (tilejit.cdiv(weight.shape[0], config["BV"]), tilejit.cdiv(dim, config["BD"]))
        embedding_bwd_onehot[grid](flat, d_rows, d_weight, **config)
        return d_weight
    d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    if d_rows.numel():
        config = launch_config(dim)
        embedding_bwd[_grid(flat.shape[0], dim, config)](flat, d_rows, d_weight, **config)
    return d_weight if weight.dtype == torch.float32 else d_weight.to(weight.dtype)


def embedding(tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The rows of ``weight`` (V, D) that ``tokens`` (any shape, int32 or int64) name: a tensor of shape
    ``tokens.shape + (D,)`` in weight's dtype, as ``torch.nn.functional.embedding``. Differentiable in weight
    (repeated tokens add their gradients). Ids outside [0, V) are not checked: they read zeros and add nothing
    to the gradient. The PyTorch operator ``tilejit::embedding_fwd``."""
    _check(tokens, weight)
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    return _OPS.forward(tokens.contiguous(), weight)


def _setup_context(ctx, inputs, output):
    tokens, weight = inputs
    ctx.save_for_backward(tokens, weight)


class _Operators:
    """The PyTorch operators of this module, in ``namespace``: ``embedding_fwd`` (differentiable in weight) and
    ``embedding_bwd`` (dweight)."""

    def __init__(self, ns: str):
        self.forward = Operator(f"{ns}::embedding_fwd", _forward, fake=lambda tokens, weight: weight.new_empty(
            *tokens.shape, weight.shape[1]), backward=self._grad, setup_context=_setup_context)
        self.backward = Operator(f"{ns}::embedding_bwd", _backward,
                                 fake=lambda d_out, tokens, weight: torch.empty_like(weight))

    def _grad(self, ctx, d_out):
        tokens, weight = ctx.saved_tensors
        return None, (self.backward(d_out, tokens, weight) if ctx.needs_input_grad[1] else None)


_OPS = _Operators(namespace(__name__, "tilejit.ops.embedding_lookup"))
