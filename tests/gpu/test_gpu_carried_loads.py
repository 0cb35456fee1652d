"""Loads whose pointers a loop carries (backend_cuda/carried_loads.py) on the GPU: a per-row vector and a single
element read each trip, forward and backward loops, a warp-specialized loop whose first iteration runs on its
own (sm_90), against a float64 reference over ragged shapes (rows and
columns not multiples of the tiles, the last block short), outputs NaN-poisoned."""
from __future__ import annotations

import pytest
import torch

from test_carried_loads import row_scaled_sum, scaled_two_products

pytestmark = pytest.mark.gpu


def _reference(x, s, tab, bk, div, out_cols):
    m, k = x.shape
    want = torch.zeros(m, out_cols, dtype=torch.float64)
    for k0 in range(0, k, bk):
        kb = k0 // div
        block = x[:, k0:k0 + bk].double().cpu()
        scale = (s[:, kb].double().cpu() if kb < s.shape[1] else torch.zeros(m, dtype=torch.float64))[:, None]
        weight = float(tab[kb]) if kb < tab.shape[0] else 0.0
        want[:, :block.shape[1]] += block * scale * weight
    return want


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("m,k,bm,bk,warps", [(300, 1000, 64, 32, 4), (77, 333, 32, 16, 4), (513, 2047, 128, 64, 8)])
def test_carried_row_and_element_loads_give_the_sums(m, k, bm, bk, warps, reverse):
    gen = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=gen).cuda()
    blocks = -(-k // bk) - 2  # S and Tab end before the last blocks: their loads read 0 there
    s = torch.randn(m, blocks, generator=gen).cuda()
    tab = torch.randn(blocks, generator=gen).cuda()
    out = torch.full((m, bk), float("nan"), device="cuda")
    row_scaled_sum[(-(-m // bm),)](x, s, tab, out, BM=bm, BK=bk, DIV=bk, REVERSE=reverse, num_warps=warps)
    want = _reference(x, s, tab, bk, bk, bk)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double().cpu(), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("m,s", [(1000, 900), (129, 200), (300, 1000)])
def test_carried_element_in_a_loop_issued_one_iteration_late(m, s, requires_sm):
    requires_sm(90)
    gen = torch.Generator().manual_seed(m * s)
    q, k, v = (torch.randn(rows, 128, generator=gen).to(torch.bfloat16) for rows in (m, s, s))
    blocks = -(-s // 64)
    scale = torch.rand(blocks - 1, generator=gen) + 0.5  # one short: the last block's scale reads 0
    out = torch.full((m, 128), float("nan"), device="cuda")
    scaled_two_products[(-(-m // 128),)](q.cuda(), k.cuda(), v.cuda(), scale.cuda(), out, BM=128, BN=64, D=128,
                                         num_warps=8)
    want = torch.zeros(m, 128, dtype=torch.float64)
    for j in range(blocks):
        rows = slice(64 * j, 64 * (j + 1))
        p = q.double() @ k[rows].double().T * (float(scale[j]) if j < blocks - 1 else 0.0)
        want += p.to(torch.bfloat16).double() @ v[rows].double()
    assert not out.isnan().any()
    # (P is rounded to bf16 from float32 scores here, from float64 ones there: a rare element rounds the other way)
    assert float((out.double().cpu() - want).norm() / want.norm()) < 2e-3
