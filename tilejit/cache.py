"""The kernel cache: an in-memory dict in front of one directory per compiled kernel on disk.

Layout under the cache root (``knobs.cache_dir()``)::

    <root>/<key[:2]>/<key>/            one entry: kernel.cubin, kernel.cu, kernel.ptx, kernel.ir, meta.json,
                                       meta.sha256
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
* Only JSON and raw bytes are read back, never pickle. The cache is private to its user (README, "Who may
  write the cache"): the root, shards and entries must be this user's and writable by nobody else, every file
  is opened without following symlinks and read only if it is a regular private file (``private_io``); a
  root that others can write is refused for a private temporary one.
* Digests chain, each kept apart from the file it checks: ``meta.sha256`` holds the sha256 of ``meta.json``'s
  bytes, and ``meta.json`` holds the sha256 of every other file (``files``; ``sha256`` is the binary's). A
  flipped digit in meta.json (a thread count, a reordered parameter list) is caught like a flipped bit in the
  cubin. They guard against damage, not against an attacker: who can write the entry could rewrite every
  digest, which is why the directories' owner and mode are checked. meta.json is validated in full (the
  cache's own fields here, the compiler's by the ``validate`` it passes); any failure discards the entry,
  which is then rebuilt, never trusted and never an error on every run.
* Many processes (the ranks of one job) asking for the same kernel compile it once: an ``O_EXCL`` lock file
  per entry names its holder (pid, host, time). Waiters poll for the entry to appear. A lock whose holder is
  gone (dead pid on this host, or older than ``TILEJIT_LOCK_TIMEOUT`` when held from another host, where the
  pid cannot be checked) is broken. A live local holder is never overruled: after the timeout the waiter
  raises, naming the holder, rather than silently compiling twice.
* A cache directory that cannot be written (read-only home, full disk) must not stop kernels from running:
  the cache warns once per process and keeps new entries in memory.
* Temporary files and directories are made exclusively with random names (``mkstemp``/``mkdtemp``); those
  left behind by killed processes are swept after ``_STALE_TMP_S``. ``clear`` and ``prune`` never follow a
  symlink: a link planted in the cache is removed as a link, whatever it points to.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import socket
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tilejit import knobs, private_io
from tilejit.errors import user_stacklevel
from tilejit.private_io import UntrustedPathError, read_private

DEFAULT_BINARY = "kernel.cubin"
META_NAME = "meta.json"
META_DIGEST_NAME = "meta.sha256"
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_KEY_RE = re.compile(r"[0-9a-f]{2,128}")
_POLL_S = (0.02, 0.05)
# A lock file is written right after it is created; one that is still unreadable after this long was left
# by a process killed in between.
_UNREADABLE_LOCK_GRACE_S = 5.0
# A waiter says who holds the lock after this long (then every _LOCK_REPORT_EVERY_S), rather than in silence.
_LOCK_REPORT_AFTER_S = 3.0
_LOCK_REPORT_EVERY_S = 60.0
# A temporary entry or trash directory older than this was left by a killed process.
_STALE_TMP_S = 3600.0

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
    """One compiled kernel. ``files`` holds what has been read so far; the rest is read on demand, each file
    checked against its digest in meta.json."""

    key: str
    path: Path | None  # None for an entry kept only in memory
    meta: dict
    files: dict[str, bytes] = field(default_factory=dict)

    def read(self, name: str) -> bytes:
        if name not in self.files:
            if self.path is None:
                raise FileNotFoundError(f"cache entry {self.key[:12]} has no file {name!r}")
            _check_file_name(name)
            data = read_private(self.path / name)
            digests = self.meta.get("files")
            if isinstance(digests, dict) and digests.get(name) != hashlib.sha256(data).hexdigest():
                raise OSError(f"{self.path / name} does not match its digest in {META_NAME}")
            self.files[name] = data
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
            with os.scandir(self.path) as it:
                return sorted(e.name for e in it if e.is_file(follow_symlinks=False))
        except OSError:
            return []

    def size_bytes(self) -> int:
        if self.path is None:
            return sum(len(data) for data in self.files.values())
        return sum(_file_size(self.path / name) for name in self.file_names())


class KernelCache:
    """Compiled kernels by key: memory first, then disk, then compile under a cross-process lock.

    ``root`` is where entries are kept: the configured directory (``configured``), or a private temporary one
    when the configured one is not this user's alone (``private_io.usable_root`` warns once).
    """

    def __init__(self, root: Path | None = None):
        self.configured = Path(root) if root is not None else knobs.cache_dir()
        self.root = private_io.usable_root(self.configured)
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
            private_io.check_private_dir(self.extents_dir)
            data = json.loads(read_private(self.extents_dir / f"{source_hash}.json"))
        except (OSError, ValueError):
            return {}
        extents = data.get("extents") if isinstance(data, dict) else None
        if not isinstance(extents, dict):
            return {}
        return {name: [d for d in dims if type(d) is int] for name, dims in extents.items()
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
        try:
            _make_private_dirs(self.root, self.extents_dir)
            private_io.write_private(self.extents_dir / f"{source_hash}.json",
                                     (json.dumps(record, sort_keys=True) + "\n").encode())
        except OSError:
            pass

    # ---- reading -----------------------------------------------------------------------------------------

    def load(self, key: str, validate: Callable[[dict], None] | None = None) -> CacheEntry | None:
        """The entry for ``key`` if present and intact; a damaged entry is removed and reported missing.
        ``validate(meta)`` checks the fields the caller reads, raising ValueError on a bad one."""
        if key in self._memory:
            return self._memory[key]
        entry = self._load_disk(key, validate)
        if entry is not None:
            self._memory[key] = entry
        return entry

    def _load_disk(self, key: str, validate: Callable[[dict], None] | None = None) -> CacheEntry | None:
        path = self.entry_dir(key)
        try:
            private_io.check_private_dir(path.parent)
            private_io.check_private_dir(path)
        except FileNotFoundError:
            return None
        except UntrustedPathError as error:
            if error.filename == str(path.parent):
                return None  # a shard we cannot trust: miss, and the write will refuse it too
            self._discard(path)
            return None
        except OSError:
            return None
        try:
            meta = _read_meta(path, key)
            if validate is not None:
                validate(meta)
            binary_name = meta["binary"]
            binary = read_private(path / binary_name)
            if hashlib.sha256(binary).hexdigest() != meta["sha256"]:
                raise ValueError("checksum mismatch")
        except (OSError, ValueError, KeyError, TypeError):
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
        for name in (META_NAME, META_DIGEST_NAME):
            if name in data:
                raise ValueError(f"{name} is written by the cache; pass it as meta")
        for name in data:
            _check_file_name(name)
        meta.update(key=key, sha256=hashlib.sha256(data[binary_name]).hexdigest(), created=time.time(),
                    files={name: hashlib.sha256(content).hexdigest() for name, content in sorted(data.items())})

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
        self._sweep_leftovers(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f"{key}.tmp-", dir=final.parent))  # mode 0700, a fresh name
        try:
            for name, content in data.items():
                _write_new(tmp / name, content)
            meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
            _write_new(tmp / META_NAME, meta_bytes)
            # The digest last: a temp dir without it is visibly incomplete to whoever cleans up.
            _write_new(tmp / META_DIGEST_NAME, (hashlib.sha256(meta_bytes).hexdigest() + "\n").encode())
            for _ in range(3):
                try:
                    os.rename(tmp, final)
                    break
                except OSError:
                    if not os.path.lexists(final):
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

    def get_or_compile(self, key: str, compile_fn: Callable[[], tuple[dict, dict]],
                       validate: Callable[[dict], None] | None = None) -> tuple[CacheEntry, bool]:
        """The entry for ``key``, compiling it with ``compile_fn() -> (files, meta)`` if no process has.

        Returns ``(entry, compiled)``; ``compiled`` is True only in the one process that ran ``compile_fn``.
        An entry on disk whose meta ``validate`` rejects is discarded and compiled again.
        """
        if key in self._memory:
            return self._memory[key], False
        fresh = knobs.always_compile()
        if not fresh and (entry := self.load(key, validate)) is not None:
            return entry, False
        if not self._writable:
            return self._compile_and_store(key, compile_fn, replace=fresh), True

        try:
            token = self._acquire_lock(key, wait_for_entry=not fresh, validate=validate)
        except _EntryAppeared as appeared:
            return appeared.entry, False
        except OSError as err:  # the shard directory or lock file cannot be created
            self._degrade(err)
            return self._compile_and_store(key, compile_fn, replace=fresh), True
        try:
            # The previous holder may have stored it between our disk check and taking the lock.
            if not fresh and (entry := self.load(key, validate)) is not None:
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
                "directory to keep them.", RuntimeWarning, stacklevel=user_stacklevel())

    # ---- the per-entry lock --------------------------------------------------------------------------------

    def _acquire_lock(self, key: str, wait_for_entry: bool, validate: Callable[[dict], None] | None = None) -> str:
        """Take ``key``'s lock and return its token, or raise _EntryAppeared if a holder stored the entry.
        While waiting on a live holder, a warning names it after a few seconds (and again every minute)."""
        lock = self.lock_path(key)
        _make_private_dirs(self.root, lock.parent)
        token = f"{random.getrandbits(64):016x}"
        start = time.monotonic()
        deadline = start + knobs.lock_timeout_s()
        next_report = start + _LOCK_REPORT_AFTER_S
        while True:
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    json.dump({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
                               "token": token}, f)
                return token
            if wait_for_entry and (entry := self.load(key, validate)) is not None:
                raise _EntryAppeared(entry)
            holder = _read_lock(lock)
            if _lock_is_stale(lock, holder):
                _break_lock(lock, holder)
                continue
            now = time.monotonic()
            if now > deadline:
                raise CacheLockTimeout(
                    f"waited {knobs.lock_timeout_s():g}s for {_describe_holder(holder)} to compile cache entry "
                    f"{key[:12]}; if no tilejit process is compiling, delete {lock} (TILEJIT_LOCK_TIMEOUT sets "
                    "the wait)")
            if now >= next_report:
                next_report = now + _LOCK_REPORT_EVERY_S
                warnings.warn(
                    f"tilejit: waiting for {_describe_holder(holder)} to compile cache entry {key[:12]} "
                    f"(waited {now - start:.0f}s of {knobs.lock_timeout_s():g}s; lock file {lock})",
                    RuntimeWarning, stacklevel=user_stacklevel())
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
        """Entries on disk whose meta.json is intact (matches meta.sha256 and is well-formed), oldest first
        (the binaries' checksums are not verified here)."""
        found = []
        for path in self._entry_dirs():
            try:
                found.append(CacheEntry(path.name, path, _read_meta(path, path.name)))
            except (OSError, ValueError):
                continue
        return sorted(found, key=lambda e: e.meta["created"])

    def find(self, prefix: str) -> list[CacheEntry]:
        """Entries whose key starts with ``prefix``."""
        prefix = prefix.lower()
        return [e for e in self.entries() if e.key.startswith(prefix)]

    def autotune_records(self) -> list[dict]:
        """Autotune records (JSON dicts), each with "path" added; unreadable or untrusted files are skipped."""
        records = []
        for path in _files_in(self.autotune_dir, ".json"):
            try:
                record = json.loads(read_private(path))
            except (OSError, ValueError):
                continue
            if isinstance(record, dict):
                records.append({**record, "path": str(path)})
        return records

    def clear(self) -> int:
        """Remove every entry, leftover temp dir, stale lock and autotune record; returns how many entries
        and records were removed. Locks of live compiles are left alone. Nothing outside the cache directory
        is touched: symlinks are removed as links, never followed."""
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
        for path in _files_in(self.autotune_dir, ".json"):
            removed += _remove(path)
        for path in _files_in(self.extents_dir):  # hints, not entries: removed but not counted
            _remove(path)
        return removed

    def prune(self, older_than_seconds: float) -> int:
        """Remove entries and autotune records created more than ``older_than_seconds`` ago (and temp
        dirs left behind that long); returns how many entries and records were removed."""
        cutoff = time.time() - older_than_seconds
        self._memory.clear()
        removed = 0
        for path in self._entry_dirs():
            try:
                created = _read_meta(path, path.name)["created"]
            except (OSError, ValueError):
                created = _mtime(path)  # damaged: goes by its age like a leftover
            if created < cutoff:
                removed += self._discard(path)
        for path in self._leftovers():
            if _mtime(path) < cutoff:
                _remove(path)
        for record in self.autotune_records():
            if (as_timestamp(record.get("created")) or _mtime(Path(record["path"]))) < cutoff:
                removed += _remove(Path(record["path"]))
        for path in _files_in(self.extents_dir):
            if _mtime(path) < cutoff:
                _remove(path)
        return removed

    def _shards(self) -> list[Path]:
        # Real directories only (is_dir without following): a symlinked shard is not walked into.
        return [Path(e.path) for e in _scan(self.root) if len(e.name) == 2 and e.is_dir(follow_symlinks=False)]

    def _entry_dirs(self) -> list[Path]:
        return [Path(e.path) for shard in self._shards() for e in _scan(shard)
                if _KEY_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]

    def _leftovers(self) -> list[Path]:
        return [Path(e.path) for shard in self._shards() for e in _scan(shard)
                if ".tmp-" in e.name or ".trash-" in e.name]

    def _sweep_leftovers(self, shard: Path) -> None:
        """Remove temp and trash dirs in ``shard`` older than _STALE_TMP_S (left by killed processes)."""
        cutoff = time.time() - _STALE_TMP_S
        for e in _scan(shard):
            if (".tmp-" in e.name or ".trash-" in e.name) and _mtime(Path(e.path)) < cutoff:
                _remove(Path(e.path))

    def _locks(self) -> list[Path]:
        return [Path(e.path) for shard in self._shards() for e in _scan(shard) if e.name.endswith(".lock")]

    def _discard(self, path: Path) -> int:
        """Remove an entry directory; renamed away first so no reader sees it half-deleted."""
        trash = path.with_name(f"{path.name}.trash-{os.getpid()}-{random.getrandbits(32):08x}")
        try:
            os.rename(path, trash)
        except OSError:
            return 0
        _remove(trash)
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
    if not _is_bare_name(name) or name in (META_NAME, META_DIGEST_NAME):
        raise ValueError(f"bad cache file name {name!r}")


def _is_bare_name(name) -> bool:
    """A plain file name inside the entry: no separator, no leading dot (so neither ``.`` nor ``..``), no NUL."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


def _is_timestamp(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _read_meta(path: Path, key: str) -> dict:
    """An entry's meta.json, checked against meta.sha256 and for every field the cache itself relies on;
    ValueError (or OSError) when anything is off."""
    meta_bytes = read_private(path / META_NAME)
    digest = read_private(path / META_DIGEST_NAME, limit=256).decode("ascii", "replace").strip()
    if digest != hashlib.sha256(meta_bytes).hexdigest():
        raise ValueError(f"{META_NAME} does not match {META_DIGEST_NAME}")
    meta = json.loads(meta_bytes)
    if not isinstance(meta, dict) or meta.get("key") != key:
        raise ValueError(f"{META_NAME} does not describe this key")
    files = meta.get("files")
    if not (isinstance(files, dict) and all(_is_bare_name(n) and n not in (META_NAME, META_DIGEST_NAME)
                                            and isinstance(d, str) and _SHA256_RE.fullmatch(d)
                                            for n, d in files.items())):
        raise ValueError(f"{META_NAME}: bad 'files'")
    binary = meta.get("binary")
    if not _is_bare_name(binary) or binary not in files:
        raise ValueError(f"{META_NAME}: 'binary' must name a file of the entry, got {binary!r}")
    if meta.get("sha256") != files[binary]:
        raise ValueError(f"{META_NAME}: 'sha256' is not the binary's")
    if not _is_timestamp(meta.get("created")):
        raise ValueError(f"{META_NAME}: 'created' must be a finite number")
    return meta


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (which must not exist: O_EXCL, no symlink followed) with mode 0600 and write ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _scan(directory: Path) -> list[os.DirEntry]:
    """The entries of a private, real directory (not a symlink to one); [] otherwise."""
    try:
        private_io.check_private_dir(directory)
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _files_in(directory: Path, suffix: str = "") -> list[Path]:
    """Entries of ``directory`` ending in ``suffix``, unless ``directory`` is a symlink or not private (then
    nothing: what it points to is not the cache's to list or remove)."""
    return [Path(e.path) for e in _scan(directory) if e.name.endswith(suffix)]


def _make_private_dirs(root: Path, shard: Path) -> None:
    """Create the cache root and a shard with mode 0700 (cached kernels are the user's own code); the
    root's parents (e.g. ~/.cache) get ordinary permissions. Both must then be this user's and writable by
    nobody else (UntrustedPathError, an OSError: the cache degrades to memory)."""
    private_io.make_private_root(root)
    private_io.make_private_dir(shard)
    if not os.access(shard, os.W_OK | os.X_OK):
        raise PermissionError(13, "Permission denied", str(shard))


def _read_lock(lock: Path) -> dict | None:
    """The holder a lock file names, with its fields checked ({} for a lock that is there but unreadable or
    malformed; None when there is no lock)."""
    try:
        holder = json.loads(read_private(lock, limit=4096))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    if not isinstance(holder, dict):
        return {}
    pid, host, when = holder.get("pid"), holder.get("host"), holder.get("time")
    return {**holder,
            "pid": pid if type(pid) is int and pid > 0 else None,
            "host": host if isinstance(host, str) else None,
            "time": when if _is_timestamp(when) else None}


def _describe_holder(holder: dict | None) -> str:
    if not holder or holder.get("pid") is None:
        return "an unknown process (the lock file does not name its holder)"
    age = f", holding it for {time.time() - holder['time']:.0f}s" if holder.get("time") is not None else ""
    return f"pid {holder['pid']} on {holder.get('host') or 'an unknown host'}{age}"


def _lock_is_stale(lock: Path, holder: dict | None) -> bool:
    if not holder or holder.get("pid") is None or holder.get("time") is None:
        # Missing, killed between creating and writing it, or malformed: judged by the file's age.
        age = time.time() - _mtime(lock)
        return os.path.lexists(lock) and age > _UNREADABLE_LOCK_GRACE_S
    if holder.get("host") == socket.gethostname():
        return not _pid_alive(holder["pid"])
    return time.time() - holder["time"] > knobs.lock_timeout_s()


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
        proc_stat = Path(f"/proc/{pid}/stat").read_text()
        return proc_stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def as_timestamp(value) -> float | None:
    """Seconds since the epoch from a finite number or an ISO-8601 string (autotune records may use either);
    None for anything else (NaN, infinities, booleans)."""
    if type(value) in (int, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        from datetime import datetime
        try:
            return datetime.fromisoformat(value).timestamp()
        except (ValueError, OverflowError, OSError):
            return None
    return None


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _file_size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _remove(path: Path) -> int:
    """Remove a file, a symlink (the link itself) or a directory tree (rmtree does not follow links in it)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        return 0
    return 1


_default_lock = threading.Lock()
_default_cache: "KernelCache | None" = None


def default_cache() -> KernelCache:
    """The process's kernel cache (at ``knobs.cache_dir()``; a new one when that setting changes)."""
    global _default_cache
    with _default_lock:
        if _default_cache is None or _default_cache.configured != knobs.cache_dir():
            _default_cache = KernelCache()
        return _default_cache
