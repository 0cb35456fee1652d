"""Every operand major-ness of 16-bit matmuls on sm_90a wgmma (NN, NT, TN, TT), against float64 on ragged shapes
with NaN-poisoned outputs: A given K x M goes through the descriptor's transpose immediate, B given K x N too.

Run on an sm_90 GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_wgmma_majors.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import MAJORS as LAYOUTS, matmul_any

pytestmark = [pytest.mark.gpu, pytest.mark.sm90a("wgmma")]



@pytest.mark.parametrize("tile", [(64, 64, 4), (128, 128, 4), (128, 256, 8)], ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("shape", [(1000, 300, 777), (256, 512, 4096), (7, 129, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_all_majors(dtype, layout, shape, tile):
    m, n, k = shape
    bm, bn, warps = tile
    ta, tb = LAYOUTS[layout]
    torch.manual_seed(m + n + k + 3 * ta + tb)
    a = torch.randn(k, m, device="cuda", dtype=dtype) if ta else torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype) if tb else torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    kw = dict(BM=bm, BN=bn, BK=64, TA=ta, TB=tb, ACC=T.float32, num_warps=warps)
    compiled = matmul_any.compile(a, b, c, **kw)
    assert "impl = wgmma_m64nNk16" in compiled.asm["ir"]
    matmul_any[(tilejit.cdiv(m, bm), tilejit.cdiv(n, bn))](a, b, c, **kw)
    torch.cuda.synchronize()
    ref = (a.double().T if ta else a.double()) @ (b.double().T if tb else b.double())
    assert not torch.isnan(c).any()
    err = (c.double() - ref).abs().max().item()
    assert err <= 1e-5 * k ** 0.5 * ref.abs().max().item() + 1e-3, err
