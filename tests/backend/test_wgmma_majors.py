"""wgmma reads every operand major-ness of 16-bit matrices: A given K x M (``transpose_a``) is M-major in shared
memory and goes in through the descriptor's transpose immediate (``imm-trans-a`` = 1), as N-major B does, so
TN and TT matmuls stay on wgmma instead of falling back to mma.sync. 8-bit and tf32 operands have no transpose
immediates: their MN-major operands reach wgmma through a transposing shared-memory copy, or (tf32) as a register
fragment of the instruction's A (test_wgmma_mn_major.py).
"""
from __future__ import annotations

import re

import pytest
import torch

from _lowering import kernel_body, lower
from kernels import matmul_any

import tilejit.language as T


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _operands(ta, tb, m=1000, n=768, k=512, dtype=torch.float16):
    a = meta(k, m, dtype=dtype) if ta else meta(m, k, dtype=dtype)
    b = meta(n, k, dtype=dtype) if tb else meta(k, n, dtype=dtype)
    return a, b, meta(m, n, dtype=torch.float32)


@pytest.mark.parametrize("tb", [False, True], ids=["TN", "TT"])
@pytest.mark.parametrize("tile", [(64, 64, 4), (128, 128, 4), (128, 256, 8)], ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_m_major_a_is_a_transposed_descriptor(dtype, tile, tb):
    bm, bn, warps = tile
    fn, cuda = lower(matmul_any, *_operands(True, tb, dtype=dtype), BM=bm, BN=bn, BK=64, TA=True, TB=tb,
                     ACC=T.float32, num_warps=warps, arch="sm_90a")
    gemm = next(op for op in fn.walk() if op.kind.mnemonic == "gemm")
    assert gemm.attrs.impl == "wgmma_m64nNk16"
    body = kernel_body(cuda)
    # imm-trans-a = 1 on every instruction; imm-trans-b = 1 for N-major B (TN), 0 for K-major B (TT)
    immediates = set(re.findall(r"p, 1, 1, (\d), (\d);", body))
    assert immediates == {("1", "0" if tb else "1")}
    # A's tile is BK x BM (64 rows): a k16 step moves 16 rows of 128 bytes, a 64-row slab moves one panel; the
    # warpgroup's descriptor starts at its slab (LBO = the panel) and each instruction adds offset >> 4
    panel = 64 * 128
    assert f"tj_adesc = tj_wgmma_desc(tj_a + tj_wg * {panel}, {panel}, 1024);" in body
    added = {int(x) * 16 for x in re.findall(r"\(tj_adesc \+ (\d+)ull\)", body)} | {0}
    slabs = bm // (64 * (warps // 4))
    assert added == {kk * 2048 + s * (warps // 4) * panel for kk in range(4) for s in range(slabs)}


def test_k_major_a_is_unchanged():
    _, cuda = lower(matmul_any, *_operands(False, False), BM=128, BN=128, BK=64, TA=False, TB=False,
                    ACC=T.float32, num_warps=4, arch="sm_90a")
    assert set(re.findall(r"p, 1, 1, (\d), (\d);", kernel_body(cuda))) == {("0", "1")}


@pytest.mark.parametrize("ta, tb", [(True, True), (True, False), (False, False)], ids=["TT", "TN", "NN"])
@pytest.mark.parametrize("dtype, acc, bk", [(torch.float8_e4m3fn, T.float32, 128), (torch.int8, T.int32, 128),
                                            (torch.float32, T.float32, 32)], ids=["fp8", "int8", "tf32"])
def test_mn_major_operands_of_other_dtypes_reach_wgmma_through_a_transposing_copy(dtype, acc, bk, ta, tb, monkeypatch):
    """8-bit and tf32 operands have no transpose immediates: each MN-major one is copied into a K-major tile
    (``transpose_copy``) and the gemm reads that one with its transpose flag flipped (with the descriptor lowering
    pinned: by default a single MN-major operand is read into registers, tests/backend/test_wgmma_mn_major.py and
    test_wgmma_mn_major_8bit.py)."""
    kwargs = dict(PRECISION="tf32") if dtype == torch.float32 else {}
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", {torch.float32: "wgmma_m64nNk8_tf32", torch.int8: "wgmma_m64nNk32_int8",
                                                 torch.float8_e4m3fn: "wgmma_m64nNk32_fp8"}[dtype])
    fn, _ = lower(matmul_any, *_operands(ta, tb, m=1024, dtype=dtype), BM=128, BN=128, BK=bk, TA=ta, TB=tb,
                  ACC=acc, num_warps=4, arch="sm_90a", **kwargs)
    gemm = next(op for op in fn.walk() if op.kind.mnemonic == "gemm")
    assert gemm.attrs.impl.startswith("wgmma")
    assert (gemm.attrs.transpose_a, gemm.attrs.transpose_b) == (False, True)  # both K-major
    copies = [op for op in fn.walk() if op.kind.mnemonic == "transpose_copy"]
    assert len(copies) == int(ta) + int(not tb)
    for i, flipped in enumerate((ta, not tb)):
        assert (gemm.operands[i].owner in copies) == flipped


def test_tn_compiles_without_spills():
    compiled = matmul_any.compile(*_operands(True, False), BM=128, BN=256, BK=64, TA=True, TB=False,
                                  ACC=T.float32, num_warps=8, arch="sm_90a")
    assert compiled.meta["spills"] == 0 and compiled.meta["registers"] <= 255


def _desc(addr: int, lbo: int, sbo: int) -> int:
    """tj_wgmma_desc as the prelude writes it (PTX ISA 9.7.15.5.1.2.2)."""
    return ((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (1 << 62)


def test_adding_an_offset_to_a_descriptor_equals_encoding_the_moved_address():
    """The lowering encodes one descriptor per operand and adds ``offset >> 4`` per instruction: the same bits
    as encoding ``addr + offset`` for every 16-byte-aligned address and offset within 227 KB of shared memory."""
    limit = 227 * 1024
    for addr in range(0, limit, 1040):
        addr -= addr % 16
        for off in (0, 16, 32, 96, 2048, 6144, 8192, 16384 + 96, 65536):
            if addr + off < limit:
                assert _desc(addr, 8192, 1024) + (off >> 4) == _desc(addr + off, 8192, 1024)
