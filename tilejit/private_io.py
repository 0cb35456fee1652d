"""Files of the cache directory, read and written as its threat model requires (README, "Who may write the cache").

The cache directory holds code this process will run (cubins, the compiled launcher) and facts it will trust
(meta.json, nvrtc.json, autotune records), so only its user may write it. Everything here enforces that:

* ``cache_root()`` is the configured directory if it belongs to this user and nobody else can write it (or does
  not exist yet: it is then created private); otherwise one warning and a fresh private directory for this
  process (``tempfile.mkdtemp``), never the shared one.
* ``read_private`` opens a file once, without following symlinks and without blocking (a FIFO planted in place
  of a file must not hang the reader), and reads it only if ``fstat`` says it is a regular file of this user
  that nobody else can write. Everything is checked on the open descriptor, so there is no window between the
  check and the read.
* ``write_private`` writes through a temporary file created exclusively (``mkstemp``: a random name, O_EXCL,
  mode 0600) and renamed into place, so no name can be predicted and pre-planted as a symlink.
* ``check_private_dir`` is the same test for a directory (shard, entry, ``native/``), by ``lstat``.

Bottom layer (beside ``knobs``): the NVRTC record, the cache, the native launcher and the autotuner all use it.
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from . import knobs
from .errors import user_stacklevel

# Files the cache reads are small (a cubin is at most a few MiB); a larger one is not ours.
MAX_READ_BYTES = 256 << 20

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
        return f"writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_private_dir(path: Path, follow: bool = False) -> None:
    """Raise UntrustedPathError unless ``path`` is a directory of this user that nobody else can write
    (a symlink is refused unless ``follow``); FileNotFoundError when it does not exist."""
    st = os.stat(path) if follow else os.lstat(path)
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
    then check it is private (it may be a symlink the user set up: followed)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    check_private_dir(root, follow=True)


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
    """``configured`` when it is this user's alone (or does not exist yet), else a private temporary directory
    for this process, with one warning naming what is wrong."""
    configured = Path(configured)
    with _lock:
        fallback = _fallback_roots.get(configured)
        if fallback is not None:
            return fallback
        try:
            check_private_dir(configured, follow=True)  # the user may point the setting at a symlink
        except FileNotFoundError:
            return configured  # created private on first write
        except UntrustedPathError as error:
            if error.errno == errno.ENOTDIR:
                return configured  # not a directory: writes fail and degrade to memory with their own warning
            fallback = Path(tempfile.mkdtemp(prefix="tilejit-cache-"))
            _fallback_roots[configured] = fallback
            warnings.warn(f"tilejit: refusing the cache directory {configured}: it is {error.strerror}, and a "
                          f"cache others can write could make this process run their code; using the private "
                          f"directory {fallback} for this process (fix the owner or mode, or set "
                          "TILEJIT_CACHE_DIR)", RuntimeWarning, stacklevel=user_stacklevel())
            return fallback
        except OSError:
            return configured  # cannot even stat it (a parent of mode 000): reads miss, writes degrade
        return configured
