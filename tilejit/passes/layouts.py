"""Fragment (layout) inference: which thread holds which element of every register tile.

Seeds: a gemm's accumulator takes the layout of the instruction the dispatch registry picked (m16n8
atoms over the warps for mma.sync); a load into registers takes a coalesced blocked layout. Layouts then
propagate forward through elementwise ops, casts, reductions (a reduction keeps its input's threads:
``SliceLayout``), ``x[:, None]`` (``ExpandLayout``) and ``.T`` (``PermutedLayout``), and backward into
values that can be built in any layout (splats, aranges, broadcasts, loop-carried values initialised
from them). Where two operands of one op still disagree, an explicit ``convert_layout`` (through shared
memory) is inserted; the accumulator-derived layout wins over the blocked one, since the accumulator is
the large tile. Shared tiles get a swizzled :class:`SharedLayout`.
"""
from __future__ import annotations

from dataclasses import replace

from ..target import REGISTRY, Target
from ..ir import Block, Function, NoAttrs, Op, OpKind, Scope, TileType, Value
from ..ir.layouts import (BlockedLayout, ExpandLayout, MmaLayout, PermutedLayout, RegisterLayout, SharedLayout,
                          SliceLayout, WgmmaLayout)
from ..ir.rewrite import blocks, defining_op

_ELEMENTWISE = {OpKind.BINARY, OpKind.UNARY, OpKind.COMPARE, OpKind.SELECT, OpKind.CAST}
_FLEXIBLE = {OpKind.SPLAT, OpKind.ARANGE, OpKind.BROADCAST, OpKind.CONVERT_LAYOUT}


def _rank(layout: RegisterLayout) -> int:
    """Accumulator-derived layouts win over blocked ones when operands disagree."""
    return 2 if isinstance(layout.root, (MmaLayout, WgmmaLayout)) else 1


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

    def get(self, v: Value) -> RegisterLayout | None:
        return self.lay.get(v.id)

    def set(self, v: Value, layout: RegisterLayout) -> bool:
        if not isinstance(v.type, TileType) or v.type.scope is not Scope.REGISTER or v.id in self.lay:
            return False
        if tuple(layout.shape) != tuple(v.type.shape):
            return False
        self.lay[v.id] = layout
        return True

    def seed(self) -> None:
        for op in self.fn.walk():
            if op.kind is OpKind.GEMM:
                impl = REGISTRY.select("gemm", op, self.target, op.loc, _source_line(op))
                op.attrs = replace(op.attrs, impl=impl.name)
                self.set(op.result, impl.payload.acc_layout(op, self.target))
            elif op.kind is OpKind.LOAD and op.result.type.scope is Scope.REGISTER:
                self.set(op.result, default_layout(op.result.type.shape, self.target.threads,
                                                   load_vector_width(self.fn, op)))

    def forward(self, op: Op) -> bool:
        changed = False
        ins = [self.get(v) for v in op.operands]
        if op.kind in _ELEMENTWISE and op.results and op.result.is_tile:
            known = [l for l in ins if l is not None]
            if known:
                changed |= self.set(op.result, max(known, key=_rank))
        elif op.kind is OpKind.REDUCE and ins[0] is not None and op.result.is_tile:
            changed |= self.set(op.result, SliceLayout(ins[0], op.attrs.axis))
        elif op.kind is OpKind.EXPAND_DIMS and ins[0] is not None:
            changed |= self.set(op.result, ExpandLayout(ins[0], op.attrs.axis))
        elif op.kind is OpKind.TRANSPOSE and ins[0] is not None:
            changed |= self.set(op.result, PermutedLayout(ins[0], op.attrs.perm))
        elif op.kind is OpKind.FOR:
            body = op.regions[0]
            term = body.terminator
            for init, arg, res, y in zip(op.operands[3:], body.args[1:], op.results, term.operands):
                # The carried value takes the stronger of what enters and what comes back (an accumulator
                # initialised from a load keeps the gemm's layout; the init converts once, before the loop).
                known = [l for l in (self.get(init), self.get(y)) if l is not None]
                choice = max(known, key=_rank) if known else self.get(arg)
                if choice is not None:
                    changed |= self.set(arg, choice) | self.set(res, choice)
        elif op.kind is OpKind.IF:
            for i, res in enumerate(op.results):
                for region in op.regions:
                    if region.terminator is not None and self.get(region.terminator.operands[i]) is not None:
                        changed |= self.set(res, self.get(region.terminator.operands[i]))
                        break
        return changed

    def backward(self, op: Op, parent: Op | None) -> bool:
        changed = False
        if op.kind in _ELEMENTWISE and op.results and op.result.is_tile and self.get(op.result) is not None:
            for v in op.operands:
                if _is_flexible(v, self):
                    changed |= self.set(v, self.get(op.result))
        elif op.kind is OpKind.GEMM:
            acc = op.operands[2]
            if _is_flexible(acc, self) and self.get(op.result) is not None:
                changed |= self.set(acc, self.get(op.result))
        elif op.kind is OpKind.FOR:
            body = op.regions[0]
            for init, arg in zip(op.operands[3:], body.args[1:]):
                if self.get(arg) is not None and _is_flexible(init, self):
                    changed |= self.set(init, self.get(arg))
        elif op.kind is OpKind.YIELD and parent is not None:
            targets = parent.regions[0].args[1:] if parent.kind is OpKind.FOR else parent.results
            for v, t in zip(op.operands, targets):
                if self.get(t) is not None and _is_flexible(v, self):
                    changed |= self.set(v, self.get(t))
        elif op.kind is OpKind.BROADCAST and self.get(op.result) is not None:
            src = op.operands[0]
            target = self.get(op.result)
            axes = [d for d, (a, b) in enumerate(zip(src.type.shape, op.result.type.shape)) if a != b]
            if len(axes) == 1 and self.get(src) is None:
                # A reduced value broadcast back: try to keep it in the target's threads.
                producer = defining_op(src)
                if producer is not None and producer.kind is OpKind.EXPAND_DIMS and self.get(producer.operands[0]) is None:
                    changed |= self.set(producer.operands[0], SliceLayout(target, axes[0]))
        return changed

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


def _is_flexible(v: Value, inf: _Inference) -> bool:
    """Values with no layout yet that can be produced directly in any layout."""
    if inf.get(v) is not None:
        return False
    op = defining_op(v)
    return op is None or op.kind in _FLEXIBLE or op.kind in _ELEMENTWISE


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


def _source_line(op: Op) -> str | None:
    if op.loc is None:
        return None
    import linecache

    return linecache.getline(op.loc.filename, op.loc.lineno).rstrip("\n") or None


def _required(op: Op, index: int, parent: Op | None, inf: _Inference) -> RegisterLayout | None:
    """The layout operand ``index`` of ``op`` must have, or None when any layout is accepted."""
    if op.kind in _ELEMENTWISE and op.results and op.result.is_tile:
        return inf.get(op.result)
    if op.kind is OpKind.GEMM and index == 2:
        return inf.get(op.result)
    if op.kind is OpKind.FOR and index >= 3:
        return inf.get(op.regions[0].args[index - 2])
    if op.kind is OpKind.YIELD and parent is not None:
        targets = parent.regions[0].args[1:] if parent.kind is OpKind.FOR else parent.results
        return inf.get(targets[index])
    return None


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
