"""Inspecting and cleaning the cache directory, for the ``tilejit cache`` CLI: list, find, clear, prune.

Nothing outside the cache directory is touched: the root is walked without following symlinks (``layout.scan``),
and a link planted in the cache is removed as a link, whatever it points to. Locks of live compiles are left
alone, and so is the compiled launcher under ``native/`` (not an entry).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from . import locks
from .entries import CacheEntry, discard, read_meta
from .layout import CacheLayout, is_private_dir, mtime, remove
from .records import as_timestamp, autotune_records


def list_entries(layout: CacheLayout) -> list[CacheEntry]:
    """Entries on disk whose meta.json is intact (matches meta.sha256 and is well-formed), oldest first
    (the binaries' checksums are not verified here)."""
    found = []
    for path in layout.entry_dirs():
        try:
            found.append(CacheEntry(path.name, path, read_meta(path, path.name)))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda e: e.meta["created"])


def find(layout: CacheLayout, prefix: str) -> list[CacheEntry]:
    """Entries whose key starts with ``prefix``."""
    prefix = prefix.lower()
    return [e for e in list_entries(layout) if e.key.startswith(prefix)]


def clear(layout: CacheLayout) -> int:
    """Remove every entry, leftover temp dir, stale lock, autotune record and extents hint, and symlinks where
    the cache keeps a directory; returns how many entries and records were removed (hints are not counted).
    Shards and record directories that are not private are cleaned too (``trusted=False``), and removed when
    that leaves them empty, so the next write makes them anew, private."""
    removed = 0
    for path in layout.entry_dirs(trusted=False):
        removed += discard(path)
    for path in layout.leftovers(trusted=False):
        remove(path)
    for lock in layout.locks(trusted=False):
        holder = locks.read_lock(lock)
        if locks.lock_is_stale(lock, holder):
            locks.break_lock(lock, holder)
    for path in layout.autotune_files(trusted=False):
        removed += remove(path)
    for path in layout.extents_files(trusted=False):  # hints, not entries: removed but not counted
        remove(path)
    for link in layout.misplaced_links():
        remove(link)  # the link, never what it points to
    for directory in [*layout.shards(trusted=False), layout.autotune_dir, layout.extents_dir]:
        if not is_private_dir(directory):
            _remove_if_empty(directory)
    return removed


def prune(layout: CacheLayout, older_than_seconds: float) -> int:
    """Remove entries and autotune records created more than ``older_than_seconds`` ago (and temp dirs and
    hints left that long); returns how many entries and records were removed."""
    cutoff = time.time() - older_than_seconds
    removed = 0
    for path in layout.entry_dirs(trusted=False):
        try:
            created = read_meta(path, path.name)["created"]
        except (OSError, ValueError):
            created = mtime(path)  # damaged: goes by its age like a leftover
        if created < cutoff:
            removed += discard(path)
    for path in layout.leftovers(trusted=False):
        if mtime(path) < cutoff:
            remove(path)
    for record in autotune_records(layout):
        if (as_timestamp(record.get("created")) or mtime(Path(record["path"]))) < cutoff:
            removed += remove(Path(record["path"]))
    for path in layout.extents_files(trusted=False):
        if mtime(path) < cutoff:
            remove(path)
    return removed


def _remove_if_empty(directory: Path) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass
