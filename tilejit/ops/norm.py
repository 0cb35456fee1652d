"""RMSNorm, optionally fused with the residual add before it, forward and backward, written in tilejit's language.

Forward (``rms_norm_fwd``): one program normalizes BM whole rows held in registers (the row, up to
``MAX_DIM`` = 8192 elements, rounded up to a power of 2 ``BD``; columns past D read as 0 and add nothing to the sum
of squares), so every element is read once and written once: ``y = s * rsqrt(mean(s^2) + eps) * w`` in float32,
stored in x's dtype. With a residual, ``s = x + residual`` is rounded to x's dtype and stored (the updated
residual stream), and the normalization reads that rounded ``s``, which is what the backward sees. The row's
``rstd`` (float32) is saved for the backward.

Backward (``rms_norm_bwd``): with ``xhat = s * rstd`` and ``g = dy * w``, ``ds = rstd * (g - xhat * mean(g *
xhat)) [+ the gradient of the returned s]``, which is the gradient of x and of the residual both. A fixed number
of programs (a couple per SM) walks the rows with a stride and keeps its partial ``sum(dy * xhat)`` over its rows
in registers; each writes it to its own row of a float32 (programs x D) buffer, which ``column_sums`` reduces to
``dweight``. No atomics: dweight is the same at every run.

``rms_norm(x, weight, eps=..., residual=...)`` is the PyTorch operator ``tilejit::rms_norm_fwd`` (backward
``tilejit::rms_norm_bwd``), differentiable in x, residual and weight, usable under ``torch.compile(fullgraph=True)``;
``reference`` is the float64 definition the tests check against.
"""
from __future__ import annotations

import torch

import tilejit
import tilejit.language as T
from tilejit.ops.custom_ops import namespace

#: The longest row the kernels take: one row lives in registers (8192 float32 over 16 warps: 16 per thread).
MAX_DIM = 8192
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@tilejit.kernel
def rms_norm_fwd(X, R, W, Y, S, Rstd, eps, BM: T.constexpr, BD: T.constexpr, RESIDUAL: T.constexpr):
    """Y (and, ``RESIDUAL``, S = X + R) of rows m0 .. m0 + BM; their rstd into Rstd."""
    D = X.shape[1]
    m0 = T.program_id(0) * BM
    x = X[m0:m0 + BM, 0:BD].to(T.float32)
    if RESIDUAL:
        s = (x + R[m0:m0 + BM, 0:BD].to(T.float32)).to(S.dtype)  # rounded as stored: the backward reads it
        S[m0:m0 + BM, 0:BD] = s
        x = s.to(T.float32)
    rstd = T.rsqrt(T.sum(x * x, 1) / D + eps)
    Rstd[m0:m0 + BM] = rstd
    Y[m0:m0 + BM, 0:BD] = x * rstd[:, None] * W[0:BD].to(T.float32)[None, :]


@tilejit.kernel
def rms_norm_bwd(DY, DS, X, W, Rstd, DX, DWp, BM: T.constexpr, BD: T.constexpr, HAS_DS: T.constexpr):
    """DX of rows p * BM, (p + P) * BM, ... (P programs); this program's sum of dY * xhat over them into DWp[p].
    Padding rows and columns read dY = 0: they add nothing."""
    M = X.shape[0]
    D = X.shape[1]
    p = T.program_id(0)
    dw = T.zeros((BM, BD), T.float32)
    w = dw + W[0:BD].to(T.float32)[None, :]  # spread over the rows once (a broadcast goes through shared memory)
    for m0 in range(p * BM, M, T.num_programs(0) * BM):
        rstd = Rstd[m0:m0 + BM][:, None]
        xhat = X[m0:m0 + BM, 0:BD].to(T.float32) * rstd
        dy = DY[m0:m0 + BM, 0:BD].to(T.float32)
        g = dy * w
        dx = (g - xhat * (T.sum(g * xhat, 1) / D)[:, None]) * rstd
        if HAS_DS:
            dx = dx + DS[m0:m0 + BM, 0:BD].to(T.float32)
        DX[m0:m0 + BM, 0:BD] = dx
        dw += dy * xhat
    DWp[p, 0:BD] = T.sum(dw, 0)


@tilejit.kernel
def column_sums(P, Out, BM: T.constexpr, BN: T.constexpr):
    """Out[n] = the sum of P[:, n] (float32), for BN columns per program."""
    n0 = T.program_id(0) * BN
    total = T.zeros((BM, BN), T.float32)
    for m0 in range(0, P.shape[0], BM):
        total += P[m0:m0 + BM, n0:n0 + BN]
    Out[n0:n0 + BN] = T.sum(total, 0)


def launch_config(dim: int, backward: bool = False) -> dict:
    """BM rows of BD columns per program: BD the row rounded up to a power of 2; short rows packed so that a
    program moves at least 2048 elements (1024 in the backward); warps so that a thread holds 16 of a tile's
    elements (two 16-byte loads of a 16-bit type), 8 in the backward, which keeps more tiles live (x, dy, dweight's
    partial, the weight); at most 16 warps: an 8192-long row is 16 values a thread, in the backward too (whose
    tiles then take more than the 128 registers a thread of 16 warps has: it spills up to about 200 bytes a thread)."""
    per_program, per_thread = (1024, 8) if backward else (2048, 16)
    bd = 1 << max(4, (dim - 1).bit_length())
    bm = max(1, min(16, per_program // bd))
    return dict(BM=bm, BD=bd, num_warps=max(1, min(16, bm * bd // (32 * per_thread))))


def _programs_for_backward(rows: int, bm: int, device: torch.device) -> int:
    """Enough programs to fill the GPU twice (each keeps its dweight partial in registers); fewer rows, fewer."""
    blocks = tilejit.cdiv(rows, bm)
    if device.type != "cuda":
        return min(blocks, 4)
    return min(blocks, 2 * torch.cuda.get_device_properties(device).multi_processor_count)


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, eps: float) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError(f"rms_norm: x and weight must be tensors, got {type(x).__name__} and "
                        f"{type(weight).__name__}")
    if x.dtype not in DTYPES or weight.dtype not in DTYPES:
        raise TypeError(f"rms_norm: x and weight must be float16, bfloat16 or float32, got x {x.dtype} and weight "
                        f"{weight.dtype}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"rms_norm: x must have a non-empty last dim, got shape {tuple(x.shape)}")
    dim = x.shape[-1]
    if dim > MAX_DIM:
        raise ValueError(f"rms_norm: rows of at most {MAX_DIM} elements (one row lives in registers), got {dim}")
    if weight.shape != (dim,):
        raise ValueError(f"rms_norm: weight must have shape ({dim},) (x's last dim), got {tuple(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"rms_norm: weight is on {weight.device}, x on {x.device}: move them to one device")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"rms_norm: residual must be a tensor or None, got {type(residual).__name__}")
        if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
            raise ValueError(f"rms_norm: residual must have x's shape, dtype and device {tuple(x.shape)} {x.dtype} "
                             f"{x.device}, got {tuple(residual.shape)} {residual.dtype} {residual.device}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"rms_norm: eps must be a number >= 0, got {eps!r}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (rows, D) with unit-stride rows (a copy only where a view cannot do it)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                     residual: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                     residual_out: torch.Tensor | None = None, rstd: torch.Tensor | None = None):
    """(y, s, rstd) as tensors of x's shape (s: x + residual, or None without one) and float32 rows: the forward
    launch. ``out``, ``residual_out`` and ``rstd`` (float32, one per row) may be preallocated, contiguous."""
    _check(x, weight, residual, eps)
    dim = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    s = None
    if residual is not None:
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual_out is None else residual_out
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device) if rstd is None else rstd
    if rows == 0:
        return y, s, rstd
    config = launch_config(dim)
    y2 = y.view(rows, dim)
    rmsnorm_args = (x2, _rows(residual) if s is not None else x2, weight, y2, s.view(rows, dim) if s is not None
                    else y2, rstd, float(eps))
    rms_norm_fwd[(tilejit.cdiv(rows, config["BM"]),)](*rmsnorm_args, RESIDUAL=s is not None, **config)
    return y, s, rstd


def rms_norm_backward(dy: torch.Tensor, ds: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor,
                      rstd: torch.Tensor, *, dx: torch.Tensor | None = None, dweight: torch.Tensor | None = None):
    """(dx, dweight): ``x`` is what was normalized (the forward's s with a residual), ``ds`` the gradient of the
    returned s (or None), ``rstd`` the forward's. dx is also the residual's gradient. Outputs may be
    preallocated (contiguous)."""
    dim = x.shape[-1]
    x2 = _rows(x)
    rows = x2.shape[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if dx is None else dx
    dweight = torch.empty_like(weight) if dweight is None else dweight
    if rows == 0:
        return dx, dweight.zero_()
    config = launch_config(dim, backward=True)
    programs = _programs_for_backward(rows, config["BM"], x.device)
    partial = torch.empty(programs, dim, dtype=torch.float32, device=x.device)
    dy2 = _rows(dy)
    rms_norm_bwd[(programs,)](dy2, _rows(ds) if ds is not None else dy2, x2, weight, rstd, dx.view(rows, dim),
                              partial, HAS_DS=ds is not None, **config)
    column_sums[(tilejit.cdiv(dim, 128),)](partial, dweight, BM=16, BN=128, num_warps=4)
    return dx, dweight


def rms_norm(x: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` over the last dim of ``x`` (..., D), float32 math, the result in
    x's dtype; D up to ``MAX_DIM``. With ``residual`` (x's shape and dtype): ``s = x + residual`` (rounded to x's
    dtype) and returns ``(rms_norm(s), s)``. x and weight: float16, bfloat16 or float32 (weight's may differ from
    x's). Differentiable in x, residual and weight; the PyTorch operator ``tilejit::rms_norm_fwd``."""
    _check(x, weight, residual, eps)
    y, s, _ = _OPS.forward(x, weight, residual, float(eps))
    return y if residual is None else (y, s)


def reference(x, weight, eps=1e-6, residual=None):
    """The float64 definition (differentiable): rms_norm of x (or of s = x + residual, then ``(y, s)``)."""
    x64 = x.double()
    s = x64 if residual is None else x64 + residual.double()
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return y if residual is None else (y, s)


def _fwd_op(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
            eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, s, rstd = rms_norm_forward(x, weight, eps, residual)
    return y, (s if s is not None else x.new_empty(0)), rstd


def _fwd_fake(x, weight, residual, eps):
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    s = torch.empty_like(x) if residual is not None else x.new_empty(0)
    return torch.empty_like(x), s, x.new_empty(rows, dtype=torch.float32)


def _bwd_op(dy: torch.Tensor, ds: torch.Tensor | None, x: torch.Tensor, weight: torch.Tensor,
            rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm_backward(dy, ds, x, weight, rstd)


def _fwd_setup_context(ctx, inputs, output):
    x, weight, residual, _ = inputs
    _, s, rstd = output
    ctx.residual = residual is not None
    ctx.save_for_backward(s if ctx.residual else x, weight, rstd)


class _Operators:
    """The PyTorch operators of this module, in ``namespace``: ``rms_norm_fwd`` ((y, s, rstd); s empty without a
    residual; differentiable) and ``rms_norm_bwd`` ((dx, dweight))."""

    def __init__(self, namespace: str):
        self.forward = torch.library.custom_op(f"{namespace}::rms_norm_fwd", mutates_args=())(_fwd_op)
        self.backward = torch.library.custom_op(f"{namespace}::rms_norm_bwd", mutates_args=())(_bwd_op)
        self.forward.register_fake(_fwd_fake)
        self.backward.register_fake(lambda dy, ds, x, weight, rstd: (torch.empty_like(x), torch.empty_like(weight)))
        self.forward.register_autograd(self._backward, setup_context=_fwd_setup_context)

    def _backward(self, ctx, grad_y, grad_s, grad_rstd):
        x, weight, rstd = ctx.saved_tensors
        grad_y = torch.zeros_like(x) if grad_y is None else grad_y
        dx, dweight = self.backward(grad_y, grad_s if ctx.residual else None, x, weight, rstd)
        return dx, dweight, (dx if ctx.residual else None), None


_OPS = _Operators(namespace(__name__, "tilejit.ops.norm"))
