"""Files of the cache directory, read and written as its threat model requires (README, "Who may write the cache").

The cache directory holds code this process will run (cubins, the compiled launcher) and facts it will trust
(meta.json, nvrtc.json, autotune records), so only its user may write it. Everything here enforces that:

* ``cache_root()`` is the configured directory, every symlink on its way resolved (``resolve_trusted``), if it
  belongs to this user and nobody else can write it (or does not exist yet: it is then created private) and
  nobody but this user and root could have made its path lead there; otherwise one warning and a fresh private
  directory for this process (``tempfile.mkdtemp``, removed at exit), never the shared one.
* ``read_private`` opens a file once, without following symlinks and without blocking (a FIFO planted in place
  of a file must not hang the reader), and reads it only if ``fstat`` says it is a regular file of this user
  that nobody else can write. Everything is checked on the open descriptor, so there is no window between the
  check and the read.
* ``write_private`` writes through a temporary file created exclusively (``mkstemp``: a random name, O_EXCL,
  mode 0600) and renamed into place, so no name can be predicted and pre-planted as a symlink.
* ``check_private_dir`` is the same test for a directory (shard, entry, ``native/``), by ``lstat``.
* ``read_json`` and ``loads_json`` parse what tilejit reads back (records, lock files, meta.json, bundle
  members, remote values) with a cap on size and on nesting depth: a damaged file is a ValueError, never a
  RecursionError.

Bottom layer (beside ``knobs``): the NVRTC record, the cache, the native launcher and the autotuner all use it.
"""
from __future__ import annotations

import atexit
import errno
import itertools
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from . import knobs
from .errors import user_stacklevel

# Files the cache reads are small (a cubin is at most a few MiB); a larger one is not ours.
MAX_READ_BYTES = 256 << 20
# JSON tilejit writes is small and shallow (meta.json nests 4 levels); Python's parser recurses once per level.
MAX_JSON_BYTES = 16 << 20
MAX_JSON_DEPTH = 64
# As the kernel's own limit on symlinks followed while resolving one path (Linux's MAXSYMLINKS).
_MAX_LINKS = 40

_lock = threading.Lock()
_fallback_roots: dict[Path, Path] = {}


class UntrustedPathError(OSError):
    """A path in the cache directory that this user does not own, others can write, or is not what it should
    be (a symlink, a FIFO, a directory where a file belongs). An OSError, so callers that treat an unreadable
    cache file as missing treat this one the same way."""


def _my_uid() -> int:
    return os.getuid()  # (a function, so tests can play another user)


def is_private(st: os.stat_result) -> bool:
    """Owned by this user and writable by neither group nor others."""
    return st.st_uid == _my_uid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def why_not_private(st: os.stat_result) -> str | None:
    if st.st_uid != _my_uid():
        return f"owned by uid {st.st_uid}, not by this user (uid {_my_uid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by {'others' if st.st_mode & stat.S_IWOTH else 'group'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_private_dir(path: Path) -> None:
    """Raise UntrustedPathError unless ``path`` is a directory of this user that nobody else can write (a
    symlink is refused: resolve a root first with ``resolve_trusted``); FileNotFoundError when it does not
    exist."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPathError(errno.ENOTDIR, "not a directory" + (" (a symlink)" if stat.S_ISLNK(st.st_mode)
                                                                     else ""), str(path))
    why = why_not_private(st)
    if why is not None:
        raise UntrustedPathError(errno.EPERM, why, str(path))


def make_private_dir(path: Path) -> None:
    """Create ``path`` with mode 0700 if missing, then check it is private (someone may have made it first)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)


def make_private_root(root: Path) -> None:
    """Create the cache root with mode 0700 if missing (its parents, e.g. ~/.cache, with ordinary permissions),
    then check it is private. ``root`` is resolved already (``usable_root``): a symlink found there now was
    planted since, and is refused."""
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    check_private_dir(root)


def open_private(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of the regular, private file ``path`` (not followed if a symlink; never blocks on a FIFO)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPathError(errno.EINVAL, "not a regular file", str(path))
        why = why_not_private(st)
        if why is not None:
            raise UntrustedPathError(errno.EPERM, why, str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int = MAX_READ_BYTES) -> bytes:
    chunks, size = [], 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        chunks.append(chunk)


def read_private(path: Path, limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of the regular, private file ``path``; OSError (UntrustedPathError) otherwise."""
    fd = open_private(path)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def loads_json(data: bytes | str, limit: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """``data`` parsed as JSON; ValueError when it is not JSON, is longer than ``limit`` or nests arrays and
    objects deeper than ``max_depth`` (checked before parsing, so 30,000 '[' cost a scan, not a RecursionError)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes of JSON, over the limit of {limit}")
    depth = json_depth(data, max_depth)
    if depth > max_depth:
        raise ValueError(f"JSON nested {depth} levels deep, over the limit of {max_depth}")
    return json.loads(data)


def read_json(path: Path, limit: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """The JSON in the regular, private file ``path`` (``read_private``, then ``loads_json``); OSError when it
    cannot be read as one, ValueError when it is not JSON tilejit would read."""
    return loads_json(read_private(path, limit), limit, max_depth)


# A JSON string, quotes included (the unrolled form: no backtracking per character).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(data: bytes, enough: int = 0) -> int:
    """How deep the arrays and objects of ``data`` nest (brackets in strings not counted); any number up to
    ``enough`` when there are no more opening brackets than that."""
    opening = data.count(b"[") + data.count(b"{")
    if opening <= enough:
        return opening
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically by a private file holding ``data`` (through an exclusively created temporary
    file in the same directory; the rename never follows a symlink at ``path``, it replaces it)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cache_root() -> Path:
    """The directory the cache uses: ``knobs.cache_dir()`` if usable (see ``usable_root``)."""
    return usable_root(knobs.cache_dir())


def usable_root(configured: Path) -> Path:
    """``configured`` with its symlinks resolved when it is this user's alone (or does not exist yet) and its
    path is (``resolve_trusted``); else a private temporary directory for this process, with one warning naming
    what is wrong. Everything that reads or cleans the cache (the compiler, the launcher, ``tilejit cache``)
    gets its root here, so all of them see the same directory."""
    configured = Path(configured)
    with _lock:
        fallback = _fallback_roots.get(configured)
        if fallback is not None:
            return fallback
        try:
            resolved = resolve_trusted(configured)
        except UntrustedPathError as error:
            return _refuse(configured, configured, error)
        except OSError:
            return configured  # cannot even stat it (a parent of mode 000): reads miss, writes degrade
        try:
            check_private_dir(resolved)
        except FileNotFoundError:
            return resolved  # created private on first write
        except UntrustedPathError as error:
            if error.errno == errno.ENOTDIR:
                return resolved  # not a directory: writes fail and degrade to memory with their own warning
            return _refuse(configured, resolved, error)
        except OSError:
            return resolved
        return resolved


def _refuse(configured: Path, resolved: Path, error: UntrustedPathError) -> Path:
    """The private directory used instead of ``configured`` from now on, with one warning saying why."""
    fallback = _private_fallback()
    _fallback_roots[configured] = fallback
    where = "it" if error.filename in (str(configured), str(resolved)) else f"{error.filename}, on its way,"
    warnings.warn(f"tilejit: refusing the cache directory {configured}: {where} is {error.strerror}, and a cache "
                  f"others can write or redirect could make this process run their code; using the private "
                  f"directory {fallback} for this process (fix the owner or mode, or set TILEJIT_CACHE_DIR)",
                  RuntimeWarning, stacklevel=user_stacklevel())
    return fallback


def resolve_trusted(path: Path) -> Path:
    """``path``, absolute, with every symlink on it resolved, once checked that nobody but this user and root
    could have made it lead there: every directory and symlink on the way is owned by one of them, and no
    directory on the way is writable by others unless it is sticky (like /tmp, where only an entry's owner may
    replace the entry, and the entry is checked in turn). Components that do not exist yet are kept as given.
    UntrustedPathError naming the component that fails; NotADirectoryError, ELOOP and other OSErrors as the
    kernel would give them."""
    path = Path(path)
    if not path.is_absolute():
        path = Path.cwd() / path
    here = Path(path.anchor)
    _check_on_the_way(here, os.lstat(here), through=True)
    pending = list(reversed(path.parts[1:]))  # a stack: the next component last
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent  # every directory up to here was checked on the way down
            continue
        step = here / name
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            return step.joinpath(*reversed(pending))
        _check_on_the_way(step, st, through=bool(pending))
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", str(path))
            target = Path(os.readlink(step))
            if target.is_absolute():
                here = Path(target.anchor)
            pending.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
            continue
        if pending and not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(step))
        here = step
    return here


def _check_on_the_way(path: Path, st: os.stat_result, through: bool) -> None:
    """Raise UntrustedPathError unless ``path`` (a directory or symlink on the way to the cache root, or the
    root itself) is owned by this user or root and, if a directory passed ``through`` that others can write,
    sticky. (The root itself must then be private: ``check_private_dir``.)"""
    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a file"
    if st.st_uid not in (_my_uid(), 0):
        raise UntrustedPathError(errno.EPERM, f"{kind} owned by uid {st.st_uid}, neither this user's "
                                              f"(uid {_my_uid()}) nor root's", str(path))
    if through and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UntrustedPathError(errno.EPERM, f"{kind} writable by others and not sticky "
                                              f"(mode {stat.S_IMODE(st.st_mode):o})", str(path))


def _private_fallback() -> Path:
    """A fresh private directory for a process whose configured root is refused, removed when it exits."""
    fallback = Path(tempfile.mkdtemp(prefix="tilejit-cache-"))
    owner = os.getpid()

    def remove_fallback() -> None:
        if os.getpid() == owner:  # not in a forked child that exits normally
            shutil.rmtree(fallback, ignore_errors=True)
    atexit.register(remove_fallback)
    return fallback
