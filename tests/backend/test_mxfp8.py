"""Microscaled float8 (OCP MX: e4m3/e5m2 with e8m0 scales per 32 of K; ``T.gemm``'s microscaled form and
``tilejit.ops.mxfp8``) on CPU: the e8m0 dtype's meaning; the interpreter's results against the float64
dequantized product over ragged shapes; each scale reaching its own rows and K block; cubins for sm_80, sm_90a
and sm_100a; the errors for bad scales."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
import tilejit.ops.mxfp8 as X

E4M3, E5M2, E8M0 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def _meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _scales(rows: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """e8m0 scales 2^-10 .. 2^10 (bytes 117 .. 137), one per 32 of K."""
    return torch.randint(117, 138, (rows, tilejit.cdiv(k, 32)), generator=gen, dtype=torch.uint8).view(E8M0)


def _operands(m: int, n: int, k: int, b_dtype=E4M3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=gen) * 3).to(E4M3)
    b = (torch.randn(n, k, generator=gen) * 3).to(b_dtype)
    return a, _scales(m, k, gen), b, _scales(n, k, gen)


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert not out.isnan().any()
    return ((out.double() - ref).norm() / ref.norm()).item()


def test_e8m0_is_a_scale_format_not_a_product_operand():
    assert T.float8_e8m0fnu.is_scale and not T.float8_e8m0fnu.is_fp8
    assert T.float8_e4m3fn.is_fp8 and not T.float8_e4m3fn.is_scale
    assert tilejit.dtypes.from_torch(E8M0) is T.float8_e8m0fnu


@tilejit.kernel
def widen(S, OUT, N: T.constexpr):
    OUT[0:N] = S[0:N].to(T.float32)


def test_the_interpreter_reads_e8m0_as_a_power_of_two(interpret):
    bits = torch.tensor([0, 1, 100, 127, 128, 200, 254, 255], dtype=torch.uint8)
    out = torch.zeros(8)
    widen[(1,)](bits.view(E8M0), out, N=8)
    want = [2.0 ** (e - 127) for e in bits[:-1].tolist()]
    assert out[:-1].tolist() == want and out[-1].isnan()


def test_the_device_conversion_of_e8m0_is_exact_and_in_its_own_header():
    text = widen.compile(_meta(8, dtype=E8M0), _meta(8), N=8, arch="sm_90a", stop_after="cuda").cuda
    assert '#include "tilejit/e8m0.cuh"' in text and "tj_to_f32(" in text
    header = tilejit.backend_cuda.headers.header_text("e8m0")
    # 0 is 2^-127 (float32's subnormal 0x00400000), 0xff NaN, the rest the exponent field itself
    assert "0x00400000u" in header and "e << 23" in header and "0xffu" in header


@pytest.mark.parametrize("m,n,k,b_dtype", [(70, 45, 200, E5M2), (64, 64, 64, E4M3), (1, 72, 40, E4M3),
                                           (130, 129, 257, E4M3)])
def test_mxfp8_matmul_matches_the_dequantized_float64_product(interpret, m, n, k, b_dtype):
    a, sa, b, sb = _operands(m, n, k, b_dtype, seed=m + n + k)
    ref = X.reference(a, sa, b, sb)
    out = X.mxfp8_matmul(a, sa, b, sb, out_dtype=torch.float32, BM=64, BN=64, num_warps=4)
    # exact products of the dequantized operands, float32 sums
    assert out.dtype == torch.float32 and _error(out, ref) < 1e-6
    bf16 = X.mxfp8_matmul(a, sa, b, sb, BM=64, BN=64, num_warps=4)
    assert bf16.dtype == torch.bfloat16 and _error(bf16, ref) < 4e-3


def test_each_scale_reaches_its_own_row_and_k_block(interpret):
    """One row's scale in one K block is 2^12 (a column's likewise): the result matches the product with those
    scales and differs from the one with the scale in the neighbouring block."""
    m, n, k = 40, 24, 160
    a, sa, b, sb = _operands(m, n, k, seed=7)
    sa.view(torch.uint8).fill_(127)
    sb.view(torch.uint8).fill_(127)
    sa.view(torch.uint8)[5, 3] = 139
    sb.view(torch.uint8)[17, 1] = 139
    out = X.mxfp8_matmul(a, sa, b, sb, out_dtype=torch.float32, BM=64, BN=64, num_warps=4)
    assert _error(out, X.reference(a, sa, b, sb)) < 1e-6
    shifted = sa.clone()
    shifted.view(torch.uint8)[5, 3], shifted.view(torch.uint8)[5, 2] = 127, 139
    assert _error(out, X.reference(a, shifted, b, sb)) > 1e-2


@tilejit.kernel
def transposed_mx(A, SA, B, SB, C, BK: T.constexpr):
    # op(a) = A^T (A given K x M), op(b) = B (K x N): the scales still run (rows of op(a) / columns of op(b), K/32)
    acc = T.gemm(A[0:BK, 0:32], B[0:BK, 0:16], None, transpose_a=True, scale_a=SA[0:32, 0:BK // 32],
                 scale_b=SB[0:16, 0:BK // 32])
    C[0:32, 0:16] = acc


def test_scales_follow_k_when_operands_are_transposed(interpret):
    gen = torch.Generator().manual_seed(3)
    at = (torch.randn(96, 32, generator=gen) * 2).to(E4M3)
    b = (torch.randn(96, 16, generator=gen) * 2).to(E5M2)
    sa, sb = _scales(32, 96, gen), _scales(16, 96, gen)
    out = torch.full((32, 16), float("nan"))
    transposed_mx[(1,)](at, sa, b, sb, out, BK=96)
    assert _error(out, X.reference(at.T, sa, b.T, sb)) < 1e-6


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_cubins_for_every_arch(arch):
    m, n, k = 1000, 2112, 7168
    compiled = X.mxfp8_mm.compile(_meta(m, k, dtype=E4M3), _meta(m, k // 32, dtype=E8M0), _meta(n, k, dtype=E5M2),
                                  _meta(n, k // 32, dtype=E8M0), _meta(m, n, dtype=torch.bfloat16), arch=arch,
                                  BK=X.BK, **X.default_config(8192, 8192))
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    # the dequantized operands multiply in bfloat16 on each arch's tensor cores
    instruction = {"sm_80": "on mma.sync.m16n8k16", "sm_90a": "on wgmma.m64n128k16",
                   "sm_100a": "on tcgen05.mma.kind::f16"}[arch]
    assert f"// gemm 128x128x64 {instruction}" in compiled.asm["cuda"]


@tilejit.kernel
def bad_mx(A, B, C, SA, SB, WHICH: T.constexpr):
    a = A[0:32, 0:64]
    b = B[0:16, 0:64]
    if WHICH == "shape":
        C[0:32, 0:16] = T.gemm(a, b, None, transpose_b=True, scale_a=SA[0:32, 0:1], scale_b=SB[0:16, 0:2])
    elif WHICH == "mixed":
        C[0:32, 0:16] = T.gemm(a, b, None, transpose_b=True, scale_a=SA[0:32, 0:2], scale_b=1.0)
    elif WHICH == "k":
        C[0:32, 0:16] = T.gemm(A[0:32, 0:48], B[0:16, 0:48], None, transpose_b=True, scale_a=SA[0:32, 0:2],
                               scale_b=SB[0:16, 0:2])
    elif WHICH == "operands":
        C[0:32, 0:16] = T.gemm(a.to(T.bfloat16), b.to(T.bfloat16), None, transpose_b=True, scale_a=SA[0:32, 0:2],
                               scale_b=SB[0:16, 0:2])
    elif WHICH == "arith":
        C[0:32, 0:2] = SA[0:32, 0:2] * SA[0:32, 0:2]
    else:
        SA[0:32, 0:2] = C[0:32, 0:2]


@pytest.mark.parametrize("which,message", [
    ("shape", r"scale_a of a microscaled matrix product must be a float8_e8m0fnu tile of shape \(32, 2\)"),
    ("mixed", r"scale_b of a microscaled matrix product must be a float8_e8m0fnu tile of shape \(16, 2\)"),
    ("k", "needs K a multiple of 32"),
    ("operands", "takes 2-D float8 tiles; operand a"),
    ("arith", r"arithmetic on f8e8m0 \(e8m0 scale\) values is not supported"),
    ("cast", "conversion of f32 to f8e8m0 is not supported in a kernel"),
])
def test_bad_microscaled_products_are_located_errors(which, message):
    args = (_meta(32, 64, dtype=E4M3), _meta(16, 64, dtype=E4M3), _meta(32, 16), _meta(32, 2, dtype=E8M0),
            _meta(16, 2, dtype=E8M0))
    with pytest.raises(tilejit.CompilationError, match=message) as info:
        bad_mx.compile(*args, WHICH=which, arch="sm_90a", stop_after="ir")
    assert "test_mxfp8.py" in str(info.value)


@pytest.mark.parametrize("change,message", [
    (dict(sa=(64, 9)), r"a_scales must be torch.float8_e8m0fnu of shape \(64, 10\)"),
    (dict(sb_dtype=torch.float32), r"b_scales must be torch.float8_e8m0fnu"),
    (dict(a_dtype=torch.bfloat16), "a must be float8"),
    (dict(b=(40, 256)), "b is given N x K"),
])
def test_bad_op_operands_are_refused(change, message):
    a = torch.zeros(64, 300, dtype=change.get("a_dtype", E4M3))
    b = torch.zeros(*change.get("b", (40, 300)), dtype=E4M3)
    sa = torch.ones(*change.get("sa", (64, 10))).to(E8M0)
    sb = torch.ones(40, 10).to(change.get("sb_dtype", E8M0))
    with pytest.raises(ValueError, match=message):
        X.mxfp8_matmul(a, sa, b, sb)
