"""Reductions along one axis of a register tile.

The tile goes through the shared scratch buffer: every thread writes its elements, then each output
element is reduced by one thread (outputs dealt round-robin), then every thread reads back the outputs its
result layout (the input's layout with the axis removed) holds. Correct for any layout; a shuffle-based
fast path for accumulator layouts is a later optimisation.
"""
from __future__ import annotations

from .. import dtypes as D
from ..ir import Op, OpKind, ReduceKind
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
    em.comment(op, f"{kind.value} over axis {axis} through shared memory")
    em.scratch((src.type.numel + n_out) * acc_dtype.itemsize)
    buf = f"reinterpret_cast<{acc_t}*>(tj_scratch)"
    res = f"(reinterpret_cast<{acc_t}*>(tj_scratch) + {src.type.numel})"
    em.line("__syncthreads();  // scratch is free")

    def write(i: str) -> None:
        valid = em.valid(layout, i)
        value = convert(f"{em.name(src)}[{i}]", src.dtype, acc_dtype)
        store = f"{buf}[{_linear(em.coords(layout, i), shape)}] = {value};"
        em.line(f"if ({valid}) {store}" if valid else store)

    em.reg_loop(layout, write)
    em.line("__syncthreads();")
    em.open(f"for (int tj_o = tid; tj_o < {n_out}; tj_o += {threads})")
    em.line(f"const int tj_outer = tj_o / {inner}, tj_inner = tj_o % {inner};")
    em.line(f"{acc_t} tj_acc = {_identity(kind, acc_dtype)};")
    em.line("#pragma unroll 8")
    em.open(f"for (int tj_k = 0; tj_k < {k}; ++tj_k)")
    em.line(f"tj_acc = {_combine(kind, 'tj_acc', f'{buf}[(tj_outer * {k} + tj_k) * {inner} + tj_inner]', acc_dtype)};")
    em.close()
    em.line(f"{res}[tj_o] = tj_acc;")
    em.close()
    em.line("__syncthreads();")
    if out.is_scalar:
        em.line(f"const {c_type(dtype)} {em.name(out)} = {convert(f'{res}[0]', acc_dtype, dtype)};")
        return
    name = em.declare_tile(out)
    out_layout = out.type.layout
    em.reg_loop(out_layout, lambda i: em.line(
        f"{name}[{i}] = {convert(f'{res}[{_linear(em.coords(out_layout, i), out.type.shape)}]', acc_dtype, dtype)};"))
