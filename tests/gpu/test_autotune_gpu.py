"""The autotuner on a GPU: tuned matmuls are correct on ragged shapes, and a second process reuses the
stored choice without timing anything."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tilejit
import tilejit.language as T

pytestmark = pytest.mark.gpu

CONFIGS = [tilejit.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=3),
           tilejit.Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=4, num_stages=3),
           tilejit.Config({"BM": 128, "BN": 64, "BK": 32}, num_warps=4, num_stages=2)]


@tilejit.autotune(configs=CONFIGS, key=["A", "B"])
@tilejit.kernel
def tuned_matmul(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


def grid(meta):
    return tilejit.cdiv(meta["A"].shape[0], meta["BM"]), tilejit.cdiv(meta["B"].shape[1], meta["BN"])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mnk", [(1000, 3000, 777), (17, 129, 33), (300, 64, 1000)])
def test_autotuned_matmul_is_correct_on_ragged_shapes(dtype, mnk):
    m, n, k = mnk
    torch.manual_seed(m)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    tuned_matmul[grid](a, b, c)
    assert tuned_matmul.best_config in CONFIGS
    assert len(tuned_matmul.stats.timed) >= 2  # it really compared configs
    ref = a.double() @ b.double()
    assert not torch.isnan(c).any()
    torch.testing.assert_close(c.double(), ref, rtol=3e-2, atol=3e-2 * max(1.0, ref.abs().max().item()) * 0.05)


CHILD = textwrap.dedent("""
    import json, sys, torch
    sys.path[:0] = {tests!r}
    import test_autotune_gpu as t
    a = torch.randn(500, 300, device="cuda", dtype=torch.float16)
    b = torch.randn(300, 200, device="cuda", dtype=torch.float16)
    c = torch.empty(500, 200, device="cuda", dtype=torch.float16)
    t.tuned_matmul[t.grid](a, b, c)
    torch.cuda.synchronize()
    s = t.tuned_matmul.stats
    print(json.dumps({{"timed": list(s.timed), "from_disk": s.from_disk,
                      "best": t.tuned_matmul.best_config.identity}}))
""")


def test_second_process_reuses_the_stored_choice(tmp_path):
    env = {**os.environ, "TILEJIT_CACHE_DIR": str(tmp_path / "shared-cache")}
    here = os.path.dirname(os.path.abspath(__file__))
    code = CHILD.format(tests=[here, os.path.dirname(here)])
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert len(first["timed"]) >= 2 and not first["from_disk"]
    assert second["timed"] == [] and second["from_disk"]
    assert second["best"] == first["best"]
