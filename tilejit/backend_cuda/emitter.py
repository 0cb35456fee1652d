"""CUDA C++ emission: the kernel skeleton, value naming, scalar and elementwise code, control flow.

Register tiles become fixed-size C arrays (``float acc[128]``) walked by fully unrolled loops over the
layout's registers, so NVRTC keeps them in registers. Scalars are plain C variables. Per-op emission
rules are registered by decorator in ``RULES``; memory, gemm and reduction rules live in sibling modules.
"""
from __future__ import annotations

import functools
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable

from .. import dtypes as D, knobs
from ..dtypes import DType
from ..ir import BinaryOp, Block, CompareOp, Function, Op, OpKind, TensorListType, TensorType, UnaryOp, Value
from ..ir.layouts import CExpr, RegisterLayout, SharedLayout, c_text, duplicate_registers
from .headers import header_text, include_directive
from ..passes.warp_specialize import launched_threads
from ..target import Target

C_TYPES = {
    D.float16: "tj_half", D.bfloat16: "tj_bf16", D.float32: "float", D.float64: "double",
    D.float8_e4m3fn: "tj_fp8e4m3", D.float8_e5m2: "tj_fp8e5m2", D.int8: "int8_t", D.int16: "int16_t",
    D.int32: "int32_t", D.int64: "int64_t", D.uint8: "uint8_t", D.bool_: "bool", D.float8_e8m0fnu: "tj_fp8e8m0",
}
# e8m0 is only ever read and converted to float32 (the frontend refuses arithmetic on it and casts to it)
STORAGE = {D.float16, D.bfloat16, D.float8_e4m3fn, D.float8_e5m2, D.float8_e8m0fnu}


def c_type(dtype: DType) -> str:
    return C_TYPES[dtype]


def to_f32(expr: str, dtype: DType) -> str:
    """``expr`` of ``dtype`` as a float (exact for storage types)."""
    if dtype in STORAGE:
        return f"tj_to_f32({expr})"
    if dtype == D.float32:
        return expr
    if dtype.is_bool:
        return f"(({expr}) ? 1.0f : 0.0f)"
    return f"(float)({expr})"


def convert(expr: str, src: DType, dst: DType) -> str:
    """The C expression converting ``expr`` from ``src`` to ``dst`` with the language's cast rules."""
    if src == dst:
        return expr
    if dst.is_bool:
        return f"({to_f32(expr, src) if src in STORAGE else expr} != 0)"
    if dst in STORAGE:
        return f"tj_from_f32<{c_type(dst)}>({to_f32(expr, src) if src != D.float64 else f'(float)({expr})'})"
    if src.is_floating and dst.is_integer and dst.bits < 32:
        # through int32 (cvt.rzi.s32: toward zero, saturating, NaN to 0), then clamped to the narrow range: C++
        # leaves an out-of-range float to int8 undefined, and NVRTC's code wrapped (300.0 became 44)
        lo, hi = (0, (1 << dst.bits) - 1) if dst.kind == "uint" else (-(1 << dst.bits - 1), (1 << dst.bits - 1) - 1)
        wide = f"(int32_t)({to_f32(expr, src) if src in STORAGE else expr})"
        return f"({c_type(dst)})tj_imin<int32_t>(tj_imax<int32_t>({wide}, {lo}), {hi})"
    if src in STORAGE:
        return f"({c_type(dst)})tj_to_f32({expr})" if dst != D.float32 else f"tj_to_f32({expr})"
    if src.is_bool:
        return f"(({expr}) ? ({c_type(dst)})1 : ({c_type(dst)})0)"
    return f"({c_type(dst)})({expr})"


def compute_dtype(dtype: DType) -> DType:
    """The dtype arithmetic is carried out in: storage floats compute in f32 and round per op."""
    return D.float32 if dtype in STORAGE else dtype


_BIN_C = {BinaryOp.ADD: "+", BinaryOp.SUB: "-", BinaryOp.MUL: "*", BinaryOp.TRUEDIV: "/", BinaryOp.AND: "&",
          BinaryOp.OR: "|", BinaryOp.XOR: "^", BinaryOp.SHL: "<<", BinaryOp.SHR: ">>"}
_CMP_C = {CompareOp.LT: "<", CompareOp.LE: "<=", CompareOp.GT: ">", CompareOp.GE: ">=", CompareOp.EQ: "==",
          CompareOp.NE: "!="}


def binary_expr(op: BinaryOp, a: str, b: str, dtype: DType) -> str:
    """``a op b`` for operands of ``dtype``; the result has ``dtype``."""
    cd = compute_dtype(dtype)
    x, y = (to_f32(a, dtype), to_f32(b, dtype)) if dtype in STORAGE else (a, b)
    if dtype.is_bool and op in (BinaryOp.AND, BinaryOp.OR, BinaryOp.XOR):
        text = f"({x} {'&&' if op is BinaryOp.AND else '||' if op is BinaryOp.OR else '!='} {y})"
    elif op is BinaryOp.FLOORDIV:
        text = f"tj_floordiv<{c_type(cd)}>({x}, {y})"
    elif op is BinaryOp.MOD:
        text = f"tj_pymod<{c_type(cd)}>({x}, {y})"
    elif op in (BinaryOp.MIN, BinaryOp.MAX):
        if cd == D.float32:
            text = f"tj_{'max' if op is BinaryOp.MAX else 'min'}({x}, {y})"
        else:
            text = f"tj_i{'max' if op is BinaryOp.MAX else 'min'}<{c_type(cd)}>({x}, {y})"
    else:
        text = f"({x} {_BIN_C[op]} {y})"
        if cd.is_integer and cd.bits < 32:
            text = f"({c_type(cd)}){text}"
    return convert(text, cd, dtype) if dtype in STORAGE else text


def unary_expr(op: UnaryOp, a: str, dtype: DType) -> str:
    cd = compute_dtype(dtype)
    x = to_f32(a, dtype) if dtype in STORAGE else a
    if op is UnaryOp.NEG:
        text = f"(-{x})"
    elif op is UnaryOp.NOT:
        text = f"(!{x})" if dtype.is_bool else f"(~{x})"
    elif op is UnaryOp.ABS:
        text = f"tj_abs({x})" if cd == D.float32 else (f"fabs({x})" if cd == D.float64 else f"({x} < 0 ? -{x} : {x})")
    else:
        fname = op.value  # exp, exp2, log, sqrt, rsqrt, log2, sin, cos, tanh, erf, sigmoid
        text = f"tj_{fname}({x})" if cd == D.float32 or op is UnaryOp.SIGMOID else f"{fname}({x})"
    if cd.is_integer and cd.bits < 32:
        text = f"({c_type(cd)}){text}"
    return convert(text, cd, dtype) if dtype in STORAGE else text


def compare_expr(op: CompareOp, a: str, b: str, dtype: DType) -> str:
    if dtype in STORAGE:
        a, b = to_f32(a, dtype), to_f32(b, dtype)
    return f"({a} {_CMP_C[op]} {b})"


#: The shared-memory origins offsets count from: a 32-bit shared address and the same place as a byte pointer
#: (the block's dynamic shared memory, and a pingpong group's own region of it).
BYTE_ORIGINS = {"tj_smem_u32": "tj_smem", "tj_gsm_u32": "tj_gsm"}


@dataclass
class SharedTile:
    """Where a shared tile lives: byte offset of its ring from ``origin``, its layout, and the slot currently read."""
    offset: int
    layout: SharedLayout
    slot: str = "0"
    address: str | None = None  # a variable holding the slot's address, when a loop keeps one
    origin: str = "tj_smem_u32"  # the 32-bit shared address offsets count from (a pingpong group's: tj_gsm_u32)

    def base(self) -> str:
        """32-bit shared address of the slot being read."""
        if self.address is not None:
            return self.address
        slot = "" if self.slot == "0" else f" + ({self.slot}) * {self.layout.stage_bytes}"
        return f"({self.origin} + {self.offset}{slot})"

    @property
    def byte_origin(self) -> str:
        """The byte pointer ``offset`` counts from (``origin`` as a generic pointer)."""
        return BYTE_ORIGINS[self.origin]

    def pointer(self) -> str:
        """Generic (byte) pointer to the slot being read, for ordinary loads and stores."""
        return f"(tj_smem + ({self.base()} - tj_smem_u32))"

    def elem_offset(self, row: Any, col: Any) -> Any:
        """Byte offset of element (row, col) inside one stage."""
        return self.layout.elem_offset(row, col)


RULES: dict[OpKind, Callable[["Emitter", Op], None]] = {}


def emits(*kinds: OpKind):
    def register(fn):
        @functools.wraps(fn)
        def rule(em: "Emitter", op: Op) -> None:
            # the op being emitted, whoever calls its rule (nested loops call RULES directly): scratch() notes it
            outer, em.emitting = em.emitting, op
            try:
                fn(em, op)
            finally:
                em.emitting = outer
        for k in kinds:
            RULES[k] = rule
        return fn
    return register


#: Whole-kernel set-up a lowering needs (e.g. tensor memory allocated at the start and given back at the end):
#: each hook is called with the emitter before the body is emitted and may return a function that emits the
#: matching tear-down after it.
KERNEL_HOOKS: list[Callable[["Emitter"], Callable[[], None] | None]] = []


def _require_e8m0(em: "Emitter") -> None:
    """The e8m0 storage type and conversion, for a kernel with e8m0 tensors or values."""
    values = [p.value for p in em.fn.params if p.value is not None] + [r for op in em.fn.walk() for r in op.results]
    if any(getattr(v.type, "dtype", None) == D.float8_e8m0fnu for v in values):
        em.require_header("e8m0")


KERNEL_HOOKS.append(_require_e8m0)

@dataclass
class AsyncMma:
    """A pipelined loop whose ring tiles only asynchronous MMAs read (``lower_loops``; wgmma or tcgen05).

    The MMAs of iteration ``k`` stay in flight while iteration ``k + 1`` issues its own. After the last of
    ``gemms``, wgmma waits until only this iteration's groups are pending (each warp then releases iteration
    ``k - 1``'s slot), tcgen05 commits the iteration's MMAs to ``empty`` (which releases the slot when they
    complete); both then call ``release``, which refills the slot. Each gemm accumulates in place: into its
    loop-carried registers (wgmma) or its tensor-memory columns (tcgen05).
    """
    gemms: list[Op]
    release: Callable[[], None]
    empty: str = ""  # C expression of the slot's "empty" mbarrier (an MMA commit may arrive on it)
    settle: bool = True  # False: the last gemm neither waits nor releases (a deferred gemm: lower_loops waits)

    def owns(self, op: Op) -> bool:
        return any(g is op for g in self.gemms)


class Emitter:
    """The emission of one kernel: its lines, names, shared memory and the state that lowerings share.

    ``specialized_body`` emits the body of a kernel whose warp-specialized loop is set up at its start
    (``fn.attrs["persistent"]`` or ``["producer_first"]``): ``lower_specialized.emit_specialized``, given by
    ``stages.emit_cuda`` (that module builds on the ``for`` rule, so the emitter cannot import it)."""

    def __init__(self, fn: Function, target: Target, kernel_name: str,
                 specialized_body: Callable[["Emitter"], None] | None = None,
                 register_grant: int | None = None) -> None:
        self.fn = fn
        # registers per math thread a warp-specialized kernel's setmaxnreg asks for (None: lower_specialized's
        # default), and the grant it emitted (None while it has emitted none)
        self.register_grant = register_grant
        self.granted: int | None = None
        self.specialized_body = specialized_body
        self.target = target
        self.kernel_name = kernel_name
        self.lines: list[str] = []
        self.depth = 1
        self.names: dict[int, str] = {}
        self.used_names: set[str] = set()
        self.shared: dict[int, SharedTile] = {}
        self.smem_top = 0
        self.smem_peak = 0  # the most shared memory any point of the kernel holds (loops give theirs back)
        self.scratch_bytes = 0
        # the op being emitted, and the one that asked for the most scratch (a SharedMemoryError points at it)
        self.emitting: Op | None = None
        self.scratch_op: Op | None = None
        # a stream-K kernel's workspace, per program (lower_split_k): 4-byte words of its slot, and its flags
        self.stream_k_words = self.stream_k_flags = 0
        self.scratch_users: list[Callable[[int], None]] = []
        # work an enclosing loop wants issued while the tensor cores run a gemm (taken by the first gemm); it may
        # return how many wgmma groups it issued that may stay pending behind the gemm's (a deferred gemm)
        self.overlap_hook: Callable[[], int | None] | None = None
        self.packed_a: dict[int, str] = {}  # register A tiles already packed into 32-bit words (id -> array name)
        self.async_mma: AsyncMma | None = None  # set by a pipelined loop whose gemms stay in flight
        self.fragment_carry = None  # set by a pipelined loop for its mma.sync gemm (lower_loops.FragmentCarry)
        self.tmem_offsets: dict[int, int] = {}  # first TMEM column of each tcgen05 gemm (by id of the op)
        self.support: dict[str, str] = {}  # extra device helpers a lowering needs, emitted once
        self.tensor_maps: list[Any] = []   # CUtensorMap parameters (lower_tma.TensorMapSpec), after the others
        self.functions: dict[tuple[str, str], str] = {}  # (parameters, body) -> name of a device_function
        self.hoisted: dict[tuple[str, Any], str] = {}  # (C type, key) -> name of a value set up once (hoist)
        self.hoisted_exprs: dict[str, tuple[str, str]] = {}  # its name -> (C type, expression)
        self.counter = 0
        self.split_at: int | None = None  # index in lines where a producer warpgroup left (consumers_only)
        # a persistent kernel emits its warp-specialized loop in two parts (lower_specialized.emit_specialized): the
        # ring and the producer ("prelude") before the walk over the programs, the math ("consumer") inside it
        self.ring_phase: str | None = None
        self.rings: dict[int, Any] = {}       # id of the loop op -> what its prelude set up, for its consumer
        self.per_program: Callable[[], None] | None = None  # emits a program's ids and what precedes the loop
        self.store_reads_pending = False  # a persistent walk's TMA stores wait for their reads at its end
        self.carried_loads: dict[int, Any] = {}  # a loop's loads with pointers set up before it (carried_loads)
        # TMA bulk reductions (lower_tma.emit_store) were issued: the kernel's end waits for them to complete; and
        # issued in the loop being emitted, nothing has waited for their reads of its staging since (lower_loops)
        self.bulk_reduced = self.bulk_reads_pending = False
        # T.program_id(0) reads the other program of a cluster pair (lower_specialized._pair_flags)
        self.partner_x = False
        # a pingpong kernel's groups of math warps (passes/warp_specialize.specialize_warps): while ``grouped``, shared
        # memory is allocated in the region each group has a copy of (from ``tj_gsm_u32``), ``group_bytes`` long
        self.groups = int(fn.attrs.get("groups", 1))
        self.grouped = False
        self.group_bytes = 0
        self._block_smem = (0, 0)

    # -- naming and output ----------------------------------------------------------------
    def name(self, v: Value) -> str:
        if v.id not in self.names:
            hint = re.sub(r"\W", "_", ascii_identifier(v.name or ""))
            base = f"v{len(self.names)}" + (f"_{hint}" if hint else "")
            self.names[v.id] = base
        return self.names[v.id]

    def alias(self, v: Value, text: str) -> None:
        self.names[v.id] = text

    def tensor_map_param(self, spec: Any) -> str:
        """The name of the ``__grid_constant__ CUtensorMap`` parameter for ``spec`` (added once)."""
        if spec not in self.tensor_maps:
            self.tensor_maps.append(spec)
        return f"tj_tmap{self.tensor_maps.index(spec)}"

    def require_support(self, name: str, text: str) -> None:
        """Emit ``text`` (a device helper generated for this kernel) once, ahead of the kernel, under ``name``."""
        self.support.setdefault(name, text)

    def require_header(self, name: str) -> None:
        """Include tilejit's header ``tilejit/<name>.cuh`` (backend_cuda/headers.py) once, ahead of the kernel, in
        the order helpers are first required."""
        header_text(name)  # a KeyError here, naming the headers there are, rather than NVRTC's "cannot open"
        self.support.setdefault(name, include_directive(name))

    def device_function(self, base: str, params: str, body: Callable[[], None]) -> str:
        """The name of a ``__noinline__`` device function taking ``params`` whose body is what ``body`` emits,
        defined ahead of the kernel once per distinct text: NVRTC compiles it once however many sites call
        it, where an inlined copy per site multiplies the compile time of bulky cold paths."""
        lines, depth = self.lines, self.depth
        self.lines, self.depth = [], 1
        try:
            body()
            text = "\n".join(self.lines)
        finally:
            self.lines, self.depth = lines, depth
        name = self.functions.get((params, text))
        if name is None:
            name = self.functions[(params, text)] = f"{base}{len(self.functions)}"
            self.require_support(name, f"static __device__ __noinline__ void {name}({params}) {{\n{text}\n}}\n")
        return name

    def hoist(self, ctype: str, expr: str, key: Any = None, base: str = "tj_h") -> str:
        """The name of a ``ctype`` constant computed once, at the kernel's start, from ``expr`` (which reads
        ``tid`` and the kernel's parameters only: a lane's share of an address, for example); equal
        expressions (or equal ``key``s, when given) share one. A main loop adds it to a base that moves instead of recomputing it each
        iteration; an opaque move keeps the compiler from recomputing it inside the loop from ``tid``."""
        self.require_header("opaque")
        key = (ctype, expr if key is None else key)
        name = self.hoisted.get(key)
        if name is None:
            name = self.hoisted[key] = f"{base}{len(self.hoisted)}"
            self.hoisted_exprs[name] = (ctype, expr)
        return name

    def consumers_only(self) -> None:
        """From here on only the math warps run (a warp-specialized loop's producer warpgroup has left): the
        block-wide barriers emitted after this point count those warps alone (named barrier 1), or, in a pingpong
        kernel, the ``num_warps`` warps of the thread's group (named barrier 1 + ``tj_group``)."""
        self.split_at = len(self.lines)

    @property
    def sync(self) -> str:
        """The block-wide barrier as a C statement: ``__syncthreads();``, or, once the producer warpgroup has left
        (``consumers_only``), a named barrier over the math warps (of the thread's group)."""
        if self.split_at is None:
            return "__syncthreads();"
        if self.groups > 1:
            return f'asm volatile("bar.sync %0, {self.target.threads};" :: "r"(1 + tj_group) : "memory");'
        return f'asm volatile("bar.sync 1, {self.target.threads};" ::: "memory");'

    @property
    def leader(self) -> str:
        """The condition that picks one thread of the block (``tid`` counts within a pingpong group)."""
        return "threadIdx.x == 0" if self.groups > 1 else "tid == 0"

    def group_shared(self, on: bool) -> None:
        """Start (or end) allocating shared memory per group of a pingpong kernel's math warps: each group's tiles
        at the same offsets from its own ``tj_gsm_u32``."""
        if self.groups == 1 or on == self.grouped:
            return
        if on:
            self._block_smem = (self.smem_top, self.smem_peak)
            self.smem_top = self.smem_peak = self.group_bytes
        else:
            self.group_bytes = -(-max(self.smem_top, self.smem_peak) // 1024) * 1024
            self.smem_top, self.smem_peak = self._block_smem
        self.grouped = on

    @property
    def smem_origin(self) -> str:
        """The 32-bit shared address ``allocate_shared``'s offsets count from now."""
        return "tj_gsm_u32" if self.grouped else "tj_smem_u32"

    def barrier(self, why: str = "") -> None:
        """Emit the block-wide barrier (``sync``), with ``why`` as its comment."""
        self.line(self.sync + (f"  // {why}" if why else ""))

    def take_overlap_hook(self) -> Callable[[], int | None] | None:
        """Work an enclosing loop wants emitted where it can overlap tensor-core math (taken once)."""
        hook, self.overlap_hook = self.overlap_hook, None
        return hook

    def run_overlap_hook(self) -> int | None:
        """Emit that work here, if there is any (taken once); what the hook returns (a deferred gemm's pending
        wgmma groups), else None."""
        hook = self.take_overlap_hook()
        return hook() if hook is not None else None

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}{self.counter}"

    def line(self, text: str = "") -> None:
        self.lines.append("  " * self.depth + text if text else "")

    def open(self, text: str) -> None:
        self.line(text + " {")
        self.depth += 1

    def close(self, text: str = "}") -> None:
        self.depth -= 1
        self.line(text)

    def comment(self, op: Op, what: str) -> None:
        where = f" ({op.loc.filename.rsplit('/', 1)[-1]}:{op.loc.lineno})" if op.loc else ""
        self.line(f"// {what}{where}")

    # -- types -----------------------------------------------------------------------------
    def layout(self, v: Value) -> RegisterLayout:
        return v.type.layout

    def declare_tile(self, v: Value) -> str:
        """``T name[R];`` for a register tile; returns the name."""
        name = self.name(v)
        self.line(f"alignas(16) {c_type(v.dtype)} {name}[{self.layout(v).regs}];")
        return name

    def reg_loop(self, layout: RegisterLayout, body: Callable[[str], None], var: str = "i") -> None:
        """A fully unrolled loop over the registers of ``layout`` (``var`` is the register index)."""
        self.line("#pragma unroll")
        self.open(f"for (int {var} = 0; {var} < {layout.regs}; ++{var})")
        body(var)
        self.close()

    def coords(self, layout: RegisterLayout, i: str) -> list[str]:
        return [c_text(c) for c in layout.coords(CExpr("tid"), CExpr(i))]

    def valid(self, layout: RegisterLayout, i: str) -> str | None:
        cond = layout.valid(CExpr("tid"), CExpr(i))
        return None if cond is True else c_text(cond)

    # -- shared memory ---------------------------------------------------------------------
    def allocate_shared(self, nbytes: int, align: int = 128) -> int:
        """The offset of ``nbytes`` of shared memory from ``smem_origin``."""
        offset = -(-self.smem_top // align) * align
        self.smem_top = offset + nbytes
        return offset

    def scratch(self, nbytes: int) -> str:
        """A shared scratch buffer reused by every layout conversion and reduction (after the tiles)."""
        if nbytes > self.scratch_bytes:
            self.scratch_bytes, self.scratch_op = nbytes, self.emitting
        return "tj_scratch"

    # -- driving -------------------------------------------------------------------------------
    def emit_block(self, block: Block) -> None:
        self.emit_ops(block.ops)

    def emit_ops(self, ops: list[Op]) -> None:
        for op in ops:
            rule = RULES.get(op.kind)
            if rule is None:
                raise NotImplementedError(f"no CUDA emission rule for tj.{op.kind.mnemonic}")
            rule(self, op)

    def params(self) -> tuple[list[str], list[str]]:
        """C parameter declarations and launcher kinds, in argument order."""
        decls, kinds = [], []
        for p in self.fn.params:
            if p.kind == "constexpr":
                continue
            v = p.value
            if isinstance(v.type, TensorType):
                name = self.name(v)
                decls.append(f"{c_type(v.dtype)}* {name}")
                kinds.append("ptr")
                for what in ("size", "stride"):
                    for d in range(v.type.rank):
                        decls.append(f"int64_t {name}_{what}{d}")
                        kinds.append("i64")
            elif isinstance(v.type, TensorListType):  # its device table (lower_lists.py) and its length
                name = self.name(v)
                decls += [f"const int64_t* __restrict__ {name}_table", f"int64_t {name}_len"]
                kinds += ["ptr", "i64"]
            else:
                dtype = v.dtype
                ctype = "int32_t" if dtype.is_bool else c_type(dtype)
                decls.append(f"{ctype} {self.name(v)}")
                kinds.append({"int32_t": "i32", "int64_t": "i64", "float": "f32"}[ctype])
        return decls, kinds

    def _thread_index(self) -> list[str]:
        """``tid``: the thread's index in the block, or in its group of math warps in a pingpong kernel (whose
        producer warpgroup, after the groups, keeps its index in the block)."""
        if self.groups == 1:
            return ["  const int tid = (int)threadIdx.x;"]
        math = self.groups * self.target.threads
        # read through a shuffle from lane 0, so the compiler knows it is the same in the whole warp: the ring's
        # count and the slot addresses derived from it stay in uniform registers (wgmma descriptors)
        return [f"  const int tj_group = __shfl_sync(0xffffffffu, (int)threadIdx.x < {math} ? "
                f"(int)threadIdx.x / {self.target.threads} : 0, 0);  // pingpong: the thread's group of math warps",
                f"  const int tid = (int)threadIdx.x - tj_group * {self.target.threads};"]

    def generate(self) -> tuple[str, list[str], int]:
        decls, kinds = self.params()
        if self.fn.attrs.get("stream_k"):  # the grid it stands for, and its workspace (runtime/launch.StreamKLauncher)
            decls += ["int32_t tj_grid0", "int32_t tj_grid1", "int32_t tj_grid2", "unsigned* __restrict__ tj_sk_ws",
                      "unsigned* tj_sk_flags", "int32_t tj_sk_epoch"]
            kinds += ["i32", "i32", "i32", "ptr", "ptr", "i32"]
        finish = [f for f in (hook(self) for hook in KERNEL_HOOKS) if f is not None]
        if self.fn.attrs.get("persistent") or self.fn.attrs.get("producer_first"):
            assert self.specialized_body is not None, "a warp-specialized kernel's body needs specialized_body"
            self.specialized_body(self)
        else:
            self.emit_block(self.fn.body)
        for f in reversed(finish):
            f()
        for n, _ in enumerate(self.tensor_maps):  # encoded by the host per launch, passed by value
            decls.append(f"const __grid_constant__ CUtensorMap tj_tmap{n}")
            kinds.append("tmap")
        body = self.lines
        # a warp-specialized loop's producer warpgroup (passes/warp_specialize.specialize_warps) is launched beyond the
        # num_warps warps (each group's, pingpong); the compiler's meta counts them the same way
        launched = launched_threads(self.fn, self.target)
        self.smem_top = max(self.smem_top, self.smem_peak)
        groups_offset = self.allocate_shared(self.groups * self.group_bytes, 1024) if self.group_bytes else 0
        scratch = -(-self.scratch_bytes // 16) * 16
        scratch_offset = self.allocate_shared(self.groups * scratch, 16) if scratch else 0
        shared_bytes = self.smem_top
        splits = self.fn.attrs.get("split_k", 1)
        cluster = f" __cluster_dims__(1, 1, {splits})" if splits > 1 else ""
        bounds = f"{launched}, 1" if self.split_at is not None else f"{launched}"
        head = [
            f'extern "C" __global__ void __launch_bounds__({bounds}){cluster} {self.kernel_name}(',
            "    " + ",\n    ".join(decls) + ") {" if decls else ") {",
            "  extern __shared__ __align__(1024) unsigned char tj_smem[];",
            *self._thread_index(),
            "  const unsigned tj_smem_u32 = tj_smem_addr(tj_smem);",
            f"  unsigned char* const tj_scratch = tj_smem + {scratch_offset}"
            + (f" + tj_group * {scratch};" if self.groups > 1 else ";"),
            "  (void)tj_smem_u32; (void)tj_scratch;",
        ]
        if self.fn.attrs.get("cluster"):  # a TMA multicast pair (tilejit/cluster_ring.cuh)
            head += ["  const unsigned tj_ncta = tj_cluster_ctas(), tj_crank = tj_cluster_rank();  // 1 and 0 without a "
                     "cluster"]
        if self.group_bytes:
            head += [f"  unsigned char* const tj_gsm = tj_smem + {groups_offset} + tj_group * {self.group_bytes};"
                     "  // this group's shared memory",
                     "  const unsigned tj_gsm_u32 = tj_smem_addr(tj_gsm);"]
        setup = [f"  const {ctype} {name} = tj_opaque(({ctype})({expr}));"
                 for name, (ctype, expr) in self.hoisted_exprs.items()]
        helpers = include_directive("prelude") + include_directive("support") + "".join(self.support.values())
        source = helpers + "\n" + "\n".join(head + setup + body + ["}"]) + "\n"
        return source, kinds, shared_bytes


# -- names -----------------------------------------------------------------------------------------

def ascii_identifier(name: str) -> str:
    """``name`` with every non-ASCII character spelled ``_<hex code point>_`` and ``_`` doubled, so distinct
    names stay distinct; an ASCII name is returned as it is. NVRTC takes ASCII identifiers only."""
    if name.isascii():
        return name
    return "".join(c if c.isascii() and c != "_" else "__" if c == "_" else f"_{ord(c):x}_" for c in name)


def kernel_symbol(name: str) -> str:
    """The entry point of kernel ``name`` in the cubin: ``tj_<name>``, or ``tju_<ascii_identifier(name)>`` for a
    name with non-ASCII characters (the prefixes differ, so no ASCII name can take a mangled name's symbol)."""
    return f"tj_{name}" if name.isascii() else f"tju_{ascii_identifier(name)}"


# -- scalars and elementwise ops --------------------------------------------------------------------

_FLOAT32_MIN_NORMAL = 2.0 ** -126


def float_literal(value: float, is_double: bool) -> str:
    """A C literal of ``value`` rounded to float (or double when ``is_double``) as the interpreter rounds it.

    Values in float's normal range keep their shortest decimal form (``0.5f``); one that rounds to infinity, to a
    subnormal or to zero is written by its bits, since NVRTC refuses a decimal constant out of float's range.
    Doubles (Python floats are doubles) keep their decimal form, infinities and NaN aside."""
    if math.isnan(value):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    if is_double:
        return repr(value)
    try:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
    except OverflowError:  # rounds past float's largest finite value
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    rounded = struct.unpack("<f", struct.pack("<I", bits))[0]
    if value != 0.0 and abs(rounded) < _FLOAT32_MIN_NORMAL:
        return f"__int_as_float(0x{bits:08x})"
    return f"{value!r}f"


def scalar_expr(em: Emitter, op: Op, args: list[str]) -> str:
    """The C expression of a scalar op given its operands' C expressions."""
    if op.kind is OpKind.CONSTANT:
        value, dtype = op.attrs.value, op.result.dtype
        if dtype.is_bool:
            return "true" if value else "false"
        if dtype.is_floating:
            text = float_literal(float(value), dtype == D.float64)
            return convert(text, D.float32, dtype) if dtype in STORAGE else text
        suffix = "LL" if dtype.bits == 64 else ""
        return f"({c_type(dtype)}){value}{suffix}"
    if op.kind in (OpKind.PROGRAM_ID, OpKind.NUM_PROGRAMS):
        builtin = f"{'blockIdx' if op.kind is OpKind.PROGRAM_ID else 'gridDim'}.{'xyz'[op.attrs.axis]}"
        if op.kind is OpKind.NUM_PROGRAMS and em.fn.attrs.get("stream_k"):
            return f"tj_grid{op.attrs.axis}"  # launched one program per SM: the user's grid is a parameter
        if op.kind is OpKind.PROGRAM_ID and em.fn.attrs.get("persistent"):
            return f"tj_pid{op.attrs.axis}"  # the program this persistent one is running now (emit_specialized)
        if op.kind is OpKind.PROGRAM_ID and op.attrs.axis == 0 and em.partner_x:
            return "(int32_t)(blockIdx.x ^ 1u)"  # the cluster pair's other program
        splits = em.fn.attrs.get("split_k", 1)
        if op.attrs.axis == 2 and splits > 1:  # z holds the user's programs times the split-K cluster
            return f"(int32_t)({builtin} / {splits}u)"
        return f"(int32_t){builtin}"
    if op.kind is OpKind.TENSOR_DIM:
        return f"{args[0]}_size{op.attrs.axis}"
    if op.kind is OpKind.TENSOR_STRIDE:
        return f"{args[0]}_stride{op.attrs.axis}"
    if op.kind is OpKind.BINARY:
        return binary_expr(op.attrs.op, args[0], args[1], op.operands[0].dtype)
    if op.kind is OpKind.UNARY:
        return unary_expr(op.attrs.op, args[0], op.operands[0].dtype)
    if op.kind is OpKind.COMPARE:
        return compare_expr(op.attrs.op, args[0], args[1], op.operands[0].dtype)
    if op.kind is OpKind.SELECT:
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if op.kind is OpKind.CAST:
        return convert(args[0], op.operands[0].dtype, op.attrs.dtype)
    if op.kind is OpKind.FMA:
        dtype = op.operands[0].dtype
        if dtype == D.float64:
            return f"fma({args[0]}, {args[1]}, {args[2]})"
        text = f"fmaf({', '.join(to_f32(a, dtype) for a in args)})"
        return convert(text, D.float32, dtype) if dtype in STORAGE else text
    raise NotImplementedError(op.kind)


@emits(OpKind.CONSTANT, OpKind.PROGRAM_ID, OpKind.NUM_PROGRAMS, OpKind.TENSOR_DIM, OpKind.TENSOR_STRIDE)
def _scalar_leaf(em: Emitter, op: Op) -> None:
    em.line(f"const {c_type(op.result.dtype)} {em.name(op.result)} = "
            f"{scalar_expr(em, op, [em.name(v) for v in op.operands])};")


@emits(OpKind.BINARY, OpKind.UNARY, OpKind.COMPARE, OpKind.SELECT, OpKind.CAST, OpKind.FMA)
def _elementwise(em: Emitter, op: Op) -> None:
    out = op.result
    if out.is_scalar:
        em.line(f"const {c_type(out.dtype)} {em.name(out)} = "
                f"{scalar_expr(em, op, [em.name(v) for v in op.operands])};")
        return
    name = em.declare_tile(out)
    layout = em.layout(out)

    def compute(i: Any) -> None:
        em.line(f"{name}[{i}] = {scalar_expr(em, op, [f'{em.name(v)}[{i}]' for v in op.operands])};")

    owner = duplicate_registers(layout, em.target.threads)
    if owner is None and _pairs_to_16_bit(op) and layout.regs % 2 == 0:
        # float32 -> fp16/bf16 two registers at a time (tj_from_f32x2: one packed cvt, the same rounding)
        src = em.name(op.operands[0])
        em.line("#pragma unroll")
        em.open(f"for (int i = 0; i < {layout.regs}; i += 2)")
        em.line(f"tj_from_f32x2<{c_type(out.dtype)}>({src}[i], {src}[i + 1], &{name}[i]);")
        em.close()
        return
    if owner is None:
        em.reg_loop(layout, compute)
        return
    # Registers that repeat another's element (a row statistic in an accumulator's slice layout): computed
    # once, copied to the rest, so a value carried around a loop keeps one live copy per element.
    for i in sorted(set(owner)):
        compute(i)
    for i, j in enumerate(owner):
        if i != j:
            em.line(f"{name}[{i}] = {name}[{j}];")


def _pairs_to_16_bit(op: Op) -> bool:
    """Whether ``op`` casts float32 to float16 or bfloat16 (converted in pairs by one packed instruction)."""
    return (op.kind is OpKind.CAST and op.operands[0].dtype == D.float32
            and op.attrs.dtype in (D.float16, D.bfloat16) and knobs.paired_casts())


@emits(OpKind.SPLAT)
def _splat(em: Emitter, op: Op) -> None:
    name = em.declare_tile(op.result)
    src = em.name(op.operands[0])
    em.reg_loop(em.layout(op.result), lambda i: em.line(f"{name}[{i}] = {src};"))


@emits(OpKind.ARANGE)
def _arange(em: Emitter, op: Op) -> None:
    name = em.declare_tile(op.result)
    layout = em.layout(op.result)
    em.reg_loop(layout, lambda i: em.line(f"{name}[{i}] = (int32_t)({em.coords(layout, i)[0]} + {op.attrs.start});"))


@emits(OpKind.EXPAND_DIMS, OpKind.TRANSPOSE)
def _view(em: Emitter, op: Op) -> None:
    # Expand/permuted layouts index the same registers as their source: the tile is the same array.
    em.line(f"auto& {em.name(op.result)} = {em.name(op.operands[0])};")


# -- control flow -------------------------------------------------------------------------------

def assign_value(em: Emitter, dst: str, v: Value) -> None:
    """``dst = v`` for a scalar or register tile already declared as ``dst``."""
    src = em.name(v)
    if src == dst:
        return
    if v.is_tile:
        em.reg_loop(v.type.layout, lambda i: em.line(f"{dst}[{i}] = {src}[{i}];"))
    else:
        em.line(f"{dst} = {src};")


def declare_var(em: Emitter, v: Value) -> str:
    if v.is_tile:
        return em.declare_tile(v)
    name = em.name(v)
    em.line(f"{c_type(v.dtype)} {name};")
    return name


def is_positive_constant(v: Value) -> bool:
    """Whether scalar ``v`` is a constant above 0 (a loop step whose sign the loop's test need not look at)."""
    op = v.owner
    return isinstance(op, Op) and op.kind is OpKind.CONSTANT and op.attrs.value > 0


def in_range(x: str, hi: str, step: str, positive: bool) -> str:
    """Whether induction value ``x`` is still inside a loop to ``hi`` by ``step`` (of either sign, unless
    ``positive``)."""
    return f"({x} < {hi})" if positive else f"(({step}) > 0 ? {x} < {hi} : {x} > {hi})"


@emits(OpKind.IF)
def _if(em: Emitter, op: Op) -> None:
    # An enclosing loop's prefetch must run on every iteration: a gemm inside a branch may not take it.
    outer_hook, em.overlap_hook = em.overlap_hook, None
    results = [declare_var(em, r) for r in op.results]
    em.open(f"if ({em.name(op.operands[0])})")
    _branch(em, op.regions[0], results)
    if len(op.regions) > 1 and op.regions[1].ops:
        em.close("} else {")
        em.depth += 1
        _branch(em, op.regions[1], results)
    em.close()
    em.overlap_hook = outer_hook


def _branch(em: Emitter, block: Block, results: list[str]) -> None:
    body = block.ops[:-1] if block.terminator is not None else block.ops
    for op in body:
        RULES[op.kind](em, op)
    if block.terminator is not None:
        for dst, v in zip(results, block.terminator.operands):
            assign_value(em, dst, v)


@emits(OpKind.YIELD)
def _yield(em: Emitter, op: Op) -> None:
    raise AssertionError("yield is emitted by its parent op")
