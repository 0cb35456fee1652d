"""Global loads and stores, shared-memory staging and layout conversions.

* global -> registers: each thread reads its layout's elements; a 16-byte (or narrower) vector access
  when the window is aligned and fully in bounds (checked at run time, uniformly), else predicated
  element accesses that read 0 out of bounds.
* global -> shared (gemm operands): ``cp.async`` 16-byte chunks with zero-fill for the out-of-bounds
  part of a row, into the swizzled layout; element-wise copies when the tensor's rows are not 16-byte
  aligned (a rolled loop in line). Pipelined loads are issued by the loop (``lower_loops``), others
  synchronously here.
* The run-time tests leave out each term that is known at compile time (``passes/divisibility.py``: the
  specialization's alignment, strides and extents, constants, ``T.multiple_of`` promises); when no term is
  left, only the vector (or cp.async) variant is emitted.
* registers -> global: predicated stores, vectorized along the layout's contiguous registers; the
  element-wise fallback of a large tile is a rolled loop over a local copy.
* conversions between layouts, and broadcasts that are not free, go through the shared scratch buffer.
"""
from __future__ import annotations


from ..ir import Op, OpKind, Scope, Value
from ..passes.divisibility import Divisibility
from ..ir.layouts import (CExpr, RegisterLayout, SharedLayout, broadcast_view, c_text, duplicate_registers,
                          thread_local_broadcast, thread_local_permutation)
from .emitter import Emitter, SharedTile, c_type, emits
from . import lower_tma

_VEC_TYPES = {16: "tj_v16", 8: "tj_v8", 4: "uint32_t", 2: "uint16_t", 1: "uint8_t"}
# Element-wise store fallbacks up to this many registers stay unrolled: they are small, and elementwise
# kernels (a few registers per thread) take them on every tensor whose size breaks the vector width.
_UNROLLED_STORE_REGS = 16
# The rolled fallback is used below sm_90 only. On sm_90a it perturbed ptxas's scheduling of the wgmma main loop
# (same instructions, other order): 128x128x64 / 4 warps / 4 stages on 8192x8192x1024 fp16 ran at 365 TFLOP/s
# instead of 385 (H200, three alternating runs each), while on sm_80 code it shortened the main loop.
_ROLLED_STORE_BEFORE_SM = 90


class Window:
    """A tile-shaped window of a global tensor, as C expressions, with what is known of it at compile time.

    ``starts`` are the C expressions of the window's starts (a pipelined loop passes them for a later
    iteration); the facts are those of the op's start values, which hold for every iteration the loop runs.
    """

    def __init__(self, em: Emitter, op: Op, starts: list[str]) -> None:
        self.em = em
        self.tensor = op.operands[0]
        self.t = em.name(self.tensor)
        self.rank = self.tensor.type.rank
        self.dropped = op.attrs.dropped
        self.tile_dims = [d for d in range(self.rank) if d not in self.dropped]
        self.starts = starts
        self.start_values = op.operands[len(op.operands) - self.rank:]
        spec = em.fn.attrs.get("tensor_specs", {}).get(self.tensor.name)
        self.unit_last = spec is not None and (self.rank - 1) in spec.unit_stride_dims \
            and bool(self.tile_dims) and self.tile_dims[-1] == self.rank - 1
        # a 2-D window whose first dim, not its last, has unit stride: a column-major tile (B given as w.T)
        self.unit_first = spec is not None and not self.unit_last and len(self.tile_dims) == 2 \
            and self.tile_dims[0] in spec.unit_stride_dims
        self.esize = self.tensor.dtype.itemsize
        # nothing is known without the analysis (IR that skipped the pass pipeline)
        self.known: Divisibility | None = em.fn.attrs.get("divisibility")

    def size(self, d: int) -> str:
        return f"{self.t}_size{d}"

    def stride(self, d: int) -> str:
        return f"{self.t}_stride{d}"

    def base_expr(self) -> str:
        terms = " + ".join(f"(int64_t)({s}) * {self.stride(d)}" for d, s in enumerate(self.starts))
        return f"{self.t} + ({terms})"

    def start_in_bounds(self, d: int) -> str:
        """Whether the window's start along dim ``d`` lies inside the tensor (a dropped dim's one index)."""
        return f"(uint64_t)(int64_t)({self.starts[d]}) < (uint64_t){self.size(d)}"

    def dropped_ok(self) -> str:
        conds = [self.start_in_bounds(d) for d in self.dropped]
        return " && ".join(conds) if conds else "true"

    def in_bounds(self, k: int, coord: str, extra: int = 0) -> str:
        d = self.tile_dims[k]
        return f"(uint64_t)((int64_t)({self.starts[d]}) + {coord}{f' + {extra}' if extra else ''}) < (uint64_t){self.size(d)}"

    def offset(self, coords: list[str]) -> str:
        """Element offset of tile coordinates from the window's base.

        The unit last stride is multiplied too: dropping it measured 16% slower on the ragged
        1000x3000x777 matmul (H200), through the element-wise staging loop's code generation.
        """
        return " + ".join(f"(int64_t)({c}) * {self.stride(d)}" for c, d in zip(coords, self.tile_dims)) or "0"

    # -- what is known at compile time (each False when nothing is) -------------------------------------------

    def start_multiple_of(self, d: int, n: int) -> bool:
        return self.known is not None and self.known.divisor(self.start_values[d]) % n == 0

    def start_nonnegative(self, d: int) -> bool:
        return self.known is not None and self.known.nonnegative(self.start_values[d])

    def stride_multiple_of(self, d: int, n: int) -> bool:
        return self.known is not None and self.known.stride_divisor(self.tensor, d) % n == 0

    def extent_multiple_of(self, d: int, n: int) -> bool:
        return self.known is not None and self.known.extent_divisor(self.tensor, d) % n == 0

    def base_aligned(self, nbytes: int) -> bool:
        """Whether the window's first element is ``nbytes``-aligned: the data pointer is, and so is each
        start times its stride (the last dim's stride is 1 where ``unit_last``)."""
        known = self.known
        if known is None or known.pointer_alignment(self.tensor) % nbytes:
            return False
        for d, v in enumerate(self.start_values):
            stride = 1 if (d == self.rank - 1 and self.unit_last) else known.stride_divisor(self.tensor, d)
            if known.divisor(v) * stride * self.esize % nbytes:
                return False
        return True

    def vector_terms(self, vec: int, pointer: str = "tj_p") -> list[str]:
        """The uniform run-time conditions for ``vec``-element accesses along the last dim from ``pointer`` (the
        window's base), less those known to hold: the base is aligned, and every other dim's stride is a multiple
        of ``vec``."""
        terms = [] if self.base_aligned(vec * self.esize) else [f"((uint64_t)({pointer}) % {vec * self.esize} == 0)"]
        terms += [f"({self.stride(d)} % {vec} == 0)" for d in range(self.rank)
                  if d != self.rank - 1 and not self.stride_multiple_of(d, vec)]
        return terms


def _start_names(em: Emitter, op: Op, first: int) -> list[str]:
    return [em.name(v) for v in op.operands[first:]]


# -- global <-> registers ------------------------------------------------------------------------

def _element(em: Emitter, op: Op, first: int) -> tuple[str, str]:
    """(pointer, in-bounds condition) of a one-element window ``X[i, j]``."""
    win = Window(em, op, _start_names(em, op, first))
    return f"({win.base_expr()})", win.dropped_ok()


@emits(OpKind.LOAD)
def _load(em: Emitter, op: Op) -> None:
    carried = em.carried_loads.get(op.result.id)  # (a loop's, its pointers set up before it: carried_loads)
    if op.result.is_scalar:
        # X[i, j]: every thread reads the element (a broadcast load); 0 out of bounds
        if carried is not None:
            carried.load_scalar(Window(em, op, _start_names(em, op, 1)), em.name(op.result))
            return
        ptr, ok = _element(em, op, 1)
        ctype = c_type(op.result.dtype)
        em.line(f"const {ctype} {em.name(op.result)} = ({ok}) ? *{ptr} : {ctype}{{}};")
        return
    if op.result.type.scope is Scope.SHARED:
        if op.attrs.pipeline:
            return  # issued ahead of time by the enclosing pipelined loop
        stage_shared(em, op.result)
        em.comment(op, f"stage {em.name(op.operands[0])} window in shared memory (synchronous)")
        em.barrier("earlier readers of this buffer are done")
        issue_shared_load(em, op, _start_names(em, op, 1), "0")
        em.line(f"tj_cp_async_commit(); tj_cp_async_wait<0>(); tj_fence_proxy_async(); {em.sync}")
        return
    out = op.result
    layout: RegisterLayout = out.type.layout
    name = em.declare_tile(out)
    win = Window(em, op, _start_names(em, op, 1))
    em.comment(op, f"load {win.t} window into registers")
    owner = duplicate_registers(layout, em.target.threads)
    if carried is not None:
        carried.load_distinct(win, name, owner)
        return
    if owner is not None:
        _load_distinct(em, win, layout, name, owner)
        return
    _move_window(em, win, layout, name, layout.vec if win.unit_last else 1, load=True)


def _load_distinct(em: Emitter, win: Window, layout: RegisterLayout, regs: str, owner: tuple[int, ...]) -> None:
    """A window loaded into a layout whose registers repeat others' elements (a per-row or per-column vector in
    an accumulator's slice layout, ``duplicate_registers``): each distinct element is loaded once and copied to
    its repeats, so a thread issues as many loads as it holds distinct elements (2 for a wgmma accumulator's
    rows), not one per register."""
    ctype = c_type(win.tensor.dtype)
    em.open("")
    em.line(f"const {ctype}* tj_p = {win.base_expr()};")
    em.line(f"const bool tj_dropped_ok = {win.dropped_ok()};")
    for i in sorted(set(owner)):
        coords = em.coords(layout, str(i))
        valid = em.valid(layout, str(i))
        ok = " && ".join(["tj_dropped_ok"] + [win.in_bounds(k, c) for k, c in enumerate(coords)]
                         + ([valid] if valid else []))
        em.line(f"{regs}[{i}] = ({ok}) ? tj_p[{win.offset(coords)}] : {ctype}{{}};")
    for i, j in enumerate(owner):
        if i != j:
            em.line(f"{regs}[{i}] = {regs}[{j}];")
    em.close()


@emits(OpKind.STORE)
def _store(em: Emitter, op: Op) -> None:
    value = op.operands[1]
    if value.is_scalar:
        # X[i, j] = v: every thread stores the same value (so each thread reads its own write back);
        # skipped out of bounds
        ptr, ok = _element(em, op, 2)
        em.line(f"if ({ok}) *{ptr} = {em.name(value)};")
        return
    staging = lower_tma.store_staging(em, op)
    if staging is not None:
        lower_tma.emit_store(em, op, staging)
        return
    layout: RegisterLayout = value.type.layout
    win = Window(em, op, _start_names(em, op, 2))
    vec = layout.vec if win.unit_last else 1
    while vec > 1 and (vec * win.esize > 16 or layout.regs % vec):
        vec //= 2
    em.comment(op, f"store into {win.t} window")
    _move_window(em, win, layout, em.name(value), vec, load=False)


def _move_window(em: Emitter, win: Window, layout: RegisterLayout, regs: str, vec: int, load: bool) -> None:
    """Registers ``regs`` (in ``layout``) from or to a global window.

    When the window's rows are aligned for ``vec``-element accesses and the last extent and start are
    multiples of ``vec`` (a uniform run-time check), every group of ``vec`` registers is wholly inside or
    wholly outside the tensor, so the window moves with predicated vector accesses; otherwise it moves
    element by element. Out-of-bounds loads read 0; out-of-bounds stores are dropped. Two straight-line
    variants, rather than a vector-or-scalar choice per group, keep the kernel and its compile time small.

    Below sm_90, the element-wise fallback of a vectorized store of more than ``_UNROLLED_STORE_REGS`` registers
    is a rolled loop: unrolled, it was most of the DESIGN matmul's PTX (a predicated store per register) and
    of its NVRTC time. Indexing the register tile in a rolled loop would push it to local memory for the
    fast path too, so the fallback first copies it to a local array. Loads stay unrolled, to keep their
    reads in flight.
    """
    ctype = c_type(win.tensor.dtype)
    const = "const " if load else ""
    em.open("")
    em.line(f"{const}{ctype}* tj_p = {win.base_expr()};")
    em.line(f"const bool tj_dropped_ok = {win.dropped_ok()};")
    if vec > 1:
        last = win.tile_dims[-1]
        whole = win.vector_terms(vec)
        if not win.extent_multiple_of(last, vec):
            whole.append(f"{win.size(last)} % {vec} == 0")
        if not win.start_multiple_of(last, vec):
            whole.append(f"(int64_t)({win.starts[last]}) % {vec} == 0")
        if not whole:  # known at compile time: the vector variant alone
            em.line(f"// {win.t}: aligned, whole {vec}-element groups (known at compile time): "
                    "no element-wise variant")
            _window_loop(em, win, layout, regs, vec, load)
            em.close()
            return
        em.open(f"if ({' && '.join(whole)})")
        _window_loop(em, win, layout, regs, vec, load)
        em.close("} else {")
        em.depth += 1
    rolled = (vec > 1 and not load and layout.regs > _UNROLLED_STORE_REGS and layout.regs * win.esize % 16 == 0
              and em.target.sm < _ROLLED_STORE_BEFORE_SM)
    if rolled:
        regs = _local_copy(em, layout, regs, ctype, win.esize)
    _window_loop(em, win, layout, regs, 1, load, unroll="1" if rolled else "")
    if vec > 1:
        em.close()
    em.close()


def _local_copy(em: Emitter, layout: RegisterLayout, regs: str, ctype: str, esize: int) -> str:
    """``tj_tmp``, a local-memory copy of register tile ``regs`` (a multiple of 16 bytes) made with
    constant-index 16-byte moves, so a rolled loop can index it while ``regs`` stays in registers."""
    per = 16 // esize
    em.line(f"alignas(16) {ctype} tj_tmp[{layout.regs}];")
    em.line("#pragma unroll")
    em.open(f"for (int tj_g = 0; tj_g < {layout.regs // per}; ++tj_g)")
    em.line(f"*reinterpret_cast<tj_v16*>(&tj_tmp[tj_g * {per}]) = *reinterpret_cast<const tj_v16*>(&{regs}[tj_g * {per}]);")
    em.close()
    return "tj_tmp"


def _window_loop(em: Emitter, win: Window, layout: RegisterLayout, regs: str, vec: int, load: bool,
                 unroll: str = "") -> None:
    """One access per group of ``vec`` registers, predicated on its first element being in bounds."""
    ctype = c_type(win.tensor.dtype)
    const = "const " if load else ""
    em.line(f"#pragma unroll {unroll}".rstrip())
    em.open(f"for (int tj_g = 0; tj_g < {layout.regs // vec}; ++tj_g)")
    em.line(f"const int i = tj_g * {vec};")
    coords = em.coords(layout, "i")
    valid = em.valid(layout, "i")
    ok = " && ".join(["tj_dropped_ok"] + [win.in_bounds(k, c) for k, c in enumerate(coords)] + ([valid] if valid else []))
    offset = win.offset(coords)
    if vec > 1:
        vt = _VEC_TYPES[vec * win.esize]
        memory = f"*reinterpret_cast<{const}{vt}*>(tj_p + {offset})"
        register = f"*reinterpret_cast<{'' if load else 'const '}{vt}*>(&{regs}[i])"
    else:
        memory, register = f"tj_p[{offset}]", f"{regs}[i]"
    if load:
        zero = f"{vt}{{}}" if vec > 1 else f"{ctype}{{}}"
        em.line(f"{register} = ({ok}) ? {memory} : {zero};")
    else:
        em.line(f"if ({ok}) {memory} = {register};")
    em.close()


# -- global -> shared ---------------------------------------------------------------------------

def stage_shared(em: Emitter, v: Value) -> SharedTile:
    """Allocate (once) the shared ring of a shared tile value."""
    tile = em.shared.get(v.id)
    if tile is None:
        layout: SharedLayout = v.type.layout
        tile = SharedTile(em.allocate_shared(layout.bytes, 1024 if layout.bytes >= 1024 else 128), layout,
                          origin=em.smem_origin)
        em.shared[v.id] = tile
    return tile


class SharedCopy:
    """Copies the window of one shared-scope load into a slot of its ring.

    Two parts, so a pipelined loop can put them apart: ``fast`` issues predicated, branch-free
    16-byte ``cp.async`` copies when the window allows them (unit-stride rows, 16-byte aligned, starts
    >= 0, whole chunks; a uniform run-time check of what is not known at compile time), and ``slow``
    copies element by element when it does not (nothing, when everything is known). In a pipelined loop
    ``fast`` runs before the tensor-core work (the scheduler interleaves the two) and ``slow`` after it.
    Names are prefixed so several copies can share one C scope.
    """

    def __init__(self, em: Emitter, op: Op, starts: list[str], slot: str, guard: str = "true",
                 address: str | None = None) -> None:
        self.em = em
        self.address = address  # the slot's shared address, when the caller keeps it (else from ``slot``)
        self.tile = stage_shared(em, op.result)
        self.lay = self.tile.layout
        self.win = Window(em, op, starts)
        self.slot = slot
        self.guard = guard
        self.ctype = c_type(op.result.dtype)
        self.x = em.fresh("tj_c") + "_"
        self.chunked = self.win.unit_last and self.lay.row_bytes % 16 == 0
        self.terms = self._fast_terms() if self.chunked else []
        self.always_fast = self.chunked and not self.terms  # under the guard

    def _fast_terms(self) -> list[str]:
        """What the cp.async path needs that is not known at compile time: the window aligned for 16-byte chunks,
        its starts >= 0, and the tensor's rows whole chunks long."""
        win, x = self.win, self.x
        rows, cols = win.tile_dims
        per_chunk = 16 // self.lay.elem_bytes
        terms = win.vector_terms(per_chunk, x + "p")
        terms += [f"(int64_t)({win.starts[d]}) >= 0" for d in (cols, rows) if not win.start_nonnegative(d)]
        if not win.extent_multiple_of(cols, per_chunk):
            terms.append(f"{win.size(cols)} % {per_chunk} == 0")
        return terms

    def begin(self) -> None:
        em, x, win, lay = self.em, self.x, self.win, self.lay
        stage = f"({self.slot}) * {lay.stage_bytes}" if self.slot != "0" else "0"
        em.line(f"const {self.ctype}* {x}p = {win.base_expr()};")
        em.line(f"const bool {x}dropped_ok = {win.dropped_ok()};")
        dst = self.address or f"{self.tile.origin} + {self.tile.offset} + {stage}"
        em.line(f"const unsigned {x}dst = {dst};")
        if self.always_fast:
            em.line(f"const bool {x}fast = ({self.guard});  // aligned, whole 16-byte chunks: known at compile time")
        elif self.chunked:
            em.line(f"const bool {x}fast = {' && '.join([f'({self.guard})', *self.terms])};  // whole 16-byte chunks only")
        else:
            em.line(f"const bool {x}fast = false;")

    def fast(self) -> None:
        """Predicated cp.async of the window's rows; the part of a chunk past the last column is
        zero-filled (src-size < 16) and rows outside the tensor are pure zero fills.

        Thread ``tid`` copies chunk ``tid % chunks_per_row`` of rows ``tid / chunks_per_row + j * rows_per_pass``:
        its column, bounds and byte count are the same for every ``j``, and its row offsets and shared
        addresses depend only on ``tid``.
        """
        if not self.chunked:
            return
        em, x, win, lay = self.em, self.x, self.win, self.lay
        threads = em.target.threads
        per_chunk = 16 // lay.elem_bytes
        c_start = win.starts[win.tile_dims[1]]
        row_stride = win.stride(win.tile_dims[0])
        cpr = lay.row_bytes // 16
        ncol = f"{win.size(win.tile_dims[1])} - ((int64_t)({c_start}) + {x}k * {per_chunk})"
        bytes_expr = (f"(int)({x}left <= 0 ? 0 : ({x}left >= {per_chunk} ? 16 : {x}left * {lay.elem_bytes}))")
        if threads % cpr == 0:
            rpp = threads // cpr  # rows per pass of all threads
            passes = -(-lay.rows // rpp)
            r_start = win.starts[win.tile_dims[0]]
            em.line(f"const int {x}k = {c_text(CExpr('tid') % cpr)}, {x}r0 = {c_text(CExpr('tid') // cpr)};")
            # The fast path needs whole chunks (see begin()), so a chunk is either read or zero-filled.
            em.line(f"const bool {x}col_ok = {ncol} > 0;")
            # Rows of the tensor left from this thread's first row (the fast path has start >= 0).
            em.line(f"const int64_t {x}rl = {x}dropped_ok && {x}col_ok ? {win.size(win.tile_dims[0])} - ((int64_t)({r_start}) + {x}r0) : 0;")
            em.line(f"const int {x}rows = {x}rl <= 0 ? 0 : ({x}rl >= {lay.rows} ? {lay.rows} : (int){x}rl);")
            em.line(f"const int64_t {x}rstep = (int64_t){rpp} * {row_stride};")
            em.line(f"const {self.ctype}* {x}src = {x}p + {x}k * {per_chunk} + (int64_t){x}r0 * {row_stride};")
            em.line(f"const unsigned {x}dst0 = {x}dst + {c_text(lay.chunk_offset(CExpr(x + 'r0'), CExpr(x + 'k')))};")
            # Rows outside the tensor are zero-filled without reading (the ignore-src operand), so the
            # address needs no clamping and the copy no branch.
            for j in range(passes):
                if lay.rows % rpp and j == passes - 1:
                    em.open(f"if ({x}r0 + {j * rpp} < {lay.rows})")
                if rpp % 8 == 0 or lay.swizzle_bits == 0:
                    dst = f"{x}dst0 + {j * rpp * lay.row_pitch}"  # same swizzle phase on every pass
                else:
                    dst = f"{x}dst + {c_text(lay.chunk_offset(CExpr(f'({x}r0 + {j * rpp})'), CExpr(x + 'k')))}"
                em.line(f"tj_cp_async_16_zfill_if({dst}, {x}src + {j} * {x}rstep, {j * rpp} >= {x}rows, {x}fast);")
                if lay.rows % rpp and j == passes - 1:
                    em.close()
            return
        chunks = lay.rows * cpr
        em.line("#pragma unroll")
        em.open(f"for (int tj_j = 0; tj_j < {-(-chunks // threads)}; ++tj_j)")
        em.line(f"const int tj_c = tid + tj_j * {threads};")
        if chunks % threads:
            em.line(f"if (tj_c >= {chunks}) break;")
        em.line(f"const int tj_r = {c_text(CExpr('tj_c') // cpr)}, {x}k = {c_text(CExpr('tj_c') % cpr)};")
        em.line(f"const int64_t {x}left = {ncol};")
        em.line(f"const int tj_n = ({x}dropped_ok && {win.in_bounds(0, 'tj_r')}) ? {bytes_expr} : 0;")
        em.line(f"const {self.ctype}* tj_src = tj_n > 0 ? {x}p + (int64_t)tj_r * {row_stride} + {x}k * {per_chunk} : {x}p;")
        em.line(f"tj_cp_async_16_if({x}dst + {c_text(lay.chunk_offset(CExpr('tj_r'), CExpr(x + 'k')))}, tj_src, tj_n, {x}fast);")
        em.close()

    def slow(self) -> None:
        """Element-wise copy for windows the fast path cannot take (unaligned rows, negative starts, a non-unit
        inner stride), in line: a rolled loop, small enough that its copies in a pipelined loop's prologue and
        body cost NVRTC little, and no call in the main loop. Neighbouring threads take neighbouring elements of
        the tensor: along a row, or down a column where the window's first dim has the unit stride (a K x N tile
        of ``w.T``), whose reads along a row would be a stride apart each."""
        em, x, win, lay = self.em, self.x, self.win, self.lay
        if self.always_fast:
            return
        rows, cols = win.tile_dims
        r0, c0 = win.starts[rows], win.starts[cols]
        em.open(f"if (({self.guard}) && !{x}fast)")
        elems, threads = lay.rows * lay.cols, em.target.threads
        # A constant trip count: unrolled by 4 without the remainder loop a count that depends on tid needs.
        em.line("#pragma unroll 4")
        em.open(f"for (int tj_j = 0; tj_j < {-(-elems // threads)}; ++tj_j)")
        em.line(f"const int tj_e = tid + tj_j * {threads};")
        if elems % threads:
            em.line(f"if (tj_e >= {elems}) break;")
        if win.unit_first:  # neighbouring threads read neighbouring elements: down a column, not along a row
            em.line(f"const int tj_k = {c_text(CExpr('tj_e') // lay.rows)}, tj_r = {c_text(CExpr('tj_e') % lay.rows)};"
                    "  // column-major window")
        else:
            em.line(f"const int tj_r = {c_text(CExpr('tj_e') // lay.cols)}, tj_k = {c_text(CExpr('tj_e') % lay.cols)};")
        em.line(f"const bool tj_ok = {x}dropped_ok && (uint64_t)((int64_t)({r0}) + tj_r) < (uint64_t){win.size(rows)}"
                f" && (uint64_t)((int64_t)({c0}) + tj_k) < (uint64_t){win.size(cols)};")
        dst_off = c_text(lay.elem_offset(CExpr("tj_r"), CExpr("tj_k")))
        em.line(f"*reinterpret_cast<{self.ctype}*>(tj_smem + ({x}dst - tj_smem_u32) + {dst_off}) = "
                f"tj_ok ? {x}p[(int64_t)(tj_r) * {win.stride(rows)} + (int64_t)(tj_k) * {win.stride(cols)}] : {self.ctype}{{}};")
        em.close()
        em.close()


class InteriorCopy:
    """The prefetch of one pipelined load for windows wholly inside their tensor, with its address math set
    up before the loop.

    Thread ``tid`` copies chunk ``tid % chunks_per_row`` of rows ``tid / chunks_per_row + j * rows_per_pass``
    (as ``SharedCopy.fast``). Before the loop: its source address for the first prefetched window, how far
    the window moves per iteration (each start is the induction variable plus an invariant, or invariant),
    the distance between its passes, its swizzled offset in a slot (``Emitter.hoist``) and the conditions
    that hold for every window (alignment, the invariant dims wholly inside). Per iteration: whether the
    moving dims are inside (``inside``), one cp.async per pass with no bounds or zero fill under that
    uniform predicate (``issue``), then the address moves on (``advance``). Windows that are not wholly
    inside go through ``SharedCopy`` (zero fill, element-wise) instead.
    """

    def __init__(self, em: Emitter, op: Op, first: list[str], coefs: list[int], step: str) -> None:
        self.em, self.op, self.coefs, self.step = em, op, coefs, step
        self.tile = stage_shared(em, op.result)
        self.lay = self.tile.layout
        self.win = Window(em, op, first)
        self.x = em.fresh("tj_i") + "_"
        lay, threads = self.lay, em.target.threads
        self.cpr = lay.row_bytes // 16
        self.rpp = threads // self.cpr if self.cpr and threads % self.cpr == 0 else 0
        self.passes = lay.rows // self.rpp if self.rpp and lay.rows % self.rpp == 0 else 0
        self.shifts: list[int] = []
        if self.passes:
            base = [lay.chunk_offset(t // self.cpr, t % self.cpr) for t in range(threads)]
            for j in range(self.passes):
                at = [lay.chunk_offset(t // self.cpr + j * self.rpp, t % self.cpr) for t in range(threads)]
                shift = {a - b for a, b in zip(at, base)}
                self.shifts.append(shift.pop() if len(shift) == 1 else -1)

    @property
    def fits(self) -> bool:
        """Unit-stride rows of whole 16-byte chunks, a whole number of passes whose slot offsets differ from the
        first pass's by constants, and every dropped dim's start invariant."""
        win, lay = self.win, self.lay
        dropped_fixed = all(self.coefs[d] == 0 for d in win.dropped)
        return (win.unit_last and len(win.tile_dims) == 2 and lay.row_bytes % 16 == 0 and self.passes > 0
                and -1 not in self.shifts and dropped_fixed and all(c in (0, 1) for c in self.coefs))

    def setup(self) -> list[str]:
        """Declare the copy's loop-invariant values; returns the conditions that hold for every window."""
        em, x, win, lay = self.em, self.x, self.win, self.lay
        rows, cols = win.tile_dims
        per_chunk = 16 // lay.elem_bytes
        esize = win.esize
        k, r0 = CExpr("tid") % self.cpr, CExpr("tid") // self.cpr
        em.line(f"// {win.t}: windows wholly inside take {self.passes} plain cp.async per thread; "
                "addresses set up here, moved by a constant per iteration")
        em.line(f"const uint64_t {x}base = (uint64_t)({win.base_expr()});")
        em.line(f"uint64_t {x}src = {x}base + (uint64_t)((int64_t)({c_text(k)}) * {per_chunk} + "
                f"(int64_t)({c_text(r0)}) * {win.stride(rows)}) * {esize};")
        moving = " + ".join(win.stride(d) for d in range(win.rank) if self.coefs[d]) or "0"
        em.line(f"const int64_t {x}inc = (int64_t)({self.step}) * ({moving}) * {esize};")
        for j in range(1, self.passes):
            em.line(f"const int64_t {x}rstep{j} = (int64_t){j * self.rpp} * {win.stride(rows)} * {esize};")
        self.dst0 = em.hoist("unsigned", c_text(lay.chunk_offset(r0, k)))
        # Known at compile time and left out: a base aligned for every iteration's window (then so is the
        # increment between two that run), the row stride, starts >= 0.
        ok = [] if win.base_aligned(16) else [f"{x}base % 16 == 0", f"{x}inc % 16 == 0"]
        if not win.stride_multiple_of(rows, per_chunk):
            ok.append(f"{win.stride(rows)} % {per_chunk} == 0")
        extent = {rows: lay.rows, cols: lay.cols}
        for d in range(win.rank):
            start = f"(int64_t)({win.starts[d]})"
            nonnegative = [] if win.start_nonnegative(d) else [f"{start} >= 0"]
            if d in win.dropped:
                ok.append(f"(uint64_t){start} < (uint64_t){win.size(d)}")
            elif self.coefs[d]:
                ok += nonnegative  # and the start only grows: the step is a positive constant
            else:
                ok.append(" && ".join(nonnegative + [f"{start} + {extent[d]} <= {win.size(d)}"]))
        return ok or ["true"]

    def inside(self, starts: list[str]) -> list[str]:
        """The per-iteration conditions: each moving dim of the window at ``starts`` ends inside the tensor."""
        win, lay = self.win, self.lay
        extent = {win.tile_dims[0]: lay.rows, win.tile_dims[1]: lay.cols}
        return [f"(int64_t)({starts[d]}) <= {win.size(d)} - {extent[d]}" for d in win.tile_dims if self.coefs[d]]

    def issue(self, slot_address: str, pred: str) -> None:
        """The window's cp.async into the slot at ``slot_address`` when ``pred`` (uniform) holds."""
        em, x = self.em, self.x
        n = self.passes
        fn = f"tj_cp_async_16x{n}_if"
        em.require_support(fn, _cp_async_rows(n))
        srcs = [f"(const void*)({x}src)"] + [f"(const void*)({x}src + {x}rstep{j})" for j in range(1, n)]
        em.line(f"{fn}<{', '.join(map(str, self.shifts))}>({slot_address} + {self.dst0}, {', '.join(srcs)}, {pred});")

    def advance(self) -> None:
        self.em.line(f"{self.x}src += {self.x}inc;")


def _cp_async_rows(n: int) -> str:
    """``tj_cp_async_16x<n>_if<O0, ..>(dst, s0, .., pred)``: n 16-byte cp.async, s_j to dst + O_j, under one
    predicate (PTX 9.7.9.25.3); the offsets are immediates."""
    srcs = ", ".join(f"const void* s{j}" for j in range(n))
    copies = " ".join(f"@p cp.async.cg.shared.global [%0+%{n + 2 + j}], [%{1 + j}], 16;" for j in range(n))
    ins = ", ".join(['"r"(dst)'] + [f'"l"(s{j})' for j in range(n)] + ['"r"((int)pred)'] + [f'"n"(O{j})' for j in range(n)])
    return f"""
/// {n} cp.async of 16 bytes, source j to shared address dst + Oj, when pred holds (one predicate for all).
template <{', '.join(f'int O{j}' for j in range(n))}> TJ_DEVICE void tj_cp_async_16x{n}_if(unsigned dst, {srcs}, bool pred) {{
  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{n + 1}, 0; {copies} }}" :: {ins} : "memory");
}}"""


def issue_shared_load(em: Emitter, op: Op, starts: list[str], slot: str, guard: str = "true") -> None:
    """Copy the window of load ``op`` into ``slot`` of its shared ring, both paths in one scope."""
    em.open("")
    copy = SharedCopy(em, op, starts, slot, guard)
    copy.begin()
    copy.fast()
    copy.slow()
    em.close()


# -- layout conversions --------------------------------------------------------------------------

def _linear(coords: list[str], shape: tuple[int, ...]) -> str:
    text = "0"
    for c, n in zip(coords, shape):
        text = f"({text}) * {n} + ({c})"
    return text


def through_scratch(em: Emitter, src: Value, dst_name: str, dst_layout: RegisterLayout, dst_shape) -> None:
    """dst (layout ``dst_layout``) = src, moving data through the shared scratch buffer; size-1 dims of
    ``src`` broadcast."""
    layout: RegisterLayout = src.type.layout
    ctype = c_type(src.dtype)
    em.scratch(src.type.numel * src.dtype.itemsize)
    buf = f"reinterpret_cast<{ctype}*>(tj_scratch)"
    em.barrier("scratch is free")

    def write(i: str) -> None:
        valid = em.valid(layout, i)
        store = f"{buf}[{_linear(em.coords(layout, i), src.type.shape)}] = {em.name(src)}[{i}];"
        em.line(f"if ({valid}) {store}" if valid else store)

    em.reg_loop(layout, write)
    em.barrier()

    def read(i: str) -> None:
        coords = [c if n > 1 else "0" for c, n in zip(em.coords(dst_layout, i), src.type.shape)]
        em.line(f"{dst_name}[{i}] = {buf}[{_linear(coords, src.type.shape)}];")

    em.reg_loop(dst_layout, read)


@emits(OpKind.BROADCAST)
def _broadcast(em: Emitter, op: Op) -> None:
    src, out = op.operands[0], op.result
    if broadcast_view(src.type.layout, out.type.layout):
        em.line(f"auto& {em.name(out)} = {em.name(src)};  // broadcast: same registers")
        return
    name = em.declare_tile(out)
    perm = thread_local_broadcast(src.type.layout, out.type.layout, em.target.threads)
    if perm is not None:  # each thread already holds what it broadcasts (e.g. row statistics of the same rows)
        em.comment(op, "broadcast by register renaming, no shared memory")
        for i, j in enumerate(perm):
            em.line(f"{name}[{i}] = {em.name(src)}[{j}];")
        return
    em.comment(op, "broadcast through shared memory")
    through_scratch(em, src, name, out.type.layout, out.type.shape)


@emits(OpKind.CONVERT_LAYOUT)
def _convert(em: Emitter, op: Op) -> None:
    src, out = op.operands[0], op.result
    if src.type.scope is Scope.SHARED and out.type.scope is Scope.REGISTER:
        tile = em.shared[src.id]
        name = em.declare_tile(out)
        layout = out.type.layout
        ctype = c_type(out.dtype)
        em.comment(op, "read a shared tile into registers")
        em.reg_loop(layout, lambda i: em.line(
            f"{name}[{i}] = *reinterpret_cast<const {ctype}*>({tile.pointer()} + "
            f"{c_text(tile.elem_offset(*[CExpr(c) for c in em.coords(layout, i)]))});"))
        return
    if src.type.scope is Scope.REGISTER and out.type.scope is Scope.SHARED:
        tile = stage_shared(em, out)
        layout = src.type.layout
        ctype = c_type(src.dtype)
        em.comment(op, "write a register tile to shared memory for the tensor cores")
        em.barrier("earlier readers of this buffer are done")

        def write(i: str) -> None:
            valid = em.valid(layout, i)
            off = c_text(tile.elem_offset(*[CExpr(c) for c in em.coords(layout, i)]))
            store = f"*reinterpret_cast<{ctype}*>({tile.byte_origin} + {tile.offset} + {off}) = {em.name(src)}[{i}];"
            em.line(f"if ({valid}) {store}" if valid else store)

        em.reg_loop(layout, write)
        em.line(f"tj_fence_proxy_async(); {em.sync}")
        return
    if src.type.layout == out.type.layout:
        em.line(f"auto& {em.name(out)} = {em.name(src)};")
        return
    perm = thread_local_permutation(src.type.layout, out.type.layout, em.target.threads)
    name = em.declare_tile(out)
    if perm is not None:
        em.comment(op, f"convert layout {src.type.layout} -> {out.type.layout} (registers renamed, no shared memory)")
        for i, j in enumerate(perm):
            em.line(f"{name}[{i}] = {em.name(src)}[{j}];")
        return
    em.comment(op, f"convert layout {src.type.layout} -> {out.type.layout}")
    through_scratch(em, src, name, out.type.layout, out.type.shape)



@emits(OpKind.BOUNDED)
def _bounded(em: Emitter, op: Op) -> None:
    """A bounded view: the same pointer and strides, each extent cut to min(extent, bound) and at least 0; every
    access reads ``<name>_size<d>``, so loads, stores, gathers and atomics through the view honor it."""
    src, out = op.operands[0], op.result
    s, name = em.name(src), em.name(out)
    em.comment(op, f"bounded view of {s}")
    em.line(f"{c_type(src.dtype)}* const {name} = {s};")
    for d, bound in enumerate(op.operands[1:]):
        b = f"(int64_t)({em.name(bound)})"
        em.line(f"const int64_t {name}_size{d} = {b} < 0 ? (int64_t)0 : ({b} < {s}_size{d} ? {b} : {s}_size{d});")
        em.line(f"const int64_t {name}_stride{d} = {s}_stride{d};")
