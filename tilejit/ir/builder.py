"""Appends ops to a current block; the frontend and the passes both build IR through it."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .core import Block, Loc, Op, Value
from .ops import OpKind
from .types import IRType


class Builder:
    def __init__(self, block: Block) -> None:
        self.block = block
        self.loc: Loc | None = None

    @contextlib.contextmanager
    def at(self, block: Block) -> Iterator[Block]:
        """Build into ``block`` for the duration of the ``with``."""
        saved = self.block
        self.block = block
        try:
            yield block
        finally:
            self.block = saved

    @contextlib.contextmanager
    def located(self, loc: Loc | None) -> Iterator[None]:
        saved = self.loc
        if loc is not None:
            self.loc = loc
        try:
            yield
        finally:
            self.loc = saved

    def create(self, kind: OpKind, operands: list[Value], result_types: list[IRType], attrs: Any,
               regions: list[Block] | None = None) -> Op:
        op = Op(kind, operands, result_types, attrs, regions, self.loc)
        self.block.ops.append(op)
        return op

    def create1(self, kind: OpKind, operands: list[Value], result_type: IRType, attrs: Any) -> Value:
        return self.create(kind, operands, [result_type], attrs).result
