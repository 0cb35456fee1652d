"""SSA values, ops, blocks and the kernel function that holds them.

Every op has a kind, operands, results, one typed attribute object, optional regions (blocks) and the
source location it came from. Block arguments carry loop induction variables and loop-carried values.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

from .ops import OpKind
from .types import IRType, ScalarType, TensorType, TileType

_ids = itertools.count()


@dataclass(frozen=True)
class Loc:
    """Where an op came from in the user's source (1-based line, 0-based column, as in ``ast``)."""
    filename: str
    lineno: int
    col: int

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}:{self.col + 1}"


@dataclass(frozen=True)
class MultipleOf:
    """A promise that an integer value is a multiple of ``divisors``: one divisor for a scalar, one per dim for a
    tile (Triton's reading: along dim d, the first element of each contiguous run is a multiple of
    ``divisors[d]``). Made by ``T.multiple_of`` (the user's promise) and by the specialization of an int argument
    divisible by 16 (the runtime's); ``passes/divisibility.py`` reads it. A broken promise is the user's bug."""
    divisors: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.divisors or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                        for n in self.divisors):
            raise ValueError(f"a promise needs positive int divisors, got {self.divisors!r}")

    def merged(self, other: "MultipleOf | None") -> "MultipleOf":
        """Both promises at once: per dim, the least common multiple."""
        if other is None:
            return self
        if len(other.divisors) != len(self.divisors):
            raise ValueError(f"promises of different ranks: {self.divisors} and {other.divisors}")
        return MultipleOf(tuple(math.lcm(a, b) for a, b in zip(self.divisors, other.divisors)))


class Value:
    """An SSA value: the result of an op or an argument of a block (or of the function)."""

    __slots__ = ("type", "name", "id", "owner", "multiple_of")

    def __init__(self, type: IRType, name: str | None = None, owner: Any = None) -> None:
        self.type = type
        self.name = name
        self.id = next(_ids)
        self.owner = owner  # the defining Op, or the Block whose argument this is
        self.multiple_of: MultipleOf | None = None  # what the value is promised to be a multiple of

    @property
    def is_tile(self) -> bool:
        return isinstance(self.type, TileType)

    @property
    def is_scalar(self) -> bool:
        return isinstance(self.type, ScalarType)

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.type, TensorType)

    @property
    def dtype(self):
        return self.type.dtype

    def __repr__(self) -> str:
        return f"Value(%{self.name or self.id}: {self.type})"


class Block:
    def __init__(self, args: list[Value] | None = None) -> None:
        self.args: list[Value] = list(args or [])
        for a in self.args:
            a.owner = self
        self.ops: list[Op] = []

    @property
    def terminator(self) -> "Op | None":
        return self.ops[-1] if self.ops and self.ops[-1].kind.is_terminator else None

    def walk(self) -> Iterator["Op"]:
        """Every op in this block and nested regions, outer ops before the ops they contain."""
        for op in self.ops:
            yield op
            for region in op.regions:
                yield from region.walk()


class Op:
    __slots__ = ("kind", "operands", "results", "attrs", "regions", "loc")

    def __init__(self, kind: OpKind, operands: list[Value], result_types: list[IRType], attrs: Any,
                 regions: list[Block] | None = None, loc: Loc | None = None) -> None:
        expected = kind.attrs
        if not isinstance(attrs, expected):
            raise TypeError(f"{kind.mnemonic} takes {expected.__name__}, got {type(attrs).__name__}")
        self.kind = kind
        self.operands = list(operands)
        self.results = [Value(t, owner=self) for t in result_types]
        self.attrs = attrs
        self.regions = list(regions or [])
        self.loc = loc

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.kind.mnemonic} has {len(self.results)} results")
        return self.results[0]

    def __repr__(self) -> str:
        return f"Op({self.kind.mnemonic}, {len(self.operands)} operands)"


@dataclass
class Param:
    """A kernel parameter as the IR sees it after specialization."""
    name: str
    kind: str            # "tensor", "tensor_list", "scalar" or "constexpr"
    value: Value | None  # None for constexpr params (folded away)
    constant: Any = None  # the constexpr value


@dataclass
class Function:
    name: str
    params: list[Param]
    body: Block
    filename: str = "<unknown>"
    attrs: dict[str, Any] = field(default_factory=dict)  # backend facts: num_warps, shared bytes ...

    def walk(self) -> Iterator[Op]:
        return self.body.walk()

    @property
    def runtime_params(self) -> list[Param]:
        return [p for p in self.params if p.kind != "constexpr"]

    def writers(self) -> dict[str, Op]:
        """The tensor and tensor-list parameters this function writes (stores, scatters, atomics), each with the
        first op that writes it: the kernel's outputs, which a launch checks for memory overlapping itself."""
        params = {p.value: p.name for p in self.params if p.kind in ("tensor", "tensor_list")}
        found: dict[str, Op] = {}
        for op in self.walk():
            if not op.kind.writes_memory:
                continue
            for operand in op.operands:
                owner = operand.owner
                if operand not in params and isinstance(owner, Op) and owner.kind is OpKind.LIST_ITEM:
                    operand = owner.operands[0]  # an item of a tensor list: the list is written
                name = params.get(operand)
                if name is not None:
                    found.setdefault(name, op)
        return found
