"""The attention example on the GPU against float64 SDPA: every config of its space, causal and not, ragged
sequence lengths, GQA and variable lengths; NaN-poisoned outputs. The backward against torch autograd of the
float64 reference: every backward config, ragged lengths up to 4097, fp16 and bf16, GQA, the base-2 LSE."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tilejit_examples_attention_gpu", ROOT / "examples" / "attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)

CASES = [(dim, bm, bn, w) for dim, configs in attention.CONFIGS.items() for bm, bn, w in configs]


def _inputs(batch, heads, seq, dim, group, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, heads // group, seq, dim, device="cuda", dtype=dtype)
    return q, k, v


def _check(out, ref, rows=None):
    assert not torch.isnan(out).any(), "some outputs were never written"
    if rows is not None:
        for b, n in enumerate(rows):
            torch.testing.assert_close(out[b, :, :n].double(), ref[b, :, :n], rtol=2e-2, atol=2e-2)
        return
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps", CASES, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CASES])
def test_every_config(dim, bm, bn, warps, causal):
    q, k, v = _inputs(2, 4, 1000, dim, 2, seed=dim + bm + bn + causal)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=bm, BN=bn, num_warps=warps)
    _check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [1, 17, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_lengths_and_dtypes(seq, causal, dtype):
    q, k, v = _inputs(1, 2, seq, 128, 1, dtype=dtype, seed=seq)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out)
    _check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_variable_lengths(causal):
    q, k, v = _inputs(3, 4, 300, 64, 4, seed=5)
    lens = torch.tensor([300, 1, 129], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, lens=lens)
    _check(out, attention.reference(q, k, v, causal, lens=lens), rows=lens.tolist())


def test_scores_with_large_magnitudes_stay_finite():
    """The online softmax rescales: scores of +-60 after scaling neither overflow nor lose the maximum row."""
    q, k, v = _inputs(1, 2, 256, 64, 1, seed=9)
    q = (q * 30).to(q.dtype)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, out=out)
    _check(out, attention.reference(q, k, v, False))


# ------------------------------------------------------------------------------------------------- backward

BWD_CASES = [(dim, "dkdv", c) for dim, spaces in attention.BWD_CONFIGS.items() for c in spaces["dkdv"]]
BWD_CASES += [(dim, "dq", c) for dim, spaces in attention.BWD_CONFIGS.items() for c in spaces["dq"]]


def _reference_grads(q, k, v, do, causal):
    """(out, dq, dk, dv) by torch autograd in float64 of the (bf16/fp16-rounded) inputs."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = attention.reference(q64, k64, v64, causal)
    out.backward(do.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def _check_grad(got, want, name):
    # The kernels round P^T, dS^T and dS to the inputs' 16-bit type before their products (as FlashAttention
    # does) and the results once more when stored: each a relative error up to 2^-8 (bf16) per term, summed
    # in float32. Gradients mix terms of both signs, so the bound is taken relative to the tensor's scale.
    assert not torch.isnan(got).any(), f"{name}: some gradients were never written"
    scale = want.abs().max().item()
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=1e-2 * scale, msg=lambda m: f"{name}: {m}")


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
    ref = _reference_grads(q, k, v, do, causal)
    _check(out, ref[0])
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        _check_grad(got, want, name)
    return lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, kernel, config", BWD_CASES,
                         ids=[f"d{d}-{n}-{c[0]}x{c[1]}-w{c[2]}" for d, n, c in BWD_CASES])
def test_backward_every_config(dim, kernel, config, causal):
    """Each config of one backward kernel with the other kernel's default; 1000 rows (ragged), GQA 2."""
    q, k, v = _inputs(2, 4, 1000, dim, 2, seed=dim + sum(config) + causal)
    do = torch.randn_like(q)
    bm, bn, warps = config
    _check_backward(q, k, v, do, causal, {kernel: dict(BM=bm, BN=bn, num_warps=warps)})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [17, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_ragged_lengths_and_dtypes(seq, causal, dtype):
    q, k, v = _inputs(1, 2, seq, 128, 1, dtype=dtype, seed=seq + causal)
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
    """attention() with inputs that require grad: AttentionFunction, GQA 4, head dim 64, 1000 rows."""
    q, k, v = (t.requires_grad_() for t in _inputs(2, 8, 1000, 64, 4, seed=21 + causal))
    do = torch.randn_like(q)
    out = attention.attention(q, k, v, causal=causal)
    out.backward(do)
    ref = _reference_grads(q, k, v, do, causal)
    _check(out.detach(), ref[0])
    for name, t, want in zip(("dq", "dk", "dv"), (q, k, v), ref[1:]):
        _check_grad(t.grad, want, name)
