"""CUDA C++ -> cubin with NVRTC, for exactly one target arch.

NVRTC comes from ``cuda.bindings.nvrtc`` (cuda-python 12.x and 13.x). The bindings' major version decides
which library is loaded: cuda-bindings 12 opens ``libnvrtc.so.12`` (pip: nvidia-cuda-nvrtc-cu12), cuda-bindings
13 opens ``libnvrtc.so.13`` (pip: nvidia-cuda-nvrtc), both found by cuda-pathfinder in site-packages or in a
CUDA toolkit. So installing cuda-bindings 13 with NVRTC 13 selects NVRTC 13 with no code here knowing.

Both NVRTC 12.9 and 13.0 return PTX from ``nvrtcGetPTX`` after compiling for a real ``sm_XX`` target, so one
compile gives cubin and PTX; the second ``compute_XX`` compile below is only a fallback for an NVRTC that does
not.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from tilejit import knobs, private_io
from tilejit.cache.layout import current_layout
from tilejit.errors import BackendCompileError, BackendUnavailableError
from tilejit.target import Arch
from tilejit.backend_cuda.headers import header_sources


# Oldest NVRTC that targets each arch (CUDA release notes); checked before NVRTC is asked, for a clear message.
_MIN_NVRTC: dict[str, tuple[int, int]] = {
    "sm_80": (11, 0),
    "sm_86": (11, 1),
    "sm_89": (11, 8),
    "sm_90a": (12, 0),
    "sm_100a": (12, 8),
    "sm_103a": (12, 9),
    "sm_120a": (12, 8),
}


@dataclass(frozen=True)
class CompileResult:
    """What NVRTC produced for one kernel source and arch."""

    cubin: bytes
    ptx: str | None
    log: str  # NVRTC's log (warnings); empty when clean
    seconds: float  # wall time of the whole compile, including a PTX-only second compile if one was needed
    arch: str
    nvrtc_version: tuple[int, int]


def _bindings_major() -> int | None:
    try:
        import cuda.bindings

        return int(str(cuda.bindings.__version__).split(".")[0])
    except Exception:
        pass
    try:
        from importlib.metadata import version

        return int(version("cuda-python").split(".")[0])
    except Exception:
        return None


def _nvrtc_package_hint() -> str:
    major = _bindings_major()
    if major is not None and major >= 13:
        return (
            f"cuda-bindings {major}.x loads libnvrtc.so.{major} (else .12): `pip install 'nvidia-cuda-nvrtc>={major}'` "
            "(or `pip install 'tilejit[cu13]'`), or put a CUDA 13 toolkit's lib64 on LD_LIBRARY_PATH"
        )
    return (
        "cuda-bindings 12.x loads libnvrtc.so.12: `pip install 'nvidia-cuda-nvrtc-cu12>=12.8'`, or put a "
        "CUDA 12 toolkit's lib64 on LD_LIBRARY_PATH"
    )


@functools.cache
def _nvrtc() -> ModuleType:
    """The NVRTC bindings module, after checking that the shared library actually loads."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # cuda-python < 12.6 spelled it this way
        except ImportError as exc:
            raise BackendUnavailableError(
                "tilejit needs NVRTC through cuda-python: `pip install 'cuda-python>=12.8' nvidia-cuda-nvrtc-cu12` "
                f"(CUDA 12) or `pip install 'tilejit[cu13]'` (CUDA 13) ({exc})"
            ) from exc
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings load the library lazily; a missing one surfaces here
        raise BackendUnavailableError(f"cannot load the NVRTC library: {exc}\nfix: {_nvrtc_package_hint()}") from exc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BackendUnavailableError(f"nvrtcVersion failed ({err}); fix: {_nvrtc_package_hint()}")
    return nvrtc


@functools.cache
def _library_version() -> tuple[int, int]:
    """(major, minor) as the loaded library reports it (loads NVRTC)."""
    _, major, minor = _nvrtc().nvrtcVersion()
    return int(major), int(minor)


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library that compile_cuda uses.

    Part of every cache key, so it is needed even when every kernel comes from the disk cache; loading NVRTC
    just to ask costs ~7 ms, so the answer is kept in ``<cache dir>/nvrtc.json`` and trusted while nothing
    that decides which library would load has changed (see ``_library_probe``).
    """
    recorded = _recorded_version()
    if recorded is not None:
        return recorded
    try:
        version = _library_version()
    except BackendUnavailableError:
        imported = imported_version()
        if imported is None:
            raise
        return imported  # no NVRTC here: the cache holds kernels an import brought, keyed by their NVRTC
    _record_version(version)
    return version


# ---- the NVRTC version record ---------------------------------------------------------------------------------

def _record_path():
    return current_layout().nvrtc_record


def _library_probe() -> dict:
    """What decides which libnvrtc the bindings load (cuda-pathfinder searches the NVIDIA wheels in
    site-packages, then conda, the loader's path and the CUDA toolkit): the bindings' version, the environment
    variables of that search, and the site-packages directories' mtimes (a ``pip install`` or uninstall adds
    or removes a dist-info directory there). Cheap: a few ``stat`` calls."""
    try:
        import cuda.bindings

        bindings = str(cuda.bindings.__version__)
    except Exception:  # noqa: BLE001 - older cuda-python: the key just omits it
        bindings = None
    sites = []
    for entry in sys.path:
        if entry.rstrip("/").endswith(("site-packages", "dist-packages")):
            try:
                sites.append([entry, os.stat(entry).st_mtime_ns])
            except OSError:
                pass
    return {"bindings": bindings, "prefix": sys.prefix, "env": knobs.cuda_library_search_env(),
            "site_packages": sites}


def _file_identity(path: str) -> list | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [path, st.st_mtime_ns, st.st_size]


def _loaded_library_path() -> str | None:
    """Where the libnvrtc this process loaded lives (None if it cannot be told)."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("nvrtc").abs_path)  # cached by pathfinder: no second load
    except Exception:  # noqa: BLE001 - bindings without pathfinder: look at the process's mappings
        pass
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libnvrtc.so" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


def _recorded_version() -> tuple[int, int] | None:
    """The version in the record, if the record describes this environment and its library is unchanged."""
    try:
        record = private_io.read_json(_record_path(), limit=1 << 16)
        version, library = record["version"], record["library"]
        if record["probe"] != _library_probe() or _file_identity(library[0]) != library:
            return None
        major, minor = version
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return (major, minor) if isinstance(major, int) and isinstance(minor, int) else None


def _record_version(version: tuple[int, int]) -> None:
    """Remember the version of the loaded library, in the cache directory as it is now (called after every
    compile, so each cache directory a process compiles into gets a record, and a wrong one is corrected).
    Nothing is written when the library cannot be identified or the directory is not writable: the next
    process then loads NVRTC to ask, as before."""
    path = _loaded_library_path()
    library = _file_identity(path) if path else None
    if library is None:
        return
    record = {"version": list(version), "library": library, "probe": _library_probe()}
    target = _record_path()
    try:
        if private_io.read_json(target, limit=1 << 16) == record:
            return
    except (OSError, ValueError):
        pass
    if hasattr(nvrtc_version, "cache_clear"):  # (tests may have replaced it)
        nvrtc_version.cache_clear()  # in case this process trusted an out-of-date record: the real one from now
    try:
        private_io.make_private_root(target.parent)
        private_io.write_private(target, (json.dumps(record, sort_keys=True) + "\n").encode())
    except OSError:
        pass


# ---- kernels built elsewhere ----------------------------------------------------------------------------------

def _imported_record_path():
    return current_layout().nvrtc_record.with_name("nvrtc-imported.json")


def record_imported_versions(versions) -> None:
    """Remember the NVRTC versions ("major.minor") that built the kernels ``tilejit cache import`` stored, so a
    process that cannot load NVRTC at all keys its lookups as those kernels were keyed (see imported_version).
    Merged with the versions already recorded; nothing is written when the directory is not writable."""
    recorded = set(_imported_versions())
    known = recorded | {parsed for parsed in map(_parse_version, versions) if parsed is not None}
    if known == recorded:
        return
    target = _imported_record_path()
    try:
        private_io.make_private_root(target.parent)
        private_io.write_private(target, (json.dumps({"versions": sorted(list(v) for v in known)}) + "\n").encode())
    except OSError:
        pass


def imported_version() -> tuple[int, int] | None:
    """The newest NVRTC version that built imported kernels (None when nothing was imported). Used only when
    NVRTC cannot be loaded: the cache keys of those kernels name it, and nothing can be compiled anyway."""
    versions = _imported_versions()
    return max(versions) if versions else None


def _imported_versions() -> list[tuple[int, int]]:
    try:
        listed = private_io.read_json(_imported_record_path(), limit=1 << 16)["versions"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(listed, list):
        return []
    return [tuple(v) for v in listed
            if isinstance(v, list) and len(v) == 2 and all(type(n) is int and 0 <= n < 1000 for n in v)]


def _parse_version(text) -> tuple[int, int] | None:
    match = re.fullmatch(r"(\d{1,3})\.(\d{1,3})", text) if isinstance(text, str) else None
    return (int(match[1]), int(match[2])) if match else None


@functools.cache
def _nvrtc_arch_numbers() -> frozenset[int]:
    """SM numbers this NVRTC can target (nvrtcGetSupportedArchs: 80, 86, 90, 100, ...)."""
    nvrtc = _nvrtc()
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
    except AttributeError:
        return frozenset()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return frozenset()
    return frozenset(int(a) for a in archs)


def check_arch_supported_by_nvrtc(arch: str) -> None:
    """Raise BackendUnavailableError if the installed NVRTC cannot target ``arch`` (already normalized)."""
    have = nvrtc_version()
    need = _MIN_NVRTC[arch]
    if have < need:
        # nvrtc.json may be out of date or damaged: a refusal is decided by the loaded library itself.
        have = _library_version()
        if have >= need:
            _record_version(have)
    number = int(re.sub(r"\D", "", arch))
    numbers = _nvrtc_arch_numbers()
    if have < need or (numbers and number not in numbers):
        raise BackendUnavailableError(
            f"{arch} needs NVRTC >= {need[0]}.{need[1]} that lists it; the installed NVRTC is {have[0]}.{have[1]}"
            f" (targets: {', '.join(f'sm_{n}' for n in sorted(numbers)) or 'unknown'}). fix: {_nvrtc_package_hint()}"
        )


def nvrtc_supports(arch: str) -> bool:
    """Whether the installed NVRTC can compile for ``arch`` (False for unknown archs)."""
    try:
        check_arch_supported_by_nvrtc(Arch.parse(arch).name)
    except (ValueError, BackendUnavailableError):
        return False
    return True


def _write_failed_source(source: str, name: str) -> str | None:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "kernel"
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"tilejit-{stem}-", suffix=".cu", delete=False, encoding="utf-8"
        ) as f:
            f.write(source)
            return f.name
    except OSError:
        return None


def _program_log(nvrtc: ModuleType, prog: object) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode("utf-8", errors="replace")


def _run_nvrtc(
    source: str, name: str, arch: str, options: list[str], *, want_cubin: bool, want_ptx: bool, tag: str = ""
) -> tuple[bytes, str | None, str]:
    """One NVRTC compile -> (cubin, ptx or None, log). Raises BackendCompileError on any failure."""
    nvrtc = _nvrtc()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS

    def fail(log: str) -> BackendCompileError:
        return BackendCompileError(log, arch=arch, source=source, source_path=_write_failed_source(source, name), name=name)

    program = source + _tag_line(tag)  # (errors show the source as given)
    # tilejit's headers go with the program, so `#include "tilejit/<name>.cuh"` reads the very files the cache key
    # hashes, from wherever the package is installed
    headers = header_sources()
    err, prog = nvrtc.nvrtcCreateProgram(program.encode("utf-8"), f"{name}.cu".encode(), len(headers),
                                         [text.encode("utf-8") for text in headers.values()],
                                         [include.encode() for include in headers])
    if err != ok:
        raise fail(f"nvrtcCreateProgram failed: {_error_string(nvrtc, err)}")
    try:
        encoded = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _program_log(nvrtc, prog)
        if err != ok:
            options_text = " ".join(options)
            raise fail(f"{log.rstrip()}\n({_error_string(nvrtc, err)}; options: {options_text})".lstrip())
        cubin = b""
        if want_cubin:
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            if err != ok:
                raise fail(f"nvrtcGetCUBINSize failed: {_error_string(nvrtc, err)}")
            if size:
                buf = b" " * size
                (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
                if err != ok:
                    raise fail(f"nvrtcGetCUBIN failed: {_error_string(nvrtc, err)}")
                cubin = buf
        ptx = None
        if want_ptx:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            if err == ok and size > 1:
                buf = b" " * size
                (err,) = nvrtc.nvrtcGetPTX(prog, buf)
                if err == ok:
                    ptx = buf.rstrip(b"\x00").decode("utf-8", errors="replace")
        return cubin, ptx, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _error_string(nvrtc: ModuleType, err: object) -> str:
    try:
        text = nvrtc.nvrtcGetErrorString(err)[1]
        return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        return str(err)


def _tag_line(tag: str) -> str:
    """A line that makes programs of different ``tag`` different programs to NVRTC, so each runs ptxas.

    NVRTC 12.9+ keeps compiled programs in a cache of its own (NVRTC guide, "Caching"). A hit returns the cubin
    with a log that lacks ptxas's report (registers, spills), which tilejit records with each kernel and which
    the autotuner uses to refuse spilling configs; two specializations of one kernel often have the same CUDA.
    Measured on an H100 with NVRTC 13.0: a repeated compile took 0.03 s instead of 0.65 s and its log had no
    spill line; a comment, an unused macro or a ``static_assert`` did not make the program new to it, a global
    variable of its own did. The variable (4 bytes of global memory, never touched) is named after the tag (the
    cache key), so a specialization compiled again gives the same cubin; it goes after the last line, so the line
    numbers of NVRTC's diagnostics still match the source."""
    import hashlib

    return f"\n__device__ int tj_tag_{hashlib.sha256(tag.encode()).hexdigest()[:24]};\n" if tag else ""


#: ptxas -v's per-kernel line ("Used 128 registers, ..."): present in every log of a compile ptxas really ran
_PTXAS_REPORT = re.compile(r"Used \d+ registers")


def compile_cuda(
    source: str, *, name: str, arch: str, keep_ptx: bool = True, options: Sequence[str] = (), tag: str = ""
) -> CompileResult:
    """Compile CUDA C++ (which may include tilejit's headers, ``#include "tilejit/prelude.cuh"``; nothing else is
    on the include path) to a cubin for exactly ``arch``.

    Options always given: ``--gpu-architecture=<arch>`` (a real target, so NVRTC emits SASS), ``-std=c++17``,
    ``-lineinfo``; ``options`` are appended. Raises ValueError for an arch tilejit does not support,
    BackendUnavailableError when NVRTC is missing or too old for it, BackendCompileError (with NVRTC's log and
    the path of a temp file holding ``source``) when compilation fails.
    """
    arch = Arch.parse(arch).name
    check_arch_supported_by_nvrtc(arch)
    common = ["-std=c++17", "-lineinfo", *options]
    start = time.perf_counter()
    cubin, ptx, log = _run_nvrtc(
        source, name, arch, [f"--gpu-architecture={arch}", *common], want_cubin=True, want_ptx=keep_ptx, tag=tag
    )
    if "--ptxas-options=-v" in options and not _PTXAS_REPORT.search(log):
        # NVRTC 13 answered from its own cache (this program was compiled before: a cleared tilejit cache, another
        # process compiling the same kernel), and its log lacks ptxas's report: once more, as a program new to it
        cubin, ptx, log = _run_nvrtc(
            source, name, arch, [f"--gpu-architecture={arch}", *common], want_cubin=True, want_ptx=keep_ptx,
            tag=f"{tag}:{uuid.uuid4().hex}")
    if not cubin:
        raise BackendCompileError(
            f"NVRTC produced no cubin for {arch}\n{log}".rstrip(),
            arch=arch, source=source, source_path=_write_failed_source(source, name), name=name,
        )
    if keep_ptx and ptx is None:  # fallback; NVRTC 12.9/13.0 return PTX for sm_XX compiles already
        virtual = arch.replace("sm_", "compute_")
        _, ptx, _ = _run_nvrtc(
            source, name, arch, [f"--gpu-architecture={virtual}", *common], want_cubin=False, want_ptx=True, tag=tag
        )
    seconds = time.perf_counter() - start
    _record_version(_library_version())
    return CompileResult(
        cubin=cubin,
        ptx=ptx,
        log=log,
        seconds=seconds,
        arch=arch,
        nvrtc_version=_library_version(),
    )
