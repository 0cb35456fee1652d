"""Layer normalization, forward and backward, written in the language.

Forward, per row of X (M x N): ``mean``, ``rstd = 1 / sqrt(var + eps)`` and ``Y = (X - mean) * rstd * W + B``;
``mean`` and ``rstd`` are saved for the backward. Each program owns BM rows and walks the columns in BN-wide
blocks three times (the sum, the centred sum of squares, the output), so any N works with a fixed tile.

Backward, with ``xhat = (x - mean) * rstd`` and ``g = W * dY``:

* ``dX = (g - xhat * mean(g * xhat) - mean(g)) * rstd`` per row (the row means in a first walk over the
  columns, dX in a second);
* ``dW = sum over rows of dY * xhat`` and ``dB = sum over rows of dY``: each program writes the column sums of
  its own BM rows to a row of a (programs x N) float32 buffer, and a second kernel sums that buffer's rows.
  Two kernels and no atomics, so dW and dB come out the same at every run.

Arithmetic is float32 (float64 for float64 tensors); Y and dX take X's dtype, dW and dB W's.

With a CUDA GPU it runs bf16 and float32 on a 1000 x 3000 problem; without one it runs through the IR
interpreter (TILEJIT_INTERPRET=1) on a small ragged float64 one. Both are checked against torch autograd in
float64; the exit status is 1 if any result is off.

    python examples/layer_norm.py
"""
from __future__ import annotations

import os
import sys

import torch

try:
    import tilejit
except ImportError:  # run from a source checkout without installing: use the repository's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    import tilejit
import tilejit.language as T


@tilejit.kernel
def layer_norm_fwd(X, W, B, Y, Mean, Rstd, eps, BM: T.constexpr, BN: T.constexpr):
    CT = T.float64 if X.dtype == T.float64 else T.float32  # the compute dtype
    N = X.shape[1]
    m0 = T.program_id(0) * BM
    # the row sums (padding columns read as 0)
    total = T.zeros((BM, BN), CT)
    for n0 in range(0, N, BN):
        total += X[m0:m0 + BM, n0:n0 + BN].to(CT)
    mean = T.sum(total, 1) / N
    # the centred sum of squares: padding columns would contribute mean^2, so they are masked
    total = T.zeros((BM, BN), CT)
    for n0 in range(0, N, BN):
        inside = (n0 + T.arange(0, BN))[None, :] < N
        d = T.where(inside, X[m0:m0 + BM, n0:n0 + BN].to(CT) - mean[:, None], 0.0)
        total += d * d
    rstd = T.rsqrt(T.sum(total, 1) / N + eps)
    Mean[m0:m0 + BM] = mean
    Rstd[m0:m0 + BM] = rstd
    for n0 in range(0, N, BN):
        xhat = (X[m0:m0 + BM, n0:n0 + BN].to(CT) - mean[:, None]) * rstd[:, None]
        Y[m0:m0 + BM, n0:n0 + BN] = xhat * W[n0:n0 + BN].to(CT)[None, :] + B[n0:n0 + BN].to(CT)[None, :]


@tilejit.kernel
def layer_norm_bwd_dx(X, DY, W, Mean, Rstd, DX, DWp, DBp, BM: T.constexpr, BN: T.constexpr):
    """dX of BM rows; their column sums of dY * xhat and dY into row ``program_id(0)`` of DWp and DBp."""
    CT = T.float64 if X.dtype == T.float64 else T.float32
    N = X.shape[1]
    p = T.program_id(0)
    m0 = p * BM
    mean = Mean[m0:m0 + BM].to(CT)[:, None]
    rstd = Rstd[m0:m0 + BM].to(CT)[:, None]
    # row means of g * xhat and of g (padding columns have dY = W = 0, so g = 0 there)
    sum_gx = T.zeros((BM, BN), CT)
    sum_g = T.zeros((BM, BN), CT)
    for n0 in range(0, N, BN):
        xhat = (X[m0:m0 + BM, n0:n0 + BN].to(CT) - mean) * rstd
        g = DY[m0:m0 + BM, n0:n0 + BN].to(CT) * W[n0:n0 + BN].to(CT)[None, :]
        sum_gx += g * xhat
        sum_g += g
    c1 = (T.sum(sum_gx, 1) / N)[:, None]
    c2 = (T.sum(sum_g, 1) / N)[:, None]
    for n0 in range(0, N, BN):
        xhat = (X[m0:m0 + BM, n0:n0 + BN].to(CT) - mean) * rstd
        dy = DY[m0:m0 + BM, n0:n0 + BN].to(CT)
        g = dy * W[n0:n0 + BN].to(CT)[None, :]
        DX[m0:m0 + BM, n0:n0 + BN] = (g - xhat * c1 - c2) * rstd
        # padding rows have dY = 0 (and mean = rstd = 0): they add nothing to the partial sums
        DWp[p, n0:n0 + BN] = T.sum(dy * xhat, 0)
        DBp[p, n0:n0 + BN] = T.sum(dy, 0)


@tilejit.kernel
def column_sums(P, Out, BM: T.constexpr, BN: T.constexpr):
    """Out[n] = sum over the rows of P[:, n], for BN columns per program."""
    CT = T.float64 if P.dtype == T.float64 else T.float32
    n0 = T.program_id(0) * BN
    total = T.zeros((BM, BN), CT)
    for m0 in range(0, P.shape[0], BM):
        total += P[m0:m0 + BM, n0:n0 + BN].to(CT)
    Out[n0:n0 + BN] = T.sum(total, 0)


def _tiles(n: int) -> tuple[int, int]:
    """(BM, BN): 4 rows per program, a column block of N rounded up to a power of 2, at most 512."""
    bn = min(512, 1 << max(4, (n - 1).bit_length()))
    return 4, bn


def layer_norm_forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5):
    """(y, mean, rstd) of the rows of the 2-D ``x``; mean and rstd are float32 (float64 for float64 ``x``)."""
    M, N = x.shape
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.empty_like(x)
    mean = torch.empty(M, device=x.device, dtype=stat)
    rstd = torch.empty(M, device=x.device, dtype=stat)
    BM, BN = _tiles(N)
    layer_norm_fwd[(tilejit.cdiv(M, BM),)](x, w, b, y, mean, rstd, eps, BM=BM, BN=BN)
    return y, mean, rstd


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor):
    """(dx, dw, db) from the forward's saved mean and rstd."""
    M, N = x.shape
    BM, BN = _tiles(N)
    programs = tilejit.cdiv(M, BM)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    dx = torch.empty_like(x)
    dw_partial = torch.empty(programs, N, device=x.device, dtype=acc)
    db_partial = torch.empty(programs, N, device=x.device, dtype=acc)
    layer_norm_bwd_dx[(programs,)](x, dy, w, mean, rstd, dx, dw_partial, db_partial, BM=BM, BN=BN)
    dw = torch.empty_like(w)
    db = torch.empty_like(w)
    for partial, out in ((dw_partial, dw), (db_partial, db)):
        column_sums[(tilejit.cdiv(N, 128),)](partial, out, BM=32, BN=128)
    return dx, dw, db


class LayerNorm(torch.autograd.Function):
    """``LayerNorm.apply(x, w, b, eps)``: the kernels above as an autograd function over the last dim."""

    @staticmethod
    def forward(ctx, x, w, b, eps=1e-5):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        y, mean, rstd = layer_norm_forward(x2, w, b, eps)
        ctx.save_for_backward(x2, w, mean, rstd)
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy.reshape(x2.shape).contiguous(), x2, w, mean, rstd)
        return dx.reshape(dy.shape), dw, db, None


def reference(x, w, b, dy, eps=1e-5):
    """(y, dx, dw, db) from torch autograd in float64."""
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = torch.nn.functional.layer_norm(x64, (x.shape[-1],), w64, b64, eps)
    y.backward(dy.double())
    return y.detach(), x64.grad, w64.grad, b64.grad


def main() -> int:
    if torch.cuda.is_available():
        device, cases = "cuda", [((1000, 3000), torch.bfloat16), ((1000, 3000), torch.float32)]
    else:
        os.environ["TILEJIT_INTERPRET"] = "1"
        device, cases = "cpu", [((37, 300), torch.float64)]
    ok = True
    for (M, N), dtype in cases:
        x = torch.randn(M, N, device=device, dtype=dtype) * 2 + 0.5
        w = torch.randn(N, device=device, dtype=dtype)
        b = torch.randn(N, device=device, dtype=dtype)
        dy = torch.randn(M, N, device=device, dtype=dtype)
        xg = x.clone().requires_grad_()
        wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
        y = LayerNorm.apply(xg, wg, bg, 1e-5)
        y.backward(dy)
        expected = reference(x, w, b, dy)
        errors = [(got.double() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                  for got, ref in zip((y, xg.grad, wg.grad, bg.grad), expected)]
        tol = {torch.bfloat16: 2e-2, torch.float32: 1e-4, torch.float64: 1e-10}[dtype]
        good = all(e <= tol for e in errors)
        ok &= good
        print(f"layer norm {M}x{N} {str(dtype)[6:]} on {device}: relative max errors y {errors[0]:.1e}, "
              f"dx {errors[1]:.1e}, dw {errors[2]:.1e}, db {errors[3]:.1e} ({'ok' if good else 'WRONG'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
