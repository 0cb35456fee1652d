"""Element types of tilejit tiles, scalars and tensors.

A :class:`DType` is a small frozen value: its name, width in bits and kind. The user-facing names
(``T.float16`` ...) are these objects; the compiler compares them by identity or equality freely.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str       # the name users write after ``T.``
    short: str      # the name the IR printer uses: f16, bf16, i32 ...
    bits: int
    kind: str       # "float", "int", "uint" or "bool"

    def __post_init__(self) -> None:
        if self.kind not in ("float", "int", "uint", "bool"):
            raise ValueError(f"unknown dtype kind {self.kind!r}")

    @property
    def is_floating(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def is_fp8(self) -> bool:
        """A float8 number format a matrix product takes (e4m3fn, e5m2); not the e8m0 scale format."""
        return self.kind == "float" and self.bits == 8 and not self.is_scale

    @property
    def is_scale(self) -> bool:
        """The e8m0 format of microscaling block scales: an exponent only, 2^(bits - 127), 0xff = NaN."""
        return self.name == "float8_e8m0fnu"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    def to_torch(self):
        import torch

        return getattr(torch, self.name)

    def __repr__(self) -> str:
        return f"tilejit.language.{self.name}"

    def __str__(self) -> str:
        return self.short


float16 = DType("float16", "f16", 16, "float")
bfloat16 = DType("bfloat16", "bf16", 16, "float")
float32 = DType("float32", "f32", 32, "float")
float64 = DType("float64", "f64", 64, "float")
float8_e4m3fn = DType("float8_e4m3fn", "f8e4m3", 8, "float")
float8_e5m2 = DType("float8_e5m2", "f8e5m2", 8, "float")
int8 = DType("int8", "i8", 8, "int")
int16 = DType("int16", "i16", 16, "int")
int32 = DType("int32", "i32", 32, "int")
int64 = DType("int64", "i64", 64, "int")
uint8 = DType("uint8", "u8", 8, "uint")
# MX block scales (OCP Microscaling E8M0): powers of two 2^-127 .. 2^127, no sign, no zero; loaded and converted
# to float32 (.to(T.float32)), and the scales of T.gemm's microscaled form; no arithmetic of its own
float8_e8m0fnu = DType("float8_e8m0fnu", "f8e8m0", 8, "float")
bool_ = DType("bool", "i1", 1, "bool")

ALL_DTYPES = (float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2,
              int8, int16, int32, int64, uint8, bool_, float8_e8m0fnu)
_BY_NAME = {d.name: d for d in ALL_DTYPES}


def from_torch(torch_dtype) -> DType:
    """The tilejit dtype of a torch dtype; TypeError for one tilejit cannot handle."""
    name = str(torch_dtype).removeprefix("torch.")
    try:
        return _BY_NAME[name]
    except KeyError:
        supported = ", ".join(d.name for d in ALL_DTYPES)
        raise TypeError(f"tensors of dtype {torch_dtype} are not supported (supported: {supported})") from None
