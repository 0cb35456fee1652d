"""From frontend IR to a cubin: the pass pipeline per arch, CUDA emission and NVRTC."""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Callable

from .. import knobs
from ..ir import Function, print_function, verify
from ..passes.canonicalize import canonicalize
from ..passes.cleanup import cleanup
from ..passes.layouts import infer_layouts
from ..passes.copies import select_copies
from ..passes.pipeline import pipeline_loops
from ..passes.scopes import infer_scopes
from . import lower_gemm, lower_loops, lower_memory, lower_reduce, lower_tma, lower_wgmma  # noqa: F401  (register rules)
from .emitter import Emitter
from .nvrtc import compile_cuda
from ..target import Target

Pass = Callable[[Function, Target], None]

# One pipeline for the sm_80 instruction path (mma.sync), which sm_90a and sm_100a also run for now.
PIPELINE_SM80: list[tuple[str, Pass]] = [
    # fuse `acc += a @ b` into gemm(a, b, acc) and fold .T into gemm flags before scopes are decided
    ("canonicalize", lambda fn, t: canonicalize(fn)),
    # gemm operands are staged in shared memory; everything else lives in registers
    ("infer-scopes", lambda fn, t: infer_scopes(fn)),
    # the dispatch registry picks each gemm's lowering, which fixes the accumulator's fragment layout
    ("infer-layouts", infer_layouts),
    # multi-buffer the shared loads of T.range loops (needs the shared layouts from the step before)
    ("pipeline", pipeline_loops),
    # pick each shared load's copy lowering (TMA only for pipelined loads, so after the step before)
    ("select-copies", select_copies),
    # drop what the rewrites left unused
    ("cleanup", lambda fn, t: cleanup(fn)),
]


def pipeline_for(arch: str) -> list[tuple[str, Pass]]:
    return PIPELINE_SM80


def run_passes(fn: Function, target: Target) -> Function:
    for name, run in pipeline_for(target.arch):
        run(fn, target)
        verify(fn)
        if knobs.dump_ir():
            print(f"// ----- IR after {name} -----\n{print_function(fn)}", file=sys.stderr)
    fn.attrs["arch"] = target.arch.name
    fn.attrs["num_warps"] = target.num_warps
    return fn


@dataclass
class CompiledArtifacts:
    name: str
    source: str
    ir: str
    ptx: str | None
    cubin: bytes
    param_kinds: list[str]
    shared_bytes: int
    threads: int
    compile_seconds: float
    registers: int | None
    spill_bytes: int | None
    tensor_maps: list[dict]


def compile_function(fn: Function, target: Target, kernel_name: str) -> CompiledArtifacts:
    start = time.perf_counter()
    run_passes(fn, target)
    emitter = Emitter(fn, target, kernel_name)
    source, kinds, shared_bytes = emitter.generate()
    result = compile_cuda(source, name=kernel_name, arch=target.arch.name, keep_ptx=knobs.keep_ptx(),
                          options=["--ptxas-options=-v"])
    registers = _PTXAS_REGISTERS.search(result.log)
    spills = _PTXAS_SPILLS.search(result.log)
    return CompiledArtifacts(kernel_name, source, print_function(fn), result.ptx, result.cubin, kinds,
                             shared_bytes, target.threads, time.perf_counter() - start,
                             int(registers.group(1)) if registers else None,
                             int(spills.group(1)) + int(spills.group(2)) if spills else None,
                             [m.to_json() for m in emitter.tensor_maps])


# ptxas -v reports, per kernel: "Used 128 registers, ..." and "N bytes spill stores, M bytes spill loads".
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
