"""Host-side CUtensorMap encoding for kernels that copy tiles with TMA.

A map describes one tensor argument (its address, extents and strides) and the box a kernel copies.
Launches reuse maps through a small cache keyed by everything the encoding depends on, so a repeated
launch on the same tensors costs a dict lookup. Encoding follows HARDWARE.md ("TMA from Python"), through
ctypes (``runtime/libcuda.py``): out-of-bounds parts of a box zero-filled, and the swizzle mode whose span is
the box's inner extent in bytes (128, 64 or 32: the backend makes each box one row of a swizzled shared tile's
128-byte panel, or its whole 64- or 32-byte row; ``backend_cuda.lower_tma.TensorMapSpec``).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

from ..errors import LaunchError

_CACHE_SIZE = 1024
_cache: OrderedDict[tuple, Any] = OrderedDict()


def encode(ptr: int, sizes: Sequence[int], strides: Sequence[int], elem_bytes: int, box: Sequence[int],
           data_type: str = "") -> bytes:
    """The 128 bytes of a CUtensorMap for a tensor at ``ptr`` with ``sizes``/``strides`` (elements, outermost
    first) and a ``box`` given innermost first, swizzled over the box's inner extent. For a copy the element type
    only matters by size (a copy moves bytes); a bulk reduction adds elements of the map's type, named by
    ``data_type`` ("float32", "int32")."""
    key = (ptr, tuple(sizes), tuple(strides), elem_bytes, tuple(box), data_type)
    found = _cache.get(key)
    if found is not None:
        return found
    from . import libcuda

    # globalStrides: bytes between consecutive elements of dims 1..rank-1 (innermost first, dim 0 implied).
    byte_strides = [int(s) * elem_bytes for s in list(reversed(strides))[1:]]
    try:
        code = libcuda.TENSOR_MAP_DATA_TYPES[data_type] if data_type else libcuda.TENSOR_MAP_UINT_TYPES[elem_bytes]
        tensor_map = libcuda.encode_tensor_map_tiled(code, ptr, [int(n) for n in reversed(sizes)], byte_strides,
                                                     [int(b) for b in box], swizzle_bytes(box, elem_bytes))
    except LaunchError as error:
        raise LaunchError(f"{error} for a tensor of sizes {list(sizes)}, strides {list(strides)} and box "
                          f"{list(box)}") from None
    _cache[key] = tensor_map
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return tensor_map


def swizzle_bytes(box: Sequence[int], elem_bytes: int) -> int:
    """The swizzle span of a box: its inner extent in bytes, which must be 128, 64 or 32."""
    span = int(box[0]) * elem_bytes
    if span not in (32, 64, 128):
        raise LaunchError(f"a TMA box of {span}-byte rows has no swizzle mode (128, 64 or 32 bytes)")
    return span


class TensorMapPacker:
    """Appends the CUtensorMap values of a compiled kernel to its packed parameter values.

    ``maps`` come from the kernel's meta (``{"tensor": name, "box": [...], "elem_bytes": n}``, and ``"data_type"``
    for a bulk reduction's map); ``layout`` gives, for each tensor parameter name, where its pointer, sizes and
    strides sit in the packed values.
    """

    def __init__(self, maps: Sequence[dict], layout: dict[str, tuple[int, int]], context: int | None = None) -> None:
        self.context = context  # the kernel's (primary) context: made current where a thread has none
        self.plan = []
        for m in maps:
            start, rank = layout[m["tensor"]]
            self.plan.append((start, rank, int(m["elem_bytes"]), tuple(m["box"]), m.get("data_type", "")))

    def __call__(self, values: list[Any]) -> list[Any]:
        return [*values, *self.maps(values)]

    def maps(self, values: Sequence[Any]) -> list[bytes]:
        """The 128-byte CUtensorMaps for the packed ``values``, in the kernel's parameter order."""
        try:
            return self._encode_all(values)
        except LaunchError:
            from . import libcuda

            if self.context is None or not libcuda.adopt_if_none(self.context):
                raise
            return self._encode_all(values)  # the thread had no context current: encoding needs one

    def _encode_all(self, values: Sequence[Any]) -> list[bytes]:
        out = []
        for start, rank, elem_bytes, box, data_type in self.plan:
            ptr = values[start]
            sizes = values[start + 1:start + 1 + rank]
            strides = values[start + 1 + rank:start + 1 + 2 * rank]
            out.append(encode(ptr, sizes, strides, elem_bytes, box, data_type))
        return out
