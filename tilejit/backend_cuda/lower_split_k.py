"""CUDA for the split-K ops (``passes/split_k.py``): a program's index in its cluster and the cluster-wide sum;
and for the stream-K ops: the bounds of a program's current run of K iterations and the fix-up of its sum.

The kernel is compiled with ``__cluster_dims__(1, 1, S)``: the S programs of one output tile are one cluster,
stacked along z, so a plain ``cuLaunchKernel`` with the grid's z scaled by S launches it (the runtime does) and
they are co-scheduled on one GPC, where each can read the others' shared memory (PTX ISA 9.7.9.18 ``mapa``,
9.7.13.4 ``barrier.cluster``).

The sum runs in every program's registers as they lie: program ``r > 0`` writes its partial accumulator to its
own shared memory in register order (16-byte vectors, consecutive threads on consecutive vectors: no bank
conflicts), the cluster synchronises, program 0 reads each peer's copy of its own registers with
``ld.shared::cluster`` and adds them in the order r = 1, 2, ... (deterministic), and the cluster synchronises
again so no program exits while its shared memory is still being read.
"""
from __future__ import annotations

from typing import Callable

from .. import dtypes as D
from ..ir import Op, OpKind
from .emitter import Emitter, emits


@emits(OpKind.SPLIT_INDEX)
def _split_index(em: Emitter, op: Op) -> None:
    em.line(f"const int32_t {em.name(op.result)} = (int32_t)(blockIdx.z % {op.attrs.splits}u);")


@emits(OpKind.SPLIT_REDUCE)
def _split_reduce(em: Emitter, op: Op) -> None:
    acc = em.name(op.operands[0])
    em.alias(op.result, acc)  # summed in place: the loop's result has no other reader (the pass checked)
    splits, regs, threads = op.attrs.splits, em.layout(op.operands[0]).regs, em.target.threads
    is_float = op.operands[0].dtype == D.float32
    word, constraint = ("f32", "f") if is_float else ("b32", "r")
    vectors, tail = divmod(regs, 4)
    mark = em.smem_top  # the loop's ring is free again; given back after this op, as a loop gives back its ring
    base = em.allocate_shared(regs * threads * 4, 16)
    em.smem_peak, em.smem_top = max(em.smem_peak, em.smem_top), mark

    def address(i: str, vector: bool) -> str:
        """Byte offset of this thread's register ``i`` (a vector index when ``vector``) in a program's buffer."""
        if vector:
            return f"((unsigned)({i} * {threads} + tid) * 16u)"
        return f"({vectors * threads * 16}u + (unsigned)({i} * {threads} + tid) * 4u)"

    em.comment(op, f"split-K: the partial accumulators of the cluster's {splits} programs summed in program 0")
    em.open("")
    em.line(f"const unsigned tj_rank = blockIdx.z % {splits}u;")
    em.barrier("every warp is past the K loop, whose shared memory this reuses")
    em.open("if (tj_rank != 0)")
    if vectors:
        em.line("#pragma unroll")
        em.open(f"for (int q = 0; q < {vectors}; ++q)")
        em.line(f'asm volatile("st.shared.v4.{word} [%0], {{%1, %2, %3, %4}};" :: "r"(tj_smem_u32 + {base}u + '
                f'{address("q", True)}), "{constraint}"({acc}[4 * q]), "{constraint}"({acc}[4 * q + 1]), '
                f'"{constraint}"({acc}[4 * q + 2]), "{constraint}"({acc}[4 * q + 3]) : "memory");')
        em.close()
    for j in range(tail):
        em.line(f'asm volatile("st.shared.{word} [%0], %1;" :: "r"(tj_smem_u32 + {base}u + {address(str(j), False)}), '
                f'"{constraint}"({acc}[{4 * vectors + j}]) : "memory");')
    em.close()
    _cluster_sync(em, "the partials are in shared memory")
    em.open("if (tj_rank == 0)")
    em.open(f"for (unsigned tj_peer = 1; tj_peer < {splits}u; ++tj_peer)")
    em.line("unsigned tj_remote;")
    em.line(f'asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(tj_remote) : "r"(tj_smem_u32 + {base}u), '
            '"r"(tj_peer));')
    ctype = "float" if is_float else "int32_t"
    if vectors:
        em.line("#pragma unroll")
        em.open(f"for (int q = 0; q < {vectors}; ++q)")
        em.line(f"{ctype} x0, x1, x2, x3;")
        em.line(f'asm volatile("ld.shared::cluster.v4.{word} {{%0, %1, %2, %3}}, [%4];" : "={constraint}"(x0), '
                f'"={constraint}"(x1), "={constraint}"(x2), "={constraint}"(x3) : "r"(tj_remote + '
                f'{address("q", True)}) : "memory");')
        em.line(f"{acc}[4 * q] += x0; {acc}[4 * q + 1] += x1; {acc}[4 * q + 2] += x2; {acc}[4 * q + 3] += x3;")
        em.close()
    for j in range(tail):
        em.open("")
        em.line(f"{ctype} x;")
        em.line(f'asm volatile("ld.shared::cluster.{word} %0, [%1];" : "={constraint}"(x) : "r"(tj_remote + '
                f'{address(str(j), False)}) : "memory");')
        em.line(f"{acc}[{4 * vectors + j}] += x;")
        em.close()
    em.close()
    em.close()
    _cluster_sync(em, "program 0 has read every peer's shared memory: the peers may exit")
    em.close()


@emits(OpKind.STREAM_K_BOUND)
def _stream_k_bound(em: Emitter, op: Op) -> None:
    # (lower_specialized._open_walk sets tj_sk_k0 / tj_sk_k1 for each part of the walk)
    em.line(f"const int32_t {em.name(op.result)} = (int32_t)tj_sk_k{int(op.attrs.end)};")


@emits(OpKind.STREAM_K_FIXUP)
def _stream_k_fixup(em: Emitter, op: Op) -> None:
    """The fix-up of the loop's accumulators after a stream-K run (``tj_sk_k0`` to ``tj_sk_k1`` of
    ``tj_sk_units``), for a run that does not cover its whole tile: the run stores its sums in its program's
    workspace slot (slot 0 for a program's first run, which starts inside a tile, slot 1 for its last, which
    starts one; in register order, consecutive threads on consecutive 16-byte vectors), then adds its iteration
    count to the tile's counter. The run that brings the count to the tile's iterations finished last: it reads
    back the slots of every run of the tile in program order (the sum does not depend on timing), clears the
    counter for the next launch and owns the sum (the epilogue runs there). No program waits for another, so
    programs need not all be resident at once (another kernel may hold SMs).

    Workspace and counters come from the runtime (``runtime/launch.StreamKLauncher``), one set per stream. A
    counter holds the launch's epoch beside its count, and a count of another epoch reads as 0: a counter left
    by a launch that did not finish, or written by anything else, cannot keep a tile from its epilogue.
    """
    accs = [em.name(v) for v in op.operands]
    owner = em.name(op.results[-1])
    for operand, result in zip(op.operands, op.results):
        em.alias(result, em.name(operand))  # summed in place: the loop's results have no other reader
    assert em.groups == 1, "stream-K kernels have one group of math warps (passes/warp_specialize.specialize_warps)"
    threads, programs = em.target.threads, em.fn.attrs["persistent"]
    regs = [em.layout(v).regs for v in op.operands]
    offsets = [sum(r * threads for r in regs[:i]) for i in range(len(regs))]
    words = sum(regs) * threads  # one slot; a program has two (its first run's and its last run's)
    em.stream_k_words, em.stream_k_flags = 2 * words, 2  # (the flags: one 64-bit counter per program)
    floats = [v.dtype == D.float32 for v in op.operands]

    def each_vector(body: Callable[[str, int, int, bool], None]) -> None:
        """``body(acc, offset, i, is_float)`` for each accumulator's 4-register vectors (index ``q``), then its
        tail registers one by one (``i`` >= 0: register i; -1: the vector loop)."""
        for acc, offset, n, is_float in zip(accs, offsets, regs, floats):
            vectors, tail = divmod(n, 4)
            if vectors:
                em.line("#pragma unroll")
                em.open(f"for (int q = 0; q < {vectors}; ++q)")
                body(acc, offset, -1, is_float)
                em.close()
            for j in range(tail):
                body(acc, offset + 4 * vectors * threads + j * threads, 4 * vectors + j, is_float)

    def word(x: str, is_float: bool) -> str:
        return f"__float_as_uint({x})" if is_float else f"(unsigned)({x})"

    def value(x: str, is_float: bool) -> str:
        return f"__uint_as_float({x})" if is_float else f"(int32_t)({x})"

    def store(acc: str, offset: int, i: int, is_float: bool) -> None:
        if i < 0:
            em.line(f"__stcg(reinterpret_cast<uint4*>(tj_dst + {offset}u) + q * {threads} + tid, make_uint4("
                    + ", ".join(word(f"{acc}[4 * q + {e}]", is_float) for e in range(4)) + "));")
        else:
            em.line(f"__stcg(tj_dst + {offset}u + tid, {word(f'{acc}[{i}]', is_float)});")

    def add(acc: str, offset: int, i: int, is_float: bool) -> None:
        if i < 0:
            em.line(f"const uint4 x = __ldcg(reinterpret_cast<const uint4*>(tj_src + {offset}u) + q * {threads} + "
                    "tid);")
            em.line(" ".join(f"{acc}[4 * q + {e}] += {value(f'x.{c}', is_float)};" for e, c in enumerate("xyzw")))
        else:
            em.line(f"{acc}[{i}] += {value(f'__ldcg(tj_src + {offset}u + tid)', is_float)};")

    em.comment(op, "stream-K: a run that does not cover its tile stores its sums; the tile's last run adds them all")
    em.line(f"bool {owner} = true;")
    em.open("if (tj_sk_k0 > 0 || tj_sk_k1 < tj_sk_units)")
    em.line(f"unsigned* const tj_dst = tj_sk_ws + (size_t)(2 * tj_first + (tj_sk_k0 > 0 ? 0 : 1)) * {words}u;")
    each_vector(store)
    em.line("__threadfence();")
    em.barrier("every math thread's sums are stored")
    em.line("unsigned tj_last = 0;")
    em.open("if (tid == 0)")
    em.line("// the tile's counter: this launch's epoch (high word) and the iterations counted (low word); a count")
    em.line("// of another epoch (a launch that did not finish, memory written by something else) counts as 0")
    em.line("unsigned long long* const tj_count = reinterpret_cast<unsigned long long*>(tj_sk_flags) + "
            "(tj_prog - tj_sk_dp);")
    em.line("const unsigned tj_mine = (unsigned)(tj_sk_k1 - tj_sk_k0);")
    em.line("unsigned long long tj_seen, tj_want;")
    em.line('asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(tj_seen) : "l"(tj_count) : "memory");')
    em.line("unsigned tj_before;")
    em.open("do")
    em.line("tj_want = tj_seen;")
    em.line("tj_before = (unsigned)(tj_want >> 32) == (unsigned)tj_sk_epoch ? (unsigned)tj_want : 0u;")
    em.line('asm volatile("atom.acq_rel.gpu.global.cas.b64 %0, [%1], %2, %3;" : "=l"(tj_seen) : "l"(tj_count), '
            '"l"(tj_want), "l"(((unsigned long long)(unsigned)tj_sk_epoch << 32) | (tj_before + tj_mine)) : '
            '"memory");')
    em.close("} while (tj_seen != tj_want);")
    em.line("tj_last = tj_before + tj_mine == (unsigned)tj_sk_units;")
    em.line("if (tj_last) *tj_count = 0ull;  // every run of the tile has counted: cleared for the next launch")
    em.close()
    em.line(f'asm volatile("{{ .reg .pred p, q; setp.ne.u32 q, %1, 0; bar.red.or.pred p, 1, {threads}, q; '
            'selp.u32 %0, 1, 0, p; }" : "=r"(tj_last) : "r"(tj_last) : "memory");'
            "  // the math warps learn whether this run finished the tile")
    em.line(f"{owner} = tj_last != 0;")
    em.open(f"if ({owner})")
    em.line("// the tile's runs in program order: programs whose runs begin before the tile's end")
    em.line("const int tj_start = (int)(tj_prog - tj_sk_dp) * tj_sk_units;")
    for acc, n in zip(accs, regs):
        em.line(f"for (int i = 0; i < {n}; ++i) {acc}[i] = 0;")
    # (the first is the last program whose run starts at or before the tile's start: tj_sk_run_start inverted)
    em.open(f"for (int tj_c = (int)(((long long)(tj_start + 1) * {programs} - 1) / tj_sk_total); tj_c < {programs}; "
            "++tj_c)")
    em.line(f"const int tj_b = tj_sk_run_start(tj_c, tj_sk_total, {programs});")
    em.line("if (tj_b >= tj_start + tj_sk_units) break;")
    em.line(f"if (tj_b == tj_sk_run_start(tj_c + 1, tj_sk_total, {programs})) continue;  // an empty run")
    em.line(f"const unsigned* const tj_src = tj_sk_ws + (size_t)(2 * tj_c + (tj_b > tj_start ? 0 : 1)) * {words}u;")
    each_vector(add)
    em.close()
    em.close()
    em.close()


def _cluster_sync(em: Emitter, why: str) -> None:
    em.line(f'asm volatile("barrier.cluster.arrive.release;\\n\\tbarrier.cluster.wait.acquire;" ::: "memory");'
            f"  // {why}")
