"""What the attention GPU tests share: random inputs (GQA-shaped), the forward's output check and the backward's
float64 autograd reference and gradient check. Test modules that pin lowerings load their own copy of
tilejit/ops/fused_attention.py (so its kernels' launch caches are their own) and pass that module's ``reference``
where one is needed."""
from __future__ import annotations

import torch


def inputs(batch, heads, seq, dim, group, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=dtype)
    return q, k, v


def check(out, ref, rows=None):
    assert not torch.isnan(out).any(), "some outputs were never written"
    if rows is not None:
        for b, n in enumerate(rows):
            torch.testing.assert_close(out[b, :, :n].double(), ref[b, :, :n], rtol=2e-2, atol=2e-2)
        return
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


def reference_grads(reference, q, k, v, do, causal):
    """(out, dq, dk, dv) by torch autograd in float64 of the (bf16/fp16-rounded) inputs, through ``reference``
    (tilejit/ops/fused_attention.py's)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = reference(q64, k64, v64, causal)
    out.backward(do.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def check_grad(got, want, name):
    # The kernels round P^T, dS^T and dS to the inputs' 16-bit type before their products (as FlashAttention
    # does) and the results once more when stored: each a relative error up to 2^-8 (bf16) per term, summed
    # in float32. Gradients mix terms of both signs, so the bound is taken relative to the tensor's scale.
    assert not torch.isnan(got).any(), f"{name}: some gradients were never written"
    # A gradient that is zero in exact arithmetic (dQ where each query sees one key: softmax is 1 and dS = 0) is
    # rounding noise in the kernels: its floor is 1e-3 of a unit-scale gradient's.
    scale = max(want.abs().max().item(), 1e-3)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=1e-2 * scale, msg=lambda m: f"{name}: {m}")
