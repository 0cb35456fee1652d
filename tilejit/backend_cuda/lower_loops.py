"""``for`` loops, including the software-pipelined form of ``T.range(..., stages=S)``.

Pipelined shared loads (marked by ``passes/pipeline.py``) are issued ``S - 1`` iterations ahead into a
ring of ``S`` shared buffers with cp.async; one commit group per iteration (empty groups included) keeps
the group count aligned with the iteration count, so ``cp.async.wait_group S-2`` at the top of iteration
``k`` guarantees that iteration ``k``'s tiles have landed (PTX 9.7.9.25.3).

TMA loads complete on a "full" mbarrier per ring slot. When the ring tiles are read by wgmma alone and
those gemms accumulate into loop-carried values (a GEMM main loop), the gemms stay in flight across
iterations (``wgmma.wait_group`` leaves this iteration's groups pending) and the slot of iteration
``k - 1`` is handed back through an "empty" mbarrier (one arrival per warp, after its wait) instead of a
block-wide barrier; thread 0 waits on it before refilling the slot with iteration ``k + S - 1``.

A warp-specialized loop (``ForAttrs.producer_warpgroup``, sm_90a) moves the refills to a producer warpgroup
launched beyond the ``num_warps`` warps: after the barriers are set up, its warps give registers back
(``setmaxnreg.dec``) and its first thread runs the loop's iterations issuing TMA loads, each into a slot once
the math has released it; then the producer leaves the kernel. The ``num_warps`` warps take the registers
(``setmaxnreg.inc``) and run the loop waiting only for loaded slots; from there on their block-wide barriers
count them alone (``Emitter.consumers_only``).

A cp.async ring (the sm_80 main loop) whose one gemm runs on mma.sync carries its fragments across iterations
(``FragmentCarry``): the wait for iteration ``k + 1``'s tiles and the block-wide barrier move from the top of
iteration ``k + 1`` to just before the mma.sync of iteration ``k``'s last k step, whose operands are already in
registers, and the first k step's fragments of iteration ``k + 1`` load while those mma.sync run. The barrier no
longer stands between a warp's last mma.sync of one iteration and its first of the next. The ring then waits with
``wait_group S-3`` (the group of the iteration in progress is committed at its end), so it needs S >= 3. Measured
on an H200 (benchmarks/RESULTS.md, ninth session): +4-23% where every copy moves whole 16-byte chunks; where a
tensor's rows are not 16-byte multiples the copies go element by element after the math, and only the last k
step's mma.sync were left to hide them (-47%), so those loops do not carry; nor do loops fed by TMA (mma.sync
pinned on sm_90a), where it measured from +5% to -10%.
"""
from __future__ import annotations

from typing import Callable

from ..ir import BinaryOp, Op, OpKind, Value
from ..ir.rewrite import reads, use_counts
from .. import dtypes as D
from .. import knobs
from ..target import REGISTRY
from ..passes.copies import load_spec
from ..passes.pipeline import (PRODUCER_THREADS, bounds_slice, compared_slice, deferred_gemm, in_flight_gemms,
                               multicast_loads, producer_slice)
from .emitter import (SPECIALIZED_BODY, RULES, AsyncMma, Emitter, assign_value, c_type, declare_var, emits,
                      scalar_expr)
from . import lower_tcgen05, lower_tma
from .lower_wgmma import wait_group
from .lower_wgmma_rs import pack_a
from .lower_memory import InteriorCopy, SharedCopy, issue_shared_load, stage_shared


CLUSTER_SUPPORT = r"""
/// A cluster's programs (1 when launched without clusters) and this one's rank in it (PTX 10.14, special registers).
TJ_DEVICE unsigned tj_cluster_ctas() { unsigned n; asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n)); return n; }
TJ_DEVICE unsigned tj_cluster_rank() { unsigned r; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
/// Every non-exited thread of the cluster gets here (PTX 9.7.13.4, barrier.cluster).
TJ_DEVICE void tj_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
/// ... with the mbarrier initializations before it visible to the cluster (PTX 9.7.13.14, fence.mbarrier_init).
TJ_DEVICE void tj_cluster_sync_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  tj_cluster_sync();
}
/// Arrive on a ring slot's "empty" mbarrier, here and at the same offset in the cluster's other program, whose
/// producer multicasts into this program's slot as well (PTX 9.7.9.18 mapa, 9.7.13.15.13 mbarrier.arrive). The
/// default semantics (release at CTA scope): the slot's readers are wgmma groups already waited for. With
/// .release.cluster here the GEMM ran at half its speed on an H100.
TJ_DEVICE void tj_mbar_arrive_pair(unsigned bar, unsigned ncta, unsigned rank) {
  tj_mbar_arrive(bar);
  if (ncta > 1) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank ^ 1u));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  }
}
"""


def release(em: Emitter, bar: str) -> str:
    """The statement by which a warp (its lane 0) hands a ring slot back on its "empty" mbarrier ``bar``: in a
    cluster's programs (``fn.attrs["cluster"]``), in both."""
    if em.fn.attrs.get("cluster"):
        em.require_support("cluster_ring", CLUSTER_SUPPORT)
        return f"if ((tid & 31) == 0) tj_mbar_arrive_pair({bar}, tj_ncta, tj_crank);"
    return f"if ((tid & 31) == 0) tj_mbar_arrive({bar});"


def _positive_constant(v: Value) -> bool:
    op = v.owner
    return isinstance(op, Op) and op.kind is OpKind.CONSTANT and op.attrs.value > 0


def _iv_coefficient(v: Value, body_ops: dict[int, Op], iv_id: int) -> int | None:
    """1 when scalar ``v`` is the induction variable plus a loop-invariant value, 0 when it is loop-invariant,
    None otherwise (a window start a pipelined loop then recomputes each iteration)."""
    if v.id == iv_id:
        return 1
    op = body_ops.get(v.id)
    if op is None:
        return 0
    coefs = [_iv_coefficient(x, body_ops, iv_id) for x in op.operands]
    if None in coefs:
        return None
    if not any(coefs):
        return 0
    if op.kind is OpKind.BINARY and op.attrs.op is BinaryOp.ADD and sorted(coefs) == [0, 1]:
        return 1
    if op.kind is OpKind.BINARY and op.attrs.op is BinaryOp.SUB and coefs == [1, 0]:
        return 1
    return None


def _rematerialize(em: Emitter, v: Value, body_ops: dict[int, Op], iv_id: int, iv_expr: str) -> str:
    """A C expression for scalar ``v`` (defined in the loop body) with the induction variable replaced."""
    if v.id == iv_id:
        return f"({iv_expr})"
    op = body_ops.get(v.id)
    if op is None:
        return em.name(v)
    args = [_rematerialize(em, x, body_ops, iv_id, iv_expr) for x in op.operands]
    return f"({scalar_expr(em, op, args)})"


class FragmentCarry:
    """An mma.sync gemm's first fragments loaded one iteration early (module docstring), in a cp.async ring whose
    slots read are ``rd[load id]`` (a variable rotated at the end of each iteration) over ``stages`` slots. Past
    the last iteration the wait, the barrier and the loads still run (uniformly, reading a stale slot): no branch
    in the loop."""

    def __init__(self, em: Emitter, gemm: Op, payload, piped: list[Op], rd: dict[int, str], stages: int) -> None:
        self.em, self.gemm, self.payload, self.piped, self.rd, self.stages = em, gemm, payload, piped, rd, stages

    def _load(self, first: bool) -> None:
        em, stages = self.em, self.stages
        em.line(f"tj_cp_async_wait<{stages - 2 if first else stages - 3}>();")
        em.barrier("its tiles landed for every thread" + ("" if first else ", and everyone is done with this slot"))
        for load in self.piped:  # the slot of the iteration after the one in progress
            tile, r = em.shared[load.result.id], self.rd[load.result.id]
            last = tile.offset + (stages - 1) * tile.layout.stage_bytes
            tile.address = r if first else (f"({r} == {tile.origin} + {last} ? {tile.origin} + {tile.offset} : "
                                            f"{r} + {tile.layout.stage_bytes})")
        self.payload.load_first(em, self.gemm)
        for load in self.piped:
            em.shared[load.result.id].address = self.rd[load.result.id]

    def prologue(self) -> None:
        """Before the loop: the carried fragments, and iteration 0's first k step in them."""
        self.em.line("// the gemm's fragments live across iterations: each loads the next one's first k step")
        self.payload.declare_carried(self.em, self.gemm)
        self._load(first=True)

    def next_iteration(self) -> None:
        """Called by the gemm before the mma.sync of its last k step (whose fragments are loaded)."""
        self.em.line("// the next iteration's tiles, and its first k step's fragments under this step's mma.sync")
        self._load(first=False)


def _carried_gemm(em: Emitter, body, piped: list[Op], stages: int):
    """The gemm of a cp.async ring's body and its lowering, when its fragments can be carried across iterations
    (``FragmentCarry``): 3 stages or more; the body's one gemm, reading two pipelined tiles that nothing else in
    the body reads, of tensors 16-byte aligned with 16-byte strides (the specialization says so; their copies go
    element by element only where an extent is not a multiple of 16 bytes either, e.g. a narrowed view); a
    lowering that carries (``MmaSync.carries``). Else None."""
    gemms = [o for o in body.walk() if o.kind is OpKind.GEMM]
    if len(gemms) != 1 or gemms[0] not in body.ops or stages < 3 or not knobs.mma_overlap():
        return None
    for load in piped:
        spec = load_spec(em.fn, load)
        if spec is None or not spec.chunks16():
            return None
    gemm = gemms[0]
    ids = {load.result.id for load in piped}
    if not all(v.id in ids for v in gemm.operands[:2]):
        return None
    counts = use_counts(body)
    if any(counts[i] != sum(v.id == i for v in gemm.operands) for i in ids):
        return None
    payload = next(i for i in REGISTRY.candidates("gemm") if i.name == gemm.attrs.impl).payload
    return (gemm, payload) if getattr(payload, "carries", None) and payload.carries(gemm) else None


@emits(OpKind.FOR)
def _for(em: Emitter, op: Op) -> None:
    lo, hi, step = (em.name(v) for v in op.operands[:3])
    body = op.regions[0]
    iv, carried = body.args[0], body.args[1:]
    iv_t = c_type(iv.dtype)
    # a specialized loop set up at the kernel's start comes here twice (emit_specialized): "prelude", "consumer"
    phase = em.ring_phase if op.attrs.producer_warpgroup else None
    # Loop-carried values live in variables declared before the loop; the results are those variables.
    for arg, init, res in zip(carried, op.operands[3:], op.results) if phase != "prelude" else ():
        name = declare_var(em, arg)
        assign_value(em, name, init)
        em.alias(res, name)
    positive = _positive_constant(op.operands[2])

    def in_range(x: str) -> str:
        return _in_range(x, hi, step, positive)

    piped = [o for o in body.ops if o.kind is OpKind.LOAD and o.attrs.pipeline]
    stages = op.attrs.stages or 1
    body_ops = {r.id: o for o in body.ops for r in o.results}

    def starts_at(load: Op, iv_expr: str) -> list[str]:
        return [_rematerialize(em, v, body_ops, iv.id, iv_expr) for v in load.operands[1:]]

    tma = [o for o in piped if o.attrs.copy == "tma_bulk_tensor"]
    per_thread = [o for o in piped if o not in tma]
    in_flight = in_flight_gemms(body) if op.attrs.async_mma else []
    # tcgen05: thread 0 issues the MMAs and commits them to the slot's "empty" barrier (one arrival); the
    # accumulators live in tensor memory for the whole loop
    tmem = op.attrs.async_mma == "tcgen05"
    producer = bool(op.attrs.producer_warpgroup) and bool(tma) and not per_thread
    late = Deferred(em, body, stages) if op.attrs.defer_mma and producer and not in_flight else None
    # a cluster's two programs fill each other's slots with the tiles they share (TMA multicast)
    paired = producer and bool(em.fn.attrs.get("cluster"))
    multicast = multicast_loads(em.fn, op) if paired else []
    yielded = body.terminator.operands
    carried_names = [em.name(op.results[next(j for j, y in enumerate(yielded) if y is g.result)]) for g in in_flight]
    # An enclosing loop's prefetch waits for the enclosing body's first gemm, not for one inside this loop.
    outer_hook, em.overlap_hook = em.overlap_hook, None
    outer_async, em.async_mma = em.async_mma, None
    # A persistent kernel's ring stays: the next program's loads land while this one finishes. Otherwise the ring
    # (a producer's too: its last loads have been consumed) is given back for what follows, e.g. a second loop.
    done = phase is None or phase == "consumer" and not em.fn.attrs.get("persistent")
    # The shared tiles (and mbarriers) made inside the loop die with it: a later loop reuses their memory.
    smem_mark = em.smem_top
    if phase != "prelude":  # the prelude's names (the ring's iteration count) serve the walk over programs
        em.open("")
    if phase == "consumer":
        full, empty, tma_bytes, maps, nbars, smem_mark = em.rings[id(op)]
    elif tma:
        em.require_support("tma", lower_tma.SUPPORT)
        released = bool(in_flight) or producer  # the math warps hand slots back on "empty" mbarriers
        nbars = 2 * stages if released else stages
        bars = em.allocate_shared(8 * nbars, 8)
        full, empty = f"{em.smem_origin} + {bars}", f"{em.smem_origin} + {bars + 8 * stages}"
        tma_bytes = sum(stage_shared(em, o.result).layout.stage_bytes for o in tma)
        maps = {o.result.id: em.tensor_map_param(lower_tma.TensorMapSpec(
            o.operands[0].name, lower_tma.box_of(o, stage_shared(em, o.result).layout), o.result.dtype.itemsize))
            for o in tma}
        em.line(f"// one mbarrier per ring slot: the bulk tensor copies of an iteration complete {tma_bytes} bytes on it")
        em.line(f"if ({em.leader}) {{ for (int s = 0; s < {stages}; ++s) tj_mbar_init({full} + 8 * s, 1); }}")
        if released:
            arrivals = 1 if tmem else em.target.num_warps
            em.line(f"// and one per slot that {'the MMA commit' if tmem else 'every warp'} arrives on once the MMAs "
                    f"have read the slot ({arrivals} arrival(s)" + (", from each program of the cluster)" if paired
                                                                  else ")"))
            count = f"{arrivals} * tj_ncta" if paired else f"{arrivals}"
            em.line(f"if ({em.leader}) {{ for (int s = 0; s < {stages}; ++s) tj_mbar_init({empty} + 8 * s, {count}); }}")
            if tmem:
                lower_tcgen05.store_accumulators(em, in_flight, carried_names)
        em.line("tj_fence_proxy_async();")
        em.barrier()
        if paired:
            em.require_support("cluster_ring", CLUSTER_SUPPORT)
            em.line("if (tj_ncta > 1) tj_cluster_sync_init();  // the barriers, initialized in both programs")
        em.rings[id(op)] = (full, empty, tma_bytes, maps, nbars, smem_mark)

    def issue_tma(at: str, slot: str, guard: str, refill: bool = False) -> None:
        if not tma or producer:
            return
        em.open(f"if (tid == 0 && ({guard}))")
        if refill:  # the slot's previous iteration (k - 1) must have been released by every warp
            em.line(f"if (tj_it > 0) tj_mbar_wait({empty} + 8 * ({slot}), ((tj_it - 1) / {stages}) & 1);")
        bar = f"{full} + 8 * ({slot})"
        em.line(f"tj_mbar_expect_tx({bar}, {tma_bytes});")
        for o in tma:
            lower_tma.tma_issue(em, o, em.shared[o.result.id], starts_at(o, at), slot, bar, maps[o.result.id])
        em.close()

    # cp.async rings (no TMA in the loop): the shared addresses of each ring's slots read and refilled live in
    # variables rotated by a constant per iteration, and windows wholly inside their tensor take InteriorCopy
    ring = bool(piped) and not tma
    rd: dict[int, str] = {}
    wr: dict[int, str] = {}
    interior: list[tuple[Op, InteriorCopy]] = []
    if producer:
        if phase != "consumer":  # (a persistent loop's consumer part finds the ring and producer set up)
            for load in piped:
                stage_shared(em, load.result)
            _producer(em, op, tma, stages, tma_bytes, full, empty, maps, starts_at, in_range, em.per_program,
                      multicast)
        if phase == "prelude":  # the math part comes inside the walk over programs; the ring's count spans it
            em.line("int tj_it = 0;  // the ring's iteration, counted across programs")
            em.async_mma, em.overlap_hook = outer_async, outer_hook
            return
    elif piped:
        for load in piped:
            stage_shared(em, load.result)
        em.line(f"// software pipeline: {stages} stages, {len(piped)} tile(s) prefetched {stages - 1} iteration(s) ahead"
                + (f", {len(tma)} by TMA" if tma else ""))
        # A rolled loop over the prefetched stages: unrolled, it repeated every copy's code (fast and
        # element-wise paths) per stage for NVRTC to compile, to save a few instructions run once.
        em.line("#pragma unroll 1")
        em.open(f"for (int tj_s = 0; tj_s < {stages - 1}; ++tj_s)")
        at = f"{lo} + ({iv_t})tj_s * {step}"
        issue_tma(at, "tj_s", in_range(f"({at})"))
        for load in per_thread:
            issue_shared_load(em, load, starts_at(load, at), "tj_s", guard=in_range(f"({at})"))
        em.line("tj_cp_async_commit();")
        em.close()
    if ring:
        for load in piped:
            tile = em.shared[load.result.id]
            rd[load.result.id], wr[load.result.id] = em.fresh("tj_rd"), em.fresh("tj_wr")
            em.line(f"unsigned {rd[load.result.id]} = {tile.origin} + {tile.offset}, {wr[load.result.id]} = "
                    f"{tile.origin} + {tile.offset + (stages - 1) * tile.layout.stage_bytes};  // slots read and refilled")
        first = f"{lo} + ({iv_t}){stages - 1} * {step}"
        for load in per_thread:
            coefs = [_iv_coefficient(v, body_ops, iv.id) for v in load.operands[1:]]
            if positive and None not in coefs:
                copy = InteriorCopy(em, load, starts_at(load, first), coefs, step)
                if copy.fits:
                    interior.append((load, copy))
        if interior:
            ok = [term for _, copy in interior for term in copy.setup()]
            em.line(f"const bool tj_inner_ok = {' && '.join(f'({t})' for t in ok)};")
    if piped and phase is None:
        em.line("int tj_it = 0;")
    carried_gemm = _carried_gemm(em, body, piped, stages) \
        if ring and phase is None and not in_flight and late is None else None
    carry = None
    if carried_gemm is not None:
        carry = FragmentCarry(em, *carried_gemm, piped, rd, stages)
        carry.prologue()
    # a pingpong group's programs take turns on the ring with the other group's: the slot before this program's
    # first is another group's to release, and this program's last is released here, after the loop
    own_slots = phase == "consumer" and em.groups > 1
    if own_slots:
        _group_turn(em, arrive=False)
        em.line("const int tj_it0 = tj_it;  // this program's first ring slot")
    if late is not None:
        late.declare()
    iv_name = em.name(iv)
    incr = f"{iv_name} += {step}" + (", ++tj_it" if piped else "")

    def iteration() -> None:
        """One iteration's code: wait for its tiles, its ops, hand back or refill, the carried values."""
        copies: list[SharedCopy] = []
        if piped:
            if carry is not None:
                em.line("// this iteration's tiles landed, and the slot refilled next was released, in the last one")
            elif per_thread:
                em.line(f"tj_cp_async_wait<{stages - 2}>();  // this iteration's tiles have landed")
                em.line("tj_fence_proxy_async();  // ... and visible to wgmma's async proxy")
            if tma:
                em.line(("if (tid == 0) " if tmem else "")
                        + f"tj_mbar_wait({full} + 8 * (tj_it % {stages}), (tj_it / {stages}) & 1);"
                        + "  // TMA tiles landed")
            if not in_flight and not producer and carry is None:
                em.barrier("... for every thread, and everyone is done with the slot refilled next")
            nxt = f"{iv_name} + ({iv_t}){stages - 1} * {step}"
            if not producer:
                em.line(f"const bool tj_prefetch = {in_range(f'({nxt})')};")
            if ring:
                for load in piped:
                    em.shared[load.result.id].address = rd[load.result.id]
                if interior:
                    inside = [c for load, copy in interior for c in copy.inside(starts_at(load, nxt))]
                    em.line(f"const bool tj_inner = tj_prefetch && tj_inner_ok{''.join(f' && {c}' for c in inside)};"
                            "  // every window wholly inside")
            else:
                em.line(f"const int tj_slot_next = (tj_it + {stages - 1}) % {stages};")
                for load in piped:
                    em.shared[load.result.id].slot = f"(tj_it % {stages})"
            inner_ids = {load.result.id for load, _ in interior}
            for load in per_thread:
                if load.result.id not in inner_ids:
                    copies.append(SharedCopy(em, load, starts_at(load, nxt), "tj_slot_next", "tj_prefetch",
                                             address=wr.get(load.result.id)))
            for copy in copies:  # the prefetch's scalars, ahead of everything
                copy.begin()

            def prefetch() -> None:
                em.line(f"// prefetch iteration +{stages - 1} (placed to overlap the tensor-core math)")
                issue_tma(nxt, "tj_slot_next", "tj_prefetch")
                for load, copy in interior:
                    copy.issue(wr[load.result.id], "tj_inner")
                for copy in copies:
                    copy.fast()
                if not ring:
                    em.line("tj_cp_async_commit();")

            def release_and_refill() -> None:
                if tmem:  # the commit releases the slot; thread 0 refills the one of iteration -1 once it is free
                    em.line(f"// refill iteration -1's slot with iteration +{stages - 1} once its MMAs completed")
                else:
                    em.line(f"// iteration -1's MMAs are complete: release its slot, then refill it with iteration "
                            f"+{stages - 1}")
                    em.open(f"if (tj_it > {'tj_it0' if own_slots else '0'})")
                    em.line("__syncwarp();")
                    em.line(release(em, f"{empty} + 8 * (tj_slot_next)"))
                    em.close()
                issue_tma(nxt, "tj_slot_next", "tj_prefetch", refill=True)

            if in_flight:
                em.async_mma = AsyncMma(in_flight, release_and_refill, f"{empty} + 8 * (tj_it % {stages})")
            elif late is not None:
                late.empty = empty
                if not late.first:
                    em.overlap_hook = late.issue_under_first_gemm
            else:
                # The first gemm of the body emits the prefetch after its first fragment loads; without one,
                # it goes first.
                em.overlap_hook = prefetch
                em.fragment_carry = carry
                if not any(o.kind is OpKind.GEMM for o in body.ops):
                    em.run_overlap_hook()
        for inner in body.ops[:-1]:
            if late is not None and late.skips(inner):
                continue
            RULES[inner.kind](em, inner)
        em.run_overlap_hook()
        if late is not None:
            late.end_iteration()
        for copy in copies:  # windows cp.async cannot copy: element-wise, after this iteration's math
            copy.slow()
        if interior:  # windows not wholly inside: zero fill past the edges, or element by element
            em.open("if (tj_prefetch && !tj_inner)")
            for load, _ in interior:
                em.open("")
                edge = SharedCopy(em, load, starts_at(load, nxt), "tj_slot_next", "true", address=wr[load.result.id])
                edge.begin()
                edge.fast()
                edge.slow()
                em.close()
            em.close()
        if producer and not in_flight and late is None:
            em.line("__syncwarp();  // this warp is done with the iteration's slot: hand it back to the producer")
            em.line(release(em, f"{empty} + 8 * (tj_it % {stages})"))
        if ring:
            # one group per iteration, closed after every copy of the iteration (the edge copies above included)
            em.line("tj_cp_async_commit();")
            for copy in (c for _, c in interior):
                copy.advance()
            for load in piped:  # the slot read now is refilled next; the next one is read
                tile, r, w = em.shared[load.result.id], rd[load.result.id], wr[load.result.id]
                em.line(f"{w} = {r}; {r} = {r} == {tile.origin} + {tile.offset + (stages - 1) * tile.layout.stage_bytes} ? "
                        f"{tile.origin} + {tile.offset} : {r} + {tile.layout.stage_bytes};")
        _assign_yields(em, carried, late.yielded() if late is not None else body.terminator.operands)

    if late is not None:  # the first iteration on its own: it has no previous one's gemm to issue
        em.open(f"if ({in_range(lo)})")
        em.line(f"const {iv_t} {iv_name} = {lo};")
        late.first = True
        iteration()
        late.first = False
        em.line("++tj_it;")
        em.close()
    first = f"{lo} + {step}" if late is not None else lo
    em.open(f"for ({iv_t} {iv_name} = {first}; {in_range(iv_name)}; {incr})")
    iteration()
    em.close()
    if own_slots:
        _group_turn(em, arrive=True)
    if late is not None:
        late.drain()
    if ring:
        for load in piped:
            em.shared[load.result.id].address = None
    em.async_mma = outer_async
    if tmem:  # the accumulators, from tensor memory back into the loop's result registers
        lower_tcgen05.load_accumulators(em, in_flight, carried_names, f"{empty} + 8 * ((tj_it - 1) % {stages})",
                                        f"((tj_it - 1) / {stages}) & 1")
    else:
        for gemm, name in zip(in_flight, carried_names):  # the last iteration's groups
            wait_group(em, 0, name, gemm.result.type.layout.regs, gemm.result.dtype == D.int32)
        if in_flight and own_slots:
            em.open("if (tj_it > tj_it0)")
            em.line("__syncwarp();  // the last iteration's MMAs are complete: release its slot")
            em.line(release(em, f"{empty} + 8 * ((tj_it - 1) % {stages})"))
            em.close()
    if per_thread:  # (TMA loads completed on the ring's barriers: no cp.async group left to wait for)
        em.line("tj_cp_async_wait<0>();")
    if piped and (per_thread or done):  # every thread is done with the ring before its memory is reused (a
        em.barrier()                    # persistent walk keeps it, and its mbarriers order the slots' readers)
    if paired and done:  # the other program's last arrivals on this one's barriers are in before the memory is reused
        em.line("if (tj_ncta > 1) tj_cluster_sync();")
    if tma and done:
        em.line(f"if ({em.leader}) {{ for (int s = 0; s < {nbars}; ++s) tj_mbar_inval({full} + 8 * s); }}"
                "  // before the memory is reused")
    em.close()
    em.overlap_hook = outer_hook
    em.smem_peak = max(em.smem_peak, em.smem_top)
    if done:
        em.smem_top = smem_mark


class Deferred:
    """Emits a warp-specialized loop whose last gemm is issued one iteration late (``passes.pipeline.deferred_gemm``,
    FlashAttention-3's intra-warpgroup overlap). Iteration ``j``: wait for slot ``j``; issue the first gemm; issue
    iteration ``j - 1``'s last gemm (its ring tiles still in slot ``j - 1``, its A operand packed when ``j - 1``
    made it); wait for the first gemm alone (one group left); the math up to the first read of the gemm's
    accumulator runs while it works; then wait for it and hand slot ``j - 1`` back. The body yields what the gemm
    would have accumulated into (``acc * alpha``): the next iteration's issue adds ``p @ v`` to it in place. After
    the loop, the last iteration's gemm is issued and waited for, and its slot handed back.

    The first iteration is emitted on its own, before the loop (``first``): it has no gemm of a previous one to
    issue. Issued under a condition instead, the gemm would reach its accumulator's readers on a path without
    its wait, and ptxas then serializes every wgmma of the kernel (C7514)."""

    def __init__(self, em: Emitter, body, stages: int) -> None:
        self.em, self.body, self.stages = em, body, stages
        self.gemm = deferred_gemm(body)
        assert self.gemm is not None, "defer_mma set on a loop deferred_gemm does not take"
        yields = body.terminator.operands
        self.into = body.args[1:][next(j for j, y in enumerate(yields) if y is self.gemm.result)]
        a = self.gemm.operands[0]
        owners = {r.id for o in body.ops for r in o.results if not (o.kind is OpKind.LOAD and o.attrs.pipeline)}
        self.packed = a if a.id in owners else None  # made in the body: carried packed to the next iteration
        self.ring = {o.result.id for o in body.ops if o.kind is OpKind.LOAD and o.attrs.pipeline}
        self.empty = ""
        self.settled = False
        self.first = False  # emitting the first iteration (before the loop)

    @property
    def previous_slot(self) -> str:
        return f"((tj_it + {self.stages - 1}) % {self.stages})"

    def declare(self) -> None:
        em = self.em
        em.line("bool tj_pend = false;  // the previous iteration's last gemm is still to issue (deferred)")
        if self.packed is not None:
            em.line(f"unsigned tj_pp[{self.packed.type.layout.regs // 2}];  // its A fragment, packed")

    def skips(self, op: Op) -> bool:
        """Emit nothing for the deferred gemm in its own iteration; wait for the previous one's before the first
        op that reads its accumulator."""
        if op is self.gemm:
            return True
        if not self.settled and not self.first and reads(op, self.into):
            self.settle()
        return False

    def issue(self) -> None:
        """The deferred gemm of the previous iteration, accumulating into the loop-carried registers in place."""
        em, gemm = self.em, self.gemm
        acc = gemm.operands[2]
        slots = {v.id: em.shared[v.id].slot for v in gemm.operands[:2] if v.id in self.ring}
        names = {v.id: em.names.get(v.id) for v in (acc, gemm.result)}
        for v in gemm.operands[:2]:
            if v.id in slots:
                em.shared[v.id].slot = self.previous_slot
        em.alias(acc, em.name(self.into))
        if self.packed is not None:
            em.packed_a[self.packed.id] = "tj_pp"
        outer, em.async_mma = em.async_mma, AsyncMma([gemm], lambda: None, settle=False)
        RULES[OpKind.GEMM](em, gemm)
        em.async_mma = outer
        em.packed_a.pop(getattr(self.packed, "id", None), None)
        for vid, name in names.items():
            if name is None:
                em.names.pop(vid, None)
            else:
                em.names[vid] = name
        for vid, slot in slots.items():
            em.shared[vid].slot = slot

    def issue_under_first_gemm(self) -> int:
        """The overlap hook of the first gemm: returns the groups it leaves pending behind that gemm's (1)."""
        self.em.line("// the previous iteration's last gemm, issued under this iteration's math")
        self.issue()
        return 1

    def _wait_and_release(self) -> None:
        em = self.em
        layout = self.into.type.layout
        wait_group(em, 0, em.name(self.into), layout.regs, self.into.dtype == D.int32)
        em.line("__syncwarp();  // and this warp is done with its slot: hand it back to the producer")
        em.line(release(em, f"{self.empty} + 8 * {self.previous_slot}"))

    def settle(self) -> None:
        em = self.em
        em.run_overlap_hook()  # no gemm took it (the first gemm lowered otherwise): issue here, no overlap
        em.line("// the previous iteration's last gemm is complete: its accumulator is read next")
        self._wait_and_release()
        self.settled = True

    def end_iteration(self) -> None:
        """Settle if nothing read the accumulator; pack this iteration's A operand for the next one's issue."""
        if not self.settled and not self.first:
            self.settle()
        if self.packed is not None:
            pack_a(self.em, self.packed, "tj_pp")
        self.em.line("tj_pend = true;")
        self.settled = False

    def yielded(self) -> list[Value]:
        return [self.gemm.operands[2] if y is self.gemm.result else y for y in self.body.terminator.operands]

    def drain(self) -> None:
        em = self.em
        em.open("if (tj_pend)")
        em.line("// the last iteration's deferred gemm")
        self.issue()
        self._wait_and_release()
        em.close()


# setmaxnreg (PTX 9.7.17.1): registers per thread after the split, a multiple of 8 in 24..256. The producer keeps
# few; the math warps take what the register file then holds (65,536 per SM, one block per SM).
_PRODUCER_REGISTERS = 40
_REGISTER_FILE = 65536

SETMAXNREG = r"""
/// Give back or take registers, per thread of the warpgroup (PTX 9.7.17.1, setmaxnreg; sm_90a).
template <int N> TJ_DEVICE void tj_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
template <int N> TJ_DEVICE void tj_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
"""


def consumer_registers(consumers: int, producers: int) -> int:
    """Registers per math thread once the producer warpgroup has given its back (a multiple of 8, <= 256)."""
    return min(256, (_REGISTER_FILE - producers * _PRODUCER_REGISTERS) // consumers // 8 * 8)


def _producer(em: Emitter, op: Op, tma: list[Op], stages: int, tma_bytes: int, full: str, empty: str,
              maps: dict[int, str], starts_at, in_range, per_program: Callable[[], None] | None = None,
              multicast: list[tuple[Op, list[Value]]] = ()) -> None:
    """The producer warpgroup's part of a warp-specialized loop, then the math warps' register grant. Set up at
    the kernel's start (``per_program`` given), the producer first computes what its loop needs (``per_program``);
    in a persistent kernel it walks the same programs as the math warps, doing so for each program."""
    lo, step = em.name(op.operands[0]), em.name(op.operands[2])
    iv_t = c_type(op.regions[0].args[0].dtype)
    consumers = em.groups * em.target.threads
    em.require_support("setmaxnreg", SETMAXNREG)
    em.line(f"// warp specialization: threads {consumers}..{consumers + PRODUCER_THREADS - 1} (the producer "
            f"warpgroup) fill the {stages}-slot ring; the {em.target.num_warps} warps before them do the math")
    em.open(f"if (tid >= {consumers})")
    em.line(f"tj_setmaxnreg_dec<{_PRODUCER_REGISTERS}>();")
    em.open(f"if (tid == {consumers})")
    em.line("int tj_pit = 0;")
    walk = per_program is not None and em.fn.attrs.get("persistent")
    if walk:
        _open_walk(em)
    if per_program is not None:
        per_program()
    flags = _pair_flags(em, op, multicast) if multicast else {}
    em.line("#pragma unroll 1")
    em.open(f"for ({iv_t} tj_piv = {lo}; {in_range('tj_piv')}; tj_piv += {step}, ++tj_pit)")
    em.line(f"const int tj_pslot = tj_pit % {stages};")
    em.line(f"if (tj_pit >= {stages}) tj_mbar_wait({empty} + 8 * tj_pslot, (tj_pit / {stages} - 1) & 1);"
            "  // the math released the slot" + (" (in both programs of a cluster)" if em.fn.attrs.get("cluster") else ""))
    bar = f"{full} + 8 * tj_pslot"
    em.line(f"tj_mbar_expect_tx({bar}, {tma_bytes});")
    for o in tma:
        lower_tma.tma_issue(em, o, em.shared[o.result.id], starts_at(o, "tj_piv"), "tj_pslot", bar,
                            maps[o.result.id], multicast=flags.get(o.result.id, ""))
    em.close()
    if walk:
        em.close()
    em.close()
    em.line("return;  // the producer's part of the kernel ends with the loop")
    em.close()
    em.line(f"tj_setmaxnreg_inc<{consumer_registers(consumers, PRODUCER_THREADS)}>();")
    em.consumers_only()


def _pair_flags(em: Emitter, loop: Op, multicast: list[tuple[Op, list[Value]]]) -> dict[int, str]:
    """For the producer, per program: the C condition under which each load of ``multicast`` (``multicast_loads``)
    is loaded once for both programs of the cluster. A load whose window depends on ``T.program_id(0)`` compares
    the values it depends on with the other program's, computed here again in a nested scope for that program
    (``tj_prog ^ 1`` in a persistent walk, ``blockIdx.x ^ 1`` otherwise); equality is symmetric, so both programs
    decide alike."""
    flags = {o.result.id: "tj_ncta > 1" for o, compared in multicast if not compared}
    checked = [(o, compared) for o, compared in multicast if compared]
    if not checked:
        return flags
    values = list({v.id: v for _, compared in checked for v in compared}.values())
    mine = {v.id: f"tj_mine{i}" for i, v in enumerate(values)}
    em.line("// the tiles whose windows the other program of the cluster loads alike: compared with its values")
    for v in values:
        em.line(f"const {c_type(v.dtype)} {mine[v.id]} = {em.name(v)};")
    for o, _ in checked:
        flags[o.result.id] = em.fresh("tj_mc")
        em.line(f"bool {flags[o.result.id]} = tj_ncta > 1;")
    em.open("if (tj_ncta > 1)")
    persistent = em.fn.attrs.get("persistent")
    if persistent:
        _as_program(em, "tj_prog ^ 1", "  // the other program of the pair walks its neighbour")
    em.partner_x = not persistent
    em.emit_ops(compared_slice(em.fn, loop, values))
    em.partner_x = False
    for o, compared in checked:
        flag = flags[o.result.id]
        em.line(f"{flag} = " + " && ".join(f"{mine[v.id]} == {em.name(v)}" for v in compared) + ";")
    if persistent:
        em.close()
    em.close()
    return flags


def _program_walk(em: Emitter, groups: int = 1) -> str:
    """The header of a persistent program's loop over the grid's programs (``tj_pid0..2`` are set inside by
    ``_program_ids``): program p < P runs programs p, p + P, p + 2P, ... in the grid's linear order. With
    ``groups`` (a pingpong kernel's math warps), group g runs the g-th of every ``groups`` of them."""
    programs = em.fn.attrs["persistent"]
    if groups == 1:
        return f"for (long long tj_prog = tj_first; tj_prog < tj_nprogs; tj_prog += {programs})"
    return (f"for (long long tj_prog = tj_first + (long long)tj_group * {programs}; tj_prog < tj_nprogs; "
            f"tj_prog += {groups * programs})")


def _open_walk(em: Emitter, groups: int = 1) -> None:
    """Open a persistent program's loop over its work (``_program_walk``), or a stream-K program's: its whole
    tiles of the first waves (``tj_prog``), then its run of the last waves' K iterations, as the part of one tile
    after another it covers (iterations ``tj_sk_k0`` to ``tj_sk_k1`` of tile ``tj_prog``; ``_stream_k_schedule``)."""
    if not em.fn.attrs.get("stream_k"):
        em.open(_program_walk(em, groups))
        return
    programs = em.fn.attrs["persistent"]
    # (computed by each side of the producer split: values live across setmaxnreg would be spilled)
    _stream_k_schedule(em, next(o for o in em.fn.body.ops if o.kind is OpKind.FOR and o.attrs.producer_warpgroup))
    em.line("long long tj_w = tj_first;")
    em.line("int tj_sk_it = tj_sk_begin;")
    em.open("while (tj_w < tj_sk_dp || tj_sk_it < tj_sk_end)")
    em.line("long long tj_prog = tj_w;  // a whole tile of the first waves")
    em.line("int tj_sk_k0 = 0, tj_sk_k1 = tj_sk_units;")
    em.open("if (tj_w < tj_sk_dp)")
    em.line(f"tj_w += {programs};")
    em.close()
    em.open("else")
    em.line("// the next part of this program's run of the last waves' iterations")
    em.line("const int tj_tile = tj_sk_it / tj_sk_units;")
    em.line("tj_prog = tj_sk_dp + tj_tile;")
    em.line("tj_sk_k0 = tj_sk_it - tj_tile * tj_sk_units;")
    em.line("tj_sk_k1 = min(tj_sk_units, tj_sk_k0 + (tj_sk_end - tj_sk_it));")
    em.line("tj_sk_it += tj_sk_k1 - tj_sk_k0;")
    em.close()


def _stream_k_schedule(em: Emitter, loop: Op) -> None:
    """A stream-K kernel's work split (passes/split_k.stream_k), computed alike by every thread at the kernel's
    start: with T tiles of U iterations each and P programs, the first T - S tiles run whole (S = T mod P, the
    last wave's), program p taking tiles p, p + P, ...; the last S * U iterations are cut into P runs as equal as
    integers allow, program p's from ``tj_sk_begin`` to ``tj_sk_end`` (counted over those tiles' iterations).
    Measured on an H200: cutting one more wave (T mod P + P tiles) was slower at every shape tried, since runs
    that start at different K offsets share less of A and B in L2, and each cut tile costs a workspace round
    trip. U is the K loop's trip count, the same in every tile (the pass checked), computed here
    from the loop's own bounds as program 0 would."""
    programs = em.fn.attrs["persistent"]
    bound = next(o for o in em.fn.body.ops if o.kind is OpKind.STREAM_K_BOUND)
    lo, hi, step = bound.operands
    em.line("int tj_sk_units;  // the K loop's iterations per tile")
    em.open("")
    em.line("const long long tj_prog = 0;")
    _program_ids(em)
    em.emit_ops(compared_slice(em.fn, loop, [lo, hi, step]))
    x, s = em.name(lo), em.name(step)
    em.line(f"tj_sk_units = {em.name(hi)} > {x} ? (int)(({em.name(hi)} - {x} + {s} - 1) / {s}) : 0;")
    em.close()
    em.line("if (tj_sk_units < 1) tj_sk_units = 1;  // a loop of no iterations: one empty run per tile, whole")
    em.line(f"const int tj_sk_tiles = (int)(tj_nprogs % {programs});  // the last wave's tiles, cut into runs")
    em.line("const long long tj_sk_dp = tj_nprogs - tj_sk_tiles;  // the tiles run whole, first")
    em.line("// this program's run: iterations tj_sk_begin to tj_sk_end of the last tj_sk_tiles tiles' tj_sk_total")
    em.line("const int tj_sk_total = tj_sk_tiles * tj_sk_units;")
    em.require_support("stream_k", STREAM_K_SUPPORT)
    em.line(f"const int tj_sk_begin = tj_sk_run_start(tj_first, tj_sk_total, {programs});")
    em.line(f"const int tj_sk_end = tj_sk_run_start(tj_first + 1, tj_sk_total, {programs});")


STREAM_K_SUPPORT = r"""
/// Where stream-K program p's run starts among the last wave's `total` iterations: `programs` runs as equal as
/// integers allow, program p + 1's start being p's end (lower_loops._stream_k_schedule, the fix-up's readers).
TJ_DEVICE int tj_sk_run_start(long long p, int total, int programs) { return (int)(p * total / programs); }
"""


def _grid_dim(em: Emitter, axis: int) -> str:
    """The user's grid extent along ``axis``: a stream-K kernel is launched with one program per SM and is told
    the grid it stands for (``tj_grid0..2``)."""
    return f"tj_grid{axis}" if em.fn.attrs.get("stream_k") else f"gridDim.{'xyz'[axis]}"


def _program_ids(em: Emitter) -> None:
    g0, g1 = _grid_dim(em, 0), _grid_dim(em, 1)
    em.line(f"const int32_t tj_pid0 = (int32_t)(tj_prog % {g0});")
    em.line(f"const int32_t tj_pid1 = (int32_t)((tj_prog / {g0}) % {g1});")
    em.line(f"const int32_t tj_pid2 = (int32_t)(tj_prog / ((long long){g0} * {g1}));")
    em.line("(void)tj_pid0; (void)tj_pid1; (void)tj_pid2;")


def _as_program(em: Emitter, other: str, comment: str = "") -> None:
    """Open a scope in which the walk's ``tj_prog`` and the program ids are those of program ``other`` (a C
    expression of the current ``tj_prog``); the caller emits what it computes for that program and closes it."""
    em.line(f"const long long tj_other = {other};{comment}")
    em.open("")
    em.line("const long long tj_prog = tj_other;")
    _program_ids(em)


def _skip_other_groups(em: Emitter, loop: Op) -> None:
    """In a pingpong kernel's walk, before a group runs program ``tj_prog``: count into ``tj_it`` the ring slots
    the producer filled for the programs of the other groups since this group's last one (the walk's programs
    ``tj_prog - j * P``, j = 1 .. groups - 1, from the first on). Their bounds are computed again here for
    each (``bounds_slice``: scalar math, from their program ids)."""
    programs = em.fn.attrs["persistent"]
    lo, hi, step = loop.operands[:3]
    iv_t = c_type(loop.regions[0].args[0].dtype)
    em.line("// the ring slots the other group's programs took since this group's last one")
    for j in range(1, em.groups):
        em.open(f"if (tj_prog - {j * programs} >= tj_first)")
        _as_program(em, f"tj_prog - {j * programs}")
        em.emit_ops(bounds_slice(em.fn, loop))
        x, s = em.name(lo), em.name(step)
        if _positive_constant(step):
            em.line(f"if ({em.name(hi)} > {x}) tj_it += (int)(({em.name(hi)} - {x} + {s} - 1) / {s});")
        else:
            em.line(f"for ({iv_t} tj_x = {x}; {_in_range('tj_x', em.name(hi), s, False)}; tj_x += {s}) ++tj_it;")
        em.close()
        em.close()


def _group_turn(em: Emitter, arrive: bool) -> None:
    """A pingpong group's main loops take turns in the walk's order (named barrier ``1 + groups + g``: group g's
    turn). The wait: a ring slot's mbarrier tells phases apart by parity alone, so a group may wait for its first
    slot only once every earlier one has been waited for, by the group of the previous program. The arrival,
    after the loop's last wait for a slot (its MMAs may still run): the next program's group may start, if the
    walk has a next program (a barrier left half-arrived would be another launch's problem)."""
    programs, groups = em.fn.attrs["persistent"], em.groups
    count = groups * em.target.threads
    if arrive:
        em.line(f'if (tj_prog + {programs} < tj_nprogs) asm volatile("bar.arrive %0, {count};" :: '
                f'"r"({1 + groups} + (tj_group + 1) % {groups}) : "memory");  // the next program\'s group: its turn')
    else:
        em.line(f'if (tj_prog != tj_first) asm volatile("bar.sync %0, {count};" :: "r"({1 + groups} + tj_group) : '
                '"memory");  // this group\'s turn: the previous program\'s group has waited for all its slots')


def _in_range(x: str, hi: str, step: str, positive: bool) -> str:
    """Whether induction value ``x`` is still inside a loop to ``hi`` by ``step`` (of either sign, unless
    ``positive``)."""
    return f"({x} < {hi})" if positive else f"(({step}) > 0 ? {x} < {hi} : {x} > {hi})"


def emit_specialized(em: Emitter) -> None:
    """The body of a kernel whose warp-specialized loop is set up at the kernel's start: a persistent kernel
    (``fn.attrs["persistent"]`` = P programs, one per SM), or one whose producer splits off first
    (``fn.attrs["producer_first"]``: something before the loop needs memory; passes/pipeline.specialize_warps).

    Persistent: the grid is launched as the user gave it; programs P and above leave at once (the hardware starts
    them once the first P finish, so they cost a moment at the end), and program p < P runs the grid's programs
    p, p + P, ... in turn, with ``T.program_id`` / ``T.num_programs`` meaning what they mean in a normal launch.
    The loop's ring and producer are set up once, before the walk: the producer runs every program's K loop back
    to back, so it fills the ring for the next program while the math warps run this one's epilogue. The ring's
    slot count runs on across programs. What precedes the loop is emitted twice (it computes scalars and
    registers only): in the producer's walk and in the math warps'.

    Producer first: the ring is set up and the producer leaves with only the scalars its loop needs
    (``producer_slice``, emitted in its branch); the math warps then run everything before the loop (with the
    named barrier of the math warps), the loop's math part and the rest.

    Pingpong (``fn.attrs["groups"]``, persistent): the walk is the producer's, and its programs are dealt to the
    groups of math warps in turn. Each group runs its own with its own shared memory (``Emitter.group_shared``)
    and barriers, and skips the ring slots of the others' (``_skip_other_groups``). The producer, filling the
    slots in the walk's order, staggers them: a group's main loop starts as the previous one's ends, and its
    epilogue runs under the next group's main loop."""
    ops = em.fn.body.ops
    at = next(i for i, o in enumerate(ops) if o.kind is OpKind.FOR and o.attrs.producer_warpgroup)
    before, loop, after = ops[:at], ops[at], ops[at + 1:]
    programs = em.fn.attrs.get("persistent")
    if programs:
        if em.fn.attrs.get("stream_k"):
            em.line(f"// stream-K: launched as {programs} programs (one per SM) that share out the work of the grid "
                    "tj_grid0 x tj_grid1 x tj_grid2")
            em.line("const long long tj_nprogs = (long long)tj_grid0 * tj_grid1 * tj_grid2;")
            em.line("const long long tj_first = blockIdx.x;")
        else:
            em.line(f"// persistent: programs 0..{programs - 1} (one per SM) run the grid's programs in turn; the "
                    "others leave at once")
            em.line("const long long tj_nprogs = (long long)gridDim.x * gridDim.y * gridDim.z;")
            em.line("const long long tj_first = blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)"
                    "gridDim.y * blockIdx.z);")
            em.line(f"if (tj_first >= {programs}) return;")

        def per_program() -> None:  # what precedes the loop, for the producer's walk and the math warps' alike
            _program_ids(em)
            em.emit_ops(before)
    else:
        needed = producer_slice(em.fn, loop)

        def per_program() -> None:  # the producer's scalars (the math warps run all of `before` below)
            em.emit_ops(needed)

    em.per_program, em.ring_phase = per_program, "prelude"
    RULES[OpKind.FOR](em, loop)
    em.ring_phase = "consumer"
    if programs:
        em.group_shared(True)
        _open_walk(em, em.groups)
        if em.groups > 1:
            _skip_other_groups(em, loop)
        per_program()
    else:
        em.emit_ops(before)
    RULES[OpKind.FOR](em, loop)
    em.emit_ops(after)
    if programs:
        em.barrier("this program's shared memory (the epilogue's) is free for the next one")
        em.close()
        if em.store_reads_pending:  # (lower_tma.emit_store)
            em.line("if (tid == 0) tj_bulk_wait_read0();  // the shared memory stays valid until the last TMA store "
                    "has read it")
            em.store_reads_pending = False
        em.group_shared(False)
        if em.fn.attrs.get("cluster"):
            em.line("if (tj_ncta > 1) tj_cluster_sync();  // the other program's last arrivals here are in")
    em.per_program = em.ring_phase = None


SPECIALIZED_BODY.append(emit_specialized)


@emits(OpKind.WHILE)
def _while(em: Emitter, op: Op) -> None:
    """``while (true) { condition; if (!cond) break; body; carried = yields; }`` over scalar variables."""
    cond_block, body = op.regions
    outer_hook, em.overlap_hook = em.overlap_hook, None  # an enclosing loop's prefetch stays outside
    for arg, init, twin, res in zip(cond_block.args, op.operands, body.args, op.results):
        name = declare_var(em, arg)
        assign_value(em, name, init)
        em.alias(twin, name)
        em.alias(res, name)
    em.open("while (true)")
    for inner in cond_block.ops[:-1]:
        RULES[inner.kind](em, inner)
    em.line(f"if (!({em.name(cond_block.terminator.operands[0])})) break;")
    for inner in body.ops[:-1]:
        RULES[inner.kind](em, inner)
    _assign_yields(em, body.args, body.terminator.operands)
    em.close()
    em.overlap_hook = outer_hook


def _assign_yields(em: Emitter, carried: list[Value], yielded: list[Value]) -> None:
    """carried = yielded, safe when a yielded value is itself a carried variable (swaps)."""
    carried_names = {em.name(a) for a in carried}
    staged = []
    for arg, y in zip(carried, yielded):  # first copy out every carried value that is read
        if em.name(y) in carried_names and em.name(y) != em.name(arg):
            tmp = em.fresh("tj_swap")
            declare_var_named(em, y, tmp)
            assign_value(em, tmp, y)
            staged.append((arg, tmp, y))
    for arg, y in zip(carried, yielded):
        if not any(a is arg for a, _, _ in staged):
            assign_value(em, em.name(arg), y)
    for arg, tmp, y in staged:
        if y.is_tile:
            em.reg_loop(y.type.layout, lambda i, t=tmp, a=em.name(arg): em.line(f"{a}[{i}] = {t}[{i}];"))
        else:
            em.line(f"{em.name(arg)} = {tmp};")


def declare_var_named(em: Emitter, v: Value, name: str) -> None:
    if v.is_tile:
        em.line(f"alignas(16) {c_type(v.dtype)} {name}[{v.type.layout.regs}];")
    else:
        em.line(f"{c_type(v.dtype)} {name};")
