"""Fragment (layout) inference: which thread holds which element of every register tile.

Seeds: a gemm's accumulator takes the layout of the instruction the dispatch registry picked (m16n8
atoms over the warps for mma.sync; with the warps along M only where the result, after elementwise math, is
another gemm's operand A that mma.sync can then read from registers: ``_rows_per_warp_gemms``); a load into
registers takes a coalesced blocked layout. Layouts then
propagate forward through elementwise ops, casts, reductions (a reduction keeps its input's threads:
``SliceLayout``), ``x[:, None]`` (``ExpandLayout``) and ``.T`` (``PermutedLayout``), and backward into
values that can be built in any layout (splats, aranges, broadcasts, loop-carried values initialised
from them). Where two operands of one op still disagree, an explicit ``convert_layout`` (through shared
memory) is inserted; the accumulator-derived layout wins over the blocked one, since the accumulator is
the large tile. Shared tiles get a swizzled :class:`SharedLayout`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .. import knobs
from ..errors import DispatchError, source_line
from ..target import REGISTRY, Target
from ..ir import Block, Function, NoAttrs, Op, OpKind, Scope, TileType, Trait, Value
from ..ir.layouts import (BlockedLayout, ExpandLayout, MmaLayout, PermutedLayout, RegisterLayout, SharedLayout,
                          SliceLayout, TmemLayout, WgmmaLayout)
from ..ir.rewrite import blocks, defining_op

def _rank(layout: RegisterLayout) -> int:
    """Accumulator-derived layouts win over blocked ones when operands disagree."""
    return 2 if isinstance(layout.root, (MmaLayout, WgmmaLayout, TmemLayout)) else 1


def default_layout(shape: tuple[int, ...], threads: int, vec: int = 1) -> BlockedLayout:
    while vec > 1 and shape[-1] % vec:
        vec //= 2
    return BlockedLayout(shape, threads, vec)


def load_vector_width(fn: Function, op: Op) -> int:
    """Elements per vector access for a load/store window: 16 bytes along a unit-stride last dim."""
    tensor = op.operands[0]
    spec = fn.attrs.get("tensor_specs", {}).get(tensor.name)
    rank = tensor.type.rank
    if spec is None or (rank - 1) not in spec.unit_stride_dims or (rank - 1) in op.attrs.dropped:
        return 1
    return max(1, 16 // tensor.dtype.itemsize)


class _Inference:
    def __init__(self, fn: Function, target: Target) -> None:
        self.fn = fn
        self.target = target
        self.lay: dict[int, RegisterLayout] = {}
        self.joins = _joins(fn)
        self.rows_per_warp = _rows_per_warp_gemms(fn, target)
        self._loop_reads: _LoopReads | None = None  # built at the first row-vector question

    def loop_reads(self) -> _LoopReads:
        """Who reads each value, and what loops carry it (the IR does not change while layouts are inferred)."""
        if self._loop_reads is None:
            self._loop_reads = _LoopReads(self.fn)
        return self._loop_reads

    def get(self, v: Value) -> RegisterLayout | None:
        return self.lay.get(v.id)

    def set(self, v: Value, layout: RegisterLayout) -> bool:
        if not isinstance(v.type, TileType) or v.type.scope is not Scope.REGISTER or v.id in self.lay:
            return False
        if tuple(layout.shape) != tuple(v.type.shape):
            return False
        # A loop's carried argument and its result are one value at run time: they take one layout, whichever
        # of them is decided first (what enters and what comes back convert to it).
        for member in self.joins.get(v.id, (v,)):
            self.lay[member.id] = layout
        return True

    def seed(self) -> None:
        for op in self.fn.walk():
            rule = LAYOUT_RULES[op.kind]
            if rule.seed is not None:
                rule.seed(self, op)

    def forward(self, op: Op) -> bool:
        rule = LAYOUT_RULES[op.kind]
        return rule.forward(self, op) if rule.forward is not None else False

    def backward(self, op: Op, parent: Op | None) -> bool:
        rule = LAYOUT_RULES[op.kind]
        return rule.backward(self, op, parent) if rule.backward is not None else False

    def run(self) -> None:
        self.seed()
        for _ in range(20):
            changed = False
            for block, parent in _blocks_with_parents(self.fn.body, None):
                for op in block.ops:
                    changed |= self.forward(op)
                for op in reversed(block.ops):
                    changed |= self.backward(op, parent)
            if not changed:
                # Anything still unknown gets the default blocked layout, then propagate once more.
                pending = [v for v in _tile_values(self.fn) if v.type.scope is Scope.REGISTER and v.id not in self.lay]
                if not pending:
                    break
                self.set(pending[0], default_layout(pending[0].type.shape, self.target.threads))


def _joins(fn: Function) -> dict[int, tuple[Value, ...]]:
    """Values that must share one layout: each ``for`` loop's carried block argument and matching result."""
    joins: dict[int, tuple[Value, ...]] = {}
    for op in fn.walk():
        if op.kind is OpKind.FOR:
            for arg, res in zip(op.regions[0].args[1:], op.results):
                joins[arg.id] = joins[res.id] = (arg, res)
    return joins


def _is_flexible(v: Value, inf: _Inference) -> bool:
    """Values with no layout yet that can be produced directly in any layout."""
    if inf.get(v) is not None:
        return False
    op = defining_op(v)
    if op is not None and op.kind is OpKind.EXPAND_DIMS:  # x[None, :] of a flexible x: x takes the slice
        return _is_flexible(op.operands[0], inf)
    return (op is None or op.kind.has(Trait.ANY_LAYOUT) or op.kind.is_elementwise
            or (op.kind is OpKind.LOAD and _row_vector_load(inf, op)))


def _blocks_with_parents(block: Block, parent: Op | None):
    yield block, parent
    for op in block.ops:
        for region in op.regions:
            yield from _blocks_with_parents(region, op)


def _tile_values(fn: Function):
    for block in blocks(fn.body):
        yield from (a for a in block.args if isinstance(a.type, TileType))
        for op in block.ops:
            yield from (r for r in op.results if isinstance(r.type, TileType))


def _required(op: Op, index: int, parent: Op | None, inf: _Inference) -> RegisterLayout | None:
    """The layout operand ``index`` of ``op`` must have, or None when any layout is accepted."""
    rule = LAYOUT_RULES[op.kind]
    return rule.required(inf, op, index, parent) if rule.required is not None else None


# -- the rules, one per op kind ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutRule:
    """How one op kind takes part in layout inference; a missing hook means the kind has nothing to say there.

    ``seed(inf, op)`` fixes a layout before propagation; ``forward(inf, op)`` derives results from operands and
    ``backward(inf, op, parent)`` operands from results (both return whether anything changed);
    ``required(inf, op, index, parent)`` is the layout operand ``index`` must have, or None for any.
    """
    seed: Callable[[_Inference, Op], None] | None = None
    forward: Callable[[_Inference, Op], bool] | None = None
    backward: Callable[[_Inference, Op, "Op | None"], bool] | None = None
    required: Callable[[_Inference, Op, int, "Op | None"], "RegisterLayout | None"] | None = None


LAYOUT_RULES: dict[OpKind, LayoutRule] = {}


def layout_rule(*kinds: OpKind, **hooks):
    rule = LayoutRule(**hooks)
    for kind in kinds:
        if kind in LAYOUT_RULES:
            raise ValueError(f"two layout rules for {kind}")
        LAYOUT_RULES[kind] = rule


def _loop_targets(parent: Op) -> list[Value]:
    """Where a yield's values go: a ``for`` body's carried arguments, or an ``if``'s results."""
    return parent.regions[0].args[1:] if parent.kind is OpKind.FOR else parent.results


def _elementwise_forward(inf: _Inference, op: Op) -> bool:
    if not (op.results and op.result.is_tile):
        return False
    known = [l for l in (inf.get(v) for v in op.operands) if l is not None]
    return inf.set(op.result, max(known, key=_rank)) if known else False


def _elementwise_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    changed = False
    if op.results and op.result.is_tile and inf.get(op.result) is not None:
        for v in op.operands:
            if _is_flexible(v, inf):
                changed |= inf.set(v, inf.get(op.result))
    return changed


def _elementwise_required(inf: _Inference, op: Op, index: int, parent: Op | None) -> RegisterLayout | None:
    return inf.get(op.result) if op.results and op.result.is_tile else None


def _gemm_seed(inf: _Inference, op: Op) -> None:
    impl = REGISTRY.select("gemm", op, inf.target, op.loc, source_line(op.loc), only=knobs.gemm_lowering())
    op.attrs = replace(op.attrs, impl=impl.name)
    layout = impl.payload.acc_layout(op, inf.target)
    if op in inf.rows_per_warp:
        layout = impl.payload.rows_acc_layout(op, inf.target) or layout
    inf.set(op.result, layout)


def _rows_per_warp_gemms(fn: Function, target: Target) -> set[Op]:
    """The gemms whose accumulators should give each warp whole rows (``GemmLowering.rows_acc_layout``, where the
    lowering gives one): a gemm whose operand A scope inference staged from a register tile computed element by element from
    other gemms' accumulators (attention's ``P = exp2(S - m).to(bf16)``, ``S = Q K^T``), and those gemms, when a
    lowering that reads A from registers needs that (``fits_rows``: mma.sync's A fragment holds all of K per warp)
    and would be preferred to the gemm's own (``keep_register_operands``). Decided before the accumulators' layouts
    are, since they follow from it; whether A is read from registers is decided after, on the layouts."""
    pinned = knobs.gemm_lowering()
    chosen: set[Op] = set()
    for op, staged in _staged_from_registers(fn):
        producers = _gemms_computing(staged.operands[0])
        if producers and _register_a_needs_rows(op, target, pinned):
            chosen.add(op)
            chosen.update(producers)
    return chosen


def _staged_from_registers(fn: Function):
    """(gemm, staging op) for each gemm whose operand A scope inference staged from a register tile (a
    convert_layout of a register value)."""
    for op in fn.walk():
        if op.kind is not OpKind.GEMM:
            continue
        staged = defining_op(op.operands[0])
        if staged is not None and staged.kind is OpKind.CONVERT_LAYOUT and \
                staged.operands[0].type.scope is Scope.REGISTER:
            yield op, staged


def _gemms_computing(v: Value) -> list[Op]:
    """The gemms whose results ``v`` is computed from by elementwise ops on tiles of its shape (casts,
    arithmetic, selects; a broadcast row statistic or a splat is a side input, not followed)."""
    found, seen, todo = [], set(), [v]
    while todo:
        x = todo.pop()
        op = defining_op(x)
        if x.id in seen or op is None:
            continue
        seen.add(x.id)
        if op.kind is OpKind.GEMM:
            found.append(op)
        elif op.kind.is_elementwise:
            todo += [o for o in op.operands if isinstance(o.type, TileType) and o.type.shape == x.type.shape]
    return found


def _register_a_needs_rows(op: Op, target: Target, pinned: str | None) -> bool:
    try:
        own = REGISTRY.select("gemm", op, target, only=pinned)
    except DispatchError:  # the seed reports it, with the source location
        return False
    for impl in REGISTRY.candidates("gemm"):
        if (_pin_admits(impl, pinned) and impl.min_sm <= target.sm <= impl.max_sm
                and impl.priority >= own.priority and impl.payload.fits_rows(op, target)):
            return True
    return False


def _pin_admits(impl, pinned: str | None) -> bool:
    """A pinned lowering (``TILEJIT_GEMM_LOWERING``) admits itself and its register-A form (``register_a_of``)."""
    return pinned in (None, impl.name, impl.payload.register_a_of)


def _gemm_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    acc = op.operands[2]
    if _is_flexible(acc, inf) and inf.get(op.result) is not None:
        return inf.set(acc, inf.get(op.result))
    return False


def _row_vector_load(inf: _Inference, op: Op) -> bool:
    """Whether ``op`` loads a 1-D register vector that is only ever widened by ``x[:, None]`` (a per-row scale of
    a tile) on a wgmma or tcgen05 target: such a load is built in the slice of the tile's layout, so that each
    thread loads the few rows it holds (2 per 64-row slab of a wgmma accumulator, 1 in tcgen05's) instead of the
    vector crossing shared memory. Columns are left to the blocked seed: a thread holds a quarter of an
    accumulator's columns, so a per-column vector in that slice would take as many registers again. Not on
    mma.sync targets, whose fragments spread a row vector over more registers (attention's dQ on sm_80 spilled
    64 bytes with it)."""
    arch = inf.target.arch
    if op.result.type.rank != 1 or not (arch.has_wgmma or arch.has_tcgen05):
        return False
    users = inf.loop_reads().users(op.result)
    return bool(users) and all(user.kind is OpKind.EXPAND_DIMS and user.attrs.axis == 1 for user in users)


class _LoopReads:
    """The readers of every value of ``fn``, and the values ``for`` loops carry: each loop's initial values and its
    body's yielded ones map to the carried argument and result they become."""

    def __init__(self, fn: Function) -> None:
        self.carried: dict[int, list[Value]] = {}  # value id -> the carried arguments / results it becomes
        self.passing: set[int] = set()  # the loops and their bodies' yields, which only pass values on
        self.readers: dict[int, list[Op]] = {}
        for op in fn.walk():
            for v in op.operands:
                self.readers.setdefault(v.id, []).append(op)
            if op.kind is OpKind.FOR:
                body = op.regions[0]
                self.passing.update((id(op), id(body.terminator)))
                for init, arg, res, back in zip(op.operands[3:], body.args[1:], op.results,
                                                body.terminator.operands):
                    self.carried.setdefault(init.id, []).extend((arg, res))
                    self.carried.setdefault(back.id, []).extend((arg, res))

    def users(self, value: Value) -> list[Op]:
        """The ops that read ``value``, where a value carried by a ``for`` loop (its initial value, or yielded by
        the loop's body) counts as read where the loop's carried argument and result are (a vector loaded one
        iteration ahead, as a block-scaled loop prefetches its scales)."""
        users, seen, todo = [], {value.id}, [value]
        while todo:
            v = todo.pop()
            for user in self.readers.get(v.id, []):
                bounds = user.operands[:3] if user.kind is OpKind.FOR else ()
                if id(user) in self.passing and v.id in self.carried and not any(u is v for u in bounds):
                    continue  # the carried argument / result stands for it
                users.append(user)
            for twin in self.carried.get(v.id, []):
                if twin.id not in seen:
                    seen.add(twin.id)
                    todo.append(twin)
        return users


def _load_seed(inf: _Inference, op: Op) -> None:
    if op.result.is_tile and op.result.type.scope is Scope.REGISTER and not _row_vector_load(inf, op):
        inf.set(op.result, default_layout(op.result.type.shape, inf.target.threads, load_vector_width(inf.fn, op)))


def _reduce_forward(inf: _Inference, op: Op) -> bool:
    src = inf.get(op.operands[0])
    return inf.set(op.result, SliceLayout(src, op.attrs.axis)) if src is not None and op.result.is_tile else False


def _expand_forward(inf: _Inference, op: Op) -> bool:
    src = inf.get(op.operands[0])
    return inf.set(op.result, ExpandLayout(src, op.attrs.axis)) if src is not None else False


def _expand_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    """``x[None, :]`` needed in layout L: a flexible ``x`` is built in L's slice along the new axis, so the
    expanded value (and a broadcast of it) is the same registers (an index vector compared with a tile's
    columns, as attention's masks do, stays in the accumulator's threads instead of crossing shared memory)."""
    want, src = inf.get(op.result), op.operands[0]
    if want is None or not _is_flexible(src, inf):
        return False
    axis = op.attrs.axis
    base = want.base if isinstance(want, ExpandLayout) and want.axis == axis else SliceLayout(want, axis)
    return inf.set(src, base)


def _transpose_forward(inf: _Inference, op: Op) -> bool:
    src = inf.get(op.operands[0])
    return inf.set(op.result, PermutedLayout(src, op.attrs.perm)) if src is not None else False


def _broadcast_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    if inf.get(op.result) is None:
        return False
    src = op.operands[0]
    target = inf.get(op.result)
    axes = [d for d, (a, b) in enumerate(zip(src.type.shape, op.result.type.shape)) if a != b]
    if len(axes) == 1 and inf.get(src) is None:
        # A reduced value broadcast back: try to keep it in the target's threads.
        producer = defining_op(src)
        if producer is not None and producer.kind is OpKind.EXPAND_DIMS and inf.get(producer.operands[0]) is None:
            return inf.set(producer.operands[0], SliceLayout(target, axes[0]))
        if _is_flexible(src, inf):  # e.g. a mask computed from an expanded index vector, then broadcast
            return inf.set(src, ExpandLayout(SliceLayout(target, axes[0]), axes[0]))
    return False


def _for_forward(inf: _Inference, op: Op) -> bool:
    changed = False
    body = op.regions[0]
    for init, arg, res, y in zip(op.operands[3:], body.args[1:], op.results, body.terminator.operands):
        # The carried value takes the stronger of what enters and what comes back (an accumulator
        # initialised from a load keeps the gemm's layout; the init converts once, before the loop).
        known = [l for l in (inf.get(init), inf.get(y)) if l is not None]
        choice = max(known, key=_rank) if known else inf.get(arg)
        if choice is not None:
            changed |= inf.set(arg, choice) | inf.set(res, choice)
    return changed


def _for_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    changed = False
    for init, arg in zip(op.operands[3:], op.regions[0].args[1:]):
        if inf.get(arg) is not None and _is_flexible(init, inf):
            changed |= inf.set(init, inf.get(arg))
    return changed


def _for_required(inf: _Inference, op: Op, index: int, parent: Op | None) -> RegisterLayout | None:
    return inf.get(op.regions[0].args[index - 2]) if index >= 3 else None


def _if_forward(inf: _Inference, op: Op) -> bool:
    changed = False
    for i, res in enumerate(op.results):
        for region in op.regions:
            if region.terminator is not None and inf.get(region.terminator.operands[i]) is not None:
                changed |= inf.set(res, inf.get(region.terminator.operands[i]))
                break
    return changed


def _yield_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    changed = False
    if parent is not None:
        for v, t in zip(op.operands, _loop_targets(parent)):
            if inf.get(t) is not None and _is_flexible(v, inf):
                changed |= inf.set(v, inf.get(t))
    return changed


def _yield_required(inf: _Inference, op: Op, index: int, parent: Op | None) -> RegisterLayout | None:
    return inf.get(_loop_targets(parent)[index]) if parent is not None else None


def unique_layout(layout: RegisterLayout, threads: int) -> RegisterLayout:
    """``layout`` when every element sits in exactly one (thread, register), else a blocked layout of its shape:
    an atomic must update each element once, and a reduction's result (``SliceLayout``) repeats its elements
    over the threads that reduced them."""
    base = layout
    while isinstance(base, PermutedLayout):
        base = base.base
    if isinstance(base, (BlockedLayout, MmaLayout, WgmmaLayout)):
        return layout
    return default_layout(tuple(layout.shape), threads)


def _gather_seed(inf: _Inference, op: Op) -> None:
    inf.set(op.result, default_layout(op.result.type.shape, inf.target.threads))


def _gather_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    index = op.operands[1]
    return inf.set(index, inf.get(op.result)) if inf.get(op.result) is not None and _is_flexible(index, inf) else False


def _scatter_required(inf: _Inference, op: Op, index: int, parent: Op | None) -> RegisterLayout | None:
    return inf.get(op.operands[1]) if index == 2 else None  # the index tile in the value's layout


def _atomic_forward(inf: _Inference, op: Op) -> bool:
    value = inf.get(op.operands[1]) if op.result.is_tile else None
    return inf.set(op.result, unique_layout(value, inf.target.threads)) if value is not None else False


def _atomic_backward(inf: _Inference, op: Op, parent: Op | None) -> bool:
    changed = False
    if op.result.is_tile and inf.get(op.result) is not None:
        for v in op.operands[1:op.attrs.first_start]:
            if _is_flexible(v, inf):
                changed |= inf.set(v, inf.get(op.result))
    return changed


def _atomic_required(inf: _Inference, op: Op, index: int, parent: Op | None) -> RegisterLayout | None:
    # value, compared value and index tile all in the result's (one owner per element) layout
    return inf.get(op.result) if op.result.is_tile and 1 <= index < op.attrs.first_start else None


layout_rule(OpKind.GATHER, seed=_gather_seed, backward=_gather_backward,
            required=lambda inf, op, index, parent: inf.get(op.result) if index == 1 else None)
layout_rule(OpKind.SCATTER, required=_scatter_required)
layout_rule(OpKind.ATOMIC, forward=_atomic_forward, backward=_atomic_backward, required=_atomic_required)
# a split-K sum keeps every register where it is (each thread adds its peers' copies of its own registers)
layout_rule(OpKind.BINARY, OpKind.UNARY, OpKind.COMPARE, OpKind.SELECT, OpKind.CAST, OpKind.FMA,
            OpKind.SPLIT_REDUCE, forward=_elementwise_forward, backward=_elementwise_backward,
            required=_elementwise_required)
layout_rule(OpKind.GEMM, seed=_gemm_seed, backward=_gemm_backward,
            required=lambda inf, op, index, parent: inf.get(op.result) if index == 2 else None)
layout_rule(OpKind.LOAD, seed=_load_seed)
layout_rule(OpKind.REDUCE, forward=_reduce_forward)
# a scan goes through shared memory (lower_reduce): its result is read back in its operand's layout
layout_rule(OpKind.SCAN, forward=lambda inf, op: inf.set(op.result, inf.get(op.operands[0]))
            if inf.get(op.operands[0]) is not None else False)
layout_rule(OpKind.EXPAND_DIMS, forward=_expand_forward, backward=_expand_backward)
layout_rule(OpKind.TRANSPOSE, forward=_transpose_forward)
layout_rule(OpKind.BROADCAST, backward=_broadcast_backward)
layout_rule(OpKind.FOR, forward=_for_forward, backward=_for_backward, required=_for_required)
layout_rule(OpKind.IF, forward=_if_forward)
layout_rule(OpKind.YIELD, backward=_yield_backward, required=_yield_required)
# Scalars, values built in whatever layout their users take (splat, arange, conversions), stores (which take
# any layout) and while loops (scalars only) have nothing to add.
layout_rule(OpKind.CONSTANT, OpKind.PROGRAM_ID, OpKind.NUM_PROGRAMS, OpKind.TENSOR_DIM, OpKind.TENSOR_STRIDE,
            OpKind.SPLIT_INDEX, OpKind.STREAM_K_BOUND, OpKind.SPLAT, OpKind.ARANGE, OpKind.CONVERT_LAYOUT, OpKind.STORE, OpKind.WHILE,
            OpKind.BOUNDED, OpKind.LIST_ITEM, OpKind.LIST_LEN, OpKind.TRANSPOSE_COPY,
            OpKind.STREAM_K_FIXUP)  # (made after layout inference, its results typed like its operands)


def infer_layouts(fn: Function, target: Target) -> None:
    inf = _Inference(fn, target)
    inf.run()
    # Insert conversions where an operand's layout differs from what its user needs.
    for block, parent in list(_blocks_with_parents(fn.body, None)):
        for op in list(block.ops):
            for index, v in enumerate(op.operands):
                if not isinstance(v.type, TileType) or v.type.scope is not Scope.REGISTER:
                    continue
                need = _required(op, index, parent, inf)
                have = inf.get(v)
                if need is None or have == need:
                    continue
                conv = Op(OpKind.CONVERT_LAYOUT, [v], [TileType(v.type.shape, v.dtype, Scope.REGISTER)], NoAttrs(),
                          loc=op.loc)
                inf.lay[conv.result.id] = need
                block.ops.insert(block.ops.index(op), conv)
                op.operands[index] = conv.result
    for v in _tile_values(fn):
        if v.type.scope is Scope.REGISTER:
            v.type = v.type.with_layout(inf.lay.get(v.id) or default_layout(v.type.shape, target.threads))
        elif v.type.scope is Scope.SHARED:
            rows, cols = v.type.shape
            v.type = v.type.with_layout(SharedLayout(rows, cols, v.dtype.itemsize, 1))
    keep_register_operands(fn, target)


def keep_register_operands(fn: Function, target: Target) -> None:
    """A gemm operand A that scope inference staged into shared memory from a register tile goes back to that
    tile when a registered lowering reads A from registers in the tile's layout (e.g. wgmma with A's fragment
    in the accumulator layout of an earlier gemm: attention's P) and gives the accumulator the layout it already
    has (the layouts were inferred for the lowering chosen first: with keys a block of 176, P @ V's A rows of 352
    bytes take no wgmma swizzle, so mma.sync's layout was chosen, which wgmma reading P from registers would not
    write). The staging copy is left dead for cleanup."""
    pinned = knobs.gemm_lowering()
    for op, staged in _staged_from_registers(fn):
        if op.operands[0].type.scope is not Scope.SHARED:
            continue
        op.operands[0] = staged.operands[0]
        impl = next((i for i in REGISTRY.candidates("gemm") if i.rejection(op, target) is None
                     and _pin_admits(i, pinned)), None)
        if impl is not None and impl.payload.register_a and impl.priority >= _priority(op) \
                and op.result.type.layout in (impl.payload.acc_layout(op, target),
                                              impl.payload.rows_acc_layout(op, target)):
            op.attrs = replace(op.attrs, impl=impl.name)
        else:
            op.operands[0] = staged.result


def _priority(op: Op) -> int:
    return REGISTRY.get("gemm", op.attrs.impl).priority
