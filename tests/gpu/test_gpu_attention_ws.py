"""The attention forward with its main key/value loop warp-specialized (the ``warp_specialize`` launch option,
sm_90a): a producer warpgroup, split off at the kernel's start with the scalars its loads need, fills the TMA ring;
the math warps release each slot at the end of their iteration. Every forward config, causal and not, ragged and
variable lengths, GQA, NaN-poisoned outputs, against the float64 SDPA reference; each test checks that the kernel
it ran really has the producer warpgroup (or, for variable lengths, why it does not)."""
from __future__ import annotations

import pytest
import torch

from attention_checks import check, check_grad, inputs, reference_grads
from lang_kernels import load_ops_copy

pytestmark = pytest.mark.gpu

attention = load_ops_copy("fused_attention")  # this module's own copy (its kernels' launch caches are its own)

CASES = [(dim, bm, bn, w) for dim, configs in attention.CONFIGS.items() for bm, bn, w in configs]


def _sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("warp specialization is an sm_90a feature")


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps", CASES, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CASES])
def test_every_config_warp_specialized(dim, bm, bn, warps, causal, stages):
    """With a 3-deep ring each loop also issues its p @ v one iteration late (deferred_gemm); with 2, not."""
    _sm90()
    q, k, v = inputs(2, 4, 1000, dim, 2, seed=dim + bm + bn + causal + stages)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=bm, BN=bn, num_warps=warps, warp_specialize=True,
                        STAGES=stages)
    check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_each_gemm_in_its_iteration_when_the_knob_says(monkeypatch, causal):
    """TILEJIT_MMA_OVERLAP=0 (the loop not rotated) gives the same results."""
    _sm90()
    monkeypatch.setenv("TILEJIT_MMA_OVERLAP", "0")
    q, k, v = inputs(2, 4, 1000, 128, 2, seed=3 + causal)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=128, BN=128, num_warps=8, warp_specialize=True,
                        STAGES=3)
    check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
def test_backward_dq_warp_specialized(dim, causal):
    """dQ's key loop warp-specialized (its 2-deep ring keeps dS @ K in its own iteration)."""
    _sm90()
    q, k, v = inputs(2, 4, 1000, dim, 2, seed=40 + dim + causal)
    do = torch.randn_like(q)
    out, lse = attention.attention_forward(q, k, v, causal=causal)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    attention.attention_backward(do, q, k, v, out, lse, causal=causal, dq=dq, dk=dk, dv=dv,
                                 config={"dq": dict(BM=128, BN=64, num_warps=8, warp_specialize=True)})
    ref = reference_grads(attention.reference, q, k, v, do, causal)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref[1:]):
        check_grad(got, want, name)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seq", [1, 17, 64, 127, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_lengths_warp_specialized(seq, causal, dtype, stages):
    """128x64 tiles: the unmasked loop runs 0, 0, 1, 1 and 64 times (deferred with 3 stages: the first iteration
    alone, then the drain)."""
    _sm90()
    q, k, v = inputs(1, 2, seq, 128, 1, dtype=dtype, seed=seq)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, warp_specialize=True, STAGES=stages)
    check(out, attention.reference(q, k, v, causal))


def test_the_kernel_run_is_specialized():
    _sm90()
    q, k, v = inputs(1, 2, 512, 128, 1, seed=1)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, out=out, warp_specialize=True)
    compiled = attention.attn_fwd.compile(q, k, v, out, out, torch.zeros(1, dtype=torch.int32, device="cuda"),
                                          0.125, 2, GROUP=1, D=128, CAUSAL=False, VARLEN=False, STORE_LSE=False,
                                          warp_specialize=True, **attention.default_config(128))
    assert compiled.meta["threads"] == 8 * 32 + 128
    check(out, attention.reference(q, k, v, False))


@pytest.mark.parametrize("causal", [False, True])
def test_variable_lengths_warp_specialized(causal):
    """The key count is one element of Lens (a scalar read, which the producer warpgroup makes too): the loop is
    warp-specialized, its p @ v deferred, and the result right on every batch entry's rows."""
    _sm90()
    q, k, v = inputs(3, 4, 300, 64, 4, seed=5)
    lens = torch.tensor([300, 1, 129], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, lens=lens, warp_specialize=True, STAGES=3)
    check(out, attention.reference(q, k, v, causal, lens=lens), rows=lens.tolist())
    compiled = attention.attn_fwd.compile(q, k, v, out, out, lens, 0.125, 4, GROUP=4, D=64, CAUSAL=causal,
                                          VARLEN=True, STORE_LSE=False, warp_specialize=True, STAGES=3,
                                          **attention.default_config(64))
    assert compiled.meta["threads"] == compiled.meta["num_warps"] * 32 + 128
    assert "defer_mma = true" in compiled.asm["ir"]


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps", CASES, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CASES])
def test_every_config_persistent_one_loop(dim, bm, bn, warps, causal, stages):
    """``persistent=True``: ``attn_fwd``'s ``ONE_LOOP`` form, one key loop whose ring stays across the programs
    each SM walks (the producer split off first, p @ v deferred with 3 stages), on more programs than SMs, GQA,
    ragged rows."""
    _sm90()
    q, k, v = inputs(4, 8, 1000, dim, 2, seed=70 + dim + bm + bn + causal + stages)
    out = torch.full_like(q, float("nan"))
    attention.attention(q, k, v, causal=causal, out=out, BM=bm, BN=bn, num_warps=warps, persistent=True,
                        STAGES=stages)
    check(out, attention.reference(q, k, v, causal))


@pytest.mark.parametrize("case", [dict(causal=True, lens=[700, 1, 333]), dict(window=(100, 37)),
                                  dict(causal=True, window=(129, 0), softcap=30.0), dict(softcap=20.0)])
def test_persistent_one_loop_masks(case):
    """Variable lengths, windows and softcaps through the persistent walk, with the LSE the backward reads."""
    _sm90()
    q, k, v = inputs(3, 4, 700, 128, 2, seed=90 + len(str(case)))
    lens = torch.tensor(case["lens"], dtype=torch.int32, device="cuda") if "lens" in case else None
    kwargs = dict(causal=case.get("causal", False), lens=lens, window=case.get("window"),
                  softcap=case.get("softcap"))
    out = torch.full_like(q, float("nan"))
    _, lse = attention.attention_forward(q, k, v, out=out, persistent=True, BM=128, BN=128, num_warps=8,
                                         STAGES=3, **kwargs)
    ref = attention.reference(q, k, v, kwargs["causal"], lens=lens, window=kwargs["window"],
                              softcap=kwargs["softcap"])
    check(out, ref, rows=None if lens is None else [700] * 3)
    _, lse_two_loops = attention.attention_forward(q, k, v, BM=128, BN=128, num_warps=8, **kwargs)
    torch.testing.assert_close(lse, lse_two_loops, rtol=1e-3, atol=1e-3)


def test_causal_default_is_one_loop_up_to_its_length(monkeypatch):
    """attention() with no config, causal, head dim 128, S <= ONE_LOOP_SEQ: the one-loop kernel, warp-specialized;
    beyond it, attn_fwd's two loops. Both right."""
    _sm90()
    launched = []

    class Spy:  # records the options _forward launched attn_fwd with
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(kwargs)
                return kernel[grid](*args, **kwargs)
            return launch

    kernel = attention.attn_fwd
    monkeypatch.setattr(attention, "attn_fwd", Spy())
    for seq, walked in ((attention.ONE_LOOP_SEQ - 77, True), (attention.ONE_LOOP_SEQ + 50, False)):
        q, k, v = inputs(2, 4, seq, 128, 1, seed=seq)
        out = torch.full_like(q, float("nan"))
        attention.attention(q, k, v, causal=True, out=out)
        check(out, attention.reference(q, k, v, True))
        options = launched[-1]
        assert bool(options.get("ONE_LOOP")) == walked
        assert options["warp_specialize"] and not options.get("persistent")
