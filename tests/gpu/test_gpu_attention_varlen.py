"""tilejit.ops.attention_varlen on the GPU: packed ragged batches (lengths 0 and 1, not multiples of the tiles)
against float64 autograd of its reference, forward into NaN-poisoned outputs and backward, GQA 1/4/8, causal
with fewer and more queries than keys, windows and softcaps, bf16 and fp16, head dims 64 and 128 with the default
configs of the GPU; the paged-cache forward at page sizes 1, 16 and 64; agreement with the padded attention() on
equal lengths; a NaN in one sequence reaching no other; torch.compile(fullgraph=True)."""
from __future__ import annotations

import math

import pytest
import torch

from attention_checks import check_grad
from tilejit.ops import attention, attention_varlen
from tilejit.ops import varlen_attention as varlen

pytestmark = pytest.mark.gpu


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def _packed(len_q, len_k, heads, kv_heads, dim, dtype, seed):
    torch.manual_seed(seed)
    q = torch.randn(sum(len_q), heads, dim, device="cuda", dtype=dtype)
    k = torch.randn(sum(len_k), kv_heads, dim, device="cuda", dtype=dtype)
    v = torch.randn(sum(len_k), kv_heads, dim, device="cuda", dtype=dtype)
    return q, k, v


def _reference_grads(q, k, v, do, cu_q, cu_k, causal, window, softcap):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = varlen.reference(*leaves, cu_q, cu_k, causal, window=window, softcap=softcap)
    out.backward(do.double())
    return out.detach(), *(t.grad for t in leaves)


def _check(out, ref):
    assert not torch.isnan(out).any(), "some outputs were never written"
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


LENGTHS = [
    ([1000, 0, 1, 333, 129], [1000, 5, 1, 333, 129]),   # equal per sequence, with 0 queries and 1 token
    ([100, 7, 640, 1], [900, 7, 1300, 64]),              # fewer queries than keys (a cached prefix)
    ([512, 300], [200, 300]),                             # more queries than keys: causal rows with no key
]
# (causal, window, softcap, GQA group, dtype)
CASES = [(False, None, None, 1, torch.bfloat16), (True, None, None, 4, torch.bfloat16),
         (True, None, None, 8, torch.float16), (True, (128, -1), None, 8, torch.bfloat16),
         (False, (64, 32), None, 4, torch.float16), (False, None, 30.0, 1, torch.bfloat16),
         (True, (256, -1), 50.0, 4, torch.bfloat16)]


@pytest.mark.parametrize("causal, window, softcap, group, dtype", CASES,
                         ids=[f"c{int(c)}-w{w}-s{s}-g{g}-{str(t)[6:]}" for c, w, s, g, t in CASES])
@pytest.mark.parametrize("lengths", range(len(LENGTHS)))
@pytest.mark.parametrize("dim", [64, 128])
def test_forward_and_backward(dim, lengths, causal, window, softcap, group, dtype):
    """The forward into a NaN-poisoned output (rows of every sequence written), then dq, dk, dv through the
    operator's autograd, against float64 autograd; queries scaled up when capped so that the cap bites."""
    len_q, len_k = LENGTHS[lengths]
    q, k, v = _packed(len_q, len_k, 8, 8 // group, dim, dtype, seed=dim + lengths + group)
    if softcap:
        q = (q * 4).to(dtype)
    cu_q, cu_k = _cu(len_q), _cu(len_k)
    do = torch.randn_like(q)
    ref = _reference_grads(q, k, v, do, cu_q, cu_k, causal, window, softcap)
    out = torch.full_like(q, float("nan"))
    varlen._forward(q, k, v, cu_q, cu_k, None, max(len_q), max(len_k), causal, window, softcap,
                    1 / math.sqrt(dim), None, out)
    _check(out, ref[0])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention_varlen(*leaves, cu_q, cu_k, max(len_q), max(len_k), causal=causal, window=window,
                           softcap=softcap)
    _check(out.detach(), ref[0])
    out.backward(do)
    for name, t, want in zip(("dq", "dk", "dv"), leaves, ref[1:]):
        check_grad(t.grad, want, name)


def _paged(k, v, len_k, page_size):
    """k, v copied into a shuffled paged cache (spare pages of noise); unused table slots hold -1, except the
    first sequence's, which point at a page of another sequence."""
    pages_of = [-(-n // page_size) for n in len_k]
    num_pages = sum(pages_of) + 3
    order = torch.randperm(num_pages).tolist()
    k_cache = torch.randn(num_pages, page_size, *k.shape[1:], device="cuda", dtype=k.dtype)
    v_cache = torch.randn(num_pages, page_size, *v.shape[1:], device="cuda", dtype=v.dtype)
    table = torch.full((len(len_k), max(pages_of) + 2), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(len_k):
        for p in range(pages_of[b]):
            page, rows = order.pop(), min(page_size, n - p * page_size)
            table[b, p] = page
            k_cache[page, :rows] = k[start + p * page_size:start + p * page_size + rows]
            v_cache[page, :rows] = v[start + p * page_size:start + p * page_size + rows]
        start += n
    table[0, pages_of[0]:] = order.pop()
    return k_cache, v_cache, table.cuda()


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("causal, window, softcap, group", [(True, None, None, 8), (False, None, None, 1),
                                                            (True, (200, -1), 30.0, 4)])
@pytest.mark.parametrize("dim", [64, 128])
def test_paged_forward(dim, causal, window, softcap, group, page_size):
    """Prefill over a paged cache: query chunks shorter than their keys, a sequence without keys, one key."""
    len_q, len_k = [300, 5, 1, 129], [1100, 0, 1, 700]
    q, k, v = _packed(len_q, len_k, 8, 8 // group, dim, torch.bfloat16, seed=page_size + group)
    k_cache, v_cache, table = _paged(k, v, len_k, page_size)
    cu_q, cu_k = _cu(len_q), _cu(len_k)
    out = torch.full_like(q, float("nan"))
    varlen._forward(q, k_cache, v_cache, cu_q, cu_k, table, max(len_q), max(len_k), causal, window, softcap,
                    1 / math.sqrt(dim), None, out)
    _check(out, varlen.reference(q, k, v, cu_q, cu_k, causal, window=window, softcap=softcap))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
def test_equal_lengths_match_the_padded_attention(dim, causal):
    """B sequences of one length packed give what attention() gives on the (B, H, S, D) batch."""
    batch, heads, seq = 4, 16, 1024
    q, k, v = _packed([seq] * batch, [seq] * batch, heads, heads // 4, dim, torch.bfloat16, seed=dim + causal)
    cu = _cu([seq] * batch)
    out = attention_varlen(q, k, v, cu, cu, seq, seq, causal=causal)

    def padded(t):
        return t.view(batch, seq, t.shape[1], dim).transpose(1, 2)

    want = attention(padded(q), padded(k), padded(v), causal=causal)
    torch.testing.assert_close(padded(out), want, rtol=2e-2, atol=2e-2)


def test_a_nan_sequence_reaches_no_other():
    """The middle sequence's queries, keys, values and gradient NaN: the other sequences' outputs and gradients
    stay finite and right."""
    len_q, len_k = [333, 200, 129], [333, 517, 129]
    q, k, v = _packed(len_q, len_k, 8, 2, 128, torch.bfloat16, seed=3)
    cu_q, cu_k = _cu(len_q), _cu(len_k)
    do = torch.randn_like(q)
    ref = _reference_grads(q, k, v, do, cu_q, cu_k, True, None, None)
    bad = [t.clone() for t in (q, k, v, do)]
    for t, (lo, hi) in zip(bad, [(333, 533), (333, 850), (333, 850), (333, 533)]):
        t[lo:hi] = float("nan")
    leaves = [t.requires_grad_() for t in bad[:3]]
    out = attention_varlen(*leaves, cu_q, cu_k, 333, 517, causal=True)
    out.backward(bad[3])
    keep_q = torch.cat([torch.arange(0, 333), torch.arange(533, 662)]).cuda()
    keep_k = torch.cat([torch.arange(0, 333), torch.arange(850, 979)]).cuda()
    _check(out.detach()[keep_q], ref[0][keep_q])
    check_grad(leaves[0].grad[keep_q], ref[1][keep_q], "dq")
    check_grad(leaves[1].grad[keep_k], ref[2][keep_k], "dk")
    check_grad(leaves[2].grad[keep_k], ref[3][keep_k], "dv")


def test_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) (inductor) around attention_varlen: the eager output and gradients."""
    len_q, len_k = [300, 1, 700], [500, 1, 700]
    q, k, v = _packed(len_q, len_k, 8, 2, 128, torch.bfloat16, seed=5)
    cu_q, cu_k = _cu(len_q), _cu(len_k)

    def model(q, k, v):
        return attention_varlen(q * 0.5, k, v, cu_q, cu_k, 700, 700, causal=True, window=(256, -1),
                                softcap=30.0).float().sum(-1)

    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v), rtol=1e-3, atol=1e-3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).sum().backward()
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    model(*eager).sum().backward()
    for a, b in zip(leaves, eager):
        assert not torch.isnan(a.grad).any()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-2, atol=1e-2)
