"""tilejit's CUDA headers (``tilejit/include/tilejit/*.cuh``): each compiles, generated code includes them, the
expansion is the translation unit NVRTC compiles, the wheel ships them and the cache key hashes them. CPU only."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tilejit import compiler
from tilejit.backend_cuda import headers
from tilejit.backend_cuda.headers import INCLUDE_DIR, expand_includes, header_sources, header_text, include_directive
from tilejit.backend_cuda.nvrtc import compile_cuda, nvrtc_supports

from kernels import matmul

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

REPO = Path(__file__).resolve().parents[2]
NAMES = sorted(n[len("tilejit/"):-len(".cuh")] for n in header_sources())
# the arch whose instructions a header's helpers wrap (each compiles for it; inline PTX is checked by ptxas only
# where a kernel calls it, which the generated-code tests do)
ARCH_OF = {"tcgen05": "sm_100a", "wgmma": "sm_90a", "tma": "sm_90a", "tma_multicast": "sm_90a", "tma_store": "sm_90a",
           "tma_reduce": "sm_90a", "cluster_ring": "sm_90a", "setmaxnreg": "sm_90a", "stream_k": "sm_90a"}


def test_the_helpers_are_headers():
    assert {"prelude", "support", "opaque", "tma", "tma_multicast", "tma_store", "wgmma", "tcgen05", "cluster_ring",
            "setmaxnreg", "stream_k"} <= set(NAMES)
    for name in NAMES:
        text = header_text(name)
        description, once, _ = text.partition("#pragma once\n")
        assert once, f"{name}.cuh has no #pragma once line"
        assert description.startswith("// "), f"{name}.cuh does not open with what it holds"
        if name != "prelude":
            assert include_directive("prelude").lstrip("\n") in text, f"{name}.cuh does not include what it needs"


@pytest.mark.parametrize("name", NAMES)
def test_each_header_compiles_on_its_own(name):
    """Included alone (twice: #pragma once), with what it includes itself, next to a kernel that uses nothing."""
    arch = ARCH_OF.get(name, "sm_80")
    if not nvrtc_supports(arch):
        pytest.skip(f"this NVRTC does not know {arch}")
    src = include_directive(name) * 2 + 'extern "C" __global__ void tj_header_probe(int* x) { x[0] = 1; }\n'
    assert compile_cuda(src, name="tj_header_probe", arch=arch, keep_ptx=False).cubin[:4] == b"\x7fELF"


def test_expansion_is_each_header_once_after_its_pragma():
    tu = expand_includes(include_directive("prelude") + include_directive("tma") + include_directive("tma"))
    assert "#include" not in tu and "#pragma once" not in tu
    prelude_code = header_text("prelude").partition("#pragma once\n")[2]
    tma_code = header_text("tma").partition("#pragma once\n")[2].replace(include_directive("prelude").lstrip("\n"), "")
    assert tu == "\n" + prelude_code + "\n" + tma_code + "\n"
    # a header's own includes are expanded where they stand when nothing included them before
    assert expand_includes(include_directive("tma")).startswith("\n" + prelude_code)


def test_an_unknown_header_is_named():
    with pytest.raises(KeyError, match=r"no tilejit header 'nope'.*there are: .*prelude"):
        expand_includes(include_directive("nope"))


def _matmul_source(arch: str) -> str:
    a = torch.empty(256, 256, dtype=torch.float16, device="meta")
    return matmul.compile(a, a, a, arch=arch, stop_after="cuda", BM=128, BN=128, BK=64, num_warps=4).cuda


def test_generated_source_includes_the_headers_and_its_expansion_compiles_alone():
    source = _matmul_source("sm_90a")
    assert source.startswith(include_directive("prelude") + include_directive("support"))
    assert include_directive("tma") in source and include_directive("wgmma") in source
    assert "tj_mbar_init(unsigned" not in source  # helpers are included, not pasted
    tu = expand_includes(source)
    assert not re.search(r'#include "tilejit/', tu) and "tj_mbar_init(unsigned" in tu
    # the expansion needs no header: the same kernel from both texts
    from_source = compile_cuda(source, name="tj_mm", arch="sm_90a", keep_ptx=True)
    from_tu = compile_cuda(tu, name="tj_mm", arch="sm_90a", keep_ptx=True)

    def code(ptx: str) -> list[str]:  # without -lineinfo's line numbers, file names and debug strings, which differ
        lines = ptx.split(".section\t.debug_str")[0].splitlines()
        return [line for line in lines if line.strip() and not re.match(r"\s*\.(loc|file)\b", line)]

    assert any(".entry" in line for line in code(from_source.ptx)) and code(from_source.ptx) == code(from_tu.ptx)


def test_a_header_edit_changes_the_cache_key(tmp_path):
    """``compiler.package_digest`` (the compiler fingerprint in every kernel's key) covers the headers."""
    package = tmp_path / "tilejit"
    shutil.copytree(Path(compiler.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    first = compiler.package_digest(package)
    header = package / "include" / "tilejit" / "tma.cuh"
    header.write_text(header.read_text() + "// one more line\n")
    assert compiler.package_digest(package) != first
    # the real package's fingerprint is this digest, headers included
    assert compiler.compiler_fingerprint() == compiler.package_digest(Path(compiler.__file__).parent)
    assert INCLUDE_DIR == Path(compiler.__file__).parent / "include"


@pytest.mark.skipif(tomllib is None, reason="tomllib is Python 3.11+")
def test_the_wheel_ships_the_headers():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data["tilejit"]
    shipped = {p.relative_to(INCLUDE_DIR.parent).as_posix() for pattern in patterns
               for p in INCLUDE_DIR.parent.glob(pattern)}
    assert {f"include/{name}" for name in header_sources()} <= shipped


def test_headers_are_read_once_per_process():
    assert headers.header_sources() is headers.header_sources()
