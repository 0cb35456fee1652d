"""Test helper: run a kernel's pass pipeline and CUDA emitter without NVRTC (fast, no cubin).

For tests that inspect the IR after passes or the generated CUDA text for many configurations; tests that
need the cubin go through ``kernel.compile(..., arch=...)``.
"""
from __future__ import annotations

def lower(kernel, *args, arch: str = "sm_80", **kwargs):
    """(final IR function, CUDA source) of the specialization ``args``/``kwargs`` select, for ``arch``: the
    compiler's stages up to ``cuda`` (no NVRTC)."""
    stages = kernel.compile(*args, arch=arch, stop_after="cuda", **kwargs)
    return stages.fn, stages.cuda


def kernel_body(source: str) -> str:
    """The generated kernel function, without the prelude and support helpers."""
    return source[source.index('extern "C" __global__'):]


def braced_block(text: str, at: int) -> str:
    """The ``{ ... }`` block of generated code that opens at the first brace at or after position ``at``."""
    start = text.index("{", at)
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    raise AssertionError("unbalanced braces")
