"""The matrix-product kernels (tests/dot_kernels.py) compile to cubins with NVRTC for sm_80, sm_90a and
sm_100a, each gemm on the lowering expected for its arch and accumulator."""
from __future__ import annotations

import re

import pytest
import torch

import dot_kernels as dk
import tilejit.language as T
from test_compile_all import check_cubin

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
ARCHS = ["sm_80", "sm_90a", "sm_100a"]


def m(*shape, dtype=f16):
    return torch.empty(*shape, dtype=dtype, device="meta")


pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py


def _mma(arch: str, tc: str) -> str:
    return {"sm_80": "mma_sync_m16n8k16", "sm_90a": "wgmma_m64nNk16", "sm_100a": tc}[arch]


# name: (kernel, args, kwargs, {arch: the gemm lowerings expected, in order})
CASES = {
    "f16acc_loop_64": (dk.matmul_out_dtype, lambda: (m(200, 300), m(300, 150), m(200, 150)),
                       dict(OUT=T.float16, TRANS_B=False, BM=64, BN=64, BK=64),
                       {"sm_80": ["mma_sync_m16n8k16_f16acc"], "sm_90a": ["wgmma_m64nNk16_f16acc"],
                        "sm_100a": ["tcgen05_mma_f16_f16acc"]}),
    "f16acc_loop_128_kmajor": (dk.matmul_out_dtype, lambda: (m(300, 512), m(200, 512), m(300, 200)),
                               dict(OUT=T.float16, TRANS_B=True, BM=128, BN=128, BK=64, num_warps=8),
                               {"sm_80": ["mma_sync_m16n8k16_f16acc"], "sm_90a": ["wgmma_m64nNk16_f16acc"],
                                "sm_100a": ["tcgen05_mma_f16_f16acc"]}),
    "f16acc_single_128": (dk.single_gemm_out_dtype, lambda: (m(200, 64), m(64, 150), m(200, 150)),
                          dict(OUT=T.float16, BM=128, BN=64, BK=64),
                          {"sm_80": ["mma_sync_m16n8k16_f16acc"], "sm_90a": ["wgmma_m64nNk16_f16acc"],
                           "sm_100a": ["tcgen05_mma_f16_f16acc"]}),
    "f16acc_fma_k40": (dk.single_gemm_out_dtype, lambda: (m(200, 40), m(40, 150), m(200, 150)),
                       dict(OUT=T.float16, BM=32, BN=32, BK=40), {a: ["fma_fallback"] for a in ARCHS}),
    "f32acc_explicit": (dk.matmul_out_dtype, lambda: (m(200, 300), m(300, 150), m(200, 150, dtype=f32)),
                        dict(OUT=T.float32, TRANS_B=False, BM=64, BN=64, BK=64),
                        {a: [_mma(a, "tcgen05_mma_f16")] for a in ARCHS}),
    "batched_dot_loaded": (dk.batched_dot, lambda: (m(5, 100, 64), m(5, 64, 80), m(5, 100, 80, dtype=f32)),
                           dict(BT=2, BM=64, BN=64, BK=64),
                           {a: [_mma(a, "tcgen05_mma_f16")] * 2 for a in ARCHS}),
    "batched_matmul_computed_bf16": (dk.batched_matmul,
                                     lambda: (m(5, 100, 70, dtype=bf16), m(5, 70, 80, dtype=bf16),
                                              m(5, 100, 80, dtype=f32)),
                                     dict(COMPUTED=True, BT=2, BM=64, BN=64, BK=64),
                                     {a: [_mma(a, "tcgen05_mma_f16")] * 2 for a in ARCHS}),
    "batched_matmul_loaded_f32": (dk.batched_matmul, lambda: (m(3, 40, 70, dtype=f32), m(3, 70, 50, dtype=f32),
                                                              m(3, 40, 50, dtype=f32)),
                                  dict(COMPUTED=False, BT=3, BM=32, BN=32, BK=16), {}),
    "broadcast_sum_f32": (dk.broadcast_sum_dot, lambda: (m(100, 32, dtype=f32), m(32, 80, dtype=f32),
                                                         m(100, 80, dtype=f32)),
                          dict(BM=32, BN=32, BK=32), {a: ["fma_fallback"] for a in ARCHS}),
    "broadcast_sum_f16": (dk.broadcast_sum_dot, lambda: (m(100, 64), m(64, 80), m(100, 80, dtype=f32)),
                          dict(BM=64, BN=64, BK=64), {a: [_mma(a, "tcgen05_mma_f16")] for a in ARCHS}),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_to_cubin(name, arch):
    kernel, args, kwargs, expect = CASES[name]
    compiled = kernel.compile(*args(), arch=arch, **kwargs)
    check_cubin(compiled, arch, kwargs.get("num_warps", 4))
    impls = re.findall(r"tj\.gemm .*impl = (\w+)", compiled.asm["ir"])
    if arch in expect:
        assert impls == expect[arch], impls


def test_broadcast_sum_needs_no_3d_shared_tile():
    """The (M, K, N) tile of products is never built: the kernel's shared memory holds the two operands only."""
    compiled = dk.broadcast_sum_dot.compile(m(128, 64, dtype=f32), m(64, 128, dtype=f32), m(128, 128, dtype=f32),
                                            BM=64, BN=64, BK=64, arch="sm_80")
    assert compiled.shared_bytes <= 2 * 64 * 64 * 4 + 4096, compiled.shared_bytes
