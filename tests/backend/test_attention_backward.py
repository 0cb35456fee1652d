"""The attention backward of tilejit/ops/fused_attention.py: the three kernels (preprocess, dK/dV, dQ) through the
interpreter against torch autograd of a float64 reference on ragged shapes, causal and not, with GQA; the
forward's base-2 log-sum-exp; every backward config compiling with NVRTC (sm_90a: every config, within shared
memory and without register spills; sm_80 and sm_100a: the default configs)."""
from __future__ import annotations

import math

import pytest
import torch

import tilejit
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import fused_attention as attention

LOG2E = 1.4426950408889634
# Small tiles so that a 70-row sequence has several blocks of each kind: unmasked, diagonal and ragged.
SMALL_FWD = dict(BM=32, BN=16, num_warps=4)
SMALL_BWD = {"dkdv": dict(BM=16, BN=32, num_warps=4), "dq": dict(BM=32, BN=16, num_warps=4)}


def _inputs(batch, heads, seq, dim, group, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, generator=gen)
    k = torch.randn(batch, heads // group, seq, dim, generator=gen)
    v = torch.randn(batch, heads // group, seq, dim, generator=gen)
    do = torch.randn(batch, heads, seq, dim, generator=gen)
    return q, k, v, do


def _reference_grads(q, k, v, do, causal):
    """(out, dq, dk, dv) in float64 through torch autograd (GQA: gradients summed over each group by autograd
    of repeat_interleave)."""
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out = attention.reference(q64, k64, v64, causal)
    out.backward(do.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def _close(got, want):
    # float32 inputs, but the interpreter's products run in tf32 (10-bit mantissas) as on the GPU: relative
    # errors of ~1e-3 per product, summed over the 32 to 70 terms of the gradients' contractions
    assert not torch.isnan(got).any(), "some outputs were never written"
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, group", [(32, 2), (64, 1)])
def test_kernels_match_float64_autograd(interpret, dim, group, causal):
    """attention_forward / attention_backward into NaN-poisoned outputs, on a 70-row ragged sequence."""
    q, k, v, do = _inputs(1, 2, 70, dim, group, seed=dim + group + causal)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"))
    attention.attention_forward(q, k, v, causal=causal, out=out, lse=lse, **SMALL_FWD)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    delta = torch.full(q.shape[:3], float("nan"))
    attention.attention_backward(do, q, k, v, out, lse, causal=causal, dq=dq, dk=dk, dv=dv, delta=delta,
                                 config=SMALL_BWD)
    ref_out, ref_dq, ref_dk, ref_dv = _reference_grads(q, k, v, do, causal)
    _close(out, ref_out)
    _close(dq, ref_dq)
    _close(dk, ref_dk)
    _close(dv, ref_dv)
    torch.testing.assert_close(delta.double(), (do.double() * out.double()).sum(-1), rtol=1e-5, atol=1e-5)


def test_log_sum_exp_is_base_2(interpret):
    q, k, v, _ = _inputs(1, 2, 45, 32, 2, seed=3)
    lse = torch.full(q.shape[:3], float("nan"))
    attention.attention_forward(q, k, v, causal=True, lse=lse, **SMALL_FWD)
    scores = q.double() @ k.double().repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(32)
    scores = scores.masked_fill(torch.ones(45, 45, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1) * LOG2E, rtol=1e-3, atol=1e-3)


def test_autograd_function(interpret):
    """attention(...) with inputs that require grad goes through the autograd of operator tilejit::attention_fwd;
    GQA 2, causal, an explicit sm_scale, and an upstream gradient that is not contiguous (from an expand)."""
    q, k, v, _ = _inputs(2, 4, 37, 32, 2, seed=11)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention.attention(q, k, v, causal=True, sm_scale=0.3, bwd_config=SMALL_BWD, **SMALL_FWD)
    assert out.grad_fn is not None and "tilejit_attention_fwd" in out.grad_fn.name()
    weights = torch.randn(32, dtype=torch.float32)
    (out * weights).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention.reference(q64, k64, v64, True, sm_scale=0.3)
    (ref * weights.double()).sum().backward()
    _close(q.grad, q64.grad)
    _close(k.grad, k64.grad)
    _close(v.grad, v64.grad)


@pytest.mark.parametrize("causal", [False, True])
def test_variable_lengths_backward(interpret, causal):
    """Variable lengths through the operator's autograd: batch b's keys end at lens[b] (one length a block multiple,
    one ragged, one inside the first key block); every query row, padding included, has its output and gradient
    (the reference attends padding rows over the same keys), and keys past a length get exactly zero."""
    q, k, v, do = _inputs(3, 4, 70, 32, 2, seed=7 + causal)
    lens = torch.tensor([64, 37, 9], dtype=torch.int32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attention.attention(q, k, v, causal=causal, lens=lens, bwd_config=SMALL_BWD, **SMALL_FWD)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention.reference(q64, k64, v64, causal, lens=lens)
    ref.backward(do.double())
    _close(out.detach(), ref.detach())
    _close(q.grad, q64.grad)
    _close(k.grad, k64.grad)
    _close(v.grad, v64.grad)
    for b, n in enumerate(lens.tolist()):
        assert (k.grad[b, :, n:] == 0).all() and (v.grad[b, :, n:] == 0).all()
    with torch.no_grad():
        assert attention.attention(q, k, v, lens=lens, **SMALL_FWD).grad_fn is None


def test_lens_must_be_one_int32_per_batch_entry(interpret):
    q, k, v, _ = _inputs(2, 2, 40, 32, 1, seed=5)
    with pytest.raises(ValueError, match="int32 tensor of shape"):
        attention.attention(q, k, v, lens=torch.tensor([40, 9]), **SMALL_FWD)


# ----------------------------------------------------------------------------------------------- compiling

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]


def _meta_args(dim, seq=1000, heads=4, group=2):
    q = torch.empty(2, heads, seq, dim, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(2, heads // group, seq, dim, dtype=torch.bfloat16, device="meta")
    rows = torch.empty(2, heads, seq, dtype=torch.float32, device="meta")
    return q, kv, rows


def _compile(kernel_name, dim, bm, bn, warps, arch, varlen=False):
    q, kv, rows = _meta_args(dim)
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    if kernel_name == "dkdv":
        # (peel_masks=False: as attention_backward launches these hand-split kernels)
        return attention.attn_bwd_dkdv.compile(q, kv, kv, q, rows, rows, kv, kv, lens, 0.125, 2, GROUP=2, BM=bm,
                                               BN=bn, D=dim, CAUSAL=True, VARLEN=varlen, num_warps=warps, arch=arch,
                                               peel_masks=False)
    return attention.attn_bwd_dq.compile(q, kv, kv, q, rows, rows, q, lens, 0.125, 4, GROUP=2, BM=bm, BN=bn, D=dim,
                                         CAUSAL=True, VARLEN=varlen, num_warps=warps, arch=arch, peel_masks=False)


def _check_compiled(compiled, arch):
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert 0 < compiled.shared_bytes <= tilejit.target.Arch.parse(arch).max_shared_bytes
    assert compiled.meta["registers"] is not None and compiled.meta["registers"] <= 255


# 64 rows over 8 warps (two warpgroups) do not split into 64-row wgmma slabs: BWD_CONFIGS says why they are there.
MMA_SYNC_ON_SM90 = {("dkdv", 256, 64, 64, 8), ("dq", 256, 64, 64, 8)}
# The causal kernels hold both loops (masked diagonal blocks, then unmasked ones): a superset of the others.
SM90_CASES = [(name, dim, bm, bn, w) for dim, spaces in attention.BWD_CONFIGS.items()
              for name, configs in spaces.items() for bm, bn, w in configs]


@pytest.mark.skipif("sm_90a" not in ARCHS, reason="NVRTC cannot compile for sm_90a")
@pytest.mark.parametrize("name, dim, bm, bn, warps", SM90_CASES,
                         ids=[f"{n}-d{d}-{m}x{b}-w{w}" for n, d, m, b, w in SM90_CASES])
def test_every_backward_config_fits_sm90a(fresh_compile_cache, name, dim, bm, bn, warps):
    """Within 227 KB of shared memory and 255 registers, with no spills; every product on wgmma, and P^T / dS^T
    (dK/dV) or dS (dQ) read from registers."""
    compiled = _compile(name, dim, bm, bn, warps, "sm_90a")
    _check_compiled(compiled, "sm_90a")
    assert compiled.meta["spills"] == 0, compiled.meta
    gemms = [line for line in compiled.asm["ir"].splitlines() if "tj.gemm" in line]
    if (name, dim, bm, bn, warps) in MMA_SYNC_ON_SM90:
        assert all("mma_sync" in g for g in gemms) and gemms
        return
    per_step = [False, True, False, True] if name == "dkdv" else [False, False, True]
    assert [("wgmma_rs_m64nNk16" in g) for g in gemms] == per_step * 2
    assert all("wgmma" in g for g in gemms)


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "sm_90a"])
@pytest.mark.parametrize("dim", sorted(attention.BWD_CONFIGS))
def test_default_backward_configs_compile(fresh_compile_cache, arch, dim):
    cfg = attention.default_bwd_config(dim)
    for name in ("dkdv", "dq"):
        c = cfg[name]
        _check_compiled(_compile(name, dim, c["BM"], c["BN"], c["num_warps"], arch), arch)


@pytest.mark.skipif("sm_80" not in ARCHS, reason="NVRTC cannot compile for sm_80")
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("dim", sorted(attention.SM80_BWD_CONFIGS))
def test_sm80_backward_defaults_do_not_spill(fresh_compile_cache, dim, varlen):
    """The sm_80 defaults: dQ without spills; dK/dV without at head dim 64, with 32 bytes at 128 (every
    config without spills there holds 32 keys a program and measured 40-55% slower on the sm_80 path). The
    variable-length kernels (masks on keys) spill more: dK/dV 8 and 136 bytes, dQ at 128 48 bytes, as ptxas reported
    when these were chosen (the configs before spilled too)."""
    bounds = {(64, "dkdv", False): 0, (64, "dkdv", True): 8, (128, "dkdv", False): 32, (128, "dkdv", True): 136,
              (128, "dq", True): 48}
    cfg = attention.default_bwd_config(dim, sm80=True)
    assert cfg != attention.default_bwd_config(dim)
    for name in ("dkdv", "dq"):
        c = cfg[name]
        compiled = _compile(name, dim, c["BM"], c["BN"], c["num_warps"], "sm_80", varlen=varlen)
        _check_compiled(compiled, "sm_80")
        limit = bounds.get((dim, name, varlen), 0)
        assert compiled.meta["spills"] <= limit, (name, compiled.meta)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dim", sorted(attention.BWD_CONFIGS))
def test_variable_length_backward_compiles(fresh_compile_cache, arch, dim):
    """The default backward configs with VARLEN (keys masked past Lens[b]); on sm_90a without spills, like the
    plain ones (on sm_80 both spill some 16-250 bytes: the 8-warp mma.sync configs hold two accumulators)."""
    cfg = attention.default_bwd_config(dim)
    for name in ("dkdv", "dq"):
        c = cfg[name]
        compiled = _compile(name, dim, c["BM"], c["BN"], c["num_warps"], arch, varlen=True)
        _check_compiled(compiled, arch)
        if arch == "sm_90a":
            assert compiled.meta["spills"] == 0, (name, compiled.meta)


@pytest.mark.parametrize("arch", ARCHS)
def test_preprocess_and_forward_with_lse_compile(fresh_compile_cache, arch):
    q, kv, rows = _meta_args(128)
    _check_compiled(attention.attn_bwd_preprocess.compile(q, q, rows, 4, BM=32, D=128, num_warps=4, arch=arch),
                    arch)
    lens = torch.empty(2, dtype=torch.int32, device="meta")
    fwd = attention.attn_fwd.compile(q, kv, kv, q, rows, lens, 0.125, 4, GROUP=2, D=128, CAUSAL=True,
                                     VARLEN=False, STORE_LSE=True, num_warps=8, BM=128, BN=64, arch=arch)
    _check_compiled(fwd, arch)
    assert "log2" in fwd.asm["cuda"]
