"""The CUDA backend's stages: the pass list, CUDA emission and NVRTC.

``tilejit.compiler`` runs these in order (``ir`` -> ``passes`` -> ``cuda`` -> ``ptx`` -> ``cubin``); this module
holds the backend's part of that chain, once. Importing it registers every lowering in the dispatch registry
(``tilejit.target.REGISTRY``), which the layout and copy-selection passes select from.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Callable

from .. import knobs
from ..ir import Function, Op, Value, print_function, verify
from ..passes.canonicalize import canonicalize
from ..passes.cleanup import cleanup
from ..passes.copies import select_copies
from ..passes.divisibility import analyze_divisibility
from ..passes.layouts import infer_layouts
from ..passes.microscaled import expand_microscaled
from ..passes.peel_masks import peel_masks
from ..passes.program_order import order_programs
from ..passes.scaled_promotion import fold_scaled_products
from ..passes.scopes import infer_scopes
from ..passes.software_pipeline import mark_async_mma, pipeline_loops
from ..passes.split_k import split_k
from ..passes.transpose_operands import transpose_operands
from ..passes.warp_specialize import specialize_warps
from ..target import Target
from . import (lower_atomic, lower_gemm, lower_lists, lower_loops, lower_memory, lower_mma_rs,  # noqa: F401
               lower_reduce, lower_split_k, lower_tma, lower_tcgen05, lower_tcgen05_mx, lower_transpose,
               lower_wgmma, lower_wgmma_mn, lower_wgmma_mn8, lower_wgmma_rs)  # (register rules)
from .emitter import Emitter
from .lower_specialized import emit_specialized
from .nvrtc import CompileResult, compile_cuda

Pass = Callable[[Function, Target], None]

# One pass list for the sm_80 instruction path (mma.sync), which sm_90a and sm_100a also run for now.
PIPELINE_SM80: list[tuple[str, Pass]] = [
    # block-scaled (MX) gemms that no block-scaled tensor-core lowering takes on this target become ordinary ops
    # (the operands dequantized into bfloat16), first, so that every later pass sees only forms it knows
    ("expand-microscaled", expand_microscaled),
    # fuse `acc += a @ b` into gemm(a, b, acc) and fold .T into gemm flags before scopes are decided
    ("canonicalize", lambda fn, t: canonicalize(fn)),
    # the split_k launch option cuts the K loop over a cluster's programs (needs the fused gemm(a, b, acc) of
    # the step before to recognise the sums; before scopes and layouts, which then treat its ops like any other)
    ("split-k", split_k),
    # a kernel whose loop lengthens with a program id runs its programs in the reverse order along that axis, the
    # longest first (after split-k, which it leaves alone; before peel-masks splits the loops: it reads their bounds
    # as written)
    ("order-programs", order_programs),
    # a loop whose T.where masks are all true over a run of iterations is split into unmasked and masked loops
    # (after split-k, whose cut of the K loop it then splits like any bounds; before scopes, layouts, pipelining
    # and warp specialization, which treat each loop it makes like any other)
    ("peel-masks", peel_masks),
    # gemm operands are staged in shared memory; everything else lives in registers
    ("infer-scopes", lambda fn, t: infer_scopes(fn)),
    # an operand staged in the major-ness its best lowering cannot read (fp8 / int8 / f32 B given K x N on wgmma)
    # is copied into a transposed shared tile; before the registry fixes the lowerings (the step after)
    ("transpose-operands", transpose_operands),
    # the dispatch registry picks each gemm's lowering, which fixes the accumulator's fragment layout
    ("infer-layouts", infer_layouts),
    # a block-scaled float8 product on wgmma (a fresh gemm and the FMA that scales it into the accumulator) becomes
    # one promoted gemm that scales each chunk as it adds it (needs the lowerings and layouts from the step before)
    ("fold-scaled-products", fold_scaled_products),
    # multi-buffer the shared loads of T.range loops (needs the shared layouts from the step before)
    ("software-pipeline", pipeline_loops),
    # pick each shared load's copy lowering (TMA only for pipelined loads, so after the step before)
    ("select-copies", select_copies),
    # drop what the rewrites left unused
    ("cleanup", lambda fn, t: cleanup(fn)),
    # plain MMA main loops filled by TMA keep their gemms in flight (wgmma; tcgen05 with TMEM accumulators);
    # after cleanup, which removes the dead values a loop body may still hold
    ("async-mma", mark_async_mma),
    # the wgmma loops asked to (or a launch option: warp_specialize, persistent, pingpong, cluster, stream_k) get a
    # producer warpgroup; after async-mma, whose marks tell the loops that qualify
    ("warp-specialize", specialize_warps),
    # what each int scalar is known to be a multiple of (and >= 0), which lets the emitter drop run-time
    # alignment tests; last, so the facts are of the IR the emitter reads
    ("divisibility", analyze_divisibility),
]


def pipeline_for(target: Target) -> list[tuple[str, Pass]]:
    return PIPELINE_SM80


def run_passes(fn: Function, target: Target) -> Function:
    """The ``passes`` stage: the arch's pipeline over the frontend IR, in place, verified after each pass."""
    for name, run in pipeline_for(target):
        run(fn, target)
        verify(fn)
        if knobs.dump_ir():
            print(f"// ----- IR after {name} -----\n{print_function(fn)}", file=sys.stderr)
    fn.attrs["arch"] = target.arch.name
    fn.attrs["num_warps"] = target.num_warps
    return fn


@dataclass
class Emitted:
    """The ``cuda`` stage's output: the source and the launch facts the emitter derived."""
    source: str
    param_kinds: list[str]
    shared_bytes: int
    tensor_maps: list[dict]
    shared_tiles: list[tuple[Value, int]]  # each shared tile (ring) and its bytes
    scratch_bytes: int                     # the buffer layout conversions and reductions share
    stream_k_slot_bytes: int = 0           # a stream-K program's part of the partial-sum workspace
    stream_k_flags: int = 0                # and its flags (one per accumulator)
    register_grant: int | None = None      # registers per math thread setmaxnreg grants (None: no producer split)
    scratch_op: Op | None = None           # the op that needs the most scratch (a reduction, a conversion ...)


def emit_cuda(fn: Function, target: Target, kernel_name: str, register_grant: int | None = None) -> Emitted:
    """The ``cuda`` stage: CUDA C++ for the lowered IR (self-contained: the prelude is included).
    ``register_grant``: the registers a warp-specialized kernel's math threads take (None: the most the producer
    warpgroup leaves, ``lower_specialized.consumer_registers``)."""
    emitter = Emitter(fn, target, kernel_name, specialized_body=emit_specialized, register_grant=register_grant)
    source, kinds, shared_bytes = emitter.generate()
    values = {v.id: v for v in _shared_values(fn)}
    tiles = [(values[vid], tile.layout.bytes) for vid, tile in emitter.shared.items() if vid in values]
    return Emitted(source, kinds, shared_bytes, [m.to_json() for m in emitter.tensor_maps], tiles,
                   emitter.scratch_bytes, emitter.stream_k_words * 4, emitter.stream_k_flags, emitter.granted,
                   emitter.scratch_op)


def _shared_values(fn: Function):
    for op in fn.walk():
        yield from op.results


def run_nvrtc(source: str, target: Target, kernel_name: str, keep_ptx: bool, key: str = "") -> CompileResult:
    """The ``ptx`` / ``cubin`` stages: one NVRTC compile for exactly the target's arch (ptxas -v for the
    resource report); ``key`` (the cache key) tells apart, for NVRTC's own cache, specializations whose CUDA is
    the same (``nvrtc.compile_cuda``'s ``tag``)."""
    return compile_cuda(source, name=kernel_name, arch=target.arch.name, keep_ptx=keep_ptx,
                        options=["--ptxas-options=-v"], tag=key)


#: How far below the default grant a spilling warp-specialized kernel's math threads' registers are tried
#: (``compiler._regrant``): three more compiles at most, each 8 registers lower (setmaxnreg takes multiples of 8).
REGRANT_STEPS = (8, 16, 24)
#: The fewest registers a math thread is granted: what a 384-thread block has without a producer split (168).
MIN_GRANT = 168


def lower_grants(grant: int) -> list[int]:
    """The register grants to try, in order, for a kernel that spilled under ``grant``."""
    return [grant - step for step in REGRANT_STEPS if grant - step >= MIN_GRANT]


def ptxas_resources(log: str) -> tuple[int | None, int | None]:
    """(registers per thread, spill bytes) from ptxas -v's report in the NVRTC log."""
    registers = _PTXAS_REGISTERS.search(log)
    spills = _PTXAS_SPILLS.search(log)
    return (int(registers.group(1)) if registers else None,
            int(spills.group(1)) + int(spills.group(2)) if spills else None)


def register_shortage(log: str) -> tuple[int, int] | None:
    """(registers a thread has, registers an instruction needs) when ptxas gave up for want of registers (C7602,
    "Insufficient registers (96) to compile instruction ... register target of 154 or higher"), else None."""
    found = _PTXAS_SHORT.search(log)
    return (int(found.group(1)), int(found.group(2))) if found else None


def wgmma_serialized(log: str) -> bool:
    """Whether ptxas serialized the kernel's wgmma (C7510-C7519, "wgmma.mma_async instructions are serialized"):
    each then waits for the previous one, which forfeits every overlap the code was written for."""
    return _PTXAS_SERIALIZED.search(log) is not None


_PTXAS_SERIALIZED = re.compile(r"C751\d\).*serialized")
_PTXAS_SHORT = re.compile(r"C7602\) Insufficient registers \((\d+)\).*?register target of (\d+)")
# ptxas -v reports, per kernel: "Used 128 registers, ..." and "N bytes spill stores, M bytes spill loads".
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
