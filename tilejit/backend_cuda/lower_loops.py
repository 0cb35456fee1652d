"""``for`` loops, including the software-pipelined form of ``T.range(..., stages=S)``.

Pipelined shared loads (marked by ``passes/software_pipeline.py``) are issued ``S - 1`` iterations ahead into a
ring of ``S`` shared buffers with cp.async; one commit group per iteration (empty groups included) keeps
the group count aligned with the iteration count, so ``cp.async.wait_group S-2`` at the top of iteration
``k`` guarantees that iteration ``k``'s tiles have landed (PTX 9.7.9.25.3).

TMA loads complete on a "full" mbarrier per ring slot. When the ring tiles are read by wgmma alone and
those gemms accumulate into loop-carried values (a GEMM main loop), the gemms stay in flight across
iterations (``wgmma.wait_group`` leaves this iteration's groups pending) and the slot of iteration
``k - 1`` is handed back through an "empty" mbarrier (one arrival per warp, after its wait) instead of a
block-wide barrier; thread 0 waits on it before refilling the slot with iteration ``k + S - 1``.

A warp-specialized loop (``ForAttrs.producer_warpgroup``, sm_90a) has its refills issued by a producer warpgroup
(``lower_specialized.emit_producer``); the ``num_warps`` warps run the loop here, waiting only for loaded slots and
handing each back on its "empty" mbarrier, and may issue the body's last gemm one iteration late (``Deferred``).

``_for`` emits a loop in the named steps of ``LoopEmission``: the TMA ring's barriers, the producer or the
prefetch of the first iterations, the cp.async ring's slot addresses, each iteration (wait for its tiles, arm the
prefetch, the body, the end of the iteration), and the drain after the loop.

A cp.async ring (the sm_80 main loop) whose one gemm runs on mma.sync carries its fragments across iterations
(``FragmentCarry``): the wait for iteration ``k + 1``'s tiles and the block-wide barrier move from the top of
iteration ``k + 1`` to just before the mma.sync of iteration ``k``'s last k step, whose operands are already in
registers, and the first k step's fragments of iteration ``k + 1`` load while those mma.sync run. The barrier no
longer stands between a warp's last mma.sync of one iteration and its first of the next. The ring then waits with
``wait_group S-3`` (the group of the iteration in progress is committed at its end), so it needs S >= 3. Measured
on an H200 on 2026-11-26 (benchmarks/history/investigations.md, "The sm_80 path run whole"): +4-23% where every
copy moves whole 16-byte chunks; where a tensor's rows are not 16-byte multiples the copies go element by element after the math, and only the last k
step's mma.sync were left to hide them (-47%), so those loops do not carry; nor do loops fed by TMA (mma.sync
pinned on sm_90a), where it measured from +5% to -10%.
"""
from __future__ import annotations

from ..ir import BinaryOp, Op, OpKind, Value
from ..ir.rewrite import reads, use_counts
from .. import dtypes as D
from .. import knobs
from ..target import REGISTRY
from ..passes.copies import load_spec
from ..passes.software_pipeline import in_flight_gemms
from ..passes.warp_specialize import deferred_gemm, multicast_loads
from .emitter import (RULES, AsyncMma, Emitter, assign_value, c_type, declare_var, emits, in_range,
                      is_positive_constant, scalar_expr)
from . import lower_tcgen05, lower_tma
from .carried_loads import CarriedLoad, carried_loads
from .lower_specialized import emit_producer, group_turn, release
from .lower_wgmma import wait_group
from .lower_wgmma_rs import pack_a, packed_words
from .lower_memory import InteriorCopy, SharedCopy, issue_shared_load, stage_shared



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
    return (gemm, payload) if payload.carries(gemm) else None


@emits(OpKind.FOR)
def _for(em: Emitter, op: Op) -> None:
    """A ``for`` loop in the steps of ``LoopEmission``: its scope and TMA ring, the producer warpgroup or the
    prefetch of the first iterations, the cp.async ring's rotating addresses, the loop, then the drain."""
    loop = LoopEmission(em, op)
    if op.attrs.peeled and loop.phase != "consumer":
        em.comment(op, f"peeled loop ({op.attrs.peeled}): "
                   + ("the iterations whose masks are all true, unmasked" if op.attrs.peeled == "unmasked"
                      else "the iterations whose masks are not all true"))
    loop.open()
    if loop.producer:
        if loop.phase != "consumer":  # (a persistent loop's consumer part finds the ring and producer set up)
            loop.split_off_producer()
        if loop.phase == "prelude":  # the math part comes inside the walk over programs; the ring's count spans it
            loop.end_prelude()
            return
    elif loop.piped:
        loop.prefetch_first_iterations()
    if loop.ring:
        loop.set_up_cp_async_ring()
    loop.start()
    loop.carry_loads()
    loop.run()
    loop.drain()


class LoopEmission:
    """The emission of one ``for`` op, in the steps ``_for`` calls. What the steps share is read off the op here:
    its pipelined loads (``tma``: filled by TMA, on mbarriers; ``per_thread``: by cp.async groups), the gemms left
    in flight, whether a producer warpgroup fills the ring, and a specialized loop's ``phase`` (set up at the
    kernel's start, it comes here twice: ``emit_specialized``'s "prelude", then "consumer")."""

    def __init__(self, em: Emitter, op: Op) -> None:
        self.em, self.op = em, op
        self.lo, self.hi, self.step = (em.name(v) for v in op.operands[:3])
        self.body = body = op.regions[0]
        self.iv, self.carried = body.args[0], body.args[1:]
        self.iv_t = c_type(self.iv.dtype)
        self.phase = em.ring_phase if op.attrs.producer_warpgroup else None
        self.positive = is_positive_constant(op.operands[2])
        self.piped = [o for o in body.ops if o.kind is OpKind.LOAD and o.attrs.pipeline]
        self.stages = stages = op.attrs.stages or 1
        self.body_ops = {r.id: o for o in body.ops for r in o.results}
        self.tma = [o for o in self.piped if o.attrs.copy == "tma_bulk_tensor"]
        self.per_thread = [o for o in self.piped if o not in self.tma]
        self.in_flight = in_flight_gemms(body) if op.attrs.async_mma else []
        # tcgen05: thread 0 issues the MMAs and commits them to the slot's "empty" barrier (one arrival); the
        # accumulators live in tensor memory for the whole loop
        self.tmem = op.attrs.async_mma == "tcgen05"
        self.producer = bool(op.attrs.producer_warpgroup) and bool(self.tma) and not self.per_thread
        self.late = Deferred(em, body, stages) if op.attrs.defer_mma and self.producer and not self.in_flight \
            else None
        # a cluster's two programs fill each other's slots with the tiles they share (TMA multicast)
        self.paired = self.producer and bool(em.fn.attrs.get("cluster"))
        self.multicast = multicast_loads(em.fn, op) if self.paired else []
        # cp.async rings (no TMA in the loop): the shared addresses of each ring's slots read and refilled live in
        # variables rotated by a constant per iteration, and windows wholly inside their tensor take InteriorCopy
        self.ring = bool(self.piped) and not self.tma
        self.rd: dict[int, str] = {}
        self.wr: dict[int, str] = {}
        self.interior: list[tuple[Op, InteriorCopy]] = []
        # the TMA ring's mbarriers ("full": loaded; "empty": released), bytes per slot and tensor maps
        self.full = self.empty = ""
        self.tma_bytes = self.nbars = 0
        self.maps: dict[int, str] = {}
        self.carry: FragmentCarry | None = None
        self.own_slots = False
        self.iv_name = self.nxt = ""
        self.carried_loads: list[CarriedLoad] = []
        # set by open(): the in-flight gemms' result names, what an enclosing loop had set, whether the ring is
        # given back after the loop, and the shared memory it gives back to
        self.carried_names: list[str] = []
        self.outer_hook = self.outer_async = None
        self.done = False
        self.smem_mark = 0
        self.outer_reads_pending = False  # bulk reductions before the loop not yet waited for (lower_tma.emit_store)

    def in_loop(self, x: str) -> str:
        """The loop's test: whether induction value ``x`` is still inside it."""
        return in_range(x, self.hi, self.step, self.positive)

    def starts_at(self, load: Op, iv_expr: str) -> list[str]:
        """The C expressions of ``load``'s window start at induction value ``iv_expr``."""
        return [_rematerialize(self.em, v, self.body_ops, self.iv.id, iv_expr) for v in load.operands[1:]]

    def open(self) -> None:
        """Declare the carried variables, open the loop's scope, and set up its TMA ring (or find it set up)."""
        em, op = self.em, self.op
        # Loop-carried values live in variables declared before the loop; the results are those variables.
        for arg, init, res in zip(self.carried, op.operands[3:], op.results) if self.phase != "prelude" else ():
            name = declare_var(em, arg)
            assign_value(em, name, init)
            em.alias(res, name)
        yielded = self.body.terminator.operands
        self.carried_names = [em.name(op.results[next(j for j, y in enumerate(yielded) if y is g.result)])
                              for g in self.in_flight]
        # An enclosing loop's prefetch waits for the enclosing body's first gemm, not for one inside this loop.
        self.outer_hook, em.overlap_hook = em.overlap_hook, None
        self.outer_async, em.async_mma = em.async_mma, None
        # A persistent kernel's ring stays: the next program's loads land while this one finishes. Otherwise the
        # ring (a producer's too: its last loads have been consumed) is given back for what follows, e.g. a second
        # loop.
        self.done = self.phase is None or self.phase == "consumer" and not em.fn.attrs.get("persistent")
        # The shared tiles (and mbarriers) made inside the loop die with it: a later loop reuses their memory.
        self.smem_mark = em.smem_top
        if self.phase != "prelude":  # the prelude's names (the ring's iteration count) serve the walk over programs
            em.open("")
            self.outer_reads_pending, em.bulk_reads_pending = em.bulk_reads_pending, False
        if self.phase == "consumer":
            self.full, self.empty, self.tma_bytes, self.maps, self.nbars, self.smem_mark = em.rings[id(op)]
        elif self.tma:
            self._set_up_tma_ring()

    def _set_up_tma_ring(self) -> None:
        """The ring's mbarriers, initialized: "full" per slot, and "empty" where the math hands slots back."""
        em, stages, tma = self.em, self.stages, self.tma
        em.require_header("tma")
        released = bool(self.in_flight) or self.producer  # the math warps hand slots back on "empty" mbarriers
        self.nbars = 2 * stages if released else stages
        bars = em.allocate_shared(8 * self.nbars, 8)
        full = self.full = f"{em.smem_origin} + {bars}"
        empty = self.empty = f"{em.smem_origin} + {bars + 8 * stages}"
        self.tma_bytes = sum(stage_shared(em, o.result).layout.stage_bytes for o in tma)
        self.maps = {o.result.id: em.tensor_map_param(lower_tma.TensorMapSpec(
            o.operands[0].name, lower_tma.box_of(o, stage_shared(em, o.result).layout), o.result.dtype.itemsize))
            for o in tma}
        em.line(f"// one mbarrier per ring slot: the bulk tensor copies of an iteration complete {self.tma_bytes} "
                "bytes on it")
        em.line(f"if ({em.leader}) {{ for (int s = 0; s < {stages}; ++s) tj_mbar_init({full} + 8 * s, 1); }}")
        if released:
            arrivals = 1 if self.tmem else em.target.num_warps
            em.line(f"// and one per slot that {'the MMA commit' if self.tmem else 'every warp'} arrives on once the "
                    f"MMAs have read the slot ({arrivals} arrival(s)"
                    + (", from each program of the cluster)" if self.paired else ")"))
            count = f"{arrivals} * tj_ncta" if self.paired else f"{arrivals}"
            em.line(f"if ({em.leader}) {{ for (int s = 0; s < {stages}; ++s) tj_mbar_init({empty} + 8 * s, {count}); "
                    "}")
            if self.tmem:
                lower_tcgen05.store_accumulators(em, self.in_flight, self.carried_names)
        em.line("tj_fence_proxy_async();")
        em.barrier()
        if self.paired:
            em.require_header("cluster_ring")
            em.line("if (tj_ncta > 1) tj_cluster_sync_init();  // the barriers, initialized in both programs")
        em.rings[id(self.op)] = (full, empty, self.tma_bytes, self.maps, self.nbars, self.smem_mark)

    def issue_tma(self, at: str, slot: str, guard: str, refill: bool = False) -> None:
        """Thread 0 loads the ring's TMA tiles of iteration ``at`` into ``slot`` (none when a producer does)."""
        if not self.tma or self.producer:
            return
        em = self.em
        em.open(f"if (tid == 0 && ({guard}))")
        if refill:  # the slot's previous iteration (k - 1) must have been released by every warp
            em.line(f"if (tj_it > 0) tj_mbar_wait({self.empty} + 8 * ({slot}), ((tj_it - 1) / {self.stages}) & 1);")
        bar = f"{self.full} + 8 * ({slot})"
        em.line(f"tj_mbar_expect_tx({bar}, {self.tma_bytes});")
        for o in self.tma:
            lower_tma.tma_issue(em, o, em.shared[o.result.id], self.starts_at(o, at), slot, bar,
                                self.maps[o.result.id])
        em.close()

    def split_off_producer(self) -> None:
        """The ring's shared tiles, then the producer warpgroup's part (``lower_specialized.emit_producer``)."""
        for load in self.piped:
            stage_shared(self.em, load.result)
        emit_producer(self.em, self.op, self.tma, self.stages, self.tma_bytes, self.full, self.empty, self.maps,
                      self.starts_at, self.in_loop, self.em.per_program, self.multicast)

    def end_prelude(self) -> None:
        """A specialized loop's prelude ends with the ring's count; its math comes later (phase "consumer")."""
        em = self.em
        em.line("int tj_it = 0;  // the ring's iteration, counted across programs")
        em.async_mma, em.overlap_hook = self.outer_async, self.outer_hook

    def prefetch_first_iterations(self) -> None:
        """The ring's shared tiles, and iterations 0 .. S-2 issued into them (TMA and cp.async alike)."""
        em, stages, lo, step = self.em, self.stages, self.lo, self.step
        for load in self.piped:
            stage_shared(em, load.result)
        em.line(f"// software pipeline: {stages} stages, {len(self.piped)} tile(s) prefetched {stages - 1} "
                "iteration(s) ahead" + (f", {len(self.tma)} by TMA" if self.tma else ""))
        # A rolled loop over the prefetched stages: unrolled, it repeated every copy's code (fast and
        # element-wise paths) per stage for NVRTC to compile, to save a few instructions run once.
        em.line("#pragma unroll 1")
        em.open(f"for (int tj_s = 0; tj_s < {stages - 1}; ++tj_s)")
        at = f"{lo} + ({self.iv_t})tj_s * {step}"
        self.issue_tma(at, "tj_s", self.in_loop(f"({at})"))
        for load in self.per_thread:
            issue_shared_load(em, load, self.starts_at(load, at), "tj_s", guard=self.in_loop(f"({at})"))
        em.line("tj_cp_async_commit();")
        em.close()

    def set_up_cp_async_ring(self) -> None:
        """The variables holding the slots read and refilled, and the interior copies' loop-invariant test."""
        em, stages = self.em, self.stages
        for load in self.piped:
            tile = em.shared[load.result.id]
            rd = self.rd[load.result.id] = em.fresh("tj_rd")
            wr = self.wr[load.result.id] = em.fresh("tj_wr")
            last = tile.offset + (stages - 1) * tile.layout.stage_bytes
            em.line(f"unsigned {rd} = {tile.origin} + {tile.offset}, {wr} = {tile.origin} + {last};"
                    "  // slots read and refilled")
        first = f"{self.lo} + ({self.iv_t}){stages - 1} * {self.step}"
        for load in self.per_thread:
            coefs = [_iv_coefficient(v, self.body_ops, self.iv.id) for v in load.operands[1:]]
            if self.positive and None not in coefs:
                copy = InteriorCopy(em, load, self.starts_at(load, first), coefs, self.step)
                if copy.fits:
                    self.interior.append((load, copy))
        if self.interior:
            ok = [term for _, copy in self.interior for term in copy.setup()]
            em.line(f"const bool tj_inner_ok = {' && '.join(f'({t})' for t in ok)};")

    def start(self) -> None:
        """The ring's count, the carried fragments, a pingpong group's turn and the deferred gemm's state."""
        em, piped = self.em, self.piped
        if piped and self.phase is None:
            em.line("int tj_it = 0;")
        carried_gemm = _carried_gemm(em, self.body, piped, self.stages) \
            if self.ring and self.phase is None and not self.in_flight and self.late is None else None
        if carried_gemm is not None:
            self.carry = FragmentCarry(em, *carried_gemm, piped, self.rd, self.stages)
            self.carry.prologue()
        # a pingpong group's programs take turns on the ring with the other group's: the slot before this
        # program's first is another group's to release, and this program's last is released here, after the loop
        self.own_slots = self.phase == "consumer" and em.groups > 1
        if self.own_slots:
            group_turn(em, arrive=False)
            em.line("const int tj_it0 = tj_it;  // this program's first ring slot")
        if self.late is not None:
            self.late.declare()
        self.iv_name = em.name(self.iv)
        self.nxt = f"{self.iv_name} + ({self.iv_t}){self.stages - 1} * {self.step}"

    def carry_loads(self) -> None:
        """The body's register loads whose addresses move by a constant per iteration: their pointers, set up
        here and stepped in the loop's header (``carried_loads``), found by ``lower_memory``'s loads."""
        self.carried_loads = carried_loads(self.em, self.body, self.body_ops, self.iv, self.op.operands[2],
                                           lambda load: self.starts_at(load, self.lo))
        for carried in self.carried_loads:
            self.em.carried_loads[carried.op.result.id] = carried

    def run(self) -> None:
        """The loop (after its first iteration on its own, when a deferred gemm's has nothing to issue)."""
        em, late, lo, iv_t, iv_name = self.em, self.late, self.lo, self.iv_t, self.iv_name
        advance = [step for carried in self.carried_loads for step in carried.advance()]
        incr = ", ".join([f"{iv_name} += {self.step}"] + (["++tj_it"] if self.piped else []) + advance)
        if late is not None:  # the first iteration on its own: it has no previous one's gemm to issue
            em.open(f"if ({self.in_loop(lo)})")
            em.line(f"const {iv_t} {iv_name} = {lo};")
            late.first = True
            self.iteration()
            late.first = False
            em.line("; ".join(["++tj_it"] + advance) + ";")
            em.close()
        first = f"{lo} + {self.step}" if late is not None else lo
        em.open(f"for ({iv_t} {iv_name} = {first}; {self.in_loop(iv_name)}; {incr})")
        self.iteration()
        em.close()
        for carried in self.carried_loads:
            del em.carried_loads[carried.op.result.id]

    def iteration(self) -> None:
        """One iteration's code: wait for its tiles, its ops, hand back or refill, the carried values."""
        em, late = self.em, self.late
        copies: list[SharedCopy] = []
        if self.piped:
            self._wait_for_tiles()
            copies = self._arm_prefetch()
        for inner in self.body.ops[:-1]:
            if late is not None and late.skips(inner):
                continue
            RULES[inner.kind](em, inner)
        em.run_overlap_hook()
        if late is not None:
            late.end_iteration()
        self._end_iteration(copies)

    def _wait_for_tiles(self) -> None:
        em, stages = self.em, self.stages
        if self.carry is not None:
            em.line("// this iteration's tiles landed, and the slot refilled next was released, in the last one")
        elif self.per_thread:
            em.line(f"tj_cp_async_wait<{stages - 2}>();  // this iteration's tiles have landed")
            em.line("tj_fence_proxy_async();  // ... and visible to wgmma's async proxy")
        if self.tma:
            em.line(("if (tid == 0) " if self.tmem else "")
                    + f"tj_mbar_wait({self.full} + 8 * (tj_it % {stages}), (tj_it / {stages}) & 1);"
                    + "  // TMA tiles landed")
        if not self.in_flight and not self.producer and self.carry is None:
            em.barrier("... for every thread, and everyone is done with the slot refilled next")

    def _arm_prefetch(self) -> list[SharedCopy]:
        """Point the ring's tiles at this iteration's slot and set up the prefetch of iteration +S-1: where it
        goes (the first gemm's overlap hook, the in-flight gemms' release, a deferred gemm's issue). Returns the
        cp.async copies of the prefetch, whose element-wise part runs at the iteration's end."""
        em, stages, nxt = self.em, self.stages, self.nxt
        if not self.producer:
            em.line(f"const bool tj_prefetch = {self.in_loop(f'({nxt})')};")
        if self.ring:
            for load in self.piped:
                em.shared[load.result.id].address = self.rd[load.result.id]
            if self.interior:
                inside = [c for load, copy in self.interior for c in copy.inside(self.starts_at(load, nxt))]
                em.line(f"const bool tj_inner = tj_prefetch && tj_inner_ok{''.join(f' && {c}' for c in inside)};"
                        "  // every window wholly inside")
        else:
            em.line(f"const int tj_slot_next = (tj_it + {stages - 1}) % {stages};")
            for load in self.piped:
                em.shared[load.result.id].slot = f"(tj_it % {stages})"
        inner_ids = {load.result.id for load, _ in self.interior}
        copies = [SharedCopy(em, load, self.starts_at(load, nxt), "tj_slot_next", "tj_prefetch",
                             address=self.wr.get(load.result.id))
                  for load in self.per_thread if load.result.id not in inner_ids]
        for copy in copies:  # the prefetch's scalars, ahead of everything
            copy.begin()
        if self.in_flight:
            em.async_mma = AsyncMma(self.in_flight, self._release_and_refill, f"{self.empty} + 8 * (tj_it % {stages})")
        elif self.late is not None:
            self.late.empty = self.empty
            if not self.late.first:
                em.overlap_hook = self.late.issue_under_first_gemm
        else:
            # The first gemm of the body emits the prefetch after its first fragment loads; without one,
            # it goes first.
            em.overlap_hook = lambda: self._prefetch(copies)
            em.fragment_carry = self.carry
            if not any(o.kind is OpKind.GEMM for o in self.body.ops):
                em.run_overlap_hook()
        return copies

    def _prefetch(self, copies: list[SharedCopy]) -> None:
        em = self.em
        em.line(f"// prefetch iteration +{self.stages - 1} (placed to overlap the tensor-core math)")
        self.issue_tma(self.nxt, "tj_slot_next", "tj_prefetch")
        for load, copy in self.interior:
            copy.issue(self.wr[load.result.id], "tj_inner")
        for copy in copies:
            copy.fast()
        if not self.ring:
            em.line("tj_cp_async_commit();")

    def _release_and_refill(self) -> None:
        em = self.em
        if self.tmem:  # the commit releases the slot; thread 0 refills the one of iteration -1 once it is free
            em.line(f"// refill iteration -1's slot with iteration +{self.stages - 1} once its MMAs completed")
        else:
            em.line(f"// iteration -1's MMAs are complete: release its slot, then refill it with iteration "
                    f"+{self.stages - 1}")
            em.open(f"if (tj_it > {'tj_it0' if self.own_slots else '0'})")
            em.line("__syncwarp();")
            em.line(release(em, f"{self.empty} + 8 * (tj_slot_next)"))
            em.close()
        self.issue_tma(self.nxt, "tj_slot_next", "tj_prefetch", refill=True)

    def _end_iteration(self, copies: list[SharedCopy]) -> None:
        """After the iteration's math: the element-wise copies, a slot handed back to the producer, the cp.async
        ring's commit and rotation, and the carried values."""
        em, stages, late = self.em, self.stages, self.late
        for copy in copies:  # windows cp.async cannot copy: element-wise, after this iteration's math
            copy.slow()
        if self.interior:  # windows not wholly inside: zero fill past the edges, or element by element
            em.open("if (tj_prefetch && !tj_inner)")
            for load, _ in self.interior:
                em.open("")
                edge = SharedCopy(em, load, self.starts_at(load, self.nxt), "tj_slot_next", "true",
                                  address=self.wr[load.result.id])
                edge.begin()
                edge.fast()
                edge.slow()
                em.close()
            em.close()
        if self.producer and not self.in_flight and late is None:
            em.line("__syncwarp();  // this warp is done with the iteration's slot: hand it back to the producer")
            em.line(release(em, f"{self.empty} + 8 * (tj_it % {stages})"))
        if self.ring:
            # one group per iteration, closed after every copy of the iteration (the edge copies above included)
            em.line("tj_cp_async_commit();")
            for copy in (c for _, c in self.interior):
                copy.advance()
            for load in self.piped:  # the slot read now is refilled next; the next one is read
                tile, r, w = em.shared[load.result.id], self.rd[load.result.id], self.wr[load.result.id]
                last = tile.offset + (stages - 1) * tile.layout.stage_bytes
                em.line(f"{w} = {r}; {r} = {r} == {tile.origin} + {last} ? {tile.origin} + {tile.offset} : "
                        f"{r} + {tile.layout.stage_bytes};")
        _assign_yields(em, self.carried, late.yielded() if late is not None else self.body.terminator.operands)

    def drain(self) -> None:
        """After the loop: the last gemms waited for (or the accumulators out of tensor memory), the ring's last
        copies waited for, its barriers invalidated, and its shared memory given back."""
        em, stages, empty = self.em, self.stages, self.empty
        if self.own_slots:
            group_turn(em, arrive=True)
        if self.late is not None:
            self.late.drain()
        if self.ring:
            for load in self.piped:
                em.shared[load.result.id].address = None
        em.async_mma = self.outer_async
        if self.tmem:  # the accumulators, from tensor memory back into the loop's result registers
            lower_tcgen05.load_accumulators(em, self.in_flight, self.carried_names,
                                            f"{empty} + 8 * ((tj_it - 1) % {stages})", f"((tj_it - 1) / {stages}) & 1")
        else:
            for gemm, name in zip(self.in_flight, self.carried_names):  # the last iteration's groups
                wait_group(em, 0, name, gemm.result.type.layout.regs, gemm.result.dtype == D.int32)
            if self.in_flight and self.own_slots:
                em.open("if (tj_it > tj_it0)")
                em.line("__syncwarp();  // the last iteration's MMAs are complete: release its slot")
                em.line(release(em, f"{empty} + 8 * ((tj_it - 1) % {stages})"))
                em.close()
        done = self.done
        if self.per_thread:  # (TMA loads completed on the ring's barriers: no cp.async group left to wait for)
            em.line("tj_cp_async_wait<0>();")
        # the body's TMA bulk reductions (lower_tma.emit_store) have read their staging before the loop gives it
        # back; a persistent walk keeps it (the kernel's end waits for them)
        staged = em.bulk_reads_pending and done
        if staged:
            em.line("if (tid == 0) tj_bulk_wait_read0();  // the loop's bulk reductions have read their staging")
        em.bulk_reads_pending = self.outer_reads_pending or (em.bulk_reads_pending and not done)
        # every thread is done with the ring before its memory is reused (a persistent walk keeps it, and its
        # mbarriers order the slots' readers)
        if (self.piped and (self.per_thread or done)) or staged:
            em.barrier()
        # the other program's last arrivals on this one's barriers are in before the memory is reused
        if self.paired and done:
            em.line("if (tj_ncta > 1) tj_cluster_sync();")
        if self.tma and done:
            em.line(f"if ({em.leader}) {{ for (int s = 0; s < {self.nbars}; ++s) tj_mbar_inval({self.full} + 8 * s); }}"
                    "  // before the memory is reused")
        em.close()
        em.overlap_hook = self.outer_hook
        em.smem_peak = max(em.smem_peak, em.smem_top)
        if done:
            em.smem_top = self.smem_mark


class Deferred:
    """Emits a warp-specialized loop whose last gemm is issued one iteration late
    (``passes.warp_specialize.deferred_gemm``, FlashAttention-3's intra-warpgroup overlap). Iteration ``j``: wait for slot ``j``; issue the first gemm; issue
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
            em.line(f"unsigned tj_pp[{packed_words(self.packed)}];  // its A fragment, packed")

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
