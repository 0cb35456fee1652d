"""Register loads in a loop whose addresses move by a constant each iteration: their pointers set up before the
loop and stepped in its header.

A per-row or per-column vector read every iteration (a block scale, attention's row statistics) or one element
(a block table entry) costs a few loads but, written as the window's base plus each element's offset, a 64-bit
address and a bounds test per element recomputed every iteration from run-time strides: ptxas recomputes them
(reloading the strides from the constant bank) rather than keep them live across the main loop. Here each
element's pointer and the bounds along the dims that do not move are computed once, before the loop, from the
window's starts at its first iteration; the pointers are loop-carried variables (which ptxas must keep in
registers), advanced in the loop's header by the starts' constant change per iteration times the strides. Only the
bounds of the moving dims are tested inside the loop.

Measured on the block-scaled fp8 loop (``tilejit.ops.fp8_blockscaled.blockscaled_mm``, 128x128, 4096x4096x7168,
NVIDIA H200): 191 SASS instructions an iteration of the math warps' loop against 147, and 867-872 against
951-969 TFLOP/s with the loop's CUDA edited by hand this way (``scripts/probes/blockscaled_carried_pointers.py``).

A start qualifies when its change per iteration is a compile-time constant (``iv_delta``): the induction variable
of a loop with a constant step, plus or minus loop-invariant values, times a constant, floor-divided by a constant
that divides its change (``k0 // 128`` in a loop by 128: floor(x + n) = floor(x) + n for an integer n), cast to a
type of the same signedness at least as wide. A vector load keeps one pointer per distinct element a thread holds, up to
``MAX_POINTERS`` (the rows of a wgmma accumulator: 2 per 64 rows); a wider one (a per-column vector) keeps
today's address math.
"""
from __future__ import annotations

from ..ir import BinaryOp, Op, OpKind, Scope, Value
from ..ir.layouts import duplicate_registers
from ..ir.rewrite import int_constant
from .emitter import Emitter, c_type
from .lower_memory import Window

#: The most pointers one load carries through a loop (each holds two registers for the whole loop).
MAX_POINTERS = 4


def iv_delta(v: Value, body_ops: dict[int, Op], iv_id: int, step: int) -> int | None:
    """How much scalar ``v`` changes from one iteration to the next of a loop whose induction variable (``iv_id``)
    moves by ``step``: 0 for a value the loop does not change, None when the change is not a known constant."""
    if v.id == iv_id:
        return step
    op = body_ops.get(v.id)
    if op is None or op.kind is OpKind.CONSTANT:
        return 0
    if op.kind is OpKind.CAST:
        src, dst = op.operands[0].dtype, op.attrs.dtype
        if not (src.is_integer and dst.kind == src.kind and dst.itemsize >= src.itemsize):
            return None
        return iv_delta(op.operands[0], body_ops, iv_id, step)
    if op.kind is not OpKind.BINARY or len(op.operands) != 2 or not op.result.dtype.is_integer:
        return None
    a, b = (iv_delta(x, body_ops, iv_id, step) for x in op.operands)
    if a is None or b is None:
        return None
    kind = op.attrs.op
    if a == 0 and b == 0:
        return 0  # computed in the body from values the loop does not change (an integer result: no TRUEDIV)
    if kind is BinaryOp.ADD:
        return a + b
    if kind is BinaryOp.SUB:
        return a - b
    if kind is BinaryOp.MUL and not (a and b):
        moving, fixed = (a, op.operands[1]) if a else (b, op.operands[0])
        factor = int_constant(fixed)
        return None if factor is None else moving * factor
    if kind is BinaryOp.FLOORDIV and b == 0:
        divisor = int_constant(op.operands[1])
        return a // divisor if divisor and a % divisor == 0 else None
    return None


class CarriedLoad:
    """One register load of a loop body whose window's starts each move by a constant per iteration
    (``deltas``): its pointers and the bounds of the dims that do not move, declared before the loop from the
    starts at the first iteration (``first``), stepped by ``advance`` in the loop's header."""

    def __init__(self, em: Emitter, op: Op, first: list[str], deltas: list[int], registers: list[int]) -> None:
        self.em, self.op, self.deltas, self.registers = em, op, deltas, registers
        self.first = Window(em, op, first)
        self.tag = em.fresh("tj_cl")
        self.pointers: list[str] = []
        self.fixed_ok: list[str] = []
        self.step = ""

    def _bounds(self, win: Window, coords: list[str] | None, moving: bool) -> list[str]:
        """The bounds tests of the dims whose starts move (``moving``) or do not: the dropped dims', then the tile
        dims' at ``coords``."""
        terms = [win.start_in_bounds(d) for d in win.dropped if bool(self.deltas[d]) == moving]
        return terms + [win.in_bounds(k, c) for k, c in enumerate(coords or [])
                        if bool(self.deltas[win.tile_dims[k]]) == moving]

    def set_up(self) -> None:
        """Before the loop: each element's pointer at the first iteration, its fixed bounds, and the step."""
        em, win = self.em, self.first
        ctype = c_type(win.tensor.dtype)
        layout = self.op.result.type.layout if self.op.result.is_tile else None
        em.line(f"// {win.t}: addresses of a window that moves by a constant per iteration, stepped in the header")
        em.line(f"const {ctype}* const {self.tag}_base = {win.base_expr()};")
        for i in self.registers if layout is not None else [None]:
            coords = em.coords(layout, str(i)) if layout is not None else None
            pointer = f"{self.tag}_p{len(self.pointers)}"
            offset = f" + ({win.offset(coords)})" if coords else ""
            em.line(f"const {ctype}* {pointer} = {self.tag}_base{offset};")
            valid = em.valid(layout, str(i)) if layout is not None else ""
            ok = self._bounds(win, coords, moving=False) + ([valid] if valid else [])
            name = f"{self.tag}_ok{len(self.pointers)}"
            em.line(f"const bool {name} = {' && '.join(ok) if ok else 'true'};")
            self.pointers.append(pointer)
            self.fixed_ok.append(name)
        moving = " + ".join(f"(int64_t){delta} * {win.stride(d)}" for d, delta in enumerate(self.deltas) if delta)
        if moving:
            self.step = f"{self.tag}_step"
            em.line(f"const int64_t {self.step} = {moving};")

    def advance(self) -> list[str]:
        """The header's increments: every pointer by the window's move."""
        return [f"{p} += {self.step}" for p in self.pointers] if self.step else []

    def load_scalar(self, win: Window, name: str) -> None:
        """``X[i, j]`` at this iteration (``win``: its starts as the body names them), 0 out of bounds."""
        ctype = c_type(win.tensor.dtype)
        ok = [self.fixed_ok[0]] + self._bounds(win, None, moving=True)
        self.em.line(f"const {ctype} {name} = ({' && '.join(ok)}) ? *{self.pointers[0]} : {ctype}{{}};")

    def load_distinct(self, win: Window, regs: str, owner: tuple[int, ...]) -> None:
        """The distinct elements of a vector window into registers ``regs``, copied to their repeats."""
        em, layout = self.em, self.op.result.type.layout
        ctype = c_type(win.tensor.dtype)
        for j, i in enumerate(self.registers):
            ok = [self.fixed_ok[j]] + self._bounds(win, em.coords(layout, str(i)), moving=True)
            em.line(f"{regs}[{i}] = ({' && '.join(ok)}) ? *{self.pointers[j]} : {ctype}{{}};")
        for i, j in enumerate(owner):
            if i != j:
                em.line(f"{regs}[{i}] = {regs}[{j}];")


def carried_loads(em: Emitter, body, body_ops: dict[int, Op], iv: Value, step: Value,
                  starts_at) -> list[CarriedLoad]:
    """The register loads among ``body``'s ops that carry their pointers (module docstring), set up here (the
    loop is about to open); ``body_ops`` maps each value the body's ops make to its op; ``starts_at(load)``
    gives the C expressions of a load's starts at the first iteration."""
    step_value = int_constant(step)
    if step_value is None:
        return []
    found = []
    for op in body.ops:
        if op.kind is not OpKind.LOAD or op.attrs.pipeline or op.result.is_tile \
                and op.result.type.scope is Scope.SHARED:
            continue
        registers = None
        if op.result.is_tile:
            owner = duplicate_registers(op.result.type.layout, em.target.threads)
            if owner is None or len(set(owner)) > MAX_POINTERS:
                continue
            registers = sorted(set(owner))
        deltas = [iv_delta(v, body_ops, iv.id, step_value) for v in op.operands[1:]]
        if None in deltas:
            continue
        carried = CarriedLoad(em, op, starts_at(op), deltas, registers or [])
        carried.set_up()
        found.append(carried)
    return found
