"""A remote cache that many machines share (``TILEJIT_REMOTE_CACHE``): kernel entries and autotune records.

The remote is untrusted storage (README, "Who may write the cache"): anyone who can reach the server can write
it. So every value is signed with HMAC-SHA256 under a secret read from the private file named by
``TILEJIT_REMOTE_CACHE_KEY``, over the value's name and its payload (a value cannot be replayed under another
name), and checked before anything in it is used. A value that fails (tampered, truncated, unsigned, oversize,
malformed) is refused with one warning and the kernel is compiled locally. Without a usable key the remote is
not used, and one warning says why.

Faults cost a bounded time: every request has a connect and a read timeout and is never retried; the first
failure (unreachable, timed out, full) turns the remote off for the rest of the process, with one warning. A
server that answers, but slowly, is turned off the same way once ``SLOW_REQUESTS`` requests have each taken
longer than ``SLOW_REQUEST_S`` (a hit on a healthy server takes milliseconds): the most a remote can cost a
process is about ``SLOW_REQUESTS`` timeouts. Lookups
go memory, disk, remote, compile (``KernelCache.get_or_compile``); a remote hit is written into the local
cache.

A store plugs in by implementing ``RemoteBackend`` (``get`` and ``put`` of bytes by name, raising
``RemoteUnavailable`` when it cannot answer); ``RedisBackend`` is the one ``TILEJIT_REMOTE_CACHE`` selects.
Payloads are JSON (file contents base64-encoded), never pickle.
"""
from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import hmac
import json
import os
import re
import stat
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Protocol

from tilejit import knobs, private_io
from tilejit.errors import UsageValueError, warn_user

from .entries import check_file_digests, check_meta_fields

#: The largest value put or accepted (a kernel entry with its CUDA, PTX and cubin is well under this).
MAX_VALUE_BYTES = 32 << 20
#: Seconds to connect, and to wait for each reply, before the remote counts as unreachable or slow.
TIMEOUT_S = 2.0
#: A request slower than this counts as slow; the remote is turned off after SLOW_REQUESTS of them.
SLOW_REQUEST_S = 0.5
SLOW_REQUESTS = 3
_SIGNED_MAGIC = b"tilejit-signed-v1\n"
_MAC_BYTES = hashlib.sha256().digest_size
_NAMESPACE = "tilejit:v1:"
_MIN_SECRET_BYTES = 16


class RemoteUnavailable(Exception):
    """The store cannot answer now: unreachable, too slow, full, or its client library is missing."""


class RefusedValue(ValueError):
    """A remote value that fails its signature or its checks."""


class RemoteBackend(Protocol):
    """Bytes by name in a store that other machines share. ``get`` returns None for a missing name, and at most
    ``limit + 1`` bytes of a value (enough to tell it is too large without holding all of it); both raise
    ``RemoteUnavailable`` when the store cannot answer, and neither may block longer than its own timeouts."""

    def get(self, name: str, limit: int) -> bytes | None: ...

    def put(self, name: str, value: bytes) -> None: ...

    def ping(self) -> float:
        """Seconds one round trip took."""


class RedisBackend:
    """A ``RemoteBackend`` on Redis (``redis://host:port/db``, also ``rediss://`` and ``unix://``), through the
    ``redis`` client, imported only when a remote cache is configured."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise RemoteUnavailable("the redis client is not installed (pip install 'tilejit[remote]')") from None
        self._errors = (redis.exceptions.RedisError, OSError)
        try:
            # No retries: one timeout is the whole cost of a dead or slow server.
            self._client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                                                retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
                                                health_check_interval=0)
        except ValueError as error:  # a query argument redis cannot parse (check_url read the rest)
            raise bad_url(url, str(error)) from None
        except self._errors as error:
            raise RemoteUnavailable(f"bad URL: {error}") from None

    def get(self, name: str, limit: int) -> bytes | None:
        try:
            # GETRANGE: a planted huge value costs limit + 1 bytes, not its size (a missing name reads as b"").
            return self._client.getrange(name, 0, limit) or None
        except self._errors as error:
            raise RemoteUnavailable(_describe(error)) from None

    def put(self, name: str, value: bytes) -> None:
        try:
            self._client.set(name, value)
        except self._errors as error:
            raise RemoteUnavailable(_describe(error)) from None

    def ping(self) -> float:
        start = time.perf_counter()
        try:
            self._client.ping()
        except self._errors as error:
            raise RemoteUnavailable(_describe(error)) from None
        return time.perf_counter() - start


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def read_secret(path: Path) -> bytes:
    """The signing secret in ``path``: a regular file of this user that nobody else can read or write (a secret
    others can read lets them sign values). OSError or ValueError saying what is wrong."""
    fd = private_io.open_private(path)
    try:
        mode = os.fstat(fd).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise private_io.UntrustedPathError(errno.EPERM, f"readable by others (mode {stat.S_IMODE(mode):o}; "
                                                "chmod 600 it)", str(path))
        secret = private_io.read_fd(fd, limit=1 << 16).strip()
    finally:
        os.close(fd)
    if len(secret) < _MIN_SECRET_BYTES:
        raise ValueError(f"{path} holds {len(secret)} bytes; a key needs at least {_MIN_SECRET_BYTES} "
                         "(e.g. `head -c 32 /dev/urandom | base64 > FILE`)")
    return secret


def sign(secret: bytes, name: str, payload: bytes) -> bytes:
    """``payload`` as stored under ``name``: a marker, the HMAC-SHA256 of name and payload, the payload."""
    return _SIGNED_MAGIC + _mac(secret, name, payload) + payload


def verify(secret: bytes, name: str, value: bytes, limit: int | None = None) -> bytes:
    """The payload of a value ``sign`` made for ``name``; RefusedValue when it is anything else."""
    limit = MAX_VALUE_BYTES if limit is None else limit
    if len(value) > limit:
        raise RefusedValue(f"{len(value)} bytes, over the limit of {limit}")
    if not value.startswith(_SIGNED_MAGIC):
        raise RefusedValue("not signed")
    header = len(_SIGNED_MAGIC) + _MAC_BYTES
    if len(value) < header:
        raise RefusedValue("truncated")
    payload = value[header:]
    if not hmac.compare_digest(value[len(_SIGNED_MAGIC):header], _mac(secret, name, payload)):
        raise RefusedValue("its signature does not match (changed, truncated, or signed with another key)")
    return payload


def _mac(secret: bytes, name: str, payload: bytes) -> bytes:
    return hmac.new(secret, name.encode() + b"\0" + payload, hashlib.sha256).digest()


def entry_name(key: str) -> str:
    return f"{_NAMESPACE}entry:{key}"


def record_name(kernel_name: str, source_hash: str, tuning_key: str) -> str:
    """The name of one autotune record: per kernel source and tuning key (hashed: keys hold any text)."""
    digest = hashlib.sha256(f"{kernel_name}\0{source_hash}\0{tuning_key}".encode()).hexdigest()
    return f"{_NAMESPACE}autotune:{digest}"


class RemoteCache:
    """Signed kernel entries and autotune records in a ``RemoteBackend``; off for good after its first fault."""

    def __init__(self, backend: RemoteBackend, secret: bytes, where: str = "the remote cache",
                 max_value_bytes: int | None = None) -> None:
        self.backend = backend
        self.where = where
        self.max_value_bytes = MAX_VALUE_BYTES if max_value_bytes is None else max_value_bytes
        self._secret = secret
        self.unavailable: str | None = None  # why the remote was turned off, once it was
        self.slow_requests = 0
        self._lock = threading.Lock()

    # ---- kernel entries ------------------------------------------------------------------------------------

    def get_entry(self, key: str) -> tuple[dict[str, bytes], dict] | None:
        """``(files, meta)`` of ``key``'s entry, checked (signature, meta fields, file digests); None when the
        remote has none, refused one, or is off. The caller validates the compiler's own meta fields."""
        payload = self._get(entry_name(key))
        if payload is None:
            return None
        try:
            data = private_io.loads_json(payload, limit=len(payload))
            if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
                raise ValueError("not an entry")
            meta = data.get("meta")
            check_meta_fields(meta, key)
            files = {name: base64.b64decode(text, validate=True) for name, text in data["files"].items()
                     if isinstance(name, str) and isinstance(text, str)}
            check_file_digests(meta, files)
        except (ValueError, TypeError, KeyError, binascii.Error) as error:
            self.refuse(entry_name(key), str(error))
            return None
        return files, meta

    def put_entry(self, key: str, files: dict[str, bytes], meta: dict) -> None:
        payload = json.dumps({"meta": meta, "files": {name: base64.b64encode(data).decode()
                                                      for name, data in sorted(files.items())}},
                             sort_keys=True).encode()
        self._put(entry_name(key), payload)

    # ---- autotune records ----------------------------------------------------------------------------------

    def get_record(self, name: str) -> dict | None:
        """A signed JSON object stored under ``name``; the caller checks its fields."""
        payload = self._get(name)
        if payload is None:
            return None
        try:
            record = private_io.loads_json(payload, limit=len(payload))
        except ValueError as error:
            self.refuse(name, str(error))
            return None
        if not isinstance(record, dict):
            self.refuse(name, "not a JSON object")
            return None
        return record

    def put_record(self, name: str, record: dict) -> None:
        self._put(name, json.dumps(record, sort_keys=True).encode())

    # ---- reachability --------------------------------------------------------------------------------------

    def ping(self) -> float | None:
        """Seconds one round trip takes; None (and the remote off) when it cannot be reached."""
        if self.unavailable is not None:
            return None
        try:
            return self.backend.ping()
        except RemoteUnavailable as error:
            self._turn_off(str(error))
            return None

    # ---- the store, signed ---------------------------------------------------------------------------------

    def _get(self, name: str) -> bytes | None:
        if self.unavailable is not None:
            return None
        start = time.perf_counter()
        try:
            value = self.backend.get(name, self.max_value_bytes)
        except RemoteUnavailable as error:
            self._turn_off(str(error))
            return None
        finally:
            self._count_if_slow(time.perf_counter() - start)
        if value is None:
            return None
        try:
            return verify(self._secret, name, bytes(value), self.max_value_bytes)
        except RefusedValue as error:
            self.refuse(name, str(error))
            return None

    def _put(self, name: str, payload: bytes) -> None:
        if self.unavailable is not None:
            return
        value = sign(self._secret, name, payload)
        if len(value) > self.max_value_bytes:
            return  # kept locally only: a value this large would be refused by every reader
        start = time.perf_counter()
        try:
            self.backend.put(name, value)
        except RemoteUnavailable as error:
            self._turn_off(str(error))
        finally:
            self._count_if_slow(time.perf_counter() - start)

    def _count_if_slow(self, seconds: float) -> None:
        if seconds <= SLOW_REQUEST_S:
            return
        with self._lock:
            self.slow_requests += 1
            count = self.slow_requests
        if count >= SLOW_REQUESTS:
            self._turn_off(f"answering slowly: {count} requests took over {SLOW_REQUEST_S:g} s each, the last "
                           f"{seconds:.2f} s")

    def refuse(self, name: str, why: str) -> None:
        warn_user(f"tilejit: refusing {name} from {self.where}: {why}; compiling locally instead")

    def _turn_off(self, why: str) -> None:
        with self._lock:
            if self.unavailable is not None:
                return
            self.unavailable = why
        warn_user(f"tilejit: the remote cache {self.where} is not answering ({why}); not using it for the "
                  "rest of this process")


# ---- the process's remote cache, from the knobs ----------------------------------------------------------------

_configured_lock = threading.Lock()
_configured: dict[tuple, "RemoteCache | str"] = {}  # (url, key file) -> the remote, or why there is none
_SCHEMES = ("redis", "rediss", "unix")
_URL_FORMS = "redis://[user:password@]host[:port][/db], rediss://... or unix:///path/to/socket"
# A scheme, then everything up to the last "@" (the user info, when the URL cannot be parsed), then the rest.
_USERINFO_RE = re.compile(r"^(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*://)?)(?P<userinfo>.*)@(?P<tail>[^@]*)$",
                          re.DOTALL)


def redacted(url: str) -> str:
    """``url`` without its password, for messages. Also when ``url`` cannot be parsed or has no ``//`` (a
    forgotten ``redis://`` makes ``user:secret@host`` a path): everything between the user name's colon and the
    last ``@`` is masked then."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is not None:
            netloc = parts.netloc.rsplit("@", 1)[1]
            user = f"{parts.username}:***@" if parts.username else "***@"
            return urllib.parse.urlunsplit(parts._replace(netloc=user + netloc))
        if "@" not in url or "@" in parts.netloc:  # no user info, or a user name alone
            return url
    except ValueError:
        pass
    match = _USERINFO_RE.match(url)
    user, colon, _ = match["userinfo"].partition(":") if match else ("", "", "")
    if not colon:
        return url
    return f"{match['head']}{user + ':' if user else ''}***@{match['tail']}"


def bad_url(url: str, why: str) -> UsageValueError:
    """The error for a ``TILEJIT_REMOTE_CACHE`` that cannot name a store (its password masked)."""
    return UsageValueError(f"TILEJIT_REMOTE_CACHE={redacted(url)} is not a remote cache URL: {why}; expected "
                           f"{_URL_FORMS} (or unset it to use only the local cache)")


def check_url(url: str) -> None:
    """A UsageValueError saying what is wrong when ``url`` cannot name a Redis store: unparseable (a broken IPv6
    host), an unknown scheme, a port that is not a number in 0-65535, no host (no socket path for unix://), a
    database that is not a number."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - parsed on access: a port that is not a number raises here
    except ValueError as error:
        raise bad_url(url, str(error)) from None
    if parts.scheme not in _SCHEMES:
        raise bad_url(url, f"unknown scheme {parts.scheme!r}" if parts.scheme else "no scheme")
    if parts.scheme == "unix":
        if not parts.path.strip("/"):
            raise bad_url(url, "no socket path")
        return
    if not parts.hostname:
        raise bad_url(url, "no host")
    if parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise bad_url(url, f"the database {parts.path.strip('/')!r} is not a number")


def configured() -> RemoteCache | str | None:
    """The remote cache ``TILEJIT_REMOTE_CACHE`` names, or why it is not used (a sentence; warned once per
    process), or None when none is configured (the default). A URL that cannot name a store is the user's
    mistake to fix, not a fault to warn about: a UsageValueError (``check_url``)."""
    url = knobs.remote_cache_url()
    if url is None:
        return None
    key_file = knobs.remote_cache_key_file()
    with _configured_lock:
        found = _configured.get((url, key_file))
        if found is None:
            found = _configured[(url, key_file)] = _open(url, key_file)
            if isinstance(found, str):
                warn_user(f"tilejit: not using the remote cache {redacted(url)}: {found}")
    return found


def remote_cache() -> RemoteCache | None:
    """The remote cache to use now: None when none is configured, it is unusable, or it was turned off."""
    found = configured()
    if isinstance(found, RemoteCache) and found.unavailable is None:
        return found
    return None


def _open(url: str, key_file: Path | None) -> RemoteCache | str:
    check_url(url)
    if key_file is None:
        return ("TILEJIT_REMOTE_CACHE_KEY is not set; every remote value must be signed with a key only you can "
                "read (e.g. `head -c 32 /dev/urandom | base64 > ~/.tilejit-key; chmod 600 ~/.tilejit-key`)")
    try:
        secret = read_secret(key_file)
    except (OSError, ValueError) as error:
        return f"cannot use the key file {key_file}: {getattr(error, 'strerror', None) or error}"
    try:
        backend = RedisBackend(url)
    except RemoteUnavailable as error:
        return str(error)
    return RemoteCache(backend, secret, redacted(url))


def status() -> str:
    """One line on the remote cache: not configured, why unused, or reachable (with a round trip's time); a
    UsageValueError when its URL cannot name a store."""
    found = configured()
    if found is None:
        return "not configured (TILEJIT_REMOTE_CACHE is unset)"
    if isinstance(found, str):
        return f"not used: {found}"
    seconds = found.ping()
    if seconds is None:
        return f"{found.where}: unreachable ({found.unavailable})"
    return f"{found.where}: reachable ({seconds * 1e3:.1f} ms round trip)"
