"""Every environment variable tilejit reads, in one place.

Each knob is read when asked for (not at import), so tests can monkeypatch ``os.environ``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from .errors import UsageValueError, full_traceback as _full_traceback


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _refuse(name: str, value: str, accepts: str) -> Exception:
    """The error for a knob set to a value it does not take: names the variable, the value and what it takes."""
    return UsageValueError(f"environment variable {name}={value!r} is not valid: it takes {accepts} (or unset it)")


def _boolean(name: str, default: bool, true: tuple[str, ...] = _TRUE, false: tuple[str, ...] = _FALSE) -> bool:
    """A boolean knob: unset or empty gives ``default``; any other value must be one of ``true`` or ``false``
    (case-insensitive), never silently taken as either."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in true:
        return True
    if value in false:
        return False
    raise _refuse(name, raw, f"{'/'.join(true)} to turn it on or {'/'.join(false)} to turn it off "
                             "(case-insensitive)")


def _flag(name: str) -> bool:
    """A knob that is off unless set to 1, true, yes or on."""
    return _boolean(name, False)


def _on_unless_off(name: str) -> bool:
    """A knob that is on unless set to 0, false, no or off."""
    return _boolean(name, True)


def interpret() -> bool:
    """TILEJIT_INTERPRET=1: run kernels through the IR interpreter on CPU tensors."""
    return _flag("TILEJIT_INTERPRET")


def full_traceback() -> bool:
    """TILEJIT_TRACEBACK=full: keep tilejit's internal frames in the tracebacks of user errors (read by
    ``errors.full_traceback``, where errors are shown: this module builds its own errors from that one)."""
    return _full_traceback()


def always_compile() -> bool:
    """TILEJIT_ALWAYS_COMPILE=1: never read the disk cache (entries are still written)."""
    return _flag("TILEJIT_ALWAYS_COMPILE")


def autotune_enabled() -> bool:
    """TILEJIT_AUTOTUNE=0: skip timing and use the first config."""
    return _on_unless_off("TILEJIT_AUTOTUNE")


def cache_dir() -> Path:
    """TILEJIT_CACHE_DIR, else the platform's user cache directory (~/.cache/tilejit on Linux)."""
    explicit = os.environ.get("TILEJIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tilejit"


def dump_ir() -> bool:
    """TILEJIT_DUMP_IR=1: print the IR after every pass to stderr."""
    return _flag("TILEJIT_DUMP_IR")


def keep_ptx() -> bool:
    """TILEJIT_KEEP_PTX=0 drops the PTX from cache entries (kept by default)."""
    return _on_unless_off("TILEJIT_KEEP_PTX")


def arch_override() -> str | None:
    """TILEJIT_ARCH=sm_90a: the arch to compile for when none is given (default: the GPU's own). A GPU only
    loads cubins built for its own major arch, so this mostly serves compile-only use."""
    value = os.environ.get("TILEJIT_ARCH", "").strip()
    return value or None


def gemm_lowering() -> str | None:
    """TILEJIT_GEMM_LOWERING=<name>: every gemm must take this lowering of the dispatch registry (e.g.
    ``mma_sync_m16n8k16`` to measure the sm_80 path on an H100, ``tcgen05_mma_f16``); a gemm it does not fit
    is a DispatchError saying why. A lowering's form reading operand A from registers (``register_a_of``: e.g.
    ``mma_sync_rs_m16n8k16`` of ``mma_sync_m16n8k16``) counts as that lowering. Part of the cache key."""
    value = os.environ.get("TILEJIT_GEMM_LOWERING", "").strip()
    return value or None


def copy_lowering() -> str | None:
    """TILEJIT_COPY_LOWERING=<name>: every global -> shared load must take this lowering of the dispatch registry
    (``cp_async`` or ``tma_bulk_tensor``); with ``TILEJIT_GEMM_LOWERING=mma_sync_m16n8k16`` and ``cp_async`` an
    sm_90a compile runs the sm_80 path whole (cp.async ring, ldmatrix, mma.sync) on an H100. A load it does not
    fit (TMA for a load no pipelined loop prefetches) is a DispatchError saying why. Part of the cache key."""
    value = os.environ.get("TILEJIT_COPY_LOWERING", "").strip()
    return value or None


def codegen_pins() -> str:
    """The knobs above that change the generated code, as text for the cache key and the autotuner's key ("" when
    none is set): ``:gemm=<name>``, ``:copy=<name>``, ``:no-mma-overlap``, ``:single-casts``."""
    gemm, copy = gemm_lowering(), copy_lowering()
    return ((f":gemm={gemm}" if gemm else "") + (f":copy={copy}" if copy else "")
            + ("" if mma_overlap() else ":no-mma-overlap") + ("" if paired_casts() else ":single-casts"))


#: The environment variables ``codegen_pins`` reads (the autotuner's per-launch key reads them raw).
CODEGEN_PIN_VARIABLES = ("TILEJIT_GEMM_LOWERING", "TILEJIT_COPY_LOWERING", "TILEJIT_MMA_OVERLAP",
                         "TILEJIT_PAIRED_CASTS")


def mma_overlap() -> bool:
    """TILEJIT_MMA_OVERLAP=0: keep each gemm's work in its own loop iteration: no deferred last gemm in
    warp-specialized loops (``passes.warp_specialize.deferred_gemm``), no mma.sync fragments carried into the next
    iteration (``backend_cuda.lower_loops.FragmentCarry``); for measuring what the overlap is worth. Part of the
    cache key."""
    return _on_unless_off("TILEJIT_MMA_OVERLAP")


def paired_casts() -> bool:
    """TILEJIT_PAIRED_CASTS=0: cast a register tile from float32 to fp16/bf16 one register at a time instead of two
    per packed conversion (``backend_cuda.emitter``); the same values, for measuring the generated code's
    difference. Part of the cache key."""
    return _on_unless_off("TILEJIT_PAIRED_CASTS")


def launch_model() -> bool:
    """TILEJIT_LAUNCH_MODEL=0: a launch that leaves its pipeline unsaid (no ``num_stages``) gets the fixed defaults
    (3 stages, no warp specialization, not persistent) instead of what ``passes.launch_model`` chooses; for
    comparing the two (``python -m benchmarks.launch_model``)."""
    return _on_unless_off("TILEJIT_LAUNCH_MODEL")


def compile_workers() -> int:
    """TILEJIT_COMPILE_WORKERS: processes used to compile autotune configs (default: all cores)."""
    raw = os.environ.get("TILEJIT_COMPILE_WORKERS", "")
    if raw.strip():
        try:
            workers = int(raw.strip())
        except ValueError:
            workers = 0
        if workers < 1:
            raise _refuse("TILEJIT_COMPILE_WORKERS", raw, "a whole number of processes, 1 or more")
        return workers
    return max(1, os.cpu_count() or 1)


def lock_timeout_s() -> float:
    """TILEJIT_LOCK_TIMEOUT: seconds to wait for another process compiling the same entry (default 600; ``inf``
    waits for ever)."""
    raw = os.environ.get("TILEJIT_LOCK_TIMEOUT", "")
    if not raw.strip():
        return 600.0
    try:
        seconds = float(raw.strip())
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # (NaN too)
        raise _refuse("TILEJIT_LOCK_TIMEOUT", raw, "a number of seconds, 0 or more (e.g. 600, or inf)")
    return seconds


def cuda_library_search_env() -> dict[str, str | None]:
    """LD_LIBRARY_PATH, CONDA_PREFIX, CUDA_PATH, CUDA_HOME: not tilejit's, but they steer which CUDA libraries
    load, so the NVRTC version record is trusted only while they are unchanged."""
    return {name: os.environ.get(name) for name in ("LD_LIBRARY_PATH", "CONDA_PREFIX", "CUDA_PATH", "CUDA_HOME")}


def native_launch() -> bool:
    """TILEJIT_NATIVE_LAUNCH=0: launch through the pure-Python path instead of the compiled launcher."""
    return _on_unless_off("TILEJIT_NATIVE_LAUNCH")


def c_compiler() -> str | None:
    """CC: not tilejit's, but the C compiler that builds the native launcher when set (else Python's own, else
    ``cc``)."""
    value = os.environ.get("CC", "").strip()
    return value or None


def remote_cache_url() -> str | None:
    """TILEJIT_REMOTE_CACHE=redis://host:port/db: a remote kernel and autotune cache shared by many machines
    (``cache/remote.py``); unset (the default), nothing but the local cache is used."""
    value = os.environ.get("TILEJIT_REMOTE_CACHE", "").strip()
    return value or None


def remote_cache_key_file() -> Path | None:
    """TILEJIT_REMOTE_CACHE_KEY: the file holding the secret that signs and checks every remote cache value
    (HMAC-SHA256); it must be private to the user. Without it the remote cache is not used."""
    value = os.environ.get("TILEJIT_REMOTE_CACHE_KEY", "").strip()
    return Path(value).expanduser() if value else None
