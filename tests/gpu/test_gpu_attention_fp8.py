"""The float8 attention forward on the GPU: every config of its space and the default (warp-specialized on sm_90)
against float64 attention of the dequantized inputs within P's rounding bound, ragged lengths, GQA, causal,
per-tensor and per-block scales, a pre-transposed v, NaN-poisoned outputs, torch.compile; and its error against
bf16 SDPA's on the same (unquantized) inputs. The float8 wgmma with A from registers (``wgmma_rs_m64nNk32_fp8``)
alone, against float64, over one and two warpgroups."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.ops import fp8_attention as fa

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_fp8_mma(requires_sm):
    requires_sm(89)


def inputs(batch, heads, seq, dim, group, per_block, seed, grow=True):
    """The float32 inputs (``grow``: rows growing along the sequence, so per-block scales differ) and their e4m3
    forms."""
    torch.manual_seed(seed)
    grow = 1 + torch.arange(seq, device="cuda", dtype=torch.float32)[:, None] / 500 if grow else 1.0
    raw = [torch.randn(batch, h, seq, dim, device="cuda") * grow for h in (heads, heads // group, heads // group)]
    return raw, [fa.quantize(t, per_block) for t in raw]


def check(out, quantized, causal):
    """Every output written; within P's bound of float64 attention of the dequantized inputs (see
    tests/backend/test_attention_fp8.py: 2^-4 of the column's largest |v| per element, 2^-8 of |out|), and 3%
    of the output's norm over the whole tensor."""
    (q, qs), (k, ks), (v, vs) = quantized
    assert not torch.isnan(out).any(), "some outputs were never written"
    ref = fa.reference(q, k, v, qs, ks, vs, causal)
    group = q.shape[1] // k.shape[1]
    v64 = fa.dequantize(v, vs)
    col_max = v64.abs().amax(dim=2, keepdim=True).repeat_interleave(group, dim=1)
    bound = (2.0 ** -4 + q.shape[2] * 2.0 ** -18) * col_max + 2.0 ** -8 * ref.abs()
    err = (out.double() - ref).abs()
    assert (err <= bound).all(), f"max err {err.max().item():.4g}, worst ratio {(err / bound).max().item():.3g}"
    assert err.norm() <= 0.03 * ref.norm()
    return ref


def run(quantized, causal, **kw):
    (q, qs), (k, ks), (v, vs) = quantized
    out = torch.full(q.shape, float("nan"), dtype=kw.pop("out_dtype", torch.bfloat16), device="cuda")
    fa.attention_fp8(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal, out=out, out_dtype=out.dtype, **kw)
    return out


CASES = [(dim, bm, bn, w, ws) for dim, configs in fa.CONFIGS.items() for bm, bn, w in configs
         for ws in (False, True)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim, bm, bn, warps, ws", CASES, ids=[f"d{d}-{m}x{n}-w{w}{'-ws' if s else ''}"
                                                                 for d, m, n, w, s in CASES])
def test_every_config(dim, bm, bn, warps, ws, causal, requires_sm):
    if ws:
        requires_sm(90)
    _, quantized = inputs(2, 4, 1000, dim, 2, True, seed=dim + bm + bn + causal)
    extra = dict(warp_specialize=True, STAGES=3) if ws else {}
    check(run(quantized, causal, BM=bm, BN=bn, num_warps=warps, **extra), quantized, causal)


@pytest.mark.parametrize("per_block", [False, True])
@pytest.mark.parametrize("seq", [1, 17, 129, 4097])
@pytest.mark.parametrize("causal", [False, True])
def test_default_config_ragged_lengths_and_scales(seq, causal, per_block):
    _, quantized = inputs(1, 4, seq, 128, 4, per_block, seed=seq)
    check(run(quantized, causal), quantized, causal)


def test_float32_out_and_pre_transposed_v():
    _, quantized = inputs(2, 8, 777, 128, 2, True, seed=7)
    (q, qs), (k, ks), (v, vs) = quantized
    out = fa.attention_fp8(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs, out_dtype=torch.float32)
    vt = fa.transpose_v(v)
    again = fa.attention_fp8(q, k, vt, q_scale=qs, k_scale=ks, v_scale=vs, out_dtype=torch.float32,
                             v_transposed=True)
    assert torch.equal(out, again)
    check(out, quantized, False)


def test_under_torch_compile():
    _, quantized = inputs(1, 4, 300, 128, 1, False, seed=9)
    (q, qs), (k, ks), (v, vs) = quantized
    compiled = torch.compile(lambda *t: fa.attention_fp8(t[0], t[1], t[2], q_scale=t[3], k_scale=t[4],
                                                         v_scale=t[5], causal=True), fullgraph=True)
    check(compiled(q, k, v, qs, ks, vs), quantized, True)


@pytest.mark.parametrize("per_block", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_error_against_float64_next_to_bf16_sdpa(causal, per_block):
    """Against float64 attention of the unquantized inputs (randn): e4m3's 3-bit mantissa costs the inputs alone
    about 4.7% of the output's norm (float64 of the dequantized inputs, S = 1024; bf16 inputs: 0.3%), P's
    rounding adds its part: fp8 stays within 8%, and above bf16 SDPA's error (a sanity check of the metric)."""
    raw, quantized = inputs(2, 8, 2048, 128, 1, per_block, seed=11, grow=False)
    exact = fa.reference(*(t.double() for t in raw), *(torch.ones((), device="cuda"),) * 3, causal)
    sdpa = torch.nn.functional.scaled_dot_product_attention(*(t.bfloat16() for t in raw), is_causal=causal)
    fp8 = run(quantized, causal)
    sdpa_err = ((sdpa.double() - exact).norm() / exact.norm()).item()
    fp8_err = ((fp8.double() - exact).norm() / exact.norm()).item()
    assert sdpa_err < fp8_err <= 0.08, (fp8_err, sdpa_err)


@tilejit.kernel
def _scores_then_p_at_v(A, B, Vt, O, D: T.constexpr):
    s = T.gemm(A[0:128, 0:32], B[0:128, 0:32], T.zeros((128, 128), T.float32), transpose_b=True, precision="fast")
    O[0:128, 0:D] = T.gemm(s.to(T.float8_e4m3fn), Vt[0:D, 0:128], T.zeros((128, D), T.float32), transpose_b=True,
                           precision="fast")


@pytest.mark.parametrize("warps", [4, 8])
def test_float8_operand_a_from_registers(warps, requires_sm):
    """Scores of small integers (exact in float32, rounded to e4m3 as torch rounds) times V: a byte of P's
    fragment in the wrong place moves whole products, far beyond the float8 sum's rounding."""
    requires_sm(90)
    torch.manual_seed(warps)
    a, b = (torch.randint(-1, 2, (128, 32), device="cuda").float().to(torch.float8_e4m3fn) for _ in range(2))
    vt = torch.randn(128, 128, device="cuda").to(torch.float8_e4m3fn)
    out = torch.full((128, 128), float("nan"), device="cuda")
    assert "wgmma_rs_m64nNk32_fp8" in _scores_then_p_at_v.compile(a, b, vt, out, D=128, num_warps=warps).asm["ir"]
    _scores_then_p_at_v[(1,)](a, b, vt, out, D=128, num_warps=warps)
    p = (a.double() @ b.double().T).float().to(torch.float8_e4m3fn).double()
    scale = (p.abs() @ vt.double().abs().T).max().item()
    torch.testing.assert_close(out.double(), p @ vt.double().T, rtol=1e-3, atol=1e-3 * scale)
