"""The issue-16 language constructs (tests/lang_kernels.py) compile to cubins with NVRTC for sm_80 and sm_90a."""
from __future__ import annotations

import pytest
import torch

import lang_kernels as lk
from test_compile_all import check_cubin

f32, i32, i64 = torch.float32, torch.int32, torch.int64
ARCHS = ["sm_80", "sm_90a"]


def m(*shape, dtype=f32):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.fixture(scope="module", autouse=True)
def _fresh_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_CACHE_DIR", str(tmp_path_factory.mktemp("tilejit-cache")))
        mp.delenv("TILEJIT_INTERPRET", raising=False)
        yield


CASES = {
    "scalar_index": (lk.scalar_index, lambda: (m(5, 7), m(5, 7)), dict(BN=8)),
    "scalar_index_mixed": (lk.scalar_index_mixed, lambda: (m(8, 16), m(16), m(8, 16), 3, 5), dict(BN=16)),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_to_cubin(name, arch):
    kernel, args, kwargs = CASES[name]
    compiled = kernel.compile(*args(), arch=arch, **kwargs)
    check_cubin(compiled, arch, kwargs.get("num_warps", 4))
