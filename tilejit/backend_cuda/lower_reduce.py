"""Reductions along one axis of a register tile.

Row reductions of a tensor-core accumulator (an mma.sync or wgmma layout reduced along its columns, as a
softmax over attention scores does) stay in registers: each thread combines the elements it holds of each of its
rows, the four lanes of a quad (which share rows) combine with two xor-shuffles, and only when several warps
split the columns do their partial results meet in a small shared buffer (one value per row and warp).

Every other reduction goes through the shared scratch buffer: every thread writes its elements, then each output
element is reduced by one thread (outputs dealt round-robin), then every thread reads back the outputs its
result layout (the input's layout with the axis removed) holds. Correct for any layout.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, OpKind, ReduceKind
from ..ir.layouts import MmaLayout, SliceLayout, WgmmaLayout
from .emitter import Emitter, c_type, convert, emits
from .lower_memory import _linear


def _combine(kind: ReduceKind, a: str, b: str, dtype) -> str:
    if kind is ReduceKind.SUM:
        return f"{a} + {b}"
    if dtype.is_floating:
        return f"tj_{'max' if kind is ReduceKind.MAX else 'min'}({a}, {b})"
    return f"tj_i{'max' if kind is ReduceKind.MAX else 'min'}({a}, {b})"


def _identity(kind: ReduceKind, dtype) -> str:
    if kind is ReduceKind.SUM:
        return f"({c_type(dtype)})0"
    if dtype.is_floating:
        return "__int_as_float(0xff800000)" if kind is ReduceKind.MAX else "__int_as_float(0x7f800000)"
    if dtype.is_bool:
        return "false" if kind is ReduceKind.MAX else "true"
    bits = dtype.bits
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if dtype.kind == "int" else (0, 2 ** bits - 1)
    return f"({c_type(dtype)})({lo if kind is ReduceKind.MAX else hi}{'LL' if bits == 64 else ''})"


@emits(OpKind.REDUCE)
def _reduce(em: Emitter, op: Op) -> None:
    src, out = op.operands[0], op.result
    kind, axis = op.attrs.kind, op.attrs.axis
    shape = src.type.shape
    dtype = out.dtype
    acc_dtype = D.float32 if dtype.is_floating and dtype.bits < 32 else dtype
    acc_t = c_type(acc_dtype)
    outer = 1
    for n in shape[:axis]:
        outer *= n
    inner = 1
    for n in shape[axis + 1:]:
        inner *= n
    k = shape[axis]
    n_out = outer * inner
    threads = em.target.threads
    layout = src.type.layout
    if _rows_of_accumulator(op, acc_dtype):
        _reduce_rows_in_registers(em, op, acc_dtype)
        return
    em.comment(op, f"{kind.value} over axis {axis} through shared memory")
    em.scratch((src.type.numel + n_out) * acc_dtype.itemsize)
    buf = f"reinterpret_cast<{acc_t}*>(tj_scratch)"
    res = f"(reinterpret_cast<{acc_t}*>(tj_scratch) + {src.type.numel})"
    em.barrier("scratch is free")

    def write(i: str) -> None:
        valid = em.valid(layout, i)
        value = convert(f"{em.name(src)}[{i}]", src.dtype, acc_dtype)
        store = f"{buf}[{_linear(em.coords(layout, i), shape)}] = {value};"
        em.line(f"if ({valid}) {store}" if valid else store)

    em.reg_loop(layout, write)
    em.barrier()
    em.open(f"for (int tj_o = tid; tj_o < {n_out}; tj_o += {threads})")
    em.line(f"const int tj_outer = tj_o / {inner}, tj_inner = tj_o % {inner};")
    em.line(f"{acc_t} tj_acc = {_identity(kind, acc_dtype)};")
    em.line("#pragma unroll 8")
    em.open(f"for (int tj_k = 0; tj_k < {k}; ++tj_k)")
    em.line(f"tj_acc = {_combine(kind, 'tj_acc', f'{buf}[(tj_outer * {k} + tj_k) * {inner} + tj_inner]', acc_dtype)};")
    em.close()
    em.line(f"{res}[tj_o] = tj_acc;")
    em.close()
    em.barrier()
    if out.is_scalar:
        em.line(f"const {c_type(dtype)} {em.name(out)} = {convert(f'{res}[0]', acc_dtype, dtype)};")
        return
    name = em.declare_tile(out)
    out_layout = out.type.layout
    em.reg_loop(out_layout, lambda i: em.line(
        f"{name}[{i}] = {convert(f'{res}[{_linear(em.coords(out_layout, i), out.type.shape)}]', acc_dtype, dtype)};"))


def _rows_of_accumulator(op: Op, acc_dtype) -> bool:
    """A reduction along the columns of an mma.sync / wgmma accumulator, into the matching slice layout."""
    src, out = op.operands[0], op.result
    layout = src.type.layout
    return (op.attrs.axis == 1 and out.is_tile and isinstance(layout, (MmaLayout, WgmmaLayout))
            and out.type.layout == SliceLayout(layout, 1) and acc_dtype in (D.float32, D.int32))


def _reduce_rows_in_registers(em: Emitter, op: Op, acc_dtype) -> None:
    """Per-thread combine, quad shuffles, and (mma.sync with warps along N) one shared exchange across warps.

    Both accumulator layouts hold, per thread, rows in pairs (g and g + 8) of "row slots": register
    ``slab * SLAB + 4 * q + 2 * h + b`` is row slot ``2 * slab + h``, column group ``q``, column ``b`` of the pair
    (PTX ISA 9.7.14.5.8 for m16n8 C/D, 9.7.15.5.1 for wgmma D; ``SLAB`` = registers per 16-row atom row, or per
    64-row slab). The four lanes ``4g .. 4g+3`` of a quad hold the other columns of the same rows.
    """
    src, out = op.operands[0], op.result
    kind = op.attrs.kind
    layout = src.type.layout
    acc_t = c_type(acc_dtype)
    slab = 4 * layout.atoms[1] if isinstance(layout, MmaLayout) else layout.shape[1] // 2
    slots = 2 * (layout.regs // slab)
    groups = slab // 4
    x, r = em.name(src), em.fresh("tj_rows")
    em.comment(op, f"{kind.value} over axis 1 in registers: quad shuffles"
                   + (f", then {layout.warps_n} warps through shared memory"
                      if isinstance(layout, MmaLayout) and layout.warps_n > 1 else ""))
    em.line(f"{acc_t} {r}[{slots}];")
    em.line("#pragma unroll")
    em.open(f"for (int tj_s = 0; tj_s < {slots}; ++tj_s)")
    em.line(f"const int tj_base = (tj_s >> 1) * {slab} + 2 * (tj_s & 1);")
    em.line(f"{acc_t} tj_v = {_identity(kind, acc_dtype)};")
    em.line("#pragma unroll")
    em.open(f"for (int tj_q = 0; tj_q < {groups}; ++tj_q)")
    for b in range(2):
        value = convert(f"{x}[tj_base + 4 * tj_q + {b}]", src.dtype, acc_dtype)
        em.line(f"tj_v = {_combine(kind, 'tj_v', value, acc_dtype)};")
    em.close()
    for lane_mask in (1, 2):
        em.line(f"tj_v = {_combine(kind, 'tj_v', f'__shfl_xor_sync(0xffffffffu, tj_v, {lane_mask})', acc_dtype)};")
    em.line(f"{r}[tj_s] = tj_v;")
    em.close()
    if isinstance(layout, MmaLayout) and layout.warps_n > 1:
        _combine_across_warps(em, layout, kind, acc_dtype, r, slots)
    name = em.declare_tile(out)
    em.reg_loop(out.type.layout, lambda i: em.line(
        f"{name}[{i}] = {convert(f'{r}[(({i}) / {slab}) * 2 + ((({i}) >> 1) & 1)]', acc_dtype, out.dtype)};"))


def _combine_across_warps(em: Emitter, layout: MmaLayout, kind: ReduceKind, acc_dtype, r: str, slots: int) -> None:
    """Warps that split a row's columns swap their partial results through shared memory: lane t = 0 of each
    quad writes its rows' partials (one per warp column), then every thread combines the warps_n partials."""
    acc_t = c_type(acc_dtype)
    rows = layout.shape[0]
    wn = layout.warps_n
    em.scratch(rows * wn * acc_dtype.itemsize)
    buf = f"reinterpret_cast<{acc_t}*>(tj_scratch)"
    wtm = layout.warp_tile[0]
    row = f"(tid >> 5) / {wn} * {wtm} + (tj_s >> 1) * 16 + ((tid & 31) >> 2) + 8 * (tj_s & 1)"
    em.barrier("scratch is free")
    em.open("if ((tid & 3) == 0)")
    em.line("#pragma unroll")
    em.line(f"for (int tj_s = 0; tj_s < {slots}; ++tj_s) {buf}[({row}) * {wn} + (tid >> 5) % {wn}] = {r}[tj_s];")
    em.close()
    em.barrier()
    em.line("#pragma unroll")
    em.open(f"for (int tj_s = 0; tj_s < {slots}; ++tj_s)")
    em.line(f"{acc_t} tj_v = {buf}[({row}) * {wn}];")
    em.line("#pragma unroll")
    em.line(f"for (int tj_w = 1; tj_w < {wn}; ++tj_w) tj_v = {_combine(kind, 'tj_v', f'{buf}[({row}) * {wn} + tj_w]', acc_dtype)};")
    em.line(f"{r}[tj_s] = tj_v;")
    em.close()


@emits(OpKind.SCAN)
def _scan(em: Emitter, op: Op) -> None:
    """Inclusive prefix sum along one axis, through the shared scratch buffer: every thread writes its elements
    (row-major), each line along the axis is summed in order by one thread (lines dealt round-robin), then every
    thread reads back the elements its layout holds. Sequential per line, so the float rounding is that of a
    left-to-right sum (the interpreter's)."""
    src, out = op.operands[0], op.result
    shape = src.type.shape
    axis = op.attrs.axis
    n = shape[axis]
    inner = 1
    for d in shape[axis + 1:]:
        inner *= d
    lines = src.type.numel // n
    ctype = c_type(out.dtype)
    layout, out_layout = src.type.layout, out.type.layout
    em.scratch(src.type.numel * out.dtype.itemsize)
    buf = f"reinterpret_cast<{ctype}*>(tj_scratch)"
    name = em.declare_tile(out)
    em.comment(op, f"cumsum along axis {axis} through shared memory")
    em.barrier("scratch is free")

    def write(i: str) -> None:
        valid = em.valid(layout, i)
        store = f"{buf}[{_linear(em.coords(layout, i), shape)}] = {em.name(src)}[{i}];"
        em.line(f"if ({valid}) {store}" if valid else store)

    em.reg_loop(layout, write)
    em.barrier()
    threads = em.target.threads
    em.open(f"for (int tj_l = tid; tj_l < {lines}; tj_l += {threads})")
    em.line(f"{ctype}* tj_line = {buf} + (tj_l / {inner}) * {n * inner} + (tj_l % {inner});")
    em.line(f"{ctype} tj_acc = ({ctype})0;")
    em.open(f"for (int tj_j = 0; tj_j < {n}; ++tj_j)")
    em.line(f"tj_acc = tj_acc + tj_line[tj_j * {inner}];")
    em.line(f"tj_line[tj_j * {inner}] = tj_acc;")
    em.close()
    em.close()
    em.barrier()
    em.reg_loop(out_layout, lambda i: em.line(f"{name}[{i}] = {buf}[{_linear(em.coords(out_layout, i), shape)}];"))
