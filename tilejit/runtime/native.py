"""The compiled launcher (``_launch.c``): built from the package's own source on first use, then loaded.

On the H200 host of benchmarks/RESULTS.md a launch through the Python path costs ~13 us of host time (reading each
tensor's pointer, sizes and strides through torch's Python API, building the call signature, packing, a ctypes
call); ``_launch.c`` does the same work without a Python frame in ~6 us, of which ~3.5 us is cuLaunchKernel itself.
It needs a C compiler and Python's headers, and nothing from CUDA or torch at build time (``libcuda.so.1`` is
opened at the first launch), so it builds in well under a second on any machine that has ``cc``. Where it cannot be
built, or with ``TILEJIT_NATIVE_LAUNCH=0``, launches take the Python path (``runtime/jit.py``), which stays the
reference; when it cannot be built, one warning says why. The switch is read at a kernel's first GPU launch.

The shared object lives at ``<cache dir>/native/launch-<digest><ext>`` (the directory is
``CacheLayout.native_dir``), the digest covering the C source, the Python version and the platform, so a change to
any of them builds a new one; beside it ``<name>.sha256`` holds the sha256 of the library's bytes and their
size, written by the build. It is executable code, so it is trusted only as the README's "Who may write the cache" says: the cache root
and ``native/`` must be this user's and writable by nobody else (else the library is built in a private temporary
directory, removed once loaded), and loading opens the file once (no symlink followed, a regular private file by
``fstat``), reads it, checks the bytes against the recorded size and digest, checks that they are an ELF shared object
for this machine whose headers and segments all lie inside them (``shared_object``: a digest file rewritten to
match a truncated library must not let ``dlopen`` map pages past its end, which is SIGBUS), and loads exactly those
bytes from an anonymous memory file (``memfd_create``), so nothing swapped in after the check can be run. A library
that fails any of this, or that ``dlopen`` refuses, is removed and built again; every failure to build or load is a
NativeBuildError, and launches then take the Python path, with one warning per process.
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

from .. import knobs, private_io
from ..cache.layout import current_layout
from ..errors import user_stacklevel
from . import shared_object

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
                              "choose that path and silence this warning.", RuntimeWarning, stacklevel=user_stacklevel())
    return _module


def load_async() -> ModuleType | None:
    """The ``_launch`` module if it is ready; otherwise start building it on a background thread (once) and return
    None, so the first launch does not wait for the C compiler (it overlaps NVRTC, or the Python path runs
    meanwhile)."""
    global _builder
    if _module is not None or _failure is not None or not knobs.native_launch():
        return _module
    built = library_path(current_layout().native_dir)
    if built.is_file() and _private(built) and _digest_path(built).is_file():
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


def _digest_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _load_or_build() -> ModuleType:
    """Load the cached library, or build it (again) and load that; NativeBuildError on any failure."""
    import shutil

    directory, scratch = _library_directory()
    refused = None
    try:
        path = library_path(directory)
        try:
            return load_verified(path)
        except FileNotFoundError:
            pass
        except NativeBuildError as error:
            refused = error
            _unlink(path)  # damaged, foreign or swapped: never used, built again below
        _remove_stale_temporaries(directory)
        build(path)
        return load_verified(path)
    except NativeBuildError as error:
        if refused is None:
            raise
        raise NativeBuildError(f"{error} (building it again because {refused})") from None
    except OSError as error:
        raise NativeBuildError(f"cannot build or load the launcher in {directory}: {error}") from None
    finally:
        if scratch:
            shutil.rmtree(directory, ignore_errors=True)  # loaded from memory: the files are not needed


def _library_directory() -> tuple[Path, bool]:
    """``<cache dir>/native`` when it and the cache root are private, else a fresh private temporary directory
    (second item True: remove it after loading)."""
    import tempfile

    layout = current_layout()
    directory = layout.native_dir
    try:
        private_io.make_private_root(layout.root)
        private_io.make_private_dir(directory)
        if os.access(directory, os.W_OK | os.X_OK):
            return directory, False
    except private_io.UntrustedPathError as error:
        warnings.warn(f"tilejit: not building the launcher in {directory}: {error.filename} is "
                      f"{error.strerror}; building it in a private temporary directory for this process",
                      RuntimeWarning, stacklevel=user_stacklevel())
    except OSError:
        pass
    try:
        return Path(tempfile.mkdtemp(prefix="tilejit-native-")), True
    except OSError as error:
        raise NativeBuildError(f"no private directory to build the launcher in: {error}") from None


def load_verified(path: Path) -> ModuleType:
    """Open ``path`` once (no symlink followed; a regular file of this user that nobody else can write), check
    its bytes against the size and digest in ``<path>.sha256`` and that they are a loadable shared object for
    this machine, and load those bytes from a private copy in memory.
    FileNotFoundError when there is no library; NativeBuildError when there is one that must not be used."""
    try:
        fd = private_io.open_private(path)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise NativeBuildError(f"refusing {path}: {error.strerror or error}") from None
    try:
        data = private_io.read_fd(fd)
    except OSError as error:
        raise NativeBuildError(f"cannot read {path}: {error}") from None
    finally:
        os.close(fd)
    try:
        recorded = private_io.read_private(_digest_path(path), limit=256).decode("ascii", "replace").split()
    except OSError as error:
        raise NativeBuildError(f"no trustworthy digest for {path}: {error.strerror or error}") from None
    if len(recorded) != 2 or not recorded[1].isdigit():
        raise NativeBuildError(f"{_digest_path(path)} does not hold a digest and a size")
    if len(data) != int(recorded[1]):
        raise NativeBuildError(f"{path} is {len(data)} bytes; it was built with {recorded[1]}")
    if _record(data) != " ".join(recorded):
        raise NativeBuildError(f"{path} does not match its recorded digest")
    host = shared_object.host_identity()
    if host is not None or sys.platform.startswith("linux"):
        problem = shared_object.loading_problem(data, host)
        if problem is not None:
            raise NativeBuildError(f"{path} cannot be loaded: {problem}")
    return _import_bytes(data, path)


def _record(data: bytes) -> str:
    """What ``<library>.sha256`` holds for a library of these bytes: their sha256 and their size."""
    import hashlib

    return f"{hashlib.sha256(data).hexdigest()} {len(data)}"


def _import_bytes(data: bytes, origin: Path) -> ModuleType:
    """Load the extension module whose verified bytes are ``data`` from a memory file (or, without
    memfd_create, from a private temporary copy), never from ``origin`` itself."""
    import tempfile

    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tilejit-launch", getattr(os, "MFD_CLOEXEC", 0))
        try:
            _write_all(fd, data)
            return _import(Path(f"/proc/self/fd/{fd}"), origin)
        finally:
            os.close(fd)
    directory = tempfile.mkdtemp(prefix="tilejit-native-load-")
    try:
        copy = Path(directory) / origin.name
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        return _import(copy, origin)
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink(path: Path) -> None:
    for p in (path, _digest_path(path)):
        try:
            os.unlink(p)
        except OSError:
            pass


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
    """Compile ``_launch.c`` into ``path`` (written under a temporary name, checked to be a non-empty shared
    object, its digest and size recorded in ``<path>.sha256``, then renamed into place)."""
    import shlex
    import subprocess
    import sysconfig
    import tempfile

    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").is_file():
        raise NativeBuildError(f"Python's C headers are not installed (no Python.h in {include}; on Debian/Ubuntu: "
                               f"apt install python{sys.version_info[0]}.{sys.version_info[1]}-dev)")
    command_head = compiler()
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise NativeBuildError(f"cannot create a temporary file in {path.parent}: {error.strerror or error}") from None
    os.close(fd)
    command = [*command_head, "-O2", "-shared", "-fPIC", "-std=gnu11", "-I", include, str(SOURCE), "-o", tmp, "-ldl"]
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise NativeBuildError(f"{shlex.join(command)} failed: {error}") from None
        if done.returncode != 0:
            log = (done.stderr or done.stdout).strip()[-2000:]
            raise NativeBuildError(f"{shlex.join(command)} exited with {done.returncode}:\n{log}")
        try:
            fd = private_io.open_private(Path(tmp))
            try:
                data = private_io.read_fd(fd)
            finally:
                os.close(fd)
        except OSError as error:
            raise NativeBuildError(f"{shlex.join(command)} left no readable output: {error}") from None
        if sys.platform.startswith("linux") and not data.startswith(b"\x7fELF") or not data:
            raise NativeBuildError(f"{shlex.join(command)} exited with 0 but wrote no shared object "
                                   f"({len(data)} bytes)")
        try:
            os.chmod(tmp, 0o700)
            private_io.write_private(_digest_path(path), (_record(data) + "\n").encode())
            os.replace(tmp, path)  # atomic: a concurrent builder's file may win; its digest is checked on load
        except OSError as error:
            raise NativeBuildError(f"cannot install {path}: {error.strerror or error}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def _import(path: Path, origin: Path) -> ModuleType:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("tilejit.runtime._launch", str(path))
    spec = importlib.util.spec_from_file_location("tilejit.runtime._launch", path, loader=loader)
    if spec is None:
        raise NativeBuildError(f"cannot import {origin}")
    try:
        module = importlib.util.module_from_spec(spec)  # dlopen, then the module's init function
        loader.exec_module(module)
    except Exception as error:  # ImportError from dlopen, or whatever a foreign init function raises
        raise NativeBuildError(f"cannot import {origin}: {type(error).__name__}: {error}") from None
    return module
