"""Benchmark harness: time a GPU callable the way the autotuner does.

``do_bench`` times single runs with CUDA events around each one and, before every run, writes a buffer larger than
the L2 and reads half of it back, so a kernel never reads operands left in the cache by the previous run, nor
pays for writing back the flush's own dirty lines. ``do_bench_cudagraph`` is for
launch-bound kernels: it captures many calls in one CUDA graph and divides the replay time by their number.

Both take their warm-up and measuring budgets in milliseconds (as Triton's do_bench does): a first estimate of
one run's time turns them into repetition counts. Everything device-specific sits behind a small ``_Timing``
object so the arithmetic can be tested on CPU with a fake clock.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable, ContextManager, Protocol, Sequence

__all__ = ["do_bench", "do_bench_cudagraph"]

RETURN_MODES = ("min", "max", "mean", "median", "all")

# Runs used for the first estimate of one run's time.
_ESTIMATE_RUNS = 5
# Replays of the captured graph in do_bench_cudagraph; each yields one sample.
_GRAPH_REPLAYS = 10
# Calls captured when the estimate reads 0 ms (a clock too coarse for the kernel).
_GRAPH_CALLS_IF_UNMEASURABLE = 1000
# Flush buffer size when the device does not report its L2 size.
_FALLBACK_FLUSH_BYTES = 256 << 20


class _Event(Protocol):
    def record(self) -> None: ...

    def elapsed_time(self, end: "_Event") -> float: ...  # milliseconds from self to end


class _Timing(Protocol):
    """What the benchmark needs from a device: events, a barrier, an L2 flush, graph capture, a side stream."""

    def event(self) -> _Event: ...

    def synchronize(self) -> None: ...

    def flush_l2(self) -> None: ...

    def capture(self, fn: Callable[[], object], n_calls: int) -> Callable[[], None]: ...

    def stream(self) -> ContextManager[object]: ...


class _CudaTiming:
    """CUDA events on torch's current device; the L2 flush writes a buffer four times the device's L2 size, then
    reads half of it back (``flush_l2``).

    Four, not two: the flush also gives the host time to enqueue the timed call before the GPU gets to its start
    event. With twice the L2 (about 33 us of writes on an H100) a launch path costing ~20 us of host time, plus
    the event records, sometimes came after the flush had finished, and the GPU's idle wait was timed as the
    kernel's (a 10 us 1024^3 matmul read 22 us in one run and 10.7 in another). Host launch costs are measured on
    their own (benchmarks/launch.py)."""

    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("tilejit.testing.do_bench needs a CUDA device (torch.cuda.is_available() is False)")
        self._torch = torch
        device = torch.cuda.current_device()
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        flush_bytes = 4 * l2_bytes if l2_bytes > 0 else _FALLBACK_FLUSH_BYTES
        self._flush_buffer = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)
        self._flush_sink = torch.empty((), dtype=torch.int64, device=device)

    def event(self) -> _Event:
        return self._torch.cuda.Event(enable_timing=True)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def flush_l2(self) -> None:
        self._flush_buffer.zero_()
        # then a read of its first half (twice the L2): the write alone leaves the L2 full of dirty lines, written
        # back to memory while the timed kernel runs, a cost that kernel does not have in a model's step (measured
        # on an H200: about 12 us of a 150 us decode at batch 32 x 4k, 8% of its HBM time); read lines are clean
        self._torch.sum(self._flush_buffer[: self._flush_buffer.numel() // 2], 0, dtype=self._torch.int64,
                        out=self._flush_sink)

    def capture(self, fn: Callable[[], object], n_calls: int) -> Callable[[], None]:
        graph = self._torch.cuda.CUDAGraph()
        with self._torch.cuda.graph(graph):
            for _ in range(n_calls):
                fn()
        self._torch.cuda.synchronize()
        return graph.replay

    def stream(self) -> ContextManager[object]:
        # Graph capture is not allowed on the legacy default stream; warm-up runs on the same side stream so
        # lazily created library handles belong to it.
        return self._torch.cuda.stream(self._torch.cuda.Stream())


def do_bench(
    fn: Callable[[], object],
    warmup: float = 25,
    rep: float = 100,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "median",
    *,
    _timing: _Timing | None = None,
) -> float | list[float]:
    """Time ``fn`` in milliseconds: median of single runs, each after an L2 flush, measured with CUDA events.

    ``warmup`` and ``rep`` are budgets in milliseconds; they become run counts from an estimate taken over
    five runs. With ``quantiles`` (a list of numbers in [0, 1]) the result is the list of those quantiles of the
    run times; otherwise ``return_mode`` picks one of "min", "max", "mean", "median" or "all" (the list of
    every run's time).
    """
    _check_return_mode(return_mode)
    timing = _timing if _timing is not None else _CudaTiming()

    fn()  # the first call may compile; keep it out of the estimate
    timing.synchronize()

    start, end = timing.event(), timing.event()
    start.record()
    for _ in range(_ESTIMATE_RUNS):
        timing.flush_l2()
        fn()
    end.record()
    timing.synchronize()
    estimate_ms = start.elapsed_time(end) / _ESTIMATE_RUNS
    n_warmup, n_repeat = _run_counts(estimate_ms, warmup, rep)

    for _ in range(n_warmup):
        fn()
    starts = [timing.event() for _ in range(n_repeat)]
    ends = [timing.event() for _ in range(n_repeat)]
    for run_start, run_end in zip(starts, ends):
        timing.flush_l2()
        run_start.record()
        fn()
        run_end.record()
    timing.synchronize()
    times = [run_start.elapsed_time(run_end) for run_start, run_end in zip(starts, ends)]
    return _summarize(times, quantiles, return_mode)


def do_bench_cudagraph(
    fn: Callable[[], object],
    rep: float = 20,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "median",
    *,
    _timing: _Timing | None = None,
) -> float | list[float]:
    """Time ``fn`` in milliseconds per call by capturing enough calls to fill ``rep`` ms in one CUDA graph.

    Launch overhead disappears from the measurement, so this suits kernels whose launch costs as much as their
    work. The graph is replayed ten times; each replay's time divided by the number of captured calls is one
    sample, summarized by ``quantiles`` / ``return_mode`` as in ``do_bench``. The L2 is not flushed.
    """
    _check_return_mode(return_mode)
    timing = _timing if _timing is not None else _CudaTiming()

    with timing.stream():
        fn()
        timing.synchronize()

        start, end = timing.event(), timing.event()
        start.record()
        for _ in range(_ESTIMATE_RUNS):
            fn()
        end.record()
        timing.synchronize()
        estimate_ms = start.elapsed_time(end) / _ESTIMATE_RUNS
        n_calls = _graph_calls(estimate_ms, rep)

        replay = timing.capture(fn, n_calls)
        samples = []
        for _ in range(_GRAPH_REPLAYS):
            start.record()
            replay()
            end.record()
            timing.synchronize()
            samples.append(start.elapsed_time(end) / n_calls)
    return _summarize(samples, quantiles, return_mode)


def _run_counts(estimate_ms: float, warmup_ms: float, rep_ms: float) -> tuple[int, int]:
    """Warm-up and timed run counts filling the budgets, at least one each."""
    if estimate_ms <= 0:
        # Too fast for the clock to see: spend the budgets at 1 us per run.
        estimate_ms = 1e-3
    return max(1, int(warmup_ms / estimate_ms)), max(1, int(rep_ms / estimate_ms))


def _graph_calls(estimate_ms: float, rep_ms: float) -> int:
    if estimate_ms <= 0:
        return _GRAPH_CALLS_IF_UNMEASURABLE
    return max(1, int(rep_ms / estimate_ms))


def _check_return_mode(return_mode: str) -> None:
    if return_mode not in RETURN_MODES:
        raise ValueError(f"return_mode must be one of {', '.join(RETURN_MODES)}; got {return_mode!r}")


def _summarize(times: Sequence[float], quantiles: Sequence[float] | None, return_mode: str) -> float | list[float]:
    if quantiles is not None:
        ordered = sorted(times)
        return [_quantile(ordered, q) for q in quantiles]
    if return_mode == "all":
        return list(times)
    if return_mode == "min":
        return min(times)
    if return_mode == "max":
        return max(times)
    if return_mode == "mean":
        return statistics.fmean(times)
    return _quantile(sorted(times), 0.5)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (torch.quantile's and numpy's default)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantiles must lie in [0, 1]; got {q}")
    position = q * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * fraction
