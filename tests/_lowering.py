"""Test helper: run a kernel's pass pipeline and CUDA emitter without NVRTC (fast, no cubin).

For tests that inspect the IR after passes or the generated CUDA text for many configurations; tests that
need the cubin go through ``kernel.compile(..., arch=...)``.
"""
from __future__ import annotations

from tilejit.backend_cuda.compiler import run_passes
from tilejit.backend_cuda.emitter import Emitter
from tilejit.target import Target
from tilejit.frontend.source import referenced_globals
from tilejit.frontend.visitor import build_function
from tilejit.passes.cleanup import cleanup


def lower(kernel, *args, arch: str = "sm_80", **kwargs):
    """(final IR function, CUDA source) of the specialization ``args``/``kwargs`` select, for ``arch``."""
    call = kernel.bind(args, dict(kwargs))
    kernel.build_ir(call)  # discovers compile-time extents, as a real compile would
    call = kernel.bind(args, dict(kwargs))
    fn = build_function(kernel.parsed, call.specs, referenced_globals(kernel.fn))
    cleanup(fn)
    target = Target.of(arch, call.options.num_warps, call.options.num_stages)
    run_passes(fn, target)
    source, _, _ = Emitter(fn, target, f"tj_{kernel.__name__}").generate()
    return fn, source


def kernel_body(source: str) -> str:
    """The generated kernel function, without the prelude and support helpers."""
    return source[source.index('extern "C" __global__'):]
