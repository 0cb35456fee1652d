"""Peeling of masked loop iterations: a ``for`` loop whose body masks a tile with ``T.where(pred, x, y)``, where
``pred`` is provably all true over a contiguous run of iterations, is split into loops over the iterations before,
inside and after that run; inside it the ``T.where`` is replaced by ``x`` (Triton's tutorial attention does this by
hand with two loops; ``tilejit.ops.fused_attention`` too).

A predicate qualifies when it is a conjunction (``&``, broadcasts) of comparisons ``<``, ``<=``, ``>``, ``>=`` of
integer tiles (or scalars) that are affine in the loop's induction variable: sums of the induction variable, of
integer scalars defined before the loop (program ids, sizes, scalar arguments, anything: they are symbols), of
constants and of ``T.arange`` along each dim, scaled by constants; splats, broadcasts, ``[None, :]`` and widening
integer casts pass through. Each comparison ``a < b`` is all true over the tile when the largest element of
``a - b`` (known in closed form: the aranges' extents are constants) is below 0, which is one linear bound on the
induction variable; the run of iterations between the bounds is computed at run time, from the symbols, and
clamped to the loop's range, so the split loops run exactly the original iterations in the original order and
give bit-identical results. A loop that starts where another loop of its block ends was split by hand (the
masked tail of ``tilejit.ops.fused_attention``'s forward) and is left alone. Anything else (a comparison of loaded or float data, ``==``, a bound that does not
move with the loop) is left as it is, and a loop with no qualifying mask is not split.

The split loops carry ``peeled = unmasked`` / ``peeled = masked`` (``ForAttrs.peeled``): the printed IR shows
them, and each stays a ``T.range`` loop with the original's stages, so the pipelining and warp specialization that
follow treat it like any other. The masked loops do not ask for a producer warpgroup (``warp_specialize=False``):
one loop per kernel may have one, and it should be the unmasked loop, which runs most iterations. The ``peel_masks``
launch option (on by default) turns the pass off.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .. import dtypes as D
from ..ir import (BinaryAttrs, BinaryOp, Block, Builder, CastAttrs, CompareOp, ConstantAttrs, Function, Op, OpKind,
                  ScalarType, Value)
from ..ir.rewrite import blocks, clone_op
from ..target import Target
from .cleanup import sweep_block


def peel_masks(fn: Function, target: Target) -> None:
    """Split every loop of ``fn`` that has a qualifying mask (module docstring); off with ``peel_masks=False``."""
    if not target.options.peel_masks:
        return
    for block in list(blocks(fn.body)):
        ends = {op.operands[1].id for op in block.ops if op.kind is OpKind.FOR}
        for loop in [op for op in block.ops if op.kind is OpKind.FOR and op.attrs.peeled is None]:
            if loop.operands[0].id in ends:
                continue  # it starts where a loop before it ends: split by hand already (tilejit.ops.fused_attention)
            plan = peel_plan(loop)
            if plan is not None:
                _split(block, loop, plan)


# -- affine forms --------------------------------------------------------------------------------------------------


@dataclass
class Affine:
    """An integer value, element by element: ``iv * iv_coef + sum(coef * symbol) + const + sum_d lanes[d] * i_d``
    for the element at index ``(i_0, i_1, ...)`` of a tile of ``shape`` (a scalar: no dims)."""
    iv_coef: int = 0
    symbols: dict[int, tuple[Value, int]] = field(default_factory=dict)  # by value id: (symbol, its coefficient)
    const: int = 0
    lanes: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()

    def scaled(self, k: int) -> "Affine":
        return Affine(self.iv_coef * k, {i: (v, c * k) for i, (v, c) in self.symbols.items()}, self.const * k,
                      tuple(c * k for c in self.lanes), self.shape)

    def plus(self, other: "Affine") -> "Affine":
        symbols = dict(self.symbols)
        for i, (v, c) in other.symbols.items():
            symbols[i] = (v, symbols.get(i, (v, 0))[1] + c)
        return Affine(self.iv_coef + other.iv_coef, {i: s for i, s in symbols.items() if s[1]},
                      self.const + other.const, tuple(a + b for a, b in zip(self.lanes, other.lanes)), self.shape)

    @property
    def is_constant(self) -> bool:
        return not self.iv_coef and not self.symbols and not any(self.lanes)

    def extreme(self, largest: bool) -> int:
        """The largest (or smallest) value of the lanes' part over the tile."""
        pick = max if largest else min
        return sum(pick(0, c * (n - 1)) for c, n in zip(self.lanes, self.shape))


@dataclass
class Bound:
    """``iv_coef * iv + rest <= 0`` (``rest`` a scalar affine form of symbols and a constant; ``iv_coef`` != 0)."""
    iv_coef: int
    rest: Affine


@dataclass
class PeelPlan:
    """A loop's qualifying masks (``T.where`` ops of its body) and the bounds under which all of them are true."""
    selects: list[Op]
    upper: list[Bound]  # iv_coef > 0: an upper bound on the induction variable
    lower: list[Bound]  # iv_coef < 0


class _Affinity:
    """Affine forms of the values a loop body's masks read (``None``: not affine in the induction variable)."""

    def __init__(self, loop: Op) -> None:
        body = loop.regions[0]
        self.iv = body.args[0]
        self.inside = {a.id for a in body.args} | {r.id for op in body.walk() for r in op.results}
        self.memo: dict[int, Affine | None] = {}

    def of(self, v: Value) -> Affine | None:
        if v.id not in self.memo:
            self.memo[v.id] = self._form(v)
        return self.memo[v.id]

    def _form(self, v: Value) -> Affine | None:
        if not v.dtype.is_integer or v.dtype.kind == "uint":
            return None
        if v is self.iv:
            return Affine(iv_coef=1)
        op = v.owner if isinstance(v.owner, Op) else None
        form = self._op_form(op) if op is not None else None
        if form is None and v.is_scalar and v.id not in self.inside:
            return Affine(symbols={v.id: (v, 1)})  # defined before the loop: a symbol
        return form

    def _op_form(self, op: Op) -> Affine | None:
        kind, ins = op.kind, op.operands
        if kind is OpKind.CONSTANT and isinstance(op.attrs.value, int) and not isinstance(op.attrs.value, bool):
            return Affine(const=op.attrs.value)
        if kind is OpKind.ARANGE:
            return Affine(const=op.attrs.start, lanes=(1,), shape=(op.attrs.end - op.attrs.start,))
        if kind is OpKind.CAST:
            src = ins[0]
            widening = src.dtype.is_integer and src.dtype.kind == "int" and op.attrs.dtype.kind == "int" \
                and op.attrs.dtype.itemsize >= src.dtype.itemsize
            return self.of(src) if widening else None
        if kind in (OpKind.SPLAT, OpKind.EXPAND_DIMS, OpKind.BROADCAST):
            inner = self.of(ins[0])
            return None if inner is None else _reshaped(inner, op)
        if kind is OpKind.BINARY and op.attrs.op in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL):
            a, b = (self.of(x) for x in ins)
            if a is None or b is None:
                return None
            if op.attrs.op is BinaryOp.MUL:
                if b.is_constant:
                    return a.scaled(b.const)
                return b.scaled(a.const) if a.is_constant else None
            return a.plus(b if op.attrs.op is BinaryOp.ADD else b.scaled(-1))
        return None

    def bounds(self, pred: Value) -> list[Bound] | None:
        """The bounds under which every element of bool ``pred`` is true, or None when that is not provable."""
        op = pred.owner if isinstance(pred.owner, Op) else None
        if op is None:
            return None
        if op.kind in (OpKind.SPLAT, OpKind.EXPAND_DIMS, OpKind.BROADCAST):
            return self.bounds(op.operands[0])
        if op.kind is OpKind.BINARY and op.attrs.op is BinaryOp.AND and pred.dtype == D.bool_:
            parts = [self.bounds(x) for x in op.operands]
            return None if any(p is None for p in parts) else parts[0] + parts[1]
        if op.kind is not OpKind.COMPARE or op.attrs.op in (CompareOp.EQ, CompareOp.NE):
            return None
        a, b = (self.of(x) for x in op.operands)
        if a is None or b is None:
            return None
        diff = a.plus(b.scaled(-1))  # all true: max(diff) < 0 (lt), <= 0 (le); min(diff) > 0 (gt), >= 0 (ge)
        less = op.attrs.op in (CompareOp.LT, CompareOp.LE)
        strict = op.attrs.op in (CompareOp.LT, CompareOp.GT)
        rest = Affine(0, dict(diff.symbols), diff.const + diff.extreme(largest=less))
        bound = Bound(diff.iv_coef, rest) if less else Bound(-diff.iv_coef, rest.scaled(-1))
        bound.rest.const += int(strict)
        return [bound] if bound.iv_coef else None  # a bound the loop does not move: no run to peel


def _reshaped(inner: Affine, op: Op) -> Affine:
    """``inner`` splat, expanded or broadcast to the shape of ``op``'s result."""
    shape = op.result.type.shape if op.result.is_tile else ()
    if op.kind is OpKind.SPLAT:
        return Affine(inner.iv_coef, inner.symbols, inner.const, (0,) * len(shape), shape)
    if op.kind is OpKind.EXPAND_DIMS:
        at = op.attrs.axis
        return Affine(inner.iv_coef, inner.symbols, inner.const, inner.lanes[:at] + (0,) + inner.lanes[at:], shape)
    lanes = tuple(0 if n == 1 and m != 1 else c for c, n, m in zip(inner.lanes, inner.shape, shape))
    return Affine(inner.iv_coef, inner.symbols, inner.const, lanes, shape)


def peel_plan(loop: Op) -> PeelPlan | None:
    """What splitting ``loop`` would peel, or None when it has no qualifying mask or its step is not a positive
    constant."""
    step = loop.operands[2].owner
    if not (isinstance(step, Op) and step.kind is OpKind.CONSTANT and isinstance(step.attrs.value, int)
            and step.attrs.value > 0) or not loop.regions[0].args[0].dtype.is_integer:
        return None
    affinity = _Affinity(loop)
    plan = PeelPlan([], [], [])
    for op in loop.regions[0].ops:
        if op.kind is OpKind.SELECT and op.result.is_tile:
            found = affinity.bounds(op.operands[0])
            if found is not None:
                plan.selects.append(op)
                plan.upper += [b for b in found if b.iv_coef > 0]
                plan.lower += [b for b in found if b.iv_coef < 0]
    return plan if plan.selects else None


# -- the split -----------------------------------------------------------------------------------------------------


def _split(block: Block, loop: Op, plan: PeelPlan) -> None:
    """Replace ``loop`` in ``block`` by its masked head (iterations before the run; only with lower bounds), the
    unmasked run, and its masked tail (only with upper bounds), chained through their carried values."""
    at = block.ops.index(loop)
    build = Builder(Block())
    lo, hi, step = loop.operands[:3]
    with build.located(loop.loc):
        emit = _ScalarEmitter(build, lo.type)
        first = emit.clamp(emit.max_of([emit.first_at_or_after(b, lo, step) for b in plan.lower]), lo, hi) \
            if plan.lower else lo
        end = emit.max(emit.clamp(emit.min_of([emit.first_after(b, lo, step) for b in plan.upper]), lo, hi),
                       first) if plan.upper else hi
    segments = ([(lo, first, "masked")] if plan.lower else []) + [(first, end, "unmasked")] + \
        ([(end, hi, "masked")] if plan.upper else [])
    made, inits = [], list(loop.operands[3:])
    for i, (start, stop, peeled) in enumerate(segments):
        last = i == len(segments) - 1
        seg = loop if last else clone_op(loop, {})
        seg.operands = [start, stop, step, *inits]
        asks = loop.attrs.warp_specialize if peeled == "unmasked" else False
        seg.attrs = replace(loop.attrs, peeled=peeled, warp_specialize=asks)
        if peeled == "unmasked":
            _unmask(seg, plan.selects if seg is loop else _counterparts(loop, seg, plan.selects))
        inits = list(seg.results)
        made.append(seg)
    block.ops[at:at + 1] = build.block.ops + made


def _counterparts(loop: Op, clone: Op, selects: list[Op]) -> list[Op]:
    """The ops of ``clone``'s body at the places of ``selects`` in ``loop``'s (a clone keeps the order)."""
    where = {id(op): i for i, op in enumerate(loop.regions[0].ops)}
    return [clone.regions[0].ops[where[id(s)]] for s in selects]


def _unmask(loop: Op, selects: list[Op]) -> None:
    """``T.where(pred, x, y)`` -> ``x`` in ``loop``'s body; the predicates' ops left unused are dropped."""
    body = loop.regions[0]
    chosen = {s.result.id: s.operands[1] for s in selects}
    for op in body.walk():
        op.operands = [chosen.get(v.id, v) for v in op.operands]
    for s in selects:
        x = s.operands[1]
        x.name = x.name or s.result.name
    sweep_block(body)


class _ScalarEmitter:
    """Builds the split points: scalar integer math in the induction variable's dtype."""

    def __init__(self, build: Builder, scalar: ScalarType) -> None:
        self.build, self.type = build, scalar
        self.constants: dict[int, int] = {}  # the int constants made here, by value id

    def const(self, n: int) -> Value:
        value = self.build.create1(OpKind.CONSTANT, [], self.type, ConstantAttrs(n))
        self.constants[value.id] = n
        return value

    def known(self, v: Value) -> int | None:
        """The int ``v`` holds when it is a constant (made here, or a constant op of the right dtype)."""
        op = v.owner
        if v.id not in self.constants and isinstance(op, Op) and op.kind is OpKind.CONSTANT and v.type == self.type \
                and type(op.attrs.value) is int:
            self.constants[v.id] = op.attrs.value
        return self.constants.get(v.id)

    def binary(self, op: BinaryOp, a: Value, b: Value) -> Value:
        """``a op b``, folded where a constant operand makes it ``a`` (``+ 0``, ``- 0``, ``* 1``) or ``b``."""
        x, y = self.known(a), self.known(b)
        if y == 0 and op in (BinaryOp.ADD, BinaryOp.SUB) or y == 1 and op in (BinaryOp.MUL, BinaryOp.FLOORDIV):
            return a
        if x == 0 and op is BinaryOp.ADD or x == 1 and op is BinaryOp.MUL:
            return b
        if x is not None and y is not None and op is BinaryOp.MUL:
            return self.const(x * y)
        return self.build.create1(OpKind.BINARY, [a, b], self.type, BinaryAttrs(op))

    def max(self, a: Value, b: Value) -> Value:
        return self.binary(BinaryOp.MAX, a, b)

    def max_of(self, values: list[Value]) -> Value:
        out = values[0]
        for v in values[1:]:
            out = self.max(out, v)
        return out

    def min_of(self, values: list[Value]) -> Value:
        out = values[0]
        for v in values[1:]:
            out = self.binary(BinaryOp.MIN, out, v)
        return out

    def clamp(self, v: Value, lo: Value, hi: Value) -> Value:
        """``v`` held to ``[lo, hi]`` (``hi`` wins when the loop is empty)."""
        return self.binary(BinaryOp.MIN, self.max(v, lo), hi)

    def affine(self, form: Affine) -> Value:
        """The scalar ``form`` (symbols and a constant) as ops."""
        out = None
        for sym, coef in form.symbols.values():
            if sym.dtype != self.type.dtype:
                sym = self.build.create1(OpKind.CAST, [sym], self.type, CastAttrs(self.type.dtype))
            term = self.binary(BinaryOp.MUL, sym, self.const(coef))
            out = term if out is None else self.binary(BinaryOp.ADD, out, term)
        return self.const(form.const) if out is None else self.binary(BinaryOp.ADD, out, self.const(form.const))

    def first_after(self, bound: Bound, lo: Value, step: Value) -> Value:
        """The first iteration (``lo + t * step``) past upper bound ``k * iv + rest <= 0``: ``t`` is
        ``floor((-rest - k * lo) / (k * step)) + 1``."""
        k = bound.iv_coef
        num = self.binary(BinaryOp.SUB, self.affine(bound.rest.scaled(-1)),
                          self.binary(BinaryOp.MUL, lo, self.const(k)))
        t = self.binary(BinaryOp.FLOORDIV, num, self.binary(BinaryOp.MUL, step, self.const(k)))
        t = self.binary(BinaryOp.ADD, t, self.const(1))
        return self.binary(BinaryOp.ADD, lo, self.binary(BinaryOp.MUL, t, step))

    def first_at_or_after(self, bound: Bound, lo: Value, step: Value) -> Value:
        """The first iteration meeting lower bound ``-a * iv + rest <= 0`` (``a > 0``): ``t`` is
        ``ceil((rest - a * lo) / (a * step))``, that is ``-floor((a * lo - rest) / (a * step))``."""
        a = -bound.iv_coef
        num = self.binary(BinaryOp.SUB, self.binary(BinaryOp.MUL, lo, self.const(a)), self.affine(bound.rest))
        t = self.binary(BinaryOp.FLOORDIV, num, self.binary(BinaryOp.MUL, step, self.const(a)))
        return self.binary(BinaryOp.SUB, lo, self.binary(BinaryOp.MUL, t, step))
