"""Where everything under the cache root lives: the one place that joins a path under it.

The root is ``knobs.cache_dir()`` when it is this user's alone, else a private temporary directory
(``private_io.usable_root``)::

    <root>/<key[:2]>/<key>/                 one kernel entry (``entries``): kernel.cubin, kernel.cu, kernel.ptx,
                                            kernel.ir, meta.json, meta.sha256
    <root>/<key[:2]>/<key>.lock             held by the one process compiling <key> (``locks``)
    <root>/<key[:2]>/<key>.tmp-*/           an entry being written (or left behind by a killed process)
    <root>/<key[:2]>/<key>.trash-*/         an entry being removed
    <root>/autotune/<kernel>-<source hash>.json   best configs written by the autotuner (``records``)
    <root>/extents/<source hash>.json       which tensor extents a kernel source needs at compile time (``records``)
    <root>/nvrtc.json                       the NVRTC version last loaded, and what identifies its library
                                            (backend_cuda/nvrtc.py)
    <root>/native/                          the compiled launcher, built from runtime/_launch.c (runtime/native.py
                                            names the library inside); not an entry: `clear` and `prune` leave it

Walking the root never follows a symlink and, for reading, lists only private directories (``scan``): what a
planted link points to is not the cache's to list or remove. Only the names above are ever listed (a shard is
two hex digits, an entry its key, a record ``<kernel>-<hex>.json`` or ``<hex>.json``), so `clear` and `prune`
remove nothing tilejit would not have made, even under a root that holds other files.
"""
from __future__ import annotations

import errno
import os
import random
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from tilejit import knobs, private_io

_KEY_RE = re.compile(r"[0-9a-f]{2,128}")
_SHARD_RE = re.compile(r"[0-9a-f]{2}")
_TEMP_MARK = ".tmp-"
_TRASH_MARK = ".trash-"
_LOCK_SUFFIX = ".lock"
# What mkdtemp (random letters, digits, "_") and trash_path (pid-hex) append to a key.
_LEFTOVER_RE = re.compile(r"[0-9a-f]{2,128}\.(?:tmp|trash)-[A-Za-z0-9_-]+")
_LOCK_RE = re.compile(r"[0-9a-f]{2,128}\.lock")
#: The file names of autotune records (``<kernel>-<source hash>.json``) and extents hints (``<source hash>.json``).
AUTOTUNE_RECORD_RE = re.compile(r"[^\W\d]\w*-[0-9a-f]{2,128}\.json")
EXTENTS_RECORD_RE = re.compile(r"[0-9a-f]{2,128}\.json")


def check_key(key: str) -> None:
    # Keys become path components: only hex, so nothing like "../" can reach the filesystem.
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"cache key must be a lowercase hex string, got {key!r}")


def is_leftover_name(name: str) -> bool:
    """An entry being written or removed (or left so by a killed process)."""
    return _LEFTOVER_RE.fullmatch(name) is not None


def trash_path(entry_dir: Path) -> Path:
    """A fresh name beside ``entry_dir`` to rename it to before removing it, so no reader sees it half-deleted."""
    return entry_dir.with_name(f"{entry_dir.name}{_TRASH_MARK}{os.getpid()}-{random.getrandbits(32):08x}")


@dataclass(frozen=True)
class CacheLayout:
    """The paths under one cache root."""

    root: Path

    # ---- kernel entries and their locks --------------------------------------------------------------------

    def shard(self, key: str) -> Path:
        check_key(key)
        return self.root / key[:2]

    def entry_dir(self, key: str) -> Path:
        return self.shard(key) / key

    def lock_path(self, key: str) -> Path:
        return self.shard(key) / (key + _LOCK_SUFFIX)

    @staticmethod
    def temp_entry_prefix(key: str) -> str:
        """The name prefix of an entry being written, made in the entry's shard with ``mkdtemp``."""
        return key + _TEMP_MARK

    # ---- records beside the entries ------------------------------------------------------------------------

    @property
    def autotune_dir(self) -> Path:
        return self.root / "autotune"

    def autotune_record(self, kernel_name: str, source_hash: str) -> Path:
        return self.autotune_dir / f"{kernel_name}-{source_hash}.json"

    @property
    def extents_dir(self) -> Path:
        return self.root / "extents"

    def extents_record(self, source_hash: str) -> Path:
        check_key(source_hash)
        return self.extents_dir / f"{source_hash}.json"

    @property
    def nvrtc_record(self) -> Path:
        return self.root / "nvrtc.json"

    @property
    def native_dir(self) -> Path:
        return self.root / "native"

    # ---- walking what is there -----------------------------------------------------------------------------
    # ``trusted=False`` (cleaning) also walks shards and record directories that are real but not private (made
    # writable by others, another user's): the names in them are still the cache's to remove.

    def shards(self, trusted: bool = True) -> list[Path]:
        # Real directories only (is_dir without following): a symlinked shard is not walked into.
        return [Path(e.path) for e in scan(self.root) if _SHARD_RE.fullmatch(e.name)
                and e.is_dir(follow_symlinks=False) and (not trusted or is_private_dir(Path(e.path)))]

    def entry_dirs(self, trusted: bool = True) -> list[Path]:
        return [Path(e.path) for shard in self.shards(trusted) for e in scan(shard, trusted)
                if _KEY_RE.fullmatch(e.name) and e.name.startswith(shard.name) and e.is_dir(follow_symlinks=False)]

    def leftovers(self, trusted: bool = True) -> list[Path]:
        return [Path(e.path) for shard in self.shards(trusted) for e in scan(shard, trusted)
                if is_leftover_name(e.name)]

    def locks(self, trusted: bool = True) -> list[Path]:
        return [Path(e.path) for shard in self.shards(trusted) for e in scan(shard, trusted)
                if _LOCK_RE.fullmatch(e.name)]

    def autotune_files(self, trusted: bool = True) -> list[Path]:
        return [Path(e.path) for e in scan(self.autotune_dir, trusted) if AUTOTUNE_RECORD_RE.fullmatch(e.name)]

    def extents_files(self, trusted: bool = True) -> list[Path]:
        return [Path(e.path) for e in scan(self.extents_dir, trusted) if EXTENTS_RECORD_RE.fullmatch(e.name)]

    def misplaced_links(self) -> list[Path]:
        """Symlinks where the cache keeps a directory (a shard, ``autotune``, ``extents``): never followed, and
        in the way of the directory the cache would make there."""
        return [Path(e.path) for e in scan(self.root) if e.is_symlink()
                and (_SHARD_RE.fullmatch(e.name) or e.name in ("autotune", "extents"))]


def current_layout() -> CacheLayout:
    """The layout of the cache root this process uses now (``private_io.cache_root()``)."""
    return CacheLayout(private_io.cache_root())


def refused_root() -> tuple[Path, Path, str] | None:
    """``(the configured root, the directory or link at fault, why)`` when ``private_io.usable_root`` refuses the
    configured cache root (others can write it or redirect it) and the cache uses a private stand-in for this
    process instead; None when the configured root is the one used. Asked without using the root, so it warns
    nothing: the `tilejit cache` commands say themselves that they leave a refused root alone, instead of
    listing, cleaning or exporting the stand-in."""
    configured = knobs.cache_dir()
    resolved = configured
    try:
        resolved = private_io.resolve_trusted(configured)
        private_io.check_private_dir(resolved)
    except private_io.UntrustedPathError as error:
        if error.errno == errno.ENOTDIR:
            return None  # not a directory: used as it is (writes fail and degrade to memory)
        where = "it" if error.filename in (str(configured), str(resolved)) else f"{error.filename}, on its way,"
        return configured, Path(error.filename), f"{where} is {error.strerror}"
    except OSError:  # missing (made private on first write) or unreadable: used as it is
        return None
    return None


def scan(directory: Path, trusted: bool = True) -> list[os.DirEntry]:
    """The entries of a private, real directory (not a symlink to one); [] otherwise. ``trusted=False``: of any
    real directory, private or not (for cleaning; still never through a symlink)."""
    try:
        if trusted:
            private_io.check_private_dir(directory)
        elif not stat.S_ISDIR(os.lstat(directory).st_mode):
            return []
        with os.scandir(directory) as it:  # (the directory it is in is private: nobody else can swap it)
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def is_private_dir(path: Path) -> bool:
    """Whether ``path`` is a real directory of this user that nobody else can write."""
    try:
        private_io.check_private_dir(path)
    except OSError:
        return False
    return True


def make_private_dirs(root: Path, shard: Path) -> None:
    """Create the cache root and a shard with mode 0700 (cached kernels are the user's own code); the
    root's parents (e.g. ~/.cache) get ordinary permissions. Both must then be this user's and writable by
    nobody else (UntrustedPathError, an OSError naming the one that is not: for the root the cache degrades to
    memory, for a shard only that shard's entries stay in memory)."""
    private_io.make_private_root(root)
    private_io.make_private_dir(shard)
    if not os.access(shard, os.W_OK | os.X_OK):
        raise PermissionError(13, "Permission denied", str(shard))


def mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def remove(path: Path) -> int:
    """Remove a file, a symlink (the link itself) or a directory tree (rmtree does not follow links in it)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        return 0
    return 1
