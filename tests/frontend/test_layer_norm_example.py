"""examples/layer_norm.py: forward and backward through the interpreter against torch autograd in float64 (ragged
shapes, NaN-poisoned outputs), the example script itself, and its kernels compiled for every arch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lang_kernels as lk

REPO = Path(__file__).resolve().parents[2]
ln = lk.load_example("layer_norm")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def run_poisoned(x, w, b, dy, eps=1e-5):
    """The three kernels launched on NaN-filled outputs: (y, mean, rstd, dx, dw, db)."""
    M, N = x.shape
    BM, BN = ln._tiles(N)
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    nan = float("nan")
    y, dx = torch.full_like(x, nan), torch.full_like(x, nan)
    mean, rstd = torch.full((M,), nan, dtype=stat), torch.full((M,), nan, dtype=stat)
    ln.layer_norm_fwd[(-(-M // BM),)](x, w, b, y, mean, rstd, eps, BM=BM, BN=BN)
    P = -(-M // BM)
    dwp, dbp = torch.full((P, N), nan, dtype=stat), torch.full((P, N), nan, dtype=stat)
    ln.layer_norm_bwd_dx[(P,)](x, dy, w, mean, rstd, dx, dwp, dbp, BM=BM, BN=BN)
    dw, db = torch.full_like(w, nan), torch.full_like(w, nan)
    ln.column_sums[(-(-N // 16),)](dwp, dw, BM=8, BN=16)
    ln.column_sums[(-(-N // 16),)](dbp, db, BM=8, BN=16)
    return y, mean, rstd, dx, dw, db


@pytest.mark.parametrize("M, N", [(37, 300), (9, 1100), (1, 17)])
def test_layer_norm_float64_matches_autograd(interpret, M, N):
    torch.manual_seed(M * N)
    x = torch.randn(M, N, dtype=torch.float64) * 3 + 1
    w, b = torch.randn(N, dtype=torch.float64), torch.randn(N, dtype=torch.float64)
    dy = torch.randn(M, N, dtype=torch.float64)
    y, mean, rstd, dx, dw, db = run_poisoned(x, w, b, dy)
    ry, rdx, rdw, rdb = ln.reference(x, w, b, dy)
    for got, ref in ((y, ry), (dx, rdx), (dw, rdw), (db, rdb)):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mean, x.mean(1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rstd, 1 / torch.sqrt(x.var(1, unbiased=False) + 1e-5), rtol=1e-10, atol=1e-10)


def test_layer_norm_float32_and_the_autograd_function(interpret):
    torch.manual_seed(3)
    M, N = 13, 200
    x = torch.randn(M, N) * 2
    w, b, dy = torch.randn(N), torch.randn(N), torch.randn(M, N)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    y = ln.LayerNorm.apply(xg, wg, bg, 1e-5)
    y.backward(dy)
    ry, rdx, rdw, rdb = ln.reference(x, w, b, dy)
    for got, ref in ((y, ry), (xg.grad, rdx), (wg.grad, rdw), (bg.grad, rdb)):
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)


def test_layer_norm_example_runs_on_the_cpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "TILEJIT_CACHE_DIR": str(tmp_path)}
    env.pop("TILEJIT_INTERPRET", None)
    done = subprocess.run([sys.executable, str(REPO / "examples" / "layer_norm.py")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "layer norm 37x300 float64 on cpu" in done.stdout and "(ok)" in done.stdout


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layer_norm_kernels_compile(arch, dtype, monkeypatch, tmp_path):
    from test_compile_all import check_cubin

    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TILEJIT_INTERPRET", raising=False)

    def m(*shape, dt=torch.float32):
        return torch.empty(*shape, dtype=dt, device="meta")

    M, N = 4097, 1000
    BM, BN = ln._tiles(N)
    P = -(-M // BM)
    for kernel, args, kw in (
        (ln.layer_norm_fwd, (m(M, N, dt=dtype), m(N, dt=dtype), m(N, dt=dtype), m(M, N, dt=dtype), m(M), m(M), 1e-5),
         dict(BM=BM, BN=BN)),
        (ln.layer_norm_bwd_dx, (m(M, N, dt=dtype), m(M, N, dt=dtype), m(N, dt=dtype), m(M), m(M),
                                m(M, N, dt=dtype), m(P, N), m(P, N)), dict(BM=BM, BN=BN)),
        (ln.column_sums, (m(P, N), m(N, dt=dtype)), dict(BM=32, BN=128)),
    ):
        compiled = kernel.compile(*args, arch=arch, **kw)
        check_cubin(compiled, arch, 4)
