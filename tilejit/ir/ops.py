"""The op table: every op kind declared once, with its attributes, traits and structural rule.

One op class (:class:`tilejit.ir.core.Op`) whose ``kind`` is an :class:`OpKind`. Each kind's value is an
:class:`OpDecl`: mnemonic, family, the frozen attribute dataclass its ops carry (which checks its own
invariants), its :class:`Trait` flags, and the verifier rule for its operands, results and regions. Passes ask
the traits (``kind.is_pure``, ``kind.writes_memory`` ...) instead of keeping their own sets of kinds.

The other per-op rules live with the layer that owns them, keyed by the same ``OpKind``: the interpreter's
(``interpreter.rule``), the layout pass's (``passes.layouts.layout_rule``) and the CUDA emitter's
(``backend_cuda.emitter.emits``); a test checks that every kind has one in each.

Adding an op: a member here (with its attrs class and rule), a semantic builder in ``frontend/``, and one rule
in each of the three tables.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

from .. import dtypes as D
from ..dtypes import DType
from .types import ScalarType, TensorListType, TensorType, TileType
from .types import Scope


class Family(enum.Enum):
    SCALAR = "scalar"        # constants, program ids, tensor metadata
    ARITH = "arith"          # elementwise arithmetic on scalars or same-shape tiles
    TILE = "tile"            # tile creation and shape manipulation
    REDUCE = "reduce"
    COMPUTE = "compute"      # tensor-core matrix products
    MEMORY = "memory"        # global loads/stores and (after lowering) shared staging
    CONTROL = "control"      # for / if / yield
    SYNC = "sync"            # barriers and async groups (lowered IR only)


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
    LOG2 = "log2"
    SIN = "sin"
    COS = "cos"
    TANH = "tanh"
    ERF = "erf"
    SIGMOID = "sigmoid"


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
    """acc + op(a) @ op(b); ``impl`` names the lowering the dispatch registry chose (backend passes). The
    result has the accumulator's dtype: float32 (int32 for int8 operands, float64 for float64), or float16 for
    float16 operands accumulating in float16 (``T.gemm(..., out_dtype=T.float16)``).

    ``precision`` is set for float32 operands (one of :data:`F32_PRECISIONS`): ``"tf32"`` multiplies on
    tensor cores with each operand truncated to tf32 (10 mantissa bits), ``"tf32x3"`` splits each operand into
    a tf32 high part and a tf32 remainder and sums three tensor-core products (close to float32 accuracy),
    ``"ieee"`` multiplies in exact float32 on FMAs. For float8 operands it is one of :data:`FP8_PRECISIONS`:
    ``"precise"`` sums in float32 (where the tensor cores accumulate float8 products with fewer bits, sm_90a's
    wgmma, the partial sums are promoted into float32 registers every 128 products of K), ``"fast"`` keeps the
    tensor cores' own accumulator for the whole loop. Other operand dtypes have one way to multiply (None).
    A fourth operand, an M x N float32 tile ``scale``, makes the gemm ``acc + (op(a) @ op(b)) * scale`` over at most
    128 products of K (a block-scaled float8 product folded into a wgmma gemm's promotion by
    ``passes/scaled_promotion.py``).
    """
    transpose_a: bool = False
    transpose_b: bool = False
    precision: str | None = None
    impl: str | None = None


#: Elements of K one e8m0 scale of a block-scaled (microscaled, OCP MX) gemm covers. Such a gemm has five
#: operands: a, b, acc, then the e8m0 scale tiles of op(a)'s rows (M, K / 32) and op(b)'s columns (N, K / 32).
MX_BLOCK = 32


def is_block_scaled(op) -> bool:
    """Whether the gemm ``op`` carries e8m0 block scales (operands 3 and 4)."""
    return len(op.operands) == 5


#: The ``precision=`` choices of a gemm on float32 operands; the first is the default of ``a @ b``.
F32_PRECISIONS = ("tf32", "tf32x3", "ieee")
#: The ``precision=`` choices of a gemm on float8 operands; the first is the default of ``a @ b``.
FP8_PRECISIONS = ("precise", "fast")


def gemm_precisions(operand: D.DType) -> tuple[str, ...]:
    """The ``precision=`` choices of a gemm on ``operand`` tiles, the default first; () when there is one way."""
    if operand == D.float32:
        return F32_PRECISIONS
    return FP8_PRECISIONS if operand.is_fp8 else ()


@dataclass(frozen=True)
class AccessAttrs:
    """A tile-shaped window of a global tensor.

    ``shape[d]`` is the window's length along tensor dim ``d``; dims listed in ``dropped`` were indexed
    by an integer and are absent from the tile (their length is 1). Elements outside the tensor read as
    ``0`` (load) or are not written (store). When every dim is dropped (``X[i, j]``) the window is one
    element and the value a scalar.
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
class IndexedAttrs:
    """A window of a global tensor whose dim ``axis`` is picked element by element by an index tile (gather,
    scatter): ``shape[axis]`` is the number of indices, the other dims are as in :class:`AccessAttrs`. The
    op's index operand has the tile's shape (the frontend broadcasts the 1-D index tile); an index outside
    the tensor reads 0 (gather) or is not written (scatter)."""
    shape: tuple[int, ...]
    dropped: tuple[int, ...]
    axis: int

    def __post_init__(self) -> None:
        if any(n <= 0 for n in self.shape):
            raise ValueError(f"window lengths must be positive: {self.shape}")
        if any(self.shape[d] != 1 for d in self.dropped) or self.axis in self.dropped:
            raise ValueError("a dropped dim has length 1 and is not the indexed one")
        if not 0 <= self.axis < len(self.shape):
            raise ValueError(f"indexed dim {self.axis} out of range")

    @property
    def tile_shape(self) -> tuple[int, ...]:
        return tuple(n for d, n in enumerate(self.shape) if d not in self.dropped)


class AtomicOp(enum.Enum):
    ADD = "add"
    MAX = "max"
    MIN = "min"
    XCHG = "xchg"
    CAS = "cas"


ATOMIC_SEMS = ("relaxed", "acquire", "release", "acq_rel")
ATOMIC_SCOPES = ("gpu", "cta", "sys")


@dataclass(frozen=True)
class AtomicAttrs:
    """A read-modify-write of every element of a window (``shape``/``dropped`` as in :class:`AccessAttrs`; with
    ``axis`` set, that dim is picked by an index tile as in :class:`IndexedAttrs`). Operands: the tensor, the
    value, the compared value (``cas`` only), the index tile (``axis`` only), then one start per tensor dim.
    The result holds the old values; elements outside the tensor are skipped (their result is 0). ``sem`` and
    ``scope`` are the PTX memory-ordering qualifiers (``atom.<sem>.<scope>``)."""
    op: AtomicOp
    sem: str
    scope: str
    shape: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    axis: int | None = None

    def __post_init__(self) -> None:
        if self.sem not in ATOMIC_SEMS:
            raise ValueError(f"sem must be one of {ATOMIC_SEMS}, got {self.sem!r}")
        if self.scope not in ATOMIC_SCOPES:
            raise ValueError(f"scope must be one of {ATOMIC_SCOPES}, got {self.scope!r}")
        if any(n <= 0 for n in self.shape) or any(self.shape[d] != 1 for d in self.dropped):
            raise ValueError(f"bad window {self.shape} (dropped {self.dropped})")
        if self.axis is not None and (self.axis in self.dropped or not 0 <= self.axis < len(self.shape)):
            raise ValueError(f"bad indexed dim {self.axis}")

    @property
    def tile_shape(self) -> tuple[int, ...]:
        return tuple(n for d, n in enumerate(self.shape) if d not in self.dropped)

    @property
    def first_start(self) -> int:
        """Index of the first start operand (after the tensor, value, cmp and index operands)."""
        return 2 + (self.op is AtomicOp.CAS) + (self.axis is not None)

    @property
    def index_operand(self) -> int | None:
        return None if self.axis is None else 2 + (self.op is AtomicOp.CAS)


@dataclass(frozen=True)
class ForAttrs:
    kind: LoopKind = LoopKind.RANGE
    stages: int | None = None  # None: take the launch's num_stages
    # set by the backend (passes/software_pipeline.mark_async_mma): the loop's gemms stay in flight across iterations,
    # "wgmma" (sm_90a) or "tcgen05" (sm_100a, accumulators kept in tensor memory for the whole loop)
    async_mma: str | None = None
    # the user's T.range(..., warp_specialize=) (None: the launch option decides)
    warp_specialize: bool | None = None
    # set by the backend (passes/warp_specialize.specialize_warps): a producer warpgroup issues the ring's TMA
    # loads while the launch's warps only compute (lower_specialized emits the producer, lower_loops the math; the
    # kernel launches one warpgroup more)
    producer_warpgroup: bool | None = None  # None when not (so the printer leaves it out)
    # set by the backend (specialize_warps, ``passes.warp_specialize.deferred_gemm``): the body's last gemm is issued in
    # the next iteration, after that iteration's first gemm, so it runs under the math between them
    # (FlashAttention-3's intra-warpgroup overlap; lower_loops emits the rotation)
    defer_mma: bool | None = None
    # set by passes/peel_masks.py on the loops it splits a loop into: "unmasked" (the iterations whose masks are all
    # true, with the masks taken away) or "masked" (the others, with the original body)
    peeled: str | None = None

    def __post_init__(self) -> None:
        if self.stages is not None and self.stages < 1:
            raise ValueError("stages must be >= 1")
        if self.peeled not in (None, "unmasked", "masked"):
            raise ValueError(f"peeled is 'unmasked' or 'masked', not {self.peeled!r}")


@dataclass(frozen=True)
class SplitAttrs:
    """``splits`` programs share one K loop (the ``split_k`` launch option; passes/split_k.py)."""
    splits: int

    def __post_init__(self) -> None:
        if not 2 <= self.splits <= 8:
            raise ValueError("a split-K cluster has 2 to 8 programs")


@dataclass(frozen=True)
class StreamKAttrs:
    """Which end of the current stream-K run of K iterations (the ``stream_k`` launch option; passes/split_k.py):
    its first iteration (``end`` False) or one past its last, counted from the tile's first iteration."""
    end: bool


class Trait(enum.Flag):
    """What passes may assume about every op of a kind."""
    NONE = 0
    PURE = enum.auto()           # no effects: the same operands and attrs give the same results; dead if unused
    READS_MEMORY = enum.auto()   # reads global or shared memory (not pure: a store may come between two reads)
    WRITES_MEMORY = enum.auto()  # has an effect: kept even when nothing uses its results
    TERMINATOR = enum.auto()     # ends a region and passes values out of it
    REGIONS = enum.auto()        # holds blocks; its effects are those of the ops inside
    ELEMENTWISE = enum.auto()    # operands and result of one shape, element by element: a layout flows through
    ANY_LAYOUT = enum.auto()     # its result can be built directly in whatever register layout its users want
    LOWERED = enum.auto()        # made by passes only; the frontend never produces it


PURE, READS, WRITES, TERM, REGIONS, ELEMWISE, ANY_LAYOUT, LOWERED = (
    Trait.PURE, Trait.READS_MEMORY, Trait.WRITES_MEMORY, Trait.TERMINATOR, Trait.REGIONS, Trait.ELEMENTWISE,
    Trait.ANY_LAYOUT, Trait.LOWERED)

# -- structural rules (the verifier): each returns what is wrong with an op, or None ------------------------------

Rule = Callable[[Any], "str | None"]


def _shape(v) -> tuple[int, ...]:
    return v.type.shape if isinstance(v.type, TileType) else ()


def no_rule(op) -> None:
    """Nothing to check beyond what every op gets (operands defined before use, attrs of the right class)."""
    return None


def _elementwise(op) -> str | None:
    shapes = {_shape(v) for v in op.operands}
    if len(shapes) != 1:
        return f"operands of different shapes {sorted(shapes)}"
    if _shape(op.result) != shapes.pop():
        return "result shape differs from operands"
    return None


def _binary(op) -> str | None:
    problem = _elementwise(op)
    if problem is None and len({v.dtype for v in op.operands}) != 1:
        return "operands of different dtypes"
    return problem


def _ternary(op) -> str | None:
    problem = _elementwise(op)
    if problem is None and len({v.dtype for v in op.operands}) != 1:
        return "operands of different dtypes"
    if problem is None and not op.operands[0].dtype.is_floating:
        return "fma needs floating-point operands"
    return problem


def _scan(op) -> str | None:
    x = op.operands[0].type
    if not isinstance(x, TileType) or _shape(op.result) != x.shape or op.attrs.axis >= x.rank:
        return "a scan keeps its operand's shape, along an existing axis"
    return None


def _unary(op) -> str | None:
    if _shape(op.operands[0]) != _shape(op.result):
        return "result shape differs from operand"
    return None


def _stream_k_fixup(op) -> str | None:
    n = len(op.operands)
    if len(op.results) != n + 1 or not n:
        return "takes the loop's accumulators and gives each summed, then whether this program owns the sum"
    if any(_shape(a) != _shape(r) for a, r in zip(op.operands, op.results)):
        return "result shape differs from operand"
    if op.results[-1].is_tile or op.results[-1].dtype != D.bool_:
        return "its last result is a bool scalar"
    return None


def _transpose_copy(op) -> str | None:
    src, dst = op.operands[0].type, op.result.type
    if len(src.shape) != 2 or dst.shape != src.shape[::-1]:
        return f"transpose_copy of {src.shape} gives {dst.shape}, not the swapped 2-D shape"
    if src.dtype != dst.dtype:
        return f"transpose_copy changes the dtype ({src.dtype} -> {dst.dtype})"
    return None


def _gemm(op) -> str | None:
    if len(op.operands) not in (3, 3 + 1, 3 + 2):
        return (f"a gemm takes a, b, acc (and a scale tile, or two block-scale tiles), not {len(op.operands)} "
                "operands")
    a, b, acc = (v.type for v in op.operands[:3])
    m, k = a.shape[::-1] if op.attrs.transpose_a else a.shape
    k2, n = b.shape[::-1] if op.attrs.transpose_b else b.shape
    if k != k2 or acc.shape != (m, n) or op.result.type.shape != (m, n):
        return f"gemm shapes {a.shape} x {b.shape} -> {acc.shape} do not agree"
    if len(op.operands) == 5:
        sa, sb = (v.type for v in op.operands[3:])
        if not (a.dtype.is_fp8 and b.dtype.is_fp8 and acc.dtype == D.float32 and k % MX_BLOCK == 0):
            return f"a block-scaled gemm takes float8 operands, K a multiple of {MX_BLOCK}, a float32 accumulator"
        if not (sa.dtype.is_scale and sb.dtype.is_scale and sa.shape == (m, k // MX_BLOCK)
                and sb.shape == (n, k // MX_BLOCK)):
            return f"block scales {sa} and {sb} are not e8m0 tiles of (M, K / 32) and (N, K / 32)"
    if len(op.operands) == 4:
        scale = op.operands[3].type
        if not (a.dtype.is_fp8 and b.dtype.is_fp8 and acc.dtype == D.float32 and k <= 128
                and isinstance(scale, TileType) and scale.shape == (m, n) and scale.dtype == D.float32
                and op.attrs.precision == "precise"):
            return (f"a scaled gemm (acc + (a @ b) * scale, passes/scaled_promotion.py) takes float8 operands over "
                    f"at most 128 of K, a float32 accumulator and an M x N float32 scale, precision 'precise'; "
                    f"got {a} x {b}, scale {scale}")
    if acc.dtype != op.result.dtype:
        return f"gemm accumulator {acc.dtype} and result {op.result.dtype} differ"
    if acc.dtype == D.float16 and a.dtype != D.float16:
        return f"a float16 accumulator needs float16 operands, not {a.dtype}"
    choices = gemm_precisions(a.dtype)
    if (op.attrs.precision is not None) != bool(choices):
        return (f"gemm precision {op.attrs.precision!r} with {a.dtype} operands (set for float32 and float8 "
                f"operands only)")
    if op.attrs.precision is not None and op.attrs.precision not in choices:
        return f"gemm precision {op.attrs.precision!r} does not apply to {a.dtype} operands"
    return None


def _access(op, starts: list, tile) -> str | None:
    tensor = op.operands[0].type
    if not isinstance(tensor, TensorType):
        return "first operand is not a tensor"
    if len(starts) != tensor.rank or len(op.attrs.shape) != tensor.rank:
        return f"{len(starts)} start indices for a rank-{tensor.rank} tensor"
    if any(not isinstance(s.type, ScalarType) or not s.dtype.is_integer for s in starts):
        return "start indices must be integer scalars"
    if not op.attrs.tile_shape:  # one element: a scalar of the tensor's dtype
        if tile != ScalarType(tensor.dtype):
            return f"a one-element window gives a {tensor.dtype} scalar, not {tile}"
        return None
    if not isinstance(tile, TileType) or tile.shape != op.attrs.tile_shape:
        return f"tile {tile} does not match the window {op.attrs.tile_shape}"
    return None


def _load(op) -> str | None:
    return _access(op, op.operands[1:], op.result.type)


def _store(op) -> str | None:
    return _access(op, op.operands[2:], op.operands[1].type)


def _starts_ok(tensor, starts: list, shape: tuple) -> str | None:
    if len(starts) != tensor.rank or len(shape) != tensor.rank:
        return f"{len(starts)} start indices for a rank-{tensor.rank} tensor"
    if any(not isinstance(s.type, ScalarType) or not s.dtype.is_integer for s in starts):
        return "start indices must be integer scalars"
    return None


def _value_matches(v, tensor: TensorType, tile_shape: tuple, what: str) -> str | None:
    want = TileType(tile_shape, tensor.dtype) if tile_shape else ScalarType(tensor.dtype)
    got = v.type
    if isinstance(got, TileType):
        got = TileType(got.shape, got.dtype)  # scope and layout do not matter here
    if got != want:
        return f"{what} {v.type} does not match the window ({want})"
    return None


def _index_ok(index, tile_shape: tuple) -> str | None:
    if not isinstance(index.type, TileType) or index.type.shape != tile_shape or not index.dtype.is_integer:
        return f"the index operand must be an integer tile of shape {tile_shape}, got {index.type}"
    return None


def _gather(op) -> str | None:
    tensor = op.operands[0].type
    if not isinstance(tensor, TensorType):
        return "first operand is not a tensor"
    return (_starts_ok(tensor, op.operands[2:], op.attrs.shape) or _index_ok(op.operands[1], op.attrs.tile_shape)
            or _value_matches(op.result, tensor, op.attrs.tile_shape, "result"))


def _scatter(op) -> str | None:
    tensor = op.operands[0].type
    if not isinstance(tensor, TensorType):
        return "first operand is not a tensor"
    return (_starts_ok(tensor, op.operands[3:], op.attrs.shape) or _index_ok(op.operands[2], op.attrs.tile_shape)
            or _value_matches(op.operands[1], tensor, op.attrs.tile_shape, "value"))


def _atomic(op) -> str | None:
    tensor = op.operands[0].type
    if not isinstance(tensor, TensorType):
        return "first operand is not a tensor"
    a = op.attrs
    problem = _starts_ok(tensor, op.operands[a.first_start:], a.shape)
    for i in range(1, a.first_start):
        if problem is None:
            problem = (_index_ok(op.operands[i], a.tile_shape) if i == a.index_operand
                       else _value_matches(op.operands[i], tensor, a.tile_shape, "value"))
    return problem or _value_matches(op.result, tensor, a.tile_shape, "result")


def _bounded(op) -> str | None:
    tensor = op.operands[0].type
    if not isinstance(tensor, TensorType) or op.result.type != tensor:
        return "a bounded view is a tensor of its operand's type"
    extents = op.operands[1:]
    if len(extents) != tensor.rank or any(not isinstance(e.type, ScalarType) or not e.dtype.is_integer
                                          for e in extents):
        return f"a bounded view of a rank-{tensor.rank} tensor takes {tensor.rank} integer extents"
    return None


def _list_item(op) -> str | None:
    tensors, index = op.operands
    if not isinstance(tensors.type, TensorListType) or op.result.type != tensors.type.element:
        return "a tensor-list item is a tensor of the list's dtype and rank"
    if not isinstance(index.type, ScalarType) or not index.dtype.is_integer:
        return "a tensor-list item is picked by an integer scalar"
    return None


def _list_len(op) -> str | None:
    if not isinstance(op.operands[0].type, TensorListType) or op.result.type != ScalarType(D.int64):
        return "the length of a tensor list is an int64 scalar"
    return None


def _for(op) -> str | None:
    body = op.regions[0]
    inits = op.operands[3:]
    if len(body.args) != len(inits) + 1:
        return "body arguments do not match iter_args"
    term = body.terminator
    if term is None or len(term.operands) != len(inits):
        return "body must end in a yield of every carried value"
    for init, arg, res, y in zip(inits, body.args[1:], op.results, term.operands):
        inside = arg.type
        if op.attrs.async_mma == "tcgen05" and isinstance(inside, TileType) and inside.scope is Scope.TMEM:
            # an accumulator kept in tensor memory through the loop (passes/software_pipeline.mark_async_mma): a TMEM
            # tile in the body, registers where it enters and leaves
            inside = inside.with_scope(Scope.REGISTER)
        if not (init.type == inside == res.type) or y.type != arg.type:
            return f"carried value types differ: {init.type}, {arg.type}, {res.type}, {y.type}"
    return None


def _if(op) -> str | None:
    for region in op.regions:
        term = region.terminator
        if op.results and (term is None or [v.type for v in term.operands] != [r.type for r in op.results]):
            return "each branch must yield one value per result, of the result's type"
    return None


def _while(op) -> str | None:
    cond, body = op.regions
    types = [v.type for v in op.operands]
    if [a.type for a in cond.args] != types or [a.type for a in body.args] != types:
        return "condition and body arguments must match the carried values"
    if cond.terminator is None or len(cond.terminator.operands) != 1 or \
            not isinstance(cond.terminator.operands[0].type, ScalarType):
        return "the condition region must yield one scalar"
    if body.terminator is None or [v.type for v in body.terminator.operands] != types:
        return "the body must yield every carried value, of its type"
    if any(isinstance(t, TileType) for t in types):
        return "a while loop carries scalars only"
    return None


# -- the table ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpDecl:
    mnemonic: str
    family: Family
    attrs: type
    traits: Trait
    verify: Rule


class OpKind(enum.Enum):
    # scalar
    CONSTANT = OpDecl("constant", Family.SCALAR, ConstantAttrs, PURE, no_rule)
    PROGRAM_ID = OpDecl("program_id", Family.SCALAR, AxisAttrs, PURE, no_rule)
    NUM_PROGRAMS = OpDecl("num_programs", Family.SCALAR, AxisAttrs, PURE, no_rule)
    TENSOR_DIM = OpDecl("tensor_dim", Family.SCALAR, AxisAttrs, PURE, no_rule)
    TENSOR_STRIDE = OpDecl("tensor_stride", Family.SCALAR, AxisAttrs, PURE, no_rule)
    # elementwise arithmetic (scalars or tiles of one shape)
    BINARY = OpDecl("binary", Family.ARITH, BinaryAttrs, PURE | ELEMWISE, _binary)
    UNARY = OpDecl("unary", Family.ARITH, UnaryAttrs, PURE | ELEMWISE, _unary)
    COMPARE = OpDecl("cmp", Family.ARITH, CompareAttrs, PURE | ELEMWISE, _elementwise)
    SELECT = OpDecl("select", Family.ARITH, NoAttrs, PURE | ELEMWISE, _elementwise)
    CAST = OpDecl("cast", Family.ARITH, CastAttrs, PURE | ELEMWISE, _unary)
    FMA = OpDecl("fma", Family.ARITH, NoAttrs, PURE | ELEMWISE, _ternary)  # a * b + c, rounded once
    # tile creation and shape
    SPLAT = OpDecl("splat", Family.TILE, ShapeAttrs, PURE | ANY_LAYOUT, no_rule)
    ARANGE = OpDecl("arange", Family.TILE, ArangeAttrs, PURE | ANY_LAYOUT, no_rule)
    EXPAND_DIMS = OpDecl("expand_dims", Family.TILE, AxisAttrs, PURE, no_rule)
    BROADCAST = OpDecl("broadcast", Family.TILE, ShapeAttrs, PURE | ANY_LAYOUT, no_rule)
    TRANSPOSE = OpDecl("trans", Family.TILE, PermAttrs, PURE, no_rule)
    CONVERT_LAYOUT = OpDecl("convert_layout", Family.TILE, NoAttrs, PURE | ANY_LAYOUT | LOWERED, _unary)
    # a 2-D shared tile copied into a new shared tile with its dims swapped: a gemm operand given in the
    # major-ness its tensor-core instruction cannot read (passes/transpose_operands.py)
    TRANSPOSE_COPY = OpDecl("transpose_copy", Family.TILE, NoAttrs, PURE | LOWERED, _transpose_copy)
    # reductions
    REDUCE = OpDecl("reduce", Family.REDUCE, ReduceAttrs, PURE, no_rule)
    SCAN = OpDecl("cumsum", Family.REDUCE, AxisAttrs, PURE, _scan)  # inclusive prefix sum along axis
    # compute
    GEMM = OpDecl("gemm", Family.COMPUTE, GemmAttrs, PURE, _gemm)
    # memory
    LOAD = OpDecl("load", Family.MEMORY, AccessAttrs, READS, _load)
    STORE = OpDecl("store", Family.MEMORY, AccessAttrs, WRITES, _store)
    GATHER = OpDecl("gather", Family.MEMORY, IndexedAttrs, READS, _gather)      # X[idx, 0:D]
    SCATTER = OpDecl("scatter", Family.MEMORY, IndexedAttrs, WRITES, _scatter)  # X[idx, 0:D] = v
    ATOMIC = OpDecl("atomic", Family.MEMORY, AtomicAttrs, READS | WRITES, _atomic)
    # T.bounded(C, (M, N)): the same tensor with its extents cut to min(extent, bound) (>= 0); no memory access
    BOUNDED = OpDecl("bounded", Family.MEMORY, NoAttrs, PURE, _bounded)
    # As[g] of a tensor-list argument: tensor g's pointer, sizes and strides, read from the list's device table
    # (written once per launch and never by the kernel, hence pure); an index outside the list gives an empty
    # tensor (every extent 0), which loads read as 0 and stores skip
    LIST_ITEM = OpDecl("list_item", Family.MEMORY, NoAttrs, PURE, _list_item)
    LIST_LEN = OpDecl("list_len", Family.SCALAR, NoAttrs, PURE, _list_len)  # len(As), a run-time int64
    # control flow
    FOR = OpDecl("for", Family.CONTROL, ForAttrs, REGIONS, _for)
    IF = OpDecl("if", Family.CONTROL, NoAttrs, REGIONS, _if)
    WHILE = OpDecl("while", Family.CONTROL, NoAttrs, REGIONS, _while)  # regions: condition (yields a bool), body
    YIELD = OpDecl("yield", Family.CONTROL, NoAttrs, TERM, no_rule)
    # split-K (passes/split_k.py): which of the cluster's programs this is (0 .. splits-1), and the sum of a
    # partial accumulator over the cluster's programs (valid in program 0; a cluster-wide barrier, so every
    # program reaches it once)
    SPLIT_INDEX = OpDecl("split_index", Family.SCALAR, SplitAttrs, PURE | LOWERED, no_rule)
    SPLIT_REDUCE = OpDecl("split_reduce", Family.SYNC, SplitAttrs, READS | WRITES | LOWERED, _unary)
    # stream-K (passes/split_k.stream_k): the bounds of the run of K iterations a persistent program does now for
    # its output tile (int32, from 0 to the tile's iteration count), and the fix-up of the loop's accumulators
    # after it: results are the accumulators summed over the tile's runs, valid where the last bool result is
    # true (the run covers the tile, or it finished last of the tile's runs: that program runs the epilogue).
    # Made after layout inference, with typed results.
    STREAM_K_BOUND = OpDecl("stream_k_bound", Family.SCALAR, StreamKAttrs, PURE | LOWERED, no_rule)
    STREAM_K_FIXUP = OpDecl("stream_k_fixup", Family.SYNC, NoAttrs, READS | WRITES | LOWERED, _stream_k_fixup)

    @property
    def mnemonic(self) -> str:
        return self.value.mnemonic

    @property
    def family(self) -> Family:
        return self.value.family

    @property
    def attrs(self) -> type:
        """The attribute dataclass every op of this kind carries."""
        return self.value.attrs

    @property
    def traits(self) -> Trait:
        return self.value.traits

    def has(self, trait: Trait) -> bool:
        return bool(self.value.traits & trait)

    @property
    def is_pure(self) -> bool:
        return self.has(Trait.PURE)

    @property
    def writes_memory(self) -> bool:
        return self.has(Trait.WRITES_MEMORY)

    @property
    def is_terminator(self) -> bool:
        return self.has(Trait.TERMINATOR)

    @property
    def is_elementwise(self) -> bool:
        return self.has(Trait.ELEMENTWISE)

    def verify(self, op) -> str | None:
        """What is wrong with ``op`` (of this kind), or None."""
        return self.value.verify(op)
