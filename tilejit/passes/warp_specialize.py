"""Warp specialization of wgmma main loops: a producer warpgroup issues the ring's TMA loads while the launch's
warps do the math (``specialize_warps``), and the forms built on it: a persistent walk over the grid's programs,
pingpong groups of math warps, cluster pairs that multicast shared tiles, stream-K, and the deferred gemm
(``deferred_gemm``). It runs after ``software_pipeline.mark_async_mma``, whose marks it reads; the CUDA backend
emits what it decides (``backend_cuda/lower_specialized.py``).
"""
from __future__ import annotations

from dataclasses import replace

from .. import knobs
from ..errors import CompilationError
from ..target import Target
from ..ir import Function, Op, OpKind, Scope
from ..ir.rewrite import reads, use_counts
from .software_pipeline import mma_family
from .split_k import StreamKError, kernel_site, stream_k


#: The ring depth from which a warp-specialized loop's last gemm is deferred (``deferred_gemm``): it holds a slot
#: one iteration longer, so a 2-deep ring leaves the next iteration's tiles no time to land (measured on an H100:
#: attention 128x128 warp-specialized, 500 TFLOP/s deferred against 534 not with 2 stages, 583 deferred with 3).
#: Without a producer warpgroup (thread 0 refilling each slot once every warp has handed it back) deferring lost
#: 10-25% (attention 64x128 w4 at D = 64: 394 -> 294 TFLOP/s), so only warp-specialized loops defer.
DEFER_STAGES = 3

#: The threads of the producer warpgroup a warp-specialized loop adds (setmaxnreg acts on whole warpgroups).
PRODUCER_THREADS = 128


def specialize_warps(fn: Function, target: Target) -> None:
    """Give the wgmma main loops asked to (``T.range(..., warp_specialize=True)``, or the ``warp_specialize``
    launch option for loops that do not say) a producer warpgroup: one of its threads issues the ring's TMA
    loads, waiting only for slots the math has released, while the launch's warps wait only for loaded slots.

    The loop is a wgmma loop whose pipelined tiles are all loaded by TMA: a plain main loop whose gemms stay in
    flight (the math warps release a slot once the next iteration's wait shows its gemms done), or one with
    other math between its gemms, like attention's (released at the end of each iteration). It sits in the
    kernel's top-level block, and the kernel is not split-K (its cluster barriers count every thread). The
    producer warpgroup is launched beyond the ``num_warps`` warps every layout is made for and leaves the kernel
    after the loop. When every op before the loop computes registers or scalars only (a loop or ``if`` of scalar
    math and scalar reads counts: a grouped GEMM's search for its group), the producer runs them too and splits
    off at the loop; otherwise (a tile loaded before the loop, attention's Q) it splits off at the
    kernel's start and computes only the scalars its loads and bounds need (``producer_slice``, which must be
    scalar math or scalar reads: ``fn.attrs["producer_first"]``, ``lower_specialized.emit_specialized``). A loop that
    asks and does not qualify is refused with the reason; the launch option passes over it.

    With the ``persistent`` launch option (which implies ``warp_specialize`` for loops that do not say), a kernel
    whose loop is specialized and split off at the loop runs as one program per SM (``fn.attrs["persistent"]``,
    the program count): each walks the grid's programs, and the producer loads the next program's tiles while
    the math warps finish this one's epilogue (``lower_specialized.emit_specialized``). With ``pingpong`` as well, and
    loop bounds computed by scalar math (``bounds_slice``), the block holds two groups of ``num_warps`` math warps
    (``fn.attrs["groups"]``), each running every other program of the walk with its own registers, shared memory
    and barriers; the producer fills one ring for both, in the walk's order, so one group's main loop runs while
    the other finishes its epilogue."""
    if target.stream_k and target.sm == 90 and (target.num_warps % 4 or fn.attrs.get("split_k", 1) > 1
                                                or target.pingpong or target.cluster > 1):
        why = ("split_k" if fn.attrs.get("split_k", 1) > 1 else "pingpong" if target.pingpong else "cluster=2"
               if target.cluster > 1 else "num_warps not a multiple of 4")
        site = kernel_site(fn)
        hint = "launch without stream_k, or with persistent=True alone"
        if site is None:
            raise StreamKError(f"kernel {fn.name}: stream_k does not combine with {why}", filename=fn.filename,
                               hint=hint)
        raise StreamKError.at(site.loc, f"stream_k does not combine with {why}", hint=hint)
    if target.sm != 90 or target.num_warps % 4 or fn.attrs.get("split_k", 1) > 1:
        asked = [op for op in fn.walk() if op.kind is OpKind.FOR and op.attrs.warp_specialize]
        if asked and target.sm == 90:
            why = "split-K kernels" if fn.attrs.get("split_k", 1) > 1 else "num_warps not a multiple of 4"
            raise _refusal(asked[0], f"warp specialization is not available for {why}")
        return  # other archs: the option is about Hopper's TMA/wgmma ring and means nothing there
    chosen = []
    for loop in fn.walk():
        if loop.kind is not OpKind.FOR:
            continue
        asked = loop.attrs.warp_specialize
        if asked is False or asked is None and not target.options.in_effect("warp_specialize"):
            continue
        why = _why_not_specialized(fn, loop)
        if why is None and chosen:
            why = "one loop per kernel may be warp-specialized"
        if why is not None:
            if asked:
                raise _refusal(loop, f"this loop cannot be warp-specialized: {why}")
            continue
        chosen.append(loop)
    for loop in chosen:
        loop.attrs = replace(loop.attrs, producer_warpgroup=True)
        fn.attrs["producer_threads"] = PRODUCER_THREADS
        if not _prelude_on_extra_threads(fn, loop):
            # the producer leaves at the kernel's start with the scalars its loads need
            # (lower_specialized.emit_specialized)
            fn.attrs["producer_first"] = True
            if target.persistent and _walks_alone(fn, loop):
                # (the producer's one thread computes each program's scalars; the math warps run all of the rest)
                fn.attrs["persistent"] = target.sm_count or DEFAULT_SM_COUNT
        elif target.persistent and all(_runs_on_one_thread(o) for o in _before(fn, loop)):
            # (what precedes the loop is repeated per program by the producer's one thread: no reduction there)
            # a cluster's two programs walk programs side by side: an even count keeps the pairs together
            programs = target.sm_count or DEFAULT_SM_COUNT
            fn.attrs["persistent"] = programs - programs % target.cluster
            if target.pingpong and not fn.attrs.get("one_group") and all(_recomputable(o) for o in
                                                                          bounds_slice(fn, loop)):
                # (one_group: the compile found no room for the second group beside a ring, compiler._cuda_stage)
                fn.attrs["groups"] = PINGPONG_GROUPS
        if target.cluster > 1 and multicast_loads(fn, loop):
            fn.attrs["cluster"] = target.cluster
        if target.stream_k and fn.attrs.get("persistent"):
            # (like persistent, the option passes over a kernel that cannot run persistent; one that can but whose
            # loop is not a sum of matrix products is refused, with the reason, by the rewrite)
            stream_k(fn, loop)
            fn.attrs["stream_k"] = fn.attrs["persistent"]
        # (a persistent kernel's loop is deferred only where the producer splits off first: attention's form,
        # run on a GPU; the walk with the producer's prelude has not been)
        if loop.attrs.async_mma is None and (loop.attrs.stages or 1) >= DEFER_STAGES and knobs.mma_overlap() \
                and (not fn.attrs.get("persistent") or fn.attrs.get("producer_first")) \
                and deferred_gemm(loop.regions[0]) is not None:
            loop.attrs = replace(loop.attrs, defer_mma=True)


#: The program count of a persistent kernel compiled with no GPU to ask (an H100 SXM's SMs).
DEFAULT_SM_COUNT = 132

#: The groups of math warps a ``pingpong`` kernel's block holds (two: one in its main loop, one in its epilogue).
PINGPONG_GROUPS = 2


def launched_threads(fn: Function, target: Target) -> int:
    """The threads a kernel's block is launched with: its groups of ``num_warps`` warps (one, or ``pingpong``'s
    two) and a warp-specialized loop's producer warpgroup."""
    return fn.attrs.get("groups", 1) * target.threads + int(fn.attrs.get("producer_threads", 0))


def multicast_loads(fn: Function, loop: Op) -> list[tuple[Op, list]]:
    """The TMA loads of a warp-specialized ``loop`` that the two programs of a cluster along x (programs 2i and
    2i + 1 of the x axis, or of a persistent walk's order) may load once for both, each with the values it needs
    compared between the two at run time: the values computed before the loop that its window starts depend on
    (through the body's scalar math) and that depend on ``T.program_id(0)``. None when the loop's bounds depend on
    ``T.program_id(0)``: the two programs must run the loop as many times. Where that
    list is empty the windows are alike in both programs at every iteration (the DESIGN matmul's B: ``k0``,
    ``program_id(1) * BN``); otherwise the producer computes those values for the other program too (they must
    come from scalar math or scalar reads) and multicasts only when all are equal (a grouped launch order's B,
    most of the time). A load whose values cannot be recomputed so is not listed."""
    body = loop.regions[0]
    iv = body.args[0]
    inside = {r.id: o for o in body.ops for r in o.results}
    varies: dict[int, bool] = {}

    def depends(v) -> bool:
        """Whether ``v`` (defined before the loop) depends on program_id(0); values out of regions count as so."""
        if v.id not in varies:
            op = v.owner
            if op is None:  # a kernel parameter
                varies[v.id] = False
            elif not isinstance(op, Op) or op.regions or op.kind is OpKind.PROGRAM_ID and op.attrs.axis == 0:
                varies[v.id] = True
            else:
                varies[v.id] = any(depends(x) for x in op.operands)
        return varies[v.id]

    def leaves(values) -> list:
        """The values defined outside the body that ``values`` depend on through the body's ops."""
        out, stack, seen = [], list(values), set()
        while stack:
            v = stack.pop()
            if v.id in seen or v is iv:
                continue
            seen.add(v.id)
            if v.id in inside:
                stack.extend(inside[v.id].operands)
            else:
                out.append(v)
        return out

    # Both programs of a pair must run the loop as many times: every slot's "empty" barrier counts both programs'
    # warps, and a persistent walk keeps the two rings' slot counts in step. So the bounds may not depend on
    # program_id(0) (a causal bound does; no clusters then).
    if any(depends(v) for v in leaves(loop.operands[:3])):
        return []
    before = _before(fn, loop)
    found = []
    for o in body.ops:
        if not (o.kind is OpKind.LOAD and o.attrs.pipeline and o.attrs.copy == "tma_bulk_tensor"):
            continue
        compared = sorted({v.id: v for v in leaves([*loop.operands[:3], *o.operands]) if depends(v)}.values(),
                          key=lambda v: v.id)
        if all(_recomputable(x) for x in _slice(before, compared)) and all(isinstance(v.owner, Op) for v in compared):
            found.append((o, compared))
    return found


def _why_not_specialized(fn: Function, loop: Op) -> str | None:
    why = None if loop.attrs.async_mma == "wgmma" else _not_a_tma_wgmma_loop(loop)
    if why is not None:
        return why
    if not any(o is loop for o in fn.body.ops):
        return "it is nested in another loop or an if (it must be in the kernel's top-level block)"
    if not _prelude_on_extra_threads(fn, loop):
        for o in producer_slice(fn, loop):
            if not _scalar_only(o):
                where = f" ({o.loc})" if o.loc else ""
                return (f"its loads' coordinates or its bounds depend on '{o.kind.mnemonic}'{where}, which computes "
                        "tiles or writes memory (the producer warpgroup computes scalars only)")
    return None


def _not_a_tma_wgmma_loop(loop: Op) -> str | None:
    """Why ``loop`` is not a wgmma loop whose pipelined tiles are all loaded by TMA (the gemm or the load at fault);
    None when it is: then its math warps can wait for loaded slots and release them at the end of each iteration."""
    body = loop.regions[0]
    gemms = [o for o in body.walk() if o.kind is OpKind.GEMM]
    if not any((o.attrs.impl or "").startswith("wgmma") for o in gemms):
        if not gemms:
            return "its body has no gemm (a producer warpgroup feeds wgmma from a ring of TMA loads)"
        where = f" ({gemms[0].loc})" if gemms[0].loc else ""
        return (f"its gemm{where} is lowered to {gemms[0].attrs.impl}, not wgmma (wgmma takes tiles of at least 64 "
                "rows per warpgroup and K in whole steps: 16 for 16-bit operands, 32 for 8-bit, 8 for float32)")
    piped = [o for o in body.ops if o.kind is OpKind.LOAD and o.attrs.pipeline]
    if not piped:
        return "none of its loads is pipelined into a ring (stages >= 2)"
    load = next((o for o in piped if o.attrs.copy != "tma_bulk_tensor"), None)
    if load is None:
        return None
    where = f" ({load.loc})" if load.loc else ""
    return (f"its load of {load.operands[0].name}{where} is copied by {load.attrs.copy}, not TMA (TMA needs the "
            "tensor's last dim of stride 1, every other stride a multiple of 16 bytes and a 16-byte aligned base; "
            "a column-major window, such as B given as w.T, is not)")


def _before(fn: Function, loop: Op) -> list[Op]:
    """The ops of the kernel's top-level block before ``loop`` (which is in it)."""
    top = fn.body.ops
    return top[:next(i for i, x in enumerate(top) if x is loop)]


def _walks_alone(fn: Function, loop: Op) -> bool:
    """Whether a kernel whose producer splits off first may walk the grid's programs (``persistent``): the
    producer's scalars (``producer_slice``) need no other thread, and no loop follows the specialized one (the
    ring stays for the next program's loads while the math warps finish this one, so a later loop's ring would
    need memory of its own; attention's masked blocks belong inside the specialized loop then), and its math warps
    release each slot at the end of their iteration (attention's form, the one run on a GPU; a plain main loop
    whose gemms stay in flight walks only with its prelude on the producer)."""
    after = fn.body.ops[next(i for i, x in enumerate(fn.body.ops) if x is loop) + 1:]
    return loop.attrs.async_mma is None and all(_runs_on_one_thread(o) for o in producer_slice(fn, loop)) and \
        not any(o.kind is OpKind.FOR for op in after for o in (op, *(x for r in op.regions for x in r.walk())))


def _prelude_on_extra_threads(fn: Function, loop: Op) -> bool:
    """Whether every op before ``loop`` may run on the producer warpgroup too (registers and scalars only)."""
    return all(_runs_on_extra_threads(o) for o in _before(fn, loop))


def producer_slice(fn: Function, loop: Op) -> list[Op]:
    """The ops before ``loop`` (in order) that its bounds and its TMA loads' tensors and window starts depend on,
    through the body's scalar math: what a producer warpgroup leaving at the kernel's start must compute itself."""
    body = loop.regions[0]
    loads = [v for o in body.ops if o.kind is OpKind.LOAD and o.attrs.pipeline for v in o.operands]
    return _slice(_before(fn, loop), [*loop.operands[:3], *loads], through=body.ops)


def compared_slice(fn: Function, loop: Op, values: list) -> list[Op]:
    """The ops before ``loop`` (in order) that ``values`` (``multicast_loads``' compared values) depend on."""
    return _slice(_before(fn, loop), values)


def bounds_slice(fn: Function, loop: Op) -> list[Op]:
    """The ops before ``loop`` (in order) that its bounds (start, stop, step) depend on."""
    return _slice(_before(fn, loop), list(loop.operands[:3]))


def _slice(before: list[Op], values: list, through: list[Op] = ()) -> list[Op]:
    """The ops of ``before`` that ``values`` depend on, directly or through the ops ``through`` (a loop body's);
    an op with regions (a loop) depends on what its regions' ops read from outside them too."""
    owners = {r.id: o for o in (*before, *through) for r in o.results}
    stack = list(values)
    seen: set[int] = set()
    while stack:
        v = stack.pop()
        if v.id not in seen and v.id in owners:
            seen.add(v.id)
            owner = owners[v.id]
            stack.extend(owner.operands)
            stack.extend(x for region in owner.regions for o in region.walk() for x in o.operands)
    return [o for o in before if any(r.id in seen for r in o.results)]


def _scalar_only(op: Op) -> bool:
    """Computes scalars (or reads them) without memory writes: safe to repeat on the producer. A loop or an
    ``if`` qualifies when every op in it does (a search over a table of offsets, as a grouped GEMM's programs
    find their group)."""
    return not op.kind.writes_memory and all(r.is_scalar for r in op.results) and \
        all(v.is_scalar or v.is_tensor for v in op.operands) and \
        all(_scalar_only(o) for region in op.regions for o in region.ops)


def _recomputable(op: Op) -> bool:
    """Scalar-only and without regions: safe to compute again for another program (a cluster's partner, a
    pingpong group's programs) op by op, under that program's ids; a loop's or an if's results are taken whole
    from the program that ran them."""
    return not op.regions and _scalar_only(op)


# Tile ops that compute registers only (no memory, no shared scratch): the producer warpgroup may run them.
_REGISTER_ONLY = frozenset({OpKind.SPLAT, OpKind.ARANGE, OpKind.BROADCAST, OpKind.EXPAND_DIMS})


def _runs_on_one_thread(op: Op) -> bool:
    """Runs on the extra threads and needs no other thread: scalar math (not a reduction of a tile, which goes
    through shuffles and shared memory) or a register-only tile op."""
    if not _runs_on_extra_threads(op):
        return False
    return not any(v.is_tile for v in op.operands) or op.kind in _REGISTER_ONLY or op.kind.is_elementwise


def _runs_on_extra_threads(op: Op) -> bool:
    if op.regions:
        return _scalar_only(op)  # a loop or if of scalar math and scalar reads
    if op.kind.writes_memory:
        return False
    if all(r.is_scalar for r in op.results):
        return True  # scalar math and metadata, uniform over the block
    return op.kind in _REGISTER_ONLY or op.kind.is_elementwise


def _refusal(loop: Op, message: str) -> CompilationError:
    return CompilationError.at(loop.loc, message, hint="drop warp_specialize=True from this T.range (it then runs "
                                                       "pipelined without a producer warpgroup), or change what "
                                                       "the error names")


def deferred_gemm(body) -> Op | None:
    """The gemm of a warp-specialized body (not left in flight) that may be issued one iteration late, or None.

    Attention's ``s = q @ k.T; softmax; acc = acc * alpha + p @ v``: iteration ``j`` issues ``q @ k_j.T``, then
    iteration ``j - 1``'s ``p @ v``, waits for the first only, and runs the softmax while the second works
    (FlashAttention-3's intra-warpgroup overlap); ``acc`` is read once that one completes. That holds when the
    body's last gemm (on wgmma, as is its first) accumulates into a loop-carried value (or a value the body makes
    for it alone, like ``acc * alpha``) and yields its result there only; its operands are ring tiles (kept a
    slot longer), values from before the loop, or a register tile the body makes for it alone (``p``, carried
    packed to the next iteration); and nothing up to the first gemm reads that carried value."""
    gemms = [o for o in body.walk() if o.kind is OpKind.GEMM]
    if len(gemms) < 2 or any(mma_family(g) != "wgmma" for g in gemms):
        return None
    first, last = gemms[0], gemms[-1]
    if len(last.operands) != 3:
        return None  # a scaled gemm (passes/scaled_promotion.py): its scale tile is this iteration's
    ops = body.ops
    if not any(o is first for o in ops) or not any(o is last for o in ops):
        return None  # both in the body's own block (not under an if)
    at = {id(o): i for i, o in enumerate(ops)}
    owners = {r.id: o for o in ops for r in o.results}
    uses = use_counts(body)
    a, b, acc = last.operands[:3]
    carried, yields = body.args[1:], body.terminator.operands
    slots = [j for j, y in enumerate(yields) if y is last.result]
    if len(slots) != 1 or uses.get(last.result.id) != 1:
        return None
    into = carried[slots[0]]
    if acc is not into and (acc.id not in owners or uses.get(acc.id) != 1):
        return None
    for v, register_ok in ((a, True), (b, False)):
        owner = owners.get(v.id)
        if owner is None:
            if any(v is x for x in body.args):
                return None  # a carried operand has moved on by the next iteration
            continue  # from before the loop
        if owner.kind is OpKind.LOAD and owner.attrs.pipeline:
            continue  # a ring tile: its slot is released a (late) iteration later
        if not (register_ok and v.type.scope is Scope.REGISTER and uses.get(v.id) == 1
                and (last.attrs.impl or "").startswith("wgmma_rs")):
            return None
    readers = [at[id(o)] for o in ops if reads(o, into)]
    if readers and min(readers) <= at[id(first)]:
        return None
    return last
