"""Peeled masks and the longest-first program order on the GPU (``passes/peel_masks.py``,
``passes/program_order.py``): the one-loop attention forward (causal and not, ragged sequence lengths, the mma.sync
path and Hopper's warp-specialized one) and a ragged-tail row sum give the same bits with ``peel_masks`` (and
``longest_first``) on, the defaults, and off, and match float64 references; NaN-poisoned outputs."""
from __future__ import annotations

import pytest
import torch

import tilejit
from attention_checks import check, inputs
from benchmarks.kernels import attention_one_loop
from kernels import ragged_exp_row_sum

pytestmark = pytest.mark.gpu

# (BM, BN, D, launch options): the sm_80 path, and Hopper's warp-specialized 3-deep ring (deferred p @ v)
CONFIGS = {
    "64x64-d64-w4": (64, 64, 64, dict(num_warps=4)),
    "128x64-d128-w8": (128, 64, 128, dict(num_warps=8)),
    "128x128-d128-w8-ws": (128, 128, 128, dict(num_warps=8, num_stages=3, warp_specialize=True)),
}


def _forward(q, k, v, causal, bm, bn, dim, options, peel, longest_first=True):
    out = torch.full_like(q, float("nan"))
    batch, heads, seq, _ = q.shape
    attention_one_loop[(tilejit.cdiv(seq, bm), heads, batch)](q, k, v, out, dim ** -0.5, BM=bm, BN=bn, D=dim,
                                                               CAUSAL=causal, peel_masks=peel,
                                                               longest_first=longest_first, **options)
    return out


@pytest.mark.parametrize("seq", [1, 17, 100, 1000, 4097])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_one_loop_attention_peeled_equals_unpeeled(config, causal, seq):
    bm, bn, dim, options = CONFIGS[config]
    if options.get("warp_specialize") and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("warp specialization is a Hopper form")
    q, k, v = inputs(2, 3, seq, dim, 1, dtype=torch.bfloat16, seed=seq + causal + bm)
    peeled = _forward(q, k, v, causal, bm, bn, dim, options, True)
    whole = _forward(q, k, v, causal, bm, bn, dim, options, False)
    final_ir = attention_one_loop.compile(q, k, v, peeled, dim ** -0.5, BM=bm, BN=bn, D=dim, CAUSAL=causal,
                                          stop_after="passes", **options).final_ir
    assert "peeled = unmasked" in final_ir and "peeled = masked" in final_ir
    assert torch.equal(peeled, whole), (peeled.float() - whole.float()).abs().max().item()
    grid_order = _forward(q, k, v, causal, bm, bn, dim, options, True, longest_first=False)
    assert torch.equal(peeled, grid_order), "the longest-first order changed the results"
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                           scale=dim ** -0.5)
    check(peeled, ref)


@pytest.mark.parametrize("cols", [1, 127, 128, 129, 1000, 4099])
def test_ragged_tail_peeled_equals_unpeeled(cols):
    torch.manual_seed(cols)
    x = torch.randn(70, cols, device="cuda", dtype=torch.float16)
    outs = []
    for peel in (True, False):
        out = torch.full((70,), float("nan"), device="cuda")
        ragged_exp_row_sum[(tilejit.cdiv(70, 16),)](x, out, BM=16, BN=128, peel_masks=peel)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0].double(), x.double().exp().sum(1), rtol=1e-4, atol=1e-4)
