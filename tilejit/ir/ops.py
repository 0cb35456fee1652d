"""Op kinds and their typed attributes.

One op class (:class:`tilejit.ir.core.Op`) with an :class:`OpKind` grouped by family; each kind has
a frozen attribute dataclass that checks its invariants. Passes add lowered kinds (shared staging,
async copies, layout conversions) to the same enum so the whole pipeline shares one IR.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ..dtypes import DType


class Family(enum.Enum):
    SCALAR = "scalar"        # constants, program ids, tensor metadata
    ARITH = "arith"          # elementwise arithmetic on scalars or same-shape tiles
    TILE = "tile"            # tile creation and shape manipulation
    REDUCE = "reduce"
    COMPUTE = "compute"      # tensor-core matrix products
    MEMORY = "memory"        # global loads/stores and (after lowering) shared staging
    CONTROL = "control"      # for / if / yield
    SYNC = "sync"            # barriers and async groups (lowered IR only)


class OpKind(enum.Enum):
    # scalar
    CONSTANT = ("constant", Family.SCALAR)
    PROGRAM_ID = ("program_id", Family.SCALAR)
    NUM_PROGRAMS = ("num_programs", Family.SCALAR)
    TENSOR_DIM = ("tensor_dim", Family.SCALAR)
    TENSOR_STRIDE = ("tensor_stride", Family.SCALAR)
    # elementwise arithmetic (scalars or tiles of one shape)
    BINARY = ("binary", Family.ARITH)
    UNARY = ("unary", Family.ARITH)
    COMPARE = ("cmp", Family.ARITH)
    SELECT = ("select", Family.ARITH)
    CAST = ("cast", Family.ARITH)
    # tile creation and shape
    SPLAT = ("splat", Family.TILE)
    ARANGE = ("arange", Family.TILE)
    EXPAND_DIMS = ("expand_dims", Family.TILE)
    BROADCAST = ("broadcast", Family.TILE)
    TRANSPOSE = ("trans", Family.TILE)
    CONVERT_LAYOUT = ("convert_layout", Family.TILE)
    # reductions
    REDUCE = ("reduce", Family.REDUCE)
    # compute
    GEMM = ("gemm", Family.COMPUTE)
    # memory
    LOAD = ("load", Family.MEMORY)
    STORE = ("store", Family.MEMORY)
    # control flow
    FOR = ("for", Family.CONTROL)
    IF = ("if", Family.CONTROL)
    WHILE = ("while", Family.CONTROL)  # regions: [condition (yields a bool), body]; scalars only
    YIELD = ("yield", Family.CONTROL)

    def __init__(self, mnemonic: str, family: Family) -> None:
        self.mnemonic = mnemonic
        self.family = family


class BinaryOp(enum.Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    TRUEDIV = "div"
    FLOORDIV = "floordiv"   # Python semantics: rounds toward -inf
    MOD = "mod"             # Python semantics: result has the divisor's sign
    MIN = "min"
    MAX = "max"
    AND = "and"             # bitwise on ints, logical on bools
    OR = "or"
    XOR = "xor"
    SHL = "shl"
    SHR = "shr"


class UnaryOp(enum.Enum):
    NEG = "neg"
    NOT = "not"             # logical not on bools, bitwise not on ints
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    ABS = "abs"


class CompareOp(enum.Enum):
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    EQ = "eq"
    NE = "ne"


class ReduceKind(enum.Enum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"


class LoopKind(enum.Enum):
    RANGE = "range"          # plain runtime loop
    PIPELINED = "pipelined"  # T.range: software-pipelined by the backend


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class ConstantAttrs:
    value: Any  # int, float or bool

    def __post_init__(self) -> None:
        if not isinstance(self.value, (int, float, bool)):
            raise TypeError(f"constant must be int, float or bool, got {type(self.value).__name__}")


@dataclass(frozen=True)
class AxisAttrs:
    axis: int

    def __post_init__(self) -> None:
        if self.axis < 0:
            raise ValueError("axis must be non-negative after normalisation")


@dataclass(frozen=True)
class BinaryAttrs:
    op: BinaryOp


@dataclass(frozen=True)
class UnaryAttrs:
    op: UnaryOp


@dataclass(frozen=True)
class CompareAttrs:
    op: CompareOp


@dataclass(frozen=True)
class CastAttrs:
    dtype: DType


@dataclass(frozen=True)
class ArangeAttrs:
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError("arange needs end > start")


@dataclass(frozen=True)
class ShapeAttrs:
    shape: tuple[int, ...]


@dataclass(frozen=True)
class PermAttrs:
    perm: tuple[int, ...]

    def __post_init__(self) -> None:
        if sorted(self.perm) != list(range(len(self.perm))):
            raise ValueError(f"not a permutation: {self.perm}")


@dataclass(frozen=True)
class ReduceAttrs:
    axis: int
    kind: ReduceKind


@dataclass(frozen=True)
class GemmAttrs:
    """acc + op(a) @ op(b); ``impl`` names the lowering the dispatch registry chose (backend passes)."""
    transpose_a: bool = False
    transpose_b: bool = False
    impl: str | None = None


@dataclass(frozen=True)
class AccessAttrs:
    """A tile-shaped window of a global tensor.

    ``shape[d]`` is the window's length along tensor dim ``d``; dims listed in ``dropped`` were indexed
    by an integer and are absent from the tile (their length is 1). Elements outside the tensor read as
    ``0`` (load) or are not written (store).
    """
    shape: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    pipeline: int = 0  # set by the pipelining pass: number of ring slots this load is prefetched through
    copy: str | None = None  # the global->shared lowering the dispatch registry chose (shared loads)

    def __post_init__(self) -> None:
        if any(n <= 0 for n in self.shape):
            raise ValueError(f"window lengths must be positive: {self.shape}")
        if any(self.shape[d] != 1 for d in self.dropped):
            raise ValueError("a dropped dim has length 1")

    @property
    def tile_shape(self) -> tuple[int, ...]:
        return tuple(n for d, n in enumerate(self.shape) if d not in self.dropped)


@dataclass(frozen=True)
class ForAttrs:
    kind: LoopKind = LoopKind.RANGE
    stages: int | None = None  # None: take the launch's num_stages

    def __post_init__(self) -> None:
        if self.stages is not None and self.stages < 1:
            raise ValueError("stages must be >= 1")


ATTRS_OF_KIND: dict[OpKind, type] = {
    OpKind.CONSTANT: ConstantAttrs,
    OpKind.PROGRAM_ID: AxisAttrs,
    OpKind.NUM_PROGRAMS: AxisAttrs,
    OpKind.TENSOR_DIM: AxisAttrs,
    OpKind.TENSOR_STRIDE: AxisAttrs,
    OpKind.BINARY: BinaryAttrs,
    OpKind.UNARY: UnaryAttrs,
    OpKind.COMPARE: CompareAttrs,
    OpKind.SELECT: NoAttrs,
    OpKind.CAST: CastAttrs,
    OpKind.SPLAT: ShapeAttrs,
    OpKind.ARANGE: ArangeAttrs,
    OpKind.EXPAND_DIMS: AxisAttrs,
    OpKind.BROADCAST: ShapeAttrs,
    OpKind.TRANSPOSE: PermAttrs,
    OpKind.CONVERT_LAYOUT: NoAttrs,
    OpKind.REDUCE: ReduceAttrs,
    OpKind.GEMM: GemmAttrs,
    OpKind.LOAD: AccessAttrs,
    OpKind.STORE: AccessAttrs,
    OpKind.FOR: ForAttrs,
    OpKind.IF: NoAttrs,
    OpKind.WHILE: NoAttrs,
    OpKind.YIELD: NoAttrs,
}
