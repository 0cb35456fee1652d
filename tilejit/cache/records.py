"""The small JSON records kept beside the kernel entries: compile-time extents hints and autotune records.

``extents/<source hash>.json`` says which tensor extents a kernel source needs at compile time, so a fresh
process computes the key of a disk hit from the arguments alone, without the frontend; it is only a hint, and
anything wrong with it reads as "nothing recorded".

``autotune/<kernel>-<source hash>.json`` holds the autotuner's records for one kernel source, ``{key string:
record}`` (``AutotuneRecordFile``). Every write reads the file, merges and replaces it while holding the file's
lock (``locks``, under a key derived from the file's name), so processes tuning at once never drop each other's
records.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable

from tilejit import private_io
from tilejit.errors import warn_user
from tilejit.private_io import loads_json, read_json, read_private

from . import locks
from .layout import CacheLayout, make_private_dirs

AUTOTUNE_FILE_LIMIT = 16 << 20  # bytes: far above any real record file, small enough to read at once


def read_extents(layout: CacheLayout, source_hash: str) -> dict[str, list[int]]:
    """``{parameter: [dims]}`` recorded for a kernel source by ``write_extents``; ``{}`` when none (or
    unreadable: the record is only a hint)."""
    path = layout.extents_record(source_hash)
    try:
        private_io.check_private_dir(path.parent)
        data = read_json(path)
    except (OSError, ValueError):
        return {}
    extents = data.get("extents") if isinstance(data, dict) else None
    if not isinstance(extents, dict):
        return {}
    return {name: [d for d in dims if type(d) is int] for name, dims in extents.items()
            if isinstance(name, str) and isinstance(dims, list)}


def write_extents(layout: CacheLayout, source_hash: str, kernel_name: str, extents: dict[str, set[int]]) -> None:
    """Record (merged with what is recorded already) which extents of which tensor parameters a kernel
    source needs at compile time. Written atomically; not writing it only costs later processes a
    frontend run, so failures are ignored."""
    path = layout.extents_record(source_hash)
    merged = {name: set(dims) for name, dims in read_extents(layout, source_hash).items()}
    for name, dims in extents.items():
        merged.setdefault(name, set()).update(dims)
    record = {"kernel": kernel_name, "extents": {name: sorted(dims) for name, dims in sorted(merged.items())}}
    try:
        make_private_dirs(layout.root, path.parent)
        private_io.write_private(path, (json.dumps(record, sort_keys=True) + "\n").encode())
    except OSError:
        pass


def autotune_records(layout: CacheLayout) -> list[dict]:
    """Autotune records (JSON dicts), each with "path" added; unreadable or untrusted files are skipped."""
    records = []
    for path in layout.autotune_files():
        try:
            record = read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append({**record, "path": str(path)})
    return records


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


# ---- autotune records ------------------------------------------------------------------------------------------

def record_problem(record: Any) -> str | None:
    """What is wrong with one stored autotune record (None when it can be trusted): timings must be finite
    positive numbers and failure reasons strings, both keyed by config identity, no config both timed and
    failed (a record saying otherwise was damaged, and would have a failing config chosen on every run), and at
    least one config timed (a record in which every config failed is no choice: they are tuned again)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    timings = record.get("timings_ms", {})
    failures = record.get("failures", {})
    if not isinstance(timings, dict) or not all(
            type(v) in (int, float) and math.isfinite(v) and v > 0 for v in timings.values()):
        return "'timings_ms' must map configs to positive, finite milliseconds"
    if not isinstance(failures, dict) or not all(isinstance(v, str) for v in failures.values()):
        return "'failures' must map configs to reasons (strings)"
    if set(timings) & set(failures):
        return f"configs both timed and failed: {sorted(set(timings) & set(failures))}"
    if not timings:
        return "no config in it was timed (every one failed)"
    return None


class AutotuneRecordFile:
    """The autotune records of one kernel source: ``{key string: record}`` in ``CacheLayout.autotune_record``."""

    def __init__(self, layout: CacheLayout, kernel_name: str, source_hash: str) -> None:
        self.layout = layout
        self.path = layout.autotune_record(kernel_name, source_hash)

    def load(self, quiet: bool = False) -> dict[str, dict[str, Any]]:
        """The valid records of the file; a file that is not a private regular file (a symlink, a FIFO, another
        user's) or does not parse is ignored, and so is each record ``record_problem`` refuses, with a warning
        (none when ``quiet``)."""
        try:
            private_io.check_private_dir(self.path.parent)
            text = read_private(self.path, limit=AUTOTUNE_FILE_LIMIT)
        except (FileNotFoundError, NotADirectoryError):
            return {}  # nothing stored yet (or a cache path that cannot exist, reported when writing)
        except OSError as error:
            self._warn(quiet, f"cannot read autotune record {self.path}: {error}; tuning again")
            return {}
        try:
            data = loads_json(text, limit=AUTOTUNE_FILE_LIMIT)
        except ValueError as error:
            self._warn(quiet, f"ignoring corrupt autotune record {self.path}: {error}")
            return {}
        if not isinstance(data, dict):
            self._warn(quiet, f"ignoring autotune record {self.path}: not a JSON object")
            return {}
        valid = {}
        for key, record in data.items():
            problem = record_problem(record)
            if problem is None:
                valid[key] = record
            else:
                self._warn(quiet, f"ignoring the autotune record for {key!r} in {self.path}: {problem}; "
                                  "tuning again")
        return valid

    def save(self, key: str, record: dict[str, Any]) -> None:
        """Store ``record`` under ``key``, keeping every valid record other processes stored meanwhile.
        OSError or ``locks.CacheLockTimeout`` when it cannot be written."""

        def merge(current: dict[str, Any]) -> dict[str, Any]:
            kept = {k: r for k, r in current.items() if record_problem(r) is None}
            kept[key] = record
            return kept

        update_autotune_file(self.layout, self.path, merge)

    @staticmethod
    def _warn(quiet: bool, message: str) -> None:
        if not quiet:
            warn_user(f"tilejit: {message}")


def update_autotune_file(layout: CacheLayout, path: Path,
                         merge: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Replace the record file ``path`` by ``merge(its records now)`` (``{}`` when it is missing or unreadable;
    ``merge`` returning None leaves it as it is), all while holding the file's lock, so a record another
    process writes at the same time is merged, never overwritten. OSError, or ``locks.CacheLockTimeout`` when
    a live process held the lock for longer than TILEJIT_LOCK_TIMEOUT."""
    make_private_dirs(layout.root, path.parent)
    lock_key = hashlib.sha256(f"autotune/{path.name}".encode()).hexdigest()
    token = locks.acquire(layout, lock_key, None)
    try:
        try:
            current = read_json(path, limit=AUTOTUNE_FILE_LIMIT)
        except (OSError, ValueError):
            current = {}
        if not isinstance(current, dict):
            current = {}
        merged = merge({k: r for k, r in current.items() if isinstance(r, dict)})
        if merged is not None:
            private_io.write_private(path, (json.dumps(merged, indent=1, sort_keys=True) + "\n").encode())
    finally:
        locks.release(layout, lock_key, token)
