"""The matrix-product features through the interpreter and the IR: ``T.gemm(..., out_dtype=)`` (float16
accumulation rounded once per 16-wide k step), batched products of 3-D tiles, and
``T.sum(a[:, :, None] * b[None, :, :], 1)`` recognized as ``a @ b``. The located errors of their misuse are in
test_errors_corpus.py; cubins for every arch in tests/backend/test_dot_compile.py."""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from filecheck import filecheck
import dot_kernels as dk
from tilejit.interpreter import F16_ACC_K_STEP


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TILEJIT_INTERPRET", "1")


def f16_accumulated(a: torch.Tensor, b: torch.Tensor, bk: int) -> torch.Tensor:
    """A @ B accumulated in float16 the way the language defines it: per BK block of the kernel's loop (zero
    padded past K), per 16 values of K, the step's float32 sum added and rounded to float16."""
    m, k = a.shape
    acc = torch.zeros(m, b.shape[1], dtype=torch.float16)
    for k0 in range(0, k, bk):
        for s in range(k0, min(k0 + bk, k), F16_ACC_K_STEP):
            e = min(s + F16_ACC_K_STEP, k)
            acc = (acc.float() + a[:, s:e].float() @ b[s:e].float()).half()
    return acc


# -- out_dtype --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trans_b", [False, True])
def test_f16_accumulation_matches_the_per_step_rounding(interpret, trans_b):
    torch.manual_seed(0)
    M, N, K = 37, 45, 70  # ragged against 16 x 16 x 32 tiles; K is not a multiple of 16
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    c = torch.full((M, N), float("nan"), dtype=torch.float16)
    dk.matmul_out_dtype[(3, 3)](a, b.T.contiguous() if trans_b else b, c, OUT=T.float16, TRANS_B=trans_b,
                                BM=16, BN=16, BK=32)
    torch.testing.assert_close(c, f16_accumulated(a, b, 32), rtol=1e-3, atol=2e-3)
    exact = a.double() @ b.double()
    torch.testing.assert_close(c.double(), exact, rtol=0, atol=0.05)  # within a few f16 ulps of |C| ~ 8


def test_f16_accumulation_loses_what_float32_keeps(interpret):
    """Every product is 1 + 2^-6 and each 16-wide step adds 16.25: once the accumulator passes 1024 (f16 ulp 1)
    the .25 is rounded away at every step, which a float32 accumulator keeps."""
    K = 4096
    a = torch.ones(16, K, dtype=torch.float16)
    b = torch.full((K, 16), 1 + 2 ** -6, dtype=torch.float16)
    c16 = torch.full((16, 16), float("nan"), dtype=torch.float32)
    c32 = torch.full((16, 16), float("nan"), dtype=torch.float32)
    dk.matmul_out_dtype[(1, 1)](a, b, c16, OUT=T.float16, TRANS_B=False, BM=16, BN=16, BK=64)
    dk.matmul_out_dtype[(1, 1)](a, b, c32, OUT=T.float32, TRANS_B=False, BM=16, BN=16, BK=64)
    expected16 = torch.tensor(0.0, dtype=torch.float16)
    for _ in range(K // 16):
        expected16 = (expected16.float() + 16.25).half()
    assert torch.equal(c16, torch.full((16, 16), expected16.item()))
    assert torch.equal(c32, torch.full((16, 16), K * (1 + 2 ** -6)))
    assert c16[0, 0].item() < c32[0, 0].item() - 20


def test_out_dtype_defaults_are_accepted_explicitly(interpret):
    a = torch.randint(-100, 100, (20, 64), dtype=torch.int8)
    b = torch.randint(-100, 100, (64, 24), dtype=torch.int8)

    @tilejit.kernel
    def k(A, B, C, OUT: T.constexpr):
        C[0:32, 0:32] = T.gemm(A[0:32, 0:64], B[0:64, 0:32], None, out_dtype=OUT)

    c = torch.zeros(20, 24, dtype=torch.int32)
    k[(1,)](a, b, c, OUT=T.int32)
    assert torch.equal(c, (a.long() @ b.long()).int())
    x, y = torch.randn(20, 64, dtype=torch.float16), torch.randn(64, 24, dtype=torch.float16)
    c = torch.zeros(20, 24)
    k[(1,)](x, y, c, OUT=T.float32)
    torch.testing.assert_close(c.double(), x.double() @ y.double(), rtol=1e-5, atol=1e-5)


def test_out_dtype_ir():
    ir = dk.matmul_out_dtype.ir(meta(64, 64), meta(64, 64), meta(64, 64), OUT=T.float16, TRANS_B=False, BM=64,
                                BN=64, BK=32)
    filecheck(ir, r"""
    CHECK: tj.splat {{.*}} : tile<64x64xf16>
    CHECK: tj.for
    CHECK: tj.gemm {{.*}} : tile<64x64xf16>
    CHECK: tj.store
    """)


def test_out_dtype_reaches_every_lowering():
    """mma.sync f16.f16.f16.f16 (sm_80), wgmma .f16 (sm_90a), tcgen05 kind::f16 with D type F16 (sm_100a); an
    f16 accumulator never takes an f32 form, and a wgmma one is not left in flight across iterations."""
    from tilejit.backend_cuda.lower_tcgen05 import instr_desc
    from tilejit import dtypes as D

    args = (meta(256, 256), meta(256, 256), meta(256, 256))
    kw = dict(OUT=T.float16, TRANS_B=True, BM=128, BN=128, BK=64, num_warps=8)
    sm80 = dk.matmul_out_dtype.compile(*args, arch="sm_80", stop_after="cuda", **kw)
    filecheck(sm80.cuda, r"""
    CHECK: mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0, %1}
    CHECK-NOT: .f32.f16.f16.f32
    CHECK: tj_mma_m16n8k16_f16_f16acc(tj_d[0], tj_d[1],
    """)
    sm90 = dk.matmul_out_dtype.compile(*args, arch="sm_90a", stop_after="cuda", **kw)
    filecheck(sm90.cuda, r"""
    CHECK: unsigned tj_h[32];
    CHECK: tj_wgmma_fence();
    CHECK: wgmma.mma_async.sync.aligned.m64n128k16.f16.f16.f16 {%0, {{.*}}, %31}
    CHECK-NOT: .f32.f16.f16
    CHECK: wgmma.wait_group.sync.aligned 0;
    CHECK: .bits = (unsigned short)(tj_h[i] >> 16);
    """)
    assert "async_mma" not in sm90.ir
    sm100 = dk.matmul_out_dtype.compile(*args, arch="sm_100a", stop_after="cuda", **kw)
    desc = instr_desc(D.float16, D.float16, D.float16, 128, 128)
    assert desc >> 4 & 3 == 0  # PTX ISA Table 42: D format F16
    filecheck(sm100.cuda, rf"""
    CHECK: tcgen05.mma.cta_group::1.kind::f16
    CHECK-SAME: "r"({desc:#x}u)
    CHECK: tcgen05.ld.sync.aligned.32x32b
    CHECK-SAME: "=r"(tj_w[0])
    """)


def test_f16_accumulator_is_refused_by_f32_lowerings(monkeypatch):
    monkeypatch.setenv("TILEJIT_GEMM_LOWERING", "mma_sync_m16n8k16")
    with pytest.raises(tilejit.CompilationError, match="accumulator is f32"):
        dk.matmul_out_dtype.compile(meta(64, 64), meta(64, 64), meta(64, 64), OUT=T.float16, TRANS_B=False,
                                    BM=64, BN=64, BK=32, arch="sm_80")


# -- batched products -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("computed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_batched_matmul(interpret, dtype, computed):
    torch.manual_seed(1)
    Bz, M, N, K = 5, 20, 24, 40  # the batch of 5 is ragged against BT = 2, the rest against 16
    a = torch.randn(Bz, M, K, dtype=dtype)
    b = torch.randn(Bz, K, N, dtype=dtype)
    c = torch.full((Bz, M, N), float("nan"))
    dk.batched_matmul[(2, 2, 3)](a, b, c, COMPUTED=computed, BT=2, BM=16, BN=16, BK=16)
    tol = 2e-3 if dtype == torch.float32 else 1e-5  # float32 operands: tf32, as for 2-D products
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=tol, atol=tol * 10)


def test_batched_dot_of_loaded_tiles(interpret):
    a = torch.randn(3, 30, 16, dtype=torch.bfloat16)
    b = torch.randn(3, 16, 20, dtype=torch.bfloat16)
    c = torch.full((3, 30, 20), float("nan"))
    dk.batched_dot[(2, 2, 2)](a, b, c, BT=2, BM=16, BN=16, BK=16)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)


def test_batched_dot_ir_slices_loads_and_registers():
    # loaded operands: one 2-D load per batch, the 3-D loads are gone
    ir = dk.batched_dot.ir(meta(4, 64, 32), meta(4, 32, 64), meta(4, 64, 64, dtype=torch.float32), BT=2, BM=64,
                           BN=64, BK=32)
    filecheck(ir, r"""
    CHECK-NOT: shape = [2, 64, 32]
    CHECK: tj.load %A[{{.*}}] {shape = [1, 64, 32], dropped = [0]} : tile<64x32xf16>
    CHECK: tj.load %B[{{.*}}] {shape = [1, 32, 64], dropped = [0]} : tile<32x64xf16>
    CHECK: tj.gemm {{.*}} : tile<64x64xf32>
    CHECK: tj.load %A[{{.*}}] {shape = [1, 64, 32], dropped = [0]} : tile<64x32xf16>
    CHECK: tj.gemm {{.*}} : tile<64x64xf32>
    CHECK: tj.select {{.*}} : tile<2x64x64xf32>
    CHECK: tj.store
    """)
    # computed operands and the carried 3-D accumulator: sliced by a masked sum over the batch dim
    ir = dk.batched_matmul.ir(meta(4, 64, 64), meta(4, 64, 64), meta(4, 64, 64, dtype=torch.float32),
                              COMPUTED=True, BT=2, BM=64, BN=64, BK=32)
    filecheck(ir, r"""
    CHECK: tj.for
    CHECK: tj.reduce {{.*}} {axis = 0, kind = sum} : tile<64x32xf32>
    CHECK: tj.gemm {{.*}} : tile<64x64xf32>
    CHECK: tj.select {{.*}} : tile<2x64x64xf32>
    CHECK: tj.yield
    """)


# -- multiply-broadcast-sum -------------------------------------------------------------------------------------

def test_broadcast_sum_is_a_product_in_exact_float32(interpret):
    torch.manual_seed(2)
    a = torch.randn(40, 16)
    b = torch.randn(16, 24)
    c = torch.full((40, 24), float("nan"))
    dk.broadcast_sum_dot[(2, 1)](a, b, c, BM=32, BN=32, BK=16)
    # tf32 would be off by ~1e-3; exact float32 products and sums stay within a few float32 ulps
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_broadcast_sum_of_16_bit_tiles(interpret, dtype):
    a = torch.randn(40, 16, dtype=dtype)
    b = torch.randn(16, 24, dtype=dtype)
    c = torch.full((40, 24), float("nan"))
    dk.broadcast_sum_dot[(2, 1)](a, b, c, BM=32, BN=32, BK=16)
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)


def test_broadcast_sum_ir_has_no_3d_tile():
    ir = dk.broadcast_sum_dot.ir(meta(64, 32, dtype=torch.float32), meta(32, 64, dtype=torch.float32),
                                 meta(64, 64, dtype=torch.float32), BM=32, BN=64, BK=32)
    filecheck(ir, r"""
    CHECK-NOT: tile<32x32x64
    CHECK: tj.gemm {{.*}}precision = ieee} : tile<32x64xf32>
    CHECK-NOT: tile<32x32x64
    """)
    ir = dk.broadcast_sum_dot.ir(meta(64, 32), meta(32, 64), meta(64, 64), BM=32, BN=64, BK=32)
    filecheck(ir, r"""
    CHECK: tj.gemm {{.*}} : tile<32x64xf32>
    CHECK-NOT: precision
    """)


def test_other_3d_sums_are_left_alone(interpret):
    """Only the exact pattern becomes a product: summing over axis 0 or 2, or a different expand, stays a sum."""
    @tilejit.kernel
    def k(A, B, C0, C2):
        a = A[0:8, 0:16]
        b = B[0:16, 0:4]
        p = a[:, :, None] * b[None, :, :]
        C0[0:16, 0:4] = T.sum(p, 0)
        C2[0:8, 0:16] = T.sum(p, 2)

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    c0, c2 = torch.zeros(16, 4), torch.zeros(8, 16)
    k[(1,)](a, b, c0, c2)
    torch.testing.assert_close(c0, a.sum(0)[:, None] * b)
    torch.testing.assert_close(c2, a * b.sum(1)[None, :])
    assert "tj.gemm" not in k.ir(meta(8, 16, dtype=torch.float32), meta(16, 4, dtype=torch.float32),
                                 meta(16, 4, dtype=torch.float32), meta(8, 16, dtype=torch.float32))
