"""Contract checks of tilejit.ops found by calling the ops as a user would (CPU: meta tensors for the refusals, the
interpreter for results): a softmax scale the kernels cannot honour, a tile of 0 and an infinite eps are refused
with a typed error naming the argument, where they used to give NaN, ZeroDivisionError or a type-check error
pointing into tilejit's own kernel source; the scales they do take still give SDPA's results."""
from __future__ import annotations


import pytest
import torch

from tilejit import ops
from tilejit.errors import ArgumentValueError
from tilejit.ops import fused_attention, varlen_attention
import tilejit.ops.paged_decode as decode

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu


@pytest.fixture
def interpret(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


Q, KV = (1, 2, 20, 32), (1, 1, 20, 32)
CU = torch.tensor([0, 5, 20], dtype=torch.int32, device="meta")
CALLS_WITH_SCALE = {
    "attention": lambda s: ops.attention(_meta(*Q), _meta(*KV), _meta(*KV), sm_scale=s),
    "attention_forward": lambda s: ops.attention_forward(_meta(*Q), _meta(*KV), _meta(*KV), sm_scale=s),
    "attention_backward": lambda s: ops.attention_backward(_meta(*Q), _meta(*Q), _meta(*KV), _meta(*KV), _meta(*Q),
                                                           _meta(1, 2, 20, dtype=torch.float32), sm_scale=s),
    "attention_varlen": lambda s: ops.attention_varlen(_meta(20, 2, 32), _meta(20, 1, 32), _meta(20, 1, 32), CU, CU,
                                                       15, 15, sm_scale=s),
    "decode_attention": lambda s: ops.decode_attention(_meta(2, 2, 32), _meta(2, 20, 1, 32), _meta(2, 20, 1, 32),
                                                       torch.empty(2, dtype=torch.int32, device="meta"), sm_scale=s),
}


@pytest.mark.parametrize("scale", [-0.5, 0.0, 0])
@pytest.mark.parametrize("op", sorted(CALLS_WITH_SCALE))
def test_non_positive_sm_scale_is_refused(op, scale):
    """The kernels scale each row's running max of the unscaled scores: a negative scale took the minimum, a zero
    one multiplied the masked -inf by 0; both gave NaN outputs (attention_fp8 already refused them)."""
    with pytest.raises(ArgumentValueError, match=f"{op}: sm_scale must be a finite number > 0"):
        CALLS_WITH_SCALE[op](scale)


def test_positive_scales_still_match_sdpa(interpret):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 32, dtype=torch.float16) for _ in range(3))
    for scale in (1e-3, 0.3, 4.0):
        out = ops.attention(q, k, v, causal=True, sm_scale=scale)
        torch.testing.assert_close(out.double(), fused_attention.reference(q, k, v, True, sm_scale=scale),
                                   rtol=2e-2, atol=2e-2)
    cu = torch.tensor([0, 1, 37], dtype=torch.int32)
    qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
    out = ops.attention_varlen(qp, kp, vp, cu, cu, 36, 36, causal=True, sm_scale=0.05)
    torch.testing.assert_close(out.double(), varlen_attention.reference(qp, kp, vp, cu, cu, causal=True,
                                                                        sm_scale=0.05), rtol=2e-2, atol=2e-2)
    lens = torch.tensor([29], dtype=torch.int32)
    cache_k, cache_v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()   # (1, 37, 2, 32)
    out = ops.decode_attention(q[:, :, 0], cache_k, cache_v, lens, sm_scale=2.5)
    torch.testing.assert_close(out.double(), decode.reference(q[:, :, 0], cache_k, cache_v, lens, sm_scale=2.5),
                               rtol=2e-2, atol=2e-2)


_A8, _B8 = _meta(4, 64, dtype=E4M3), _meta(8, 64, dtype=E4M3)
CALLS_WITH_CONFIG = {
    "attention": lambda **c: ops.attention(_meta(*Q), _meta(*KV), _meta(*KV), **c),
    "attention_forward": lambda **c: ops.attention_forward(_meta(*Q), _meta(*KV), _meta(*KV), **c),
    "attention bwd_config": lambda **c: ops.attention(_meta(*Q).requires_grad_(), _meta(*KV), _meta(*KV),
                                                      bwd_config={"dq": c}),
    "decode_attention": lambda **c: ops.decode_attention_forward(_meta(2, 2, 32), _meta(2, 20, 1, 32),
                                                                 _meta(2, 20, 1, 32),
                                                                 torch.empty(2, dtype=torch.int32, device="meta"), **c),
    "mxfp8_matmul": lambda **c: ops.mxfp8_matmul(_A8, _meta(4, 2, dtype=E8M0), _B8, _meta(8, 2, dtype=E8M0), **c),
    "fp8_blockscaled_matmul": lambda **c: ops.fp8_blockscaled_matmul(_A8, _meta(4, 1, dtype=torch.float32), _B8,
                                                                     _meta(1, 1, dtype=torch.float32), **c),
}


@pytest.mark.parametrize("key", ["BM", "BN", "STAGES"])
@pytest.mark.parametrize("op", sorted(CALLS_WITH_CONFIG))
def test_a_tile_of_zero_is_refused(op, key):
    """BM=0 / BN=0 divided by zero computing the grid; STAGES=0 failed type-checking tilejit's own kernel."""
    with pytest.raises(ArgumentValueError, match=f"config key '{key}' must be a positive int, got 0"):
        CALLS_WITH_CONFIG[op](**{key: 0})


def test_attention_forward_checks_its_config_keys():
    with pytest.raises(ArgumentValueError, match=r"attention_forward: unknown config key\(s\) \['BQ'\]"):
        ops.attention_forward(_meta(*Q), _meta(*KV), _meta(*KV), BQ=64)


@pytest.mark.parametrize("eps", [float("inf"), float("nan"), -1e-6])
def test_rms_norm_eps_is_finite_and_non_negative(eps):
    """eps = inf was taken and normalized every row to 0."""
    with pytest.raises(ArgumentValueError, match="rms_norm: eps must be a number >= 0 and finite"):
        ops.rms_norm(_meta(3, 8), _meta(8), eps=eps)
