"""Sliding windows and logit softcaps of tilejit.ops.attention on the GPU: forward and backward against float64
autograd of the reference (scores written out: window, softcap, lengths), NaN-poisoned outputs, ragged lengths,
GQA 1/4/8, bf16 and fp16, the default configs of the GPU; and torch.compile(fullgraph=True) of a function
calling it, forward and backward."""
from __future__ import annotations

import pytest
import torch

from attention_checks import check, check_grad, inputs
from tilejit.ops import fused_attention as attention

pytestmark = pytest.mark.gpu

WINDOWS = [(128, 0), (256, 256), (-1, 64), (0, 0), (1000, 3)]


def _reference_grads(q, k, v, do, causal, window, softcap, lens=None):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = attention.reference(q64, k64, v64, causal, lens=lens, window=window, softcap=softcap)
    out.backward(do.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{l}_{r}" for l, r in WINDOWS])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq, dim, group", [(1000, 128, 4), (777, 64, 1), (300, 128, 8)])
def test_window_forward(seq, dim, group, causal, window, dtype):
    q, k, v = inputs(2, 8, seq, dim, group, dtype=dtype, seed=seq + dim + causal + window[0])
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, window=window, out=out)
    check(out, attention.reference(q, k, v, causal, window=window))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("softcap", [30.0, 50.0, 2.0])
@pytest.mark.parametrize("window", [None, (128, 0), (256, 256)])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_forward(causal, window, softcap, dtype):
    """Scores scaled up (q times 4) so that the cap bites at 30 and 50 too."""
    q, k, v = inputs(1, 8, 1000, 128, 4, dtype=dtype, seed=int(softcap) + causal)
    q = (q * 4).to(dtype)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, window=window, softcap=softcap, out=out)
    check(out, attention.reference(q, k, v, causal, window=window, softcap=softcap))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(128, 0), (-1, 64), (200, 100)])
def test_window_with_variable_lengths(causal, window):
    """Every row, padding included, is written: a padding row that sees no key gives 0 (as the reference)."""
    q, k, v = inputs(3, 8, 600, 64, 4, seed=7 + causal)
    lens = torch.tensor([600, 1, 333], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, window=window, lens=lens, out=out)
    check(out, attention.reference(q, k, v, causal, lens=lens, window=window))


BWD_CASES = [(False, (128, 0), None, 4, 1000), (True, (256, 256), None, 1, 777), (False, (-1, 64), 30.0, 8, 1000),
             (True, None, 50.0, 4, 513), (False, None, 30.0, 1, 1000), (True, (128, 0), 50.0, 8, 300),
             (False, (0, 0), None, 4, 129)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal, window, softcap, group, seq", BWD_CASES,
                         ids=[f"c{int(c)}-w{w}-s{s}-g{g}-S{n}" for c, w, s, g, n in BWD_CASES])
@pytest.mark.parametrize("dim", [64, 128])
def test_backward(dim, causal, window, softcap, group, seq, dtype):
    """attention_forward / attention_backward into NaN-poisoned tensors against float64 autograd, and the same
    through the operator's autograd."""
    q, k, v = inputs(2, 8, seq, dim, group, dtype=dtype, seed=seq + dim + group)
    do = torch.randn_like(q)
    ref = _reference_grads(q, k, v, do, causal, window, softcap)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device="cuda")
    attention.attention_forward(q, k, v, causal=causal, window=window, softcap=softcap, out=out, lse=lse)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    attention.attention_backward(do, q, k, v, out, lse, causal=causal, window=window, softcap=softcap,
                                 dq=grads[0], dk=grads[1], dv=grads[2])
    check(out, ref[0])
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        check_grad(got, want, name)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    attention.attention(*leaves, causal=causal, window=window, softcap=softcap).backward(do)
    for name, t, want in zip(("dq", "dk", "dv"), leaves, ref[1:]):
        check_grad(t.grad, want, name)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_with_window_and_variable_lengths(causal):
    q, k, v = inputs(3, 8, 500, 128, 4, seed=31 + causal)
    lens = torch.tensor([500, 7, 257], dtype=torch.int32, device="cuda")
    do = torch.randn_like(q)
    ref = _reference_grads(q, k, v, do, causal, (96, 32), 30.0, lens=lens)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention.attention(*leaves, causal=causal, window=(96, 32), softcap=30.0, lens=lens)
    out.backward(do)
    check(out.detach(), ref[0])
    for name, t, want in zip(("dq", "dk", "dv"), leaves, ref[1:]):
        check_grad(t.grad, want, name)


def test_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) (inductor) of a function around attention: no graph break, the same output
    and gradients as eager."""
    q, k, v = inputs(2, 8, 1000, 128, 4, seed=5)

    def model(q, k, v):
        return attention.attention(q * 0.5, k, v, causal=True, window=(256, 0), softcap=30.0).float().sum(-1)

    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-3, atol=1e-3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).sum().backward()
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    model(*eager).sum().backward()
    for a, b in zip(leaves, eager):
        assert not torch.isnan(a.grad).any()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-2, atol=1e-2)
