"""Kernels launched without pipeline options run what the launch model chose (passes/launch_model.py) and compute
the right thing: the README matmul on plain tiles of every dtype and the obvious attention forward, on ragged
shapes with NaN-poisoned outputs, against float64 references; and the choice recorded in the compiled kernel is
the model's for this GPU's arch.

Run on a GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_launch_model.py`` (the choices differ from the fixed
defaults on sm_90 GPUs only).
"""
from __future__ import annotations

import math

import pytest
import torch

import tilejit
from benchmarks.kernels import attention_one_loop, matmul
from tilejit.passes.launch_model import choose, loop_shape
from tilejit.runtime.launch import resolve_arch

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "tf32": torch.float32, "fp8": torch.float8_e4m3fn}
# (BM, BN, BK for 16-bit operands, num_warps): two blocks per SM (plain), one (warp-specialized, 4 stages) and
# 64 KiB stages (warp-specialized and persistent on sm_90a)
TILES = [(128, 128, 64, 4), (128, 256, 64, 8), (256, 128, 64, 8), (128, 128, 128, 8)]


def _expected(kernel, args, kwargs) -> dict:
    """What the model chooses for this launch on this GPU."""
    from tilejit.compiler import run_stages

    call = kernel.bind(args, dict(kwargs))
    fn = run_stages(call.spec, None, "ir").fn
    return choose(loop_shape(fn), resolve_arch(None, torch.cuda.current_device()), kwargs["num_warps"]).values


@pytest.mark.parametrize("tile", TILES, ids=lambda t: "{}x{}x{}w{}".format(*t))
@pytest.mark.parametrize("shape", [(1000, 904, 520), (256, 512, 4096), (130, 200, 72)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_without_options(dtype, shape, tile):
    m, n, k = shape
    bm, bn, bk16, warps = tile
    dt = DTYPES[dtype]
    if dt.itemsize == 1 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    torch.manual_seed(m + n + k + bm + bn)
    a = torch.randn(m, k, device="cuda").to(dt)
    b = torch.randn(k, n, device="cuda").to(dt)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    kw = dict(BM=bm, BN=bn, BK=bk16 * 2 // dt.itemsize, num_warps=warps)
    compiled = matmul.kernel.compile(a, b, c, **kw)
    assert compiled.meta["launch_model"] == _expected(matmul.kernel, (a, b, c), kw)
    for _ in range(2):  # the slow path, then the fast one
        c.fill_(float("nan"))
        matmul.kernel[(tilejit.cdiv(m, bm) * tilejit.cdiv(n, bn),)](a, b, c, **kw)
        torch.cuda.synchronize()
        ref = a.double() @ b.double()
        assert not torch.isnan(c).any()
        err = (c.double() - ref).abs().max().item()
        if dt.itemsize == 1:  # wgmma sums each chunk of up to 128 fp8 products keeping ~14 bits (the precise
            # mode promotes between chunks): up to 2^-14 of the largest sum per term of a chunk
            tol = 2.0 ** -14 * min(k, 128) * ref.abs().max().item() + 1e-3
        else:
            tol = (1e-2 if dt == torch.float32 else 1e-5) * k ** 0.5 * ref.abs().max().item() + 1e-3
        assert err <= tol, err


def test_one_block_tiles_are_warp_specialized_on_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the model warp-specializes on sm_90a only")
    a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    c = torch.empty(512, 512, device="cuda", dtype=torch.float16)
    compiled = matmul.kernel.compile(a, a, c, BM=128, BN=256, BK=64, num_warps=8)
    assert compiled.threads == 256 + 128 and compiled.meta["num_stages"] == 4
    assert "producer_warpgroup = true" in compiled.asm["ir"]
    plain = matmul.kernel.compile(a, a, c, BM=128, BN=256, BK=64, num_warps=8, num_stages=3)
    assert plain.threads == 256 and "launch_model" not in plain.meta


@pytest.mark.parametrize("tile", [(128, 128, 8), (128, 64, 8), (64, 128, 4), (64, 64, 4)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_attention_forward_without_options(d, causal, tile):
    bm, bn, warps = tile
    torch.manual_seed(d + bm + bn + causal)
    batch, heads, seq = 2, 3, 1000  # ragged: 1000 is no multiple of any tile
    q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    scale = 1.0 / math.sqrt(d)
    kw = dict(BM=bm, BN=bn, D=d, CAUSAL=causal, num_warps=warps)
    compiled = attention_one_loop.compile(q, k, v, o, scale, **kw)
    assert compiled.meta["launch_model"] == _expected(attention_one_loop, (q, k, v, o, scale), kw)
    attention_one_loop[(tilejit.cdiv(seq, bm), heads, batch)](q, k, v, o, scale, **kw)
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert not torch.isnan(o).any()
    assert (o.double() - ref).abs().max().item() < 2e-2
