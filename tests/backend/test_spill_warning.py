"""A compile whose threads spill kilobytes to local memory warns, naming the kernel, the spill and what would avoid
it; a tuned config's compile stays quiet."""
from __future__ import annotations

import warnings

import pytest
import torch

from kernels import matmul
from tilejit.backend_cuda.nvrtc import nvrtc_supports

pytestmark = [pytest.mark.usefixtures("fresh_compile_cache"),
              pytest.mark.skipif(not nvrtc_supports("sm_80"), reason="NVRTC cannot target sm_80")]


def _operands():
    return (torch.empty(1024, 512, dtype=torch.float16, device="meta"),
            torch.empty(512, 1024, dtype=torch.float16, device="meta"),
            torch.empty(1024, 1024, dtype=torch.float16, device="meta"))


def test_tiles_too_large_for_the_threads_warn():
    """128x256 float32 accumulators on 4 warps: 256 values a thread, beyond the 255 registers it may have."""
    with pytest.warns(RuntimeWarning, match=r"kernel matmul: ptxas spilled [\d,]+ bytes a thread .*num_warps"):
        compiled = matmul.compile(*_operands(), BM=128, BN=256, BK=32, num_warps=4, arch="sm_80")
    assert compiled.meta["spills"] >= 1024


def test_a_config_that_fits_compiles_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = matmul.compile(*_operands(), BM=128, BN=128, BK=32, num_warps=8, arch="sm_80")
    assert not compiled.meta["spills"]
