"""Kernels that ship: a tar of cache entries with their autotune records and extents hints, written by
``tilejit cache export`` and read back, checked, by ``tilejit cache import``.

A machine whose cache was filled by an import finds every kernel on disk and never compiles them (NVRTC is not
called). The tar's members, all regular files::

    entries/<key>/<file>              an entry's files, meta.json and meta.sha256 among them
    autotune/<kernel>-<source hash>.json   autotune records, as in the cache directory
    extents/<source hash>.json        compile-time extents hints

A bundle comes from elsewhere, so nothing in it is trusted: no member is extracted to the filesystem; a member
that is not a regular file (a link, a device), whose name is not one of the above (an absolute path, ``..``),
or that is too large is refused; each entry is checked like one read from disk (meta.sha256, meta.json's
fields, every file's digest, and the compiler's own fields through ``validate``) and then stored through
``KernelCache.store``, so it lands as any compiled entry does. Each refusal is named.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tilejit.private_io import MAX_READ_BYTES, loads_json, read_json, read_private

from . import records
from .entries import META_DIGEST_NAME, META_NAME, check_file_digests, check_file_name, check_meta_fields
from .kernel_cache import KernelCache
from .layout import AUTOTUNE_RECORD_RE, check_key
from .locks import CacheLockTimeout
from .maintenance import list_entries

_ENTRY_MEMBER = re.compile(r"entries/([0-9a-f]{2,128})/([^/]+)")
_AUTOTUNE_MEMBER = re.compile(f"autotune/({AUTOTUNE_RECORD_RE.pattern})")
_EXTENTS_MEMBER = re.compile(r"extents/([0-9a-f]{2,128})\.json")
_MAX_MEMBERS = 1 << 16
# Fields new_entry writes for a stored entry; an imported meta's are checked, then made again from its files.
_MADE_BY_STORE = ("key", "sha256", "created", "files")


@dataclass
class ImportReport:
    """What an import took and what it refused (member or entry name, and why)."""

    entries: list[str] = field(default_factory=list)
    autotune_records: int = 0
    extents_hints: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)
    nvrtc_versions: set[str] = field(default_factory=set)  # "major.minor" of the NVRTC that built each entry


# ---- export -----------------------------------------------------------------------------------------------------

def export_bundle(cache: KernelCache, path: Path, kernels: Iterable[str] = ()) -> tuple[int, int]:
    """Write the cache's intact entries (only those of the named ``kernels`` when any are named), their autotune
    records and extents hints to the tar ``path`` (gzip-compressed when it ends in .gz or .tgz); returns how
    many entries and autotune records it holds. An entry whose files no longer match their digests is left
    out."""
    wanted = set(kernels)
    layout = cache.layout
    mode = "w:gz" if str(path).endswith((".gz", ".tgz")) else "w"
    n_entries = n_records = 0
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tar:
        for entry in list_entries(layout):
            if wanted and entry.meta.get("kernel") not in wanted:
                continue
            try:
                files = {name: read_private(entry.path / name) for name in entry.meta["files"]}
                check_file_digests(entry.meta, files)
                files[META_NAME] = read_private(entry.path / META_NAME)
                files[META_DIGEST_NAME] = read_private(entry.path / META_DIGEST_NAME, limit=256)
            except (OSError, ValueError):
                continue
            for name, data in sorted(files.items()):
                _add(tar, f"entries/{entry.key}/{name}", data)
            n_entries += 1
        for record_path in layout.autotune_files():
            chosen = _records_of(record_path, wanted)
            if chosen:
                _add(tar, f"autotune/{record_path.name}", json.dumps(chosen, indent=1, sort_keys=True).encode())
                n_records += len(chosen)
        for hint_path in layout.extents_files():
            hint = _json_of(hint_path)
            if isinstance(hint, dict) and (not wanted or hint.get("kernel") in wanted):
                _add(tar, f"extents/{hint_path.name}", json.dumps(hint, sort_keys=True).encode())
    return n_entries, n_records


def _records_of(path: Path, wanted: set[str]) -> dict:
    data = _json_of(path)
    if not isinstance(data, dict):
        return {}
    return {key: record for key, record in data.items()
            if isinstance(record, dict) and (not wanted or record.get("kernel") in wanted)}


def _json_of(path: Path):
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
    tar.addfile(info, io.BytesIO(data))


# ---- import -----------------------------------------------------------------------------------------------------

def import_bundle(cache: KernelCache, path: Path, validate: Callable[[dict], None] | None = None,
                  record_problem: Callable[[dict], str | None] | None = None) -> ImportReport:
    """Check every member of the bundle at ``path`` and store what passes into ``cache``; ``validate(meta)`` checks
    the compiler's fields of each entry's meta.json (ValueError), ``record_problem(record)`` says what is wrong with
    an autotune record (None: nothing). Autotune records already in the cache are kept over imported ones.
    OSError or tarfile.TarError when the file cannot be read as a tar at all."""
    report = ImportReport()
    entry_files: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path, "r:*") as tar:
        for count, member in enumerate(tar):
            if count >= _MAX_MEMBERS:
                report.refused.append((member.name, f"more than {_MAX_MEMBERS} members; the rest is not read"))
                break
            if member.isdir():
                continue
            problem = _member_problem(member)
            if problem is not None:
                report.refused.append((member.name, problem))
                continue
            data = tar.extractfile(member).read()
            if (match := _ENTRY_MEMBER.fullmatch(member.name)) is not None:
                entry_files.setdefault(match[1], {})[match[2]] = data
            elif (match := _AUTOTUNE_MEMBER.fullmatch(member.name)) is not None:
                _import_records(cache, member.name, match[1], data, record_problem, report)
            else:
                _import_extents(cache, member.name, _EXTENTS_MEMBER.fullmatch(member.name)[1], data, report)
    for key, files in sorted(entry_files.items()):
        try:
            meta = _checked_entry(key, files, validate)
        except (ValueError, KeyError, TypeError) as error:
            report.refused.append((f"entries/{key}", str(error)))
            continue
        stored = cache.store(key, files, {name: value for name, value in meta.items() if name not in _MADE_BY_STORE})
        report.entries.append(stored.key)
        versions = meta.get("versions")
        version = versions.get("nvrtc") if isinstance(versions, dict) else None
        if isinstance(version, str):
            report.nvrtc_versions.add(version)
    return report


def _member_problem(member: tarfile.TarInfo) -> str | None:
    if not member.isfile():
        return "not a regular file (links, devices and FIFOs are refused)"
    if not any(pattern.fullmatch(member.name) for pattern in (_ENTRY_MEMBER, _AUTOTUNE_MEMBER, _EXTENTS_MEMBER)):
        return "not a name a bundle holds (entries/<key>/<file>, autotune/<kernel>-<hash>.json, extents/<hash>.json)"
    if member.size > MAX_READ_BYTES:
        return f"{member.size} bytes, larger than any cache file may be ({MAX_READ_BYTES})"
    match = _ENTRY_MEMBER.fullmatch(member.name)
    if match is not None and match[2] not in (META_NAME, META_DIGEST_NAME):
        try:
            check_file_name(match[2])
        except ValueError as error:
            return str(error)
    return None


def _checked_entry(key: str, files: dict[str, bytes], validate: Callable[[dict], None] | None) -> dict:
    """The meta.json of an imported entry, after every check a disk entry passes; the entry's files are left in
    ``files`` (meta.json and meta.sha256 taken out). ValueError saying what failed."""
    check_key(key)
    meta_bytes, digest = files.pop(META_NAME, None), files.pop(META_DIGEST_NAME, None)
    if meta_bytes is None or digest is None:
        raise ValueError(f"no {META_NAME} or {META_DIGEST_NAME}")
    if digest.decode("ascii", "replace").strip() != hashlib.sha256(meta_bytes).hexdigest():
        raise ValueError(f"{META_NAME} does not match {META_DIGEST_NAME}")
    meta = loads_json(meta_bytes)
    check_meta_fields(meta, key)
    check_file_digests(meta, files)
    if validate is not None:
        validate(meta)
    return meta


def _import_records(cache: KernelCache, member: str, file_name: str, data: bytes,
                    record_problem: Callable[[dict], str | None] | None, report: ImportReport) -> None:
    try:
        imported = loads_json(data)
        if not isinstance(imported, dict):
            raise ValueError("not a JSON object")
    except ValueError as error:
        report.refused.append((member, str(error)))
        return
    layout = cache.layout
    path = layout.autotune_dir / file_name
    valid = {}
    for key, record in imported.items():
        problem = "not a JSON object" if not isinstance(record, dict) else (
            "it is for another key" if record.get("key") != key else
            record_problem(record) if record_problem is not None else None)
        if problem is not None:
            report.refused.append((f"{member}: {key!r}", problem))
        else:
            valid[key] = record
    if not valid:
        return
    taken: list[str] = []

    def merge(current: dict) -> dict | None:  # under the record file's lock: a concurrent writer's records stay
        taken[:] = [key for key in valid if key not in current]
        return {**current, **{key: valid[key] for key in taken}} if taken else None

    try:
        records.update_autotune_file(layout, path, merge)
    except (OSError, CacheLockTimeout) as error:
        report.refused.append((member, f"cannot write {path}: {error}"))
        return
    report.autotune_records += len(taken)


def _import_extents(cache: KernelCache, member: str, source_hash: str, data: bytes, report: ImportReport) -> None:
    try:
        hint = loads_json(data)
        extents = hint["extents"]
        kernel = hint["kernel"]
        if not isinstance(kernel, str) or not isinstance(extents, dict) or not all(
                isinstance(name, str) and isinstance(dims, list) and all(type(d) is int and d >= 0 for d in dims)
                for name, dims in extents.items()):
            raise ValueError("not an extents hint ({'kernel': name, 'extents': {parameter: [dims]}})")
    except (ValueError, KeyError, TypeError) as error:
        report.refused.append((member, str(error)))
        return
    cache.write_extents(source_hash, kernel, {name: set(dims) for name, dims in extents.items()})
    report.extents_hints += 1
