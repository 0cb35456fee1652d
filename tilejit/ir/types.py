"""Types of IR values: scalars, tiles, tensors and tensor lists.

Tiles carry two optional attributes that later passes fill in: the memory ``scope`` they live in and
the ``layout`` that spreads their elements over threads (register tiles) or bytes (shared tiles).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from ..dtypes import DType


class Scope(enum.Enum):
    GLOBAL = "global"
    SHARED = "shared"
    REGISTER = "reg"
    TMEM = "tmem"


@dataclass(frozen=True)
class ScalarType:
    dtype: DType

    def __str__(self) -> str:
        return str(self.dtype)


@dataclass(frozen=True)
class TileType:
    shape: tuple[int, ...]
    dtype: DType
    scope: Scope | None = None
    layout: Any = None  # a frozen layout object from tilejit.passes.layouts

    def __post_init__(self) -> None:
        if not self.shape or any((not isinstance(d, int)) or d <= 0 for d in self.shape):
            raise ValueError(f"tile shape must be a non-empty tuple of positive ints, got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def with_scope(self, scope: Scope | None) -> "TileType":
        return replace(self, scope=scope)

    def with_layout(self, layout: Any) -> "TileType":
        return replace(self, layout=layout)

    def with_dtype(self, dtype: DType) -> "TileType":
        return replace(self, dtype=dtype)

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        extra = ""
        if self.scope is not None:
            extra += f", {self.scope.value}"
        if self.layout is not None:
            extra += f", {self.layout}"
        return f"tile<{dims}x{self.dtype}{extra}>"


@dataclass(frozen=True)
class TensorType:
    """A global-memory tensor argument: dtype and rank; sizes and strides are runtime scalars."""
    dtype: DType
    rank: int

    def __str__(self) -> str:
        return f"tensor<{self.rank}d x {self.dtype}>"


@dataclass(frozen=True)
class TensorListType:
    """A list of global-memory tensors of one dtype and rank (a tensor-list argument); its length and each
    tensor's pointer, sizes and strides are read at run time from a table the launch builds on the device."""
    dtype: DType
    rank: int

    @property
    def element(self) -> TensorType:
        return TensorType(self.dtype, self.rank)

    def __str__(self) -> str:
        return f"tensor_list<{self.rank}d x {self.dtype}>"


IRType = ScalarType | TileType | TensorType | TensorListType
