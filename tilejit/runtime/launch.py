"""Launching compiled kernels on torch tensors: the target of a device, per-device launchers, argument packing."""
from __future__ import annotations

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
                compiled.launchers[device_index] = launcher
    return launcher


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
