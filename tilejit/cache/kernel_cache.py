"""``KernelCache``: compiled kernels by key, from memory, then disk, then the remote cache (when one is
configured: ``remote``), then compiled under a cross-process lock.

A cache directory that cannot be written (read-only home, full disk) must not stop kernels from running: the
cache warns once per process and keeps new entries in memory. One shard that cannot be trusted (a symlink,
writable by others) costs only its own entries: they are kept in memory, with one warning naming it. The entry format is ``entries``'s, the lock
``locks``'s, the paths ``layout``'s; the inspection and cleaning methods hand over to ``maintenance``.
"""
from __future__ import annotations

import collections
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

from tilejit import knobs, private_io
from tilejit.errors import warn_user
from tilejit.private_io import UntrustedPathError

from . import entries, locks, maintenance, records
from .entries import CacheEntry
from .layout import CacheLayout, check_key, make_private_dirs

# Once per process, not per KernelCache: every cache object pointing at the same bad directory would
# otherwise repeat the same warning.
_warned_unwritable = False
_warned_shards: set[str] = set()

#: Where a kernel came from, as ``get_or_compile`` and ``lookup`` report it (a compiled kernel's ``origin``).
ORIGINS = ("memory", "disk", "remote", "compiled")
_origin_counts: collections.Counter = collections.Counter()


def origin_counts() -> dict[str, int]:
    """How many kernel lookups of this process each origin answered (``tilejit cache stats``)."""
    return {origin: _origin_counts[origin] for origin in ORIGINS}


def remote_cache():
    """The remote cache to use now (``remote.remote_cache``), or None; its module (and the client's) is imported
    only when ``TILEJIT_REMOTE_CACHE`` is set, so a process without one pays nothing for it."""
    if knobs.remote_cache_url() is None:
        return None
    from . import remote

    return remote.remote_cache()


def _found(entry: CacheEntry, origin: str) -> tuple[CacheEntry, str]:
    _origin_counts[origin] += 1
    return entry, origin


class KernelCache:
    """Compiled kernels by key: memory first, then disk, then the remote cache (if configured), then compile
    under a cross-process lock.

    ``root`` is where entries are kept: the configured directory (``configured``), or a private temporary one
    when the configured one is not this user's alone (``private_io.usable_root`` warns once).
    """

    def __init__(self, root: Path | None = None):
        self.configured = Path(root) if root is not None else knobs.cache_dir()
        self.root = private_io.usable_root(self.configured)
        self.layout = CacheLayout(self.root)
        self._memory: dict[str, CacheEntry] = {}
        self._writable = True  # cleared on the first failed write; reads from disk still work

    # ---- paths (the layout's) --------------------------------------------------------------------------------

    def entry_dir(self, key: str) -> Path:
        return self.layout.entry_dir(key)

    def lock_path(self, key: str) -> Path:
        return self.layout.lock_path(key)

    @property
    def autotune_dir(self) -> Path:
        return self.layout.autotune_dir

    @property
    def extents_dir(self) -> Path:
        return self.layout.extents_dir

    # ---- compile-time extents, per kernel source -----------------------------------------------------------

    def read_extents(self, source_hash: str) -> dict[str, list[int]]:
        """``{parameter: [dims]}`` recorded for a kernel source (``records.read_extents``)."""
        return records.read_extents(self.layout, source_hash)

    def write_extents(self, source_hash: str, kernel_name: str, extents: dict[str, set[int]]) -> None:
        """Record which extents of which tensor parameters a kernel source needs at compile time
        (``records.write_extents``); nothing is written once the cache has fallen back to memory."""
        check_key(source_hash)
        if self._writable:
            records.write_extents(self.layout, source_hash, kernel_name, extents)

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

    def lookup(self, key: str, validate: Callable[[dict], None] | None = None) -> tuple[CacheEntry, str] | None:
        """``(entry, origin)`` from memory or disk (``load``), counted in ``origin_counts``; None on a miss."""
        if key in self._memory:
            return _found(self._memory[key], "memory")
        entry = self.load(key, validate)
        return None if entry is None else _found(entry, "disk")

    def _load_disk(self, key: str, validate: Callable[[dict], None] | None = None) -> CacheEntry | None:
        path = self.layout.entry_dir(key)
        try:
            private_io.check_private_dir(path.parent)
            private_io.check_private_dir(path)
        except FileNotFoundError:
            return None
        except UntrustedPathError as error:
            if error.filename == str(path.parent):
                return None  # a shard we cannot trust: miss, and the write will refuse it too
            entries.discard(path)
            return None
        except OSError:
            return None
        try:
            meta = entries.read_meta(path, key)
            if validate is not None:
                validate(meta)
            binary_name, binary = entries.read_binary(path, meta)
            entries.check_stored_files(path, meta)
        except (OSError, ValueError, KeyError, TypeError):
            # Final directories only appear complete (by rename), so this one was damaged after the fact.
            entries.discard(path)
            return None
        return CacheEntry(key, path, meta, {binary_name: binary})

    # ---- writing -----------------------------------------------------------------------------------------

    def store(self, key: str, files: dict[str, bytes | str], meta: dict, replace: bool = False) -> CacheEntry:
        """Write an entry atomically. If another process stored ``key`` first, its intact entry is kept
        (unless ``replace``). Falls back to memory when the cache directory cannot be written."""
        check_key(key)
        data, meta = entries.new_entry(key, files, meta)
        if self._writable:
            try:
                entry = self._store_disk(key, data, meta, replace)
            except OSError as err:
                self._degrade_or_skip_shard(err)
            else:
                self._memory[key] = entry
                return entry
        entry = CacheEntry(key, None, meta, data)
        self._memory[key] = entry
        return entry

    def _store_disk(self, key: str, data: dict[str, bytes], meta: dict, replace: bool) -> CacheEntry:
        final = self.layout.entry_dir(key)
        make_private_dirs(self.root, final.parent)
        entries.sweep_leftovers(final.parent)
        tmp = entries.write_temp_entry(final.parent, key, data, meta)
        try:
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
                    entries.discard(final)
            else:
                raise OSError(f"could not rename {tmp} into place")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        binary_name = meta["binary"]
        return CacheEntry(key, final, meta, {binary_name: data[binary_name]})

    def get_or_compile(self, key: str, compile_fn: Callable[[], tuple[dict, dict]],
                       validate: Callable[[dict], None] | None = None) -> tuple[CacheEntry, str]:
        """The entry for ``key`` from memory, disk or the remote cache, else compiled with
        ``compile_fn() -> (files, meta)`` (by one process at a time, under the entry's lock).

        Returns ``(entry, origin)``, the origin one of ``ORIGINS``: "compiled" only in the process that ran
        ``compile_fn``, which pushes the entry to the remote cache. An entry on disk or in the remote whose meta
        ``validate`` rejects is discarded (or refused) and compiled again.
        """
        if key in self._memory:
            return _found(self._memory[key], "memory")
        fresh = knobs.always_compile()
        if not fresh and (entry := self.load(key, validate)) is not None:
            return _found(entry, "disk")
        if not fresh and (entry := self._load_remote(key, validate)) is not None:
            return _found(entry, "remote")
        if not self._writable:
            return _found(self._compile_and_store(key, compile_fn, replace=fresh), "compiled")

        try:
            token = locks.acquire(self.layout, key, None if fresh else (lambda: self.load(key, validate)))
        except locks.EntryAppeared as appeared:
            return _found(appeared.entry, "disk")
        except OSError as err:  # the shard directory or lock file cannot be created
            self._degrade_or_skip_shard(err)
            return _found(self._compile_and_store(key, compile_fn, replace=fresh), "compiled")
        try:
            # The previous holder may have stored it between our disk check and taking the lock.
            if not fresh and (entry := self.load(key, validate)) is not None:
                return _found(entry, "disk")
            return _found(self._compile_and_store(key, compile_fn, replace=fresh), "compiled")
        finally:
            locks.release(self.layout, key, token)

    def _load_remote(self, key: str, validate: Callable[[dict], None] | None) -> CacheEntry | None:
        """``key``'s entry from the remote cache, checked and written into this cache; None on a miss."""
        shared = remote_cache()
        if shared is None:
            return None
        found = shared.get_entry(key)
        if found is None:
            return None
        files, meta = found
        if validate is not None:
            try:
                validate(meta)
            except (ValueError, KeyError, TypeError) as error:
                from .remote import entry_name

                shared.refuse(entry_name(key), str(error))
                return None
        # Stored as a new local entry: the digests are made again from the (checked) files.
        made_by_cache = ("key", "sha256", "created", "files")
        return self.store(key, files, {name: value for name, value in meta.items() if name not in made_by_cache})

    def _compile_and_store(self, key: str, compile_fn: Callable[[], tuple[dict, dict]],
                           replace: bool) -> CacheEntry:
        start = time.perf_counter()
        files, meta = compile_fn()
        meta = dict(meta)
        meta.setdefault("compile_seconds", round(time.perf_counter() - start, 4))
        entry = self.store(key, files, meta, replace=replace)
        shared = remote_cache()
        if shared is not None:
            data = {name: content.encode() if isinstance(content, str) else bytes(content)
                    for name, content in files.items()}
            try:
                entries.check_file_digests(entry.meta, data)
            except ValueError:
                return entry  # another process stored its own build of the key first: that one is its to push
            shared.put_entry(key, data, entry.meta)
        return entry

    def _degrade_or_skip_shard(self, err: OSError) -> None:
        """Fall back to memory for the whole process (``_degrade``), unless ``err`` is about one shard that
        cannot be trusted: then only that shard's entries stay in memory, with one warning per shard."""
        filename = getattr(err, "filename", None)
        if not (isinstance(err, UntrustedPathError) and filename and Path(filename).parent == self.root):
            self._degrade(err)
            return
        if filename not in _warned_shards:
            _warned_shards.add(filename)
            warn_user(
                f"tilejit: not using the cache shard {filename}: it is {err.strerror}; its kernels are kept in "
                "memory for this process (fix its owner or mode, or `tilejit cache clear` removes it)")

    def _degrade(self, err: OSError) -> None:
        global _warned_unwritable
        self._writable = False
        if not _warned_unwritable:
            _warned_unwritable = True
            where = f"{err.filename}: " if err.filename and err.filename != str(self.root) else ""
            warn_user(
                f"tilejit: cannot write the kernel cache at {self.root} ({where}{err.strerror or err}); compiled "
                "kernels are kept in memory for this process only. Set TILEJIT_CACHE_DIR to a writable "
                "directory to keep them.")

    # ---- inspection and maintenance (the `tilejit cache` CLI; see ``maintenance``) -------------------------

    def entries(self) -> list[CacheEntry]:
        """Entries on disk whose meta.json is intact, oldest first (``maintenance.list_entries``)."""
        return maintenance.list_entries(self.layout)

    def find(self, prefix: str) -> list[CacheEntry]:
        """Entries whose key starts with ``prefix``."""
        return maintenance.find(self.layout, prefix)

    def autotune_records(self) -> list[dict]:
        """Autotune records (JSON dicts), each with "path" added; unreadable or untrusted files are skipped."""
        return records.autotune_records(self.layout)

    def clear(self) -> int:
        """Remove every entry, leftover temp dir, stale lock and autotune record; returns how many entries
        and records were removed (``maintenance.clear``). Locks of live compiles are left alone. Nothing outside
        the cache directory is touched: symlinks are removed as links, never followed."""
        self._memory.clear()
        return maintenance.clear(self.layout)

    def prune(self, older_than_seconds: float) -> int:
        """Remove entries and autotune records created more than ``older_than_seconds`` ago (and temp
        dirs left behind that long); returns how many entries and records were removed."""
        self._memory.clear()
        return maintenance.prune(self.layout, older_than_seconds)


_default_lock = threading.Lock()
_default_cache: "KernelCache | None" = None


def default_cache() -> KernelCache:
    """The process's kernel cache (at ``knobs.cache_dir()``; a new one when that setting changes)."""
    global _default_cache
    with _default_lock:
        if _default_cache is None or _default_cache.configured != knobs.cache_dir():
            _default_cache = KernelCache()
        return _default_cache
