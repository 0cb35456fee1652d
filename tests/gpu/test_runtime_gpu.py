"""The launch path on a real GPU: CUDA graphs, device indices, threads and streams.

Run on a machine with a GPU: ``python -m pytest -q -m gpu tests/gpu/test_runtime_gpu.py``. Outputs are poisoned
with NaN before every launch (and before every graph replay) so an element a launch did not write fails.
"""
from __future__ import annotations

import threading

import pytest
import torch

import tilejit
import tilejit.language as T

pytestmark = pytest.mark.gpu

NAN = float("nan")
BLOCK = 1024


@tilejit.kernel
def axpb(X, Y, a, b, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * a + b


from kernels import matmul  # noqa: E402  (the matmul of examples/matmul.py, shared by the test layers)


def device_or_skip(index: int) -> torch.device:
    if torch.cuda.device_count() <= index:
        pytest.skip(f"needs {index + 1} CUDA devices, torch sees {torch.cuda.device_count()}")
    return torch.device("cuda", index)


DEVICES = [pytest.param(0, id="cuda:0"), pytest.param(1, id="cuda:1")]


def launch_axpb(kernel, x, y, a, b) -> None:
    kernel[(tilejit.cdiv(x.numel(), BLOCK),)](x, y, a, b, BLOCK=BLOCK)


def launch_matmul(kernel, a, b, c) -> None:
    grid = (tilejit.cdiv(a.shape[0], 128), tilejit.cdiv(b.shape[1], 128))
    kernel[grid](a, b, c, BM=128, BN=128, BK=32, num_warps=4)


def capture(graph: torch.cuda.CUDAGraph, dev: torch.device):
    """Capture on a side stream of ``dev`` (torch's shared default capture stream lives on whichever device
    first used it, so it cannot serve cuda:1 after cuda:0)."""
    return torch.cuda.graph(graph, stream=torch.cuda.Stream(device=dev))


def matmul_ref(a, b) -> torch.Tensor:
    return a.double() @ b.double()


def assert_matmul_close(c, a, b) -> None:
    torch.testing.assert_close(c.double(), matmul_ref(a, b), rtol=1e-3, atol=1e-2)


# ---- CUDA graphs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("index", DEVICES)
def test_graph_replay_of_an_elementwise_kernel_matches_eager(index):
    dev = device_or_skip(index)
    x = torch.randn(10_000 + 17, device=dev)
    y = torch.full_like(x, NAN)
    launch_axpb(axpb, x, y, 2.0, 0.5)  # eager: compiles and loads outside the capture
    torch.cuda.synchronize(dev)
    eager = y.clone()
    torch.testing.assert_close(eager, x * 2.0 + 0.5)

    y.fill_(NAN)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(dev), capture(graph, dev):
        launch_axpb(axpb, x, y, 2.0, 0.5)
    torch.cuda.synchronize(dev)
    assert torch.isnan(y).all(), "the launch ran during capture instead of being recorded"

    graph.replay()
    torch.cuda.synchronize(dev)
    assert torch.equal(y, eager)
    # Replays read the captured buffers' new contents, with the captured scalars.
    x.copy_(torch.randn_like(x))
    y.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(y, x * 2.0 + 0.5)


def test_graph_replay_of_the_matmul_matches_eager():
    dev = device_or_skip(0)
    a = torch.randn(256, 512, device=dev, dtype=torch.float16)
    b = torch.randn(512, 384, device=dev, dtype=torch.float16)
    c = torch.full((256, 384), NAN, device=dev, dtype=torch.float32)
    launch_matmul(matmul, a, b, c)
    torch.cuda.synchronize()
    eager = c.clone()
    assert_matmul_close(eager, a, b)

    c.fill_(NAN)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, dev):
        launch_matmul(matmul, a, b, c)
    torch.cuda.synchronize()
    assert torch.isnan(c).all(), "the launch ran during capture instead of being recorded"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, eager)

    a.copy_(torch.randn_like(a))
    b.copy_(torch.randn_like(b))
    c.fill_(NAN)
    graph.replay()
    torch.cuda.synchronize()
    assert_matmul_close(c, a, b)


def test_graph_with_several_launches_replays_them_in_order():
    dev = device_or_skip(0)
    x = torch.randn(4096, device=dev)
    y, z = torch.full_like(x, NAN), torch.full_like(x, NAN)
    launch_axpb(axpb, x, y, 1.0, 0.0)
    torch.cuda.synchronize()
    y.fill_(NAN)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, dev):
        launch_axpb(axpb, x, y, 3.0, 1.0)   # y = 3x + 1
        launch_axpb(axpb, y, z, -2.0, 4.0)  # z = -2y + 4, reads what the first launch wrote
    for _ in range(2):
        y.fill_(NAN)
        z.fill_(NAN)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(z, (x * 3.0 + 1.0) * -2.0 + 4.0)


def test_first_launch_of_a_kernel_inside_a_graph_capture():
    """No eager warm-up: compiling, loading the module and the launch all happen while capturing."""
    dev = device_or_skip(0)
    fresh = tilejit.kernel(axpb.fn)  # a new Kernel: nothing compiled or loaded for it in this process
    x = torch.randn(5000, device=dev)
    y = torch.full_like(x, NAN)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, dev):
        launch_axpb(fresh, x, y, -1.5, 2.0)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * -1.5 + 2.0)


# ---- device indices -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("index", DEVICES)
def test_launch_on_a_device_index_leaves_the_current_device_alone(index):
    dev = device_or_skip(index)
    torch.cuda.set_device(0)
    x = torch.randn(3000, device=dev)
    y = torch.full_like(x, NAN)
    launch_axpb(axpb, x, y, 0.25, -1.0)
    a = torch.randn(128, 256, device=dev, dtype=torch.float16)
    b = torch.randn(256, 256, device=dev, dtype=torch.float16)
    c = torch.full((128, 256), NAN, device=dev, dtype=torch.float32)
    launch_matmul(matmul, a, b, c)
    torch.cuda.synchronize(dev)
    assert torch.cuda.current_device() == 0
    assert y.device == dev and c.device == dev
    torch.testing.assert_close(y, x * 0.25 - 1.0)
    assert_matmul_close(c, a, b)


def test_one_kernel_alternating_between_two_devices():
    devs = [device_or_skip(0), device_or_skip(1)]
    xs = [torch.randn(2048, device=d) for d in devs]
    ys = [torch.full_like(x, NAN) for x in xs]
    for step in range(4):  # 0, 1, 0, 1: each device keeps its own loaded module
        i = step % 2
        ys[i].fill_(NAN)
        launch_axpb(axpb, xs[i], ys[i], float(step), 1.0)
        torch.cuda.synchronize(devs[i])
        torch.testing.assert_close(ys[i], xs[i] * float(step) + 1.0)


def test_tensors_on_different_devices_are_rejected():
    devs = [device_or_skip(0), device_or_skip(1)]
    x, y = torch.randn(1024, device=devs[0]), torch.empty(1024, device=devs[1])
    with pytest.raises(ValueError, match="different devices"):
        launch_axpb(axpb, x, y, 1.0, 0.0)


# ---- threads ------------------------------------------------------------------------------------------------

def _in_thread(fn) -> None:
    errors: list[BaseException] = []

    def body():
        try:
            fn()
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("first_launch_in", ["main thread", "second thread"])
def test_launch_from_a_second_python_thread(first_launch_in):
    dev = device_or_skip(0)
    kernel = tilejit.kernel(axpb.fn)
    x = torch.randn(8192, device=dev)
    y_main, y_thread = torch.full_like(x, NAN), torch.full_like(x, NAN)

    def from_thread():
        launch_axpb(kernel, x, y_thread, 3.0, -2.0)
        torch.cuda.synchronize(dev)

    if first_launch_in == "main thread":
        launch_axpb(kernel, x, y_main, 5.0, 1.0)
        _in_thread(from_thread)
    else:
        _in_thread(from_thread)
        launch_axpb(kernel, x, y_main, 5.0, 1.0)
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(y_thread, x * 3.0 - 2.0)
    torch.testing.assert_close(y_main, x * 5.0 + 1.0)


def test_tensor_map_kernel_launched_first_from_a_thread_without_a_context():
    """A thread that never called the CUDA runtime has no context current (torch's autograd threads run a custom
    op's backward so): encoding the kernel's tensor maps and launching it must adopt the kernel's context."""
    dev = device_or_skip(0)
    kernel = tilejit.kernel(matmul.fn)
    a = torch.randn(300, 520, device=dev, dtype=torch.float16)
    b = torch.randn(520, 200, device=dev, dtype=torch.float16)
    c = torch.full((300, 200), NAN, device=dev, dtype=torch.float32)
    torch.cuda.synchronize(dev)
    _in_thread(lambda: launch_matmul(kernel, a, b, c))
    torch.cuda.synchronize(dev)
    assert_matmul_close(c, a, b)


def test_concurrent_launches_from_two_threads_keep_their_arguments():
    """Many launches of one kernel from two threads at once: each launch must use its own arguments (a
    parameter buffer shared between threads would let one thread's values reach another's launch)."""
    dev = device_or_skip(0)
    kernel = tilejit.kernel(axpb.fn)
    n, launches = 4096, 300
    x = torch.randn(n, device=dev)
    launch_axpb(kernel, x, torch.empty_like(x), 1.0, 0.0)  # compile and load once, before the race
    torch.cuda.synchronize(dev)
    outs = [torch.full((launches, n), NAN, device=dev) for _ in range(2)]
    torch.cuda.synchronize(dev)  # the NaN fill (default stream) is done before the workers' streams write them
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(t: int):
        try:
            stream = torch.cuda.Stream(device=dev)
            start.wait()
            with torch.cuda.stream(stream):
                for k in range(launches):
                    launch_axpb(kernel, x, outs[t][k], float(k), float(t * 1000))
            stream.synchronize()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    torch.cuda.synchronize(dev)
    scales = torch.arange(launches, device=dev, dtype=torch.float32)[:, None]
    for t in range(2):
        expected = x[None, :] * scales + float(t * 1000)
        # The kernel computes x * a + b as one FMA, torch rounds the product first: where the two nearly cancel
        # (x * k close to -1000) they differ by ~1e-4 absolute, which isclose's relative test alone rejects.
        # Another launch's row (another k, another b) is off by far more on every element.
        bad = (~torch.isclose(outs[t], expected, atol=1e-3)).any(dim=1).nonzero().flatten().tolist()
        assert bad == [], f"thread {t}: rows {bad[:10]} hold another launch's result (or none)"


# ---- streams ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("index", DEVICES)
def test_launch_is_ordered_on_the_current_non_default_stream(index):
    dev = device_or_skip(index)
    x = torch.zeros(1 << 20, device=dev)
    y = torch.full_like(x, NAN)
    launch_axpb(axpb, x, y, 1.0, 0.0)  # warm: compile and load outside the timed part
    torch.cuda.synchronize(dev)
    y.fill_(NAN)
    torch.cuda.synchronize(dev)
    stream = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(stream):
        # Keep the stream busy for a while; a launch on any other stream would run first and read x == 0.
        torch.cuda._sleep(int(2e8))
        x.fill_(3.0)
        launch_axpb(axpb, x, y, 2.0, 1.0)
        z = y + 0.0  # a torch op after the launch on the same stream sees its result
    stream.synchronize()
    assert torch.all(y == 7.0) and torch.all(z == 7.0)


def test_launch_on_a_side_stream_does_not_wait_for_the_default_stream():
    dev = device_or_skip(0)
    x = torch.ones(1 << 16, device=dev)
    y = torch.full_like(x, NAN)
    launch_axpb(axpb, x, y, 1.0, 0.0)
    torch.cuda.synchronize()
    done = torch.cuda.Event()
    side = torch.cuda.Stream(device=dev)
    torch.cuda._sleep(int(1e9))  # the default stream is busy for ~0.5 s
    with torch.cuda.stream(side):
        launch_axpb(axpb, x, y, 4.0, 0.0)
        done.record(side)
    done.synchronize()
    # Still sleeping: the launch neither waited for the default stream nor ran on it.
    assert not torch.cuda.current_stream(dev).query(), "the side-stream launch waited for the default stream"
    assert torch.all(y == 4.0)
    torch.cuda.synchronize()


# ---- the compiled launcher (runtime/_launch.c) ----------------------------------------------------------------

def test_launches_after_the_first_take_the_native_path_and_match_the_python_path(monkeypatch):
    from tilejit.runtime import native

    dev = device_or_skip(0)
    if native.load() is None:
        pytest.skip(f"native launcher unavailable here: {native.failure()}")
    fast = tilejit.kernel(axpb.fn)
    monkeypatch.setenv("TILEJIT_NATIVE_LAUNCH", "0")
    slow = tilejit.kernel(axpb.fn)
    x = torch.randn(3000, device=dev)
    launch_axpb(slow, x, torch.empty_like(x), 1.0, 0.0)
    monkeypatch.delenv("TILEJIT_NATIVE_LAUNCH")
    assert slow._dispatcher is None
    # Python path (compiles, makes the dispatcher), a native miss (remembers the entry), then native hits.
    for step in range(4):
        y_fast, y_slow = torch.full_like(x, NAN), torch.full_like(x, NAN)
        launch_axpb(fast, x, y_fast, 1.5 + step, -float(step))
        launch_axpb(slow, x, y_slow, 1.5 + step, -float(step))
        torch.cuda.synchronize(dev)
        torch.testing.assert_close(y_fast, (x.double() * (1.5 + step) - step).float())
        assert torch.equal(y_fast, y_slow)
    stats = fast._dispatcher.stats()
    assert stats["misses"] == 1 and stats["hits"] == 2 and stats["fallbacks"] == 0


def _axpb_on(path: str, monkeypatch):
    """A fresh axpb kernel that launches through the compiled launcher ("native") or the Python path."""
    from tilejit.runtime import native

    if path == "native":
        if native.load() is None:  # ready before the first launch, so that launch makes the dispatcher
            pytest.skip(f"native launcher unavailable here: {native.failure()}")
    else:
        monkeypatch.setenv("TILEJIT_NATIVE_LAUNCH", "0")  # read at the kernel's first GPU launch
    return tilejit.kernel(axpb.fn)


@pytest.mark.parametrize("path", ["native", "python"])
def test_launch_paths_respecialize_on_alignment_and_dtype(path, monkeypatch):
    dev = device_or_skip(0)
    kernel = _axpb_on(path, monkeypatch)
    base = torch.randn(5000, device=dev, dtype=torch.float64)
    for x in (base.float(), base.float()[1:], base.half(), base.float()[3:]):  # aligned, not, fp16, not again
        y = torch.full_like(x, NAN)
        launch_axpb(kernel, x, y, 2.0, 0.5)
        torch.cuda.synchronize(dev)
        torch.testing.assert_close(y.double(), (x.double() * 2.0 + 0.5).to(y.dtype).double())
    assert len(kernel._compiled) == 3
    if path == "native":
        # The first launch (Python) made the dispatcher; unaligned fp32 and fp16 missed; unaligned again hit.
        assert kernel._dispatcher.stats() == {"hits": 1, "misses": 2, "fallbacks": 0, "entries": 2}
    else:
        assert len(kernel._fast) == 3 and kernel._dispatcher is None


@pytest.mark.parametrize("path", ["native", "python"])
def test_run_time_arguments_by_keyword_take_the_fast_path(path, monkeypatch):
    dev = device_or_skip(0)
    kernel = _axpb_on(path, monkeypatch)
    x = torch.randn(4097, device=dev)
    slow_calls = []
    real_run = kernel.run
    monkeypatch.setattr(kernel, "run", lambda *a, **k: slow_calls.append(1) or real_run(*a, **k))
    for step in range(3):
        y = torch.full_like(x, NAN)
        kernel[(tilejit.cdiv(x.numel(), BLOCK),)](X=x, Y=y, b=0.25, a=float(step), BLOCK=BLOCK)
        torch.cuda.synchronize(dev)
        torch.testing.assert_close(y, x * float(step) + 0.25)
        monkeypatch.delenv("TILEJIT_NATIVE_LAUNCH", raising=False)  # the choice made at the first launch sticks
    if path == "native":
        # Python (compiles, makes the dispatcher), a native miss (remembers the entry), then a native hit.
        assert len(slow_calls) == 2
        assert kernel._dispatcher.stats() == {"hits": 1, "misses": 1, "fallbacks": 0, "entries": 1}
    else:
        assert len(slow_calls) == 1 and kernel._dispatcher is None  # compiled once; then dict hits


@pytest.mark.parametrize("path", ["native", "python"])
def test_outputs_that_overlap_themselves_or_require_grad_are_refused_after_a_remembered_launch(path, monkeypatch):
    """A launch refuses an output (a tensor the kernel writes) whose elements share memory or that requires grad,
    as the interpreter does, also after the same signature was launched and remembered; inputs may be either."""
    from tilejit.errors import ArgumentValueError

    dev = device_or_skip(0)
    kernel = _axpb_on(path, monkeypatch)
    x = torch.randn(4096, device=dev)
    for _ in range(3):  # the Python path, then the fast path's misses and hits
        launch_axpb(kernel, x, torch.empty_like(x), 2.0, 0.0)
    shared = torch.zeros(1, device=dev).expand(4096)
    with pytest.raises(ArgumentValueError, match="output 'Y' has stride 0"):
        launch_axpb(kernel, x, shared, 2.0, 0.0)
    graded = torch.zeros(4096, device=dev, requires_grad=True)
    for _ in range(2):
        with pytest.raises(ArgumentValueError, match="output 'Y' requires grad"):
            launch_axpb(kernel, x, graded, 2.0, 0.0)
    with torch.no_grad():
        for _ in range(2):
            launch_axpb(kernel, x, graded, 2.0, 0.0)
    torch.cuda.synchronize(dev)
    assert torch.equal(graded.detach(), x * 2.0)
    with pytest.raises(ArgumentValueError, match="output 'Y' requires grad"):
        launch_axpb(kernel, x, graded, 2.0, 0.0)  # grad mode back on: refused again, not a remembered hit
    y = torch.full_like(x, NAN)
    launch_axpb(kernel, shared, y, 1.0, 1.0)  # an input may share memory
    torch.cuda.synchronize(dev)
    assert torch.equal(y, torch.ones_like(y))


def test_launches_run_right_through_a_symlinked_root_with_every_json_buried(tmp_path, monkeypatch):
    """A root reached through the user's own symlink, then nvrtc.json, extents hints and meta.json (digest
    rewritten to match) nested 30,000 deep: the next process's launch reads them as absent, recompiles, and
    computes the right numbers."""
    import hashlib

    from tilejit.cache import kernel_cache

    real = tmp_path / "real-cache"
    real.mkdir(mode=0o700)
    (tmp_path / "cache").symlink_to(real)
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_cache, "_default_cache", None)
    dev = torch.device("cuda", 0)
    for attempt in range(2):
        x = torch.randn(10_000 + 17, device=dev, dtype=torch.float64).float()
        y = torch.full_like(x, NAN)
        launch_axpb(tilejit.kernel(axpb.fn), x, y, 2.0, 0.5)
        torch.cuda.synchronize(dev)
        torch.testing.assert_close(y.double(), x.double() * 2.0 + 0.5, rtol=1e-6, atol=1e-6)
        deep = "[" * 30000 + "]" * 30000
        metas = list(real.glob("*/*/meta.json"))
        assert metas, "the launch wrote its entry under the symlink's target"
        for record in [real / "nvrtc.json", *real.glob("extents/*.json"), *metas]:
            record.write_text(deep)
        for meta in metas:
            (meta.parent / "meta.sha256").write_text(hashlib.sha256(deep.encode()).hexdigest() + "\n")
        monkeypatch.setattr(kernel_cache, "_default_cache", None)  # the next launch as a fresh process's
