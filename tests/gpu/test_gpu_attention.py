"""The attention example on the GPU against float64 SDPA: every config of its space, causal and not, ragged
sequence lengths, GQA and variable lengths; NaN-poisoned outputs. The backward against torch autograd of the
float64 reference: every backward config, ragged lengths up to 4097, fp16 and bf16, GQA, the base-2 LSE."""
from __future__ import annotations


import pytest
import torch

from attention_checks import check, check_grad, inputs, reference_grads
from tilejit.ops import fused_attention as attention

pytestmark = pytest.mark.gpu

CASES = [(dim, bm, bn, w) for dim, configs in attention.CONFIGS.items() for bm, bn, w in configs]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps", CASES, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CASES])
def test_every_config(dim, bm, bn, warps, causal):
    q, k, v = inputs(2, 4, 1000, dim, 2, seed=dim + bm + bn + causal)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=bm, BN=bn, num_warps=warps)
    check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [1, 17, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_lengths_and_dtypes(seq, causal, dtype):
    q, k, v = inputs(1, 2, seq, 128, 1, dtype=dtype, seed=seq)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out)
    check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_variable_lengths(causal):
    q, k, v = inputs(3, 4, 300, 64, 4, seed=5)
    lens = torch.tensor([300, 1, 129], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, lens=lens)
    check(out, attention.reference(q, k, v, causal, lens=lens), rows=lens.tolist())


def test_scores_with_large_magnitudes_stay_finite():
    """The online softmax rescales: scores of +-60 after scaling neither overflow nor lose the maximum row."""
    q, k, v = inputs(1, 2, 256, 64, 1, seed=9)
    q = (q * 30).to(q.dtype)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, out=out)
    check(out, attention.reference(q, k, v, False))


# ------------------------------------------------------------------------------------------------- backward

BWD_CASES = [(dim, "dkdv", c) for dim, spaces in attention.BWD_CONFIGS.items() for c in spaces["dkdv"]]
BWD_CASES += [(dim, "dq", c) for dim, spaces in attention.BWD_CONFIGS.items() for c in spaces["dq"]]


def _backward(q, k, v, do, causal, config=None):
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    attention.attention_forward(q, k, v, causal=causal, out=out, lse=lse)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    attention.attention_backward(do, q, k, v, out, lse, causal=causal, dq=grads[0], dk=grads[1], dv=grads[2],
                                 delta=torch.full(q.shape[:3], float("nan"), device=q.device), config=config)
    return out, lse, grads


def _check_backward(q, k, v, do, causal, config=None):
    out, lse, grads = _backward(q, k, v, do, causal, config)
    ref = reference_grads(attention.reference, q, k, v, do, causal)
    check(out, ref[0])
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        check_grad(got, want, name)
    return lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, kernel, config", BWD_CASES,
                         ids=[f"d{d}-{n}-{c[0]}x{c[1]}-w{c[2]}" for d, n, c in BWD_CASES])
def test_backward_every_config(dim, kernel, config, causal):
    """Each config of one backward kernel with the other kernel's default; 1000 rows (ragged), GQA 2."""
    q, k, v = inputs(2, 4, 1000, dim, 2, seed=dim + sum(config) + causal)
    do = torch.randn_like(q)
    bm, bn, warps = config
    _check_backward(q, k, v, do, causal, {kernel: dict(BM=bm, BN=bn, num_warps=warps)})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [17, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_ragged_lengths_and_dtypes(seq, causal, dtype):
    q, k, v = inputs(1, 2, seq, 128, 1, dtype=dtype, seed=seq + causal)
    do = torch.randn_like(q)
    lse = _check_backward(q, k, v, do, causal)
    scores = q.double() @ k.double().transpose(-1, -2) / 128 ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    # the stored log-sum-exp is base 2
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1) * 1.4426950408889634, rtol=1e-4,
                               atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_through_attention(causal):
    """attention() with inputs that require grad (the operator's autograd): GQA 4, head dim 64, 1000 rows."""
    q, k, v = (t.requires_grad_() for t in inputs(2, 8, 1000, 64, 4, seed=21 + causal))
    do = torch.randn_like(q)
    out = attention.attention(q, k, v, causal=causal)
    out.backward(do)
    ref = reference_grads(attention.reference, q, k, v, do, causal)
    check(out.detach(), ref[0])
    for name, t, want in zip(("dq", "dk", "dv"), (q, k, v), ref[1:]):
        check_grad(t.grad, want, name)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
def test_variable_lengths_backward(dim, causal):
    """Variable lengths through the operator's autograd (lens: a full one, a ragged one, one inside the first block):
    outputs and gradients of every row against float64 autograd of the reference (padding rows attend over the
    same keys); keys past a length get exactly zero gradients."""
    q, k, v = (t.requires_grad_() for t in inputs(3, 4, 1000, dim, 2, seed=31 + dim + causal))
    lens = torch.tensor([1000, 731, 5], dtype=torch.int32, device="cuda")
    do = torch.randn_like(q)
    out = attention.attention(q, k, v, causal=causal, lens=lens)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention.reference(q64, k64, v64, causal, lens=lens)
    ref.backward(do.double())
    check(out.detach(), ref.detach())
    for name, t, want in zip(("dq", "dk", "dv"), (q, k, v), (q64.grad, k64.grad, v64.grad)):
        check_grad(t.grad, want, name)
    for b, n in enumerate(lens.tolist()):
        assert (k.grad[b, :, n:] == 0).all() and (v.grad[b, :, n:] == 0).all()
