"""What the frontend knows about each argument of one specialization of a kernel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dtypes import DType


@dataclass(frozen=True)
class TensorSpec:
    dtype: DType
    rank: int
    unit_stride_dims: tuple[int, ...] = ()   # dims whose stride is 1
    aligned16: bool = False                  # data pointer 16-byte aligned
    strides16: bool = False                  # every non-unit stride is a multiple of 16 bytes (TMA's rule)
    shape_constants: tuple[tuple[int, int], ...] = ()  # (dim, size) pairs the kernel needs at compile time

    def chunks16(self) -> bool:
        """Whether windows along the last dim are whole 16-byte chunks as far as the specialization knows: the data
        16-byte aligned, unit stride in the last dim, every other stride a multiple of 16 bytes (TMA's rule)."""
        return self.aligned16 and self.strides16 and self.rank - 1 in self.unit_stride_dims


@dataclass(frozen=True)
class TensorListSpec:
    """A list (or tuple) of tensors of one dtype and rank, specialized on the dims whose stride is 1 in every
    item (vector accesses along the last one); not on the length, nor on the items' pointers, extents and strides,
    which are run-time values. Alignment is not part of it: it only matters to TMA, which an item never takes
    (cp.async and vector loads check it at run time)."""
    dtype: DType
    rank: int
    unit_stride_dims: tuple[int, ...] = ()   # dims whose stride is 1 in every item

    def item_spec(self) -> TensorSpec:
        """The specialization each item's accesses may rely on."""
        return TensorSpec(self.dtype, self.rank, self.unit_stride_dims)


@dataclass(frozen=True)
class ScalarSpec:
    dtype: DType
    equals_one: bool = False     # an int equal to 1 is folded to the constant 1
    divisible16: bool = False


@dataclass(frozen=True)
class ConstexprSpec:
    value: Any


ArgSpec = TensorSpec | TensorListSpec | ScalarSpec | ConstexprSpec


class NeedsShape(Exception):
    """Raised by the frontend when a kernel needs a tensor extent at compile time (a full ``:`` slice).

    The runtime adds ``(param, dim)`` to the specialization and compiles again.
    """

    def __init__(self, param: str, dim: int) -> None:
        super().__init__(f"{param}.shape[{dim}]")
        self.param = param
        self.dim = dim


def spec_json(spec: ArgSpec) -> list:
    """The JSON form of a spec, as it enters the cache key."""
    if isinstance(spec, TensorSpec):
        return ["tensor", spec.dtype.name, spec.rank, list(spec.unit_stride_dims), spec.aligned16,
                spec.strides16, [list(p) for p in spec.shape_constants]]
    if isinstance(spec, TensorListSpec):
        return ["tensor_list", spec.dtype.name, spec.rank, list(spec.unit_stride_dims)]
    if isinstance(spec, ScalarSpec):
        return ["scalar", spec.dtype.name, spec.equals_one, spec.divisible16]
    value = spec.value
    if isinstance(value, DType):
        value = "dtype:" + value.name
    return ["constexpr", repr(value)]
