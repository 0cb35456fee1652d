"""The compiled launcher (tilejit/runtime/_launch.c) on CPU: built from source, signatures, packing, fallbacks.

No GPU is needed: the dispatcher takes the tensor type, the stream getter and the slow path as arguments, so
these tests drive it with stand-in tensors, and ``set_launch_hook`` records what would have gone to
cuLaunchKernel (the packed parameter bytes included) instead of calling the driver. The GPU tests run every
kernel through the same code with real tensors.
"""
from __future__ import annotations

import os
import stat
import struct
import threading
import warnings

import pytest

from tilejit import knobs
from tilejit.runtime.driver import param_struct
from tilejit.runtime import native

CONSTEXPR, RUNTIME, SHAPED = "constexpr", "runtime", "shaped"


def _build_tools_missing() -> str | None:
    """Why this machine cannot build the launcher at all (then tilejit falls back, warned), or None."""
    import sysconfig
    from pathlib import Path

    try:
        native.compiler()
    except native.NativeBuildError as error:
        return str(error)
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").is_file():
        return f"no Python.h in {include}"
    return None


# A machine without a C compiler or Python's headers cannot build the launcher; every other failure is a bug.
_MISSING = _build_tools_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"cannot build the native launcher here: {_MISSING}")


@pytest.fixture(scope="module")
def mod(tmp_path_factory):
    root = tmp_path_factory.mktemp("native-cache")
    old = os.environ.get("TILEJIT_CACHE_DIR")
    os.environ["TILEJIT_CACHE_DIR"] = str(root)
    try:
        module = native._load_or_build()
    finally:
        if old is None:
            del os.environ["TILEJIT_CACHE_DIR"]
        else:
            os.environ["TILEJIT_CACHE_DIR"] = old
    return module


class DType:
    def __init__(self, name: str) -> None:
        self.name = name


F16, F32 = DType("f16"), DType("f32")


class FakeTensor:
    """What the launcher reads of a torch tensor: dtype, shape, stride(), data_ptr(), get_device(), requires_grad."""

    def __init__(self, shape, strides=None, ptr=0x7f0000000000, dtype=F16, device=0, requires_grad=False) -> None:
        self.shape = tuple(shape)
        self.requires_grad = requires_grad
        if strides is None:
            strides, acc = [], 1
            for n in reversed(self.shape):
                strides.insert(0, acc)
                acc *= n
        self._strides = tuple(strides)
        self._ptr = ptr
        self.dtype = dtype
        self._device = device

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return self._device


class Recorder:
    """Stands in for the slow path, the Python fallback, the grid resolver and the driver."""

    def __init__(self, mod, kinds, tmaps=None) -> None:
        self.mod = mod
        self.kinds = kinds
        self.tmaps = tmaps
        self.slow_calls, self.fallback_calls, self.python_launches, self.launches, self.grid_calls = [], [], [], [], []
        self.entry = None

    def slow(self, grid, args, kwargs):
        self.slow_calls.append((grid, args, kwargs))
        self.entry = self.mod.Entry(0xABCD, (128, 1, 1), 4096, bytes(native.KIND_CODES[k] for k in self.kinds), 0,
                                    self.tmaps, self.python_launch)
        return self.entry

    def fallback(self, grid, args, kwargs):
        self.fallback_calls.append((grid, args, kwargs))

    def python_launch(self, grid, stream, values):
        self.python_launches.append((grid, stream, values))

    def grid_fn(self, grid, args, kwargs):
        self.grid_calls.append(grid)
        return grid(kwargs) if callable(grid) else None  # as Kernel._fast_grid

    def hook(self, function, grid, block, smem, stream, params, offsets):
        self.launches.append({"function": function, "grid": grid, "block": block, "smem": smem, "stream": stream,
                              "params": params, "offsets": offsets})


@pytest.fixture
def make(mod):
    made = []

    def make(kinds, roles=(RUNTIME,) * 6, fast_kwargs=("BLOCK", "num_warps"), names="XYZWnm", defaults=None,
             tmaps=None):
        rec = Recorder(mod, kinds, tmaps)
        roles = list(roles)
        names = tuple(names)[:len(roles)]
        d = mod.Dispatcher(roles=roles, role_constexpr=CONSTEXPR, role_shaped=SHAPED, fast_kwargs=set(fast_kwargs),
                           tensor_type=FakeTensor, stream_getter=lambda device: 0x5000 + device, slow=rec.slow,
                           fallback=rec.fallback, grid_fn=rec.grid_fn, names=names,
                           runtime_index={n: i for i, n in enumerate(names) if roles[i] != CONSTEXPR},
                           defaults=defaults or {})
        rec.roles = roles
        mod.set_launch_hook(rec.hook)
        made.append(rec)
        return d, rec

    yield make
    mod.set_launch_hook(None)


# The kernel of benchmarks/launch.py: four 1-d tensors and two ints (plus a constexpr keyword).
TINY_KINDS = ["ptr", "i64", "i64"] * 4 + ["i32", "i64"]


def tiny_args(ptr=0x7f0000001000):
    return tuple(FakeTensor((33,), ptr=ptr + 256 * i) for i in range(4)) + (7, 32)


def expected_bytes(kinds, values):
    packer, _ = param_struct(kinds)
    return packer.pack(*values)


def test_the_library_is_cached_private_and_rebuilt_when_others_can_write_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    path = native.library_path(tmp_path / "cache" / "native")
    native._load_or_build()
    assert path.is_file()
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    first = path.stat().st_mtime_ns
    native._load_or_build()
    assert path.stat().st_mtime_ns == first  # loaded, not rebuilt
    os.chmod(path, 0o777)  # someone else could have written it: never load it, build again
    native._load_or_build()
    assert not path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_an_unbuildable_launcher_warns_once_and_falls_back(tmp_path, monkeypatch):
    broken = tmp_path / "_launch.c"
    broken.write_text("this is not C;\n")
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failure", None)
    with pytest.warns(RuntimeWarning, match="native launcher is unavailable") as caught:
        assert native.load() is None
        assert native.load() is None
    assert len(caught) == 1
    assert "exited with" in native.failure()
    assert not list((tmp_path / "cache" / "native").glob("*.tmp"))  # no half-written library left behind


def test_the_first_launch_starts_a_background_build_and_does_not_wait_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failure", None)
    monkeypatch.setattr(native, "_builder", None)
    started = threading.Event()
    real_build = native.build

    def slow_build(path):
        started.set()
        real_build(path)

    monkeypatch.setattr(native, "build", slow_build)
    assert native.load_async() is None  # not ready yet: the caller launches through Python meanwhile
    assert started.wait(60)
    native._builder.join(120)
    assert native.ready() is not None and native.load_async() is native.ready()
    assert native.library_path(tmp_path / "cache" / "native").is_file()


def test_stale_temporaries_of_killed_builds_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    directory = tmp_path / "cache" / "native"
    directory.mkdir(parents=True, mode=0o700)
    old, recent = directory / "launch-x.so.abc.tmp", directory / "launch-x.so.def.tmp"
    old.write_bytes(b"half")
    recent.write_bytes(b"in progress")
    os.utime(old, (1, 1))
    native._load_or_build()
    assert not old.exists() and recent.exists()


def test_timing_the_driver_needs_a_remembered_entry(mod, make):
    d, rec = make(TINY_KINDS)
    with pytest.raises(ValueError, match="launch the kernel with these arguments first"):
        mod.time_driver_launches(d, 10, 0, tiny_args())


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("TILEJIT_NATIVE_LAUNCH", "0")
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failure", None)
    assert not knobs.native_launch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load() is None


def test_a_miss_goes_to_the_slow_path_then_hits_pack_what_the_python_launcher_packs(make):
    d, rec = make(TINY_KINDS)
    args = tiny_args()
    d.bind((5,))(*args, BLOCK=32, num_warps=1)
    assert len(rec.slow_calls) == 1 and not rec.launches
    assert rec.slow_calls[0] == ((5,), args, {"BLOCK": 32, "num_warps": 1})
    d.bind((5, 2))(*args, BLOCK=32, num_warps=1)
    d.bind((5, 2, 3))(*args, BLOCK=32, num_warps=1)
    assert len(rec.slow_calls) == 1 and len(rec.launches) == 2
    launch = rec.launches[1]
    assert launch["function"] == 0xABCD and launch["block"] == (128, 1, 1) and launch["smem"] == 4096
    assert launch["grid"] == (5, 2, 3) and rec.launches[0]["grid"] == (5, 2, 1)
    assert launch["stream"] == 0x5000
    values = []
    for t in args[:4]:
        values += [t.data_ptr(), *t.shape, *t.stride()]
    values += [7, 32]
    assert launch["params"] == expected_bytes(TINY_KINDS, values)
    assert launch["offsets"] == list(param_struct(TINY_KINDS)[1])
    assert d.stats() == {"hits": 2, "misses": 1, "fallbacks": 0, "entries": 1}


def test_a_tensor_that_requires_grad_signs_apart(make):
    """The slow path refuses an output that requires grad (and remembers no call writing one), so a remembered
    call must not let such a tensor through in place of one that does not."""
    d, rec = make(TINY_KINDS)
    args = tiny_args()
    d.bind((5,))(*args, BLOCK=32, num_warps=1)
    d.bind((5,))(*args, BLOCK=32, num_warps=1)
    assert len(rec.slow_calls) == 1 and len(rec.launches) == 1
    graded = (*args[:3], FakeTensor(args[3].shape, ptr=args[3].data_ptr(), requires_grad=True), *args[4:])
    d.bind((5,))(*graded, BLOCK=32, num_warps=1)
    assert len(rec.slow_calls) == 2 and len(rec.launches) == 1


def test_a_call_the_slow_path_hands_no_entry_for_is_never_remembered(mod, make):
    """The slow path returns None for a call writing an output with a stride-0 dimension: it comes back there."""
    _, rec = make(TINY_KINDS)
    calls = []
    names = tuple("XYZWnm")
    d = mod.Dispatcher(roles=[RUNTIME] * 6, role_constexpr=CONSTEXPR, role_shaped=SHAPED,
                       fast_kwargs={"BLOCK", "num_warps"}, tensor_type=FakeTensor, stream_getter=lambda device: 0,
                       slow=lambda grid, args, kwargs: calls.append(grid), fallback=rec.fallback, grid_fn=rec.grid_fn,
                       names=names, runtime_index={n: i for i, n in enumerate(names)}, defaults={})
    args = (FakeTensor((33,), strides=(0,)),) + tiny_args()[1:]
    d.bind((5,))(*args, BLOCK=32, num_warps=1)
    d.bind((5,))(*args, BLOCK=32, num_warps=1)
    assert calls == [(5,), (5,)] and not rec.launches


def test_every_parameter_kind_is_packed_at_its_offset(make):
    kinds = ["ptr", "i64", "i64", "i64", "i64", "i32", "f32", "i64", "i32"]
    d, rec = make(kinds, roles=(RUNTIME, RUNTIME, RUNTIME, RUNTIME, RUNTIME))
    t = FakeTensor((3, 5), strides=(1, 3), ptr=0x10000)
    args = (t, -3, 2.5, 1 << 40, True)
    d.bind((1,))(*args)
    d.bind((1,))(*args)
    values = [0x10000, 3, 5, 1, 3, -3, 2.5, 1 << 40, 1]
    assert rec.launches[0]["params"] == expected_bytes(kinds, values)


def test_signature_changes_with_what_the_key_depends_on(make):
    d, rec = make(TINY_KINDS)

    def sig(*args, **kwargs):
        return d.signature(*args, **kwargs)

    base = tiny_args()
    x, y, z, w, n, m = base
    same = [
        (FakeTensor((33,), ptr=x.data_ptr() + 4096), y, z, w, n, m),  # another address, same alignment
        (FakeTensor((99,), ptr=x.data_ptr()), y, z, w, n, m),  # another extent of an unshaped tensor
        (x, y, z, w, 9, m),  # another int of the same class (not 1, not a multiple of 16)
        (x, y, z, w, n, 48),
    ]
    for args in same:
        assert sig(*args) == sig(*base)
    different = [
        (FakeTensor((33,), ptr=x.data_ptr() + 8), y, z, w, n, m),  # 16-byte alignment lost
        (FakeTensor((33,), ptr=x.data_ptr(), dtype=F32), y, z, w, n, m),
        (FakeTensor((33,), strides=(2,), ptr=x.data_ptr()), y, z, w, n, m),
        (FakeTensor((33, 1), ptr=x.data_ptr()), y, z, w, n, m),  # rank
        (x, y, z, w, 1, m),  # == 1
        (x, y, z, w, n, 33),  # no longer a multiple of 16
        (x, y, z, w, n, 2.0),  # a float
        (x, y, z, w, True, m),  # a bool is not an int
        tuple(FakeTensor((33,), ptr=t.data_ptr(), device=1) for t in base[:4]) + (n, m),
    ]
    signatures = [sig(*args) for args in different]
    assert all(s is not None for s in signatures)
    assert len({sig(*base), *signatures}) == len(different) + 1
    assert sig(*base, BLOCK=32) != sig(*base, BLOCK=64)
    assert sig(*base, BLOCK=32) != sig(*base, BLOCK="32")
    assert sig(*base, BLOCK=32, num_warps=4) != sig(*base, num_warps=4, BLOCK=32)  # keyword order, as in Python
    assert sig(*base, BLOCK=1.0) != sig(*base, BLOCK=1)
    assert sig(*base, BLOCK=True) != sig(*base, BLOCK=1)


def test_an_empty_tensor_is_signed_apart_from_a_full_one(make):
    """The key records emptiness (an empty tensor gets no tensor map): so does the C signature."""
    d, rec = make(TINY_KINDS)
    base = tiny_args()
    x = base[0]
    empty = FakeTensor((0,), ptr=x.data_ptr())
    assert d.signature(empty, *base[1:]) is not None
    assert d.signature(empty, *base[1:]) != d.signature(*base)


def test_shaped_tensors_put_their_extents_in_the_signature_as_the_role_list_changes(make):
    d, rec = make(TINY_KINDS)
    a = tiny_args()
    b = (FakeTensor((64,), ptr=a[0].data_ptr()),) + a[1:]
    assert d.signature(*a) == d.signature(*b)
    rec.roles[0] = SHAPED  # the kernel learned that A's extent is a compile-time constant: same list object
    assert d.signature(*a) != d.signature(*b)


def test_constexpr_arguments_are_signed_by_value_and_unknown_objects_by_identity(make):
    d, rec = make(["ptr", "i64", "i64"], roles=(RUNTIME, CONSTEXPR))
    t = FakeTensor((8,))
    assert d.signature(t, "relu") == d.signature(t, "".join(["re", "lu"]))  # equal strings, distinct objects
    assert d.signature(t, "relu") != d.signature(t, "gelu")
    assert d.signature(t, None) != d.signature(t, 0)
    assert d.signature(t, 1) != d.signature(t, True)
    marker = object()
    assert d.signature(t, marker) == d.signature(t, marker)
    assert d.signature(t, marker) != d.signature(t, object())
    d.bind((1,))(t, marker)
    d.bind((1,))(t, marker)
    assert len(rec.slow_calls) == 1 and len(rec.launches) == 1
    # The table keeps the object alive, so its address cannot come back as another object's.
    del marker
    d.bind((1,))(t, object())
    assert len(rec.slow_calls) == 2


@pytest.mark.parametrize("call", [
    "unknown keyword", "list argument", "too few", "too many", "cpu tensor", "mixed devices", "no tensor",
    "huge int",
])
def test_calls_the_signature_cannot_describe_take_the_python_fallback(make, call):
    d, rec = make(TINY_KINDS)
    x, y, z, w, n, m = tiny_args()
    args, kwargs = {
        "unknown keyword": ((x, y, z, w, n, m), {"BLOK": 32}),
        "list argument": ((x, y, z, w, [1], m), {}),
        "too few": ((x, y, z), {}),
        "too many": ((x, y, z, w, n, m, 1), {}),
        "cpu tensor": ((FakeTensor((4,), device=-1), y, z, w, n, m), {}),
        "mixed devices": ((x, FakeTensor((33,), device=1), z, w, n, m), {}),
        "no tensor": ((1, 2, 3, 4, n, m), {}),
        "huge int": ((x, y, z, w, 1 << 70, m), {}),
    }[call]
    d.bind((1,))(*args, **kwargs)
    assert rec.fallback_calls == [((1,), args, kwargs)]
    assert not rec.slow_calls and not rec.launches
    assert d.stats()["fallbacks"] == 1


def test_run_time_parameters_by_keyword_or_default_are_signed_in_their_place(make):
    d, rec = make(TINY_KINDS, defaults={"m": 0})
    x, y, z, w, n, m = tiny_args()
    positional = d.signature(x, y, z, w, n, 0)
    assert d.signature(x, y, z, w, n) == d.signature(x, y, z, w, n, m=0)  # default or keyword: same words
    assert d.signature(x, y, z, W=w, n=n)[1:] == positional[1:]  # only the positional count differs
    assert d.signature(x, y, z, w, n, m=17) != d.signature(x, y, z, w, n, m=16)
    d.bind((1,))(x, y, z, W=w, n=n, BLOCK=32)
    d.bind((1,))(x, y, z, W=w, n=n, BLOCK=32)
    values = []
    for t in (x, y, z, w):
        values += [t.data_ptr(), *t.shape, *t.stride()]
    assert rec.launches[0]["params"] == expected_bytes(TINY_KINDS, values + [n, 0])
    for args, kwargs in [((x, y, z), {"n": n}),  # W missing: Python says so
                         ((x, y, z, w, n), {"n": n})]:  # n twice
        d.bind((1,))(*args, **kwargs)
    assert len(rec.fallback_calls) == 2 and len(rec.launches) == 1


def test_grids_that_are_not_plain_tuples(make):
    d, rec = make(TINY_KINDS)
    args = tiny_args()
    d.bind((4,))(*args)
    d.bind(lambda meta: (3, 2))(*args)
    assert rec.launches[-1]["grid"] == (3, 2, 1) and len(rec.grid_calls) == 1
    for bad in [(0,), (-1, 2), (1, 2, 3, 4), (2.0,), [2]]:
        d.bind(bad)(*args)
    assert len(rec.slow_calls) == 1 + 5  # Python names what is wrong with each
    assert len(rec.launches) == 1


def test_errors_from_python_callbacks_propagate(make):
    d, rec = make(TINY_KINDS)
    args = tiny_args()

    def failing_slow(grid, args, kwargs):
        raise ValueError("from the slow path")

    d2 = type(d)(roles=[RUNTIME] * 6, role_constexpr=CONSTEXPR, role_shaped=SHAPED, fast_kwargs=set(),
                 tensor_type=FakeTensor, stream_getter=lambda i: 0, slow=failing_slow, fallback=rec.fallback,
                 grid_fn=rec.grid_fn, names=tuple("XYZWnm"), runtime_index={n: i for i, n in enumerate("XYZWnm")},
                 defaults={})
    with pytest.raises(ValueError, match="from the slow path"):
        d2.bind((1,))(*args)
    d.bind((1,))(*args)

    def bad_grid(meta):
        raise KeyError("BM")

    with pytest.raises(KeyError, match="BM"):
        d.bind(bad_grid)(*args)


def test_an_int_that_does_not_fit_its_32_bit_parameter_goes_to_the_python_launcher(make):
    d, rec = make(TINY_KINDS)
    x, y, z, w, n, m = tiny_args()
    d.bind((1,))(x, y, z, w, n, m)
    d.bind((1,))(x, y, z, w, (1 << 31) + 5, m)  # same signature class (neither 1 nor a multiple of 16)
    assert len(rec.launches) == 0 and len(rec.python_launches) == 1
    grid, stream, values = rec.python_launches[0]
    assert grid == (1, 1, 1) and stream == 0x5000 and values[-2] == (1 << 31) + 5


def test_tensor_maps_are_asked_for_and_copied_after_the_values(make):
    seen = []

    def tmaps(values):
        seen.append(list(values))
        return [bytes([i]) * 128 for i in (1, 2)]

    kinds = ["ptr", "i64", "i64", "i64", "i64", "tmap", "tmap"]
    d, rec = make(kinds, roles=(RUNTIME,), tmaps=tmaps)
    t = FakeTensor((16, 64), ptr=0x20000)
    d.bind((1,))(t)
    d.bind((1,))(t)
    values = [0x20000, 16, 64, 64, 1]
    assert seen == [values]
    params = rec.launches[0]["params"]
    assert params == expected_bytes(kinds, values + [b"\x01" * 128, b"\x02" * 128])


def test_split_k_entries_launch_z_times_the_cluster_and_leave_the_limit_to_python(make):
    d, rec = make(TINY_KINDS)
    kinds = bytes(native.KIND_CODES[k] for k in TINY_KINDS)
    rec.slow = lambda grid, args, kwargs: rec.mod.Entry(0xABCD, (128, 1, 1), 0, kinds, 0, None, rec.python_launch, 4)
    d = rec.mod.Dispatcher(roles=list(rec.roles), role_constexpr=CONSTEXPR, role_shaped=SHAPED,
                           fast_kwargs={"BLOCK", "num_warps"}, tensor_type=FakeTensor, stream_getter=lambda i: 0,
                           slow=rec.slow, fallback=rec.fallback, grid_fn=rec.grid_fn, names=tuple("XYZWnm"),
                           runtime_index={n: i for i, n in enumerate("XYZWnm")}, defaults={})
    args = tiny_args()
    d.bind((3,))(*args)  # the miss: remembered
    d.bind((3, 2, 5))(*args)
    assert rec.launches[-1]["grid"] == (3, 2, 20)
    d.bind((1, 1, 20000))(*args)  # 80000 programs along z: the Python launcher raises CUDA's limit
    assert rec.python_launches[-1][0] == (1, 1, 20000) and len(rec.launches) == 1


def test_python_only_entries_hand_every_launch_to_their_launcher(make):
    """A stream-K kernel's Entry: remembered like any other, but each launch goes to its Python launcher with the
    packed values (which adds the grid and the stream's workspace), never to the driver."""
    d, rec = make(TINY_KINDS)
    kinds = bytes(native.KIND_CODES[k] for k in TINY_KINDS)
    rec.slow = lambda grid, args, kwargs: rec.mod.Entry(0xABCD, (128, 1, 1), 0, kinds, 0, None, rec.python_launch,
                                                        1, 1, True)
    d = rec.mod.Dispatcher(roles=list(rec.roles), role_constexpr=CONSTEXPR, role_shaped=SHAPED,
                           fast_kwargs={"BLOCK", "num_warps"}, tensor_type=FakeTensor, stream_getter=lambda i: 0x77,
                           slow=rec.slow, fallback=rec.fallback, grid_fn=rec.grid_fn, names=tuple("XYZWnm"),
                           runtime_index={n: i for i, n in enumerate("XYZWnm")}, defaults={})
    args = tiny_args()
    d.bind((3,))(*args)  # the miss: remembered (the slow path launches it itself)
    d.bind((3, 2))(*args)
    d.bind((5,))(*args)
    assert not rec.launches and not rec.fallback_calls
    assert [(g, s) for g, s, _ in rec.python_launches] == [((3, 2, 1), 0x77), ((5, 1, 1), 0x77)]
    assert rec.python_launches[0][2] == [0x7f0000001000, 33, 1, 0x7f0000001100, 33, 1, 0x7f0000001200, 33, 1,
                                         0x7f0000001300, 33, 1, 7, 32]


def test_entry_rejects_bad_plans(mod):
    with pytest.raises(ValueError, match="unknown parameter kind"):
        mod.Entry(1, (1, 1, 1), 0, bytes([9]), 0, None, print)
    with pytest.raises(ValueError, match="must come last"):
        mod.Entry(1, (1, 1, 1), 0, bytes([4, 0]), 0, lambda v: [], print)
    with pytest.raises(ValueError, match="needs a tmaps callable"):
        mod.Entry(1, (1, 1, 1), 0, bytes([0, 4]), 0, None, print)
    with pytest.raises(ValueError, match="too many"):
        mod.Entry(1, (1, 1, 1), 0, bytes([4] * 40), 0, lambda v: [], print)
    with pytest.raises(ValueError, match="zscale must be 1 to 16"):
        mod.Entry(1, (1, 1, 1), 0, bytes([0]), 0, None, print, 0)


def test_many_threads_launch_through_one_dispatcher(make):
    d, rec = make(TINY_KINDS)
    args = tiny_args()
    d.bind((1,))(*args)
    errors = []

    def worker():
        try:
            for _ in range(200):
                d.bind((2,))(*args)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(rec.launches) == 800 and len(rec.slow_calls) == 1
    assert all(launch["params"] == rec.launches[0]["params"] for launch in rec.launches)


def test_param_struct_matches_the_c_layout(make):
    """The Python launcher and _launch.c agree on where each parameter sits (tmaps 64-byte aligned)."""
    kinds = ["i32", "ptr", "f32", "tmap"]
    _, offsets = param_struct(kinds)
    assert offsets == (0, 8, 16, 64)
    assert struct.calcsize(param_struct(kinds)[0].format) == 192


def test_a_tensor_list_takes_the_python_fallback(make):
    """A list or tuple argument (a tensor list) is not signed here: the Python path signs it and finds its device
    table (runtime/tensor_lists.py), every time."""
    d, rec = make(TINY_KINDS)
    base = tiny_args()
    for listed in (([base[0], FakeTensor((5,))],) + base[1:], ((base[0],),) + base[1:]):
        assert d.signature(*listed) is None
        d.bind((1,))(*listed)
    assert len(rec.fallback_calls) == 2 and not rec.slow_calls and not rec.launches
    assert d.stats()["fallbacks"] == 2
