"""Sliding windows and logit softcaps in tilejit.ops.attention (forward, backward, GQA, variable lengths): the
interpreter against a float64 reference written out (scores, softcap, window and length masks, softmax), key
blocks outside the window never read (NaN-poisoned operands), the kernels compiling with NVRTC for every arch,
the arguments checked, and the PyTorch operators: their fake kernels, opcheck, and torch.compile(fullgraph)."""
from __future__ import annotations

import math

import pytest
import torch

import tilejit
from attention_tiles import SMALL_ATTENTION_BWD, SMALL_ATTENTION_FWD
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import fused_attention as attention

SMALL_FWD, SMALL_BWD = SMALL_ATTENTION_FWD, SMALL_ATTENTION_BWD


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))


def _inputs(batch, heads, kv_heads, seq, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, h, seq, dim, generator=gen) for h in (heads, kv_heads, kv_heads, heads)]


def _explicit_reference(q, k, v, causal, window, softcap, lens, sm_scale):
    """Row by row in float64, independent of the module's reference: for query i the visible keys j (j < the
    batch's length; causal: j <= i; window (l, r): i - l <= j <= i + r), their capped scores, the softmax."""
    batch, heads, seq, _ = q.shape
    group = heads // k.shape[1]
    left, right = window if window is not None else (-1, -1)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(batch):
        length = seq if lens is None else int(lens[b])
        for h in range(heads):
            for i in range(seq):
                keys = [j for j in range(length) if (not causal or j <= i) and (left < 0 or j >= i - left)
                        and (right < 0 or j <= i + right)]
                if not keys:
                    continue
                s = k[b, h // group, keys].double() @ q[b, h, i].double() * sm_scale
                if softcap:
                    s = softcap * torch.tanh(s / softcap)
                out[b, h, i] = torch.softmax(s, 0) @ v[b, h // group, keys].double()
    return out


def _close(got, want):
    # the interpreter's products run in tf32, as on the GPU
    assert not torch.isnan(got).any(), "some outputs were never written"
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


# (causal, window, softcap, lens, GQA group): windows narrower than a block and wider than the sequence, one
# sided on each side, with causal; softcap alone and with a window; variable lengths where padding rows see no key
CASES = [
    (False, (20, 7), None, None, 2),
    (True, (24, -1), 5.0, None, 1),
    (False, (-1, 9), None, (70, 13), 2),
    (False, None, 4.0, (45, 70), 4),
    (True, (10, -1), None, (70, 3), 2),
    (False, (5, 0), 3.0, None, 1),
    (False, (100, 100), None, None, 2),
]


@pytest.mark.parametrize("causal, window, softcap, lens, group", CASES,
                         ids=[f"c{int(c)}-w{w}-s{s}-l{n}-g{g}" for c, w, s, n, g in CASES])
def test_forward_and_backward_match_float64(interpret, causal, window, softcap, lens, group):
    """Output into a NaN-poisoned tensor, then dq, dk, dv through the operator's autograd, on a 70-row ragged
    sequence (not a multiple of the tiles), against float64 autograd of the module's reference; the reference
    itself against a row-by-row one."""
    q, k, v, do = _inputs(2, 4, 4 // group, 70, 32, seed=len(str((causal, window, softcap, lens, group))))
    lens_t = None if lens is None else torch.tensor(lens, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, window=window, softcap=softcap, lens=lens_t, out=out, **SMALL_FWD)
    sm_scale = 1 / math.sqrt(32)
    explicit = _explicit_reference(q, k, v, causal, window, softcap, lens_t, sm_scale)
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = attention.reference(*ref64, causal, lens=lens_t, window=window, softcap=softcap)
    torch.testing.assert_close(ref.detach(), explicit, rtol=1e-9, atol=1e-9)
    _close(out, explicit)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    got = attention.attention(*leaves, causal=causal, window=window, softcap=softcap, lens=lens_t,
                              bwd_config=SMALL_BWD, **SMALL_FWD)
    got.backward(do)
    ref.backward(do.double())
    _close(got.detach(), explicit)
    for mine, theirs in zip(leaves, ref64):
        _close(mine.grad, theirs.grad)


def test_key_blocks_outside_the_window_are_never_read(interpret):
    """Keys 0..31 poisoned with NaN: query rows from 64 on (window (16, 0): they see keys from 48) must come out
    finite and right, which they cannot if a program reads a block of those keys, even masked (0 * NaN). Same
    for the backward: dq of those rows, and dk/dv of keys from 96 on with queries 0..63 poisoned."""
    q, k, v, do = _inputs(1, 2, 1, 128, 32, seed=3)
    clean = attention.reference(q, k, v, True, window=(16, 0))
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, :32] = float("nan")
    v_bad[:, :, :32] = float("nan")
    out = attention.attention(q, k_bad, v_bad, window=(16, 0), **SMALL_FWD)
    _close(out[:, :, 64:], clean[:, :, 64:])
    out, lse = attention.attention_forward(q, k, v, window=(16, 0), **SMALL_FWD)
    dq, _, _ = attention.attention_backward(do, q, k_bad, v_bad, out, lse, window=(16, 0), config=SMALL_BWD)
    assert not torch.isnan(dq[:, :, 64:]).any()
    q_bad, do_bad = q.clone(), do.clone()
    q_bad[:, :, :64] = float("nan")
    do_bad[:, :, :64] = float("nan")
    _, dk, dv = attention.attention_backward(do_bad, q_bad, k, v, out, lse, window=(16, 0), config=SMALL_BWD)
    assert not torch.isnan(dk[:, :, 96:]).any() and not torch.isnan(dv[:, :, 96:]).any()
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    attention.reference(*ref64, True, window=(16, 0)).backward(do.double())
    _close(dk[:, :, 96:], ref64[1].grad[:, :, 96:])
    _close(dv[:, :, 96:], ref64[2].grad[:, :, 96:])


def test_a_right_bound_of_zero_is_causal_and_defaults_add_no_constexpr():
    """The kernels without a window or softcap take none of the new constexprs (so they compile as before);
    window (-1, 0) runs as causal; with causal the right bound is 0."""
    # (the hand-split kernels are launched unpeeled; the windowed loops, every block masked, are peeled)
    assert attention._masking(False, None, None) == {"CAUSAL": False, "peel_masks": False}
    assert attention._masking(True, None, 0.0) == {"CAUSAL": True, "peel_masks": False}
    assert attention._masking(False, (-1, 0), None) == {"CAUSAL": True, "peel_masks": False}
    assert attention._masking(True, (64, 64), 30.0) == {"CAUSAL": True, "WINDOW_LEFT": 64, "SOFTCAP": 30.0,
                                                        "peel_masks": True}
    assert attention._masking(False, (-1, 64), None) == {"CAUSAL": False, "WINDOW_RIGHT": 64, "peel_masks": True}


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=(3,)), "window must be"), (dict(window=(-2, 0)), "window must be"),
    (dict(window=(1.5, 2)), "window must be"), (dict(softcap=-1.0), "softcap must be"),
    (dict(softcap=float("inf")), "softcap must be"), (dict(BQ=64), "unknown config key"),
    (dict(num_warps=True), "must be a non-negative int"), (dict(bwd_config={"dk": {}}), "'dkdv' and 'dq'"),
])
def test_bad_arguments_are_value_errors(kwargs, match):
    q = torch.empty(1, 2, 8, 32, device="meta")
    with pytest.raises(ValueError, match=match):
        attention.attention(q, q, q, **kwargs)


# ----------------------------------------------------------------------------------------------- compiling

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal, window, softcap", [(True, (256, 0), 30.0), (False, (128, 128), None),
                                                     (False, None, 50.0)])
def test_windowed_and_capped_kernels_compile(fresh_compile_cache, arch, causal, window, softcap):
    """Forward (the arch's default config: warp-specialized on sm_90a at D=128), dK/dV and dQ (default configs)
    with a window and/or softcap, GQA and variable lengths, to cubins within shared memory and registers."""
    dim = 128
    q = torch.empty(2, 4, 1000, dim, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(2, 2, 1000, dim, dtype=torch.bfloat16, device="meta")
    rows = torch.empty(2, 4, 1000, dtype=torch.float32, device="meta")
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    masking = attention._masking(causal, window, softcap)
    hopper = arch == "sm_90a"
    fwd = attention.attn_fwd.compile(q, kv, kv, q, rows, lens, 0.125, 4, GROUP=2, D=dim, VARLEN=True,
                                     STORE_LSE=True, arch=arch, **masking,
                                     **attention.default_config(dim, masking["CAUSAL"], hopper))
    compiled = [fwd]
    bwd = attention.default_bwd_config(dim, hopper=hopper, sm80=arch == "sm_80")
    compiled.append(attention.attn_bwd_dkdv.compile(q, kv, kv, q, rows, rows, kv, kv, lens, 0.125, 2, GROUP=2,
                                                    D=dim, VARLEN=True, arch=arch, **masking, **bwd["dkdv"]))
    compiled.append(attention.attn_bwd_dq.compile(q, kv, kv, q, rows, rows, q, lens, 0.125, 4, GROUP=2, D=dim,
                                                  VARLEN=True, arch=arch, **masking, **bwd["dq"]))
    for c in compiled:
        assert c.asm["cubin"][:4] == b"\x7fELF"
        assert 0 < c.shared_bytes <= tilejit.target.Arch.parse(arch).max_shared_bytes
    if softcap:
        assert all("tanh" in c.asm["cuda"] for c in compiled)


# ----------------------------------------------------------------------------------------------- the operators

def _op_args(q, k, v, store_lse):
    from tilejit.ops.custom_ops import encode_config

    return (q, k, v, None, True, 24, -1, 5.0, 0.25, encode_config(dict(BM=16, BN=16, num_warps=4), "fwd"), store_lse,
            encode_config(SMALL_BWD["dkdv"], "dkdv"), encode_config(SMALL_BWD["dq"], "dq"))


def test_operators_are_registered_with_fake_kernels():
    """tilejit::attention_fwd / _bwd exist, and their fake kernels give shapes on meta tensors (what
    torch.compile traces with), the log-sum-exp only when asked for."""
    q = torch.empty(2, 8, 100, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(2, 2, 100, 64, dtype=torch.bfloat16, device="meta")
    out, lse = torch.ops.tilejit.attention_fwd(*_op_args(q, kv, kv, True))
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "meta"
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    assert torch.ops.tilejit.attention_fwd(*_op_args(q, kv, kv, False))[1].shape == (0,)
    dq, dk, dv = torch.ops.tilejit.attention_bwd(q, q, kv, kv, q, lse, None, True, 24, -1, 5.0, 0.25, [], [])
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, kv.shape, kv.shape)


def test_opcheck(interpret):
    """torch.library.opcheck: schema, autograd registration, fake kernel against the real one (the interpreter
    on CPU), and AOT dispatch."""
    q, k, v, _ = _inputs(1, 2, 1, 20, 16, seed=1)
    torch.library.opcheck(torch.ops.tilejit.attention_fwd.default, _op_args(q, k, v, True))
    torch.library.opcheck(torch.ops.tilejit.attention_fwd.default, _op_args(q.requires_grad_(), k, v, True))


def test_torch_compile_fullgraph(interpret):
    """A function calling attention compiles with fullgraph=True (no graph break), forward and backward, and
    agrees with the eager call."""
    q, k, v, _ = _inputs(1, 2, 1, 20, 16, seed=2)
    cfg = dict(BM=16, BN=16, num_warps=4)
    bwd = {"dkdv": dict(BM=16, BN=16, num_warps=4), "dq": dict(BM=16, BN=16, num_warps=4)}

    def model(q, k, v):
        return attention.attention(q, k, v, causal=True, window=(8, 0), softcap=5.0, bwd_config=bwd, **cfg).relu()

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), model(q, k, v))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).sum().backward()
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    model(*eager).sum().backward()
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad)
