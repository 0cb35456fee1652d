"""Relaxed tile atomic_adds of wgmma accumulators on the GPU: on sm_90 they are TMA bulk reductions
(``cp.reduce.async.bulk.tensor``, backend_cuda/lower_atomic.py), elsewhere per-element ``red``; either way the sums
must be right.

A split-K matmul adds every program's partial tile into a random float32 C (never zeros) on shapes that are not
multiples of the tiles, against a float64 C0 + A @ B; C is a column window of a wider tensor whose neighbours must
keep their values (TMA clips at the window's extents). A second kernel adds each K block's product into the same
window from hundreds of programs inside a pipelined (and a warp-specialized) loop, so reductions to the same lines
run concurrently: in float32 against float64, and in int32 from int8 products, exactly.

Run on a machine with an sm_90+ GPU: ``python -m pytest -q -m gpu tests/gpu/test_gpu_tma_reduce.py``.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from kernels import accumulate_blocks, splitk_atomic

pytestmark = [pytest.mark.gpu, pytest.mark.requires_sm(90)]

BULK = "bulk reductions into global"


def _takes_bulk_path(cuda: str) -> None:
    """On an sm_90 GPU (sm_90a: wgmma accumulators), the atomic is the bulk reduction these tests are about."""
    if torch.cuda.get_device_capability() == (9, 0):
        assert BULK in cuda


@pytest.mark.parametrize("tile", [(128, 128, 64, 8), (64, 128, 64, 4), (128, 64, 64, 4)],
                         ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("shape", [(1000, 1000, 3000, 4), (77, 264, 1000, 3), (300, 520, 4096, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_split_k_atomic_add_into_random_c_matches_float64(tile, shape):
    bm, bn, bk, warps = tile
    m, n, k, splits = shape
    torch.manual_seed(m + 3 * n + 7 * k + bm + bn)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    wide = torch.full((m, n + 16), 7.0, device="cuda", dtype=torch.float32)
    c = wide[:, 8:8 + n]
    c.copy_(torch.randn(m, n, device="cuda"))
    c0 = c.double()
    k_split = tilejit.cdiv(tilejit.cdiv(k, splits), bk) * bk
    grid = (tilejit.cdiv(m, bm), tilejit.cdiv(n, bn), tilejit.cdiv(k, k_split))
    splitk_atomic[grid](a, b, c, k_split, BM=bm, BN=bn, BK=bk, num_warps=warps)
    torch.cuda.synchronize()
    _takes_bulk_path(splitk_atomic.compile(a, b, c, k_split, BM=bm, BN=bn, BK=bk, num_warps=warps,
                                           stop_after="cuda").cuda)
    ref = c0 + a.double() @ b.double()
    assert not torch.isnan(c).any()
    scale = ref.abs().max().item()
    # bf16 operands are exact; the float32 accumulation's error grows ~sqrt(K), and each of the grid's adds rounds
    bound = 1e-5 * k ** 0.5 * scale + grid[2] * 2 ** -23 * scale + 1e-4
    err = (c.double() - ref).abs().max().item()
    assert err <= bound, (err, bound)
    assert (wide[:, :8] == 7).all() and (wide[:, 8 + n:] == 7).all()


@pytest.mark.parametrize("options", [{}, {"warp_specialize": True}], ids=["pipelined", "warp_specialized"])
def test_many_programs_reduce_into_one_window_in_a_loop(options):
    programs, bm, bn, bk, k = 264, 64, 128, 64, 1024  # two programs an SM: 16 reductions each, all on one window
    torch.manual_seed(programs + len(options))
    a = torch.randn(programs, bm, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(programs, k, bn, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(bm, bn, device="cuda", dtype=torch.float32)
    c0 = c.double()
    accumulate_blocks[(programs,)](a, b, c, BM=bm, BN=bn, BK=bk, num_warps=4, **options)
    torch.cuda.synchronize()
    _takes_bulk_path(accumulate_blocks.compile(a, b, c, BM=bm, BN=bn, BK=bk, num_warps=4, stop_after="cuda",
                                               **options).cuda)
    ref = c0 + torch.einsum("pmk,pkn->mn", a.double(), b.double())
    adds = programs * (k // bk)
    scale = ref.abs().max().item()
    # every add rounds once in float32 (a lost or doubled block's product would be ~8, far above this)
    bound = adds * 2 ** -23 * scale + 1e-3
    err = (c.double() - ref).abs().max().item()
    assert err <= bound, (err, bound)


def test_int32_reductions_from_many_programs_are_exact():
    """int8 products summed in int32 by bulk reductions through an int32 map: every update counted, exactly."""
    programs, bm, bn, bk, k = 264, 64, 128, 128, 1024
    torch.manual_seed(5)
    # small values: the sums stay far inside int32 and are exact in float64, the reference's type
    a = torch.randint(-8, 8, (programs, bm, k), device="cuda", dtype=torch.int8)
    b = torch.randint(-8, 8, (programs, bn, k), device="cuda", dtype=torch.int8)
    c = torch.randint(-2 ** 20, 2 ** 20, (bm, bn), device="cuda", dtype=torch.int32)
    c0 = c.double()
    accumulate_blocks[(programs,)](a, b, c, BM=bm, BN=bn, BK=bk, TB=True, ACC=T.int32, num_warps=4)
    torch.cuda.synchronize()
    _takes_bulk_path(accumulate_blocks.compile(a, b, c, BM=bm, BN=bn, BK=bk, TB=True, ACC=T.int32, num_warps=4,
                                               stop_after="cuda").cuda)
    ref = c0 + torch.einsum("pmk,pnk->mn", a.double(), b.double())
    assert ref.abs().max().item() < 2 ** 31  # no wrap-around
    assert torch.equal(c.double(), ref)
