"""The attention kernels (tilejit/ops/fused_attention.py) compile for every config of their space on every arch, and
the layout pass joins the two gemms' accumulator layouts at the loop (the failure the attention issue reported)."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from attention_tiles import fwd_meta_args as _args
from tilejit.ops import fused_attention as attention

ARCHS = [a for a in ("sm_80", "sm_90a", "sm_100a") if nvrtc_supports(a)]


pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py


CASES = [(dim, bm, bn, w) for dim, configs in attention.CONFIGS.items() for bm, bn, w in configs]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dim, bm, bn, warps", CASES, ids=[f"d{d}-{m}x{n}-w{w}" for d, m, n, w in CASES])
def test_every_config_compiles(arch, dim, bm, bn, warps):
    compiled = attention.attn_fwd.compile(*_args(dim), GROUP=2, BM=bm, BN=bn, D=dim, CAUSAL=True, VARLEN=True,
                                          num_warps=warps, arch=arch)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    assert 0 < compiled.shared_bytes <= tilejit.target.Arch.parse(arch).max_shared_bytes
    assert "tj.gemm" in compiled.asm["ir"]


@pytest.mark.parametrize("bm, bn, warps", [(128, 64, 8), (64, 128, 4)])
def test_loop_joins_the_two_accumulator_layouts(bm, bn, warps):
    """m_i / l_i are reduced from the BM x BN scores and scale the BM x D accumulator: with BN != D the two
    gemms' layouts differ, and the loop's carried row statistics take one layout (a conversion where needed)."""
    stages = attention.attn_fwd.compile(*_args(128), GROUP=2, BM=bm, BN=bn, D=128, CAUSAL=False, VARLEN=False,
                                        num_warps=warps, arch="sm_90a", stop_after="passes")
    ir = stages.final_ir
    loop = next(line for line in ir.splitlines() if "tj.for" in line and "iter_args" in line)
    head, results = loop.split(") -> (")
    # every carried value has one type on entry (iter_args) and on exit (results): with BN != D the row
    # statistics (slices of the BM x BN scores' layout) convert to scale the BM x D accumulator
    assert ("tj.convert_layout" in ir) == (bn != 128)


def test_a_tile_too_large_for_shared_memory_is_a_located_compile_error():
    @tilejit.kernel
    def huge(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, A.shape[1], BK, stages=4):
            acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
        C[0:BM, 0:BN] = acc.to(C.dtype)

    a = torch.empty(256, 1024, dtype=torch.float16, device="meta")
    with pytest.raises(tilejit.SharedMemoryError) as info:
        huge.compile(a, a, a, BM=256, BN=256, BK=256, num_warps=8, arch="sm_86", stop_after="cuda")
    text = str(info.value)
    assert "test_attention.py" in text and "def huge" in text and "^" in text
    assert "256x256 float16 tile: 131,072 B" in text and "sm_86 allows 101,376" in text
    # the located line and its caret first, then the tiles that fill shared memory
    lines = text.splitlines()
    caret = next(i for i, line in enumerate(lines) if line.strip() == "^")
    assert lines[0].endswith("sm_86 allows 101,376 per block") and "def huge" in lines[caret - 1]
    assert any("256x256 float16 tile" in line for line in lines[caret + 1:])


def test_a_ring_too_deep_for_shared_memory_is_made_shallower():
    """4 stages of 128x256 + 256x64... do not fit sm_80's 163 KB: the compiler pipelines 3 deep instead."""
    a = torch.empty(1024, 1024, dtype=torch.float16, device="meta")
    from kernels import matmul_staged

    stages = matmul_staged.compile(a, a, a, BM=128, BN=256, BK=64, num_warps=8, num_stages=4, arch="sm_80",
                                   stop_after="cuda")
    assert stages.shared_bytes <= 163 * 1024
    assert "stages=3" in stages.final_ir and "stages=4" not in stages.final_ir
    deep = matmul_staged.compile(a, a, a, BM=128, BN=256, BK=64, num_warps=8, num_stages=4, arch="sm_90a",
                                 stop_after="cuda")
    assert "stages=4" in deep.final_ir  # 227 KB on sm_90a: the ring the user asked for


@pytest.mark.parametrize("bm, bn, warps", [(128, 64, 8), (64, 64, 4), (128, 128, 8)])
def test_probabilities_feed_the_second_gemm_from_registers(bm, bn, warps):
    """P = exp2(S - m).to(bf16) holds the first gemm's accumulator layout, which is the A fragment of wgmma:
    the second gemm reads it from registers (no staging through shared memory, no C7519 fences)."""
    stages = attention.attn_fwd.compile(*_args(128), GROUP=2, BM=bm, BN=bn, D=128, CAUSAL=True, VARLEN=False,
                                        num_warps=warps, arch="sm_90a", stop_after="cuda")
    gemms = [line for line in stages.final_ir.splitlines() if "tj.gemm" in line]
    # causal: one loop for the blocks below the diagonal, one for the diagonal blocks; each has S = Q K^T then P V
    assert [("wgmma_rs_m64nNk16" in g) for g in gemms] == [False, True] * (len(gemms) // 2) and gemms
    # P is never staged: no value is converted into shared memory
    assert not [line for line in stages.final_ir.splitlines() if "tj.convert_layout" in line and "shared" in line]
    assert "A from registers" in stages.cuda and "unsigned tj_pa[" in stages.cuda
    from tilejit.backend_cuda import nvrtc
    log = nvrtc.compile_cuda(stages.cuda, name="k", arch="sm_90a", options=["--ptxas-options=-v"]).log
    assert "C7519" not in log and "C7514" not in log, log


def test_a_register_operand_in_another_layout_is_staged():
    """A register A operand that is not in a wgmma accumulator layout (here: loaded and scaled element-wise,
    a blocked layout) still goes through shared memory, and mma.sync archs never take the register lowering."""
    @tilejit.kernel
    def scaled_a(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
        acc = T.zeros((BM, BN), T.float32)
        for k0 in T.range(0, A.shape[1], BK):
            a = (A[0:BM, k0:k0 + BK] * 2.0).to(A.dtype)
            acc = T.gemm(a, B[0:BN, k0:k0 + BK], acc, transpose_b=True)
        C[0:BM, 0:BN] = acc

    a = torch.empty(128, 512, dtype=torch.float16, device="meta")
    c = torch.empty(128, 128, dtype=torch.float32, device="meta")
    for arch in ("sm_90a", "sm_80"):
        ir = scaled_a.compile(a, a, c, BM=128, BN=128, BK=64, num_warps=4, arch=arch, stop_after="passes").final_ir
        gemm = next(line for line in ir.splitlines() if "tj.gemm" in line)
        assert "wgmma_rs" not in gemm and "tj.convert_layout" in ir


@pytest.mark.parametrize("dim", [64, 128])
def test_key_blocks_whose_rows_take_no_wgmma_swizzle_compile(dim):
    """176 keys a block: P @ V's A rows (352 bytes) take no wgmma swizzle from shared memory, so the product's
    accumulator layout is mma.sync's; reading P from registers on wgmma would write another layout, so P @ V
    stays on mma.sync (it was switched to wgmma and the compile failed inside tilejit)."""
    compiled = attention.attn_fwd.compile(*_args(dim), GROUP=2, BM=128, BN=176, D=dim, CAUSAL=True, VARLEN=False,
                                          num_warps=8, arch="sm_90a")
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    ir = compiled.asm["ir"]
    gemms = [line for line in ir.splitlines() if "tj.gemm" in line]
    assert gemms and not any("wgmma_rs" in g for g in gemms)
