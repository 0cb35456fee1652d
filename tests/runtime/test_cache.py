"""The on-disk kernel cache: atomic entries, recovery from damage, one compile across processes."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

import tilejit
from tilejit.cache import CacheLockTimeout, KernelCache, kernel_cache, make_key
from tilejit.cache.layout import CacheLayout

REPO = Path(__file__).resolve().parents[2]
KEY = make_key({"kernel": "add", "arch": "sm_90"})


def fake_compile(marker: Path | None = None, cubin: bytes = b"\x7fELF-cubin", delay: float = 0.0):
    """A stand-in for the compiler: returns (files, meta) and appends one line to ``marker`` per call."""
    def compile_fn():
        if marker is not None:
            with open(marker, "a") as f:
                f.write(f"{os.getpid()}\n")
        time.sleep(delay)
        files = {"kernel.cubin": cubin, "kernel.cu": "__global__ void add() {}\n",
                 "kernel.ptx": ".version 8.0\n", "kernel.ir": "func add() {}\n"}
        meta = {"kernel": "add", "signature": "*fp32, *fp32, i32", "arch": "sm_90", "threads": 128,
                "shared_bytes": 0, "registers": 16, "spills": 0, "versions": {"tilejit": "0.1.0"},
                "binary": "kernel.cubin"}
        return files, meta
    return compile_fn


def compile_count(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


@pytest.fixture
def root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(root))
    monkeypatch.delenv("TILEJIT_ALWAYS_COMPILE", raising=False)
    monkeypatch.delenv("TILEJIT_LOCK_TIMEOUT", raising=False)
    monkeypatch.setattr(kernel_cache, "_warned_unwritable", False)
    return root


def test_make_key_is_canonical_json_sha256():
    assert make_key({"a": 1, "b": [1, 2]}) == make_key({"b": [1, 2], "a": 1})
    assert make_key({"a": 1}) != make_key({"a": 2})
    assert len(make_key({})) == 64 and int(make_key({}), 16) >= 0


def test_layout_names_every_path_under_the_root():
    layout = CacheLayout(Path("/r"))
    assert layout.entry_dir(KEY) == Path("/r") / KEY[:2] / KEY
    assert layout.lock_path(KEY) == Path("/r") / KEY[:2] / f"{KEY}.lock"
    assert layout.autotune_record("matmul", "c0ffee") == Path("/r/autotune/matmul-c0ffee.json")
    assert layout.extents_record("c0ffee") == Path("/r/extents/c0ffee.json")
    assert layout.nvrtc_record == Path("/r/nvrtc.json") and layout.native_dir == Path("/r/native")
    for bad in ("../etc", "AB", "", "a"):
        with pytest.raises(ValueError, match="lowercase hex"):
            layout.entry_dir(bad)
    with pytest.raises(ValueError, match="lowercase hex"):
        layout.extents_record("../x")


def test_only_the_layout_joins_paths_under_the_cache_root():
    """The cache root is reached through a CacheLayout everywhere but where it is decided (private_io) and the
    layout itself, so a path under it has one owner."""
    package = Path(tilejit.__file__).resolve().parent
    reaching = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if "cache_root()" in p.read_text())
    assert reaching == ["cache/layout.py", "private_io.py"]


def test_store_writes_private_json_entry(root):
    entry, origin = KernelCache().get_or_compile(KEY, fake_compile())
    assert origin == "compiled" and entry.path == root / KEY[:2] / KEY
    assert sorted(p.name for p in entry.path.iterdir()) == [
        "kernel.cu", "kernel.cubin", "kernel.ir", "kernel.ptx", "meta.json", "meta.sha256"]
    meta = json.loads((entry.path / "meta.json").read_text())
    assert meta["key"] == KEY and meta["kernel"] == "add" and meta["binary"] == "kernel.cubin"
    assert abs(meta["created"] - time.time()) < 60 and "compile_seconds" in meta
    for directory in (root, root / KEY[:2], entry.path):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert not (root / KEY[:2] / f"{KEY}.lock").exists()
    assert [p.name for p in (root / KEY[:2]).iterdir()] == [KEY]  # no temp dir left


def test_second_lookup_in_a_process_does_not_touch_disk(root):
    cache = KernelCache()
    first, _ = cache.get_or_compile(KEY, fake_compile())
    shutil.rmtree(first.path)
    again, origin = cache.get_or_compile(KEY, fake_compile())
    assert again is first and origin == "memory"


def test_entry_reads_other_files_lazily(root):
    KernelCache().get_or_compile(KEY, fake_compile())
    entry = KernelCache().load(KEY)
    assert set(entry.files) == {"kernel.cubin"}
    assert entry.read_text("kernel.cu") == "__global__ void add() {}\n"
    assert entry.binary == b"\x7fELF-cubin"


def test_bad_keys_and_file_names_are_rejected(root):
    with pytest.raises(ValueError):
        KernelCache().load("../etc")
    with pytest.raises(ValueError):
        KernelCache().store(KEY, {"x.bin": b""}, {})  # no kernel.cubin
    with pytest.raises(ValueError):
        KernelCache().store(KEY, {"kernel.cubin": b"", "meta.json": "{}"}, {})


_CHILD = """
import sys
from tilejit.cache import KernelCache
sys.path[:0] = {tests!r}
from test_cache import fake_compile
entry, origin = KernelCache().get_or_compile({key!r}, fake_compile(cubin=b"from-child"))
print(origin, entry.binary.decode())
"""


def test_hit_across_processes(root):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    code = _CHILD.format(tests=[str(REPO / "tests" / "runtime"), str(REPO / "tests")], key=KEY)
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert [r.stdout.split() for r in runs] == [["compiled", "from-child"], ["disk", "from-child"]]
    assert KernelCache().get_or_compile(KEY, fake_compile(cubin=b"parent"))[0].binary == b"from-child"


def _rank(root: str, key: str, marker: str, barrier, results) -> None:
    barrier.wait()
    entry, origin = KernelCache(Path(root)).get_or_compile(key, fake_compile(Path(marker), delay=0.5))
    results.put((origin, entry.binary, entry.read_text("kernel.cu")))


def test_eight_processes_compile_once(root, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    marker = tmp_path / "compiles.txt"
    barrier, results = ctx.Barrier(8), ctx.Queue()
    ranks = [ctx.Process(target=_rank, args=(str(root), KEY, str(marker), barrier, results)) for _ in range(8)]
    for p in ranks:
        p.start()
    got = [results.get(timeout=180) for _ in ranks]
    for p in ranks:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert compile_count(marker) == 1
    assert sorted(origin for origin, _, _ in got) == ["compiled"] + ["disk"] * 7
    assert all(binary == b"\x7fELF-cubin" and cu.startswith("__global__") for _, binary, cu in got)


def _truncate_cubin(path: Path) -> None:
    (path / "kernel.cubin").write_bytes(b"\x7fE")


def _wrong_checksum(path: Path) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["sha256"] = "0" * 64
    (path / "meta.json").write_text(json.dumps(meta))


def _missing_meta(path: Path) -> None:
    (path / "meta.json").unlink()


def _garbage_meta(path: Path) -> None:
    (path / "meta.json").write_text('{"key": ')


def _missing_cubin(path: Path) -> None:
    (path / "kernel.cubin").unlink()


def _temp_dir_left_behind(path: Path) -> None:
    # A writer killed before its rename: a temp dir with some files and no meta.json, no final entry.
    shutil.rmtree(path)
    tmp = path.with_name(f"{path.name}.tmp-99999-deadbeef")
    tmp.mkdir()
    (tmp / "kernel.cubin").write_bytes(b"\x7fE")


@pytest.mark.parametrize("damage", [_truncate_cubin, _wrong_checksum, _missing_meta, _garbage_meta,
                                    _missing_cubin, _temp_dir_left_behind])
def test_damaged_entry_is_recompiled_and_replaced(root, tmp_path, damage):
    marker = tmp_path / "compiles.txt"
    path = KernelCache().get_or_compile(KEY, fake_compile(marker))[0].path
    damage(path)
    assert KernelCache().load(KEY) is None
    entry, origin = KernelCache().get_or_compile(KEY, fake_compile(marker, cubin=b"rebuilt"))
    assert origin == "compiled" and compile_count(marker) == 2 and entry.binary == b"rebuilt"
    reloaded = KernelCache().load(KEY)
    assert reloaded is not None and reloaded.binary == b"rebuilt"
    assert reloaded.read_text("kernel.cu").startswith("__global__")


def _unwritable_root(kind: str, tmp_path: Path) -> Path:
    if kind == "read_only_dir":
        root = tmp_path / "ro"
        root.mkdir(mode=0o500)
        root.chmod(0o500)
        try:
            (root / "probe").mkdir()
        except PermissionError:
            return root
        pytest.skip("running as a user that chmod 0500 does not stop (root); covered by under_a_file")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a regular file, so nothing can be created under it")
    return blocker / "cache"


@pytest.mark.parametrize("kind", ["read_only_dir", "under_a_file"])
def test_unwritable_cache_dir_degrades_to_memory_with_one_warning(root, tmp_path, monkeypatch, kind):
    unwritable = _unwritable_root(kind, tmp_path)
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(unwritable))
    marker = tmp_path / "compiles.txt"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = KernelCache(), KernelCache()
        a, compiled_a = first.get_or_compile(KEY, fake_compile(marker))
        again, compiled_again = first.get_or_compile(KEY, fake_compile(marker))
        other_key = make_key({"other": 1})
        b, compiled_b = second.get_or_compile(other_key, fake_compile(marker))
        second.store(make_key({"third": 1}), {"kernel.cubin": b"x"}, {})
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and str(unwritable) in str(runtime[0].message)
    assert (compiled_a, compiled_again, compiled_b) == ("compiled", "memory", "compiled") and again is a
    assert a.path is None and b.path is None and a.binary == b"\x7fELF-cubin"
    assert a.read_text("kernel.cu").startswith("__global__") and compile_count(marker) == 2


def _compile_forever(root: str, key: str, started: str) -> None:
    def compile_fn():
        Path(started).write_text(str(os.getpid()))
        time.sleep(600)
        raise AssertionError("should have been killed")
    KernelCache(Path(root)).get_or_compile(key, compile_fn)


def test_process_killed_during_compile_leaves_a_stale_lock_that_is_recovered(root, tmp_path, monkeypatch):
    # Long enough that only the dead-pid check (not the lock's age) can explain a quick recovery.
    monkeypatch.setenv("TILEJIT_LOCK_TIMEOUT", "30")
    started = tmp_path / "started"
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_compile_forever, args=(str(root), KEY, str(started)))
    child.start()
    deadline = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < deadline and child.is_alive(), "child never started compiling"
        time.sleep(0.05)
    child.kill()
    child.join()
    lock = root / KEY[:2] / f"{KEY}.lock"
    assert lock.exists() and json.loads(lock.read_text())["pid"] == child.pid
    assert KernelCache().load(KEY) is None
    began = time.monotonic()
    entry, origin = KernelCache().get_or_compile(KEY, fake_compile())
    assert origin == "compiled" and entry.binary == b"\x7fELF-cubin" and time.monotonic() - began < 10
    assert not lock.exists() and KernelCache().load(KEY) is not None


def _write_lock(root: Path, **holder) -> Path:
    lock = root / KEY[:2] / f"{KEY}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps(holder))
    return lock


def test_lock_of_a_live_local_process_times_out_with_a_clear_error(root, monkeypatch, tmp_path):
    monkeypatch.setenv("TILEJIT_LOCK_TIMEOUT", "0.3")
    lock = _write_lock(root, pid=os.getpid(), host=socket.gethostname(), time=time.time(), token="x")
    marker = tmp_path / "compiles.txt"
    with pytest.raises(CacheLockTimeout, match=f"pid {os.getpid()}") as raised:
        KernelCache().get_or_compile(KEY, fake_compile(marker))
    assert str(lock) in str(raised.value) and compile_count(marker) == 0 and lock.exists()


def test_lock_from_another_host_older_than_timeout_is_broken(root, monkeypatch):
    monkeypatch.setenv("TILEJIT_LOCK_TIMEOUT", "5")
    lock = _write_lock(root, pid=1, host="some-other-node", time=time.time() - 60, token="x")
    entry, origin = KernelCache().get_or_compile(KEY, fake_compile())
    assert origin == "compiled" and not lock.exists()


def test_lock_left_empty_by_a_killed_creator_is_broken(root):
    lock = _write_lock(root)
    lock.write_text("")
    os.utime(lock, (time.time() - 60, time.time() - 60))
    assert KernelCache().get_or_compile(KEY, fake_compile())[1] == "compiled"


def test_waiter_loads_the_entry_the_lock_holder_stores(root, tmp_path):
    lock = _write_lock(root, pid=os.getpid(), host=socket.gethostname(), time=time.time(), token="x")
    marker = tmp_path / "compiles.txt"

    def holder():
        time.sleep(0.3)
        files, meta = fake_compile(cubin=b"holder")()
        KernelCache().store(KEY, files, meta)
        lock.unlink()

    thread = threading.Thread(target=holder)
    thread.start()
    entry, origin = KernelCache().get_or_compile(KEY, fake_compile(marker))
    thread.join()
    assert origin == "disk" and entry.binary == b"holder" and compile_count(marker) == 0


def test_always_compile_bypasses_reads_and_replaces_the_entry(root, monkeypatch, tmp_path):
    marker = tmp_path / "compiles.txt"
    KernelCache().get_or_compile(KEY, fake_compile(marker, cubin=b"old"))
    monkeypatch.setenv("TILEJIT_ALWAYS_COMPILE", "1")
    entry, origin = KernelCache().get_or_compile(KEY, fake_compile(marker, cubin=b"new"))
    assert origin == "compiled" and compile_count(marker) == 2 and entry.binary == b"new"
    monkeypatch.delenv("TILEJIT_ALWAYS_COMPILE")
    assert KernelCache().load(KEY).binary == b"new"


def test_store_keeps_an_intact_entry_another_process_wrote_first(root):
    files, meta = fake_compile(cubin=b"first")()
    KernelCache().store(KEY, files, meta)
    files, meta = fake_compile(cubin=b"second")()
    assert KernelCache().store(KEY, files, meta).binary == b"first"
    assert KernelCache().store(KEY, files, meta, replace=True).binary == b"second"
    assert KernelCache().load(KEY).binary == b"second"
    assert len(list((root / KEY[:2]).iterdir())) == 1  # no temp or trash dirs left


def write_meta(entry_path: Path, meta: dict) -> None:
    """Rewrite an entry's meta.json as the cache would (with its digest in meta.sha256): a deliberate edit."""
    data = json.dumps(meta).encode()
    (entry_path / "meta.json").write_bytes(data)
    (entry_path / "meta.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def _age(entry_path: Path, seconds: float) -> None:
    meta = json.loads((entry_path / "meta.json").read_text())
    meta["created"] = time.time() - seconds
    write_meta(entry_path, meta)


def _autotune_record(root: Path, name: str, age_s: float) -> Path:
    """A record named as the autotuner names them (``<kernel>-<source hash>.json``): the only names the cache
    lists and removes."""
    path = root / "autotune" / f"{name}-{hashlib.sha256(name.encode()).hexdigest()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kernel": name, "key": [128, 128], "config": {"BLOCK": 64},
                                "timings_ms": [0.5, 0.25], "created": time.time() - age_s}))
    return path


def test_prune_removes_only_old_entries_and_records(root):
    cache = KernelCache()
    old_key, new_key = make_key({"old": 1}), make_key({"new": 1})
    _age(cache.get_or_compile(old_key, fake_compile())[0].path, 40 * 86400)
    cache.get_or_compile(new_key, fake_compile())
    old_record, new_record = _autotune_record(root, "old", 40 * 86400), _autotune_record(root, "new", 60)
    assert cache.prune(30 * 86400) == 2
    assert [e.key for e in KernelCache().entries()] == [new_key]
    assert not old_record.exists() and new_record.exists()


def test_clear_removes_entries_records_and_leftovers(root):
    cache = KernelCache()
    for n in range(3):
        cache.get_or_compile(make_key({"n": n}), fake_compile())
    _autotune_record(root, "matmul", 0)
    leftover = root / KEY[:2] / f"{KEY}.tmp-99999-0000"
    leftover.mkdir(parents=True)
    assert [r["kernel"] for r in cache.autotune_records()] == ["matmul"]
    assert cache.clear() == 4
    assert KernelCache().entries() == [] and cache.autotune_records() == [] and not leftover.exists()
    assert cache.load(make_key({"n": 0})) is None  # the memory layer is cleared too
