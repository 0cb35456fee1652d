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
    # (lower_loops._open_walk sets tj_sk_k0 / tj_sk_k1 for each part of the walk)
    em.line(f"const int32_t {em.name(op.result)} = (int32_t)tj_sk_k{int(op.attrs.end)};")


@emits(OpKind.STREAM_K_FIXUP)
def _stream_k_fixup(em: Emitter, op: Op) -> None:
    """The fix-up of one accumulator after a stream-K run (``tj_sk_k0`` to ``tj_sk_k1`` of ``tj_sk_units``):

    * a run that does not start its tile (its program's first run of the last waves) stores the partial sum in
      the program's workspace slot, in register order (consecutive threads on consecutive 16-byte vectors), then
      sets its flag with release semantics at GPU scope;
    * a run that starts its tile but does not end it waits for the flags of the programs after it whose runs
      begin inside the tile, adds their slots in program order (the result does not depend on timing) and
      clears each flag for the next launch.

    Workspace and flags come from the runtime (``runtime/launch.StreamKLauncher``), one set per stream: every
    flag is 0 between launches. A kernel with several accumulators gives each its own flag and part of the slot.
    """
    acc = em.name(op.operands[0])
    em.alias(op.result, acc)  # summed in place: the loop's result has no other reader (the pass checked)
    fixups = [o for o in em.fn.walk() if o.kind is OpKind.STREAM_K_FIXUP]
    index = next(i for i, o in enumerate(fixups) if o is op)
    threads, programs = em.target.threads, em.fn.attrs["persistent"]
    sizes = [em.layout(o.operands[0]).regs * threads for o in fixups]
    em.stream_k_words, em.stream_k_flags = sum(sizes), len(fixups)
    offset, regs = sum(sizes[:index]), em.layout(op.operands[0]).regs
    vectors, tail = divmod(regs, 4)
    is_float = op.operands[0].dtype == D.float32

    def flag(program: str) -> str:
        """The address of ``program``'s flag for this accumulator."""
        return f"tj_sk_flags + {len(fixups)} * {program} + {index}"

    def as_word(x: str) -> str:
        return f"__float_as_uint({x})" if is_float else f"(unsigned)({x})"

    def from_word(x: str) -> str:
        return f"__uint_as_float({x})" if is_float else f"(int32_t)({x})"

    em.comment(op, "stream-K: this run's partial sum handed on, or the later runs' sums added")
    em.open("")
    em.line(f"const size_t tj_sk_slot = {em.stream_k_words}u;  // words per program")
    em.line("// a later run of the tile hands its sum to the program that starts the tile; that one adds them")
    em.open("if (tj_sk_k0 > 0)")
    em.line(f"unsigned* const tj_dst = tj_sk_ws + (size_t)tj_first * tj_sk_slot + {offset}u;")
    if vectors:
        em.line("#pragma unroll")
        em.open(f"for (int q = 0; q < {vectors}; ++q)")
        em.line(f"__stcg(reinterpret_cast<uint4*>(tj_dst) + q * {threads} + tid, make_uint4("
                f"{as_word(f'{acc}[4 * q]')}, {as_word(f'{acc}[4 * q + 1]')}, {as_word(f'{acc}[4 * q + 2]')}, "
                f"{as_word(f'{acc}[4 * q + 3]')}));")
        em.close()
    for j in range(tail):
        em.line(f"__stcg(tj_dst + {4 * vectors * threads} + {j * threads} + tid, {as_word(f'{acc}[{4 * vectors + j}]')});")
    em.line("__threadfence();")
    em.barrier("every math thread's part of the sum is stored")
    em.line(f'if (tid == 0) asm volatile("st.release.gpu.global.u32 [%0], 1;" :: "l"({flag("tj_first")}) : "memory");')
    em.close()
    em.open("else if (tj_sk_k1 < tj_sk_units)")
    em.line("const int tj_tile_end = (tj_sk_end / tj_sk_units + 1) * tj_sk_units;  // (this run ends inside it)")
    em.open(f"for (int tj_peer = (int)tj_first + 1; tj_peer < {programs}; ++tj_peer)")  # (in program order)
    em.line(f"const int tj_pb = (int)((long long)tj_peer * tj_sk_total / {programs});")
    em.line("if (tj_pb >= tj_tile_end) break;  // a run of the next tile")
    em.line(f"if (tj_pb == (int)((long long)(tj_peer + 1) * tj_sk_total / {programs})) continue;  // an empty run")
    em.open("if (tid == 0)")
    em.line("unsigned tj_ready = 0;")
    em.open("while (true)")
    em.line(f'asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(tj_ready) : "l"({flag("tj_peer")}) : '
            '"memory");')
    em.line("if (tj_ready) break;")
    em.line("__nanosleep(32);")
    em.close()
    em.line(f"*({flag('tj_peer')}) = 0;  // cleared for the next launch")
    em.close()
    em.barrier("the peer's sum is in the workspace")
    em.line(f"const unsigned* const tj_src = tj_sk_ws + (size_t)tj_peer * tj_sk_slot + {offset}u;")
    if vectors:
        em.line("#pragma unroll")
        em.open(f"for (int q = 0; q < {vectors}; ++q)")
        em.line(f"const uint4 x = __ldcg(reinterpret_cast<const uint4*>(tj_src) + q * {threads} + tid);")
        em.line(f"{acc}[4 * q] += {from_word('x.x')}; {acc}[4 * q + 1] += {from_word('x.y')}; "
                f"{acc}[4 * q + 2] += {from_word('x.z')}; {acc}[4 * q + 3] += {from_word('x.w')};")
        em.close()
    for j in range(tail):
        em.line(f"{acc}[{4 * vectors + j}] += {from_word(f'__ldcg(tj_src + {4 * vectors * threads} + {j * threads} + tid)')};")
    em.close()
    em.close()
    em.close()


def _cluster_sync(em: Emitter, why: str) -> None:
    em.line(f'asm volatile("barrier.cluster.arrive.release;\\n\\tbarrier.cluster.wait.acquire;" ::: "memory");'
            f"  // {why}")
