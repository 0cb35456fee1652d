"""The autotuner on a fake kernel and a fake benchmark: choice, pruning, persistence, failures, parallel compile."""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import threading
import types
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tilejit
import tilejit.language as T
from tilejit.autotuner import AutotuneError, Autotuner, Config, autotune
from tilejit.backend_cuda import nvrtc
from tilejit.errors import LaunchError, TilejitError


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(path))
    monkeypatch.delenv("TILEJIT_AUTOTUNE", raising=False)
    monkeypatch.delenv("TILEJIT_COMPILE_WORKERS", raising=False)
    return path


class FakeKernel:
    """Follows the Kernel interface the autotuner wraps; records compiles and launches."""

    def __init__(self, source="v1", *, fail_compile=lambda meta: None, fail_launch=lambda meta: None,
                 compile_seconds=0.0, on_launch=None, spills=lambda meta: 0):
        def matmul(A, B, M, BM, BN):  # noqa: N803 - mirrors a kernel signature
            pass

        self.fn = matmul
        self.__name__ = "matmul"
        self.arg_names = ["A", "B", "M", "BM", "BN"]
        self.source = source
        self.fail_compile = fail_compile
        self.fail_launch = fail_launch
        self.spills = spills
        self.compile_seconds = compile_seconds
        self.on_launch = on_launch
        self.compiles: list[dict] = []
        self.compile_threads: list[int] = []
        self.launches: list[tuple[tuple, dict]] = []
        self.lock = threading.Lock()

    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    def compile(self, *args, arch=None, **meta):
        time.sleep(self.compile_seconds)
        with self.lock:
            self.compiles.append(meta)
            self.compile_threads.append(threading.get_ident())
        reason = self.fail_compile(meta)
        if reason:
            raise LaunchError(reason)
        return types.SimpleNamespace(meta={"registers": 100 + meta["BM"], "spills": self.spills(meta)})

    def __getitem__(self, grid):
        assert isinstance(grid, tuple), "the autotuner resolves callable grids itself"

        def launch(*args, **meta):
            reason = self.fail_launch(meta)
            if reason:
                raise LaunchError(reason)
            self.launches.append((grid, meta))
            if self.on_launch is not None:
                self.on_launch(args, meta)

        return launch


class FakeBench:
    """Replaces do_bench: runs the launcher once and reports a time chosen from the launched config."""

    def __init__(self, kernel: FakeKernel, ms_by_bm: dict[int, float]):
        self.kernel = kernel
        self.ms_by_bm = ms_by_bm
        self.timed: list[int] = []

    def __call__(self, run) -> float:
        run()
        bm = self.kernel.launches[-1][1]["BM"]
        self.timed.append(bm)
        return self.ms_by_bm[bm]


def configs_for(*bms):
    return [Config({"BM": bm, "BN": 64}, num_warps=4, num_stages=2) for bm in bms]


def make_tuner(kernel, configs, ms_by_bm, **options):
    bench = FakeBench(kernel, ms_by_bm)
    tuner = Autotuner(kernel, configs, key=["M"], bench_fn=bench, **options)
    return tuner, bench


def launch(tuner, m=1024, dtype=torch.float16, **kwargs):
    a = torch.zeros(4, dtype=dtype)
    b = torch.zeros(4, dtype=dtype)
    tuner[(1,)](a, b, m, **kwargs)


TIMES = {32: 3.0, 64: 1.0, 128: 2.0, 256: 0.5, 512: 9.0}


def record_file(cache_dir, kernel):
    return cache_dir / "autotune" / f"matmul-{kernel.source_hash()}.json"


# -- choosing -------------------------------------------------------------------------------------------------


class SaggingBench(FakeBench):
    """A GPU whose clock sagged while one timing ran: the ``slow``-th timing reads ``factor`` times longer."""

    def __init__(self, kernel, ms_by_bm, slow: int, factor: float):
        super().__init__(kernel, ms_by_bm)
        self.slow, self.factor = slow, factor

    def __call__(self, run) -> float:
        ms = super().__call__(run)
        return ms * self.factor if len(self.timed) - 1 == self.slow else ms


def test_finalists_are_timed_again_in_turns(cache_dir):
    """A timing inflated by a clock sag (the 128 config's, in the first pass) does not decide: every config within
    15% of the best is timed again in three rotating turns and keeps its best time; slower ones are not."""
    kernel = FakeKernel()
    bench = SaggingBench(kernel, {32: 3.0, 64: 1.0, 128: 0.95, 256: 1.1}, slow=2, factor=1.2)
    tuner = Autotuner(kernel, configs_for(32, 64, 128, 256), key=["M"], bench_fn=bench)
    launch(tuner)
    assert bench.timed[:4] == [32, 64, 128, 256]  # first pass: 128 reads 1.14 ms, behind 64's 1.0
    finalists = {64, 128, 256}  # within 15% of 1.0; 32 (3.0 ms) is not
    assert sorted(bench.timed[4:]) == sorted(3 * list(finalists))
    assert bench.timed[4:7] != bench.timed[7:10]  # the order rotates between turns
    assert tuner.best_config.kwargs["BM"] == 128
    assert len(tuner.stats.timed) == 4 and len(tuner.stats.retimed) == 3
    stored = json.loads(record_file(cache_dir, kernel).read_text())  # the best times are what is stored
    (record,) = stored.values()  # one key
    assert record["timings_ms"]["BM=128, BN=64, num_warps=4, num_stages=2"] == 0.95


def test_a_lone_leader_is_not_timed_again():
    kernel = FakeKernel()
    tuner, bench = make_tuner(kernel, configs_for(32, 64, 128), TIMES)  # 64 leads by more than 15%
    launch(tuner)
    assert sorted(bench.timed) == [32, 64, 128] and tuner.stats.retimed == []


def test_chooses_the_fastest_config_and_launches_with_it():
    kernel = FakeKernel()
    tuner, bench = make_tuner(kernel, configs_for(32, 64, 128), TIMES)
    launch(tuner)
    assert sorted(bench.timed) == [32, 64, 128]
    assert tuner.best_config == Config({"BM": 64, "BN": 64}, num_warps=4, num_stages=2)
    assert kernel.launches[-1][1] == {"BM": 64, "BN": 64, "num_warps": 4, "num_stages": 2}


def test_grid_callable_sees_named_args_user_kwargs_and_config():
    kernel = FakeKernel()
    tuner, _ = make_tuner(kernel, configs_for(32, 64), TIMES)
    seen = []

    def grid(meta):
        seen.append(dict(meta))
        return (meta["M"] // meta["BM"],)

    a = torch.zeros(4)
    tuner[grid](a, a, M=1024)
    assert seen[-1]["M"] == 1024 and seen[-1]["BM"] == 64 and seen[-1]["num_warps"] == 4
    assert seen[-1]["A"] is a
    assert kernel.launches[-1][0] == (16,)


def test_chosen_config_is_reused_in_memory_and_key_values_retune():
    kernel = FakeKernel()
    tuner, bench = make_tuner(kernel, configs_for(32, 64), TIMES)
    launch(tuner, m=1024)
    launch(tuner, m=1024)
    assert len(bench.timed) == 2
    launch(tuner, m=2048)
    assert len(bench.timed) == 4
    launch(tuner, m=1024, dtype=torch.bfloat16)  # tensor dtypes are part of the key
    assert len(bench.timed) == 6


def test_single_config_is_used_without_timing():
    kernel = FakeKernel()
    tuner, bench = make_tuner(kernel, configs_for(128), TIMES)
    launch(tuner)
    assert bench.timed == [] and kernel.compiles == []
    assert tuner.best_config.kwargs["BM"] == 128


def test_autotune_disabled_uses_the_first_config(monkeypatch, cache_dir):
    monkeypatch.setenv("TILEJIT_AUTOTUNE", "0")
    kernel = FakeKernel()
    tuner, bench = make_tuner(kernel, configs_for(128, 64, 32), TIMES)
    launch(tuner)
    assert bench.timed == [] and kernel.compiles == []
    assert tuner.best_config.kwargs["BM"] == 128
    assert kernel.launches[-1][1]["BM"] == 128
    assert not (cache_dir / "autotune").exists()


def test_interpreter_mode_times_configs_without_compiling_and_keys_the_choice_apart(monkeypatch, cache_dir):
    kernel = FakeKernel()
    tuner, bench = make_tuner(kernel, configs_for(128, 64, 32), TIMES)
    launch(tuner)  # on the "GPU" path: compiled, then timed
    assert len(kernel.compiles) == 3 and tuner.best_config.kwargs["BM"] == 64
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    kernel.compiles.clear()
    bench.timed.clear()
    tuner._chosen.clear()  # as a new process would
    launch(tuner)
    assert kernel.compiles == [] and sorted(bench.timed) == [32, 64, 128]  # tuned again: its own key
    assert tuner.best_config.kwargs["BM"] == 64 and kernel.launches[-1][1]["BM"] == 64
    keys = sorted(json.loads(record_file(cache_dir, kernel).read_text()))
    assert len(keys) == 2 and keys[1] == keys[0] + "; interpreter"


def test_a_pinned_lowering_tunes_under_its_own_key(monkeypatch, cache_dir):
    """Timings taken with a gemm or copy lowering pinned (or the mma overlap off) are not the default lowering's:
    each setting tunes again under its own key, in this process (the per-launch key) and on disk."""
    kernel = FakeKernel()
    tuner, bench = make_tuner(kernel, configs_for(128, 64, 32), TIMES)
    launch(tuner)
    assert sorted(bench.timed) == [32, 64, 128]
    pinned = {"TILEJIT_GEMM_LOWERING": "mma_sync_m16n8k16", "TILEJIT_COPY_LOWERING": "cp_async"}
    for name, value in pinned.items():
        monkeypatch.setenv(name, value)
    bench.timed.clear()
    launch(tuner)  # no tuner._chosen.clear(): the per-launch key itself must tell the pins apart
    assert sorted(bench.timed) == [32, 64, 128]
    monkeypatch.setenv("TILEJIT_MMA_OVERLAP", "0")
    bench.timed.clear()
    launch(tuner)
    assert sorted(bench.timed) == [32, 64, 128]
    for name in (*pinned, "TILEJIT_MMA_OVERLAP"):
        monkeypatch.delenv(name)
    bench.timed.clear()
    launch(tuner)  # back to the first setting: its choice is remembered
    assert bench.timed == []
    keys = sorted(json.loads(record_file(cache_dir, kernel).read_text()))
    assert len(keys) == 3
    assert keys[1] == keys[0] + "; codegen=gemm=mma_sync_m16n8k16:copy=cp_async"
    assert keys[2] == keys[1] + ":no-mma-overlap"


@tilejit.kernel
def double(X, Y, BLOCK: T.constexpr):
    i = T.program_id(0) * BLOCK
    Y[i:i + BLOCK] = X[i:i + BLOCK] * 2.0


def test_interpreter_mode_autotunes_a_real_kernel_without_nvrtc_or_a_gpu(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")

    def no_nvrtc(*args, **kwargs):
        raise AssertionError("NVRTC was asked for under TILEJIT_INTERPRET=1")

    for name in ("_nvrtc", "nvrtc_version", "compile_cuda"):
        monkeypatch.setattr(nvrtc, name, no_nvrtc)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    tuner = autotune([Config({"BLOCK": 32}), Config({"BLOCK": 64}, num_warps=8)], key=["X"])(double)
    x = torch.randn(256)
    y = torch.full((256,), float("nan"))
    tuner[lambda meta: (256 // meta["BLOCK"],)](x, y)  # the default bench: wall clock on the interpreter
    assert tuner.stats.compiled == [] and len(tuner.stats.timed) == 2 and tuner.stats.failed == []
    torch.testing.assert_close(y, x * 2.0)


def test_passing_a_tuned_parameter_at_launch_is_an_error():
    tuner, _ = make_tuner(FakeKernel(), configs_for(32, 64), TIMES)
    with pytest.raises(TypeError, match="BM"):
        launch(tuner, BM=32)
    with pytest.raises(TypeError, match="num_warps"):
        launch(tuner, num_warps=8)


def test_unknown_names_are_rejected_when_decorating():
    with pytest.raises(ValueError, match="'K'"):
        Autotuner(FakeKernel(), configs_for(32), key=["K"])
    with pytest.raises(ValueError, match="reset_to_zero"):
        Autotuner(FakeKernel(), configs_for(32), key=["M"], reset_to_zero=["C"])
    with pytest.raises(ValueError, match="prune_configs_by"):
        Autotuner(FakeKernel(), configs_for(32), key=["M"], prune_configs_by={"topk": 2})


def test_decorator_exposes_the_kernel_interface():
    kernel = FakeKernel()
    tuner = autotune(configs=configs_for(32, 64), key=["M"])(kernel)
    assert isinstance(tuner, Autotuner)
    assert tuner.fn is kernel.fn
    assert tuner.__name__ == "matmul"
    assert tuner.arg_names == kernel.arg_names
    assert tuner.source_hash() == kernel.source_hash()
    assert tuner.configs == configs_for(32, 64)
    assert tuner.best_config is None
    tuner.compile(1, 2, 3, BM=16, BN=16, num_warps=4, num_stages=1)
    assert kernel.compiles == [{"BM": 16, "BN": 16, "num_warps": 4, "num_stages": 1}]
    assert tuner.compile_seconds == 0.0  # other attributes reach the kernel


# -- config identity ------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.sampled_from(["BM", "BN", "BK", "GROUP", "SPLIT"]), st.integers(1, 512), min_size=1))
def test_config_identity_ignores_dict_order(kwargs):
    for permutation in itertools.islice(itertools.permutations(kwargs.items()), 6):
        assert Config(dict(permutation), num_warps=8).identity == Config(kwargs, num_warps=8).identity


def test_config_identity_distinguishes_content():
    base = Config({"BM": 64}, num_warps=4, num_stages=3)
    assert base != Config({"BM": 64}, num_warps=8, num_stages=3)
    assert base != Config({"BM": 64}, num_warps=4, num_stages=4)
    assert base != Config({"BM": 128}, num_warps=4, num_stages=3)
    assert base != Config({"BM": True}, num_warps=4, num_stages=3)
    assert base == Config({"BM": 64}, num_warps=4, num_stages=3, pre_hook=print)
    with pytest.raises(ValueError, match="num_warps"):
        Config({"num_warps": 4})


# -- pruning --------------------------------------------------------------------------------------------------


def test_early_config_prune_sees_named_args_and_kwargs():
    kernel = FakeKernel()
    calls = []

    def keep_small(configs, named_args, **kwargs):
        calls.append((named_args["M"], dict(kwargs)))
        return [c for c in configs if c.kwargs["BM"] <= named_args["M"] // 16]

    tuner, bench = make_tuner(kernel, configs_for(32, 64, 128), TIMES,
                              prune_configs_by={"early_config_prune": keep_small})
    a = torch.zeros(4)
    tuner[(1,)](a, a, M=1024)
    assert calls == [(1024, {"M": 1024})]
    assert sorted(bench.timed) == [32, 64]
    assert sorted(c["BM"] for c in kernel.compiles) == [32, 64]


def test_early_config_prune_removing_everything_is_an_autotune_error():
    tuner, _ = make_tuner(FakeKernel(), configs_for(32, 64), TIMES,
                          prune_configs_by={"early_config_prune": lambda configs, named, **kw: []})
    with pytest.raises(AutotuneError, match="early_config_prune"):
        launch(tuner)


@pytest.mark.parametrize("top_k", [2, 0.5])
def test_perf_model_keeps_the_top_k_estimates(top_k):
    kernel = FakeKernel()
    estimates = []

    def perf_model(A, B, M, BM, BN, num_warps, num_stages):  # noqa: N803
        estimates.append(BM)
        return abs(BM - 100)  # predicts 128 and 64 as the best

    tuner, bench = make_tuner(kernel, configs_for(32, 64, 128, 512), TIMES,
                              prune_configs_by={"perf_model": perf_model, "top_k": top_k})
    launch(tuner)
    assert sorted(estimates) == [32, 64, 128, 512]
    assert sorted(bench.timed) == [64, 128]
    assert tuner.best_config.kwargs["BM"] == 64


def test_perf_model_without_need_to_prune_is_not_called():
    called = []
    tuner, bench = make_tuner(FakeKernel(), configs_for(32, 64), TIMES,
                              prune_configs_by={"perf_model": lambda **kw: called.append(1) or 0.0, "top_k": 5})
    launch(tuner)
    assert called == [] and sorted(bench.timed) == [32, 64]


# -- persistence ----------------------------------------------------------------------------------------------


def test_record_is_written_as_documented(cache_dir):
    kernel = FakeKernel()
    tuner, _ = make_tuner(kernel, configs_for(32, 64, 128), TIMES)
    launch(tuner)
    path = record_file(cache_dir, kernel)
    data = json.loads(path.read_text())
    assert len(data) == 1
    (key, record), = data.items()
    assert "M=1024" in key and "A:torch.float16" in key and "B:torch.float16" in key
    assert record["kernel"] == "matmul"
    assert record["key"] == key
    assert record["config"] == {"kwargs": {"BM": 64, "BN": 64}, "num_warps": 4, "num_stages": 2}
    assert record["timings_ms"] == {c.identity: TIMES[c.kwargs["BM"]] for c in configs_for(32, 64, 128)}
    assert record["created"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_second_process_reuses_the_record_without_compiling_or_timing(cache_dir):
    first = FakeKernel()
    tuner, _ = make_tuner(first, configs_for(32, 64, 128), TIMES)
    launch(tuner)

    second = FakeKernel()  # a fresh kernel object, as in another process
    tuner2, bench2 = make_tuner(second, list(reversed(configs_for(32, 64, 128))), TIMES)
    launch(tuner2)
    assert bench2.timed == [] and second.compiles == []
    assert tuner2.stats.from_disk
    assert tuner2.best_config.kwargs["BM"] == 64
    assert second.launches[-1][1]["BM"] == 64


def test_adding_a_config_times_only_the_new_one(cache_dir):
    kernel = FakeKernel()
    tuner, _ = make_tuner(kernel, configs_for(32, 64, 128), TIMES)
    launch(tuner)

    faster = FakeKernel()
    tuner2, bench2 = make_tuner(faster, configs_for(256, 32, 64, 128), TIMES)
    launch(tuner2)
    assert bench2.timed == [256]
    assert [c["BM"] for c in faster.compiles] == [256]
    assert tuner2.best_config.kwargs["BM"] == 256

    slower = FakeKernel()
    tuner3, bench3 = make_tuner(slower, configs_for(32, 64, 128, 256, 512), TIMES)
    launch(tuner3)
    assert bench3.timed == [512]
    assert tuner3.best_config.kwargs["BM"] == 256
    record = next(iter(json.loads(record_file(cache_dir, kernel).read_text()).values()))
    assert len(record["timings_ms"]) == 5


def test_removing_a_config_chooses_among_the_remaining_ones(cache_dir):
    tuner, _ = make_tuner(FakeKernel(), configs_for(32, 64, 128), TIMES)
    launch(tuner)
    tuner2, bench2 = make_tuner(FakeKernel(), configs_for(32, 128), TIMES)
    launch(tuner2)
    assert bench2.timed == []
    assert tuner2.best_config.kwargs["BM"] == 128


def test_changed_source_hash_uses_a_new_file(cache_dir):
    tuner, _ = make_tuner(FakeKernel("v1"), configs_for(32, 64), TIMES)
    launch(tuner)
    edited = FakeKernel("v2")
    tuner2, bench2 = make_tuner(edited, configs_for(32, 64), TIMES)
    launch(tuner2)
    assert sorted(bench2.timed) == [32, 64]
    assert len(list((cache_dir / "autotune").glob("matmul-*.json"))) == 2
    assert record_file(cache_dir, edited).exists()


def test_keys_tuned_separately_share_one_file(cache_dir):
    kernel = FakeKernel()
    tuner, _ = make_tuner(kernel, configs_for(32, 64), TIMES)
    launch(tuner, m=1024)
    launch(tuner, m=4096)
    data = json.loads(record_file(cache_dir, kernel).read_text())
    assert sorted("M=1024" in key for key in data) == [False, True]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"k": {"timings_ms": "fast"}}'])
def test_corrupt_record_is_ignored_with_a_warning(cache_dir, content):
    kernel = FakeKernel()
    path = record_file(cache_dir, kernel)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    tuner, bench = make_tuner(kernel, configs_for(32, 64), TIMES)
    with pytest.warns(RuntimeWarning, match="autotune record"):  # a malformed record is dropped, and said so
        launch(tuner)
    assert sorted(bench.timed) == [32, 64]
    data = json.loads(path.read_text())
    assert "k" not in data and len(data) == 1


def test_unwritable_cache_dir_keeps_the_choice_in_memory(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(blocker))
    tuner, bench = make_tuner(FakeKernel(), configs_for(32, 64), TIMES)
    with caplog.at_level(logging.WARNING, logger="tilejit.autotune"):
        launch(tuner)
        launch(tuner)
    assert tuner.best_config.kwargs["BM"] == 64
    assert len(bench.timed) == 2
    assert "cannot write autotune record" in caplog.text


# -- failures -------------------------------------------------------------------------------------------------


def test_config_failing_to_compile_is_skipped_and_logged(caplog):
    kernel = FakeKernel(fail_compile=lambda meta: meta["BM"] == 64 and "needs 300 KiB of shared memory")
    tuner, bench = make_tuner(kernel, configs_for(32, 64, 128), TIMES)
    with caplog.at_level(logging.INFO, logger="tilejit.autotune"):
        launch(tuner)
    assert sorted(bench.timed) == [32, 128]
    assert tuner.best_config.kwargs["BM"] == 128
    assert "BM=64" in caplog.text and "needs 300 KiB of shared memory" in caplog.text
    assert tuner.stats.failed == [Config({"BM": 64, "BN": 64}, num_stages=2).identity]


def test_config_failing_to_launch_is_skipped_and_not_retried(cache_dir):
    kernel = FakeKernel(fail_launch=lambda meta: meta["BM"] == 64 and "too many resources requested")
    tuner, bench = make_tuner(kernel, configs_for(32, 64, 128), TIMES)
    launch(tuner)
    assert sorted(bench.timed) == [32, 128]
    assert tuner.best_config.kwargs["BM"] == 128
    record = next(iter(json.loads(record_file(cache_dir, kernel).read_text()).values()))
    assert "too many resources requested" in record["failures"]["BM=64, BN=64, num_warps=4, num_stages=2"]

    again = FakeKernel(fail_launch=kernel.fail_launch)
    tuner2, bench2 = make_tuner(again, configs_for(32, 64, 128), TIMES)
    launch(tuner2)
    assert bench2.timed == [] and again.compiles == []


def test_config_that_spills_is_refused_when_one_that_does_not_is_there(cache_dir, caplog):
    kernel = FakeKernel(spills=lambda meta: 96 if meta["BM"] == 128 else 0)
    tuner, bench = make_tuner(kernel, configs_for(32, 64, 128), {32: 3.0, 64: 2.0, 128: 1.0})
    with caplog.at_level(logging.INFO, logger="tilejit.autotune"):
        launch(tuner)
    assert sorted(bench.timed) == [32, 64] and tuner.best_config.kwargs["BM"] == 64
    assert "spills 96 bytes to local memory (228 registers)" in caplog.text
    assert tuner.stats.registers == {c.identity: 100 + c.kwargs["BM"] for c in configs_for(32, 64, 128)}
    assert tuner.stats.spills[configs_for(128)[0].identity] == 96
    record = next(iter(json.loads(record_file(cache_dir, kernel).read_text()).values()))
    assert "refused: spills 96 bytes" in record["failures"]["BM=128, BN=64, num_warps=4, num_stages=2"]


def test_configs_that_all_spill_are_all_timed():
    kernel = FakeKernel(spills=lambda meta: 32)
    tuner, bench = make_tuner(kernel, configs_for(32, 64), TIMES)
    launch(tuner)
    assert sorted(bench.timed) == [32, 64] and tuner.stats.failed == []


def test_all_configs_failing_raises_an_error_listing_each(cache_dir):
    kernel = FakeKernel(fail_compile=lambda meta: f"no room for BM={meta['BM']}" if meta["BM"] != 128 else None,
                        fail_launch=lambda meta: meta["BM"] == 128 and "launch refused")
    tuner, _ = make_tuner(kernel, configs_for(32, 64, 128), TIMES)
    with pytest.raises(AutotuneError) as info:
        launch(tuner)
    error = info.value
    assert isinstance(error, TilejitError)
    message = str(error)
    assert "all 3 configs failed" in message
    for bm in (32, 64):
        assert f"BM={bm}, BN=64" in message and f"no room for BM={bm}" in message
    assert "BM=128, BN=64" in message and "launch refused" in message
    assert [c.kwargs["BM"] for c, _ in error.failures] == [32, 64, 128]
    assert not record_file(cache_dir, kernel).exists()


# -- parallel compilation and progress ------------------------------------------------------------------------


def test_configs_compile_on_more_than_one_worker(monkeypatch):
    monkeypatch.setenv("TILEJIT_COMPILE_WORKERS", "4")
    kernel = FakeKernel(compile_seconds=0.2)
    tuner, bench = make_tuner(kernel, configs_for(*range(16, 144, 16)), {bm: float(bm) for bm in range(16, 144, 16)})
    launch(tuner)
    assert len(kernel.compiles) == 8
    assert len(set(kernel.compile_threads)) > 1
    assert tuner.stats.compile_thread_ids == set(kernel.compile_threads)
    assert len(bench.timed) == 8


def test_no_progress_output_when_stderr_is_not_a_terminal(capsys):
    tuner, _ = make_tuner(FakeKernel(), configs_for(32, 64), TIMES)
    launch(tuner)
    assert capsys.readouterr().err == ""


def test_progress_bar_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    tuner, _ = make_tuner(FakeKernel(), configs_for(32, 64), TIMES)
    launch(tuner)
    assert "autotune matmul" in terminal.getvalue()


# -- argument hooks -------------------------------------------------------------------------------------------


def test_reset_to_zero_and_restore_value_around_every_timed_run():
    seen = []

    def accumulate(args, meta):
        a, b = args[0], args[1]
        seen.append((a.clone(), b.clone()))
        a += 1  # an atomics-style output: must start from zero
        b *= 2  # an in-place update: must start from the saved value

    kernel = FakeKernel(on_launch=accumulate)

    def bench(run):
        for _ in range(3):
            run()
        return TIMES[kernel.launches[-1][1]["BM"]]

    tuner = Autotuner(kernel, configs_for(32, 64), key=["M"], reset_to_zero=["A"], restore_value=["B"],
                      bench_fn=bench)
    a = torch.full((4,), 7.0)
    b = torch.full((4,), 3.0)
    tuner[(1,)](a, b, 1024)
    timed, final = seen[:-1], seen[-1]
    assert len(timed) == 6
    for a_before, b_before in timed:
        assert torch.equal(a_before, torch.zeros(4))
        assert torch.equal(b_before, torch.full((4,), 3.0))
    # the real launch sees the restored B, and A zeroed again (an atomics-style output adds to zeros)
    assert torch.equal(final[0], torch.zeros(4)) and torch.equal(a, torch.ones(4))
    assert torch.equal(final[1], torch.full((4,), 3.0))
    assert torch.equal(b, torch.full((4,), 6.0))


def test_pre_hook_runs_before_every_launch():
    hooked = []
    configs = [Config({"BM": 32, "BN": 64}, num_stages=2, pre_hook=lambda nargs: hooked.append(nargs["BM"])),
               Config({"BM": 64, "BN": 64}, num_stages=2, pre_hook=lambda nargs: hooked.append(nargs["BM"]))]
    tuner, _ = make_tuner(FakeKernel(), configs, TIMES)
    launch(tuner)
    assert sorted(hooked) == [32, 64, 64]
