"""The kernel cache: an in-memory dict in front of one directory per compiled kernel on disk.

Layout under the cache root (``knobs.cache_dir()``; every path under it is joined in ``layout``)::

    <root>/<key[:2]>/<key>/            one entry: kernel.cubin, kernel.cu, kernel.ptx, kernel.ir, meta.json,
                                       meta.sha256
    <root>/<key[:2]>/<key>.lock        held by the one process compiling <key>
    <root>/<key[:2]>/<key>.tmp-*/      an entry being written (or left behind by a killed process)
    <root>/autotune/<name>.json        best configs written by the autotuner
    <root>/extents/<source hash>.json  which tensor extents a kernel source needs at compile time (a hint that
                                       lets a fresh process compute the key of a disk hit without the frontend)
    <root>/nvrtc.json                  the NVRTC version last loaded, and what identifies its library (nvrtc.py)
    <root>/native/launch-<digest>.so   the compiled launcher, built from runtime/_launch.c (runtime/native.py);
                                       not an entry: `clear` and `prune` leave it

One module per concern:

* ``layout``: the paths above, key checks, and walking the root without following symlinks.
* ``entries``: one entry's files and digests (``CacheEntry``, ``make_key``), written by rename of a complete
  temporary directory, read back checked.
* ``locks``: the per-entry lock file, so the ranks of one job compile a kernel once.
* ``kernel_cache``: ``KernelCache`` (memory, then disk, then the remote, then compile under the lock; memory
  only when the directory cannot be written) and ``default_cache``.
* ``records``: the extents hints, and the autotune records as ``tilejit cache list`` shows them.
* ``maintenance``: list, find, clear and prune, for the ``tilejit cache`` CLI.
* ``remote``: the remote cache many machines share (``TILEJIT_REMOTE_CACHE``, Redis), every value signed; its
  module is imported only when one is configured.
* ``bundle``: ``tilejit cache export`` and ``import``, entries shipped in a tar and checked on the way in.

Only JSON and raw bytes are read back, never pickle. The cache is private to its user (README, "Who may write
the cache"): the root, shards and entries must be this user's and writable by nobody else, every file is opened
without following symlinks and read only if it is a regular private file (``private_io``); JSON is parsed with
caps on size and depth. The root is resolved through its symlinks, each owned by the user or root; a root that
others can write or redirect is refused for a private temporary one. Temporary files and directories are made exclusively with
random names (``mkstemp``/``mkdtemp``); those left behind by killed processes are swept after an hour.

Everything imports from here as before the split: ``from tilejit.cache import KernelCache``.
"""
from __future__ import annotations

from .entries import DEFAULT_BINARY, META_DIGEST_NAME, META_NAME, CacheEntry, make_key
from .kernel_cache import KernelCache, default_cache
from .locks import CacheError, CacheLockTimeout
from .records import as_timestamp

__all__ = [
    "DEFAULT_BINARY", "META_NAME", "META_DIGEST_NAME", "CacheEntry", "make_key", "KernelCache", "default_cache",
    "CacheError", "CacheLockTimeout", "as_timestamp",
]
