"""do_bench / do_bench_cudagraph arithmetic on a fake clock, plus a GPU smoke test."""
from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tilejit import testing
from tilejit.testing import do_bench, do_bench_cudagraph


class FakeEvent:
    def __init__(self, device: "FakeDevice") -> None:
        self.device = device
        self.time: float | None = None

    def record(self) -> None:
        self.time = self.device.now

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.time is not None and end.time is not None, "event read before it was recorded"
        return end.time - self.time


class FakeDevice:
    """Implements testing._Timing: a clock in milliseconds that only the benchmarked function advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []
        self.captured_calls: int | None = None
        self.in_side_stream = False

    def event(self) -> FakeEvent:
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.log.append("sync")

    def flush_l2(self) -> None:
        self.log.append("flush")

    def capture(self, fn, n_calls):
        self.captured_calls = n_calls

        def replay() -> None:
            for _ in range(n_calls):
                fn()

        return replay

    @contextlib.contextmanager
    def stream(self):
        self.in_side_stream = True
        yield None
        self.in_side_stream = False


def kernel_taking(device: FakeDevice, durations):
    """A benchmarked function whose i-th call takes durations(i) ms."""
    calls = [0]

    def fn() -> None:
        device.now += durations(calls[0])
        device.log.append("run")
        calls[0] += 1

    fn.calls = calls
    return fn


def test_counts_follow_the_estimate():
    device = FakeDevice()
    fn = kernel_taking(device, lambda i: 2.0)
    result = do_bench(fn, warmup=10, rep=40, _timing=device)
    assert result == pytest.approx(2.0)
    # 1 first call + 5 estimate runs + 10/2 warm-up runs + 40/2 timed runs
    assert fn.calls[0] == 1 + 5 + 5 + 20
    # every estimate run and every timed run follows a flush; the first call and warm-up runs do not
    assert device.log.count("flush") == 5 + 20


def test_every_timed_run_follows_an_l2_flush():
    device = FakeDevice()
    fn = kernel_taking(device, lambda i: 1.0)
    do_bench(fn, warmup=3, rep=7, _timing=device)
    timed = device.log[-(2 * 7 + 1):]  # 7 x (flush, run), then the final synchronize
    assert timed == ["flush", "run"] * 7 + ["sync"]


def test_unmeasurably_fast_kernel_still_gets_bounded_counts():
    device = FakeDevice()
    fn = kernel_taking(device, lambda i: 0.0)
    assert do_bench(fn, warmup=0.5, rep=2, _timing=device) == 0.0
    assert fn.calls[0] == 1 + 5 + 500 + 2000


def test_at_least_one_run_when_the_kernel_outlasts_the_budget():
    device = FakeDevice()
    fn = kernel_taking(device, lambda i: 50.0)
    assert do_bench(fn, warmup=25, rep=10, _timing=device) == pytest.approx(50.0)
    assert fn.calls[0] == 1 + 5 + 1 + 1


# Timed runs (after 1 first call, 5 estimate runs at 1 ms and 2 warm-up runs) take these times.
TIMED = [5.0, 1.0, 3.0, 2.0, 4.0]


def bench_with_timed_runs(**kwargs):
    device = FakeDevice()
    fn = kernel_taking(device, lambda i: 1.0 if i < 8 else TIMED[i - 8])
    return do_bench(fn, warmup=2, rep=5, _timing=device, **kwargs)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("min", 1.0), ("max", 5.0), ("mean", 3.0), ("median", 3.0), ("all", TIMED)],
)
def test_return_modes(mode, expected):
    assert bench_with_timed_runs(return_mode=mode) == pytest.approx(expected)


def test_quantiles_return_a_list_interpolated_between_ranks():
    result = bench_with_timed_runs(quantiles=[0.0, 0.1, 0.5, 0.8, 1.0])
    assert isinstance(result, list)
    assert result == pytest.approx([1.0, 1.4, 3.0, 4.2, 5.0])


def test_single_quantile_is_still_a_list():
    assert bench_with_timed_runs(quantiles=[0.5]) == pytest.approx([3.0])


def test_bad_return_mode_and_quantile_are_rejected():
    with pytest.raises(ValueError, match="return_mode"):
        bench_with_timed_runs(return_mode="average")
    with pytest.raises(ValueError, match="quantiles"):
        bench_with_timed_runs(quantiles=[1.5])


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=1, max_size=40),
    q=st.floats(0.0, 1.0),
)
def test_quantile_matches_torch(times, q):
    ours = testing._quantile(sorted(times), q)
    theirs = torch.quantile(torch.tensor(times, dtype=torch.float64), q).item()
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    estimate=st.floats(1e-4, 100.0),
    warmup=st.floats(0.0, 200.0),
    rep=st.floats(0.0, 500.0),
)
def test_run_counts_fill_the_budgets(estimate, warmup, rep):
    n_warmup, n_repeat = testing._run_counts(estimate, warmup, rep)
    assert n_warmup >= 1 and n_repeat >= 1
    # as many runs as fit in the budget, never one more (unless the minimum of one applies)
    assert n_repeat == 1 or n_repeat * estimate <= rep * (1 + 1e-9)
    assert (n_repeat + 1) * estimate > rep * (1 - 1e-9)
    assert n_warmup == 1 or n_warmup * estimate <= warmup * (1 + 1e-9)


def test_cudagraph_divides_each_replay_by_the_captured_calls():
    device = FakeDevice()
    fn = kernel_taking(device, lambda i: 0.25)
    result = do_bench_cudagraph(fn, rep=5, return_mode="all", _timing=device)
    assert device.captured_calls == 20  # 5 ms / 0.25 ms
    assert result == pytest.approx([0.25] * 10)  # ten replays
    assert fn.calls[0] == 1 + 5 + 10 * 20
    assert "flush" not in device.log
    assert not device.in_side_stream


def test_cudagraph_runs_inside_the_side_stream():
    device = FakeDevice()
    seen = []

    def fn() -> None:
        seen.append(device.in_side_stream)
        device.now += 1.0

    do_bench_cudagraph(fn, rep=3, _timing=device)
    assert seen and all(seen)


def test_cudagraph_unmeasurable_kernel_captures_a_fixed_number_of_calls():
    device = FakeDevice()
    fn = kernel_taking(device, lambda i: 0.0)
    assert do_bench_cudagraph(fn, _timing=device) == 0.0
    assert device.captured_calls == 1000


def test_cudagraph_quantiles():
    device = FakeDevice()
    # estimate at 1 ms -> 4 calls captured; replay r takes (r + 1) ms per call
    fn = kernel_taking(device, lambda i: 1.0 if i < 6 else float((i - 6) // 4 + 1))
    result = do_bench_cudagraph(fn, rep=4, quantiles=[0.0, 0.5, 1.0], _timing=device)
    assert device.captured_calls == 4
    assert result == pytest.approx([1.0, 5.5, 10.0])


@pytest.mark.gpu
def test_flush_buffer_is_at_least_four_times_the_l2():
    timing = testing._CudaTiming()
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    assert timing._flush_buffer.numel() * timing._flush_buffer.element_size() >= 4 * l2


@pytest.mark.gpu
def test_do_bench_times_a_real_matmul():
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    small = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    big_ms = do_bench(lambda: a @ a, warmup=5, rep=20)
    small_ms = do_bench(lambda: small @ small, warmup=5, rep=20)
    assert 0 < small_ms < big_ms
    lo, mid, hi = do_bench(lambda: a @ a, warmup=5, rep=20, quantiles=[0.2, 0.5, 0.8])
    assert 0 < lo <= mid <= hi
    graph_ms = do_bench_cudagraph(lambda: small @ small, rep=5)
    assert 0 < graph_ms < big_ms
