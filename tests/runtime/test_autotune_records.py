"""Autotune records on disk: concurrent saves merge under the file's lock, and a record in which every config
failed is no choice (tuned again; an error naming each config with its error when they fail again).

CPU only: the saves go through the records API (``tilejit.cache.records``) from separate processes, and the
tuning runs the fake kernel and benchmark of test_autotune.py.
"""
from __future__ import annotations

import json
import multiprocessing
import warnings
from pathlib import Path

import pytest
import torch

from tilejit.autotuner import AutotuneError
from tilejit.cache.layout import CacheLayout
from tilejit.cache.records import AutotuneRecordFile, record_problem

import test_autotune as at
from test_autotune import cache_dir  # noqa: F401 - the fixture: a fresh cache directory per test

WRITERS = 8
ROUNDS = 13
SOURCE_HASH = "ab" * 32


def _record(key: str, ms: float) -> dict:
    return {"kernel": "matmul", "key": key, "config": {"kwargs": {"BM": 64}}, "timings_ms": {"BM=64": ms},
            "failures": {}, "created": "2000-01-01T00:00:00+00:00"}


def _save_rounds(root: str, writer: int, barrier) -> None:
    """One writer process: each round, wait for every writer, then save a record of its own."""
    store = AutotuneRecordFile(CacheLayout(Path(root)), "matmul", SOURCE_HASH)
    for round_ in range(ROUNDS):
        barrier.wait(60)
        key = f"M={writer}; round={round_}"
        store.save(key, _record(key, 1.0 + writer + round_ / 100))


def test_concurrent_saves_lose_no_record(tmp_path):
    root = tmp_path / "cache"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WRITERS)
    writers = [context.Process(target=_save_rounds, args=(str(root), w, barrier)) for w in range(WRITERS)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
    assert [p.exitcode for p in writers] == [0] * WRITERS
    stored = json.loads((root / "autotune" / f"matmul-{SOURCE_HASH}.json").read_text())
    expected = {f"M={w}; round={r}": _record(f"M={w}; round={r}", 1.0 + w + r / 100)
                for w in range(WRITERS) for r in range(ROUNDS)}
    missing = sorted(set(expected) - set(stored))
    assert not missing, f"{len(missing)} of {len(expected)} records lost: {missing[:5]}"
    assert stored == expected
    assert not list((root / "autotune").glob("*.tmp"))  # no temporary file left behind


def test_a_save_keeps_the_records_of_other_keys_and_drops_invalid_ones(tmp_path):
    layout = CacheLayout(tmp_path / "cache")
    store = AutotuneRecordFile(layout, "matmul", SOURCE_HASH)
    store.save("M=1", _record("M=1", 1.0))
    text = json.loads(store.path.read_text())
    text["M=bad"] = {"timings_ms": {"BM=64": -1.0}}
    store.path.write_text(json.dumps(text))
    store.save("M=2", _record("M=2", 2.0))
    assert json.loads(store.path.read_text()) == {"M=1": _record("M=1", 1.0), "M=2": _record("M=2", 2.0)}


def test_a_record_in_which_every_config_failed_is_no_choice():
    assert record_problem({"timings_ms": {}, "failures": {"BM=32": "boom"}}) == \
        "no config in it was timed (every one failed)"
    assert record_problem({"timings_ms": {"BM=32": 1.0}, "failures": {"BM=64": "boom"}}) is None


def _plant(cache_dir, kernel, tuner, record: dict) -> None:
    half = torch.zeros(4, dtype=torch.float16)
    key = tuner._key_string({"A": half, "B": half, "M": 1024})  # what at.launch(tuner) tunes for
    path = at.record_file(cache_dir, kernel)
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    path.write_text(json.dumps({key: {"kernel": "matmul", "key": key, **record}}))


def test_a_stored_record_with_every_config_failed_is_tuned_again(cache_dir):
    kernel = at.FakeKernel()
    configs = at.configs_for(32, 64)
    tuner, bench = at.make_tuner(kernel, configs, at.TIMES)
    _plant(cache_dir, kernel, tuner, {"timings_ms": {}, "failures": {c.identity: "launch failed: out of memory"
                                                                      for c in configs}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        at.launch(tuner)
    assert any("every one failed" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert sorted(bench.timed) == [32, 64] and tuner.best_config.kwargs["BM"] == 64
    stored = next(iter(json.loads(at.record_file(cache_dir, kernel).read_text()).values()))
    assert set(stored["timings_ms"]) == {c.identity for c in configs} and stored["failures"] == {}


def test_failures_are_retried_when_the_record_times_none_of_the_configs_tuned_now(cache_dir):
    kernel = at.FakeKernel()
    configs = at.configs_for(32, 64)
    tuner, bench = at.make_tuner(kernel, configs, at.TIMES)
    gone = at.configs_for(512)[0].identity  # timed once, then removed from the config list
    _plant(cache_dir, kernel, tuner, {"timings_ms": {gone: 9.0}, "failures": {c.identity: "launch failed: busy"
                                                                              for c in configs}})
    at.launch(tuner)
    assert sorted(bench.timed) == [32, 64] and tuner.best_config.kwargs["BM"] == 64


def test_configs_failing_again_raise_an_error_naming_each_with_its_new_error(cache_dir):
    kernel = at.FakeKernel(fail_launch=lambda meta: f"no room for BM={meta['BM']}")
    configs = at.configs_for(32, 64)
    tuner, bench = at.make_tuner(kernel, configs, at.TIMES)
    _plant(cache_dir, kernel, tuner, {"timings_ms": {}, "failures": {c.identity: "stale reason"
                                                                      for c in configs}})
    for _ in range(2):  # every launch tries again, and says why each config failed
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(AutotuneError) as info:
                at.launch(tuner)
        message = str(info.value)
        assert "all 2 configs failed" in message and "stale reason" not in message
        for bm in (32, 64):
            assert f"BM={bm}, BN=64" in message and f"no room for BM={bm}" in message
        assert [c.kwargs["BM"] for c, _ in info.value.failures] == [32, 64]
    stored = next(iter(json.loads(at.record_file(cache_dir, kernel).read_text()).values()))
    assert stored["timings_ms"] == {}  # the failed tuning stored no choice
