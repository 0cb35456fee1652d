"""The cache's fault table, one test (or parametrized family) per row: inject the fault, assert the clean outcome.

Rows: damaged entries; meta.json intact but wrong; planted entries; a bad cache root; lock files; concurrency
and killed writers; nvrtc.json and FIFOs; the CLI; tampered autotune records; the launcher library; a library
swapped while it loads. (The random contract cases are tests/runtime/test_contract_fuzz.py.)
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tilejit import cli, compiler, private_io
from tilejit.cache import entries as cache_entries, kernel_cache, locks as cache_locks
from tilejit.cache import CacheError, CacheLockTimeout, KernelCache, make_key
from tilejit.runtime import native

from test_cache import KEY, compile_count, fake_compile, write_meta

OTHER_UID = 54321


@pytest.fixture
def root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(root))
    monkeypatch.delenv("TILEJIT_ALWAYS_COMPILE", raising=False)
    monkeypatch.delenv("TILEJIT_LOCK_TIMEOUT", raising=False)
    monkeypatch.setattr(kernel_cache, "_warned_unwritable", False)
    monkeypatch.setattr(private_io, "_fallback_roots", {})
    return root


def kernel_compile(marker: Path | None = None, cubin: bytes = b"\x7fELF-cubin"):
    """fake_compile plus the fields compiler.check_meta asks for (what a real compile stores)."""
    base = fake_compile(marker, cubin)

    def compile_fn():
        files, meta = base()
        meta.update(kernel_symbol="add_kernel", param_kinds=["ptr", "i64", "i64", "i32"], tensor_maps=[],
                    value_layout={"X": [0, 1]})
        return files, meta
    return compile_fn


def stored(marker: Path, validate=compiler.check_meta) -> Path:
    entry, compiled = KernelCache().get_or_compile(KEY, kernel_compile(marker), validate)
    assert compiled == "compiled"
    return entry.path


def rebuilt_once_more(marker: Path, validate=compiler.check_meta) -> bool:
    """The damaged entry is missed (and discarded), compiled again, and the new one is read back intact."""
    assert KernelCache().load(KEY, validate) is None
    before = compile_count(marker)
    entry, compiled = KernelCache().get_or_compile(KEY, kernel_compile(marker, b"\x7fELF-rebuilt"), validate)
    again = KernelCache().load(KEY, validate)
    return (compiled == "compiled" and compile_count(marker) == before + 1 and entry.binary == b"\x7fELF-rebuilt"
            and again is not None and again.binary == b"\x7fELF-rebuilt")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def with_timeout(fn, seconds: float = 20.0):
    """fn() on a thread; fails the test (instead of hanging the suite) if it does not return in time."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as error:  # noqa: BLE001 - re-raised below
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"hung for {seconds}s"
    if "error" in result:
        raise result["error"]
    return result.get("value")


# ---- row 1: damaged entry ----------------------------------------------------------------------------------

def _flip_byte(path: Path) -> None:
    data = bytearray((path / "kernel.cubin").read_bytes())
    data[3] ^= 0x40
    (path / "kernel.cubin").write_bytes(bytes(data))


DAMAGE = {
    "cubin truncated": lambda p: (p / "kernel.cubin").write_bytes(b"\x7fE"),
    "cubin flipped": _flip_byte,
    "cubin empty": lambda p: (p / "kernel.cubin").write_bytes(b""),
    "cubin missing": lambda p: (p / "kernel.cubin").unlink(),
    "meta missing": lambda p: (p / "meta.json").unlink(),
    "meta garbage": lambda p: (p / "meta.json").write_text('{"key": '),
    "meta empty": lambda p: (p / "meta.json").write_bytes(b""),
    "meta digit flipped": lambda p: (p / "meta.json").write_text(
        (p / "meta.json").read_text().replace('"threads": 128', '"threads": 129')),
    "meta digest missing": lambda p: (p / "meta.sha256").unlink(),
    "cubin a directory": lambda p: ((p / "kernel.cubin").unlink(), (p / "kernel.cubin").mkdir()),
    # The files asm reads besides the cubin: damaged, the entry is too (not a hit whose asm["cuda"] fails).
    "cuda source truncated": lambda p: (p / "kernel.cu").write_bytes((p / "kernel.cu").read_bytes()[:5]),
    "cuda source garbage": lambda p: (p / "kernel.cu").write_bytes(b"\x00garbage"),
    "cuda source missing": lambda p: (p / "kernel.cu").unlink(),
    "ptx empty": lambda p: (p / "kernel.ptx").write_bytes(b""),
    "ir a directory": lambda p: ((p / "kernel.ir").unlink(), (p / "kernel.ir").mkdir()),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_row1_a_damaged_entry_is_discarded_and_rebuilt(root, tmp_path, damage):
    marker = tmp_path / "compiles"
    DAMAGE[damage](stored(marker))
    assert rebuilt_once_more(marker)


def test_row1_a_file_damaged_after_the_entry_loaded_is_a_cache_error_naming_it(root, tmp_path):
    path = stored(tmp_path / "compiles")
    entry = KernelCache().load(KEY, compiler.check_meta)
    (path / "kernel.cu").write_bytes(b"\x00garbage")  # checked at load, changed since
    asm = compiler.CompiledKernel(entry, "disk").asm
    with pytest.raises(CacheError, match=r"kernel\.cu changed on disk after the entry was loaded"):
        asm["cuda"]
    assert asm["cubin"] == b"\x7fELF-cubin"  # the rest of the entry still reads
    (path / "kernel.ptx").unlink()  # a file the entry lacks is "not available", as for PTX never kept
    assert "ptx" not in asm and asm.get("ptx") is None


# ---- row 2: meta.json intact (its digest rewritten to match) but wrong -------------------------------------

def _edit(field, value=None, delete=False):
    def edit(meta):
        if delete:
            del meta[field]
        else:
            meta[field] = value
    return edit


WRONG_META = {
    "kernel_symbol missing": _edit("kernel_symbol", delete=True),
    "threads a string": _edit("threads", "128"),
    "shared_bytes negative": _edit("shared_bytes", -1),
    "param_kinds not a list": _edit("param_kinds", "ptr,i64"),
    "value_layout mistyped": _edit("value_layout", {"X": "0,1"}),
    "binary escapes": _edit("binary", "../../../x"),
    "binary absolute": _edit("binary", "/etc/passwd"),
    "binary not a string": _edit("binary", 7),
    "created NaN": _edit("created", float("nan")),
    "created a string": _edit("created", "yesterday"),
    "files missing": _edit("files", delete=True),
    "key of another entry": _edit("key", make_key({"another": 1})),
    "not an object": None,
}


@pytest.mark.parametrize("wrong", list(WRONG_META))
def test_row2_meta_that_parses_but_is_wrong_is_discarded_and_rebuilt(root, tmp_path, wrong):
    marker = tmp_path / "compiles"
    path = stored(marker)
    outside = tmp_path / "x"
    outside.write_bytes(b"\x7fELF-outside")
    meta = json.loads((path / "meta.json").read_text())
    if WRONG_META[wrong] is None:
        meta = [meta]
    else:
        WRONG_META[wrong](meta)
    write_meta(path, meta)
    assert rebuilt_once_more(marker)


def test_row2_reordered_param_kinds_without_a_new_digest_are_caught(root, tmp_path):
    marker = tmp_path / "compiles"
    path = stored(marker)
    text = (path / "meta.json").read_text()
    meta = json.loads(text)
    meta["param_kinds"] = list(reversed(meta["param_kinds"]))
    (path / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")  # meta.sha256 untouched
    assert rebuilt_once_more(marker)


# ---- row 3: planted entries -----------------------------------------------------------------------------------

def test_row3_an_entry_planted_as_a_symlink_is_not_followed(root, tmp_path):
    marker = tmp_path / "compiles"
    path = stored(marker)
    planted = tmp_path / "planted"
    shutil.copytree(path, planted)
    (planted / "kernel.cubin").write_bytes(b"\x7fELF-foreign")
    shutil.rmtree(path)
    path.symlink_to(planted)
    assert rebuilt_once_more(marker)
    assert (planted / "kernel.cubin").read_bytes() == b"\x7fELF-foreign"  # not followed, not deleted


def test_row3_an_entry_planted_through_a_world_writable_root_is_refused(root, tmp_path, monkeypatch):
    marker = tmp_path / "compiles"
    stored(marker)  # the "planted" entry: written into the root, which is then opened to the world
    os.chmod(root, 0o777)
    with pytest.warns(RuntimeWarning, match="refusing the cache directory") as caught:
        cache = KernelCache()
    assert len([w for w in caught if "refusing" in str(w.message)]) == 1
    assert cache.root != root and stat.S_IMODE(os.stat(cache.root).st_mode) == 0o700
    assert cache.load(KEY) is None  # the planted entry is not read
    entry, compiled = cache.get_or_compile(KEY, kernel_compile(marker))
    assert compiled == "compiled" and entry.path.is_relative_to(cache.root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert KernelCache().root == cache.root  # the same private directory, not warned again


def test_row3_files_of_another_user_in_an_entry_are_not_read(root, tmp_path):
    marker = tmp_path / "compiles"
    path = stored(marker)
    os.chown(path / "kernel.cubin", OTHER_UID, OTHER_UID) if os.getuid() == 0 else os.chmod(
        path / "kernel.cubin", 0o666)
    assert rebuilt_once_more(marker)


# ---- row 4: the cache root -------------------------------------------------------------------------------------

def _root_file(root, tmp_path):
    root.parent.mkdir(parents=True, exist_ok=True)
    root.write_text("a file")
    return "degrade"


def _root_symlink(root, tmp_path):
    real = tmp_path / "real-cache"
    real.mkdir(mode=0o700)
    root.symlink_to(real)
    return "works"


def _root_read_only(root, tmp_path):
    root.mkdir(mode=0o500)
    return "works" if os.getuid() == 0 else "degrade"  # root writes through mode 0500


def _root_other_owner(root, tmp_path):
    root.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(root, OTHER_UID, OTHER_UID)
    else:
        pytest.skip("chown to another user needs root")
    return "refuse"


def _root_group_writable(root, tmp_path):
    root.mkdir()
    os.chmod(root, 0o770)
    return "refuse"


def _root_mode_000(root, tmp_path):
    root.mkdir(mode=0o700)
    os.chmod(root, 0)
    return "works" if os.getuid() == 0 else "degrade"


def _root_disk_full(root, tmp_path, monkeypatch=None):
    return "full"


def _root_under_a_file(root, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    return ("degrade", blocker / "cache")


ROOTS = {"a file": _root_file, "a symlink": _root_symlink, "read-only": _root_read_only,
         "another owner": _root_other_owner, "group-writable": _root_group_writable, "mode 000": _root_mode_000,
         "disk full": _root_disk_full, "under a file": _root_under_a_file}


@pytest.mark.parametrize("kind", list(ROOTS))
def test_row4_a_bad_cache_root_never_stops_a_kernel(root, tmp_path, monkeypatch, kind):
    expect = ROOTS[kind](root, tmp_path)
    if isinstance(expect, tuple):
        expect, where = expect
        monkeypatch.setenv("TILEJIT_CACHE_DIR", str(where))
    if expect == "full":
        def no_space(path, data):
            raise OSError(28, "No space left on device", str(path))
        monkeypatch.setattr(cache_entries, "_write_new", no_space)
        expect = "degrade"
    marker = tmp_path / "compiles"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = KernelCache()
        entry, compiled = cache.get_or_compile(KEY, kernel_compile(marker))
        again, compiled_again = KernelCache().get_or_compile(KEY, kernel_compile(marker))
        KernelCache().entries(), KernelCache().autotune_records(), KernelCache().read_extents(KEY)
        KernelCache().write_extents(KEY, "add", {"X": {0}})
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert compiled == "compiled" and entry.binary == b"\x7fELF-cubin"
    if expect == "works":
        assert messages == [] and entry.path is not None and compiled_again == "disk"
    elif expect == "degrade":
        assert len(messages) == 1 and "cannot write the kernel cache" in messages[0] and entry.path is None
    else:
        assert len(messages) == 1 and "refusing the cache directory" in messages[0]
        assert entry.path is not None and not entry.path.is_relative_to(root) and compiled_again == "disk"
    os.chmod(root, 0o700) if root.is_dir() and not root.is_symlink() else None


# ---- row 5: lock files -----------------------------------------------------------------------------------------

def _lock(root: Path, content: str, age_s: float = 60.0) -> Path:
    lock = root / KEY[:2] / f"{KEY}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(root, 0o700)
    lock.write_text(content)
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


LOCKS = {
    "dead pid": lambda: json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "time": time.time(),
                                    "token": "x"}),
    "empty": lambda: "",
    "not json": lambda: "pid=12 host=x",
    "a list": lambda: "[1, 2, 3]",
    "pid a string": lambda: json.dumps({"pid": "12", "host": socket.gethostname(), "time": time.time()}),
    "time a string": lambda: json.dumps({"pid": 1, "host": "elsewhere", "time": "noon"}),
    "time NaN": lambda: '{"pid": 1, "host": "elsewhere", "time": NaN}',
    "pid a float, host a number": lambda: json.dumps({"pid": 1.5, "host": 7, "time": None}),
    "pid negative": lambda: json.dumps({"pid": -1, "host": socket.gethostname(), "time": time.time()}),
}


@pytest.mark.parametrize("kind", list(LOCKS))
def test_row5_a_stale_or_malformed_lock_is_broken_without_errors(root, tmp_path, kind):
    lock = _lock(root, LOCKS[kind]())
    entry, compiled = with_timeout(lambda: KernelCache().get_or_compile(KEY, kernel_compile(tmp_path / "m")))
    assert compiled == "compiled" and entry.path is not None and not lock.exists()


def test_row5_a_live_holder_is_named_within_seconds_then_a_clear_timeout(root, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_LOCK_TIMEOUT", "1.5")
    monkeypatch.setattr(cache_locks, "_LOCK_REPORT_AFTER_S", 0.3)
    lock = _lock(root, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time() - 42,
                                   "token": "x"}), age_s=0)
    began = time.monotonic()
    with pytest.warns(RuntimeWarning, match=rf"waiting for pid {os.getpid()} on {socket.gethostname()}, "
                                            r"holding it for 4\ds") as caught:
        with pytest.raises(CacheLockTimeout, match=f"pid {os.getpid()}"):
            KernelCache().get_or_compile(KEY, kernel_compile(tmp_path / "m"))
    assert len([w for w in caught if "waiting for" in str(w.message)]) == 1
    assert time.monotonic() - began < 10 and lock.exists()


# ---- row 6: concurrency and killed writers (8 processes x compile-once and kill -9 are in test_cache.py) -------

def test_row6_temp_dirs_left_by_killed_writers_are_swept(root, tmp_path):
    marker = tmp_path / "compiles"
    path = stored(marker)
    shard = path.parent
    old = [shard / f"{KEY}.tmp-1-deadbeef", shard / f"{KEY}.trash-1-feedface", shard / "ab.tmp-x"]
    for leftover in old:
        leftover.mkdir()
        (leftover / "kernel.cubin").write_bytes(b"half")
        os.utime(leftover, (1, 1))
    recent = shard / f"{KEY}.tmp-2-cafecafe"
    recent.mkdir()
    KernelCache().store(make_key({"next": 1}) if shard.name == make_key({"next": 1})[:2] else KEY,
                        *kernel_compile()(), replace=True)
    assert not any(p.exists() for p in old) and recent.exists()


def test_row6_temp_names_are_not_predictable(root, tmp_path, monkeypatch):
    seen = []
    real = cache_entries.tempfile.mkdtemp

    def spy(*args, **kwargs):
        made = real(*args, **kwargs)
        seen.append(made)
        return made
    monkeypatch.setattr(cache_entries.tempfile, "mkdtemp", spy)
    stored(tmp_path / "m")
    assert len(seen) == 1 and f".tmp-{os.getpid()}" not in seen[0]


# ---- row 7: nvrtc.json and FIFOs -----------------------------------------------------------------------------

def test_row7_garbage_nvrtc_record_is_ignored(root):
    from tilejit.backend_cuda import nvrtc

    root.mkdir(mode=0o700)
    for garbage in (b"", b"{", b"[]", b'{"version": "12.8"}', b'{"version": [12], "library": 3, "probe": {}}'):
        (root / "nvrtc.json").write_bytes(garbage)
        assert nvrtc._recorded_version() is None


def test_row7_a_record_naming_an_old_nvrtc_does_not_refuse_compiles(root, monkeypatch):
    from tilejit.backend_cuda import nvrtc

    if not nvrtc.nvrtc_supports("sm_90a"):
        pytest.skip("this NVRTC cannot target sm_90a")
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (11, 0))  # what a stale or planted record would say
    nvrtc.check_arch_supported_by_nvrtc("sm_90a")  # asks the library itself before refusing


def test_row7_nvrtc_record_is_written_without_a_predictable_temp_name(root, monkeypatch):
    from tilejit.backend_cuda import nvrtc

    root.mkdir(mode=0o700)
    bait = root / f"nvrtc.json.tmp-{os.getpid()}"
    victim = root.parent / "victim"
    victim.write_text("keep")
    bait.symlink_to(victim)
    monkeypatch.setattr(nvrtc, "_loaded_library_path", lambda: sys.executable)
    nvrtc._record_version((12, 9))
    assert victim.read_text() == "keep" and json.loads((root / "nvrtc.json").read_text())["version"] == [12, 9]


@pytest.mark.parametrize("where", ["meta.json", "meta.sha256", "kernel.cubin", "nvrtc.json", "extents", "lock"])
def test_row7_a_fifo_never_hangs_a_reader(root, tmp_path, where):
    from tilejit.backend_cuda import nvrtc

    marker = tmp_path / "compiles"
    path = stored(marker)
    if where == "nvrtc.json":
        os.mkfifo(root / "nvrtc.json")
        assert with_timeout(nvrtc._recorded_version) is None
    elif where == "extents":
        (root / "extents").mkdir(mode=0o700)
        os.mkfifo(root / "extents" / f"{KEY}.json")
        assert with_timeout(lambda: KernelCache().read_extents(KEY)) == {}
    elif where == "lock":
        shutil.rmtree(path)
        lock = path.with_name(KEY + ".lock")
        os.mkfifo(lock)
        os.utime(lock, (1, 1))
        assert with_timeout(lambda: KernelCache().get_or_compile(KEY, kernel_compile(marker)))[1] == "compiled"
    else:
        (path / where).unlink()
        os.mkfifo(path / where)
        assert with_timeout(lambda: rebuilt_once_more(marker))


# ---- row 8: the CLI ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["..", "../..", "/etc", "ab/../..", "", "g" * 10, "a" * 200, "-1"])
def test_row8_show_with_odd_keys_gives_one_clean_line(root, tmp_path, key):
    stored(tmp_path / "m")
    rc, out, err = run_cli("cache", "show", "--", key)
    assert rc != 0 and "Traceback" not in err and out == ""


@pytest.mark.parametrize("damage", ["flipped", "symlink", "fifo", "not utf-8"])
def test_row8_show_of_a_damaged_file_is_one_clean_line(root, tmp_path, damage):
    path = stored(tmp_path / "m")
    cu = path / "kernel.cu"
    if damage == "flipped":
        cu.write_text("__global__ void evil() {}\n")
    elif damage == "symlink":
        (tmp_path / "elsewhere.cu").write_text("secret")
        cu.unlink()
        cu.symlink_to(tmp_path / "elsewhere.cu")
    elif damage == "fifo":
        cu.unlink()
        os.mkfifo(cu)
    else:
        meta = json.loads((path / "meta.json").read_text())
        cu.write_bytes(b"\xff\xfe")
        meta["files"]["kernel.cu"] = hashlib.sha256(b"\xff\xfe").hexdigest()
        write_meta(path, meta)
    rc, out, err = with_timeout(lambda: run_cli("cache", "show", KEY[:12], "--cuda"))
    assert rc == 1 and err.startswith("tilejit: ") and "Traceback" not in err and "secret" not in out


@pytest.mark.parametrize("created", [float("nan"), float("inf"), -float("inf"), 1e300, -1e300, True])
def test_row8_show_and_list_with_odd_created(root, tmp_path, created):
    path = stored(tmp_path / "m")
    meta = json.loads((path / "meta.json").read_text())
    meta["created"] = created
    write_meta(path, meta)
    for argv in (["cache", "show", KEY[:12]], ["cache", "list"], ["cache", "list", "--json"],
                 ["cache", "prune", "--older-than", "1d"]):
        rc, out, err = run_cli(*argv)
        assert "Traceback" not in err and (rc == 0 or err.startswith("tilejit: ")), (argv, rc, err)


@pytest.mark.parametrize("link", ["extents", "autotune", "shard", "entry", "leftover"])
@pytest.mark.parametrize("command", [["cache", "clear", "--yes"], ["cache", "prune", "--older-than", "0s"]])
def test_row8_clear_and_prune_never_follow_a_symlink_out_of_the_cache(root, tmp_path, link, command):
    stored(tmp_path / "m")
    project = tmp_path / "proj"
    project.mkdir()
    for name in ("a.json", "main.py", "ab.tmp-1"):
        (project / name).write_text("precious")
    (project / "ff").mkdir()
    (project / "ff" / ("f" * 64)).mkdir()
    os.utime(project / "main.py", (1, 1))
    where = {"extents": root / "extents", "autotune": root / "autotune", "shard": root / "ff",
             "entry": root / KEY[:2] / ("0" * 64), "leftover": root / KEY[:2] / f"{KEY}.tmp-1-x"}[link]
    if where.exists():
        shutil.rmtree(where)
    where.symlink_to(project)
    rc, out, err = run_cli(*command)
    assert rc == 0 and "Traceback" not in err
    assert sorted(p.name for p in project.iterdir()) == ["a.json", "ab.tmp-1", "ff", "main.py"]
    assert all((project / n).read_text() == "precious" for n in ("a.json", "main.py", "ab.tmp-1"))
    assert (project / "ff" / ("f" * 64)).is_dir()


# ---- row 9: tampered autotune records ------------------------------------------------------------------------

TAMPERED = {
    "timings a string": {"timings_ms": "fast"},
    "timing a string": {"timings_ms": {"BM=32": "1"}},
    "timing NaN": {"timings_ms": {"ID32": float("nan")}},
    "timing negative": {"timings_ms": {"ID32": -1.0}},
    "timing zero": {"timings_ms": {"ID32": 0}},
    "timing a bool": {"timings_ms": {"ID32": True}},
    "reason not a string": {"timings_ms": {"ID64": 1.0}, "failures": {"ID32": 7}},
    "failures a list": {"failures": ["ID32"]},
    "known-failing config timed": {"timings_ms": {"ID32": 0.001, "ID64": 1.0}, "failures": {"ID32": "boom"}},
    "record a list": [1, 2],
}


@pytest.mark.parametrize("kind", list(TAMPERED) + ["file a FIFO", "file a symlink", "dir a symlink"])
def test_row9_a_tampered_autotune_record_is_discarded_with_a_warning(root, tmp_path, kind):
    import test_autotune as at

    kernel = at.FakeKernel(fail_launch=lambda meta: "boom" if meta.get("BM") == 32 else None)
    configs = at.configs_for(32, 64)
    path = at.record_file(root, kernel)
    path.parent.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    tuner, bench = at.make_tuner(kernel, configs, at.TIMES)
    if kind == "file a FIFO":
        os.mkfifo(path)
    elif kind in ("file a symlink", "dir a symlink"):
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / path.name).write_text("{}")
        if kind == "file a symlink":
            path.symlink_to(elsewhere / path.name)
        else:
            shutil.rmtree(path.parent)
            path.parent.symlink_to(elsewhere)
    else:
        import torch

        half = torch.zeros(4, dtype=torch.float16)
        key = tuner._key_string({"A": half, "B": half, "M": 1024})  # what at.launch(tuner) tunes for
        text = json.dumps({key: TAMPERED[kind]})
        path.write_text(text.replace("ID32", configs[0].identity).replace("ID64", configs[1].identity))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with_timeout(lambda: at.launch(tuner))
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("autotune record" in m for m in messages), messages
    assert tuner.best_config.kwargs["BM"] == 64 and 64 in bench.timed  # tuned again, the failing one not chosen


# ---- row 10: the launcher library ----------------------------------------------------------------------------

@pytest.fixture
def fresh_native(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(private_io, "_fallback_roots", {})
    for name in ("_module", "_failure", "_builder"):
        monkeypatch.setattr(native, name, None)
    try:
        native.compiler()
    except native.NativeBuildError as error:
        pytest.skip(str(error))
    return tmp_path / "cache" / "native"


def _so(directory: Path) -> Path:
    return native.library_path(directory)


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "digest missing", "symlink", "other owner",
                                    "group-writable", "a FIFO"])
def test_row10_a_bad_library_is_never_loaded_and_is_rebuilt(fresh_native, tmp_path, damage):
    native._load_or_build()
    so = _so(fresh_native)
    good = so.read_bytes()
    if damage == "truncated":
        so.write_bytes(good[: len(good) // 3])
    elif damage == "empty":
        so.write_bytes(b"")
    elif damage == "garbage":
        so.write_bytes(b"\x7fELF" + os.urandom(100))
    elif damage == "digest missing":
        (so.parent / (so.name + ".sha256")).unlink()
    elif damage == "symlink":
        elsewhere = tmp_path / "elsewhere.so"
        elsewhere.write_bytes(good)
        so.unlink()
        so.symlink_to(elsewhere)
    elif damage == "other owner":
        if os.getuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(so, OTHER_UID, OTHER_UID)
    elif damage == "group-writable":
        os.chmod(so, 0o770)
    else:
        so.unlink()
        os.mkfifo(so)
    with pytest.raises(native.NativeBuildError):
        with_timeout(lambda: native.load_verified(so))
    module = with_timeout(native._load_or_build)
    assert module.Dispatcher is not None and so.is_file() and not so.is_symlink()
    rebuilt = so.read_bytes()
    assert (so.parent / (so.name + ".sha256")).read_text().split() == [hashlib.sha256(rebuilt).hexdigest(),
                                                                       str(len(rebuilt))]


@pytest.mark.parametrize("cc", ["true", "false", "/nonexistent/cc", "sh -c 'echo junk > \"$0\"'"])
def test_row10_a_compiler_that_makes_nothing_is_a_build_error(fresh_native, monkeypatch, cc):
    monkeypatch.setenv("CC", cc)
    monkeypatch.setattr(native, "compiler", lambda: ["sh", "-c", "echo junk > \"$@\"", "sh"] if cc.startswith("sh")
                        else [cc])
    with pytest.raises(native.NativeBuildError):
        native._load_or_build()
    assert not _so(fresh_native).exists() and not list(fresh_native.glob("*.tmp"))
    with pytest.warns(RuntimeWarning, match="native launcher is unavailable"):
        assert native.load() is None  # launches take the Python path


def test_row10_an_unwritable_native_dir_builds_privately_and_leaves_nothing(fresh_native, monkeypatch, tmp_path):
    fresh_native.parent.mkdir(mode=0o700)
    fresh_native.write_text("not a directory")
    before = set(os.listdir(native_tmp := Path(__import__("tempfile").gettempdir())))
    with pytest.warns(RuntimeWarning, match="is not a directory"):
        module = native._load_or_build()
    assert module.Dispatcher is not None
    leaked = {n for n in set(os.listdir(native_tmp)) - before if n.startswith("tilejit-native")}
    assert not leaked


def test_row10_a_native_dir_of_another_user_is_not_used(fresh_native, monkeypatch):
    fresh_native.mkdir(parents=True, mode=0o700)
    os.chmod(fresh_native, 0o777)
    with pytest.warns(RuntimeWarning, match="not building the launcher in"):
        module = native._load_or_build()
    assert module.Dispatcher is not None and not _so(fresh_native).exists()


def test_row10_mkstemp_failure_is_a_build_error(fresh_native, monkeypatch):
    def no_temp(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(native, "_library_directory", lambda: (fresh_native, False))
    fresh_native.mkdir(parents=True, mode=0o700)
    import tempfile

    monkeypatch.setattr(tempfile, "mkstemp", no_temp)
    with pytest.raises(native.NativeBuildError, match="No space left"):
        native._load_or_build()


def test_row10_an_odd_cache_path_works(tmp_path, monkeypatch):
    odd = tmp_path / "sp ace;$(touch pwned)\nnew'line"
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(odd))
    monkeypatch.setattr(private_io, "_fallback_roots", {})
    assert native._load_or_build().Dispatcher is not None
    assert _so(odd / "native").is_file() and not (tmp_path / "pwned").exists()


# ---- row 11: the library swapped while it loads ------------------------------------------------------------

ATTACKER_C = r'''
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void pwn(void) {
    const char *m = getenv("TILEJIT_TEST_PWNED");
    if (m) { FILE *f = fopen(m, "a"); if (f) { fputs("pwned\n", f); fclose(f); } }
}
'''


def test_row11_a_library_swapped_while_loading_never_runs(fresh_native, tmp_path, monkeypatch):
    native._load_or_build()
    so = _so(fresh_native)
    good = so.read_bytes()
    src = tmp_path / "attacker.c"
    src.write_text(ATTACKER_C)
    attacker = tmp_path / "attacker.so"
    subprocess.run([*native.compiler(), "-shared", "-fPIC", str(src), "-o", str(attacker)], check=True)
    marker = tmp_path / "pwned"
    monkeypatch.setenv("TILEJIT_TEST_PWNED", str(marker))
    bad, swap = attacker.read_bytes(), so.with_name("swap.tmp")
    stop = threading.Event()

    def swapper():  # the attacker owns the directory: swaps the file by rename, back and forth
        i = 0
        while not stop.is_set():
            swap.write_bytes(bad if i % 2 == 0 else good)
            os.replace(swap, so)
            i += 1

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    loaded = refused = 0
    try:
        for _ in range(60):
            try:
                native.load_verified(so)
                loaded += 1
            except (native.NativeBuildError, FileNotFoundError):
                refused += 1
    finally:
        stop.set()
        thread.join()
    assert not marker.exists(), "the attacker's library ran"
    assert loaded + refused == 60
