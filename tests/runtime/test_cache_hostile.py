"""The cache against a second, hostile user and a careless one: a cache root others can aim (symlinks and
directories on its way), JSON nested 30,000 deep in every file tilejit parses, lock files that lie, cache files
the CLI must not follow or block on, and one bad shard.

Runs as root (CI) and as an ordinary user: "another user" is a chown to OTHER_UID as root, else a stat that
says so (``owned_by_another``).
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
import tarfile
import time
import warnings
from pathlib import Path

import pytest

from tilejit import private_io
from tilejit.cache import CacheLockTimeout, KernelCache, make_key
from tilejit.errors import InternalError, TilejitError

from test_cache import KEY, write_meta
from test_cache_faults import OTHER_UID, kernel_compile, root, run_cli, stored, with_timeout  # noqa: F401

DEEP = "[" * 30000 + "]" * 30000
REPO = Path(__file__).resolve().parents[2]


def owned_by_another(path: Path, monkeypatch) -> None:
    """Make ``path`` (a link is not followed) belong to another user: for real as root, else as the cache's
    ``lstat`` sees it."""
    if os.getuid() == 0:
        os.lchown(path, OTHER_UID, OTHER_UID)
        return
    real_lstat, target = os.lstat, os.path.abspath(path)

    def lstat(p, *args, **kwargs):
        st = real_lstat(p, *args, **kwargs)
        if os.path.abspath(os.fspath(p)) != target:
            return st
        fields = list(st)
        fields[stat.ST_UID] = OTHER_UID
        return os.stat_result(fields)
    monkeypatch.setattr(os, "lstat", lstat)


def refusals(caught) -> list[str]:
    return [str(w.message) for w in caught if "refusing the cache directory" in str(w.message)]


def planted_files(directory: Path) -> dict[str, bytes]:
    """Files a user keeps in ``directory``, some under names the cache also uses (autotune/, extents/, a shard)."""
    files = {"autotune/notes.json": b'{"mine": 1}', "extents/data.csv": b"1,2,3\n", "notes.txt": b"keep",
             f"{KEY[:2]}/todo.txt": b"keep", f"{KEY[:2]}/{KEY[:2]}-draft/x.txt": b"keep", "ab.tmp-1": b"keep",
             "extents/readme.json": b"{}", "nvrtc.txt": b"keep"}
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return files


def assert_untouched(directory: Path, files: dict[str, bytes]) -> None:
    assert {name: (directory / name).read_bytes() for name in files} == files


# ---- the root and the links on its way ------------------------------------------------------------------------

def test_a_symlinked_root_of_the_user_is_used_and_the_cli_sees_what_the_compiler_writes(root, tmp_path):
    real = tmp_path / "real-cache"
    real.mkdir(mode=0o700)
    root.symlink_to(real)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = stored(tmp_path / "m")
    assert path == real / KEY[:2] / KEY and KernelCache().root == real
    rc, out, err = run_cli("cache", "list", "--json")
    listed = json.loads(out)
    assert rc == 0 and listed["root"] == str(real) and [e["key"] for e in listed["entries"]] == [KEY]
    rc, out, _ = run_cli("cache", "path")
    assert out.strip() == str(real)
    rc, out, _ = run_cli("cache", "clear", "--yes")
    assert rc == 0 and out.startswith("removed 1 entry") and not path.exists() and root.is_symlink()
    stored(tmp_path / "m")
    rc, out, _ = run_cli("cache", "prune", "--older-than", "0s")
    assert rc == 0 and out.startswith("removed 1 entry") and not path.exists()


@pytest.mark.parametrize("where", ["the root link", "a link on the way", "a directory on the way"])
def test_a_root_another_user_could_aim_is_refused_and_the_target_untouched(root, tmp_path, monkeypatch, where):
    victim = tmp_path / "victim-docs"
    victim.mkdir(mode=0o700)
    files = planted_files(victim)
    if where == "the root link":  # /tmp/shared/tjcache -> ~/docs, made by another user
        root.symlink_to(victim)
        bad = root
    elif where == "a link on the way":
        (tmp_path / "via").symlink_to(tmp_path)
        monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "via" / "victim-docs"))
        bad = tmp_path / "via"
    else:
        shared = tmp_path / "shared"
        shared.mkdir()
        (shared / "tjcache").symlink_to(victim)
        monkeypatch.setenv("TILEJIT_CACHE_DIR", str(shared / "tjcache"))
        bad = shared
    owned_by_another(bad, monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = KernelCache()
        entry, compiled = cache.get_or_compile(KEY, kernel_compile(tmp_path / "m"))
        rc, out, err = run_cli("cache", "clear", "--yes")
    messages = refusals(caught)
    assert len(messages) == 1 and str(bad) in messages[0] and f"uid {OTHER_UID}" in messages[0], messages
    assert compiled == "compiled" and not entry.path.is_relative_to(victim)
    configured = os.environ["TILEJIT_CACHE_DIR"]
    assert rc == 1 and err.startswith(f"tilejit: not clearing the cache directory {configured}: ")
    assert f"fix the owner or mode of {bad}" in err and "removed nothing" in err
    assert_untouched(victim, files)
    assert sorted(p.name for p in victim.iterdir()) == sorted({n.split("/")[0] for n in files})


def test_a_directory_others_can_write_on_the_way_is_refused_unless_sticky(root, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(shared / "tjcache"))
    with pytest.warns(RuntimeWarning, match=rf"{shared}, on its way, is a directory writable by others and not "
                                            r"sticky \(mode 777\)"):
        assert KernelCache().root != shared / "tjcache"
    private_io._fallback_roots.clear()
    os.chmod(shared, 0o1777)  # like /tmp: only an entry's owner may replace it, and tjcache is checked in turn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stored(tmp_path / "m").is_relative_to(shared / "tjcache")


def test_a_root_others_can_write_is_named_with_its_mode(root, tmp_path):
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.warns(RuntimeWarning, match=rf"refusing the cache directory {root}: it is writable by others "
                                            r"\(mode 777\)"):
        KernelCache()


@pytest.mark.parametrize("command, doing", [(["clear", "--yes"], "clearing"),
                                            (["prune", "--older-than", "0s"], "pruning")])
def test_clear_and_prune_of_a_refused_root_say_so_and_remove_nothing(root, tmp_path, command, doing):
    path = stored(tmp_path / "m")  # an entry of the root, which is then opened to the world
    os.chmod(root, 0o777)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one line of its own, not the refusal's warning
        rc, out, err = run_cli("cache", *command)
    assert rc == 1 and out == "" and len(err.splitlines()) == 1, (rc, out, err)
    assert err.startswith(f"tilejit: not {doing} the cache directory {root}: it is writable by others (mode 777)")
    assert "removed nothing" in err and f"fix the owner or mode of {root}" in err
    assert (path / "kernel.cubin").exists()
    os.chmod(root, 0o700)  # fixed as the message says: now it is cleaned
    private_io._fallback_roots.clear()
    rc, out, err = run_cli("cache", *command)
    assert rc == 0 and out.startswith("removed 1 entry") and not path.exists(), (rc, out, err)


def test_clear_and_prune_remove_only_what_tilejit_names_under_a_root_with_other_files(root, tmp_path):
    root.mkdir(mode=0o700)
    files = planted_files(root)
    stored(tmp_path / "m")
    KernelCache().write_extents(KEY, "add", {"X": {0}})
    for command in (["cache", "prune", "--older-than", "0s"], ["cache", "clear", "--yes"]):
        rc, out, err = run_cli(*command)
        assert rc == 0 and "Traceback" not in err
    assert KernelCache().entries() == [] and not (root / "extents" / f"{KEY}.json").exists()
    assert_untouched(root, files)


@pytest.mark.parametrize("command, doing, outcome", [
    (["path"], "printing", "printed nothing"), (["list"], "listing", "listed nothing"),
    (["list", "--json"], "listing", "listed nothing"), (["show", KEY[:12]], "reading", "showed nothing"),
    (["export", "OUT"], "exporting", "wrote no OUT"), (["import", "OUT"], "importing into", "imported nothing")])
def test_path_list_show_export_and_import_of_a_refused_root_act_on_nothing(root, tmp_path, command, doing,
                                                                           outcome):
    """A refused root's stand-in lasts one process: printing, listing or exporting it would show an empty cache
    where the user's entries are, and importing into it would keep nothing."""
    stored(tmp_path / "m")
    os.chmod(root, 0o777)
    tar = tmp_path / "bundle.tar"
    if command[0] == "import":
        tar.write_bytes(b"")
    command = [str(tar) if part == "OUT" else part for part in command]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc, out, err = run_cli("cache", *command)
    assert rc == 1 and out == "" and len(err.splitlines()) == 1, (rc, out, err)
    assert err.startswith(f"tilejit: not {doing} the cache directory {root}: it is writable by others (mode 777)")
    assert outcome.replace("OUT", str(tar)) in err and f"fix the owner or mode of {root}" in err
    assert command[0] == "import" or not tar.exists()
    rc, out, err = run_cli("cache", "stats")
    assert rc == 0 and f"the cache directory {root} is refused: it is writable by others" in out, (out, err)


@pytest.mark.parametrize("command, doing", [(["path"], "printing"), (["list"], "listing"),
                                            (["clear", "--yes"], "clearing"), (["prune", "--older-than", "0s"],
                                                                               "pruning")])
def test_cache_commands_on_a_root_that_is_a_file_say_so(root, command, doing):
    root.write_text("not a cache")
    rc, out, err = run_cli("cache", *command)
    assert rc == 1 and out == "", (rc, out, err)
    assert err.startswith(f"tilejit: not {doing} the cache directory {root}: it is not a directory")
    assert root.read_text() == "not a cache"
    rc, out, err = run_cli("cache", "stats")
    assert rc == 0 and f"the cache directory {root} is not a directory" in out, (out, err)


def test_a_refused_root_leaves_no_private_directory_behind(tmp_path):
    refused = tmp_path / "refused"
    refused.mkdir()
    os.chmod(refused, 0o777)
    temp = tmp_path / "tmp"
    temp.mkdir()
    code = ("import warnings; warnings.simplefilter('ignore'); from tilejit.cache import KernelCache; "
            "c = KernelCache(); c.store('ab' * 32, {'kernel.cubin': b'x'}, {}); "
            "assert (c.root / 'ab').is_dir(); print(c.root)")
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(temp), TILEJIT_CACHE_DIR=str(refused))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == temp and list(temp.iterdir()) == []


# ---- JSON nested 30,000 deep ---------------------------------------------------------------------------------

def _deep_meta(path: Path) -> None:
    (path / "meta.json").write_text(DEEP)
    (path / "meta.sha256").write_text(hashlib.sha256(DEEP.encode()).hexdigest() + "\n")


@pytest.mark.parametrize("where", ["meta.json", "lock", "extents", "nvrtc.json"])
def test_deep_json_in_a_cache_file_reads_as_absent(root, tmp_path, where):
    from tilejit.backend_cuda import nvrtc

    marker = tmp_path / "m"
    path = stored(marker)
    if where == "meta.json":
        _deep_meta(path)
    elif where == "lock":
        shutil.rmtree(path)  # no entry: the next compile must take the lock
        lock = path.with_name(f"{KEY}.lock")
        lock.write_text("[" * 2000 + "]" * 2000)  # deep, and within a lock file's 4 KiB
        os.utime(lock, (1, 1))
    elif where == "extents":
        (root / "extents").mkdir(mode=0o700)
        (root / "extents" / f"{KEY}.json").write_text(DEEP)
        assert KernelCache().read_extents(KEY) == {}
    else:
        (root / "nvrtc.json").write_text(DEEP)
        assert nvrtc._recorded_version() is None
    if where in ("meta.json", "lock"):
        entry, compiled = KernelCache().get_or_compile(KEY, kernel_compile(marker))
        assert compiled == "compiled" and entry.binary == b"\x7fELF-cubin"
    for argv in (["cache", "list"], ["cache", "list", "--json"], ["cache", "show", KEY[:12]],
                 ["cache", "prune", "--older-than", "30d"], ["cache", "clear", "--yes"]):
        rc, out, err = run_cli(*argv)
        assert "Traceback" not in err and (rc == 0 or err.startswith("tilejit: ")), (argv, rc, err)


def test_deep_json_everywhere_a_real_compile_still_works(root, tmp_path, monkeypatch):
    """NVRTC compiles on CPU: compile, bury every JSON file the cache keeps under 30,000 brackets, compile the
    same kernel from a fresh Kernel object (disk, then recompiled), then the CLI."""
    from test_cache_kernels import compile_scale

    from tilejit.backend_cuda import nvrtc
    from tilejit.cache import kernel_cache

    first = compile_scale()
    for record in [root / "nvrtc.json", *(root / "extents").glob("*.json")]:
        record.write_text(DEEP)
    _deep_meta(first.entry.path)
    assert nvrtc._recorded_version() is None
    monkeypatch.setattr(kernel_cache, "_default_cache", None)  # a fresh process's cache: nothing in memory
    again = compile_scale()
    assert again.entry.binary[:4] == b"\x7fELF" and again.entry.key == first.entry.key
    assert json.loads((first.entry.path / "meta.json").read_text())["key"] == first.entry.key  # rebuilt
    for argv in (["cache", "list"], ["cache", "clear", "--yes"]):
        rc, out, err = run_cli(*argv)
        assert rc == 0 and "Traceback" not in err


def test_deep_json_in_an_autotune_record_is_ignored_with_a_warning_and_tuned_again(root, tmp_path):
    import test_autotune as at

    kernel = at.FakeKernel()
    path = at.record_file(root, kernel)
    path.parent.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    path.write_text(DEEP)
    tuner, bench = at.make_tuner(kernel, at.configs_for(32, 64), at.TIMES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        at.launch(tuner)
    assert any("autotune record" in str(w.message) for w in caught) and bench.timed
    rc, out, err = run_cli("cache", "list")
    assert rc == 0 and "Traceback" not in err


def test_deep_json_in_a_bundle_member_is_refused(root, tmp_path):
    from tilejit.cache import bundle

    tar_path = tmp_path / "b.tar"
    with tarfile.open(tar_path, "w") as tar:
        for name in (f"autotune/matmul-{'e' * 64}.json", f"extents/{KEY}.json", f"entries/{KEY}/meta.json",
                     f"entries/{KEY}/meta.sha256", f"entries/{KEY}/kernel.cubin"):
            data = (hashlib.sha256(DEEP.encode()).hexdigest().encode() if name.endswith("sha256")
                    else b"x" if name.endswith("cubin") else DEEP.encode())
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    report = bundle.import_bundle(KernelCache(), tar_path)
    assert report.entries == [] and len(report.refused) == 3
    assert all("nested 30000 levels deep" in why for _, why in report.refused), report.refused


def test_deep_json_in_a_remote_value_is_refused(root):
    from tilejit.cache import remote

    class Store:
        def __init__(self):
            self.values = {}

        def get(self, name, limit):
            return self.values.get(name)

        def put(self, name, value):
            self.values[name] = value

        def ping(self):
            return 0.0

    secret = b"s" * 32
    shared = remote.RemoteCache(Store(), secret)
    shared.backend.values[remote.entry_name(KEY)] = remote.sign(secret, remote.entry_name(KEY), DEEP.encode())
    shared.backend.values["r"] = remote.sign(secret, "r", DEEP.encode())
    with pytest.warns(RuntimeWarning, match="nested 30000 levels deep"):
        assert shared.get_entry(KEY) is None
    with pytest.warns(RuntimeWarning, match="nested 30000 levels deep"):
        assert shared.get_record("r") is None


# ---- lock files ------------------------------------------------------------------------------------------------

LYING_LOCKS = {  # each names a holder that cannot be checked, or one gone long ago
    "pid over 64 bits": lambda: '{"pid": 99999999999999999999, "host": "%s", "time": %f}' % (HOST, time.time()),
    "pid 2**40": lambda: '{"pid": 1099511627776, "host": "%s", "time": %f}' % (HOST, time.time()),
    "host 100,000 characters": lambda: '{"pid": 1, "host": "%s", "time": %f}' % ("x" * 100000, time.time()),
    "time 1e300": lambda: '{"pid": 1, "host": "elsewhere", "time": 1e300}',
    "time negative": lambda: '{"pid": 1, "host": "elsewhere", "time": -5}',
    "token a list": lambda: '{"pid": 1, "host": "elsewhere", "time": %f, "token": [1]}' % (time.time() - 1e5),
}
HOST = socket.gethostname()


@pytest.mark.parametrize("kind", [*LYING_LOCKS, "a directory", "a directory with files", "a FIFO"])
def test_a_lying_or_odd_lock_is_broken_and_clear_copes(root, tmp_path, kind):
    lock = root / KEY[:2] / f"{KEY}.lock"
    lock.parent.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    if kind in LYING_LOCKS:
        lock.write_text(LYING_LOCKS[kind]())
    elif kind == "a FIFO":
        os.mkfifo(lock)
    else:
        lock.mkdir()
        if kind.endswith("files"):
            (lock / "x").write_text("x")
    os.utime(lock, (1, 1))
    rc, out, err = with_timeout(lambda: run_cli("cache", "clear", "--yes"))
    assert rc == 0 and "Traceback" not in err and not os.path.lexists(lock)
    if kind in LYING_LOCKS:
        lock.write_text(LYING_LOCKS[kind]())
    else:
        lock.mkdir()
    os.utime(lock, (1, 1))
    entry, compiled = with_timeout(lambda: KernelCache().get_or_compile(KEY, kernel_compile(tmp_path / "m")))
    assert compiled == "compiled" and entry.path is not None and not os.path.lexists(lock)


def test_a_lock_timeout_reaches_the_user_as_a_typed_error(root, tmp_path, monkeypatch):
    from test_cache_kernels import compile_scale

    key = compile_scale().entry.key
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "second"))
    monkeypatch.setenv("TILEJIT_LOCK_TIMEOUT", "0.5")
    lock = tmp_path / "second" / key[:2] / f"{key}.lock"
    lock.parent.mkdir(parents=True, mode=0o700)
    os.chmod(lock.parent.parent, 0o700)
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                                "token": "x"}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CacheLockTimeout, match=f"pid {os.getpid()}") as raised:
            compile_scale()
    assert isinstance(raised.value, TilejitError) and not isinstance(raised.value, InternalError)
    assert "tilejit bug" not in str(raised.value)


# ---- the CLI reads nothing it must not follow or wait on --------------------------------------------------------

@pytest.fixture
def fake_cuobjdump(tmp_path, monkeypatch):
    """A cuobjdump on PATH that prints the first line of the file it is given."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "cuobjdump").write_text('#!/bin/sh\nread -r first < "$2"; echo "sass of $first"\n')
    (tools / "cuobjdump").chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))


@pytest.mark.parametrize("cubin", ["a FIFO", "a symlink to a FIFO", "a symlink to a file"])
def test_show_sass_never_follows_or_waits_on_the_cubin(root, tmp_path, fake_cuobjdump, cubin):
    path = stored(tmp_path / "m")
    (path / "kernel.cubin").unlink()
    elsewhere = tmp_path / "elsewhere"
    if cubin == "a symlink to a file":
        elsewhere.write_text("secret\n")
    else:
        os.mkfifo(elsewhere if cubin != "a FIFO" else path / "kernel.cubin")
    if cubin != "a FIFO":
        (path / "kernel.cubin").symlink_to(elsewhere)
    rc, out, err = with_timeout(lambda: run_cli("cache", "show", KEY[:12], "--sass"), seconds=15)
    assert rc == 1 and err.startswith("tilejit: ") and "Traceback" not in err and "secret" not in out


def test_show_sass_with_a_kernel_sass_the_meta_does_not_list_disassembles_the_cubin(root, tmp_path,
                                                                                    fake_cuobjdump):
    path = stored(tmp_path / "m")
    (path / "kernel.sass").write_text("planted\n")
    rc, out, err = run_cli("cache", "show", KEY[:12], "--sass")
    assert rc == 0 and out == "sass of \x7fELF-cubin\n" and err == ""
    (path / "kernel.sass").unlink()
    os.mkfifo(path / "kernel.sass")
    rc, out, err = with_timeout(lambda: run_cli("cache", "show", KEY[:12], "--sass"))
    assert rc == 0 and out == "sass of \x7fELF-cubin\n"


# ---- one bad shard ----------------------------------------------------------------------------------------------

def _other_key() -> str:
    n = 0
    while make_key({"n": n})[:2] == KEY[:2]:
        n += 1
    return make_key({"n": n})


@pytest.mark.parametrize("shard", ["a symlink", "writable by others"])
def test_one_bad_shard_costs_only_its_own_entries_and_clear_repairs_it(root, tmp_path, shard):
    other = _other_key()
    root.mkdir(mode=0o700)
    bad = root / KEY[:2]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "keep.txt").write_text("keep")
    if shard == "a symlink":
        bad.symlink_to(elsewhere)
    else:
        bad.mkdir()
        os.chmod(bad, 0o777)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = KernelCache()
        kept, compiled = cache.get_or_compile(KEY, kernel_compile(tmp_path / "m"))
        on_disk, _ = cache.get_or_compile(other, kernel_compile(tmp_path / "m"))
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    why = "not a directory (a symlink)" if shard == "a symlink" else "writable by others (mode 777)"
    assert messages == [f"tilejit: not using the cache shard {bad}: it is {why}; its kernels are kept in memory "
                        "for this process (fix its owner or mode, or `tilejit cache clear` removes it)"]
    assert compiled == "compiled" and kept.path is None and on_disk.path == root / other[:2] / other
    rc, out, err = run_cli("cache", "clear", "--yes")
    assert rc == 0 and out.startswith("removed 1 entry") and not os.path.lexists(bad)
    assert (elsewhere / "keep.txt").read_text() == "keep"
    assert KernelCache().get_or_compile(KEY, kernel_compile(tmp_path / "m"))[0].path == bad / KEY
