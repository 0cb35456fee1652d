"""Loading cubins and launching kernels with the CUDA driver API.

torch owns the CUDA contexts: tilejit loads modules into the primary context torch created for a device and
launches on torch's streams, so kernels interleave with torch ops and CUDA graph capture. The driver is reached
through ctypes (``libcuda.py``): importing cuda.bindings' driver module would cost a fresh process more than
its whole budget for the first launch from a disk-cache hit. Nothing here touches the GPU at import time.

Launches normally go through the compiled launcher (``runtime/_launch.c``); this module's ``Launcher`` is the
Python path: the first launch of each specialization, and every launch where the compiled launcher cannot be
built. It does the least per call: parameters live in a preallocated buffer described by a ``struct.Struct``
(one ``pack_into`` fills them all), the ``void*[]`` array of their addresses is built once, and the call is one
``cuLaunchKernel``. The buffer is per thread (created on a thread's first launch): cuLaunchKernel releases the
GIL, so with one shared buffer a second thread could overwrite the parameters between the first thread's pack
and launch. Two ways to make that call are kept (see ``LAUNCH_IMPLS``): ctypes on ``libcuda.so.1`` (the
default: no cuda.bindings import) and cuda.bindings' ``cuLaunchKernel``.
"""
from __future__ import annotations

import ctypes
import functools
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from tilejit.errors import BackendUnavailableError, LaunchError

from . import libcuda

PARAM_KINDS = ("ptr", "i64", "i32", "f32", "tmap")
# struct code, size, alignment of each kernel-parameter kind as the kernel sees it.
_PARAM_LAYOUT: dict[str, tuple[str, int, int]] = {
    "ptr": ("Q", 8, 8),
    "i64": ("q", 8, 8),
    "i32": ("i", 4, 4),
    "f32": ("f", 4, 4),
    "tmap": ("128s", 128, 64),  # CUtensorMap, passed by value (const __grid_constant__)
}
_DEFAULT_SMEM_LIMIT = 48 * 1024  # above this a kernel must opt in (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)

LAUNCH_IMPLS = ("ctypes", "bindings")
# Measured on an H200 (driver 580, cuda-bindings 13.3, torch 2.11), 14 params (8 ptr, 2 i64, 2 i32, 2 f32),
# host time per launch, median of 7 x 20k: "bindings" 4.5 us, "ctypes" 5.5-5.8 us. ctypes is the default all
# the same: it spares the ~16 ms import of cuda.bindings.driver on a first launch, and the hot path is the
# compiled launcher, not this one.
DEFAULT_LAUNCH_IMPL = "ctypes"


@functools.cache
def _driver() -> ModuleType:
    """cuda.bindings' driver module, for the "bindings" launch impl only."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6
        except ImportError as exc:
            raise BackendUnavailableError(
                "the 'bindings' launch impl needs the CUDA driver bindings: `pip install 'cuda-python>=12.8'`"
            ) from exc
    return driver


_contexts: dict[int, int] = {}  # device index -> torch's primary CUcontext (fixed for the process's life)


def ensure_torch_context(device_index: int) -> int:
    """Make torch create its primary context on ``device_index`` and return it (a ``CUcontext`` handle).

    Does not change torch's current device for the caller: the device is selected only inside a
    ``torch.cuda.device`` block, where a one-element allocation forces the lazily created context to exist.
    """
    ctx = _contexts.get(device_index)
    if ctx is not None:
        return ctx
    import torch

    if not torch.cuda.is_available():
        raise LaunchError("no CUDA GPU is visible to torch (torch.cuda.is_available() is False)")
    count = torch.cuda.device_count()
    if not 0 <= device_index < count:
        raise LaunchError(f"CUDA device index {device_index} out of range: torch sees {count} device(s)")
    with torch.cuda.device(device_index):
        torch.empty(1, device=f"cuda:{device_index}")
        ctx = libcuda.current_context()
    if not ctx:
        raise LaunchError(f"torch did not make a CUDA context current for device {device_index}")
    _contexts[device_index] = ctx
    return ctx


_ContextPushed = libcuda.ContextPushed


@dataclass(frozen=True)
class KernelAttributes:
    """What the driver reports about a loaded kernel (cuFuncGetAttribute)."""

    num_regs: int
    local_bytes: int  # per-thread local memory: > 0 usually means register spills
    static_smem_bytes: int
    max_threads_per_block: int
    max_smem_optin_bytes: int  # the device's per-block opt-in shared memory limit


class LoadedKernel:
    """A kernel function in a module loaded into torch's primary context of one device."""

    def __init__(self, name: str, device_index: int, context: Any, module: Any, function: Any,
                 attributes: KernelAttributes) -> None:
        self.name = name
        self.device_index = device_index
        self.context = context
        self.module = module
        self.function = function
        self.attributes = attributes
        self.dynamic_smem_limit = _DEFAULT_SMEM_LIMIT - attributes.static_smem_bytes

    def reserve_dynamic_smem(self, nbytes: int) -> None:
        """Allow launches with ``nbytes`` of dynamic shared memory (opting in above 48 KiB)."""
        if nbytes <= self.dynamic_smem_limit:
            return
        static = self.attributes.static_smem_bytes
        available = self.attributes.max_smem_optin_bytes
        if static + nbytes > available:
            raise LaunchError(
                f"kernel {self.name!r} needs {static + nbytes} bytes of shared memory per block ({static} static + "
                f"{nbytes} dynamic) but device {self.device_index} allows at most {available} "
                "(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN); use fewer stages or smaller tiles"
            )
        with _ContextPushed(self.context):
            libcuda.check(libcuda.function("cuFuncSetAttribute")(
                self.function, libcuda.FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
                f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) for {self.name!r}")
        self.dynamic_smem_limit = nbytes

    def blocks_per_sm(self, threads: int, dynamic_smem_bytes: int) -> int:
        """How many blocks of ``threads`` threads and ``dynamic_smem_bytes`` of dynamic shared memory one SM holds at
        once (cuOccupancyMaxActiveBlocksPerMultiprocessor: registers, shared memory, threads and blocks counted); 0
        where the device allows no block that much shared memory."""
        try:
            self.reserve_dynamic_smem(dynamic_smem_bytes)  # the occupancy API counts none above the kernel's limit
        except LaunchError:
            return 0
        blocks = ctypes.c_int()
        with _ContextPushed(self.context):
            libcuda.check(libcuda.function("cuOccupancyMaxActiveBlocksPerMultiprocessor")(
                ctypes.byref(blocks), self.function, threads, dynamic_smem_bytes),
                f"cuOccupancyMaxActiveBlocksPerMultiprocessor for {self.name!r}")
        return blocks.value

    def unload(self) -> None:
        """Unload the module; the kernel must not be launched afterwards."""
        if self.module is not None:
            with _ContextPushed(self.context):
                libcuda.check(libcuda.function("cuModuleUnload")(self.module), "cuModuleUnload")
            self.module = None

    def __repr__(self) -> str:
        a = self.attributes
        return (f"LoadedKernel({self.name!r}, device={self.device_index}, regs={a.num_regs}, "
                f"local_bytes={a.local_bytes}, static_smem={a.static_smem_bytes})")


def load_cubin(cubin: bytes, kernel_name: str, device_index: int, dynamic_smem_bytes: int = 0) -> LoadedKernel:
    """Load ``cubin`` into torch's context on ``device_index`` and look up ``kernel_name`` (its extern "C" name).

    Opts in to more than 48 KiB of shared memory when the kernel needs it; raises LaunchError, saying how many
    bytes were needed and how many the device has, when it cannot.
    """
    ctx = ensure_torch_context(device_index)
    with _ContextPushed(ctx):
        try:
            module = libcuda.module_load(cubin)
        except LaunchError as error:
            raise LaunchError(f"{error} (kernel {kernel_name!r})") from None
        try:
            function = libcuda.module_function(module, kernel_name)
            attributes = KernelAttributes(
                num_regs=libcuda.function_attribute(function, libcuda.FUNC_NUM_REGS),
                local_bytes=libcuda.function_attribute(function, libcuda.FUNC_LOCAL_SIZE_BYTES),
                static_smem_bytes=libcuda.function_attribute(function, libcuda.FUNC_SHARED_SIZE_BYTES),
                max_threads_per_block=libcuda.function_attribute(function, libcuda.FUNC_MAX_THREADS_PER_BLOCK),
                max_smem_optin_bytes=libcuda.current_device_attribute(
                    libcuda.DEVICE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            )
        except BaseException:
            libcuda.function("cuModuleUnload")(module)
            raise
    loaded = LoadedKernel(kernel_name, device_index, ctx, module, function, attributes)
    try:
        loaded.reserve_dynamic_smem(dynamic_smem_bytes)
    except BaseException:
        loaded.unload()
        raise
    return loaded


def param_struct(param_kinds: Sequence[str]) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packed kernel-parameter buffer of ``param_kinds`` (each at its natural alignment, as the kernel reads
    its parameters) and each parameter's byte offset in it."""
    fmt, offsets, offset = ["="], [], 0
    for kind in param_kinds:
        code, size, align = _PARAM_LAYOUT[kind]
        pad = -offset % align
        if pad:
            fmt.append(f"{pad}x")
            offset += pad
        offsets.append(offset)
        fmt.append(code)
        offset += size
    return struct.Struct("".join(fmt)), tuple(offsets)


class Launcher:
    """Launches one loaded kernel with a fixed parameter signature, block shape and dynamic shared memory.

    ``launcher(grid, stream, values)``: ``grid`` is a 3-tuple, ``stream`` a CUstream handle as an int
    (``torch.cuda.current_stream(device).cuda_stream``), ``values`` one per parameter in kernel order: ints
    (device addresses) for "ptr", ints for "i64"/"i32", floats for "f32", and for "tmap" the 128 bytes of a
    CUtensorMap (``bytes`` or a cuda.bindings ``CUtensorMap``).
    """

    def __init__(self, loaded: LoadedKernel, param_kinds: Sequence[str], block: tuple[int, int, int],
                 dynamic_smem_bytes: int, impl: str = DEFAULT_LAUNCH_IMPL, cluster_z: int = 1,
                 cluster_x: int = 1) -> None:
        if impl not in LAUNCH_IMPLS:
            raise ValueError(f"unknown launch impl {impl!r}; one of {LAUNCH_IMPLS}")
        unknown = [k for k in param_kinds if k not in _PARAM_LAYOUT]
        if unknown:
            raise ValueError(f"unknown parameter kind(s) {unknown}; known: {PARAM_KINDS}")
        if len(block) != 3 or min(block) < 1:
            raise ValueError(f"block must be 3 positive ints, got {block}")
        threads = block[0] * block[1] * block[2]
        if threads > loaded.attributes.max_threads_per_block:
            raise LaunchError(
                f"kernel {loaded.name!r} launched with {threads} threads per block but it can run at most "
                f"{loaded.attributes.max_threads_per_block} ({loaded.attributes.num_regs} registers per thread)"
            )
        loaded.reserve_dynamic_smem(dynamic_smem_bytes)
        self.loaded = loaded
        self.param_kinds = tuple(param_kinds)
        self.block = tuple(block)
        self.dynamic_smem_bytes = dynamic_smem_bytes
        self.impl = impl
        self.cluster_z = cluster_z  # programs per user program along z (split-K clusters; 1 = none)
        # programs per cluster along x (TMA multicast pairs), launched so when the grid's x extent is a multiple
        self.cluster_x = cluster_x

        self._struct, self._offsets = param_struct(self.param_kinds)
        self._per_thread = threading.local()
        self._tmap_positions = tuple(i for i, k in enumerate(self.param_kinds) if k == "tmap")
        self.launch = self._build_launch(loaded, impl)
        self._native_entries: dict[Any, Any] = {}

    def _thread_buffer(self) -> tuple[Any, int]:
        """This thread's (parameter buffer, address of its ``void*[]``), made on the thread's first launch."""
        per_thread = self._per_thread
        slot = getattr(per_thread, "slot", None)
        if slot is None:
            buffer = ctypes.create_string_buffer(max(self._struct.size, 1))
            base = ctypes.addressof(buffer)
            # Kept alive with the thread's slot: the driver reads the array through a bare address.
            per_thread.pointers = (ctypes.c_void_p * max(len(self._offsets), 1))(*[base + o for o in self._offsets])
            slot = per_thread.slot = (buffer, ctypes.addressof(per_thread.pointers))
        return slot

    @property
    def _pointers(self) -> Any:
        """The calling thread's ``void*[]`` of parameter addresses (for tests and debugging)."""
        self._thread_buffer()
        return self._per_thread.pointers

    def _build_launch(self, loaded: LoadedKernel, impl: str) -> Callable[[tuple[int, int, int], int, Sequence[Any]], None]:
        """The per-call path as one closure over locals (no attribute lookups beyond the thread's buffer, no
        extra frames)."""
        pack_into, per_thread, thread_buffer = self._struct.pack_into, self._per_thread, self._thread_buffer
        bx, by, bz = self.block
        smem = self.dynamic_smem_bytes
        if impl == "bindings":
            drv = _driver()
            cu_function = getattr(drv, "CUfunction", None)
            function = cu_function(loaded.function) if cu_function and loaded.function is not None else loaded.function
            cu_launch = drv.cuLaunchKernel

            def raw(gx: int, gy: int, gz: int, stream: int, params: int) -> Any:
                return cu_launch(function, gx, gy, gz, bx, by, bz, smem, stream, params, 0)[0]
        else:
            handle = loaded.function
            try:
                cu_launch = libcuda.function("cuLaunchKernel")
            except BackendUnavailableError as missing:  # no driver: a launcher can be built, not launched
                def cu_launch(*args: Any, _missing: Exception = missing) -> int:
                    raise _missing

            def raw(gx: int, gy: int, gz: int, stream: int, params: int) -> Any:
                return cu_launch(handle, gx, gy, gz, bx, by, bz, smem, stream, params, None)
        if self.cluster_x > 1:
            raw = self._cluster_launch(loaded, raw)
        self._raw_launch = raw
        to_bytes = self._tensor_maps_as_bytes if self._tmap_positions else None
        cluster_z = self.cluster_z

        def launch(grid: tuple[int, int, int], stream: int, values: Sequence[Any]) -> None:
            if to_bytes is not None:
                values = to_bytes(values)
            if cluster_z != 1:
                grid = (grid[0], grid[1], grid[2] * cluster_z)
                if grid[2] > 65535:
                    raise LaunchError(f"kernel {loaded.name!r}: grid z {grid[2] // cluster_z} x split_k {cluster_z} "
                                      "exceeds CUDA's 65535; use a smaller split_k or fewer programs along z")
            try:
                buffer, params = per_thread.slot
            except AttributeError:
                buffer, params = thread_buffer()
            try:
                pack_into(buffer, 0, *values)
            except struct.error as exc:
                raise self._bad_values(values, exc) from None
            err = raw(grid[0], grid[1], grid[2], stream, params)
            if err:
                self._recover(err, grid, stream, params)

        return launch

    def _cluster_launch(self, loaded: LoadedKernel, plain: Callable[..., Any]) -> Callable[..., Any]:
        """``raw`` for a kernel compiled for TMA multicast clusters along x: a grid whose x extent is a multiple of
        the cluster runs in clusters (cuLaunchKernelEx with the cluster shape), another without (the kernel reads
        its cluster size at run time)."""
        per = self.cluster_x
        try:
            launch_ex = libcuda.function("cuLaunchKernelEx")
        except BackendUnavailableError as missing:
            def launch_ex(*args: Any, _missing: Exception = missing) -> int:
                raise _missing
        block, smem, handle = self.block, self.dynamic_smem_bytes, loaded.function
        per_thread = threading.local()  # each thread's CUlaunchConfig (its grid and stream change per launch)

        def raw(gx: int, gy: int, gz: int, stream: int, params: int) -> Any:
            if gx % per:
                return plain(gx, gy, gz, stream, params)
            config = getattr(per_thread, "config", None)
            if config is None:
                config = per_thread.config = libcuda.cluster_launch_config(block, smem, (per, 1, 1))
            config.grid[0], config.grid[1], config.grid[2] = gx, gy, gz
            config.stream = stream
            return launch_ex(ctypes.addressof(config), handle, params, None)
        return raw

    def native_entry(self, tmaps: Callable[[Sequence[Any]], list[bytes]] | None = None,
                     fallback: Callable[..., None] | None = None) -> Any:
        """This launcher as an Entry of the compiled launcher (``runtime/_launch.c``), made once; None when that
        launcher is unavailable. ``fallback`` (default: this launcher) runs a launch the driver refused, so
        tilejit's context retry and errors apply."""
        entry = self._native_entries.get(tmaps)
        if entry is None:
            from ..runtime import native

            module = native.load()
            if module is None:
                return None
            kinds = bytes(native.KIND_CODES[k] for k in self.param_kinds)
            entry = module.Entry(int(self.loaded.function), self.block, self.dynamic_smem_bytes, kinds,
                                 self.loaded.device_index, tmaps, fallback or self, self.cluster_z, self.cluster_x)
            self._native_entries[tmaps] = entry
        return entry

    def __call__(self, grid: tuple[int, int, int], stream: int, values: Sequence[Any]) -> None:
        """Launch on ``stream`` (an int handle). Hot callers may hold ``self.launch`` instead (same thing, one
        call frame less)."""
        self.launch(grid, stream, values)

    def _tensor_maps_as_bytes(self, values: Sequence[Any]) -> list[Any]:
        values = list(values)
        for i in self._tmap_positions:
            v = values[i]
            if not isinstance(v, (bytes, bytearray, memoryview)):
                values[i] = ctypes.string_at(v.getPtr(), 128)  # cuda.bindings CUtensorMap
        return values

    def _bad_values(self, values: Sequence[Any], exc: Exception) -> LaunchError:
        if len(values) != len(self.param_kinds):
            return LaunchError(f"kernel {self.loaded.name!r} takes {len(self.param_kinds)} parameters "
                               f"{list(self.param_kinds)}, got {len(values)} values")
        for i, (kind, v) in enumerate(zip(self.param_kinds, values)):
            try:
                struct.pack("=" + _PARAM_LAYOUT[kind][0], v)
            except struct.error as e:
                return LaunchError(f"kernel {self.loaded.name!r} parameter {i} ({kind}): cannot pass {v!r}: {e}")
        return LaunchError(f"kernel {self.loaded.name!r}: cannot pack parameters: {exc}")

    def _recover(self, err: int, grid: tuple[int, int, int], stream: int, params: int) -> None:
        """A failed launch: retry once with the kernel's own context current (the caller's thread may have
        another device's context current, or none), else raise LaunchError naming the error."""
        if libcuda.adopt_if_none(self.loaded.context):
            err = self._raw_launch(*grid, stream, params)
            if not err:
                return
        elif libcuda.current_context() != self.loaded.context:
            with _ContextPushed(self.loaded.context):
                err = self._raw_launch(*grid, stream, params)
            if not err:
                return
        raise LaunchError(
            f"cuLaunchKernel({self.loaded.name!r}) failed: {libcuda.error_name(int(err))}; grid={tuple(grid)}, "
            f"block={self.block}, dynamic_smem={self.dynamic_smem_bytes}, device={self.loaded.device_index}"
        )


def make_launcher(loaded: LoadedKernel, param_kinds: Sequence[str], block: tuple[int, int, int],
                  dynamic_smem_bytes: int = 0, impl: str = DEFAULT_LAUNCH_IMPL, cluster_z: int = 1,
                  cluster_x: int = 1) -> Launcher:
    """A Launcher for ``loaded``; ``param_kinds`` from PARAM_KINDS in kernel-parameter order; ``cluster_z``
    programs launched per program of the grid along z (a kernel compiled with split_k); ``cluster_x`` programs
    per cluster along x (a kernel compiled with ``cluster``, when the grid allows)."""
    return Launcher(loaded, param_kinds, block, dynamic_smem_bytes, impl, cluster_z, cluster_x)
