"""One kernel entry on disk: its files, ``meta.json`` and ``meta.sha256``, how they are written and checked.

An entry directory appears only by ``os.rename`` of a fully written temporary directory, so a reader never sees
half an entry; anything wrong with a final directory (unparseable meta, checksum mismatch, missing file) means
someone damaged it, and it is thrown away and recompiled.

Digests chain, each kept apart from the file it checks: ``meta.sha256`` holds the sha256 of ``meta.json``'s
bytes, and ``meta.json`` holds the sha256 of every other file (``files``; ``sha256`` is the binary's). A flipped
digit in meta.json (a thread count, a reordered parameter list) is caught like a flipped bit in the cubin. They
guard against damage, not against an attacker: who can write the entry could rewrite every digest, which is why
the directories' owner and mode are checked. meta.json is validated in full (the cache's own fields here, the
compiler's by the ``validate`` the caller passes).
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tilejit.private_io import loads_json, read_private

from .layout import CacheLayout, is_leftover_name, mtime, remove, scan, trash_path

DEFAULT_BINARY = "kernel.cubin"
META_NAME = "meta.json"
META_DIGEST_NAME = "meta.sha256"
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# A temporary entry or trash directory older than this was left by a killed process.
_STALE_TMP_S = 3600.0


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
        """The bytes of the entry's file ``name``, checked against its digest; FileNotFoundError when the entry
        has no such file (on disk: meta.json does not list it, whatever lies there), another OSError when it
        cannot be read or does not match."""
        if name not in self.files:
            digests = self.meta.get("files")
            if self.path is None or not isinstance(digests, dict) or name not in digests:
                raise FileNotFoundError(errno.ENOENT, f"cache entry {self.key[:12]} has no file {name!r}",
                                        str(self.path / name) if self.path is not None else name)
            check_file_name(name)
            data = read_private(self.path / name)
            if digests.get(name) != hashlib.sha256(data).hexdigest():
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


def check_file_name(name: str) -> None:
    if not _is_bare_name(name) or name in (META_NAME, META_DIGEST_NAME):
        raise ValueError(f"bad cache file name {name!r}")


def _is_bare_name(name) -> bool:
    """A plain file name inside the entry: no separator, no leading dot (so neither ``.`` nor ``..``), no NUL."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


def is_timestamp(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


# ---- writing --------------------------------------------------------------------------------------------------

def new_entry(key: str, files: dict[str, bytes | str], meta: dict) -> tuple[dict[str, bytes], dict]:
    """The bytes and the full meta.json of a new entry: ``meta`` with the binary's name (default
    ``kernel.cubin``), the key, the digests and the creation time added. ValueError on a bad file name."""
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
        check_file_name(name)
    meta.update(key=key, sha256=hashlib.sha256(data[binary_name]).hexdigest(), created=time.time(),
                files={name: hashlib.sha256(content).hexdigest() for name, content in sorted(data.items())})
    return data, meta


def write_temp_entry(shard: Path, key: str, data: dict[str, bytes], meta: dict) -> Path:
    """A fully written entry in a fresh temporary directory of ``shard`` (mode 0700, a random name), ready to be
    renamed into place; nothing is left behind on failure."""
    tmp = Path(tempfile.mkdtemp(prefix=CacheLayout.temp_entry_prefix(key), dir=shard))
    try:
        for name, content in data.items():
            _write_new(tmp / name, content)
        meta_bytes = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
        _write_new(tmp / META_NAME, meta_bytes)
        # The digest last: a temp dir without it is visibly incomplete to whoever cleans up.
        _write_new(tmp / META_DIGEST_NAME, (hashlib.sha256(meta_bytes).hexdigest() + "\n").encode())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (which must not exist: O_EXCL, no symlink followed) with mode 0600 and write ``data``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def sweep_leftovers(shard: Path) -> None:
    """Remove temp and trash dirs in ``shard`` older than _STALE_TMP_S (left by killed processes)."""
    cutoff = time.time() - _STALE_TMP_S
    for e in scan(shard):
        if is_leftover_name(e.name) and mtime(Path(e.path)) < cutoff:
            remove(Path(e.path))


def discard(path: Path) -> int:
    """Remove an entry directory; renamed away first so no reader sees it half-deleted."""
    trash = trash_path(path)
    try:
        os.rename(path, trash)
    except OSError:
        return 0
    remove(trash)
    return 1


# ---- reading --------------------------------------------------------------------------------------------------

def read_meta(path: Path, key: str) -> dict:
    """An entry's meta.json, checked against meta.sha256 and for every field the cache itself relies on;
    ValueError (or OSError) when anything is off."""
    meta_bytes = read_private(path / META_NAME)
    digest = read_private(path / META_DIGEST_NAME, limit=256).decode("ascii", "replace").strip()
    if digest != hashlib.sha256(meta_bytes).hexdigest():
        raise ValueError(f"{META_NAME} does not match {META_DIGEST_NAME}")
    meta = loads_json(meta_bytes)
    check_meta_fields(meta, key)
    return meta


def check_meta_fields(meta, key: str) -> None:
    """Raise ValueError unless ``meta`` is the meta.json of ``key``'s entry with every field the cache itself
    relies on well-formed (the file digests, the binary's name and sha256, the creation time); the same check
    for an entry read from disk, a remote cache or an imported bundle."""
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
    if not is_timestamp(meta.get("created")):
        raise ValueError(f"{META_NAME}: 'created' must be a finite number")


def check_file_digests(meta: dict, files: dict[str, bytes]) -> None:
    """Raise ValueError unless ``files`` are exactly the files ``meta`` lists, each matching its digest."""
    listed = meta["files"]
    if set(files) != set(listed):
        raise ValueError(f"files {sorted(files)} are not those {META_NAME} lists ({sorted(listed)})")
    for name, data in files.items():
        if hashlib.sha256(data).hexdigest() != listed[name]:
            raise ValueError(f"{name} does not match its digest in {META_NAME}")


def read_binary(path: Path, meta: dict) -> tuple[str, bytes]:
    """The entry's binary (name and bytes), checked against meta.json's ``sha256``; ValueError on a mismatch."""
    binary_name = meta["binary"]
    binary = read_private(path / binary_name)
    if hashlib.sha256(binary).hexdigest() != meta["sha256"]:
        raise ValueError("checksum mismatch")
    return binary_name, binary


def check_stored_files(path: Path, meta: dict) -> None:
    """Raise ValueError (or OSError) unless every file meta.json lists besides the binary (the CUDA source, IR,
    PTX, SASS) is in ``path`` and matches its digest: an entry whose ``kernel.cu`` was truncated or deleted is
    damaged like one whose cubin was, not a hit whose ``asm["cuda"]`` fails later. Read and dropped, not kept:
    ``CacheEntry.read`` reads them again, checked, when asked."""
    for name, digest in meta["files"].items():
        if name != meta["binary"] and hashlib.sha256(read_private(path / name)).hexdigest() != digest:
            raise ValueError(f"{name} does not match its digest in {META_NAME}")


def _file_size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0
