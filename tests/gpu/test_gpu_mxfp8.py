"""Microscaled float8 products on the GPU (``tilejit.ops.mxfp8``, ``T.gemm``'s microscaled form): e4m3/e5m2
operands with e8m0 scales per 32 of K, quantized from random data (each 32-block's scale the power of two that
brings its largest magnitude into e4m3's range), against the float64 product of the dequantized operands;
ragged M, N and K, NaN-poisoned outputs. On sm_80 / sm_90a (and, compiled only, sm_100a) the operands are
dequantized into bfloat16 exactly and summed in float32: float32 out differs from float64 by float32 sums only
(well under 1e-5 relative); bf16 out by its rounding (about 2^-9 per element).

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_mxfp8.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.ops.mxfp8 as X

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
                               reason="needs a GPU with bf16 tensor cores (sm_80+)")
CONFIGS = {"default": {}, "128x128": dict(BM=128, BN=128, STAGES=3, num_warps=8),
           "64x64": dict(BM=64, BN=64, STAGES=3, num_warps=4)}


def _quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """MX quantization of ``x`` (rows, K) along K: (values of ``dtype``, e8m0 scales (rows, cdiv(K, 32)))."""
    rows, k = x.shape
    kb = tilejit.cdiv(k, 32)
    xp = torch.nn.functional.pad(x, (0, kb * 32 - k)).view(rows, kb, 32)
    top = 448.0 if dtype == torch.float8_e4m3fn else 57344.0
    exponent = torch.ceil(torch.log2(xp.abs().amax(-1).clamp_min(2.0 ** -100) / top)).clamp(-127, 127)
    values = (xp / torch.exp2(exponent)[..., None]).view(rows, kb * 32)[:, :k].to(dtype)
    scales = (exponent + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    return values.contiguous(), scales.contiguous()


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any(), "an output was left unwritten"
    return ((out.double() - ref).norm() / ref.norm()).item()


@needs_gpu
@pytest.mark.parametrize("config", CONFIGS, ids=list(CONFIGS))
@pytest.mark.parametrize("m,n,k,b_dtype", [(1000, 2112, 7168, torch.float8_e4m3fn), (77, 200, 300, torch.float8_e5m2),
                                           (4096, 4096, 4096, torch.float8_e4m3fn), (1, 136, 96, torch.float8_e4m3fn)])
def test_mxfp8_matmul_matches_the_dequantized_float64_product(config, m, n, k, b_dtype):
    torch.manual_seed(m * 31 + n * 7 + k)
    x = torch.randn(m, k, device="cuda") * torch.exp2(torch.randint(-6, 7, (m, 1), device="cuda").float())
    w = torch.randn(n, k, device="cuda")
    a, sa = _quantize(x, torch.float8_e4m3fn)
    b, sb = _quantize(w, b_dtype)
    ref = X.reference(a, sa, b, sb)
    out = torch.full((m, n), float("nan"), device="cuda")
    cfg = {**X.default_config(m, n), **CONFIGS[config], "BK": X.BK}
    grid = (tilejit.cdiv(m, cfg["BM"]), tilejit.cdiv(n, cfg["BN"]))
    X.mxfp8_mm[grid](a, sa, b, sb, out, **cfg)
    assert _error(out, ref) < 1e-5
    bf16 = X.mxfp8_matmul(a, sa, b, sb, **CONFIGS[config])
    assert bf16.dtype == torch.bfloat16 and _error(bf16, ref) < 4e-3


@tilejit.kernel
def _widen(S, OUT, N: tilejit.language.constexpr):
    OUT[0:N] = S[0:N].to(tilejit.language.float32)


@needs_gpu
def test_every_e8m0_byte_converts_to_its_power_of_two():
    bits = torch.arange(256, dtype=torch.int32, device="cuda").to(torch.uint8)
    out = torch.full((256,), -1.0, device="cuda")
    _widen[(1,)](bits.view(torch.float8_e8m0fnu), out, N=256)
    want = bits.view(torch.float8_e8m0fnu).float()  # torch's meaning: 2^(e - 127), 0xff NaN
    assert torch.equal(out[:255], want[:255]) and out[255].isnan()
