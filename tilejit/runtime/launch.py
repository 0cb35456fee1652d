"""Launching compiled kernels on torch tensors: the target of a device, per-device launchers, argument packing."""
from __future__ import annotations

import itertools
import threading
from typing import Any

from .. import knobs
from ..errors import UsageRuntimeError
from ..compiler import CompiledKernel
from ..target import Arch

_launcher_lock = threading.Lock()


def resolve_arch(arch: "str | Arch | None", device_index: int | None = None) -> Arch:
    """``arch`` parsed; else ``TILEJIT_ARCH``; else the arch of the GPU ``device_index`` (the current one)."""
    arch = arch or knobs.arch_override()
    if arch:
        return Arch.parse(arch)
    import torch

    if not torch.cuda.is_available():
        raise UsageRuntimeError("no CUDA GPU is visible: pass arch='sm_90a' (or another) to compile for a target")
    return Arch.for_capability(*torch.cuda.get_device_capability(device_index))


def launcher_for(compiled: CompiledKernel, device_index: int):
    """The launcher of ``compiled`` on one device: the cubin loaded there, its tensor maps packed per launch."""
    launcher = compiled.launchers.get(device_index)
    if launcher is None:
        from .driver import load_cubin, make_launcher

        with _launcher_lock:
            launcher = compiled.launchers.get(device_index)
            if launcher is None:
                loaded = load_cubin(compiled.entry.binary, compiled.name, device_index, compiled.shared_bytes)
                launcher = make_launcher(loaded, compiled.param_kinds, (compiled.threads, 1, 1),
                                         compiled.shared_bytes, cluster_z=int(compiled.meta.get("split_k", 1)),
                                         cluster_x=int(compiled.meta.get("cluster", 1)))
                maps = compiled.meta.get("tensor_maps") or []
                if maps:
                    launcher = _with_tensor_maps(launcher, maps, compiled.meta["value_layout"])
                programs = int(compiled.meta.get("stream_k") or 0)
                if programs:
                    launcher = StreamKLauncher(launcher, programs, int(compiled.meta["stream_k_slot_bytes"]),
                                               int(compiled.meta["stream_k_flags"]), device_index)
                compiled.launchers[device_index] = launcher
    return launcher


def resident_blocks(compiled: CompiledKernel, device_index: int, shared_bytes: int | None = None) -> int:
    """How many blocks of ``compiled`` one SM of device ``device_index`` holds at once (loading it there first),
    with its shared memory or ``shared_bytes`` instead (its registers and threads kept): what a launch plan needs
    to count the waves of a grid."""
    launcher = launcher_for(compiled, device_index)
    while not hasattr(launcher, "loaded"):  # a wrapper (tensor maps, stream-K) around the plain launcher
        launcher = launcher.launcher
    return launcher.loaded.blocks_per_sm(compiled.threads, compiled.shared_bytes if shared_bytes is None
                                         else shared_bytes)


def _with_tensor_maps(launcher, maps: list[dict], layout: dict[str, list[int]]) -> "TensorMapLauncher":
    from .tma import TensorMapPacker

    return TensorMapLauncher(launcher, TensorMapPacker(maps, {name: (start, rank) for name, (start, rank) in
                                                              layout.items()}, context=launcher.loaded.context))


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


class StreamKLauncher:
    """A stream-K kernel's launcher (passes/split_k.stream_k): it launches the kernel's P programs (one per SM, the
    count it was compiled for) whatever the grid, and appends to the values the grid they stand for and the
    workspace of the launch's stream (``stream_k_workspace``) and an epoch before the tensor maps. The kernel
    reads a tile counter of another epoch as 0 (lower_split_k._stream_k_fixup), so a count that a launch did not
    finish, or memory something else wrote, cannot make a later launch skip a tile."""

    def __init__(self, launcher, programs: int, slot_bytes: int, flags: int, device_index: int) -> None:
        self.launcher = launcher
        self.programs = programs
        self.workspace_bytes = programs * slot_bytes
        self.flag_words = programs * flags
        self.device_index = device_index

    def __call__(self, grid, stream, values) -> None:
        data, flags = stream_k_workspace(self.device_index, stream, self.workspace_bytes, self.flag_words)
        epoch = next(_LAUNCHES) % (2**31 - 1) + 1  # (never 0: the value of a cleared counter)
        self.launcher((self.programs, 1, 1), stream, [*values, *grid, data, flags, epoch])

    def native_entry(self):
        """An Entry of the compiled launcher that hands every launch, its values packed, to this launcher (the
        workspace is looked up per stream in Python)."""
        inner = self.launcher
        plain = inner.launcher if isinstance(inner, TensorMapLauncher) else inner
        entry = getattr(self, "_entry", None)
        if entry is None:
            from . import native

            module = native.load()
            if module is None:
                return None
            user = [k for k in plain.param_kinds if k != "tmap"][:-STREAM_K_PARAMS]
            kinds = bytes(native.KIND_CODES[k] for k in user)
            entry = self._entry = module.Entry(int(plain.loaded.function), plain.block, plain.dynamic_smem_bytes,
                                               kinds, plain.loaded.device_index, None, self, 1, 1, True)
        return entry


#: The parameters a stream-K kernel takes after the user's (backend_cuda/emitter.py): the grid's three extents,
#: the workspace, the counters and the launch's epoch.
STREAM_K_PARAMS = 6

#: Counts stream-K launches, for their epochs (``next`` on a count is atomic in CPython: launches may come from
#: several threads).
_LAUNCHES = itertools.count()

#: Per (device, stream): the stream-K workspace (partial sums) and its tile counters (zeroed when made).
_WORKSPACES: dict[tuple[int, int], tuple[Any, Any]] = {}
_workspace_lock = threading.Lock()


def stream_k_workspace(device_index: int, stream: int, data_bytes: int, flag_words: int) -> tuple[int, int]:
    """The addresses of the stream-K workspace of ``stream`` on ``device_index``, at least ``data_bytes`` of
    partial sums and ``flag_words`` zeroed 32-bit flags. One per stream: launches on one stream run one after the
    other, so they may share it; launches on two streams may run at once, so they may not. It grows by a new
    allocation on that stream (the caching allocator orders its reuse of the old one after the stream's work).

    The stream is wrapped with ``torch.cuda.get_stream_from_external``: ``torch.cuda.ExternalStream(0)`` (torch's
    default stream, handle 0) gives a fresh pooled stream instead (pytorch/pytorch#182960), and the counters' zero
    fill ran there, unordered with the launch: a fill landing while the kernel counted lost arrivals, and tiles
    were left unwritten (seen in GPU runs shared by many processes, where that stream's work came late)."""
    key = (device_index, stream)
    found = _WORKSPACES.get(key)
    if found is None or found[0].numel() < data_bytes or found[1].numel() < flag_words:
        import torch

        with _workspace_lock, torch.cuda.stream(torch.cuda.get_stream_from_external(stream, device=device_index)):
            found = _WORKSPACES.get(key)
            if found is None or found[0].numel() < data_bytes or found[1].numel() < flag_words:
                old_bytes, old_flags = (found[0].numel(), found[1].numel()) if found else (0, 0)
                device = torch.device("cuda", device_index)
                found = (torch.empty(max(data_bytes, old_bytes), dtype=torch.uint8, device=device),
                         torch.zeros(max(flag_words, old_flags, 1), dtype=torch.int32, device=device))
                _WORKSPACES[key] = found
    return found[0].data_ptr(), found[1].data_ptr()


def pack_values(call) -> list[Any]:
    """A bound call's run-time parameter values in launch order: per tensor its pointer, sizes and strides, per
    tensor list its table's address and length."""
    from ..frontend.spec import ConstexprSpec, TensorListSpec, TensorSpec
    from .tensor_lists import TABLES, capturing

    values: list[Any] = []
    specs = call.specs
    for name, value in call.values.items():
        spec = specs[name]
        if isinstance(spec, ConstexprSpec):
            continue
        if isinstance(spec, TensorSpec):
            values.append(value.data_ptr())
            values.extend(int(s) for s in value.shape)
            values.extend(int(s) for s in value.stride())
        elif isinstance(spec, TensorListSpec):  # the address of its table on the device, and its length
            values.append(TABLES.address(value, value[0].get_device(), capturing()))
            values.append(len(value))
        elif isinstance(value, bool):
            values.append(int(value))
        else:
            values.append(value)
    return values
