"""Autotuned launches on a GPU through the compiled launcher's tuned dispatch: hits after tuning, CUDA graph
capture and replay, a new key tuned anew, and the warning of a shrunk ring located at the user's launch line."""
from __future__ import annotations

import inspect

import pytest
import torch

import tilejit

from kernels import matmul_staged  # tests/ is on the path

pytestmark = pytest.mark.gpu

NAN = float("nan")
CONFIGS = [tilejit.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=3),
           tilejit.Config({"BM": 128, "BN": 128, "BK": 32}, num_warps=4, num_stages=3)]


# The plain function of tests/kernels.py's matmul_staged (its pipeline depth is the launch's num_stages): each test
# makes kernels of its own from it.
matmul = matmul_staged.fn


def grid(meta):
    return tilejit.cdiv(meta["A"].shape[0], meta["BM"]), tilejit.cdiv(meta["B"].shape[1], meta["BN"])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEJIT_NATIVE_LAUNCH", raising=False)
    monkeypatch.delenv("TILEJIT_AUTOTUNE", raising=False)


def operands(m, n, k, dtype=torch.float16):
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b, torch.full((m, n), NAN, device="cuda", dtype=torch.float32)


def assert_matmul(c, a, b):
    ref = a.double() @ b.double()
    assert not torch.isnan(c).any(), "an element was left unwritten"
    torch.testing.assert_close(c.double(), ref, rtol=1e-2, atol=1e-2 * max(1.0, ref.abs().max().item()))


def settled_tuner():
    """A fresh tuner whose tuned dispatch has remembered a 1000x300x777 fp16 launch."""
    tuner = tilejit.autotune(configs=CONFIGS, key=["A", "B"])(tilejit.kernel(matmul))
    a, b, c = operands(1000, 300, 777)
    for _ in range(5):
        tuner[grid](a, b, c)
        if tuner._native is not None and tuner._native.stats()["entries"]:
            return tuner
    pytest.fail(f"the tuned dispatch never remembered the launch (native launcher: "
                f"{tilejit.runtime.native.failure() or 'loaded'})")


def test_tuned_launches_hit_the_compiled_launcher_and_are_correct():
    tuner = settled_tuner()
    torch.manual_seed(0)
    a, b, c = operands(1000, 300, 777)
    hits = tuner._native.stats()["hits"]
    tuner[grid](a, b, c)
    torch.cuda.synchronize()
    assert tuner._native.stats()["hits"] == hits + 1
    assert_matmul(c, a, b)
    misses = tuner._native.stats()["misses"]
    a2, b2, c2 = operands(333, 129, 65, torch.bfloat16)  # a new key and dtype: a miss, tuned anew, then correct
    tuner[grid](a2, b2, c2)
    torch.cuda.synchronize()
    assert_matmul(c2, a2, b2)
    assert tuner._native.stats()["misses"] == misses + 1 and len(tuner.stats.timed) == len(CONFIGS)


def test_tuned_launches_are_captured_by_cuda_graphs_and_replayed():
    tuner = settled_tuner()
    torch.manual_seed(1)
    a, b, c = operands(1000, 300, 777)
    hits = tuner._native.stats()["hits"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        tuner[grid](a, b, c)
    torch.cuda.synchronize()
    assert torch.isnan(c).all(), "the launch ran during capture instead of being recorded"
    assert tuner._native.stats()["hits"] == hits + 1  # captured through the tuned dispatch
    graph.replay()
    torch.cuda.synchronize()
    assert_matmul(c, a, b)
    a.copy_(torch.randn_like(a))  # replays read the captured buffers' new contents
    b.copy_(torch.randn_like(b))
    c.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    assert_matmul(c, a, b)


def test_the_shrunk_ring_warning_names_the_launch_line(tmp_path, monkeypatch):
    """fp32 128x256x64 tiles with 3 stages do not fit an H100's shared memory: the compile of the launch shrinks
    the ring and says so at the launch's line, for a plain launch and for a tuned one."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the 3-stage fp32 ring fits only where shared memory is smaller than an H100's: sm_90 needed")
    kernel = tilejit.kernel(matmul)
    a, b, c = operands(300, 520, 200, torch.float32)
    meta = dict(BM=128, BN=256, BK=64, num_warps=8, num_stages=3)
    with pytest.warns(RuntimeWarning, match="a pipeline of 3 stages") as caught:
        line = inspect.currentframe().f_lineno + 1
        kernel[(tilejit.cdiv(300, 128), tilejit.cdiv(520, 256))](a, b, c, **meta)
    assert {(w.filename, w.lineno) for w in caught if "a pipeline of" in str(w.message)} == {(__file__, line)}
    torch.cuda.synchronize()
    assert_matmul(c, a, b)
    configs = [tilejit.Config({"BM": 128, "BN": 256, "BK": 64}, num_warps=8, num_stages=3),
               tilejit.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=2)]
    tuner = tilejit.autotune(configs=configs, key=["A"])(tilejit.kernel(matmul))
    # A new process's view (another cache directory, nothing in memory): the tuning compiles the ring again.
    from tilejit.cache import kernel_cache

    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "tuned-cache"))
    monkeypatch.setattr(kernel_cache, "_default_cache", None)
    c.fill_(NAN)
    with pytest.warns(RuntimeWarning, match="a pipeline of 3 stages") as caught:
        line = inspect.currentframe().f_lineno + 1
        tuner[grid](a, b, c)
    assert {(w.filename, w.lineno) for w in caught if "a pipeline of" in str(w.message)} == {(__file__, line)}
    torch.cuda.synchronize()
    assert_matmul(c, a, b)
