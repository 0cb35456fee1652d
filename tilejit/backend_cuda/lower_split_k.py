"""CUDA for the split-K ops (``passes/split_k.py``): a program's index in its cluster and the cluster-wide sum.

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


def _cluster_sync(em: Emitter, why: str) -> None:
    em.line(f'asm volatile("barrier.cluster.arrive.release;\\n\\tbarrier.cluster.wait.acquire;" ::: "memory");'
            f"  // {why}")
