"""Compiling a specialization (through the disk cache) and launching it on torch tensors."""
from __future__ import annotations

import platform
import threading
from typing import Any

from .. import knobs
from ..cache import CacheEntry, KernelCache

_cache_lock = threading.Lock()
_default_cache: KernelCache | None = None


def default_cache() -> KernelCache:
    """The process's kernel cache (at knobs.cache_dir() as it was on first use)."""
    global _default_cache
    with _cache_lock:
        if _default_cache is None or _default_cache.root != knobs.cache_dir():
            _default_cache = KernelCache()
        return _default_cache


class Asm:
    """The artifacts of a compiled kernel: ``ir``, ``cuda``, ``ptx``, ``cubin`` and (when a
    disassembler is found) ``sass``; read from the cache entry on first access."""

    _FILES = {"ir": "kernel.ir", "cuda": "kernel.cu", "ptx": "kernel.ptx", "cubin": "kernel.cubin",
              "sass": "kernel.sass"}

    def __init__(self, entry: CacheEntry) -> None:
        self._entry = entry
        self._values: dict[str, Any] = {}

    def keys(self) -> list[str]:
        return ["ir", "cuda", "ptx", "cubin", "sass"]

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __getitem__(self, key: str) -> Any:
        if key not in self._FILES:
            raise KeyError(key)
        if key not in self._values:
            self._values[key] = self._read(key)
        if self._values[key] is None:
            raise KeyError(f"{key} is not available for this kernel")
        return self._values[key]

    def _read(self, key: str) -> Any:
        name = self._FILES[key]
        try:
            data = self._entry.read(name)
        except (FileNotFoundError, KeyError, OSError):
            data = None
        if key == "sass" and data is None:
            from .sass import disassemble

            return disassemble(self._entry.read("kernel.cubin"))
        if data is None:
            return None
        return data if key == "cubin" else data.decode()


class CompiledKernel:
    """One specialization compiled for one arch: its cache entry, launch facts and per-device launchers."""

    def __init__(self, entry: CacheEntry, from_disk: bool) -> None:
        self.entry = entry
        self.key = entry.key
        self.meta = entry.meta
        self.name = self.meta["kernel_symbol"]
        self.arch = self.meta["arch"]
        self.param_kinds = list(self.meta["param_kinds"])
        self.shared_bytes = int(self.meta["shared_bytes"])
        self.threads = int(self.meta["threads"])
        self.from_disk = from_disk
        self.asm = Asm(entry)
        self._launchers: dict[int, Any] = {}
        self._lock = threading.Lock()

    def launcher(self, device_index: int):
        launcher = self._launchers.get(device_index)
        if launcher is None:
            from .driver import load_cubin, make_launcher

            with self._lock:
                launcher = self._launchers.get(device_index)
                if launcher is None:
                    loaded = load_cubin(self.entry.binary, self.name, device_index, self.shared_bytes)
                    launcher = make_launcher(loaded, self.param_kinds, (self.threads, 1, 1), self.shared_bytes)
                    maps = self.meta.get("tensor_maps") or []
                    if maps:
                        launcher = _with_tensor_maps(launcher, maps, self.meta["value_layout"])
                    self._launchers[device_index] = launcher
        return launcher

    def __repr__(self) -> str:
        return f"<CompiledKernel {self.meta.get('kernel')} {self.arch} key={self.key[:12]}>"


def _with_tensor_maps(launcher, maps: list[dict], layout: dict[str, list[int]]) -> "TensorMapLauncher":
    from .tma import TensorMapPacker

    return TensorMapLauncher(launcher, TensorMapPacker(maps, {name: (start, rank) for name, (start, rank) in
                                                              layout.items()}))


class TensorMapLauncher:
    """A launcher that appends the kernel's CUtensorMaps (encoded, or found in the cache) to the values."""

    def __init__(self, launcher, packer) -> None:
        self.launcher = launcher
        self.packer = packer

    def __call__(self, grid, stream, values) -> None:
        self.launcher(grid, stream, self.packer(values))

    def native_entry(self):
        """The compiled launcher's Entry: the plain kernel's, with the maps computed by the packer."""
        return self.launcher.native_entry(tmaps=self.packer.maps, fallback=self)


def value_layout(call) -> dict[str, list[int]]:
    """Where each tensor argument's pointer, sizes and strides sit in the packed values: [start, rank]."""
    layout, at = {}, 0
    for name, spec in call.specs.items():
        kind = type(spec).__name__
        if kind == "TensorSpec":
            layout[name] = [at, spec.rank]
            at += 1 + 2 * spec.rank
        elif kind == "ScalarSpec":
            at += 1
    return layout


def _versions() -> dict[str, str]:
    from ..backend_cuda.nvrtc import nvrtc_version
    from .jit import __version__

    major, minor = nvrtc_version()
    return {"tilejit": __version__, "nvrtc": f"{major}.{minor}", "python": platform.python_version()}


def resolve_arch(arch: str | None, device_index: int | None = None) -> str:
    from ..target import Arch

    arch = arch or knobs.arch_override()
    if arch:
        return Arch.parse(arch).name
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU is visible: pass arch='sm_90a' (or another) to compile for a target")
    major, minor = torch.cuda.get_device_capability(device_index)
    return Arch.for_capability(major, minor).name


def compile_call(kernel, call, arch: str | None, device_index: int | None = None) -> CompiledKernel:
    """Compile (or fetch from memory/disk) the specialization ``call`` selects, for ``arch``.

    The frontend runs only when the entry is not in the cache: which tensor extents are compile-time
    constants (part of the key) is recorded per kernel source in the cache, so a fresh process computes the
    key of a disk hit from the arguments alone. On a miss the frontend runs before any cache lock is taken
    (user errors surface first, and any extents it discovers go into the key).
    """
    from ..backend_cuda.nvrtc import nvrtc_version

    arch = resolve_arch(arch, device_index)
    major, minor = nvrtc_version()
    target = f"cuda:{arch}:nvrtc{major}.{minor}"
    cache = default_cache()
    if kernel._stored_shape_dims is None:
        kernel.use_stored_extents(cache.read_extents(kernel.source_hash()))
    kernel.respecialize_extents(call)
    key = kernel._key(call, target)
    compiled = kernel._compiled.get(key)
    if compiled is not None:
        return compiled
    if knobs.always_compile() or cache.load(key) is None:
        kernel.build_ir(call)
        key = kernel._key(call, target)
        compiled = kernel._compiled.get(key)
        if compiled is not None:
            return compiled
        if kernel._shape_dims != kernel._stored_shape_dims:
            cache.write_extents(kernel.source_hash(), kernel.__name__, kernel._shape_dims)
            kernel._stored_shape_dims = {p: set(d) for p, d in kernel._shape_dims.items()}

    def build() -> tuple[dict, dict]:
        from ..backend_cuda.compiler import compile_function
        from ..target import Target
        from ..frontend.source import referenced_globals
        from ..frontend.visitor import build_function
        from ..passes.cleanup import cleanup

        fn = build_function(kernel.parsed, call.specs, referenced_globals(kernel.fn))
        cleanup(fn)
        target = Target.of(arch, call.options.num_warps, call.options.num_stages)
        symbol = f"tj_{kernel.__name__}"
        art = compile_function(fn, target, symbol)
        files = {"kernel.cubin": art.cubin, "kernel.cu": art.source, "kernel.ir": art.ir}
        if art.ptx:
            files["kernel.ptx"] = art.ptx
        meta = {
            "kernel": kernel.__name__, "kernel_symbol": symbol,
            "signature": _signature(call), "arch": arch, "threads": art.threads,
            "shared_bytes": art.shared_bytes, "param_kinds": art.param_kinds,
            "registers": art.registers, "spills": art.spill_bytes,
            "compile_seconds": round(art.compile_seconds, 4), "versions": _versions(),
            "binary": "kernel.cubin", "num_warps": call.options.num_warps, "num_stages": call.options.num_stages,
            "tensor_maps": art.tensor_maps, "value_layout": value_layout(call),
        }
        return files, meta

    entry, built = cache.get_or_compile(key, build)
    compiled = CompiledKernel(entry, from_disk=not built)
    kernel._compiled[key] = compiled
    kernel._note_specialization(call)
    return compiled


def _signature(call) -> str:
    from .jit import _spec_json

    parts = []
    for name, spec in call.specs.items():
        js = _spec_json(spec)
        if js[0] == "tensor":
            parts.append(f"{name}:{js[1]}[{js[2]}d]")
        elif js[0] == "scalar":
            parts.append(f"{name}:{js[1]}")
        else:
            parts.append(f"{name}={js[1]}")
    return ", ".join(parts)


def pack_values(call) -> list[Any]:
    values: list[Any] = []
    for name, value in call.values.items():
        spec = call.specs[name]
        kind = type(spec).__name__
        if kind == "ConstexprSpec":
            continue
        if kind == "TensorSpec":
            values.append(value.data_ptr())
            values.extend(int(s) for s in value.shape)
            values.extend(int(s) for s in value.stride())
        elif isinstance(value, bool):
            values.append(int(value))
        else:
            values.append(value)
    return values


def launch_compiled(kernel, call, grid: tuple[int, int, int]):
    import torch

    tensors = [v for v in call.values.values() if isinstance(v, torch.Tensor)]
    device_index = tensors[0].device.index if tensors and tensors[0].device.index is not None \
        else torch.cuda.current_device()
    compiled = compile_call(kernel, call, None, device_index)
    launcher = compiled.launcher(device_index)
    stream = torch.cuda.current_stream(device_index).cuda_stream
    launcher(grid, stream, pack_values(call))
    return launcher
