"""Issue 16's language constructs on the GPU: scalar indexing, atomics under contention, split-K, gather and
scatter with duplicate and out-of-range indices, the extra math functions. Outputs are NaN-poisoned where a
missed element would otherwise go unnoticed; shapes are not multiples of the tiles."""
from __future__ import annotations

import pytest
import torch

import lang_kernels as lk

pytestmark = pytest.mark.gpu


def test_scalar_index_gpu():
    x = torch.randn(37, 29, device="cuda")
    y = torch.full((37, 29), float("nan"), device="cuda")
    lk.scalar_index[(37,)](x, y, BN=32)  # columns 29..31 are out of bounds
    torch.testing.assert_close(y, 2 * x + x[:, :1])


@pytest.mark.parametrize("i, j", [(3, 5), (-1, 2), (3, 40), (9, 0)])
def test_scalar_index_mixed_gpu(i, j):
    x = torch.randn(8, 16, device="cuda")
    y = torch.full((16,), float("nan"), device="cuda")
    out = torch.full((8, 16), 7.0, device="cuda")
    lk.scalar_index_mixed[(1,)](x, y, out, i, j, BN=16)
    inside = 0 <= i < 8 and 0 <= j < 16
    v = x[i, j] if inside else torch.tensor(0.0, device="cuda")
    expected_out = torch.full((8, 16), 7.0, device="cuda")
    if inside:
        expected_out[i, j] = 3 * v
    torch.testing.assert_close(out, expected_out)
    row = x[i] if 0 <= i < 8 else torch.zeros(16, device="cuda")
    torch.testing.assert_close(y, row + v)
