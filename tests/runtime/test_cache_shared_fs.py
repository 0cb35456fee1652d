"""A cache directory on a shared filesystem: 8 processes posing as 2 hosts (their lock records name different
hostnames) compile the same kernels into one directory, with stale locks left by a dead process on each kind of
host. No error, every kernel compiled once, no entry lost or damaged, no lock left behind."""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tilejit.cache import KernelCache, make_key

KEYS = [make_key({"shared-fs kernel": i}) for i in range(6)]
HOSTS = ("host-a", "host-b")


def cubin_of(key: str) -> bytes:
    return b"\x7fELF-" + key.encode()


def _compile_fn(key: str, marker: Path, host: str):
    def compile_fn():
        with open(marker, "a") as f:
            f.write(json.dumps({"key": key, "host": host, "pid": os.getpid()}) + "\n")
        time.sleep(0.1)
        files = {"kernel.cubin": cubin_of(key), "kernel.cu": f"// {key}\n"}
        return files, {"kernel": "shared", "arch": "sm_90", "binary": "kernel.cubin"}
    return compile_fn


def _rank(rank: int, root: str, marker: str, barrier, results) -> None:
    host = HOSTS[rank % 2]
    socket.gethostname = lambda: host  # what the lock records name, as on a second machine sharing the directory
    os.environ["TILEJIT_LOCK_TIMEOUT"] = "20"
    barrier.wait()
    got = []
    try:
        cache = KernelCache(Path(root))
        for key in KEYS[rank % len(KEYS):] + KEYS[:rank % len(KEYS)]:  # each rank starts somewhere else
            entry, origin = cache.get_or_compile(key, _compile_fn(key, Path(marker), host))
            got.append([key, origin, entry.binary == cubin_of(key), entry.read_text("kernel.cu") == f"// {key}\n"])
        results.put((rank, got, None))
    except BaseException as error:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, got, repr(error)))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _plant_lock(root: Path, key: str, holder: dict) -> Path:
    shard = root / key[:2]
    shard.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = shard / f"{key}.lock"
    lock.write_text(json.dumps({**holder, "token": "0" * 16}))
    lock.chmod(0o600)
    return lock


def test_eight_processes_on_two_hosts_share_one_directory(tmp_path):
    root = tmp_path / "shared-cache"
    root.mkdir(mode=0o700)
    marker = tmp_path / "compiles.jsonl"
    # A dead host's lock, older than the lock timeout: every host breaks it. A lock of a dead process on host-a,
    # fresh: host-a's processes see the pid is gone and break it; host-b's cannot check the pid and wait for
    # the entry.
    planted = [_plant_lock(root, KEYS[0], {"pid": 4242, "host": "host-gone", "time": time.time() - 3600}),
               _plant_lock(root, KEYS[1], {"pid": _dead_pid(), "host": "host-a", "time": time.time()})]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    ranks = [ctx.Process(target=_rank, args=(rank, str(root), str(marker), barrier, results)) for rank in range(8)]
    for process in ranks:
        process.start()
    reports = sorted(results.get(timeout=240) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
    assert [error for _, _, error in reports] == [None] * 8
    assert [process.exitcode for process in ranks] == [0] * 8
    for _, got, _ in reports:
        assert sorted(key for key, *_ in got) == sorted(KEYS)
        assert all(binary_ok and source_ok for _, _, binary_ok, source_ok in got)
    compiles = [json.loads(line) for line in marker.read_text().splitlines()]
    assert sorted(c["key"] for c in compiles) == sorted(KEYS)  # each kernel compiled once, by one process
    origins = [origin for _, got, _ in reports for _, origin, *_ in got]
    assert origins.count("compiled") == len(KEYS) and set(origins) <= {"compiled", "disk"}
    assert {c["host"] for c in compiles} <= set(HOSTS)
    assert not any(lock.exists() for lock in planted)
    assert not list(root.glob("*/*.lock")) and not list(root.glob("*/*.tmp-*"))
    entries = KernelCache(root).entries()
    assert sorted(e.key for e in entries) == sorted(KEYS)
    assert all(KernelCache(root).load(key).binary == cubin_of(key) for key in KEYS)
