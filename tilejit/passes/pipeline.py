"""Software pipelining of ``T.range(..., stages=S)`` loops.

A shared-memory load in the body of a pipelined loop is prefetched ``S - 1`` iterations ahead into a ring
of ``S`` buffers, when its window can be computed for a future iteration: its start indices may depend
only on the induction variable, on values defined before the loop and on scalar arithmetic over those
(not on loop-carried values or loaded data). The code generator then emits the prologue (iterations
``0 .. S-2`` issued up front), the steady state (wait for the oldest group, prefetch iteration
``k + S - 1``, compute iteration ``k``) and the drain. Trip counts below ``S`` are guarded per stage.
"""
from __future__ import annotations

from dataclasses import replace

from ..target import Target
from ..ir import Family, Function, LoopKind, OpKind, Scope, TileType
from ..ir.layouts import SharedLayout


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
