"""Embedding lookup, forward and backward, written in tilejit's language.

Forward (``embedding_fwd``): a program copies BM token rows of BD columns, ``Out[i] = W[tokens[i]]`` (a gather
of whole rows). Backward (``embedding_bwd``): a program adds BM rows of dOut into dW's rows ``tokens[i]`` with
float32 atomic adds (``T.atomic_add``, relaxed), so repeated tokens accumulate; a float16/bfloat16 weight's
gradient is summed in a float32 buffer and cast once. The order of the adds is not fixed, so dW of a repeated
token may differ in its last bits from run to run.

Token ids are not range-checked (that would cost a host sync): an id outside [0, V) reads a row of zeros and
adds to no row of dW.

``embedding(tokens, weight)`` is the PyTorch operator ``tilejit::embedding_fwd`` (backward
``tilejit::embedding_bwd``), differentiable in weight, usable under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import torch

import tilejit
import tilejit.language as T
from tilejit import knobs
from tilejit.errors import UsageTypeError, UsageValueError
from tilejit.ops.custom_ops import Operator, namespace

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TOKEN_DTYPES = (torch.int32, torch.int64)


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
