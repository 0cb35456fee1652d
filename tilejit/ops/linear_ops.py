"""GEMM ops of a transformer as PyTorch operators, forward and backward: ``linear``, ``swiglu_linear`` and
``linear_cross_entropy`` (the kernels are in ``linear_kernels``).

- ``linear(x, weight)`` = x @ weight.T (operator ``tilejit::linear_fwd``; backward ``tilejit::linear_bwd``:
  dX = dY @ W reads W as stored (N, K), dW = dY^T @ X reads dY transposed in place, no copies).
- ``swiglu_linear(x, w_gate, w_up)`` = silu(x @ w_gate.T) * (x @ w_up.T), both products in one kernel with
  silu * mul in its epilogue. Backward: dGate, dUp from one kernel, then dX = dGate @ Wg + dUp @ Wu (one kernel,
  two K loops), dWg = dGate^T @ X, dWu = dUp^T @ X. What the backward reads of the products is a choice
  (``recompute``): by default (False) the forward, when a gradient is wanted, also stores the two (M, F)
  products (two extra writes of the output's size: the cheapest in time, the backward runs 4 GEMMs);
  ``recompute=True`` keeps only x and the backward recomputes both products in the kernel that makes dGate and
  dUp (2 more GEMMs, no (M, F) activation kept: the cheapest in memory). Without a gradient (inference) the
  forward writes the output alone.
- ``linear_cross_entropy(h, weight, targets, ignore_index=-100, reduction="mean")``: cross-entropy of
  h @ weight.T against ``targets`` in chunks of rows: per chunk a GEMM makes the logits, ``cross_entropy_rows``
  their float32 log-sum-exp, loss and gradient (in place), and two GEMMs add dH = dlogits @ W and
  dW += dlogits^T @ h (float32) in the forward, as Liger Kernel does, so the full (N, V) logits never exist and
  the backward only scales. ``chunk_rows`` (default: about N * D / V rows, at least 64) bounds the logits alive.

fp16 and bf16 (float32 operands run as tf32 products), any leading dims for ``linear`` and ``swiglu_linear``;
on a GPU the GEMMs are autotuned per shape on their first call (tune before capturing a CUDA graph); under
``TILEJIT_INTERPRET=1`` they run on CPU tensors with fixed tiles.
"""
from __future__ import annotations

import math

import torch

from tilejit.errors import UsageTypeError, UsageValueError
import tilejit.ops.linear_kernels as kernels
import tilejit.ops.arg_checks as arg_checks
from tilejit.ops.custom_ops import Operator, namespace

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_operands(op: str, x: torch.Tensor, weights: dict[str, torch.Tensor]) -> None:
    """Typed errors for what the kernels cannot take: non-tensors, dtypes, ranks, devices, mismatched K."""
    for name, t in {"x": x, **weights}.items():
        if not isinstance(t, torch.Tensor):
            raise UsageTypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise UsageTypeError(f"{op}: {name} is {t.dtype}; the kernels take float16, bfloat16 or float32")
        if t.dtype != x.dtype:
            raise UsageTypeError(f"{op}: {name} is {t.dtype} but x is {x.dtype}; cast them to one dtype")
        if t.device != x.device:
            raise UsageValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
    if x.dim() < 1:
        raise UsageValueError(f"{op}: x must have at least one dim (..., K), got a 0-d tensor")
    first_name, first = next(iter(weights.items()))
    for name, w in weights.items():
        if w.dim() != 2 or w.shape[1] != x.shape[-1]:
            raise UsageValueError(f"{op}: {name} must be 2-D (N, K) with K = x.shape[-1] = {x.shape[-1]}, got "
                                  f"shape {tuple(w.shape)}")
        if w.shape != first.shape:
            raise UsageValueError(f"{op}: {name} {tuple(w.shape)} must have {first_name}'s shape {tuple(first.shape)}")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as a 2-D (rows, K) tensor with unit last stride (a view where one exists); K may be 0."""
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 2 and t.stride(-1) == 1 and t.stride(0) >= t.shape[1] else t.contiguous()


# -- linear --------------------------------------------------------------------------------------------------------

def _linear_fwd(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.shape[0], weight.shape[0])
    if out.numel():
        if x.shape[1] == 0:
            return out.zero_()
        kernels.matmul(x, weight, out, trans_b=True)
    return out


def _linear_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, need_dx: bool,
                need_dw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dy = _unit_last(dy)
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    dw = torch.empty_like(weight) if need_dw else weight.new_empty(0)
    if dy.numel() == 0:  # no rows or no outputs: the gradients are sums of nothing
        return dx.zero_(), dw.zero_()
    if need_dx and dx.numel():
        kernels.matmul(dy, weight, dx)                 # (M, N) @ (N, K)
    if need_dw and dw.numel():
        kernels.matmul(dy, x, dw, trans_a=True)        # (M, N)^T @ (M, K)
    return dx, dw


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T for x (..., K) and weight (N, K): the operator ``tilejit::linear_fwd``, differentiable."""
    _check_operands("linear", x, {"weight": weight})
    arg_checks.runs_on("linear", "x", x, x.numel() > 0 and weight.shape[0] > 0)  # (K = 0: zeros, no launch)
    out = _OPS.linear(_rows(x), _unit_last(weight))
    return out.reshape(*x.shape[:-1], weight.shape[0])


# -- swiglu_linear -------------------------------------------------------------------------------------------------

def _swiglu_fwd(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                save_products: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, features = x.shape[0], w_gate.shape[0]
    out = x.new_empty(rows, features)
    gate = x.new_empty(rows, features) if save_products else x.new_empty(0)
    up = x.new_empty(rows, features) if save_products else x.new_empty(0)
    if out.numel():
        if x.shape[1] == 0:
            return out.zero_(), gate.zero_(), up.zero_()
        kernels.swiglu_forward(x, w_gate, w_up, out, gate if save_products else None, up if save_products else None)
    return out, gate, up


def _swiglu_bwd(d_out: torch.Tensor, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                gate: torch.Tensor, up: torch.Tensor, need_dx: bool,
                need_dw: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d_out = _unit_last(d_out)
    dx = torch.empty_like(x) if need_dx else x.new_empty(0)
    dwg = torch.empty_like(w_gate) if need_dw else w_gate.new_empty(0)
    dwu = torch.empty_like(w_up) if need_dw else w_up.new_empty(0)
    if d_out.numel() == 0 or x.shape[1] == 0:
        return dx.zero_(), dwg.zero_(), dwu.zero_()
    d_gate, d_up = torch.empty_like(d_out), torch.empty_like(d_out)
    saved = gate.numel() > 0
    kernels.swiglu_backward_gates(x, w_gate, w_up, gate if saved else None, up if saved else None, d_out, d_gate,
                                  d_up)
    if need_dx:
        kernels.matmul(d_gate, w_gate, dx, a2=d_up, b2=w_up)   # dGate @ Wg + dUp @ Wu
    if need_dw:
        kernels.matmul(d_gate, x, dwg, trans_a=True)
        kernels.matmul(d_up, x, dwu, trans_a=True)
    return dx, dwg, dwu


def swiglu_linear(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, *,
                  recompute: bool = False) -> torch.Tensor:
    """silu(x @ w_gate.T) * (x @ w_up.T) for x (..., D) and weights (F, D), one fused kernel: the operator
    ``tilejit::swiglu_fwd``, differentiable in x, w_gate and w_up. ``recompute=True``: the backward recomputes
    the two (M, F) products instead of the forward storing them (less memory, 2 more GEMMs)."""
    _check_operands("swiglu_linear", x, {"w_gate": w_gate, "w_up": w_up})
    arg_checks.runs_on("swiglu_linear", "x", x, x.numel() > 0 and w_gate.shape[0] > 0)
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or w_gate.requires_grad or w_up.requires_grad)
    out = _OPS.swiglu(_rows(x), _unit_last(w_gate), _unit_last(w_up), wants_grad and not recompute)[0]
    return out.reshape(*x.shape[:-1], w_gate.shape[0])


# -- linear_cross_entropy ------------------------------------------------------------------------------------------

def default_chunk_rows(rows: int, dim: int, vocab: int) -> int:
    """Rows per chunk: the chunk's logits at most about the size of h (rows * dim elements), in whole 128-row
    tiles, at least 64 rows."""
    return max(64, rows * dim // max(vocab, 1) // 128 * 128)


def _lce_fwd(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str,
             chunk_rows: int, with_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, vocab = h.shape[0], weight.shape[0]
    loss_rows = torch.zeros(rows, dtype=torch.float32, device=h.device)
    counted = (targets != ignore_index).sum().to(torch.float32)
    scale = (1.0 / counted if reduction == "mean" else torch.ones((), dtype=torch.float32, device=h.device)).reshape(1)
    dh = torch.zeros_like(h) if with_grad else h.new_empty(0)
    dw = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if with_grad else h.new_empty(0)
    step = max(1, min(rows, chunk_rows))
    logits_buffer = h.new_empty(step, vocab)
    for start in range(0, rows if vocab else 0, step):
        stop = min(rows, start + step)
        h_chunk = h[start:stop]
        logits = logits_buffer[:stop - start]
        if h.shape[1]:
            kernels.matmul(h_chunk, weight, logits, trans_b=True)
        else:
            logits.zero_()
        kernels.cross_entropy_chunk(logits, targets[start:stop], loss_rows[start:stop], scale, ignore_index)
        if with_grad and h.shape[1]:
            kernels.matmul(logits, weight, dh[start:stop])                           # dlogits @ W
            kernels.matmul(logits, h_chunk, dw, trans_a=True, accumulate=True)       # dW += dlogits^T @ h
    loss = loss_rows.sum() * scale[0]
    return loss, dh, dw.to(weight.dtype) if with_grad else dw


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
                         reduction: str = "mean", chunk_rows: int | None = None) -> torch.Tensor:
    """Cross-entropy of the logits h @ weight.T (never materialized whole) against ``targets``: a float32 scalar,
    the mean over rows whose target is not ``ignore_index`` (``reduction="mean"``; NaN when there are none, as
    torch) or their sum (``"sum"``). h (N, D), weight (V, D), targets int64 (N,) in [0, V) or ``ignore_index``
    (not checked: that would cost a host sync). The operator ``tilejit::linear_cross_entropy``, differentiable in
    h and weight: the gradients are computed in the forward (``chunk_rows`` rows of logits at a time)."""
    _check_operands("linear_cross_entropy", h, {"weight": weight})
    if h.dim() != 2:
        raise UsageValueError(f"linear_cross_entropy: h must be (N, D), got shape {tuple(h.shape)}")
    if not isinstance(targets, torch.Tensor) or targets.dtype != torch.int64 or targets.shape != h.shape[:1]:
        got = f"{targets.dtype} {tuple(targets.shape)}" if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise UsageTypeError(f"linear_cross_entropy: targets must be an int64 tensor of shape ({h.shape[0]},), "
                             f"got {got}")
    if targets.device != h.device:
        raise UsageValueError(f"linear_cross_entropy: targets are on {targets.device} but h is on {h.device}")
    if reduction not in ("mean", "sum"):
        raise UsageValueError(f"linear_cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise UsageTypeError(f"linear_cross_entropy: ignore_index must be an int, got {ignore_index!r}")
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(h.shape[0], h.shape[1], weight.shape[0])
    elif isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise UsageValueError(f"linear_cross_entropy: chunk_rows must be a positive int, got {chunk_rows!r}")
    # (the row kernel runs for every row of a non-empty vocabulary, D = 0 included)
    arg_checks.runs_on("linear_cross_entropy", "h", h, h.shape[0] > 0 and weight.shape[0] > 0)
    with_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    return _OPS.cross_entropy(_unit_last(h), _unit_last(weight), targets.contiguous(), ignore_index, reduction,
                              chunk_rows, with_grad)[0]


# -- the operators -------------------------------------------------------------------------------------------------

class _Operators:
    """This module's PyTorch operators in ``namespace``, each with its fake (shape) function and autograd."""

    def __init__(self, ns: str):
        self.linear = Operator(f"{ns}::linear_fwd", _linear_fwd, fake=lambda x, w: x.new_empty(x.shape[0], w.shape[0]),
                               backward=self._linear_grad, setup_context=_save_inputs)
        self.linear_bwd = Operator(f"{ns}::linear_bwd", _linear_bwd, fake=lambda dy, x, w, need_dx, need_dw: (
            torch.empty_like(x) if need_dx else x.new_empty(0), torch.empty_like(w) if need_dw else w.new_empty(0)))
        self.swiglu = Operator(f"{ns}::swiglu_fwd", _swiglu_fwd, fake=_swiglu_fake, backward=self._swiglu_grad,
                               setup_context=_swiglu_setup, materialize_grads=False)
        self.swiglu_bwd = Operator(f"{ns}::swiglu_bwd", _swiglu_bwd, fake=lambda d_out, x, wg, wu, g, u, need_dx,
                                   need_dw: (torch.empty_like(x) if need_dx else x.new_empty(0),
                                             torch.empty_like(wg) if need_dw else wg.new_empty(0),
                                             torch.empty_like(wu) if need_dw else wu.new_empty(0)))
        self.cross_entropy = Operator(f"{ns}::linear_cross_entropy", _lce_fwd, fake=_lce_fake, backward=_lce_grad,
                                      setup_context=_lce_setup, materialize_grads=False)

    def _linear_grad(self, ctx, d_out):
        x, weight = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[:2]
        dx, dw = self.linear_bwd(d_out, x, weight, need_dx, need_dw)
        return (dx if need_dx else None), (dw if need_dw else None)

    def _swiglu_grad(self, ctx, d_out, _d_gate, _d_up):
        if d_out is None:  # only the saved products were used (their gradients are not taken)
            return None, None, None, None
        x, w_gate, w_up, gate, up = ctx.saved_tensors
        need_dx = ctx.needs_input_grad[0]
        need_dw = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        dx, dwg, dwu = self.swiglu_bwd(d_out, x, w_gate, w_up, gate, up, need_dx, need_dw)
        return (dx if need_dx else None), (dwg if ctx.needs_input_grad[1] else None), \
            (dwu if ctx.needs_input_grad[2] else None), None


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_fake(x, w_gate, w_up, save_products):
    shape = (x.shape[0], w_gate.shape[0]) if save_products else (0,)
    return x.new_empty(x.shape[0], w_gate.shape[0]), x.new_empty(shape), x.new_empty(shape)


def _swiglu_setup(ctx, inputs, output):
    x, w_gate, w_up, _ = inputs
    _, gate, up = output
    ctx.save_for_backward(x, w_gate, w_up, gate, up)


def _lce_fake(h, weight, targets, ignore_index, reduction, chunk_rows, with_grad):
    dh = torch.empty_like(h) if with_grad else h.new_empty(0)
    dw = torch.empty_like(weight) if with_grad else h.new_empty(0)
    return h.new_empty((), dtype=torch.float32), dh, dw


def _lce_setup(ctx, inputs, output):
    _, dh, dw = output
    ctx.with_grad = inputs[-1]
    ctx.save_for_backward(dh, dw)


def _lce_grad(ctx, d_loss, _d_dh, _d_dw):
    if not ctx.with_grad:
        raise RuntimeError("linear_cross_entropy ran without gradients (with_grad=False), so it has no backward: "
                           "call tilejit.ops.linear_cross_entropy with h or weight requiring grad")
    if d_loss is None:  # the loss was not used (the gradients it holds are not taken)
        return (None,) * 7
    dh, dw = ctx.saved_tensors
    need_dh, need_dw = ctx.needs_input_grad[:2]
    return ((dh * d_loss).to(dh.dtype) if need_dh else None), ((dw * d_loss).to(dw.dtype) if need_dw else None), \
        None, None, None, None, None


_OPS = _Operators(namespace(__name__, "tilejit.ops.linear_ops"))
