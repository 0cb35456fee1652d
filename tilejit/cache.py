"""The kernel cache: an in-memory dict in front of one directory per compiled kernel on disk.

Layout under the cache root (``knobs.cache_dir()``)::

    <root>/<key[:2]>/<key>/            one entry: kernel.cubin, kernel.cu, kernel.ptx, kernel.ir, meta.json
    <root>/<key[:2]>/<key>.lock        held by the one process compiling <key>
    <root>/<key[:2]>/<key>.tmp-*/      an entry being written (or left behind by a killed process)
    <root>/autotune/<name>.json        best configs written by the autotuner
    <root>/extents/<source hash>.json  which tensor extents a kernel source needs at compile time (a hint that
                                       lets a fresh process compute the key of a disk hit without the frontend)
    <root>/nvrtc.json                  the NVRTC version last loaded, and what identifies its library (nvrtc.py)
    <root>/native/launch-<digest>.so   the compiled launcher, built from runtime/_launch.c (runtime/native.py);
                                       not an entry: `clear` and `prune` leave it

Why it is built this way:

* An entry directory appears only by ``os.rename`` of a fully written temporary directory, so a reader never
  sees half an entry; anything wrong with a final directory (unparseable meta, checksum mismatch, missing
  file) means someone damaged it, and it is thrown away and recompiled.
* Only JSON and raw bytes are read back, never pickle: a cache directory shared between users must not be a
  way to run code.
* Many processes (the ranks of one job) asking for the same kernel compile it once: an ``O_EXCL`` lock file
  per entry names its holder (pid, host, time). Waiters poll for the entry to appear. A lock whose holder is
  gone (dead pid on this host, or older than ``TILEJIT_LOCK_TIMEOUT`` when held from another host, where the
  pid cannot be checked) is broken. A live local holder is never overruled: after the timeout the waiter
  raises, naming the holder, rather than silently compiling twice.
* A cache directory that cannot be written (read-only home, full disk) must not stop kernels from running:
  the cache warns once per process and keeps new entries in memory.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import socket
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tilejit import knobs

DEFAULT_BINARY = "kernel.cubin"
META_NAME = "meta.json"
_KEY_RE = re.compile(r"[0-9a-f]{2,128}")
_POLL_S = (0.02, 0.05)
# A lock file is written right after it is created; one that is still unreadable after this long was left
# by a process killed in between.
_UNREADABLE_LOCK_GRACE_S = 5.0

# Once per process, not per KernelCache: every cache object pointing at the same bad directory would
# otherwise repeat the same warning.
_warned_unwritable = False


class CacheError(Exception):
    """Base class of the cache's own errors."""


class CacheLockTimeout(CacheError):
    """Another live process held an entry's lock for longer than TILEJIT_LOCK_TIMEOUT."""


def make_key(material: dict) -> str:
    """The sha256 of ``material`` as canonical JSON (sorted keys, no whitespace)."""
    text = json.dumps(material, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class CacheEntry:
    """One compiled kernel. ``files`` holds what has been read so far; the rest is read on demand."""

    key: str
    path: Path | None  # None for an entry kept only in memory
    meta: dict
    files: dict[str, bytes] = field(default_factory=dict)

    def read(self, name: str) -> bytes:
        if name not in self.files:
            if self.path is None:
                raise FileNotFoundError(f"cache entry {self.key[:12]} has no file {name!r}")
            self.files[name] = (self.path / name).read_bytes()
        return self.files[name]

    def read_text(self, name: str) -> str:
        return self.read(name).decode("utf-8")

    @property
    def binary(self) -> bytes:
        return self.read(self.meta.get("binary", DEFAULT_BINARY))

    def file_names(self) -> list[str]:
        if self.path is None:
            return sorted(self.files)
        try:
            return sorted(p.name for p in self.path.iterdir() if p.is_file())
        except OSError:
            return []

    def size_bytes(self) -> int:
        if self.path is None:
            return sum(len(data) for data in self.files.values())
        return sum(_file_size(self.path / name) for name in self.file_names())


class KernelCache:
    """Compiled kernels by key: memory first, then disk, then compile under a cross-process lock."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else knobs.cache_dir()
        self._memory: dict[str, CacheEntry] = {}
        self._writable = True  # cleared on the first failed write; reads from disk still work

    # ---- paths -------------------------------------------------------------------------------------------

    def entry_dir(self, key: str) -> Path:
        _check_key(key)
        return self.root / key[:2] / key

    def lock_path(self, key: str) -> Path:
        return self.entry_dir(key).with_name(key + ".lock")

    @property
    def autotune_dir(self) -> Path:
        return self.root / "autotune"

    @property
    def extents_dir(self) -> Path:
        return self.root / "extents"

    # ---- compile-time extents, per kernel source -----------------------------------------------------------

    def read_extents(self, source_hash: str) -> dict[str, list[int]]:
        """``{parameter: [dims]}`` recorded for a kernel source by ``write_extents``; ``{}`` when none (or
        unreadable: the record is only a hint)."""
        _check_key(source_hash)
        try:
            data = json.loads((self.extents_dir / f"{source_hash}.json").read_text())
        except (OSError, ValueError):
            return {}
        extents = data.get("extents") if isinstance(data, dict) else None
        if not isinstance(extents, dict):
            return {}
        return {name: [d for d in dims if isinstance(d, int)] for name, dims in extents.items()
                if isinstance(name, str) and isinstance(dims, list)}

    def write_extents(self, source_hash: str, kernel_name: str, extents: dict[str, set[int]]) -> None:
        """Record (merged with what is recorded already) which extents of which tensor parameters a kernel
        source needs at compile time. Written atomically; not writing it only costs later processes a
        frontend run, so failures are ignored."""
        _check_key(source_hash)
        if not self._writable:
            return
        merged = {name: set(dims) for name, dims in self.read_extents(source_hash).items()}
        for name, dims in extents.items():
            merged.setdefault(name, set()).update(dims)
        record = {"kernel": kernel_name, "extents": {name: sorted(dims) for name, dims in sorted(merged.items())}}
        path = self.extents_dir / f"{source_hash}.json"
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{random.getrandbits(32):08x}")
        try:
            _make_private_dirs(self.root, self.extents_dir)
            tmp.write_text(json.dumps(record, sort_keys=True) + "\n")
            os.replace(tmp, path)
        except OSError:
            _remove(tmp)

    # ---- reading -----------------------------------------------------------------------------------------

    def load(self, key: str) -> CacheEntry | None:
        """The entry for ``key`` if present and intact; a damaged entry is removed and reported missing."""
        if key in self._memory:
            return self._memory[key]
        entry = self._load_disk(key)
        if entry is not None:
            self._memory[key] = entry
        return entry

    def _load_disk(self, key: str) -> CacheEntry | None:
        path = self.entry_dir(key)
        if not path.is_dir():
            return None
        try:
            meta = json.loads((path / META_NAME).read_text())
            if not isinstance(meta, dict) or meta.get("key") != key:
                raise ValueError("meta.json does not describe this key")
            binary_name = meta.get("binary", DEFAULT_BINARY)
            binary = (path / binary_name).read_bytes()
            if hashlib.sha256(binary).hexdigest() != meta.get("sha256"):
                raise ValueError("checksum mismatch")
        except (OSError, ValueError):
            # Final directories only appear complete (by rename), so this one was damaged after the fact.
            self._discard(path)
            return None
        return CacheEntry(key, path, meta, {binary_name: binary})

    # ---- writing -----------------------------------------------------------------------------------------

    def store(self, key: str, files: dict[str, bytes | str], meta: dict, replace: bool = False) -> CacheEntry:
        """Write an entry atomically. If another process stored ``key`` first, its intact entry is kept
        (unless ``replace``). Falls back to memory when the cache directory cannot be written."""
        _check_key(key)
        data = {name: (content.encode() if isinstance(content, str) else bytes(content))
                for name, content in files.items()}
        meta = dict(meta)
        binary_name = meta.setdefault("binary", DEFAULT_BINARY)
        if binary_name not in data:
            raise ValueError(f"files has no {binary_name!r} (meta['binary'])")
        if META_NAME in data:
            raise ValueError(f"{META_NAME} is written by the cache; pass it as meta")
        meta.update(key=key, sha256=hashlib.sha256(data[binary_name]).hexdigest(), created=time.time())

        if self._writable:
            try:
                entry = self._store_disk(key, data, meta, replace)
            except OSError as err:
                self._degrade(err)
            else:
                self._memory[key] = entry
                return entry
        entry = CacheEntry(key, None, meta, data)
        self._memory[key] = entry
        return entry

    def _store_disk(self, key: str, data: dict[str, bytes], meta: dict, replace: bool) -> CacheEntry:
        final = self.entry_dir(key)
        _make_private_dirs(self.root, final.parent)
        tmp = final.with_name(f"{key}.tmp-{os.getpid()}-{random.getrandbits(32):08x}")
        tmp.mkdir(mode=0o700)
        try:
            for name, content in data.items():
                _check_file_name(name)
                (tmp / name).write_bytes(content)
            # meta.json last: a temp dir without it is visibly incomplete to whoever cleans up.
            (tmp / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            for _ in range(3):
                try:
                    os.rename(tmp, final)
                    break
                except OSError:
                    if not final.exists():
                        raise
                # Another process got there first (rename onto a non-empty directory fails).
                if not replace:
                    theirs = self._load_disk(key)  # discards theirs if damaged, so the retry can win
                    if theirs is not None:
                        shutil.rmtree(tmp, ignore_errors=True)
                        return theirs
                else:
                    self._discard(final)
            else:
                raise OSError(f"could not rename {tmp} into place")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        binary_name = meta["binary"]
        return CacheEntry(key, final, meta, {binary_name: data[binary_name]})

    def get_or_compile(self, key: str, compile_fn: Callable[[], tuple[dict, dict]]) -> tuple[CacheEntry, bool]:
        """The entry for ``key``, compiling it with ``compile_fn() -> (files, meta)`` if no process has.

        Returns ``(entry, compiled)``; ``compiled`` is True only in the one process that ran ``compile_fn``.
        """
        if key in self._memory:
            return self._memory[key], False
        fresh = knobs.always_compile()
        if not fresh and (entry := self.load(key)) is not None:
            return entry, False
        if not self._writable:
            return self._compile_and_store(key, compile_fn, replace=fresh), True

        try:
            token = self._acquire_lock(key, wait_for_entry=not fresh)
        except _EntryAppeared as appeared:
            return appeared.entry, False
        except OSError as err:  # the shard directory or lock file cannot be created
            self._degrade(err)
            return self._compile_and_store(key, compile_fn, replace=fresh), True
        try:
            # The previous holder may have stored it between our disk check and taking the lock.
            if not fresh and (entry := self.load(key)) is not None:
                return entry, False
            return self._compile_and_store(key, compile_fn, replace=fresh), True
        finally:
            self._release_lock(key, token)

    def _compile_and_store(self, key: str, compile_fn: Callable[[], tuple[dict, dict]],
                           replace: bool) -> CacheEntry:
        start = time.perf_counter()
        files, meta = compile_fn()
        meta = dict(meta)
        meta.setdefault("compile_seconds", round(time.perf_counter() - start, 4))
        return self.store(key, files, meta, replace=replace)

    def _degrade(self, err: OSError) -> None:
        global _warned_unwritable
        self._writable = False
        if not _warned_unwritable:
            _warned_unwritable = True
            warnings.warn(
                f"tilejit: cannot write the kernel cache at {self.root} ({err.strerror or err}); compiled "
                "kernels are kept in memory for this process only. Set TILEJIT_CACHE_DIR to a writable "
                "directory to keep them.", RuntimeWarning, stacklevel=3)

    # ---- the per-entry lock --------------------------------------------------------------------------------

    def _acquire_lock(self, key: str, wait_for_entry: bool) -> str:
        """Take ``key``'s lock and return its token, or raise _EntryAppeared if a holder stored the entry."""
        lock = self.lock_path(key)
        _make_private_dirs(self.root, lock.parent)
        token = f"{random.getrandbits(64):016x}"
        deadline = time.monotonic() + knobs.lock_timeout_s()
        while True:
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    json.dump({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                               "token": token}, f)
                return token
            if wait_for_entry and (entry := self.load(key)) is not None:
                raise _EntryAppeared(entry)
            holder = _read_lock(lock)
            if _lock_is_stale(lock, holder):
                _break_lock(lock, holder)
                continue
            if time.monotonic() > deadline:
                who = (f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "an unknown process")
                raise CacheLockTimeout(
                    f"waited {knobs.lock_timeout_s():g}s for {who} to compile cache entry {key[:12]}; "
                    f"if no tilejit process is compiling, delete {lock} (TILEJIT_LOCK_TIMEOUT sets the wait)")
            time.sleep(random.uniform(*_POLL_S))

    def _release_lock(self, key: str, token: str) -> None:
        lock = self.lock_path(key)
        holder = _read_lock(lock)
        # Only remove our own lock: if ours was judged stale and broken, the file now belongs to someone else.
        if holder is not None and holder.get("token") == token:
            try:
                lock.unlink()
            except FileNotFoundError:
                pass

    # ---- inspection and maintenance (the `tilejit cache` CLI) ----------------------------------------------

    def entries(self) -> list[CacheEntry]:
        """Entries on disk whose meta.json parses, oldest first (checksums are not verified here)."""
        found = []
        for path in self._entry_dirs():
            try:
                meta = json.loads((path / META_NAME).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(meta, dict):
                found.append(CacheEntry(path.name, path, meta))
        return sorted(found, key=lambda e: as_timestamp(e.meta.get("created")) or 0.0)

    def find(self, prefix: str) -> list[CacheEntry]:
        """Entries whose key starts with ``prefix``."""
        prefix = prefix.lower()
        return [e for e in self.entries() if e.key.startswith(prefix)]

    def autotune_records(self) -> list[dict]:
        """Autotune records (JSON dicts), each with "path" added; unreadable files are skipped."""
        records = []
        for path in sorted(self.autotune_dir.glob("*.json")) if self.autotune_dir.is_dir() else []:
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict):
                records.append({**record, "path": str(path)})
        return records

    def clear(self) -> int:
        """Remove every entry, leftover temp dir, stale lock and autotune record; returns how many entries
        and records were removed. Locks of live compiles are left alone."""
        self._memory.clear()
        removed = 0
        for path in self._entry_dirs():
            removed += self._discard(path)
        for path in self._leftovers():
            _remove(path)
        for lock in self._locks():
            holder = _read_lock(lock)
            if _lock_is_stale(lock, holder):
                _break_lock(lock, holder)
        if self.autotune_dir.is_dir():
            for path in self.autotune_dir.glob("*.json"):
                removed += _remove(path)
        if self.extents_dir.is_dir():  # hints, not entries: removed but not counted
            for path in self.extents_dir.iterdir():
                _remove(path)
        return removed

    def prune(self, older_than_seconds: float) -> int:
        """Remove entries and autotune records created more than ``older_than_seconds`` ago (and temp
        dirs left behind that long); returns how many entries and records were removed."""
        cutoff = time.time() - older_than_seconds
        self._memory.clear()
        removed = 0
        for entry in self.entries():
            if (as_timestamp(entry.meta.get("created")) or _mtime(entry.path)) < cutoff:
                removed += self._discard(entry.path)
        for path in self._leftovers():
            if _mtime(path) < cutoff:
                _remove(path)
        for record in self.autotune_records():
            if (as_timestamp(record.get("created")) or _mtime(Path(record["path"]))) < cutoff:
                removed += _remove(Path(record["path"]))
        if self.extents_dir.is_dir():
            for path in self.extents_dir.iterdir():
                if _mtime(path) < cutoff:
                    _remove(path)
        return removed

    def _shards(self) -> list[Path]:
        try:
            return sorted(p for p in self.root.iterdir() if len(p.name) == 2 and p.is_dir())
        except OSError:
            return []

    def _entry_dirs(self) -> list[Path]:
        return [p for shard in self._shards() for p in sorted(shard.iterdir())
                if _KEY_RE.fullmatch(p.name) and p.is_dir()]

    def _leftovers(self) -> list[Path]:
        return [p for shard in self._shards() for p in shard.iterdir()
                if ".tmp-" in p.name or ".trash-" in p.name]

    def _locks(self) -> list[Path]:
        return [p for shard in self._shards() for p in shard.glob("*.lock")]

    def _discard(self, path: Path) -> int:
        """Remove an entry directory; renamed away first so no reader sees it half-deleted."""
        trash = path.with_name(f"{path.name}.trash-{os.getpid()}-{random.getrandbits(32):08x}")
        try:
            os.rename(path, trash)
        except OSError:
            return 0
        shutil.rmtree(trash, ignore_errors=True)
        return 1


class _EntryAppeared(Exception):
    """Internal: while waiting on a lock, the holder stored the entry."""

    def __init__(self, entry: CacheEntry):
        super().__init__(entry.key)
        self.entry = entry


def _check_key(key: str) -> None:
    # Keys become path components: only hex, so nothing like "../" can reach the filesystem.
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"cache key must be a lowercase hex string, got {key!r}")


def _check_file_name(name: str) -> None:
    if not name or "/" in name or name.startswith(".") or name == META_NAME:
        raise ValueError(f"bad cache file name {name!r}")


def _make_private_dirs(root: Path, shard: Path) -> None:
    """Create the cache root and a shard with mode 0700 (cached kernels are the user's own code); the
    root's parents (e.g. ~/.cache) get ordinary permissions."""
    root.parent.mkdir(parents=True, exist_ok=True)
    for path in (root, shard):
        path.mkdir(mode=0o700, exist_ok=True)
    if not os.access(shard, os.W_OK | os.X_OK):
        raise PermissionError(13, "Permission denied", str(shard))


def _read_lock(lock: Path) -> dict | None:
    try:
        holder = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _lock_is_stale(lock: Path, holder: dict | None) -> bool:
    if holder is None:  # missing, or killed between creating and writing it
        age = time.time() - _mtime(lock)
        return lock.exists() and age > _UNREADABLE_LOCK_GRACE_S
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        return not _pid_alive(holder["pid"])
    return time.time() - float(holder.get("time", 0)) > knobs.lock_timeout_s()


def _break_lock(lock: Path, holder: dict | None) -> None:
    # Re-read just before unlinking so a lock taken anew since we judged it stale survives.
    if _read_lock(lock) == holder:
        try:
            lock.unlink()
        except FileNotFoundError:
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child that its parent has not reaped yet still answers kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def as_timestamp(value) -> float | None:
    """Seconds since the epoch from a number or an ISO-8601 string (autotune records may use either)."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        from datetime import datetime
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _remove(path: Path) -> int:
    try:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        return 0
    return 1


_default_lock = threading.Lock()
_default_cache: "KernelCache | None" = None


def default_cache() -> KernelCache:
    """The process's kernel cache (at ``knobs.cache_dir()``; a new one when that setting changes)."""
    global _default_cache
    with _default_lock:
        if _default_cache is None or _default_cache.root != knobs.cache_dir():
            _default_cache = KernelCache()
        return _default_cache
