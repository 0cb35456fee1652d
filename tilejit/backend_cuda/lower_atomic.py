"""Gathers, scatters and atomics: per-element, predicated global accesses in a register layout.

Each thread handles the elements its layout gives it; an element's tensor coordinates are the window's start
plus its tile coordinate, or the index tile's value along the indexed dim. An element outside the tensor is
not read (0), not written, and takes no atomic (old value 0).

Atomics (PTX ISA 9.7.13.5 ``atom``, 9.7.13.6 ``red``): ``atom.<sem>.<scope>.global.<op>.<type>``; with the
result unused and a ``relaxed``/``release`` sem, ``red`` (no return value). Integer add/max/min, f32/f64 add,
exchange and compare-and-swap are single instructions; float max/min are a compare-and-swap loop; f16/bf16
use ``atom.add.noftz`` where the arch has it and a 16-bit compare-and-swap loop otherwise. The layout
pass gives an atomic's operands a layout in which every element has one owner (``unique_layout``), so each
element is updated once; a tile atomic's ``sem`` orders each thread's own accesses. A single-element atomic
is issued by thread 0; with a non-relaxed ``sem`` (or a used result) the program synchronizes before and after
it, so it orders every thread's accesses (locks, flags), and thread 0 passes the old value to the others
through shared scratch.

On sm_90+ a relaxed tile atomic_add of a wgmma accumulator whose old values are unused goes out as TMA bulk
tensor reductions instead (``_bulk_reduction``: the TMA store epilogue's staging, ``lower_tma.emit_store``): whole
128-byte lines added in L2, each element's add a relaxed atomic at gpu scope (PTX 9.7.9.25.5.3).
"""
from __future__ import annotations

from .. import dtypes as D
from ..dtypes import DType
from ..ir import AtomicOp, Op, OpKind
from ..ir.layouts import SharedLayout
from .emitter import Emitter, c_type, emits
from . import lower_tma

# the PTX operand constraint and type suffixes of each supported dtype
_CONSTRAINT = {D.float32: "f", D.float64: "d", D.int32: "r", D.int64: "l"}
_BITS_TYPE = {D.float32: "b32", D.float64: "b64", D.int32: "b32", D.int64: "b64"}
_ADD_TYPE = {D.float32: "f32", D.float64: "f64", D.int32: "u32", D.int64: "u64"}   # two's complement: u = s
_MINMAX_TYPE = {D.int32: "s32", D.int64: "s64"}
_UINT = {32: "unsigned", 64: "unsigned long long"}


def _used_values(em: Emitter) -> set[int]:
    used = getattr(em, "_tj_used_values", None)
    if used is None:
        used = {v.id for op in em.fn.walk() for v in op.operands}
        em._tj_used_values = used  # type: ignore[attr-defined]
    return used


def _element(em: Emitter, op: Op, first_start: int, index: str | None, coords: list[str] | None):
    """(element offset from the tensor's base, in-bounds condition) of one element: ``coords`` are its tile
    coordinates (None for a single-element window), ``index`` the C expression of its index-tile value."""
    tensor = op.operands[0]
    t = em.name(tensor)
    starts = [em.name(v) for v in op.operands[first_start:]]
    attrs = op.attrs
    axis = getattr(attrs, "axis", None)
    k = 0
    terms, conds = [], []
    for d in range(tensor.type.rank):
        if d in attrs.dropped:
            c = f"(int64_t)({starts[d]})"
        elif d == axis:
            c = f"(int64_t)({index})"
            k += 1
        else:
            c = f"((int64_t)({starts[d]}) + {coords[k]})"
            k += 1
        terms.append(f"{c} * {t}_stride{d}")
        conds.append(f"(uint64_t){c} < (uint64_t){t}_size{d}")
    return " + ".join(terms), " && ".join(conds)


# -- gather and scatter ------------------------------------------------------------------------------

@emits(OpKind.GATHER)
def _gather(em: Emitter, op: Op) -> None:
    out = op.result
    layout = out.type.layout
    name = em.declare_tile(out)
    t, idx = em.name(op.operands[0]), em.name(op.operands[1])
    ctype = c_type(out.dtype)
    em.comment(op, f"gather rows of {t} by an index tile")

    def body(i: str) -> None:
        off, ok = _element(em, op, 2, f"{idx}[{i}]", em.coords(layout, i))
        valid = em.valid(layout, i)
        em.line(f"{name}[{i}] = ({ok}{' && ' + valid if valid else ''}) ? {t}[{off}] : {ctype}{{}};")

    em.reg_loop(layout, body)


@emits(OpKind.SCATTER)
def _scatter(em: Emitter, op: Op) -> None:
    value = op.operands[1]
    layout = value.type.layout
    t, v, idx = em.name(op.operands[0]), em.name(value), em.name(op.operands[2])
    em.comment(op, f"scatter into rows of {t} picked by an index tile (duplicates: one write wins)")

    def body(i: str) -> None:
        off, ok = _element(em, op, 3, f"{idx}[{i}]", em.coords(layout, i))
        valid = em.valid(layout, i)
        em.line(f"if ({ok}{' && ' + valid if valid else ''}) {t}[{off}] = {v}[{i}];")

    em.reg_loop(layout, body)


# -- atomics ----------------------------------------------------------------------------------------

_HALF = {D.float16: ("f16", 700), D.bfloat16: ("bf16", 900)}  # atom.add.noftz.<type>, from sm_<n>


def _atomic16(name: str, kind: AtomicOp, dtype: DType, sem: str, scope: str, use_red: bool) -> str:
    """f16/bf16 atomics: ``atom.add.noftz.{f16,bf16}`` (bf16 from sm_90) for add; a compare-and-swap loop on the
    16 bits (``atom.cas.b16``, sm_70+) for the rest, computing in float32 and rounding once, like the
    elementwise ops."""
    ctype = c_type(dtype)
    qual = f"{sem}.{scope}"
    load_sem = "acquire" if sem in ("acquire", "acq_rel") else "relaxed"
    ptx_type, min_arch = _HALF[dtype]
    if kind is AtomicOp.CAS:
        return (f"TJ_DEVICE {ctype} {name}({ctype}* p, {ctype} cmp, {ctype} v) {{\n  {ctype} old;\n"
                f"  asm volatile(\"atom.{qual}.global.cas.b16 %0, [%1], %2, %3;\" : \"=h\"(old.bits) "
                f": \"l\"(p), \"h\"(cmp.bits), \"h\"(v.bits) : \"memory\");\n  return old;\n}}\n")
    update = {AtomicOp.ADD: "tj_to_f32(cur) + tj_to_f32(v)", AtomicOp.MAX: "tj_max(tj_to_f32(cur), tj_to_f32(v))",
              AtomicOp.MIN: "tj_min(tj_to_f32(cur), tj_to_f32(v))"}
    next_bits = "v.bits" if kind is AtomicOp.XCHG else f"tj_from_f32<{ctype}>({update[kind]}).bits"
    loop = (f"  unsigned short old;\n"
            f"  asm volatile(\"ld.{load_sem}.{scope}.global.b16 %0, [%1];\" : \"=h\"(old) : \"l\"(p) : \"memory\");\n"
            f"  while (true) {{\n"
            f"    const {ctype} cur{{old}};\n"
            f"    const unsigned short next = {next_bits};\n"
            f"    if (next == old{' && false' if kind is AtomicOp.XCHG else ''}) return cur;  // nothing to write\n"
            f"    unsigned short prev;\n"
            f"    asm volatile(\"atom.{qual}.global.cas.b16 %0, [%1], %2, %3;\" : \"=h\"(prev) : \"l\"(p), "
            f"\"h\"(old), \"h\"(next) : \"memory\");\n"
            f"    if (prev == old) return cur;\n"
            f"    old = prev;\n  }}\n")
    if kind is not AtomicOp.ADD:
        return f"TJ_DEVICE {ctype} {name}({ctype}* p, {ctype} v) {{\n{loop}}}\n"
    if use_red:
        native = (f"  asm volatile(\"red.{qual}.global.add.noftz.{ptx_type} [%0], %1;\" :: \"l\"(p), \"h\"(v.bits) "
                  f": \"memory\");\n")
        fallback = loop.replace("return cur;", "return;")
        return (f"TJ_DEVICE void {name}({ctype}* p, {ctype} v) {{\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {min_arch}\n"
                f"{native}#else\n{fallback}#endif\n}}\n")
    native = (f"  {ctype} old;\n  asm volatile(\"atom.{qual}.global.add.noftz.{ptx_type} %0, [%1], %2;\" : \"=h\"(old.bits) "
              f": \"l\"(p), \"h\"(v.bits) : \"memory\");\n  return old;\n")
    return (f"TJ_DEVICE {ctype} {name}({ctype}* p, {ctype} v) {{\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {min_arch}\n"
            f"{native}#else\n{loop}#endif\n}}\n")


def atomic_function(em: Emitter, kind: AtomicOp, dtype: DType, sem: str, scope: str, returns: bool) -> str:
    """The name of a device function ``T f(T* p, T v[, T cmp])`` doing one atomic (added to the support once)."""
    use_red = not returns and sem in ("relaxed", "release") and kind is AtomicOp.ADD
    name = f"tj_{'red' if use_red else 'atom'}_{kind.value}_{dtype.name}_{sem}_{scope}"
    if dtype in _HALF:
        em.require_support(name, _atomic16(name, kind, dtype, sem, scope, use_red))
        return name
    ctype, con, bits = c_type(dtype), _CONSTRAINT[dtype], dtype.bits
    qual = f"{sem}.{scope}"
    if kind is AtomicOp.ADD and use_red:
        text = (f"TJ_DEVICE void {name}({ctype}* p, {ctype} v) {{\n"
                f"  asm volatile(\"red.{qual}.global.add.{_ADD_TYPE[dtype]} [%0], %1;\" :: \"l\"(p), \"{con}\"(v) : \"memory\");\n}}\n")
    elif kind is AtomicOp.ADD or (kind in (AtomicOp.MAX, AtomicOp.MIN) and dtype.is_integer):
        ptx_type = _ADD_TYPE[dtype] if kind is AtomicOp.ADD else _MINMAX_TYPE[dtype]
        text = (f"TJ_DEVICE {ctype} {name}({ctype}* p, {ctype} v) {{\n  {ctype} old;\n"
                f"  asm volatile(\"atom.{qual}.global.{kind.value}.{ptx_type} %0, [%1], %2;\" : \"={con}\"(old) "
                f": \"l\"(p), \"{con}\"(v) : \"memory\");\n  return old;\n}}\n")
    elif kind is AtomicOp.XCHG:
        text = (f"TJ_DEVICE {ctype} {name}({ctype}* p, {ctype} v) {{\n  {ctype} old;\n"
                f"  asm volatile(\"atom.{qual}.global.exch.{_BITS_TYPE[dtype]} %0, [%1], %2;\" : \"={con}\"(old) "
                f": \"l\"(p), \"{con}\"(v) : \"memory\");\n  return old;\n}}\n")
    elif kind is AtomicOp.CAS:
        text = (f"TJ_DEVICE {ctype} {name}({ctype}* p, {ctype} cmp, {ctype} v) {{\n  {ctype} old;\n"
                f"  asm volatile(\"atom.{qual}.global.cas.{_BITS_TYPE[dtype]} %0, [%1], %2, %3;\" : \"={con}\"(old) "
                f": \"l\"(p), \"{con}\"(cmp), \"{con}\"(v) : \"memory\");\n  return old;\n}}\n")
    else:  # float max/min: compare-and-swap on the bits until the stored value is already the max/min
        cas = atomic_function(em, AtomicOp.CAS, D.int32 if bits == 32 else D.int64, sem, scope, True)
        itype = "int32_t" if bits == 32 else "int64_t"
        load_sem = "acquire" if sem in ("acquire", "acq_rel") else "relaxed"
        ld_con = "r" if bits == 32 else "l"
        pick = (f"tj_{kind.value}(cur, v)" if dtype == D.float32 else
                f"((cur != cur || v != v) ? (cur + v) : ({'cur > v' if kind is AtomicOp.MAX else 'cur < v'} ? cur : v))")
        to_bits = "__float_as_int" if bits == 32 else "__double_as_longlong"
        from_bits = "__int_as_float" if bits == 32 else "__longlong_as_double"
        text = (f"TJ_DEVICE {ctype} {name}({ctype}* p, {ctype} v) {{\n"
                f"  {itype}* q = reinterpret_cast<{itype}*>(p);\n  {itype} old;\n"
                f"  asm volatile(\"ld.{load_sem}.{scope}.global.b{bits} %0, [%1];\" : \"={ld_con}\"(old) : \"l\"(q) : \"memory\");\n"
                f"  while (true) {{\n"
                f"    const {ctype} cur = {from_bits}(old);\n"
                f"    const {itype} next = {to_bits}({pick});\n"
                f"    if (next == old) return cur;  // already the {kind.value}: nothing to write\n"
                f"    const {itype} prev = {cas}(q, old, next);\n"
                f"    if (prev == old) return cur;\n"
                f"    old = prev;\n  }}\n}}\n")
    em.require_support(name, text)
    return name


# The element types a TMA bulk reduction adds as ``red`` does: f32 (both round to nearest even and flush subnormal
# inputs and results to zero: PTX 9.7.9.25.4.2, 9.7.13.6) and int32 (two's complement: the s32 add is the u32 one).
# f16 and bf16 keep ``red.add.noftz``: the PTX text of the tensor form says nothing of how it rounds or treats
# subnormals for them, so a match with the per-element path is not verified; it has no s64 or f64 add.
_BULK_ADD_TYPES = (D.float32, D.int32)


def _bulk_form(em: Emitter, op: Op) -> bool:
    """Whether atomic ``op`` has the form of a TMA bulk reduction: an add whose old values are unused,
    ``sem="relaxed"`` (a bulk reduction orders nothing: acquire and release keep ``atom``/``red``), gpu or cta
    scope (the reduction's gpu scope covers cta; not sys), a window (no index tile), f32 or int32
    (``_BULK_ADD_TYPES``), and the TMA epilogue's form (``lower_tma.stageable``: sm_90+, a wgmma accumulator of
    the tensor's dtype, a plain tensor TMA can describe, a 2-D window along its last dim of whole 128-byte rows)."""
    a, out = op.attrs, op.result
    return (a.op is AtomicOp.ADD and a.sem == "relaxed" and a.scope in ("gpu", "cta") and a.axis is None
            and not out.is_scalar and out.id not in _used_values(em) and op.operands[1].dtype in _BULK_ADD_TYPES
            and lower_tma.stageable(em, op))


def _bulk_reduction(em: Emitter, op: Op) -> tuple[SharedLayout, int] | None:
    """The staging of a tile atomic that goes out as TMA bulk reductions, or None when it keeps the per-element
    path: it has their form (``_bulk_form``), its staging fits the shared memory left, and the kernel touches the
    tensor only by atomics of that form (its extents and strides aside).

    The reductions complete asynchronously, in the async proxy, and accesses are ordered (or atomic with respect
    to each other) only within one proxy (the PTX memory model's morally strong operations): a kernel that also
    loads, stores or otherwise updates the tensor keeps the per-element path, where program order holds, rather
    than wait for each reduction to complete. (Each atomic's staging fits or not where it is emitted: two
    bulk-form atomics into one tensor could still take different paths where one sits in a loop whose ring
    leaves too little room.)"""
    if not _bulk_form(em, op):
        return None
    tensor = op.operands[0]
    for other in em.fn.walk():
        if other is op or other.kind in (OpKind.TENSOR_DIM, OpKind.TENSOR_STRIDE):
            continue
        if any(v is tensor for v in other.operands) and not (other.kind is OpKind.ATOMIC and _bulk_form(em, other)):
            return None
    return lower_tma.store_staging(em, op)


def _atomic_call(em: Emitter, op: Op, fn: str, ptr: str, val: str, cmp: str | None) -> str:
    return f"{fn}({ptr}, {cmp + ', ' if cmp is not None else ''}{val})"


@emits(OpKind.ATOMIC)
def _atomic(em: Emitter, op: Op) -> None:
    staging = _bulk_reduction(em, op)
    if staging is not None:
        lower_tma.emit_store(em, op, staging, lower_tma.REDUCE_ADD)
        return
    a = op.attrs
    tensor, value, out = op.operands[0], op.operands[1], op.result
    t = em.name(tensor)
    dtype = tensor.dtype
    returns = out.id in _used_values(em)
    fn = atomic_function(em, a.op, dtype, a.sem, a.scope, returns)
    cmp = op.operands[2] if a.op is AtomicOp.CAS else None
    index = op.operands[a.index_operand] if a.index_operand is not None else None
    ctype = c_type(dtype)
    em.comment(op, f"atomic {a.op.value} ({a.sem}, {a.scope}) into {t}")
    if out.is_scalar:
        # One element: thread 0 issues it. With a non-relaxed sem the program synchronizes around it, so the
        # release covers every thread's earlier accesses and the acquire every thread's later ones (a lock
        # or flag taken by one thread on behalf of the program).
        off, ok = _element(em, op, a.first_start, None, None)
        call = _atomic_call(em, op, fn, f"{t} + ({off})", em.name(value), em.name(cmp) if cmp is not None else None)
        name = em.name(out)
        fenced = a.sem != "relaxed"
        if not returns and not fenced:
            em.line(f"if (tid == 0 && {ok}) {call};")
            em.line(f"const {ctype} {name} = {ctype}{{}};  // unused")
            return
        buf = f"reinterpret_cast<{ctype}*>({em.scratch(8)})"
        em.line(f"{ctype} {name};")
        em.open("")
        em.barrier("the program's earlier accesses (and scratch readers) are done")
        if returns:
            em.line(f"if (tid == 0) *{buf} = ({ok}) ? {call} : {ctype}{{}};")
        else:
            em.line(f"if (tid == 0 && {ok}) {call};")
        em.barrier("thread 0's atomic (and old value) before the program goes on")
        em.line(f"{name} = {'*' + buf if returns else ctype + '{}'};")
        em.close()
        return
    layout = out.type.layout
    name = em.declare_tile(out)
    v = em.name(value)
    c = em.name(cmp) if cmp is not None else None
    idx = em.name(index) if index is not None else None

    def body(i: str) -> None:
        off, ok = _element(em, op, a.first_start, f"{idx}[{i}]" if idx else None, em.coords(layout, i))
        valid = em.valid(layout, i)
        cond = f"{ok}{' && ' + valid if valid else ''}"
        call = _atomic_call(em, op, fn, f"{t} + ({off})", f"{v}[{i}]", f"{c}[{i}]" if c else None)
        if returns and "tj_red_" not in fn:
            em.line(f"{name}[{i}] = ({cond}) ? {call} : {ctype}{{}};")
        else:
            em.line(f"if ({cond}) {call};")

    if not returns:
        em.line(f"(void){name};")
    em.reg_loop(layout, body)
