"""The compiled launcher (``_launch.c``): built from the package's own source on first use, then loaded.

On the H200 host of benchmarks/RESULTS.md a launch through the Python path costs ~13 us of host time (reading each
tensor's pointer, sizes and strides through torch's Python API, building the call signature, packing, a ctypes
call); ``_launch.c`` does the same work without a Python frame in ~6 us, of which ~3.5 us is cuLaunchKernel itself.
It needs a C compiler and Python's headers, and nothing from CUDA or torch at build time (``libcuda.so.1`` is
opened at the first launch), so it builds in well under a second on any machine that has ``cc``. Where it cannot be
built, or with ``TILEJIT_NATIVE_LAUNCH=0``, launches take the Python path (``runtime/jit.py``), which stays the
reference; when it cannot be built, one warning says why. The switch is read at a kernel's first GPU launch.

The shared object lives at ``<cache dir>/native/launch-<digest><ext>``, the digest covering the C source, the
Python version and the platform, so a change to any of them builds a new one. It is executable code, so unlike
the rest of the cache it is loaded only from a directory and a file that belong to this user and that nobody
else can write; otherwise it is built again in a private temporary directory.
"""
from __future__ import annotations

import functools
import os
import stat
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType

# Imported where used (subprocess, sysconfig, tempfile, ...): `import tilejit` must stay cheap, and most processes
# load an already built library or never launch on a GPU.

from .. import knobs

SOURCE = Path(__file__).with_name("_launch.c")
# Parameter kinds as _launch.c numbers them (driver.PARAM_KINDS names).
KIND_CODES = {"ptr": 0, "i64": 1, "i32": 2, "f32": 3, "tmap": 4}

_lock = threading.Lock()
_module: ModuleType | None = None
_failure: str | None = None
_builder: threading.Thread | None = None
_STALE_TMP_S = 600  # a temporary library older than this was left by a killed build


class NativeBuildError(RuntimeError):
    """The native launcher could not be built or loaded (the message says why)."""


def load() -> ModuleType | None:
    """The ``_launch`` module, built on first use; None when disabled or unbuildable (warned once)."""
    global _module, _failure
    if _module is not None or _failure is not None or not knobs.native_launch():
        return _module
    with _lock:
        if _module is None and _failure is None:
            try:
                _module = _load_or_build()
            except NativeBuildError as error:
                _failure = str(error)
                warnings.warn(f"tilejit: the native launcher is unavailable ({error}); kernels launch through the "
                              "Python path (several microseconds more per launch). Set TILEJIT_NATIVE_LAUNCH=0 to "
                              "choose that path and silence this warning.", RuntimeWarning, stacklevel=3)
    return _module


def load_async() -> ModuleType | None:
    """The ``_launch`` module if it is ready; otherwise start building it on a background thread (once) and return
    None, so the first launch does not wait for the C compiler (it overlaps NVRTC, or the Python path runs
    meanwhile)."""
    global _builder
    if _module is not None or _failure is not None or not knobs.native_launch():
        return _module
    built = library_path(knobs.cache_dir() / "native")
    if built.is_file() and _private(built):
        return load()  # built by an earlier process: loading takes about a millisecond
    with _lock:
        if _builder is None and _module is None and _failure is None:
            _builder = threading.Thread(target=load, name="tilejit-native-build", daemon=True)
            _builder.start()
    return _module


def ready() -> ModuleType | None:
    """The ``_launch`` module if it is loaded, without building anything."""
    return _module


def failure() -> str | None:
    """Why the native launcher is unavailable (None when it loaded or was never asked for)."""
    return _failure


def digest() -> str:
    """What the library's file name is keyed by: the C source, the Python version and the platform."""
    return _digest(SOURCE)


@functools.cache
def _digest(source: Path) -> str:  # read and hashed once per source path, not at every first-launch check
    import hashlib
    import platform

    h = hashlib.sha256(source.read_bytes())
    for part in (sys.version, platform.machine(), platform.system(), _ext_suffix()):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:20]


def _ext_suffix() -> str:
    import importlib.machinery
    import sysconfig

    return sysconfig.get_config_var("EXT_SUFFIX") or importlib.machinery.EXTENSION_SUFFIXES[0]


def library_path(directory: Path) -> Path:
    return directory / f"launch-{digest()}{_ext_suffix()}"


def _load_or_build() -> ModuleType:
    import tempfile

    directory = knobs.cache_dir() / "native"
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
        usable = _private(directory)
    except OSError:
        usable = False
    if not usable:
        directory = Path(tempfile.mkdtemp(prefix="tilejit-native-"))
    path = library_path(directory)
    if not (path.is_file() and _private(path)):
        _remove_stale_temporaries(directory)
        build(path)
    return _import(path)


def _remove_stale_temporaries(directory: Path) -> None:
    now = time.time()
    for tmp in directory.glob("launch-*.tmp"):
        try:
            if now - tmp.stat().st_mtime > _STALE_TMP_S:
                tmp.unlink()
        except OSError:
            pass


def _private(path: Path) -> bool:
    """Owned by this user and writable by nobody else (the library is code this process will run)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def compiler() -> list[str]:
    """The C compiler command: $CC, else the one Python was built with, else ``cc``; NativeBuildError if none."""
    import shlex
    import shutil
    import sysconfig

    for candidate in (knobs.c_compiler(), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if not candidate:
            continue
        words = shlex.split(candidate)
        if words and shutil.which(words[0]):
            return words
    raise NativeBuildError("no C compiler found (install cc, or set CC)")


def build(path: Path) -> None:
    """Compile ``_launch.c`` into ``path`` (written under a temporary name, then renamed into place)."""
    import shlex
    import subprocess
    import sysconfig
    import tempfile

    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").is_file():
        raise NativeBuildError(f"Python's C headers are not installed (no Python.h in {include}; on Debian/Ubuntu: "
                               f"apt install python{sys.version_info[0]}.{sys.version_info[1]}-dev)")
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    command = [*compiler(), "-O2", "-shared", "-fPIC", "-std=gnu11", "-I", include, str(SOURCE), "-o", tmp, "-ldl"]
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise NativeBuildError(f"{shlex.join(command)} failed: {error}") from None
        if done.returncode != 0:
            log = (done.stderr or done.stdout).strip()[-2000:]
            raise NativeBuildError(f"{shlex.join(command)} exited with {done.returncode}:\n{log}")
        os.chmod(tmp, 0o700)
        os.replace(tmp, path)  # atomic: a concurrent builder's identical file may win, which is fine
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _import(path: Path) -> ModuleType:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("tilejit.runtime._launch", str(path))
    spec = importlib.util.spec_from_file_location("tilejit.runtime._launch", path, loader=loader)
    if spec is None:
        raise NativeBuildError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(module)
    except ImportError as error:
        raise NativeBuildError(f"cannot import {path}: {error}") from None
    return module
