"""The CUDA driver functions tilejit calls, through ctypes on ``libcuda.so.1``.

A fresh process that finds its kernel in the disk cache should reach the first launch in a few milliseconds;
importing ``cuda.bindings.driver`` alone takes ~16 ms (H200 host, torch 2.11 image), so loading modules, reading
kernel attributes, switching contexts, launching and encoding tensor maps go through these dozen C functions
instead. The library is opened on first use; nothing here touches the GPU at import. Enum values are cuda.h's
(unchanged from CUDA 12.0 to 13).
"""
from __future__ import annotations

import ctypes
import functools
from types import SimpleNamespace
from typing import Any

from ..errors import BackendUnavailableError, LaunchError

# CUfunction_attribute
FUNC_MAX_THREADS_PER_BLOCK = 0
FUNC_SHARED_SIZE_BYTES = 1
FUNC_LOCAL_SIZE_BYTES = 3
FUNC_NUM_REGS = 4
FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# CUdevice_attribute
DEVICE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
# CUtensorMapDataType (by element size: a TMA copy moves bytes), interleave, swizzle, L2 promotion, OOB fill
TENSOR_MAP_UINT_TYPES = {1: 0, 2: 1, 4: 2}
# CU_TENSOR_MAP_DATA_TYPE_INT32 / _FLOAT32: a map whose elements the TMA unit computes on (a bulk reduction's add)
TENSOR_MAP_DATA_TYPES = {"int32": 3, "float32": 7}
TENSOR_MAP_INTERLEAVE_NONE = 0
TENSOR_MAP_SWIZZLES = {32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_32B / 64B / 128B, by the span in bytes
TENSOR_MAP_L2_PROMOTION_256B = 3
TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0

_p, _i, _u32, _u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
_P = ctypes.POINTER
# name in the library -> argument types (every function returns a CUresult). The _v2 names are the ones cuda.h
# maps the plain names to.
_SIGNATURES: dict[str, list[Any]] = {
    "cuGetErrorName": [_i, _P(ctypes.c_char_p)],
    "cuGetErrorString": [_i, _P(ctypes.c_char_p)],
    "cuCtxGetCurrent": [_P(_p)],
    "cuCtxSetCurrent": [_p],
    "cuCtxPushCurrent_v2": [_p],
    "cuCtxPopCurrent_v2": [_P(_p)],
    "cuCtxGetDevice": [_P(_i)],
    "cuDeviceGetAttribute": [_P(_i), _i, _i],
    "cuModuleLoadData": [_P(_p), ctypes.c_char_p],
    "cuModuleUnload": [_p],
    "cuModuleGetFunction": [_P(_p), _p, ctypes.c_char_p],
    "cuFuncGetAttribute": [_P(_i), _i, _p],
    "cuFuncSetAttribute": [_p, _i, _i],
    "cuLaunchKernel": [_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, _p, _p, _p],
    "cuLaunchKernelEx": [_p, _p, _p, _p],
    "cuOccupancyMaxActiveClusters": [_P(_i), _p, _p],
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": [_P(_i), _p, _i, ctypes.c_size_t],
    "cuTensorMapEncodeTiled": [_p, _i, _u32, _p, _P(_u64), _P(_u64), _P(_u32), _P(_u32), _i, _i, _i, _i],
}


@functools.cache
def lib() -> SimpleNamespace:
    """The driver functions by their cuda.h names (``cuCtxPushCurrent``, not ``..._v2``)."""
    try:
        handle = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise BackendUnavailableError(f"cannot load the CUDA driver library libcuda.so.1 ({exc}); is the NVIDIA "
                                      "driver installed and a GPU visible?") from None
    functions = {}
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(handle, name, None)
        if fn is None:  # e.g. cuTensorMapEncodeTiled on a pre-12.0 driver: an error when used, not at load
            continue
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        functions[name.removesuffix("_v2")] = fn
    return SimpleNamespace(**functions)


#: CUlaunchAttributeID of a launch's thread-block cluster shape (cuda.h, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION).
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


class LaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union (a cluster's x, y, z first)."""
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig, the first argument of cuLaunchKernelEx."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", _p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def cluster_launch_config(block: tuple[int, int, int], shared_bytes: int, cluster: tuple[int, int, int]) -> LaunchConfig:
    """A CUlaunchConfig with one attribute, the cluster shape; its grid and stream are set per launch. The
    attribute array is kept alive by the config (``_keep``)."""
    attr = (LaunchAttribute * 1)()
    attr[0].id = LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr[0].value[0], attr[0].value[1], attr[0].value[2] = cluster
    config = LaunchConfig()
    config.block[:] = list(block)
    config.shared_bytes = shared_bytes
    config.attrs = ctypes.cast(attr, ctypes.POINTER(LaunchAttribute))
    config.num_attrs = 1
    config._keep = attr
    return config


def function(name: str) -> Any:
    fn = getattr(lib(), name, None)
    if fn is None:
        raise BackendUnavailableError(f"the installed CUDA driver has no {name}; update the NVIDIA driver")
    return fn


def error_name(err: int) -> str:
    """``CUDA_ERROR_X (description)`` for a CUresult."""
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    try:
        if lib().cuGetErrorName(int(err), ctypes.byref(name)) != 0 or not name.value:
            return f"CUresult {int(err)}"
        described = lib().cuGetErrorString(int(err), ctypes.byref(text)) == 0 and text.value
    except BackendUnavailableError:
        return f"CUresult {int(err)}"
    return f"{name.value.decode()} ({text.value.decode()})" if described else name.value.decode()


def check(err: int, what: str) -> None:
    """Raise LaunchError naming ``what`` and the error when ``err`` is not CUDA_SUCCESS."""
    if err:
        raise LaunchError(f"{what} failed: {error_name(err)}")


def current_context() -> int | None:
    ctx = ctypes.c_void_p()
    check(function("cuCtxGetCurrent")(ctypes.byref(ctx)), "cuCtxGetCurrent")
    return ctx.value


def adopt_if_none(ctx: int) -> bool:
    """Make ``ctx`` current on a thread that has no context current, as the CUDA runtime does on a thread's first
    call (torch's autograd threads may run a custom op's backward before any runtime call: the driver calls of a
    launch then see no context). Returns whether it did; a thread with any context current is left alone."""
    if current_context():
        return False
    check(function("cuCtxSetCurrent")(ctx), "cuCtxSetCurrent")
    return True


class ContextPushed:
    """``with ContextPushed(ctx):`` makes ``ctx`` current on this thread for the block, then restores."""

    def __init__(self, ctx: int) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        check(function("cuCtxPushCurrent")(self.ctx), "cuCtxPushCurrent")

    def __exit__(self, *exc: object) -> None:
        check(function("cuCtxPopCurrent")(ctypes.byref(ctypes.c_void_p())), "cuCtxPopCurrent")


def module_load(image: bytes) -> int:
    module = ctypes.c_void_p()
    check(function("cuModuleLoadData")(ctypes.byref(module), image), "cuModuleLoadData")
    return module.value


def module_function(module: int, name: str) -> int:
    fn = ctypes.c_void_p()
    check(function("cuModuleGetFunction")(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction({name!r})")
    return fn.value


def function_attribute(fn: int, attribute: int) -> int:
    value = ctypes.c_int()
    check(function("cuFuncGetAttribute")(ctypes.byref(value), attribute, fn), f"cuFuncGetAttribute({attribute})")
    return value.value


def current_device_attribute(attribute: int) -> int:
    device, value = ctypes.c_int(), ctypes.c_int()
    check(function("cuCtxGetDevice")(ctypes.byref(device)), "cuCtxGetDevice")
    check(function("cuDeviceGetAttribute")(ctypes.byref(value), attribute, device.value),
          f"cuDeviceGetAttribute({attribute})")
    return value.value


def encode_tensor_map_tiled(data_type: int, address: int, dims: list[int], byte_strides: list[int],
                            box: list[int], swizzle_bytes: int) -> bytes:
    """cuTensorMapEncodeTiled with dense element strides, no interleave, the 128-, 64- or 32-byte swizzle
    (``swizzle_bytes``), 256-byte L2 promotion and no float OOB fill (out-of-bounds parts of a box read zeros);
    ``dims``/``box`` innermost first and ``byte_strides`` for dims 1..rank-1. Returns the 128 bytes of the
    CUtensorMap; raises LaunchError."""
    rank = len(dims)
    aligned = ctypes.create_string_buffer(128 + 64)  # a CUtensorMap is 128 bytes, 64-byte aligned
    at = (ctypes.addressof(aligned) + 63) // 64 * 64
    err = function("cuTensorMapEncodeTiled")(
        at, data_type, rank, address, (ctypes.c_uint64 * rank)(*dims),
        (ctypes.c_uint64 * max(rank - 1, 1))(*byte_strides), (ctypes.c_uint32 * rank)(*box),
        (ctypes.c_uint32 * rank)(*([1] * rank)), TENSOR_MAP_INTERLEAVE_NONE, TENSOR_MAP_SWIZZLES[swizzle_bytes],
        TENSOR_MAP_L2_PROMOTION_256B, TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err:
        raise LaunchError(f"cuTensorMapEncodeTiled failed: {error_name(err)}")
    return ctypes.string_at(at, 128)
