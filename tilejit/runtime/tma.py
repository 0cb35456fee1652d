"""Host-side CUtensorMap encoding for kernels that copy tiles with TMA.

A map describes one tensor argument (its address, extents and strides) and the box a kernel copies.
Launches reuse maps through a small cache keyed by everything the encoding depends on, so a repeated
launch on the same tensors costs a dict lookup. Encoding follows HARDWARE.md ("TMA from Python"): every
number wrapped in cuuint32_t / cuuint64_t, 128-byte swizzle, out-of-bounds parts of a box zero-filled.
"""
from __future__ import annotations

import ctypes
import functools
from collections import OrderedDict
from typing import Any, Sequence

from ..errors import LaunchError

_CACHE_SIZE = 1024
_cache: OrderedDict[tuple, Any] = OrderedDict()


@functools.cache
def _data_types() -> dict[int, Any]:
    from cuda.bindings import driver

    t = driver.CUtensorMapDataType
    return {1: t.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2: t.CU_TENSOR_MAP_DATA_TYPE_UINT16,
            4: t.CU_TENSOR_MAP_DATA_TYPE_UINT32}


def encode(ptr: int, sizes: Sequence[int], strides: Sequence[int], elem_bytes: int, box: Sequence[int]) -> Any:
    """A CUtensorMap for a tensor at ``ptr`` with ``sizes``/``strides`` (elements, outermost first) and a
    ``box`` given innermost first. The element type only matters by size: a copy moves bytes."""
    key = (ptr, tuple(sizes), tuple(strides), elem_bytes, tuple(box))
    found = _cache.get(key)
    if found is not None:
        return found
    from cuda.bindings import driver

    rank = len(sizes)
    dims = [driver.cuuint64_t(int(n)) for n in reversed(sizes)]
    # globalStrides: bytes between consecutive elements of dims 1..rank-1 (innermost first, dim 0 implied).
    byte_strides = [driver.cuuint64_t(int(s) * elem_bytes) for s in list(reversed(strides))[1:]]
    result = driver.cuTensorMapEncodeTiled(
        _data_types()[elem_bytes], driver.cuuint32_t(rank), ptr, dims, byte_strides,
        [driver.cuuint32_t(int(b)) for b in box], [driver.cuuint32_t(1)] * rank,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    err, tensor_map = result[0], result[1]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"cuTensorMapEncodeTiled failed ({err.name}) for a tensor of sizes {list(sizes)}, "
                          f"strides {list(strides)} and box {list(box)}")
    # Kept as the 128 bytes the kernel parameter is, so a cached launch copies bytes and converts nothing.
    tensor_map = ctypes.string_at(tensor_map.getPtr(), 128)
    _cache[key] = tensor_map
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return tensor_map


class TensorMapPacker:
    """Appends the CUtensorMap values of a compiled kernel to its packed parameter values.

    ``maps`` come from the kernel's meta (``{"tensor": name, "box": [...], "elem_bytes": n}``); ``layout``
    gives, for each tensor parameter name, where its pointer, sizes and strides sit in the packed values.
    """

    def __init__(self, maps: Sequence[dict], layout: dict[str, tuple[int, int]]) -> None:
        self.plan = []
        for m in maps:
            start, rank = layout[m["tensor"]]
            self.plan.append((start, rank, int(m["elem_bytes"]), tuple(m["box"])))

    def __call__(self, values: list[Any]) -> list[Any]:
        return [*values, *self.maps(values)]

    def maps(self, values: Sequence[Any]) -> list[bytes]:
        """The 128-byte CUtensorMaps for the packed ``values``, in the kernel's parameter order."""
        out = []
        for start, rank, elem_bytes, box in self.plan:
            ptr = values[start]
            sizes = values[start + 1:start + 1 + rank]
            strides = values[start + 1 + rank:start + 1 + 2 * rank]
            out.append(encode(ptr, sizes, strides, elem_bytes, box))
        return out
