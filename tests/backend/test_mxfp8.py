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
from filecheck import filecheck

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


def _compile_op(arch: str, bk: int, stop_after: str | None = None, **config):
    m, n, k = 1000, 2112, 7168
    config = {**X.default_config(8192, 8192), **config}
    return X.mxfp8_mm.compile(_meta(m, k, dtype=E4M3), _meta(m, k // 32, dtype=E8M0), _meta(n, k, dtype=E5M2),
                              _meta(n, k // 32, dtype=E8M0), _meta(m, n, dtype=torch.bfloat16), arch=arch, BK=bk,
                              stop_after=stop_after, **config)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_the_portable_form_compiles_for_every_arch(arch):
    """K steps of 64 (which sm_100a's block-scaled kind does not take): the operands dequantized and multiplied
    in bfloat16 on each arch's tensor cores."""
    compiled = _compile_op(arch, 64)
    assert compiled.asm["cubin"][:4] == b"\x7fELF"
    instruction = {"sm_80": "on mma.sync.m16n8k16", "sm_90a": "on wgmma.m64n128k16",
                   "sm_100a": "on tcgen05.mma.kind::f16"}[arch]
    assert f"// gemm 128x128x64 {instruction}" in compiled.asm["cuda"]
    assert "block_scale" not in compiled.asm["cuda"] and "tj_to_f32(" in compiled.asm["cuda"]


def test_sm100a_runs_the_block_scaled_tcgen05_kind():
    """128x128 tiles, K steps of 128: four kind::mxf8f6f4.block_scale.block32 MMAs (K = 32 each), both scale
    atoms copied into tensor memory first, each MMA naming its byte (K block) of the scale columns; in the PTX,
    and in the SASS as UTCCP and UTCQMMA when a disassembler is installed. Compiled only: no Blackwell GPU."""
    compiled = _compile_op("sm_100a", 128, num_warps=4)
    text = compiled.asm["cuda"]
    filecheck(text, """
        CHECK: gemm 128x128x128 on tcgen05.mma.kind::mxf8f6f4.block_scale.block32 {{.*}} e8m0 scales in columns 128..135
        CHECK: tj_fence_proxy_async();
        CHECK: tj_tc_sync();
        CHECK: tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" :: "r"(tj_tmem + 128)
        CHECK-NEXT: tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;" :: "r"(tj_tmem + 132)
        CHECK: kind::mxf8f6f4.block_scale.block32 [%0], %1, %2, %3, [%4], [%5], p;
        CHECK-SAME: "r"(0x8a00400u), "r"(tj_tmem + 128), "r"(tj_tmem + 132)
        CHECK-NEXT: "r"(0x28a00410u), "r"(tj_tmem + 128), "r"(tj_tmem + 132)
        CHECK-NEXT: "r"(0x48a00420u), "r"(tj_tmem + 128), "r"(tj_tmem + 132)
        CHECK-NEXT: "r"(0x68a00430u), "r"(tj_tmem + 128), "r"(tj_tmem + 132)
        CHECK-NEXT: tj_tc_commit(tj_tc_bar);
    """)
    assert "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32" in compiled.asm["ptx"]
    assert "tcgen05.cp.cta_group::1.32x128b.warpx4" in compiled.asm["ptx"]
    assert compiled.meta["spills"] in (0, None), compiled.meta
    sass = compiled.asm.get("sass")
    if sass:
        assert "UTCQMMA" in sass and "UTCCP" in sass


def test_shapes_the_block_scaled_kind_does_not_take_fall_back_on_sm100a():
    """N = 256 (two atoms of B's scales, a layout not relied on) takes the dequantized form."""
    text = _compile_op("sm_100a", 128, stop_after="cuda", BM=128, BN=256, num_warps=8).cuda
    assert "block_scale" not in text and "on tcgen05.mma.kind::f16" in text


@pytest.mark.parametrize("a_dtype,b_dtype,m,n,a_id,b_id,want", [
    # PTX ISA 9.7.16.4.2, block-scaled kinds: B scale id 4-5, A type 7-9, B type 10-12, N >> 3 17-22,
    # UE8M0 bit 23, M >> 4 24-28,
    # A scale id 29-30 (no D type field; K = 32 leaves bit 31 clear)
    (T.float8_e4m3fn, T.float8_e4m3fn, 128, 128, 0, 0, 16 << 17 | 1 << 23 | 8 << 24),
    (T.float8_e4m3fn, T.float8_e5m2, 128, 128, 1, 1, 1 << 4 | 1 << 10 | 16 << 17 | 1 << 23 | 8 << 24 | 1 << 29),
    (T.float8_e5m2, T.float8_e4m3fn, 128, 16, 3, 2, 2 << 4 | 1 << 7 | 2 << 17 | 1 << 23 | 8 << 24 | 3 << 29),
    (T.float8_e5m2, T.float8_e5m2, 128, 256, 2, 3, 3 << 4 | 1 << 7 | 1 << 10 | 32 << 17 | 1 << 23 | 8 << 24 | 2 << 29),
])
def test_block_scaled_instruction_descriptor_fields(a_dtype, b_dtype, m, n, a_id, b_id, want):
    from tilejit.backend_cuda.lower_tcgen05_mx import block_scaled_instr_desc
    got = block_scaled_instr_desc(a_dtype, b_dtype, m, n, a_id, b_id)
    assert got == want, f"{got:#010x} != {want:#010x}"
    assert got < 1 << 31 and not got & (1 << 3 | 1 << 6)  # reserved bits, K size
    with pytest.raises(ValueError, match="bytes 0..3"):
        block_scaled_instr_desc(a_dtype, b_dtype, m, n, 4, 0)


def test_the_staged_scales_fill_tcgen05_cp_atoms():
    """Row r, K block c of a 256-row, 8-block tile: atom (r // 128, c // 4) of 512 bytes, byte (r % 32) * 16 +
    (r % 128) // 32 * 4 + c % 4, so that 32x128b.warpx4 puts it in lane r % 32 (of every lane quarter), column
    (r % 128) // 32 of the atom, byte c % 4; every byte of the 4 atoms is used once."""
    from tilejit.backend_cuda.lower_tcgen05_mx import scale_atom_offset
    offsets = {scale_atom_offset(r, c, 8): (r, c) for r in range(256) for c in range(8)}
    assert sorted(offsets) == list(range(4 * 512))
    r, c = 200, 6
    offset = scale_atom_offset(r, c, 8)
    atom, within = divmod(offset, 512)
    lane, word_byte = divmod(within, 16)
    assert (atom, lane, word_byte // 4, word_byte % 4) == (1 * 2 + 1, r % 32, (r % 128) // 32, c % 4)


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


def test_the_op_traces_under_torch_compile_fullgraph(interpret):
    a, sa, b, sb = _operands(70, 40, 96, seed=11)

    def run(a, sa, b, sb):
        return X.mxfp8_matmul(a, sa, b, sb, BM=64, BN=64, num_warps=4)

    compiled = torch.compile(run, fullgraph=True, backend="eager")
    got, want = compiled(a, sa, b, sb), run(a, sa, b, sb)
    assert got.dtype == torch.bfloat16 and got.shape == (70, 40) and torch.equal(got, want)
