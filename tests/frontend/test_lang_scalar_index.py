"""Scalar indexing ``X[i, j]``: a one-element load gives a 0-d scalar, ``X[i, j] = v`` stores one element; out of
bounds reads 0 and writes nothing, as slices do."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from filecheck import filecheck
from lang_kernels import scalar_index, scalar_index_mixed


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def test_scalar_index_ir():
    ir = scalar_index_mixed.ir(meta(8, 16), meta(16), meta(8, 16), 3, 5, BN=16)
    filecheck(ir, r"""
        CHECK: %v = tj.load %X[%i, %j] {shape = [1, 1], dropped = [0, 1]} : f32
        CHECK: tj.store {{.*}}, %Out[%i, %j] {shape = [1, 1], dropped = [0, 1]}
        CHECK: tj.splat %v {shape = [16]} : tile<16xf32>
    """)


def test_scalar_index_interpreter(interpret):
    x = torch.randn(5, 7)
    y = torch.full((5, 7), float("nan"))
    scalar_index[(5,)](x, y, BN=8)  # column 7 is out of bounds: read 0, not written
    torch.testing.assert_close(y, 2 * x + x[:, :1])


@pytest.mark.parametrize("i, j", [(3, 5), (-1, 2), (3, 40), (9, 0)])
def test_scalar_index_out_of_bounds(interpret, i, j):
    x = torch.randn(8, 16)
    y = torch.full((16,), float("nan"))
    out = torch.full((8, 16), 7.0)
    scalar_index_mixed[(1,)](x, y, out, i, j, BN=16)
    inside = 0 <= i < 8 and 0 <= j < 16
    v = x[i, j] if inside else torch.tensor(0.0)
    expected_out = torch.full((8, 16), 7.0)
    if inside:
        expected_out[i, j] = 3 * v
    torch.testing.assert_close(out, expected_out)
    row = x[i] if 0 <= i < 8 else torch.zeros(16)
    torch.testing.assert_close(y, row + v)


def test_scalar_store_casts_to_the_tensor_dtype(interpret):
    @tilejit.kernel
    def k(X, n):
        X[n] = n * 2 + 1
        X[n + 1] = 2.75

    x = torch.zeros(4, dtype=torch.int32)
    k[(1,)](x, 1)
    assert x.tolist() == [0, 3, 2, 0]


def test_scalar_index_cuda_text():
    src = scalar_index_mixed.compile(meta(8, 16), meta(16), meta(8, 16), 3, 5, BN=16, arch="sm_80",
                                     stop_after="cuda").cuda
    filecheck(src, r"""
        CHECK: const float {{v[0-9]+_v}} = ((uint64_t)(int64_t)({{.*}}) < (uint64_t){{.*}}_size0 && {{.*}}) ? *({{.*}}) : float{};
        CHECK: if ({{.*}}) *({{.*}}Out{{.*}}) = {{.*}};
    """)
