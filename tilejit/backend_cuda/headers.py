"""tilejit's CUDA device helpers as headers: ``tilejit/include/tilejit/<name>.cuh``, shipped as package data.

A lowering that needs fixed device helpers asks for their header (``Emitter.require_header("tma_store")``), and
the generated source includes it once, ahead of the kernel, as ``#include "tilejit/tma_store.cuh"``. NVRTC is
given the text of every header with the program (:func:`header_sources`), not a search path: a compile reads
exactly the files the cache key hashes (``compiler.package_digest`` covers ``*.cuh``), from the source tree and
from an installed wheel alike.

A header is a comment saying what it holds, ``#pragma once``, its own ``#include "tilejit/..."`` lines (what it
needs: the prelude, for all of them), then its code. :func:`expand_includes` turns a source into the one
translation unit NVRTC compiles: each tilejit include line replaced by what follows that header's
``#pragma once`` line (its own include lines expanded the same way), a header already included by nothing, as
the preprocessor does. An include directive is emitted after a newline of its own (:func:`include_directive`),
which keeps each directive on a line of its own and separates the helpers by a blank line, as the helper text
did when it lived in Python strings: the expansion is byte for byte the source the emitter generated then, so
the codegen digests (``scripts/codegen_digest.py``, taken over the expansion) stayed valid. It is what to read,
or hand to another compiler, when the source with its include lines (``kernel.asm["cuda"]``, the cache's
``kernel.cu``) is not enough.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

#: The directory holding ``tilejit/<name>.cuh``: what to give another compiler as ``-I`` (NVRTC gets the text).
INCLUDE_DIR = Path(__file__).resolve().parent.parent / "include"

_INCLUDE_LINE = re.compile(r'^#include "tilejit/(\w+)\.cuh"\n', re.MULTILINE)
_ONCE = "#pragma once\n"


def include_directive(name: str) -> str:
    """The text that includes header ``name`` in generated source: a newline, then ``#include "tilejit/<name>.cuh"``
    on a line of its own (the newline makes it one after helper text that did not end its last line)."""
    return f'\n#include "tilejit/{name}.cuh"\n'


@functools.cache
def header_sources() -> dict[str, str]:
    """Every tilejit header's text by the name it is included as (``"tilejit/tma.cuh"``), read once per process."""
    return {f"tilejit/{path.name}": path.read_text(encoding="utf-8")
            for path in sorted((INCLUDE_DIR / "tilejit").glob("*.cuh"))}


def header_text(name: str) -> str:
    """The whole text of header ``name``; KeyError naming the headers there are when it does not exist."""
    text = header_sources().get(f"tilejit/{name}.cuh")
    if text is None:
        known = ", ".join(sorted(n[len("tilejit/"):-len(".cuh")] for n in header_sources()))
        raise KeyError(f"no tilejit header {name!r} in {INCLUDE_DIR / 'tilejit'} (there are: {known})")
    return text


def expand_includes(source: str) -> str:
    """``source`` with every ``#include "tilejit/<name>.cuh"`` line replaced by that header's text after its
    ``#pragma once`` line, recursively, each header once: the translation unit NVRTC compiles."""
    included: set[str] = set()

    def expand(text: str) -> str:
        return _INCLUDE_LINE.sub(lambda m: header_body(m.group(1)), text)

    def header_body(name: str) -> str:
        if name in included:
            return ""
        included.add(name)
        description, once, body = header_text(name).partition(_ONCE)
        if not once:
            raise ValueError(f"tilejit header {name!r} has no '#pragma once' line")
        return expand(body)

    return expand(source)
