"""What each integer scalar of a kernel is known to be a multiple of, and whether it is known to be >= 0.

The CUDA emitter asks these facts before it tests at run time whether a window may move with vector accesses
(``backend_cuda/lower_memory.py``); a test they prove is left out, and when every test is, so is the
element-wise variant behind it.

* A divisor is the largest power of two known to divide the value (1: nothing known). Alignment only asks
  about powers of two, and they survive the wrap-around of fixed-width arithmetic; a divisor is capped at
  ``2**(bits - 1)`` of the value's dtype, which is also what the constant 0 gets.
* Sources: constants; promises on values (``Value.multiple_of``: ``T.multiple_of``, and each int argument the
  specialization found divisible by 16); from the specialization of tensor arguments (``TensorSpec``),
  compile-time extents and strides that are multiples of 16 bytes (``strides16``). A promise on a tensor's
  extent or stride value (``T.multiple_of(X.shape[1], 16)``) holds for the tensor itself.
* One rule per op kind (``_RULES``, registered with ``@_rule``): sums and differences keep the smaller divisor,
  products multiply them, a loop's induction variable gets the smaller of its start's and step's, casts keep
  the divisor (capped when they narrow). Loop-carried values and while-loop values are unknown unless promised.
* The sign: program ids, tensor extents and strides, list lengths and non-negative constants are >= 0, and
  sums, products, min/max and floor divisions of such values stay so (assuming no overflow, as C does).

A broken promise is the user's bug: the code relying on it is then wrong (undefined results, as in Triton).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .. import dtypes as D
from ..ir import BinaryOp, Block, Function, Op, OpKind, UnaryOp, Value


@dataclass(frozen=True)
class Facts:
    """What is known of one integer scalar."""
    divisor: int = 1           # a power of two the value is a multiple of
    nonnegative: bool = False

    def __post_init__(self) -> None:
        if self.divisor < 1 or self.divisor & (self.divisor - 1):
            raise ValueError(f"a divisor is a power of two, got {self.divisor}")


UNKNOWN = Facts()


def power_of_two_part(n: int, cap: int) -> int:
    """The largest power of two dividing ``n``, at most ``cap`` (``cap`` for 0, which every number divides)."""
    return cap if n == 0 else min(abs(n) & -abs(n), cap)


def _cap(dtype: D.DType) -> int:
    return 1 << (dtype.bits - 1)


def _is_int_scalar(v: Value) -> bool:
    return v.is_scalar and v.dtype.is_integer


Rule = Callable[["Divisibility", Op], "Facts | list[Facts]"]
_RULES: dict[OpKind, Rule] = {}


def _rule(*kinds: OpKind) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for kind in kinds:
            _RULES[kind] = fn
        return fn
    return register


class Divisibility:
    """The facts of every integer scalar of ``fn`` (computed once, in program order), and what they say about
    the tensors the kernel accesses."""

    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self.specs: dict[str, Any] = fn.attrs.get("tensor_specs", {})
        self.facts: dict[int, Facts] = {}
        # promises made on a tensor's extent or stride values: (tensor value id, dim) -> divisor
        self._promised_dims: dict[tuple[int, int], int] = {}
        self._promised_strides: dict[tuple[int, int], int] = {}
        for op in fn.walk():
            if op.kind in (OpKind.TENSOR_DIM, OpKind.TENSOR_STRIDE) and op.result.multiple_of is not None:
                table = self._promised_dims if op.kind is OpKind.TENSOR_DIM else self._promised_strides
                key = (op.operands[0].id, op.attrs.axis)
                table[key] = max(table.get(key, 1), self._promise(op.result))
        for p in fn.params:
            if p.value is not None and _is_int_scalar(p.value):
                self._set(p.value, UNKNOWN)
        self._block(fn.body)

    # -- queries -------------------------------------------------------------------------------------------------

    def of(self, v: Value) -> Facts:
        return self.facts.get(v.id, UNKNOWN)

    def divisor(self, v: Value) -> int:
        return self.of(v).divisor

    def nonnegative(self, v: Value) -> bool:
        return self.of(v).nonnegative

    def pointer_alignment(self, tensor: Value) -> int:
        """Bytes the data pointer of ``tensor`` (a parameter, a bounded view of one, a list item) is aligned to:
        16 when the specialization found it so, else the element size (torch's guarantee)."""
        spec = self.specs.get(tensor.name)
        return 16 if spec is not None and spec.aligned16 else tensor.dtype.itemsize

    def extent_divisor(self, tensor: Value, d: int) -> int:
        """A power of two that ``tensor.shape[d]`` is a multiple of: a compile-time extent, a promise on the extent,
        or for a bounded view the smaller of its source's and its bound's (its extent is one of them, or 0)."""
        cap = _cap(D.int64)
        promised = self._promised_dims.get((tensor.id, d), 1)
        op = tensor.owner if isinstance(tensor.owner, Op) else None
        if op is not None and op.kind is OpKind.BOUNDED:
            return max(promised, min(self.extent_divisor(op.operands[0], d), self.divisor(op.operands[1 + d])))
        if op is None:  # a parameter: its specialization may fix the extent
            spec = self.specs.get(tensor.name)
            fixed = dict(spec.shape_constants) if spec is not None else {}
            if d in fixed:
                return max(promised, power_of_two_part(fixed[d], cap))
        return promised

    def stride_divisor(self, tensor: Value, d: int) -> int:
        """A power of two that ``tensor.stride(d)`` (in elements) is a multiple of: from the specialization (every
        stride other than a unit one a multiple of 16 bytes), or a promise on the stride."""
        promised = self._promised_strides.get((tensor.id, d), 1)
        op = tensor.owner if isinstance(tensor.owner, Op) else None
        if op is not None and op.kind is OpKind.BOUNDED:  # the source's strides
            return max(promised, self.stride_divisor(op.operands[0], d))
        spec = self.specs.get(tensor.name)
        if op is None and spec is not None and spec.strides16 and d not in spec.unit_stride_dims:
            return max(promised, 16 // min(16, tensor.dtype.itemsize))
        return promised

    # -- the walk ------------------------------------------------------------------------------------------------

    def _promise(self, v: Value) -> int:
        if v.multiple_of is None or not v.is_scalar:
            return 1
        return power_of_two_part(v.multiple_of.divisors[0], _cap(v.dtype))

    def _set(self, v: Value, derived: Facts) -> None:
        """Record what ``v`` is known to be: derived from its definition, and promised."""
        promised = self._promise(v)
        self.facts[v.id] = Facts(max(derived.divisor, promised), derived.nonnegative) if promised > 1 else derived

    def _block(self, block: Block) -> None:
        for op in block.ops:
            if op.kind is OpKind.FOR:
                lo, _, step = op.operands[:3]
                iv, *carried = op.regions[0].args
                # lo + k * step for k = 0, 1, ...
                self._set(iv, Facts(min(self.divisor(lo), self.divisor(step)),
                                    self.nonnegative(lo) and self.nonnegative(step)))
                for a in carried:
                    if _is_int_scalar(a):
                        self._set(a, UNKNOWN)
            else:
                for region in op.regions:
                    for a in region.args:
                        if _is_int_scalar(a):
                            self._set(a, UNKNOWN)
            for region in op.regions:
                self._block(region)
            if not any(_is_int_scalar(r) for r in op.results):
                continue
            rule = _RULES.get(op.kind)
            derived = rule(self, op) if rule is not None else UNKNOWN
            derived = derived if isinstance(derived, list) else [derived] * len(op.results)
            for r, f in zip(op.results, derived):
                if _is_int_scalar(r):
                    self._set(r, f)


# -- rules: the facts of an op's (integer scalar) result from its operands' --------------------------------------

@_rule(OpKind.CONSTANT)
def _constant(an: Divisibility, op: Op) -> Facts:
    value = op.attrs.value
    return Facts(power_of_two_part(int(value), _cap(op.result.dtype)), value >= 0)


@_rule(OpKind.PROGRAM_ID, OpKind.NUM_PROGRAMS, OpKind.LIST_LEN, OpKind.SPLIT_INDEX, OpKind.STREAM_K_BOUND)
def _grid_and_counts(an: Divisibility, op: Op) -> Facts:
    return Facts(1, True)


@_rule(OpKind.TENSOR_DIM)
def _tensor_dim(an: Divisibility, op: Op) -> Facts:
    return Facts(an.extent_divisor(op.operands[0], op.attrs.axis), True)


@_rule(OpKind.TENSOR_STRIDE)
def _tensor_stride(an: Divisibility, op: Op) -> Facts:
    return Facts(an.stride_divisor(op.operands[0], op.attrs.axis), True)  # torch has no negative strides


def _const(v: Value) -> int | None:
    op = v.owner
    return op.attrs.value if isinstance(op, Op) and op.kind is OpKind.CONSTANT else None


def _shift(v: Value) -> int | None:
    """The shift amount, when ``v`` is a constant one (0 .. 62)."""
    c = _const(v)
    return c if isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 63 else None


@_rule(OpKind.BINARY)
def _binary(an: Divisibility, op: Op) -> Facts:
    a, b = (an.of(v) for v in op.operands)
    cap = _cap(op.result.dtype)
    kind = op.attrs.op
    both = a.nonnegative and b.nonnegative
    low = min(a.divisor, b.divisor)
    if kind is BinaryOp.ADD:
        return Facts(low, both)
    if kind is BinaryOp.SUB:
        return Facts(low)
    if kind is BinaryOp.MUL:
        return Facts(min(a.divisor * b.divisor, cap), both)
    if kind is BinaryOp.MIN:  # the result is one of the two
        return Facts(low, both)
    if kind is BinaryOp.MAX:
        return Facts(low, a.nonnegative or b.nonnegative)
    if kind is BinaryOp.MOD:  # a - q * b: a multiple of both divisors' smaller; Python's sign is the divisor's
        return Facts(low, b.nonnegative)
    if kind is BinaryOp.AND:  # the low zero bits of either operand stay zero; the sign bit needs both
        return Facts(max(a.divisor, b.divisor), a.nonnegative or b.nonnegative)
    if kind in (BinaryOp.OR, BinaryOp.XOR):
        return Facts(low, both)
    shift = _shift(op.operands[1])
    if kind is BinaryOp.SHL:
        return Facts(min(a.divisor << shift, cap) if shift is not None else a.divisor, a.nonnegative)
    if kind in (BinaryOp.SHR, BinaryOp.FLOORDIV):
        if kind is BinaryOp.FLOORDIV:
            c = _const(op.operands[1])
            shift = c.bit_length() - 1 if isinstance(c, int) and c > 0 and c & (c - 1) == 0 else None
        # an exact division by 2**shift when the divisor allows it
        divisor = a.divisor >> shift if shift is not None and a.divisor >> shift >= 1 else 1
        return Facts(divisor, both if kind is BinaryOp.FLOORDIV else a.nonnegative)
    return UNKNOWN


@_rule(OpKind.UNARY)
def _unary(an: Divisibility, op: Op) -> Facts:
    a = an.of(op.operands[0])
    if op.attrs.op is UnaryOp.NEG:
        return Facts(a.divisor)
    if op.attrs.op is UnaryOp.ABS:
        return Facts(a.divisor, True)
    return UNKNOWN


@_rule(OpKind.CAST)
def _cast(an: Divisibility, op: Op) -> Facts:
    src, dst = op.operands[0].dtype, op.result.dtype
    if src.is_bool:
        return Facts(1, True)
    if not src.is_integer:
        return UNKNOWN
    a = an.of(op.operands[0])
    # a wider (or equally wide, same kind) type holds the value unchanged; a narrower one keeps its low bits
    keeps = dst.bits > src.bits or (dst.bits == src.bits and dst.kind == src.kind)
    return Facts(min(a.divisor, _cap(dst)), dst.kind == "uint" or (keeps and a.nonnegative))


@_rule(OpKind.SELECT)
def _select(an: Divisibility, op: Op) -> Facts:
    a, b = (an.of(v) for v in op.operands[1:])
    return Facts(min(a.divisor, b.divisor), a.nonnegative and b.nonnegative)


@_rule(OpKind.IF)
def _if(an: Divisibility, op: Op) -> list[Facts]:
    """Each result is one branch's yield or the other's."""
    yields = [region.terminator.operands if region.terminator is not None else [] for region in op.regions]
    if len(op.regions) != 2 or any(len(y) != len(op.results) for y in yields):
        return [UNKNOWN] * len(op.results)
    return [Facts(min(an.divisor(a), an.divisor(b)), an.nonnegative(a) and an.nonnegative(b))
            for a, b in zip(*yields)]


def analyze_divisibility(fn: Function, target: Any = None) -> None:
    """The pass: the facts of ``fn`` as it will be emitted, kept in ``fn.attrs["divisibility"]``."""
    fn.attrs["divisibility"] = Divisibility(fn)
