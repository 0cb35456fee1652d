"""The small JSON records kept beside the kernel entries: compile-time extents hints and autotune records.

``extents/<source hash>.json`` says which tensor extents a kernel source needs at compile time, so a fresh
process computes the key of a disk hit from the arguments alone, without the frontend; it is only a hint, and
anything wrong with it reads as "nothing recorded". ``autotune/*.json`` is written by the autotuner (its
``_TuningStore``); here it is only listed, for ``tilejit cache list``.
"""
from __future__ import annotations

import json
import math

from tilejit import private_io
from tilejit.private_io import read_json

from .layout import CacheLayout, make_private_dirs


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
