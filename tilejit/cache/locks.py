"""The per-entry lock: many processes (the ranks of one job) asking for the same kernel compile it once.

An ``O_EXCL`` lock file per entry names its holder (pid, host, time, and a random token so a holder removes only
its own lock). Waiters poll for the entry to appear. A lock whose holder is gone (dead pid on this host, or
older than ``TILEJIT_LOCK_TIMEOUT`` when held from another host, where the pid cannot be checked) is broken. A
live local holder is never overruled: after the timeout the waiter raises ``CacheLockTimeout`` (a
``TilejitError``), naming the holder, rather than silently compiling twice. A lock file is read like any cache
file (bounded, never followed, never blocking) and checked field by field; one that is not a regular file (a
directory, a FIFO) or names no valid holder is judged by its age, and removed as what it is.
"""
from __future__ import annotations

import json
import math
import os
import random
import socket
import time
from pathlib import Path
from typing import Callable

from tilejit import knobs
from tilejit.errors import TilejitError, warn_user
from tilejit.private_io import read_json

from .entries import CacheEntry
from .layout import CacheLayout, make_private_dirs, mtime, remove

_POLL_S = (0.02, 0.05)
# A lock file is written right after it is created; one that is still unreadable after this long was left
# by a process killed in between.
_UNREADABLE_LOCK_GRACE_S = 5.0
# A waiter says who holds the lock after this long (then every _LOCK_REPORT_EVERY_S), rather than in silence.
_LOCK_REPORT_AFTER_S = 3.0
_LOCK_REPORT_EVERY_S = 60.0
# What a lock file may say: Linux's PID_MAX_LIMIT, HOST_NAME_MAX rounded up, the token acquire writes; a time
# more than a day ahead of this clock is no holder's.
_MAX_PID = 1 << 22
_MAX_HOST_CHARS = 255
_MAX_TOKEN_CHARS = 64
_MAX_CLOCK_SKEW_S = 86400.0


class CacheError(TilejitError):
    """Base class of the cache's own errors."""


class CacheLockTimeout(CacheError):
    """Another live process held an entry's lock for longer than TILEJIT_LOCK_TIMEOUT."""


# Public through the package, and named there in tracebacks as before the cache was split into modules.
CacheError.__module__ = CacheLockTimeout.__module__ = "tilejit.cache"


class EntryAppeared(Exception):
    """While waiting on a lock, the holder stored the entry."""

    def __init__(self, entry: CacheEntry):
        super().__init__(entry.key)
        self.entry = entry


def acquire(layout: CacheLayout, key: str, stored_entry: Callable[[], CacheEntry | None] | None) -> str:
    """Take ``key``'s lock and return its token; while waiting, raise EntryAppeared as soon as
    ``stored_entry()`` finds the entry (None: do not look). While waiting on a live holder, a warning names it
    after a few seconds (and again every minute); its stack level assumes ``KernelCache.get_or_compile`` calls
    this directly."""
    lock = layout.lock_path(key)
    make_private_dirs(layout.root, lock.parent)
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
        if stored_entry is not None and (entry := stored_entry()) is not None:
            raise EntryAppeared(entry)
        holder = read_lock(lock)
        if lock_is_stale(lock, holder):
            break_lock(lock, holder)
            continue
        now = time.monotonic()
        if now > deadline:
            raise CacheLockTimeout(
                f"waited {knobs.lock_timeout_s():g}s for {_describe_holder(holder)} to compile cache entry "
                f"{key[:12]}; if no tilejit process is compiling, delete {lock} (TILEJIT_LOCK_TIMEOUT sets "
                "the wait)")
        if now >= next_report:
            next_report = now + _LOCK_REPORT_EVERY_S
            warn_user(
                f"tilejit: waiting for {_describe_holder(holder)} to compile cache entry {key[:12]} "
                f"(waited {now - start:.0f}s of {knobs.lock_timeout_s():g}s; lock file {lock})")
        time.sleep(random.uniform(*_POLL_S))


def release(layout: CacheLayout, key: str, token: str) -> None:
    lock = layout.lock_path(key)
    holder = read_lock(lock)
    # Only remove our own lock: if ours was judged stale and broken, the file now belongs to someone else.
    if holder is not None and holder.get("token") == token:
        try:
            lock.unlink()
        except FileNotFoundError:
            pass


def read_lock(lock: Path) -> dict | None:
    """The holder a lock file names: ``pid``, ``host``, ``time`` and ``token``, each None unless well-formed
    (an int pid in Linux's range, a short printable host name, a finite time not ahead of this clock by more
    than a day, a short token string). {} for a lock that is there but unreadable, not a regular file or not a
    JSON object; None when there is no lock."""
    try:
        holder = read_json(lock, limit=4096, max_depth=2)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    if not isinstance(holder, dict):
        return {}
    pid, host, when, token = (holder.get(name) for name in ("pid", "host", "time", "token"))
    return {"pid": pid if type(pid) is int and 0 < pid < _MAX_PID else None,
            "host": host if isinstance(host, str) and 0 < len(host) <= _MAX_HOST_CHARS and host.isprintable()
            else None,
            "time": float(when) if type(when) in (int, float) and math.isfinite(when)
            and 0 < when < time.time() + _MAX_CLOCK_SKEW_S else None,
            "token": token if isinstance(token, str) and len(token) <= _MAX_TOKEN_CHARS else None}


def _describe_holder(holder: dict | None) -> str:
    if not holder or holder.get("pid") is None:
        return "an unknown process (the lock file does not name its holder)"
    age = f", holding it for {time.time() - holder['time']:.0f}s" if holder.get("time") is not None else ""
    return f"pid {holder['pid']} on {holder.get('host') or 'an unknown host'}{age}"


def lock_is_stale(lock: Path, holder: dict | None) -> bool:
    if not holder or holder.get("pid") is None or holder.get("time") is None:
        # Missing, killed between creating and writing it, or malformed: judged by the file's age.
        age = time.time() - mtime(lock)
        return os.path.lexists(lock) and age > _UNREADABLE_LOCK_GRACE_S
    if holder.get("host") == socket.gethostname():
        return not _pid_alive(holder["pid"])
    return time.time() - holder["time"] > knobs.lock_timeout_s()


def break_lock(lock: Path, holder: dict | None) -> None:
    # Re-read just before unlinking so a lock taken anew since we judged it stale survives. Removed as what it
    # is: a directory planted there goes too, a symlink as a link.
    if read_lock(lock) == holder:
        remove(lock)


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
