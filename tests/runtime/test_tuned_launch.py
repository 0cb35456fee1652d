"""Autotuned launches through the compiled launcher's tuned dispatch (``_launch.c``'s Tuned), on CPU.

A real ``Autotuner`` over a real ``@tilejit.kernel`` whose Dispatcher is built, as in test_native_launch.py, over
stand-in tensors, with ``set_launch_hook`` recording what would have gone to cuLaunchKernel: after the first tuned
launches, a launch is a hit of the tuned table (no Python frame of the autotuner's), and a new key argument, a
new dtype or a changed environment misses and goes back to the autotuner. The GPU tests (tests/gpu/
test_tuned_launch_gpu.py) run the same path with real tensors, under CUDA graph capture.
"""
from __future__ import annotations

import os
import types
import uuid
import warnings

import pytest

import tilejit
import tilejit.language as T
from tilejit import autotuner as autotuner_module
from tilejit.autotuner import Autotuner, Config
from tilejit.runtime import native

from test_native_launch import _build_tools_missing  # (tests/runtime is on the path)

CONSTEXPR, RUNTIME = "constexpr", "runtime"
TIMES = {32: 3.0, 64: 1.0, 128: 2.0}  # ms by BLOCK: 64 wins


_MISSING = _build_tools_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"cannot build the native launcher here: {_MISSING}")


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    old = os.environ.get("TILEJIT_CACHE_DIR")
    os.environ["TILEJIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("native-cache"))
    try:
        return native._load_or_build()
    finally:
        if old is None:
            del os.environ["TILEJIT_CACHE_DIR"]
        else:
            os.environ["TILEJIT_CACHE_DIR"] = old


class DType:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


F16, F32 = DType("f16"), DType("f32")


class FakeTensor:
    """What the launcher and the autotuner read of a torch tensor."""

    def __init__(self, n: int, dtype=F16, ptr=0x7f0000001000) -> None:
        self.shape, self._strides, self.dtype, self._ptr, self.requires_grad = (n,), (1,), dtype, ptr, False

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return 0


def scale(X, Y, n, BLOCK: T.constexpr):
    Y[0:BLOCK] = X[0:BLOCK] * 2


class Tuned:
    """A tuner over a real kernel whose compiled launcher runs on stand-in tensors; records launches and timings."""

    def __init__(self, mod, monkeypatch, configs=None, key=("n",)) -> None:
        self.mod = mod
        self.kernel = tilejit.kernel(scale)
        self.kernel.compile = lambda *args, **meta: types.SimpleNamespace(meta={})
        source_hash = uuid.uuid4().hex * 2  # each tuner its own records: none stored by another test is found
        self.kernel.source_hash = lambda: source_hash
        self.slow_calls, self.launches, self.timed = [], [], []
        self.kernel._dispatcher = mod.Dispatcher(
            roles=list(self.kernel._roles), role_constexpr=CONSTEXPR, role_shaped="shaped",
            fast_kwargs=set(self.kernel._fast_kwargs), tensor_type=FakeTensor,
            stream_getter=lambda device: 0x5000 + device, slow=self.slow, fallback=self.fallback, grid_fn=self.grid,
            names=tuple(self.kernel.arg_names), runtime_index=dict(self.kernel._runtime_index), defaults={})
        monkeypatch.setattr(native, "ready", lambda: mod)
        mod.set_launch_hook(self.hook)
        configs = configs or [Config({"BLOCK": b}, num_warps=4) for b in TIMES]
        self.tuner = Autotuner(self.kernel, configs, key=list(key), bench_fn=self.bench)

    def slow(self, grid, args, kwargs):
        """The kernel's slow path: the Entry of the config launched (its function names the BLOCK)."""
        self.slow_calls.append(dict(kwargs))
        return self.mod.Entry(kwargs["BLOCK"], (128, 1, 1), 0, bytes([0, 1, 1, 0, 1, 1, 1]), 0, None,
                              lambda *a: None)

    def fallback(self, grid, args, kwargs):
        raise AssertionError(f"the kernel's fallback was taken: {args} {kwargs}")

    def grid(self, grid, args, kwargs):
        return grid(kwargs) if callable(grid) else None

    def hook(self, function, grid, block, smem, stream, params, offsets):
        self.launches.append((function, grid))

    def bench(self, run):
        run()
        run()  # the first run of a config is the kernel's miss, launched by its slow path
        block = self.launches[-1][0]
        self.timed.append(block)
        return TIMES[block]


@pytest.fixture
def tuned(mod, monkeypatch):
    made = []

    def make(**options):
        made.append(Tuned(mod, monkeypatch, **options))
        return made[-1]

    monkeypatch.delenv("TILEJIT_AUTOTUNE", raising=False)
    yield make
    mod.set_launch_hook(None)


def settle(t: Tuned, grid, *args):
    """Launch until the tuned dispatch remembers the call (the kernel's Dispatcher first has to remember the
    chosen config's launch); returns the launches it took."""
    for count in range(1, 6):
        t.tuner[grid](*args)
        if t.tuner._native is not None and t.tuner._native.stats()["entries"]:
            return count
    raise AssertionError("the tuned dispatch never remembered the call")


def test_after_the_first_tuned_launches_the_compiled_launcher_takes_them(tuned):
    t = tuned()
    x, y = FakeTensor(100), FakeTensor(100, ptr=0x7f0000002000)
    assert settle(t, (4,), x, y, 100) <= 3
    assert t.timed.count(32) >= 1 and t.timed.count(64) >= 1  # tuned once: every config timed
    native_tuned = t.tuner._native
    before, timed, slow = native_tuned.stats(), list(t.timed), len(t.slow_calls)
    t.launches.clear()
    for _ in range(5):
        t.tuner[(7, 2)](x, y, 100)
    after = native_tuned.stats()
    assert after["hits"] == before["hits"] + 5 and after["misses"] == before["misses"]
    assert t.launches == [(64, (7, 2, 1))] * 5  # the chosen config's kernel, on the launch's grid
    assert t.timed == timed and len(t.slow_calls) == slow  # nothing tuned or compiled again
    assert t.tuner.best_config.kwargs == {"BLOCK": 64}
    assert type(t.tuner[(1,)]).__name__ == "TunedLaunch"


def test_a_new_key_value_or_dtype_misses_and_tunes_anew(tuned):
    t = tuned()
    x, y = FakeTensor(100), FakeTensor(100)
    settle(t, (4,), x, y, 100)
    stats = t.tuner._native.stats()
    timed = len(t.timed)
    t.tuner[(4,)](x, y, 200)  # a key argument's new value: a miss, tuned again
    assert t.tuner._native.stats()["misses"] == stats["misses"] + 1 and len(t.timed) > timed
    timed = len(t.timed)
    t.tuner[(4,)](x, y, 100)  # n=100 again: no tuning (remembered by the autotuner, if not yet by the table)
    assert len(t.timed) == timed
    t.tuner[(4,)](FakeTensor(100, F32), FakeTensor(100, F32), 100)  # a new dtype: tuned anew
    assert len(t.timed) > timed
    words = t.tuner._native.signature
    assert words(x, y, 100) != words(x, y, 200) != words(x, y, 101)
    assert words(x, y, 100) != words(FakeTensor(100, F32), y, 100)
    assert words(x, y, 100) == words(FakeTensor(100, ptr=0x7f0000009000), y, 100)  # not the pointer's value


def test_a_non_key_int_keeps_the_hit_and_a_changed_environment_misses(tuned, monkeypatch):
    t = tuned(key=("X",))  # keyed on the tensor X: its extents
    x, y = FakeTensor(100), FakeTensor(100)
    settle(t, (4,), x, y, 100)
    words = t.tuner._native.signature
    assert words(x, y, 100) == words(x, y, 99)  # n is not a key argument (both neither 1 nor a multiple of 16)
    assert words(x, y, 100) != words(FakeTensor(101), y, 100)
    plain = words(x, y, 100)
    for name in autotuner_module.NATIVE_KEY_VARIABLES:
        monkeypatch.setenv(name, "0")
        assert words(x, y, 100) != plain, name
        monkeypatch.delenv(name)
        assert words(x, y, 100) == plain
    monkeypatch.setenv("TILEJIT_AUTOTUNE", "0")  # the first config, not the tuned one
    t.launches.clear()
    t.tuner[(4,)](x, y, 100)
    t.tuner[(4,)](x, y, 100)
    assert {block for block, _ in t.launches} == {32}


def test_a_grid_function_sees_the_choice(tuned):
    t = tuned()
    x, y = FakeTensor(100), FakeTensor(100)

    def grid(meta):
        return (tilejit.cdiv(meta["n"], meta["BLOCK"]),)

    settle(t, grid, x, y, 100)
    hits = t.tuner._native.stats()["hits"]
    t.launches.clear()
    t.tuner[grid](x, y, 100)
    assert t.launches == [(64, (2, 1, 1))] and t.tuner._native.stats()["hits"] == hits + 1


def test_a_config_with_a_pre_hook_is_never_remembered(tuned):
    seen = []
    t = tuned(configs=[Config({"BLOCK": 32}, num_warps=4, pre_hook=lambda args: seen.append(args["n"]))])
    x, y = FakeTensor(100), FakeTensor(100)
    for _ in range(4):
        t.tuner[(4,)](x, y, 100)
    assert seen == [100] * 4  # the hook ran before every launch
    assert t.tuner._native is not None and t.tuner._native.stats()["entries"] == 0


def test_passing_a_tuned_parameter_is_still_refused(tuned):
    t = tuned()
    x, y = FakeTensor(100), FakeTensor(100)
    settle(t, (4,), x, y, 100)
    with pytest.raises(tilejit.errors.UsageTypeError, match="chosen by the autotuner"):
        t.tuner[(4,)](x, y, 100, BLOCK=32)


def test_the_interpreter_path_is_unaffected(monkeypatch):
    """Under TILEJIT_INTERPRET=1 no Dispatcher is made, so the tuner stays on its Python path."""
    import torch

    monkeypatch.setenv("TILEJIT_INTERPRET", "1")
    kernel = tilejit.kernel(scale)
    tuner = Autotuner(kernel, [Config({"BLOCK": 32}), Config({"BLOCK": 64})], key=["n"], bench_fn=lambda run: run()
                      or 1.0)
    x = torch.arange(64, dtype=torch.float32)
    y = torch.zeros(64)
    for _ in range(3):
        tuner[(1,)](x, y, 64)
    assert torch.equal(y, x * 2)
    assert tuner._native is None and kernel._dispatcher is None


# -- warnings of compiling name the user's line ------------------------------------------------------------------

def _shrinking_configs():
    """A config whose ring (8 stages of 128x128x64 halves, 256 KB) sm_80 shrinks with a warning, and one that fits."""
    return [Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=4, num_stages=8),
            Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=2)]


def test_warnings_while_tuning_name_the_launch_line(tmp_path, monkeypatch):
    """The configs compile on the autotuner's threads, where no frame is the user's: the warning still names the
    line of the tuned launch (the benchmark runs nothing; the chosen config's launch then refuses meta tensors)."""
    import inspect

    import torch
    from kernels import matmul_staged

    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))  # a cold cache: the compile runs, and warns
    monkeypatch.setenv("TILEJIT_ARCH", "sm_80")
    monkeypatch.setenv("TILEJIT_COMPILE_WORKERS", "2")
    tuner = Autotuner(tilejit.kernel(matmul_staged.fn), _shrinking_configs(), key=["A"], bench_fn=lambda run: 1.0)
    a, b, c = (torch.empty(4096, 4096, dtype=torch.float16, device="meta") for _ in range(3))
    with pytest.warns(RuntimeWarning, match="a pipeline of 8 stages") as caught:
        with pytest.raises(tilejit.errors.ArgumentValueError, match="move it to a CUDA device"):
            line = inspect.currentframe().f_lineno + 1
            tuner[(1, 1)](a, b, c)
    assert tuner.stats.compile_thread_ids  # compiled on the autotuner's threads
    locations = {(w.filename, w.lineno) for w in caught if "a pipeline of" in str(w.message)}
    assert locations == {(__file__, line)}


def test_warnings_of_compile_name_its_line_through_a_helper_of_the_users(tmp_path, monkeypatch):
    """``kernel.compile`` called from a function of the user's: the warning names the line inside it (the first
    frame out of tilejit), whatever tilejit frames lie between."""
    import inspect

    import torch
    from kernels import matmul_staged

    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path))
    kernel = Autotuner(tilejit.kernel(matmul_staged.fn), _shrinking_configs(), key=["A"])  # compile passes through
    a = torch.empty(4096, 4096, dtype=torch.float16, device="meta")
    lines = []

    def build():
        lines.append(inspect.currentframe().f_lineno + 1)
        return kernel.compile(a, a, a, BM=128, BN=128, BK=64, num_warps=4, num_stages=8, arch="sm_80",
                              stop_after="cuda")

    with pytest.warns(RuntimeWarning, match="a pipeline of 8 stages") as caught:
        build()
    (warning,) = [w for w in caught if "a pipeline of" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, lines[0])


def test_a_warning_located_in_code_without_a_module_spec(monkeypatch):
    """A call site in code that torch.compile generates (its globals have no ``__spec__.loader``): the warning is
    still located there, not a ValueError from ``warnings.warn_explicit``."""
    from tilejit import errors

    generated = {"__name__": "torch_compiled_graph"}
    exec(compile("import sys\nframe = sys._getframe()\n", "<eval_with_key>.7", "exec"), generated)
    monkeypatch.setattr(errors, "_user_frame", lambda site: generated["frame"])
    token = errors._CALL_SITE.set(object())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            errors.warn_user("tilejit: a pipeline of 2 stages ...")
    finally:
        errors._CALL_SITE.reset(token)
    assert [(w.filename, w.lineno) for w in caught] == [("<eval_with_key>.7", 2)]


def test_a_warning_located_in_a_module_run_with_python_m(tmp_path):
    """A compile warning whose call site is a module run as ``python -m`` (``__main__``, whose loader refuses to
    give the source of another name) is located there, not an InternalError."""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "userscript.py").write_text(textwrap.dedent('''
        import warnings, torch, tilejit, tilejit.language as T

        @tilejit.kernel
        def k(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
            acc = T.zeros((BM, BN), T.float32)
            for k0 in T.range(0, A.shape[1], BK):
                acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
            C[0:BM, 0:BN] = acc

        a = torch.empty(512, 512, dtype=torch.float32, device="meta")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            k.compile(a, a, a, BM=128, BN=256, BK=64, num_warps=8, num_stages=3, arch="sm_90a")
        print([(w.filename.rsplit("/", 1)[-1], w.lineno) for w in caught if "a pipeline of 3" in str(w.message)])
    '''))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "TILEJIT_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "userscript"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[('userscript.py', 14)]"  # the compile line
