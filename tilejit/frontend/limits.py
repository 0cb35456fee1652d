"""The compiler's limits on one kernel, in one place (docs/language.md states them).

Each is far above what a kernel that compiles to something useful needs, and low enough that a kernel beyond it
is refused with a located error in seconds instead of hanging in the emitter or exhausting Python's stack:

- ``MAX_TILE_ELEMENTS``: the elements of any one tile (twice the largest tile of the test suite's kernels, a
  128x256 accumulator; a register tile of this size already takes NVRTC about ten seconds).
- ``MAX_NESTING_DEPTH``: how deeply expressions and statements nest (a sum of 200 terms nests 200 deep).
- ``MAX_KERNEL_OPS``: the operations one specialization's IR may hold, counted as the frontend creates them
  (unrolled ``T.static_range`` loops and inlined helpers included).
"""
from __future__ import annotations

from typing import Any

from ..ir import Builder, Function, Op, OpKind, TileType

MAX_TILE_ELEMENTS = 1 << 16
MAX_NESTING_DEPTH = 200
MAX_KERNEL_OPS = 10_000


class LimitExceeded(Exception):
    """A limit was passed; the frontend turns it into a located LimitError."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


class CountingBuilder(Builder):
    """The frontend's builder: counts the ops it creates and stops at ``MAX_KERNEL_OPS``."""

    def __init__(self, block: Any) -> None:
        super().__init__(block)
        self.created = 0

    def create(self, kind: OpKind, operands: list, result_types: list, attrs: Any, regions: list | None = None) -> Op:
        self.created += 1
        if self.created > MAX_KERNEL_OPS:
            raise LimitExceeded(f"the kernel is too large: more than {MAX_KERNEL_OPS:,} operations",
                                "unroll fewer iterations (T.static_range) or use a runtime loop (range)")
        return super().create(kind, operands, result_types, attrs, regions)


def oversized_tile(fn: Function) -> Op | None:
    """The first op whose result is a tile of more than ``MAX_TILE_ELEMENTS`` elements, or None."""
    for op in fn.walk():
        for value in op.results:
            if isinstance(value.type, TileType) and value.type.numel > MAX_TILE_ELEMENTS:
                return op
    return None
