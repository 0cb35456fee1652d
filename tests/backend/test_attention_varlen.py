"""tilejit.ops.attention_varlen (packed variable-length sequences, flash_attn_varlen_func's conventions): the
interpreter against a float64 reference over ragged lengths (0 and 1 included), GQA 1/4/8, causal with fewer and
more queries than keys (the bottom-right aligned diagonal), windows and softcaps, forward into NaN-poisoned
outputs and backward against float64 autograd; the paged-cache forward at page sizes 1, 16 and 64 with the pages
shuffled; the kernels compiling for sm_80, sm_90a and sm_100a; argument errors; the PyTorch operators."""
from __future__ import annotations

import math

import pytest
import torch

import tilejit
from attention_tiles import SMALL_ATTENTION_BWD, SMALL_ATTENTION_FWD
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import fused_attention
from tilejit.ops import varlen_attention as varlen

SMALL_FWD, SMALL_BWD = SMALL_ATTENTION_FWD, SMALL_ATTENTION_BWD


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    """The interpreter, with tiles small enough that the sequences span several blocks."""
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(varlen, "default_config", lambda dim, causal, hopper: dict(SMALL_FWD))
    monkeypatch.setattr(varlen, "default_bwd_config", lambda dim, hopper, sm80: {n: dict(c) for n, c in
                                                                                  SMALL_BWD.items()})


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def _packed(len_q, len_k, heads, kv_heads, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(len_q), heads, dim, generator=gen)
    k = torch.randn(sum(len_k), kv_heads, dim, generator=gen)
    v = torch.randn(sum(len_k), kv_heads, dim, generator=gen)
    return q, k, v, torch.randn(q.shape, generator=gen)


def _row_by_row(q, k, v, len_q, len_k, causal, window, softcap):
    """Query by query in float64, independent of ``varlen.reference``: row i of a sequence with Lq queries and Lk
    keys sees the keys j with j <= i + Lk - Lq (causal) and inside the window around that diagonal."""
    left, right = window if window is not None else (-1, -1)
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    q0 = k0 = 0
    for lq, lk in zip(len_q, len_k):
        for i in range(lq):
            diag = i + lk - lq
            keys = [j for j in range(lk) if (not causal or j <= diag) and (left < 0 or j >= diag - left)
                    and (right < 0 or j <= diag + right)]
            for h in range(q.shape[1]) if keys else ():
                s = k[[k0 + j for j in keys], h // group].double() @ q[q0 + i, h].double() / math.sqrt(q.shape[2])
                if softcap:
                    s = softcap * torch.tanh(s / softcap)
                out[q0 + i, h] = torch.softmax(s, 0) @ v[[k0 + j for j in keys], h // group].double()
        q0, k0 = q0 + lq, k0 + lk
    return out


def _close(got, want):
    # the interpreter's products run in tf32, as on the GPU
    assert not torch.isnan(got).any(), "some outputs were never written"
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


# (query lengths, key lengths, causal, window, softcap, query heads, kv heads): ragged lengths with 0 and 1,
# fewer queries than keys (a prefill after a cached prefix) and more (rows before the diagonal see no key)
CASES = [
    ([37, 0, 1, 50], [37, 5, 1, 50], False, None, None, 4, 4),
    ([5, 0, 40, 1], [50, 3, 47, 9], True, None, None, 8, 2),
    ([40, 17], [23, 9], True, None, None, 8, 1),
    ([33, 1, 20], [60, 1, 20], False, (7, 3), None, 4, 1),
    ([30, 12], [45, 12], True, (9, -1), 4.0, 4, 4),
    ([25, 40], [25, 61], False, (-1, 5), 2.5, 8, 1),
    ([19, 44], [19, 44], False, None, 3.0, 4, 1),
    ([3, 35], [0, 35], True, None, None, 2, 2),
]


@pytest.mark.parametrize("len_q, len_k, causal, window, softcap, heads, kv_heads", CASES,
                         ids=[f"q{q}-k{k}-c{int(c)}-w{w}-s{s}-g{h // kv}" for q, k, c, w, s, h, kv in CASES])
def test_forward_and_backward_match_float64(interpret, len_q, len_k, causal, window, softcap, heads, kv_heads):
    """Forward into a NaN-poisoned output against a row-by-row float64 reference (and the module's reference
    against it); dq, dk, dv through the operator's autograd against float64 autograd of the module's reference
    (rows and keys of sequences without partners get zero gradients)."""
    q, k, v, do = _packed(len_q, len_k, heads, kv_heads, 32, seed=sum(len_q) + 7 * sum(len_k) + heads)
    cu_q, cu_k = _cu(len_q), _cu(len_k)
    want = _row_by_row(q, k, v, len_q, len_k, causal, window, softcap)
    ref = varlen.reference(q, k, v, cu_q, cu_k, causal, window=window, softcap=softcap)
    torch.testing.assert_close(ref, want)
    out = torch.full_like(q, float("nan"))
    varlen._forward(q, k, v, cu_q, cu_k, None, max(len_q), max(len_k), causal, window, softcap,
                    1 / math.sqrt(32), None, out)
    _close(out, want)
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    out = tilejit.ops.attention_varlen(*mine, cu_q, cu_k, max(len_q), max(len_k), causal=causal, window=window,
                                       softcap=softcap)
    _close(out.detach(), want)
    out.backward(do)
    theirs = [t.double().requires_grad_() for t in (q, k, v)]
    varlen.reference(*theirs, cu_q, cu_k, causal, window=window, softcap=softcap).backward(do.double())
    for a, b in zip(mine, theirs):
        _close(a.grad, b.grad)


def test_grid_larger_than_the_sequences_and_sm_scale(interpret):
    """max_seqlen above every length (blocks past each sequence do nothing) and an explicit sm_scale."""
    q, k, v, _ = _packed([9, 20], [30, 20], 2, 1, 16, seed=5)
    cu_q, cu_k = _cu([9, 20]), _cu([30, 20])
    out = tilejit.ops.attention_varlen(q, k, v, cu_q, cu_k, 100, 90, causal=True, sm_scale=0.3)
    _close(out, varlen.reference(q, k, v, cu_q, cu_k, True, sm_scale=0.3))


def _paged(k, v, len_k, page_size, seed):
    """k, v (total_k, heads, D) copied into a shuffled paged cache with spare pages of noise; the block table's
    unused slots hold -1 and (first sequence) a valid page of another sequence, which the masks must drop."""
    gen = torch.Generator().manual_seed(seed)
    pages_of = [-(-n // page_size) for n in len_k]
    num_pages = sum(pages_of) + 2
    order = torch.randperm(num_pages, generator=gen).tolist()
    k_cache = torch.randn(num_pages, page_size, *k.shape[1:], generator=gen)
    v_cache = torch.randn(num_pages, page_size, *v.shape[1:], generator=gen)
    table = torch.full((len(len_k), max(pages_of) + 1), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(len_k):
        for p in range(pages_of[b]):
            page, rows = order.pop(), min(page_size, n - p * page_size)
            table[b, p] = page
            k_cache[page, :rows] = k[start + p * page_size:start + p * page_size + rows]
            v_cache[page, :rows] = v[start + p * page_size:start + p * page_size + rows]
        start += n
    table[0, pages_of[0]:] = order.pop()
    return k_cache, v_cache, table


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("causal, window, softcap, heads, kv_heads", [
    (True, None, None, 8, 1), (False, None, 3.0, 4, 4), (True, (12, -1), None, 8, 2), (False, (5, 5), 2.0, 4, 1)])
def test_paged_forward_matches_float64(interpret, page_size, causal, window, softcap, heads, kv_heads):
    """Prefill over a paged cache: queries shorter than their keys (a cached prefix), a sequence without keys,
    one of one key; into a NaN-poisoned output."""
    len_q, len_k = [13, 4, 1, 30], [70, 0, 1, 30]
    q, k, v, _ = _packed(len_q, len_k, heads, kv_heads, 32, seed=page_size + heads)
    k_cache, v_cache, table = _paged(k, v, len_k, page_size, seed=page_size)
    cu_q, cu_k = _cu(len_q), _cu(len_k)
    out = torch.full_like(q, float("nan"))
    varlen._forward(q, k_cache, v_cache, cu_q, cu_k, table, max(len_q), max(len_k), causal, window, softcap,
                    1 / math.sqrt(32), None, out)
    _close(out, _row_by_row(q, k, v, len_q, len_k, causal, window, softcap))
    public = tilejit.ops.attention_varlen(q, k_cache, v_cache, cu_q, cu_k, max(len_q), max(len_k), causal=causal,
                                          window=window, softcap=softcap, block_table=table)
    torch.testing.assert_close(public, out)


def test_keys_of_other_sequences_are_never_mixed_in(interpret):
    """Each sequence's neighbours poisoned with NaN in turn: the outputs and gradients of the others stay
    finite and right, which they cannot if a block of another sequence's keys or queries counted, even masked
    to 0 (0 * NaN)."""
    len_q, len_k = [21, 34, 18], [29, 34, 11]
    q, k, v, do = _packed(len_q, len_k, 4, 2, 16, seed=11)
    cu_q, cu_k = _cu(len_q), _cu(len_k)
    for b in range(3):
        bad = [t.clone() for t in (q, k, v, do)]
        for t, cu in zip(bad, (cu_q, cu_k, cu_k, cu_q)):
            t[int(cu[b]):int(cu[b + 1])] = float("nan")
        leaves = [t.requires_grad_() for t in bad[:3]]
        out = tilejit.ops.attention_varlen(*leaves, cu_q, cu_k, 34, 34, causal=b == 1)
        out.backward(bad[3])
        theirs = [t.double().requires_grad_() for t in (q, k, v)]
        varlen.reference(*theirs, cu_q, cu_k, b == 1).backward(do.double())
        for other in {0, 1, 2} - {b}:
            rows_q = slice(int(cu_q[other]), int(cu_q[other + 1]))
            rows_k = slice(int(cu_k[other]), int(cu_k[other + 1]))
            _close(out.detach()[rows_q], varlen.reference(q, k, v, cu_q, cu_k, b == 1)[rows_q])
            _close(leaves[0].grad[rows_q], theirs[0].grad[rows_q])
            _close(leaves[1].grad[rows_k], theirs[1].grad[rows_k])
            _close(leaves[2].grad[rows_k], theirs[2].grad[rows_k])


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


CU = torch.tensor([0, 4, 8], dtype=torch.int32)


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((torch.zeros(8, 4, 32), torch.zeros(8, 4, 32, dtype=torch.float16), torch.zeros(8, 4, 32), CU, CU, 4, 4), {},
     TypeError, "share one dtype"),
    ((torch.zeros(8, 4, 32, dtype=torch.int32),) * 3 + (CU, CU, 4, 4), {}, TypeError, "share one dtype"),
    ((torch.zeros(8, 32), torch.zeros(8, 4, 32), torch.zeros(8, 4, 32), CU, CU, 4, 4), {}, ValueError,
     r"q must be \(total_q, heads, D\)"),
    ((torch.zeros(8, 4, 32), torch.zeros(8, 3, 32), torch.zeros(8, 3, 32), CU, CU, 4, 4), {}, ValueError,
     "multiple of key/value heads"),
    ((torch.zeros(8, 4, 32), torch.zeros(8, 4, 64), torch.zeros(8, 4, 64), CU, CU, 4, 4), {}, ValueError,
     "one head dim"),
    ((torch.zeros(8, 4, 24),) * 3 + (CU, CU, 4, 4), {}, ValueError, "multiple of 16"),
    ((torch.zeros(8, 4, 32),) * 3 + (CU.long(), CU, 4, 4), {}, ValueError, "cu_seqlens_q must be an int32"),
    ((torch.zeros(8, 4, 32),) * 3 + (CU, CU[:2], 4, 4), {}, ValueError, "must have one shape"),
    ((torch.zeros(8, 4, 32),) * 3 + (CU, CU, 4.0, 4), {}, ValueError, "max_seqlen_q must be an int"),
    ((torch.zeros(8, 4, 32),) * 3 + (CU, CU, 4, -1), {}, ValueError, "max_seqlen_k must be an int"),
    ((torch.zeros(8, 4, 32),) * 3 + (CU, CU, 4, 4), dict(window=(2,)), ValueError, "window must be"),
    ((torch.zeros(8, 4, 32),) * 3 + (CU, CU, 4, 4), dict(softcap=-2.0), ValueError, "softcap must be"),
    ((torch.zeros(8, 4, 32),) * 3 + (CU, CU, 4, 4), dict(block_table=torch.zeros(2, 3, dtype=torch.int32)),
     ValueError, r"\(num_pages, page_size, kv_heads, D\)"),
    ((torch.zeros(8, 4, 32), torch.zeros(3, 4, 4, 32), torch.zeros(3, 4, 4, 32), CU, CU, 4, 4),
     dict(block_table=torch.zeros(3, 3, dtype=torch.int32)), ValueError, r"block_table must be .* \(2, max_pages\)"),
    ((torch.zeros(8, 4, 32, requires_grad=True), torch.zeros(3, 4, 4, 32), torch.zeros(3, 4, 4, 32), CU, CU, 4, 4),
     dict(block_table=torch.zeros(2, 3, dtype=torch.int32)), ValueError, "has no backward"),
])
def test_bad_arguments_are_typed_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        tilejit.ops.attention_varlen(*args, **kwargs)


def test_empty_batch_launches_nothing():
    """max_seqlen_q = 0 (or no tokens): an empty result without a launch (a CPU tensor, no interpreter)."""
    q = torch.zeros(0, 2, 16)
    cu = torch.zeros(3, dtype=torch.int32)
    assert tilejit.ops.attention_varlen(q, q, q, cu, cu, 0, 0).shape == (0, 2, 16)


# ----------------------------------------------------------------------------------------------- compiling

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]


# sm_80's default dQ config at D=128, and sm_90a's forward config with a window (both shared with the padded
# kernels), ask for a 2-stage ring that the compiler shrinks to 1 stage with a warning
@pytest.mark.filterwarnings("ignore:tilejit. kernel attn_varlen_.*a pipeline of 2 stages:RuntimeWarning")
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dim, causal, window, softcap", [(128, True, None, None), (64, False, None, None),
                                                          (128, False, (256, 64), 30.0)])
def test_kernels_compile(fresh_compile_cache, arch, dim, causal, window, softcap):
    """The forward with the arch's default config (on sm_90a warp-specialized at D=128 like the padded forward),
    dK/dV and dQ with the default backward configs, and the paged forward: cubins within
    the shared memory of the arch."""
    hopper = arch == "sm_90a"
    view = varlen._tokens_view
    q, kv = view(_meta(1000, 4, dim)), view(_meta(1200, 2, dim))
    lse = _meta(1, 4, 1000, dtype=torch.float32)
    cu = _meta(3, dtype=torch.int32)
    masking = fused_attention._masking(causal, window, softcap)
    causal = masking.pop("CAUSAL")
    fwd_config = fused_attention.default_config(dim, causal, hopper)
    bwd = fused_attention.default_bwd_config(dim, hopper=hopper, sm80=arch == "sm_80")
    common = dict(GROUP=2, D=dim, CAUSAL=causal, arch=arch, **masking)
    fwd = varlen.attn_varlen_fwd.compile(q, kv, kv, q, lse, cu, cu, 0.1, 4, STORE_LSE=True, **common, **fwd_config)
    compiled = [fwd,
                varlen.attn_varlen_bwd_dkdv.compile(q, kv, kv, q, lse, lse, kv, kv, cu, cu, 0.1, 2, **common,
                                                    **bwd["dkdv"]),
                varlen.attn_varlen_bwd_dq.compile(q, kv, kv, q, lse, lse, q, cu, cu, 0.1, 4, **common, **bwd["dq"]),
                varlen.attn_varlen_paged_fwd.compile(q, _meta(64 * 16, 2, dim), _meta(64 * 16, 2, dim), q, lse, cu,
                                                     cu, _meta(2, 8, dtype=torch.int32), 0.1, 4, PAGE=16,
                                                     STORE_LSE=True, **common,
                                                     **{n: fwd_config[n] for n in ("BM", "BN", "num_warps")})]
    for c in compiled:
        assert c.asm["cubin"][:4] == b"\x7fELF"
        assert 0 < c.shared_bytes <= tilejit.target.Arch.parse(arch).max_shared_bytes
    if hopper and fwd_config.get("warp_specialize") and window is None:
        # the key/value loop warp-specialized as the padded forward's (a producer warpgroup that computes the
        # loop's bounds from the cu_seqlens), K and V through the TMA, whole blocks stored through it (with a
        # window, neither forward is warp-specialized: every block is masked)
        cuda = fwd.asm["cuda"]
        assert "setmaxnreg_inc" in cuda and "tma_load_4d" in cuda and "tma_store_4d" in cuda


# ----------------------------------------------------------------------------------------------- the operators

def _op_args(q, k, v, store_lse):
    cu = torch.tensor([0, 3, 10], dtype=torch.int32, device=q.device)
    return (q, k, v, cu, cu, None, 7, 7, True, 5, -1, 4.0, 0.25, store_lse)


def test_operators_are_registered_with_fake_kernels():
    """tilejit::attention_varlen_fwd / _bwd exist and their fake kernels give shapes on meta tensors (what
    torch.compile traces with); lse (heads, total_q) only when asked for."""
    q, kv = _meta(10, 8, 64), _meta(10, 2, 64)
    args = list(_op_args(q, kv, kv, True))
    args[3] = args[4] = _meta(3, dtype=torch.int32)
    out, lse = torch.ops.tilejit.attention_varlen_fwd(*args)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (8, 10) and lse.dtype == torch.float32
    args[-1] = False
    assert torch.ops.tilejit.attention_varlen_fwd(*args)[1].shape == (0,)
    dq, dk, dv = torch.ops.tilejit.attention_varlen_bwd(q, q, kv, kv, q, lse, args[3], args[4], 7, 7, True, 5, -1,
                                                       4.0, 0.25)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, kv.shape, kv.shape)


def test_opcheck(interpret):
    """torch.library.opcheck: schema, autograd registration, fake kernel against the real one, AOT dispatch."""
    q, k, v, _ = _packed([3, 7], [3, 7], 2, 1, 16, seed=1)
    torch.library.opcheck(torch.ops.tilejit.attention_varlen_fwd.default, _op_args(q, k, v, True))
    torch.library.opcheck(torch.ops.tilejit.attention_varlen_fwd.default,
                          _op_args(q.requires_grad_(), k, v, True))


def test_torch_compile_fullgraph(interpret):
    """A function calling attention_varlen compiles with fullgraph=True, forward and backward, and agrees with
    the eager call."""
    q, k, v, _ = _packed([5, 12], [9, 12], 2, 1, 16, seed=2)
    cu_q, cu_k = _cu([5, 12]), _cu([9, 12])

    def model(q, k, v):
        return tilejit.ops.attention_varlen(q, k, v, cu_q, cu_k, 12, 12, causal=True, window=(6, -1),
                                            softcap=5.0).relu()

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).sum().backward()
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    model(*eager).sum().backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad)
