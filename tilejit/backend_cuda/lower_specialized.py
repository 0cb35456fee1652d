"""A warp-specialized loop's producer warpgroup, and the kernel forms built on it: a persistent walk over the grid's
programs, pingpong groups of math warps, cluster pairs that multicast shared tiles, and stream-K's schedule.

A warp-specialized loop (``ForAttrs.producer_warpgroup``, sm_90a; ``passes/warp_specialize.py`` decides which)
moves the refills of its TMA ring to a producer warpgroup launched beyond the ``num_warps`` warps: after the
barriers are set up, its warps give registers back (``setmaxnreg.dec``) and its first thread runs the loop's
iterations issuing TMA loads, each into a slot once the math has released it; then the producer leaves the kernel
(``emit_producer``). The ``num_warps`` warps take the registers (``setmaxnreg.inc``) and run the loop waiting only
for loaded slots (``lower_loops``); from there on their block-wide barriers count them alone
(``Emitter.consumers_only``).

A kernel whose specialized loop is set up at its start (persistent, or with the producer split off first) has its
body emitted by ``emit_specialized``, which ``backend_cuda/stages.py`` hands to the emitter; it emits the loop
through the ``for`` rule twice (``Emitter.ring_phase``: the ring and producer, then the math).
"""
from __future__ import annotations

from typing import Callable

from ..ir import Op, OpKind, Value
from ..passes.warp_specialize import PRODUCER_THREADS, bounds_slice, compared_slice, producer_slice
from .emitter import RULES, Emitter, c_type, in_range, is_positive_constant
from . import lower_tma




def release(em: Emitter, bar: str) -> str:
    """The statement by which a warp (its lane 0) hands a ring slot back on its "empty" mbarrier ``bar``: in a
    cluster's programs (``fn.attrs["cluster"]``), in both."""
    if em.fn.attrs.get("cluster"):
        em.require_header("cluster_ring")
        return f"if ((tid & 31) == 0) tj_mbar_arrive_pair({bar}, tj_ncta, tj_crank);"
    return f"if ((tid & 31) == 0) tj_mbar_arrive({bar});"


# setmaxnreg (PTX 9.7.17.1): registers per thread after the split, a multiple of 8 in 24..256. The producer keeps
# few; the math warps take what the register file then holds (65,536 per SM, one block per SM).
_PRODUCER_REGISTERS = 40
_REGISTER_FILE = 65536



def consumer_registers(consumers: int, producers: int) -> int:
    """Registers per math thread once the producer warpgroup has given its back (a multiple of 8, <= 256)."""
    return min(256, (_REGISTER_FILE - producers * _PRODUCER_REGISTERS) // consumers // 8 * 8)


def emit_producer(em: Emitter, op: Op, tma: list[Op], stages: int, tma_bytes: int, full: str, empty: str,
              maps: dict[int, str], starts_at, in_range, per_program: Callable[[], None] | None = None,
              multicast: list[tuple[Op, list[Value]]] = ()) -> None:
    """The producer warpgroup's part of a warp-specialized loop, then the math warps' register grant. Set up at
    the kernel's start (``per_program`` given), the producer first computes what its loop needs (``per_program``);
    in a persistent kernel it walks the same programs as the math warps, doing so for each program."""
    lo, step = em.name(op.operands[0]), em.name(op.operands[2])
    iv_t = c_type(op.regions[0].args[0].dtype)
    consumers = em.groups * em.target.threads
    em.require_header("setmaxnreg")
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
            "  // the math released the slot"
            + (" (in both programs of a cluster)" if em.fn.attrs.get("cluster") else ""))
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
    em.granted = em.register_grant or consumer_registers(consumers, PRODUCER_THREADS)
    em.line(f"tj_setmaxnreg_inc<{em.granted}>();")
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
    if em.fn.attrs.get("producer_first") and groups == 1 and not em.fn.attrs.get("cluster"):
        # programs of unequal cost (attention's causal blocks) in the grid's order: turn by turn, the SMs take
        # them forwards, then backwards, so an SM given a costly one in one turn gets a cheap one in the next
        programs = em.fn.attrs["persistent"]
        em.open(f"for (long long tj_turn = 0; tj_turn * {programs} < tj_nprogs; ++tj_turn)")
        em.line(f"const long long tj_prog = tj_turn * {programs} + ((tj_turn & 1) ? {programs - 1} - tj_first : "
                "tj_first);  // a snake over each turn's programs")
        em.line("if (tj_prog >= tj_nprogs) continue;  // the last turn's programs past the grid")
        return
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
    em.require_header("stream_k")
    em.line(f"const int tj_sk_begin = tj_sk_run_start(tj_first, tj_sk_total, {programs});")
    em.line(f"const int tj_sk_end = tj_sk_run_start(tj_first + 1, tj_sk_total, {programs});")




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
        if is_positive_constant(step):
            em.line(f"if ({em.name(hi)} > {x}) tj_it += (int)(({em.name(hi)} - {x} + {s} - 1) / {s});")
        else:
            em.line(f"for ({iv_t} tj_x = {x}; {in_range('tj_x', em.name(hi), s, False)}; tj_x += {s}) ++tj_it;")
        em.close()
        em.close()


def group_turn(em: Emitter, arrive: bool) -> None:
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


def emit_specialized(em: Emitter) -> None:
    """The body of a kernel whose warp-specialized loop is set up at the kernel's start: a persistent kernel
    (``fn.attrs["persistent"]`` = P programs, one per SM), or one whose producer splits off first
    (``fn.attrs["producer_first"]``: something before the loop needs memory; passes/warp_specialize.specialize_warps).

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

        needed = producer_slice(em.fn, loop) if em.fn.attrs.get("producer_first") else before

        def per_program() -> None:  # what precedes the loop, for the producer's walk and the math warps' alike
            _program_ids(em)
            em.emit_ops(needed if em.ring_phase == "prelude" else before)
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
