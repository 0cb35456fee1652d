"""The float8 attention forward (tilejit/ops/fp8_attention.py): the interpreter against float64 attention of the
dequantized inputs over ragged lengths, GQA, causal and not, per-tensor and per-block scales (NaN-poisoned
outputs); P's scaling before its e4m3 rounding; the errors for bad scales and inputs; compiles for sm_89, sm_90a
(warp-specialized), sm_100a, and sm_80 (the FMA fallback, which attention_fp8 refuses)."""
from __future__ import annotations

import math

import pytest
import torch

from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.ops import fp8_attention as fa

pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py

F8 = torch.float8_e4m3fn
SMALL = dict(BM=64, BN=64, num_warps=4)


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def error_bound(v64, ref, seq):
    """What the kernel may differ from float64 attention of the dequantized inputs: P's e4m3 rounding (a relative
    error <= 2^-4 per weight, the row sum taken before it: <= 2^-4 of the column's largest |v|; weights below
    e4m3's normal range lose up to 2^-10 of the row's largest 2^8 each), and the bf16 store (2^-9 of |out|, 2^-8
    taken). The first product's float8 sum (one k32 step per 32 of D, 14 bits kept) is far below these."""
    group = ref.shape[1] // v64.shape[1]
    col_max = v64.abs().amax(dim=2, keepdim=True).repeat_interleave(group, dim=1)
    return (2.0 ** -4 + seq * 2.0 ** -18) * col_max + 2.0 ** -8 * ref.abs()


def check(out, q, k, v, qs, ks, vs, causal, sm_scale=None):
    assert not torch.isnan(out).any(), "some outputs were never written"
    ref = fa.reference(q, k, v, qs, ks, vs, causal, sm_scale)
    err = (out.double() - ref).abs()
    bound = error_bound(fa.dequantize(v, vs), ref, q.shape[2])
    assert (err <= bound).all(), f"max err {err.max().item():.4g} over bound at {(err / bound).argmax().item()}"
    # random rounding errors average out: far below the worst case over the whole tensor
    assert err.norm() <= 0.04 * ref.norm() + 1e-12
    return ref


def inputs(batch, heads, seq, dim, group, per_block, seed, spread=True):
    """e4m3 q, k, v and their scales; with ``spread`` each row's magnitude grows along the sequence, so per-block
    scales differ from block to block."""
    torch.manual_seed(seed)
    grow = (1 + torch.arange(seq, dtype=torch.float32)[:, None] / 40) if spread else 1.0
    raw = [torch.randn(batch, h, seq, dim) * grow for h in (heads, heads // group, heads // group)]
    (q, qs), (k, ks), (v, vs) = (fa.quantize(t, per_block) for t in raw)
    return q, k, v, qs, ks, vs


CASES = [(1, 1, False), (77, 2, False), (77, 2, True), (130, 1, True), (200, 4, True)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq, group, per_block", CASES)
def test_matches_float64_of_the_dequantized_inputs(interpret, seq, group, per_block, causal):
    q, k, v, qs, ks, vs = inputs(2 if seq < 100 else 1, 4, seq, 32, group, per_block, seed=seq + group)
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
    fa.attention_fp8(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal, out=out, **SMALL)
    check(out, q, k, v, qs, ks, vs, causal)


def test_mixed_scale_forms_and_tiles(interpret):
    """q per block, k per tensor, v per block whose scales change by 2^10 from block to block (the accumulator
    changes units at each); 128 x 64 tiles of 8 warps; float32 out; an explicit sm_scale."""
    q, k, v, qs, _, vs = inputs(1, 2, 300, 32, 1, True, seed=3)
    k, ks = fa.quantize(k.float(), False)
    vs = vs * torch.tensor([1.0, 1024.0, 1.0 / 1024.0])
    out = fa.attention_fp8(q, k, v, q_scale=qs, k_scale=ks.reshape(1), v_scale=vs, sm_scale=0.3,
                           out_dtype=torch.float32, BM=128, BN=64, num_warps=8)
    assert out.dtype == torch.float32
    check(out, q, k, v, qs, ks, vs, False, sm_scale=0.3)


def test_pre_transposed_v_gives_the_same_output(interpret):
    q, k, v, qs, ks, vs = inputs(1, 2, 90, 32, 2, True, seed=4)
    vt = fa.transpose_v(v)
    assert vt.shape == (1, 1, 32, 90) and vt.stride(2) == 96
    plain = fa.attention_fp8(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs, causal=True, **SMALL)
    given = fa.attention_fp8(q, k, vt, q_scale=qs, k_scale=ks, v_scale=vs, causal=True, v_transposed=True, **SMALL)
    assert torch.equal(plain, given)
    assert torch.equal(fa.reference(q, k, vt, qs, ks, vs, True, v_transposed=True),
                       fa.reference(q, k, v, qs, ks, vs, True))


def test_p_is_scaled_into_e4m3_range_before_rounding(interpret):
    """Two keys whose weights are 1 and 2^-12: unscaled, 2^-12 rounds to 0 in e4m3 (its smallest value is 2^-9)
    and the output would be 0; scaled by 2^8 it is 2^-4, exact, and the output is v1 * 2^-12 / (1 + 2^-12)."""
    dim = 32
    q = torch.zeros(1, 1, 2, dim)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 2, dim)
    k[0, 0, 0, 0] = 1.0
    v = torch.zeros(1, 1, 2, dim)
    v[0, 0, 1] = 1.0  # key 0 scores 12 ln 2, key 1 scores 0: weights 1 and 2^-12
    one = torch.ones((), dtype=torch.float32)
    out = fa.attention_fp8(q.to(F8), k.to(F8), v.to(F8), q_scale=one, k_scale=one, v_scale=one * 4096,
                           sm_scale=12 * math.log(2), out_dtype=torch.float32, **SMALL)
    want = 4096 * 2.0 ** -12 / (1 + 2.0 ** -12)
    torch.testing.assert_close(out[0, 0], torch.full((2, dim), want), rtol=1e-5, atol=0)


def test_bad_scales_and_inputs_are_clear_errors(interpret):
    q, k, v, qs, ks, vs = inputs(1, 2, 70, 32, 1, True, seed=5)
    one = torch.ones((), dtype=torch.float32)
    run = dict(q_scale=one, k_scale=one, v_scale=one)
    with pytest.raises(ValueError, match=r"q_scale must have shape \(\) or \(1,\) .* or \(1, 2, 1\)"):
        fa.attention_fp8(q, k, v, **{**run, "q_scale": torch.ones(1, 2, 2)})
    with pytest.raises(ValueError, match=r"k_scale must have shape .*\(1, 2, 1\) \(one per 128 keys"):
        fa.attention_fp8(q, k, v, **{**run, "k_scale": torch.ones(2, 1)})
    with pytest.raises(TypeError, match="v_scale must be a float32 tensor"):
        fa.attention_fp8(q, k, v, **{**run, "v_scale": one.double()})
    with pytest.raises(TypeError, match="v_scale must be a float32 tensor .* got float"):
        fa.attention_fp8(q, k, v, **{**run, "v_scale": 1.0})
    with pytest.raises(TypeError, match="q must be a 4-d torch.float8_e4m3fn tensor, got torch.bfloat16"):
        fa.attention_fp8(q.to(torch.bfloat16), k, v, **run)
    with pytest.raises(ValueError, match=r"and v \(B, H // G, D, S\) \(v_transposed\)"):
        fa.attention_fp8(q, k, v, v_transposed=True, **run)
    with pytest.raises(ValueError, match="query heads 2 must be a multiple of key/value heads 3"):
        fa.attention_fp8(q, *(t[:, :1].expand(1, 3, 70, 32) for t in (k, v)), **run)
    with pytest.raises(ValueError, match="BM and BN must divide 128"):
        fa.attention_fp8(q, k, v, BM=64, BN=96, num_warps=4, **run)
    with pytest.raises(TypeError, match="out_dtype must be one of"):
        fa.attention_fp8(q, k, v, out_dtype=torch.float8_e4m3fn, **run)
    with pytest.raises(ValueError, match="out must be torch.bfloat16"):
        fa.attention_fp8(q, k, v, out=torch.empty(q.shape, dtype=torch.float16), **run)
    with pytest.raises(ValueError, match="sm_scale must be a finite number > 0, got -0.5"):
        fa.attention_fp8(q, k, v, sm_scale=-0.5, **run)
    with pytest.raises(ValueError, match="unknown config key"):
        fa.attention_fp8(q, k, v, BK=64, **run)


def test_gpus_without_float8_products_are_refused():
    with pytest.raises(RuntimeError, match=r"sm_89 or newer\); this GPU is sm_80: use tilejit.ops.attention"):
        fa.require_fp8_mma((8, 0))
    fa.require_fp8_mma((8, 9))
    fa.require_fp8_mma((9, 0))


def _args(seq=1000, heads=4, group=2, dim=128, per_block=True):
    q = torch.empty(2, heads, seq, dim, dtype=F8, device="meta")
    k = torch.empty(2, heads // group, seq, dim, dtype=F8, device="meta")
    vt = torch.empty(2, heads // group, dim, -(-seq // 16) * 16, dtype=F8, device="meta")[..., :seq]
    out = torch.empty(2, heads, seq, dim, dtype=torch.bfloat16, device="meta")
    blocks = -(-seq // 128)
    if per_block:
        scales = [torch.empty(2, h, blocks, dtype=torch.float32, device="meta") for h in (heads, heads // group,
                                                                                        heads // group)]
    else:
        scales = [torch.empty(1, dtype=torch.float32, device="meta")] * 3
    flags = dict(Q_BLOCKED=per_block, K_BLOCKED=per_block, V_BLOCKED=per_block)
    return (q, k, vt, out, *scales, 0.088, heads), dict(GROUP=group, D=dim, **flags)


def _final_ir(arch, causal=True, per_block=True, **config):
    args, meta = _args(per_block=per_block)
    return fa.attn_fwd_fp8.compile(*args, CAUSAL=causal, **meta, **config, arch=arch, stop_after="passes").final_ir


def test_hopper_default_runs_p_at_v_from_registers_deferred():
    """sm_90a, the default config: q @ k^T on float8 wgmma from shared memory, p @ v with P's e4m3 fragment
    gathered from registers (no staging through shared memory), issued one iteration late under the next
    block's q @ k^T in the unmasked loop, as the bf16 forward's."""
    args, meta = _args()
    stages = fa.attn_fwd_fp8.compile(*args, CAUSAL=True, **meta, **fa.default_config(128, hopper=True),
                                     arch="sm_90a", stop_after="cuda")
    gemms = [line for line in stages.final_ir.splitlines() if "tj.gemm" in line]
    impls = [g.split("impl = ")[1].split("}")[0] for g in gemms]
    assert impls == ["wgmma_m64nNk32_fp8", "wgmma_rs_m64nNk32_fp8"] * 2  # the unmasked loop, the masked one
    assert all("precision = fast" in g for g in gemms)
    assert "tj.convert_layout" not in stages.final_ir  # P is never staged through shared memory
    cuda = stages.cuda
    assert "the previous iteration's last gemm, issued under this iteration's math" in cuda
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in cuda and "{%64, %65, %66, %67}" in cuda
    assert "__byte_perm(__shfl_sync(0xffffffffu, x, tj_q0), __shfl_sync(0xffffffffu, x, tj_q1), tj_sel)" in cuda


@pytest.mark.parametrize("arch, qk, pv", [("sm_89", "mma_sync_m16n8k32_fp8", "mma_sync_m16n8k32_fp8"),
                                           ("sm_100a", "tcgen05_mma_f8f6f4", "mma_sync_m16n8k32_fp8"),
                                           ("sm_80", "fma_fallback", "fma_fallback")])
def test_other_archs_choose_their_float8_products(arch, qk, pv):
    """sm_100a: q @ k^T on tcgen05, p @ v (P in registers) on mma.sync; sm_80 has no float8 products: the FMA
    fallback compiles (attention_fp8 refuses such GPUs)."""
    ir = _final_ir(arch, per_block=False, **fa.default_config(128))
    impls = [line.split("impl = ")[1].split("}")[0] for line in ir.splitlines() if "tj.gemm" in line]
    assert impls == [qk, pv, qk, pv]


@pytest.mark.parametrize("arch", [a for a in ("sm_89", "sm_90a", "sm_100a") if nvrtc_supports(a)])
def test_default_config_compiles_to_a_cubin(arch):
    args, meta = _args(seq=4096)
    compiled = fa.attn_fwd_fp8.compile(*args, CAUSAL=False, **meta, **fa.default_config(128, arch == "sm_90a"),
                                       arch=arch)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"


HOPPER_CASES = [(bm, bn, w, ws) for bm, bn, w in fa.CONFIGS[128] for ws in (False, True)]


@pytest.mark.skipif(not nvrtc_supports("sm_90a"), reason="NVRTC without sm_90a")
@pytest.mark.parametrize("bm, bn, warps, ws", HOPPER_CASES,
                         ids=[f"{m}x{n}-w{w}{'-ws' if s else ''}" for m, n, w, s in HOPPER_CASES])
def test_every_head_dim_128_config_compiles_for_sm90a(bm, bn, warps, ws):
    args, meta = _args()
    extra = dict(warp_specialize=True, STAGES=3) if ws else {}
    compiled = fa.attn_fwd_fp8.compile(*args, CAUSAL=True, **meta, BM=bm, BN=bn, num_warps=warps, **extra,
                                       arch="sm_90a")
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert "wgmma_rs_m64nNk32_fp8" in compiled.asm["ir"]
