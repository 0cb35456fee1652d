"""Software pipelining of ``T.range(..., stages=S)`` loops, and the marking of main loops whose gemms stay in flight.

A shared-memory load in the body of a pipelined loop is prefetched ``S - 1`` iterations ahead into a ring
of ``S`` buffers, when its window can be computed for a future iteration: its start indices may depend
only on the induction variable, on values defined before the loop and on scalar arithmetic over those
(not on loop-carried values or loaded data). The code generator then emits the prologue (iterations
``0 .. S-2`` issued up front), the steady state (wait for the oldest group, prefetch iteration
``k + S - 1``, compute iteration ``k``) and the drain. Trip counts below ``S`` are guarded per stage.

Once the copies are chosen, ``mark_async_mma`` marks the TMA-fed MMA main loops whose gemms may stay in flight
across iterations (``in_flight_gemms``). Warp specialization, the pass after it, is in ``warp_specialize.py``.
"""
from __future__ import annotations

from dataclasses import replace

from .. import dtypes as D
from ..target import Target
from ..ir import Family, Function, LoopKind, Op, OpKind, Scope, TileType, is_block_scaled
from ..ir.layouts import SharedLayout
from ..ir.rewrite import use_counts
from .transpose_operands import IN_FLIGHT_COPIES


def _prefetchable_values(body) -> set[int]:
    """Ids of scalar values in ``body`` computable from the induction variable and outer values."""
    inside = {a.id for a in body.args}
    for op in body.walk():
        inside.update(r.id for r in op.results)
    ok = {body.args[0].id}
    for op in body.ops:
        if op.regions or op.kind.family not in (Family.SCALAR, Family.ARITH):
            continue
        if all(r.is_scalar for r in op.results) and all(v.id in ok or v.id not in inside for v in op.operands):
            ok.update(r.id for r in op.results)
    return ok | set()  # outer values are checked by the caller


def pipeline_loops(fn: Function, target: Target) -> None:
    for loop in fn.walk():
        if loop.kind is not OpKind.FOR or loop.attrs.kind is not LoopKind.PIPELINED:
            continue
        stages = loop.attrs.stages or target.num_stages
        # a cap set by the compiler when a deeper ring did not fit the target's shared memory
        stages = min(stages, fn.attrs.get("max_stages", stages))
        if stages < 2:
            continue
        body = loop.regions[0]
        inside = {a.id for a in body.args}
        for op in body.walk():
            inside.update(r.id for r in op.results)
        ok = _prefetchable_values(body)
        piped = 0
        for op in body.ops:
            if op.kind is not OpKind.LOAD or not op.result.is_tile or op.result.type.scope is not Scope.SHARED:
                continue
            # the tensor too: a view (T.bounded) made inside the body cannot be read ahead of it
            if all(v.id in ok or v.id not in inside for v in op.operands):
                op.attrs = replace(op.attrs, pipeline=stages)
                t: TileType = op.result.type
                layout: SharedLayout = t.layout
                op.result.type = t.with_layout(replace(layout, stages=stages))
                piped += 1
        if piped:
            loop.attrs = replace(loop.attrs, stages=stages)


def mark_async_mma(fn: Function, target: Target) -> None:
    """Mark the pipelined loops whose gemms may stay in flight across iterations (``ForAttrs.async_mma``): a
    plain MMA main loop (``in_flight_gemms``) at least 2 stages deep; a tcgen05 loop's accumulators take scope
    tmem in its body. Runs after the copies are chosen: the ring must be filled by TMA, whose mbarriers carry the
    hand-back; warp specialization (``warp_specialize.specialize_warps``) reads the marks."""
    for loop in fn.walk():
        if loop.kind is not OpKind.FOR or loop.attrs.kind is not LoopKind.PIPELINED or (loop.attrs.stages or 1) < 2:
            continue
        gemms = in_flight_gemms(loop.regions[0])
        if gemms:
            loop.attrs = replace(loop.attrs, async_mma=mma_family(gemms[0]))
            if loop.attrs.async_mma == "tcgen05":
                for gemm in gemms:
                    _keep_in_tmem(gemm)
            for copy in (o for o in loop.regions[0].ops if o.kind is OpKind.TRANSPOSE_COPY):
                t: TileType = copy.result.type
                copy.result.type = t.with_layout(replace(t.layout, stages=IN_FLIGHT_COPIES))



def _keep_in_tmem(gemm: Op) -> None:
    """A tcgen05 accumulator stays in tensor memory through the loop: in the body, the carried value the gemm
    reads and the result it yields are TMEM tiles (still in their TmemLayout: the registers the loop's entry stores
    into TMEM and its exit loads back); what enters the loop and its result stay registers."""
    for v in (gemm.operands[2], gemm.result):
        v.type = v.type.with_scope(Scope.TMEM)


def in_flight_gemms(body) -> list[Op]:
    """The gemms of a TMA-pipelined body that may stay in flight across iterations, or [] when the body is
    not a plain MMA main loop: every ring tile read only by asynchronous gemms of one family (wgmma, or
    tcgen05 with the accumulator kept in tensor memory), each accumulating into its own loop-carried value
    (read nowhere else) and yielding the result to the same place, the rest scalar math."""
    piped = [o for o in body.ops if o.kind is OpKind.LOAD and o.attrs.pipeline]
    if not piped or any(o.attrs.copy != "tma_bulk_tensor" for o in piped):
        return []
    ring = {o.result.id for o in piped}
    # a ring tile copied transposed for wgmma (transpose_operands) counts as read from the ring
    transposed = {o.result.id for o in body.ops if o.kind is OpKind.TRANSPOSE_COPY and o.operands[0].id in ring}
    carried, yields = body.args[1:], body.terminator.operands
    uses = use_counts(body)  # (nested regions count too; a body with any is refused below anyway)
    gemms = []
    for o in body.ops[:-1]:
        if any(o is p for p in piped) or o.result.id in transposed:
            continue
        if o.kind is OpKind.GEMM and mma_family(o) is not None and not is_block_scaled(o):
            a, b, acc = o.operands[:3]
            slots = [j for j, y in enumerate(yields) if y is o.result and carried[j] is acc]
            fed = all(v.id in ring or v.id in transposed and mma_family(o) == "wgmma" for v in (a, b))
            if fed and slots and uses.get(acc.id) == 1 and uses.get(o.result.id) == 1:
                gemms.append(o)
                continue
            return []
        scalar = all(v.is_scalar for v in (*o.operands, *o.results))
        if o.regions or not scalar or o.kind.family not in (Family.SCALAR, Family.ARITH):
            return []
    return gemms if len({mma_family(g) for g in gemms}) == 1 else []


def mma_family(op: Op) -> str | None:
    impl = op.attrs.impl or ""
    if impl.startswith("wgmma") and op.result.dtype == D.float16:
        return None  # its f16x2 registers are packed around each product: never left in flight
    return next((f for f in ("wgmma", "tcgen05") if impl.startswith(f)), None)
