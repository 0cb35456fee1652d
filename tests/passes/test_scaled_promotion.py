"""``passes/scaled_promotion.py``: a block-scaled float8 product (a fresh wgmma gemm and the FMA that scales it into
the accumulator) becomes one promoted gemm with a scale operand on sm_90a, and stays as it is where the product is
not that (other targets, a product read twice, a product over more than one block of K); the verifier's rules
for the scaled form."""
from __future__ import annotations

import re

import pytest
import torch

import tilejit
import tilejit.language as T
import tilejit.ops.fp8_blockscaled as F
from tilejit import dtypes as D
from tilejit.ir.ops import GemmAttrs, _gemm as gemm_rule
from tilejit.ir.types import Scope, TileType

E4M3 = torch.float8_e4m3fn


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _blockscaled_ir(arch: str, **config) -> str:
    m, n, k = 1000, 2112, 7168
    return F.blockscaled_mm.compile(_meta(m, k, dtype=E4M3), _meta(m, 56), _meta(n, k, dtype=E4M3), _meta(17, 56),
                                    _meta(m, n, dtype=torch.bfloat16), arch=arch, stop_after="passes",
                                    **config).final_ir


def _gemms(ir: str) -> list[str]:
    return [line for line in ir.splitlines() if "tj.gemm" in line]


@pytest.mark.parametrize("config", [dict(BM=128, BN=128, STAGES=4, num_warps=8, persistent=True),
                                    dict(BM=64, BN=64, STAGES=4, num_warps=4)])
def test_sm90a_folds_the_scale_into_the_gemm(config):
    ir = _blockscaled_ir("sm_90a", **config)
    (gemm,) = _gemms(ir)
    assert re.search(r"tj\.gemm %\w+, %\w+, %\w+, %\w+ \{", gemm) and "precision = precise" in gemm
    assert "tj.fma" not in ir


@pytest.mark.parametrize("arch", ["sm_89", "sm_100a"])
def test_other_targets_keep_the_product_and_its_fma(arch):
    ir = _blockscaled_ir(arch, BM=64, BN=64, STAGES=3, num_warps=4)
    (gemm,) = _gemms(ir)
    assert re.search(r"tj\.gemm %\w+, %\w+, %\w+ \{", gemm) and "precision = fast" in gemm
    assert "tj.fma" in ir


@tilejit.kernel
def product_read_twice(A, SA, B, C, D, BM: T.constexpr, BN: T.constexpr):
    """A scaled product whose fresh sum is also stored: the pair stays (the sum is needed as it is)."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    p = T.gemm(A[m0:m0 + BM, 0:128], B[n0:n0 + BN, 0:128], T.zeros((BM, BN), T.float32), transpose_b=True,
               precision="fast")
    C[m0:m0 + BM, n0:n0 + BN] = p * SA[m0:m0 + BM, 0][:, None] + C[m0:m0 + BM, n0:n0 + BN]
    D[m0:m0 + BM, n0:n0 + BN] = p


@tilejit.kernel
def two_blocks_of_k(A, SA, B, C, BM: T.constexpr, BN: T.constexpr):
    """``T.gemm`` with a scale over 256 of K: the product is precise already (promoted inside), then scaled."""
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    acc = T.gemm(A[m0:m0 + BM, 0:256], B[n0:n0 + BN, 0:256], acc, transpose_b=True, scale_a=SA[m0:m0 + BM, 0])
    C[m0:m0 + BM, n0:n0 + BN] = acc


def test_products_that_are_not_a_fresh_block_are_left_alone():
    a, b = _meta(256, 256, dtype=E4M3), _meta(256, 256, dtype=E4M3)
    ir = product_read_twice.compile(a, _meta(256, 2), b, _meta(256, 256), _meta(256, 256), BM=64, BN=64,
                                    num_warps=4, arch="sm_90a", stop_after="passes").final_ir
    assert all(len(re.findall(r"%\w+", g.split("{")[0].split("=", 1)[1])) == 3 for g in _gemms(ir))
    ir = two_blocks_of_k.compile(a, _meta(256, 2), b, _meta(256, 256), BM=64, BN=64, num_warps=4,
                                 arch="sm_90a", stop_after="passes").final_ir
    assert all(len(re.findall(r"%\w+", g.split("{")[0].split("=", 1)[1])) == 3 for g in _gemms(ir))
    assert "tj.fma" in ir


def test_the_verifier_names_what_a_scaled_gemm_takes():
    """A gemm of four operands is a scaled one: float8 operands over <= 128 of K, an M x N float32 scale,
    precision "precise"; anything else is refused with the rule."""
    fn = F.blockscaled_mm.compile(_meta(256, 256, dtype=E4M3), _meta(256, 2), _meta(256, 256, dtype=E4M3),
                                  _meta(2, 2), _meta(256, 256, dtype=torch.bfloat16), BM=64, BN=64, STAGES=3,
                                  num_warps=4, arch="sm_90a", stop_after="passes")
    assert fn.final_ir  # the folded form verifies

    class FakeValue:
        def __init__(self, shape, dtype):
            self.type = TileType(shape, dtype, Scope.REGISTER)
            self.dtype = dtype

    class FakeOp:
        def __init__(self, operands, precision):
            self.operands = operands
            self.attrs = GemmAttrs(transpose_b=True, precision=precision)
            self.result = FakeValue((64, 64), D.float32)

    f8, f32 = D.float8_e4m3fn, D.float32
    good = [FakeValue((64, 128), f8), FakeValue((64, 128), f8), FakeValue((64, 64), f32), FakeValue((64, 64), f32)]
    assert gemm_rule(FakeOp(good, "precise")) is None
    for operands, precision in [(good, "fast"),
                                (good[:3] + [FakeValue((64, 1), f32)], "precise"),
                                ([FakeValue((64, 256), f8), FakeValue((64, 256), f8)] + good[2:], "precise")]:
        assert "a scaled gemm" in gemm_rule(FakeOp(operands, precision))
