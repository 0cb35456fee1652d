"""What the pass pipeline decides, as it shows in the generated CUDA and PTX: the gemm lowering per arch,
transposes folded into the gemm, vector widths, broadcasts, which loads a pipelined loop prefetches, compact
store fallbacks and in-line element-wise copies.

The cases (``kernels.PASS_CASES``) are shared with tests/passes/test_passes.py, which checks the IR they compile
to. Each is compiled once per module through ``kernel.compile(..., arch=...)`` into a fresh cache directory
(NVRTC runs on the CPU); a few go through ``_lowering.lower`` (no NVRTC).
"""
from __future__ import annotations

import re

import pytest

import tilejit
import tilejit.language as T
from tilejit.backend_cuda.nvrtc import compile_cuda, nvrtc_supports
from tilejit.ir import OpKind

from _lowering import kernel_body, lower
from filecheck import filecheck
from kernels import PASS_CASES, PLAIN_PASS_CASES, _mm, example_matmul, meta


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compiled(name) -> the CompiledKernel of a case of PASS_CASES or PLAIN_PASS_CASES (each compiled once per
    module)."""
    seen: dict[str, object] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEJIT_CACHE_DIR", str(tmp_path_factory.mktemp("tilejit-cache")))

        def get(name: str):
            if name not in seen:
                kernel, args, kwargs = {**PASS_CASES, **PLAIN_PASS_CASES}[name]()
                seen[name] = kernel.compile(*args, **kwargs)
            return seen[name]

        yield get


LOWER_ONLY = {"mm80_lowered": lambda: _mm(example_matmul, 128, 128, 32, "sm_80")}


def lowered(name: str):
    """(final IR function, CUDA source) of a case without NVRTC."""
    kernel, args, kwargs = {**PASS_CASES, **LOWER_ONLY}[name]()
    return lower(kernel, *args, **kwargs)


# -- the matmul of examples/matmul.py on sm_80 ------------------------------------------------------------------

def test_example_matmul_sm80_cuda_and_ptx(compiled):
    c = compiled("mm80")
    body = kernel_body(c.asm["cuda"])
    filecheck(body, r"""
        CHECK: software pipeline: 3 stages, 2 tile(s) prefetched 2 iteration(s) ahead
        CHECK-NEXT: #pragma unroll 1
        CHECK-NEXT: for (int tj_s = 0; tj_s < 2; ++tj_s) {
        CHECK: tj_cp_async_16_zfill_if(
        CHECK: tj_cp_async_16_zfill_if(
        CHECK: tj_cp_async_commit();
        CHECK-NOT: tj_cp_async_16_zfill_if(
        CHECK: the gemm's fragments live across iterations
        CHECK-NEXT: unsigned tj_af[2][4][4], tj_bf[2][8][2];
        CHECK-NEXT: tj_cp_async_wait<1>();
        CHECK-NEXT: __syncthreads();
        CHECK: tj_ldmatrix_x4_at<{{[0-9]+}}>(tj_af[0]
        CHECK: tj_ldmatrix_x4_trans_at<{{[0-9]+}}>(tj_bf[0]
        CHECK: for (int64_t
        CHECK-NOT: __syncthreads();
        CHECK: gemm 128x128x32 on mma.sync.m16n8k16 (2x2 warps, 4x8 atoms per warp)
        CHECK-NOT: tj_af[0]
        CHECK: tj_ldmatrix_x4_at<{{[0-9]+}}>(tj_af[1]
        CHECK: tj_ldmatrix_x4_trans_at<{{[0-9]+}}>(tj_bf[1]
        CHECK: prefetch iteration +2
        CHECK: tj_cp_async_16x4_if<
        CHECK: tj_cp_async_16x4_if<
        CHECK: tj_mma_m16n8k16_f16({{.*}}tj_af[0]
        CHECK: tj_cp_async_wait<0>();
        CHECK-NEXT: __syncthreads();
        CHECK: tj_ldmatrix_x4_at<{{[0-9]+}}>(tj_af[0]
        CHECK: tj_ldmatrix_x4_trans_at<{{[0-9]+}}>(tj_bf[0]
        CHECK: tj_mma_m16n8k16_f16({{.*}}tj_af[1]
        CHECK-NOT: tj_mma_m16n8k16
        CHECK: if (tj_prefetch && !tj_inner) {
        CHECK: tj_cp_async_16_zfill_if(
        CHECK: tj_cp_async_commit();
        CHECK: tj_cp_async_wait<0>();
        CHECK: store into
    """)
    assert body.count("tj_mma_m16n8k16_f16(") == 2  # one unrolled atom loop per k16 step
    assert "tj_wgmma" not in body and "convert layout" not in body
    ptx = c.asm["ptx"]
    for needle in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group 1",
                   "cp.async.wait_group 0", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                   "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                   "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"):
        assert needle in ptx, needle
    assert "wgmma" not in ptx and "fence.proxy.async" not in ptx  # the fence is compiled out before sm_90
    assert c.asm["cubin"][:4] == b"\x7fELF"


def test_bf16_matmul_uses_the_bf16_mma(compiled):
    c = compiled("mm80_bf16")
    filecheck(c.asm["ir"], r"""
        CHECK: tj.load %A{{.*}}tile<64x32xbf16, shared, #shared<64x32, swizzle=64B, stages=3>>
        CHECK: tj.load %B{{.*}}tile<32x64xbf16, shared, #shared<32x64, swizzle=128B, stages=3>>
        CHECK: tj.gemm {{.*}}impl = mma_sync_m16n8k16{{.*}}#mma<warps=2x2>
    """)
    body = kernel_body(c.asm["cuda"])
    assert "tj_mma_m16n8k16_bf16(" in body and "tj_mma_m16n8k16_f16(" not in body
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in c.asm["ptx"]


# -- sm_90a: wgmma ---------------------------------------------------------------------------------------------------

def test_example_matmul_sm90a_takes_wgmma(compiled):
    c = compiled("mm90")
    filecheck(c.asm["ir"], r"""
        CHECK-LABEL: tj.func @matmul
        CHECK-SAME: arch = sm_90a
        CHECK: %acc = tj.splat {{.*}} : tile<128x128xf32, reg, #wgmma<warpgroups=1>>
        CHECK: tj.for {{.*}}stages = 3
        CHECK-NEXT: tj.load %A{{.*}}pipeline = 3{{.*}} : tile<128x64xf16, shared, #shared<128x64, swizzle=128B, stages=3>>
        CHECK-NEXT: tj.load %B{{.*}}pipeline = 3{{.*}} : tile<64x128xf16, shared, #shared<64x128, swizzle=128B, panels=2, stages=3>>
        CHECK-NEXT: tj.gemm {{.*}}impl = wgmma_m64nNk16} : tile<128x128xf32, reg, #wgmma<warpgroups=1>>
        CHECK-NEXT: tj.yield
        CHECK-NOT: #mma<
    """)
    body = kernel_body(c.asm["cuda"])
    # generic-proxy writes to shared memory (cp.async, or the mbarrier init of a TMA ring) are fenced
    # before the async proxy (wgmma, TMA) touches them
    assert "tj_fence_proxy_async();" in body
    # the main loop keeps one iteration's wgmma groups in flight and hands ring slots back through "empty"
    # mbarriers (one arrival per warp) instead of a block-wide barrier per k-step
    filecheck(body, r"""
        CHECK: tj_mbar_init(tj_smem_u32 + [[FULL:[0-9]+]] + 8 * s, 1)
        CHECK: tj_mbar_init(tj_smem_u32 + [[EMPTY:[0-9]+]] + 8 * s, 4)
        CHECK: for (int64_t
        CHECK-NEXT: tj_mbar_wait(tj_smem_u32 + [[FULL]] + 8 * (tj_it % 3), (tj_it / 3) & 1);
        CHECK-NOT: __syncthreads
        CHECK: gemm 128x128x64 on wgmma.m64n128k16 (1 warpgroup(s), 2 slab(s) of 64 rows each), left in flight
        CHECK: tj_wgmma_fence();
        CHECK: wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16
        CHECK: tj_wgmma_commit();
        CHECK-NEXT: wgmma.wait_group.sync.aligned 1
        CHECK-NOT: __syncthreads
        CHECK: if ((tid & 31) == 0) tj_mbar_arrive(tj_smem_u32 + [[EMPTY]] + 8 * (tj_slot_next));
        CHECK: if (tj_it > 0) tj_mbar_wait(tj_smem_u32 + [[EMPTY]] + 8 * (tj_slot_next), ((tj_it - 1) / 3) & 1);
        CHECK: tj_mbar_expect_tx(tj_smem_u32 + [[FULL]] + 8 * (tj_slot_next)
        CHECK: wgmma.wait_group.sync.aligned 0
        CHECK: __syncthreads();
        CHECK: tj_mbar_inval
    """)
    # 4 k16 steps x 2 slabs of 64 rows
    assert body.count("wgmma.mma_async.sync.aligned.m64n128k16") == 8
    assert "tj_mma_m16n8k16" not in body and "tj_ldmatrix" not in body
    ptx = c.asm["ptx"]
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx
    assert "wgmma.fence.sync.aligned" in ptx and "wgmma.commit_group.sync.aligned" in ptx
    assert c.asm["cubin"][:4] == b"\x7fELF"


def test_sm90a_two_warpgroups(compiled):
    c = compiled("mm90_wg2")
    filecheck(c.asm["ir"], r"""
        CHECK: num_warps = 8
        CHECK: tj.gemm {{.*}}impl = wgmma_m64nNk16} : tile<128x256xf32, reg, #wgmma<warpgroups=2>>
    """)
    body = kernel_body(c.asm["cuda"])
    # a launch without num_stages: the launch model warp-specializes this one-block-per-SM tile (a producer
    # warpgroup beside the 8 math warps; passes/launch_model.py)
    assert "__launch_bounds__(384, 1)" in body
    assert body.count("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16") == 4  # 4 k16 steps x 1 slab


# -- transposes folded into the gemm ------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["nt", "nt_gemm"])
def test_nt_folds_the_transpose_into_transpose_b(compiled, case):
    c = compiled(case)
    bm, bn = (128, 128) if case == "nt" else (64, 128)
    checks = r"""
        CHECK: tj.load %A{{.*}} : tile<@BM@x32xf16, shared, #shared<@BM@x32, swizzle=64B, stages=3>>
        CHECK-NEXT: tj.load %Bt[%n0, %k0] {{.*}} : tile<@BN@x32xf16, shared, #shared<@BN@x32, swizzle=64B, stages=3>>
        CHECK-NEXT: tj.gemm {{.*}}transpose_a = false, transpose_b = true, impl = mma_sync_m16n8k16
        CHECK-NOT: tj.trans
    """
    filecheck(c.asm["ir"], checks.replace("@BM@", str(bm)).replace("@BN@", str(bn)))
    body = kernel_body(c.asm["cuda"])
    # B stored N x K: its rows already hold k-pairs, so ldmatrix without .trans; A as in NN
    assert re.search(r"tj_ldmatrix_x4_at<\d+>\(tj_bf", body) and "tj_ldmatrix_x4_trans" not in body
    assert re.search(r"tj_ldmatrix_x4_at<\d+>\(tj_af", body)


def test_tn_folds_the_transpose_into_transpose_a(compiled):
    c = compiled("tn")
    filecheck(c.asm["ir"], r"""
        CHECK: tj.load %At[%k0, %m0] {{.*}} : tile<32x128xf16, shared, #shared<32x128, swizzle=128B, panels=2, stages=3>>
        CHECK-NEXT: tj.load %B[%k0, %n0] {{.*}} : tile<32x64xf16, shared, #shared<32x64, swizzle=128B, stages=3>>
        CHECK-NEXT: tj.gemm {{.*}}transpose_a = true, transpose_b = false, impl = mma_sync_m16n8k16
        CHECK-SAME: tile<128x64xf32, reg, #mma<warps=2x2>>
        CHECK-NOT: tj.trans
    """)
    body = kernel_body(c.asm["cuda"])
    # A stored K x M: transposed while loading; B stored K x N as in NN
    assert re.search(r"tj_ldmatrix_x4_trans_at<\d+>\(tj_af", body) and "tj_ldmatrix_x4_at<" not in body
    assert re.search(r"tj_ldmatrix_x4_trans_at<\d+>\(tj_bf", body)


# -- register tiles: blocked loads, reductions, broadcasts ---------------------------------------------------------

def test_softmax_rows_loads_f16_with_16_byte_vectors(compiled):
    c = compiled("softmax_rows")
    filecheck(c.asm["ir"], r"""
        CHECK: tj.load %X[%r, %{{[0-9]+}}] {shape = [1, 1024], dropped = [0]} : tile<1024xf16, reg, #blocked<threads=128, vec=8>>
        CHECK: tj.cast {{.*}} : tile<1024xf32, reg, #blocked<threads=128, vec=8>>
        CHECK: tj.reduce %x_1 {axis = 0, kind = max} : f32
        CHECK: tj.reduce %e {axis = 0, kind = sum} : f32
        CHECK: tj.store {{.*}}%Y
        CHECK-NOT: convert_layout
    """)
    body = kernel_body(c.asm["cuda"])
    assert "*reinterpret_cast<tj_v16*>(&" in body  # the vector load of 8 halves
    assert "convert layout" not in body


def test_softmax_2d_reduces_to_slices_and_broadcasts_for_free(compiled):
    c = compiled("softmax_2d")
    filecheck(c.asm["ir"], r"""
        CHECK: tj.load %X{{.*}} : tile<4x128xf16, reg, #blocked<threads=128, vec=8>>
        CHECK: [[MX:%[0-9]+]] = tj.reduce %x {axis = 1, kind = max} : tile<4xf32, reg, #slice<#blocked<threads=128, vec=8>, axis=1>>
        CHECK-NEXT: [[E1:%[0-9]+]] = tj.expand_dims [[MX]] {axis = 1} : tile<4x1xf32, reg, #expand<#slice<#blocked<threads=128, vec=8>, axis=1>, axis=1>>
        CHECK-NEXT: tj.broadcast [[E1]] {shape = [4, 128]} : tile<4x128xf32, reg, #blocked<threads=128, vec=8>>
        CHECK: tj.reduce %e {axis = 1, kind = sum} : tile<4xf32, reg, #slice<#blocked<threads=128, vec=8>, axis=1>>
        CHECK-NEXT: tj.expand_dims
        CHECK-NEXT: tj.broadcast {{.*}} : tile<4x128xf32, reg, #blocked<threads=128, vec=8>>
        CHECK: tj.store
    """)
    assert "convert_layout" not in c.asm["ir"]
    body = kernel_body(c.asm["cuda"])
    assert body.count("// broadcast: same registers") == 2
    assert "broadcast through shared memory" not in body and "convert layout" not in body


def test_bias_row_meets_the_mma_accumulator_through_a_scratch_broadcast(compiled):
    """What the pass does today: the bias load keeps its coalesced blocked layout (a load is a seed, so the
    broadcast's backward rule cannot re-layout it); the broadcast's result takes the accumulator's #mma layout
    and is materialised through the shared scratch buffer; the add and everything after stay in #mma with no
    convert_layout."""
    c = compiled("bias")
    filecheck(c.asm["ir"], r"""
        CHECK: [[ACC:%acc_1]] = tj.for
        CHECK: tj.yield
        CHECK: [[BIAS:%[0-9]+]] = tj.load %bias[%n0] {shape = [64]} : tile<64xf32, reg, #blocked<threads=128, vec=4>>
        CHECK-NEXT: [[ROW:%[0-9]+]] = tj.expand_dims [[BIAS]] {axis = 0} : tile<1x64xf32, reg, #expand<#blocked<threads=128, vec=4>, axis=0>>
        CHECK-NEXT: [[BC:%[0-9]+]] = tj.broadcast [[ROW]] {shape = [64, 64]} : tile<64x64xf32, reg, #mma<warps=2x2>>
        CHECK-NEXT: %y = tj.binary [[ACC]], [[BC]] {op = add} : tile<64x64xf32, reg, #mma<warps=2x2>>
        CHECK: tj.binary %y, %{{[0-9]+}} {op = max} : tile<64x64xf32, reg, #mma<warps=2x2>>
        CHECK: tj.cast {{.*}} : tile<64x64xf16, reg, #mma<warps=2x2>>
        CHECK: tj.store
    """)
    assert "convert_layout" not in c.asm["ir"]
    body = kernel_body(c.asm["cuda"])
    filecheck(body, r"""
        CHECK: tj_mma_m16n8k16_f16(
        CHECK: load v{{[0-9]+}}_bias window into registers
        CHECK: broadcast through shared memory
        CHECK-NEXT: __syncthreads();  // scratch is free
        CHECK: tj_scratch
        CHECK: __syncthreads();
        CHECK: store into
    """)


def test_accumulator_reduction_is_a_slice_of_mma_and_broadcasts_for_free(compiled):
    c = compiled("rowmax")
    filecheck(c.asm["ir"], r"""
        CHECK: %mx = tj.reduce %acc_1 {axis = 1, kind = max} : tile<64xf32, reg, #slice<#mma<warps=2x2>, axis=1>>
        CHECK-NEXT: tj.expand_dims %mx {axis = 1} : tile<64x1xf32, reg, #expand<#slice<#mma<warps=2x2>, axis=1>, axis=1>>
        CHECK-NEXT: tj.broadcast {{.*}} : tile<64x64xf32, reg, #mma<warps=2x2>>
        CHECK-NEXT: tj.binary %acc_1, {{.*}} {op = sub} : tile<64x64xf32, reg, #mma<warps=2x2>>
        CHECK: tj.store %mx, %R
    """)
    assert "convert_layout" not in c.asm["ir"]
    assert "// broadcast: same registers" in kernel_body(c.asm["cuda"])


# -- pipelining ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["num_stages1", "stages1"])
def test_single_stage_loops_are_not_pipelined(compiled, case):
    c = compiled(case)
    ir = c.asm["ir"]
    filecheck(ir, r"""
        CHECK: tj.for
        CHECK-NEXT: tj.load %A{{.*}} : tile<64x32xf16, shared, #shared<64x32, swizzle=64B, stages=1>>
        CHECK-NEXT: tj.load %B{{.*}} : tile<32x64xf16, shared, #shared<32x64, swizzle=128B, stages=1>>
        CHECK-NEXT: tj.gemm {{.*}}impl = mma_sync_m16n8k16
    """)
    assert "pipeline =" not in ir
    if case == "num_stages1":
        assert "stages = " not in ir  # no stages on the loop either
    body = kernel_body(c.asm["cuda"])
    assert "software pipeline" not in body and "prefetch iteration" not in body
    # each iteration stages its tiles synchronously
    assert body.count("tj_cp_async_commit(); tj_cp_async_wait<0>();") == 2


def test_loads_depending_on_a_loop_carried_value_are_not_prefetched(compiled):
    c = compiled("carried")
    filecheck(c.asm["ir"], r"""
        CHECK: tj.for %k0 = {{.*}} iter_args(%acc_2 = %acc, %off_1 = %{{[0-9]+}}) {{.*}}stages = 3
        CHECK-NOT: pipeline
        CHECK-NEXT: tj.load %A[%m0, %off_1] {{.*}} : tile<64x32xf16, shared, #shared<64x32, swizzle=64B, stages=1>>
        CHECK-NEXT: tj.load %B[%k0, %n0] {{.*}}pipeline = 3{{.*}} : tile<32x64xf16, shared, #shared<32x64, swizzle=128B, stages=3>>
        CHECK: tj.yield
    """)
    body = kernel_body(c.asm["cuda"])
    filecheck(body, r"""
        CHECK: software pipeline: 3 stages, 1 tile(s) prefetched 2 iteration(s) ahead
        CHECK: for (int64_t
        CHECK: tj_cp_async_wait<1>();
        CHECK: stage v{{[0-9]+}}_A window in shared memory (synchronous)
        CHECK: tj_cp_async_commit(); tj_cp_async_wait<0>();
        CHECK: tj_mma_m16n8k16_f16(
    """)


def test_loop_with_only_carried_windows_is_not_pipelined(compiled):
    c = compiled("carried_only")
    ir = c.asm["ir"]
    assert "pipeline =" not in ir
    assert ir.count("stages=1>>") == 2
    assert "software pipeline" not in kernel_body(c.asm["cuda"])


def test_windows_computed_from_the_induction_variable_are_prefetched(compiled):
    c = compiled("induction")
    filecheck(c.asm["ir"], r"""
        CHECK: tj.for %i = {{.*}}stages = 4
        CHECK: %k0 = tj.binary %i, {{.*}} {op = mul}
        CHECK-NEXT: tj.load %A[%m0, %k0] {{.*}}pipeline = 4{{.*}}stages=4>>
        CHECK-NEXT: tj.load %B[%k0, %n0] {{.*}}pipeline = 4{{.*}}stages=4>>
    """)
    body = kernel_body(c.asm["cuda"])
    filecheck(body, r"""
        CHECK: software pipeline: 4 stages, 2 tile(s) prefetched 3 iteration(s) ahead
        CHECK-NEXT: #pragma unroll 1
        CHECK-NEXT: for (int tj_s = 0; tj_s < 3; ++tj_s) {
        CHECK: tj_cp_async_commit();
        CHECK-NOT: tj_cp_async_commit();
        CHECK: unsigned [[RD:tj_rd[0-9]+]] = tj_smem_u32 + 0, [[WR:tj_wr[0-9]+]] = tj_smem_u32 + 12288;
        CHECK: tj_cp_async_wait<2>();
        CHECK-NEXT: __syncthreads();
        CHECK: for (
        CHECK-NOT: tj_cp_async_wait
        CHECK: tj_cp_async_wait<1>();
        CHECK-NEXT: __syncthreads();
        CHECK: tj_cp_async_commit();
        CHECK: [[WR]] = [[RD]]; [[RD]] = [[RD]] == tj_smem_u32 + 12288 ? tj_smem_u32 + 0 : [[RD]] + 4096;
    """)


@tilejit.kernel
def nested_pipelines(A, B, C, D, E, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    """A pipelined loop whose body runs another pipelined loop before its own gemm."""
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK, stages=2):
        inner = T.zeros((BM, BN), T.float32)
        for j0 in T.range(0, K, BK, stages=2):
            inner += C[m0:m0 + BM, j0:j0 + BK] @ D[j0:j0 + BK, n0:n0 + BN]
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
        acc = acc + inner
    E[m0:m0 + BM, n0:n0 + BN] = acc.to(E.dtype)


def _copies_never_issued(body: str) -> list[str]:
    """Prefixes of SharedCopy objects whose run-time checks are emitted but whose cp.async never is."""
    prefixes = re.findall(r"const bool (tj_c\d+_)fast = ", body)
    return [x for x in prefixes
            if not re.search(rf"tj_cp_async_16(_zfill)?_if\(.*{x}fast\);", body)]


def test_every_prefetch_copy_is_issued_in_a_single_pipelined_loop():
    _, source = lowered("mm80_lowered")
    body = kernel_body(source)
    assert _copies_never_issued(body) == []
    assert body.count("// prefetch iteration +2") == 1


def test_outer_prefetch_survives_an_inner_pipelined_loop():
    fn, source = lower(nested_pipelines, meta(256, 256), meta(256, 256), meta(256, 256), meta(256, 256),
                       meta(256, 256), BM=64, BN=64, BK=32, arch="sm_80")
    piped = [op for op in fn.walk() if op.kind is OpKind.LOAD and op.attrs.pipeline]
    assert len(piped) == 4  # both loops prefetch both of their operands
    body = kernel_body(source)
    assert body.count("// software pipeline: 2 stages") == 2
    assert _copies_never_issued(body) == []
    assert body.count("// prefetch iteration +1") == 2


# -- cold paths: compact fallbacks (the cold NVRTC compile of examples/matmul.py, tests/runtime/test_cold_paths.py) -

def test_example_matmul_store_fallback_is_a_rolled_loop_over_a_local_copy():
    """The vectorized epilogue store is as before; its element-wise fallback copies the register tile to a
    local array with constant-index 16-byte moves (so the tile stays in registers) and stores from that
    array in a rolled loop, instead of 128 unrolled predicated stores. The run-time test keeps only what the
    specialization does not tell (C's pointer and row stride are 16-byte aligned, n0 is a multiple of BN)."""
    _, source = lowered("mm80_lowered")
    filecheck(kernel_body(source), r"""
        CHECK: store into
        CHECK: if ({{v[0-9]+}}_C_size1 % 2 == 0) {
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int tj_g = 0; tj_g < 64; ++tj_g) {
        CHECK-NEXT: const int i = tj_g * 2;
        CHECK-NEXT: if (tj_dropped_ok && {{.*}}) *reinterpret_cast<uint32_t*>(tj_p + {{.*}}) = *reinterpret_cast<const uint32_t*>(&[[REGS:v[0-9]+]][i]);
        CHECK-NEXT: }
        CHECK-NEXT: } else {
        CHECK-NEXT: alignas(16) tj_half tj_tmp[128];
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int tj_g = 0; tj_g < 16; ++tj_g) {
        CHECK-NEXT: *reinterpret_cast<tj_v16*>(&tj_tmp[tj_g * 8]) = *reinterpret_cast<const tj_v16*>(&[[REGS]][tj_g * 8]);
        CHECK-NEXT: }
        CHECK-NEXT: #pragma unroll 1
        CHECK-NEXT: for (int tj_g = 0; tj_g < 128; ++tj_g) {
        CHECK-NEXT: const int i = tj_g * 1;
        CHECK-NEXT: if (tj_dropped_ok && {{.*}}) tj_p[{{.*}}] = tj_tmp[i];
        CHECK-NEXT: }
        CHECK-NEXT: }
    """)


def test_example_matmul_ptx_has_one_rolled_scalar_store_and_no_spills(compiled):
    c = compiled("mm80")
    ptx = c.asm["ptx"]
    assert ptx.count("st.global.u32") == 64  # the vectorized epilogue, unrolled
    assert ptx.count("st.global.u16") == 1   # its fallback, rolled
    assert ptx.count("st.local.v4") == 16    # the local copy of the 128 halves; nothing else goes to local memory
    assert c.meta["spills"] == 0


@pytest.mark.parametrize("case, ctype, regs", [("copy_i8", "int8_t", 32), ("copy_f32", "float", 32)])
def test_large_store_fallbacks_roll_and_loads_stay_unrolled(compiled, case, ctype, regs):
    """Loads keep their unrolled fallback (a rolled one would serialize the reads); stores of more than 16
    registers roll theirs."""
    c = compiled(case)
    per = 16 // {"int8_t": 1, "float": 4}[ctype]
    filecheck(kernel_body(c.asm["cuda"]), rf"""
        CHECK: load {{{{.*}}}} window into registers
        CHECK: }} else {{
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int tj_g = 0; tj_g < {regs}; ++tj_g) {{
        CHECK-NOT: tj_tmp
        CHECK: store into
        CHECK: }} else {{
        CHECK-NEXT: alignas(16) {ctype} tj_tmp[{regs}];
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int tj_g = 0; tj_g < {regs // per}; ++tj_g) {{
        CHECK: #pragma unroll 1
        CHECK-NEXT: for (int tj_g = 0; tj_g < {regs}; ++tj_g) {{
    """)
    assert c.meta["spills"] == 0


def test_store_fallbacks_stay_unrolled_from_sm_90(compiled):
    """On sm_90a the rolled fallback reordered the wgmma main loop's scheduling (5% slower, H200): not used."""
    body = kernel_body(compiled("copy_f32_sm90").asm["cuda"])
    assert "tj_tmp" not in body and "#pragma unroll 1\n" not in body
    filecheck(body, r"""
        CHECK: store into
        CHECK: } else {
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int tj_g = 0; tj_g < 32; ++tj_g) {
    """)


def test_small_store_fallbacks_stay_unrolled(compiled):
    """Elementwise kernels' tiles (8 registers here) keep the unrolled fallback they take on odd sizes."""
    body = kernel_body(compiled("softmax_rows").asm["cuda"])
    filecheck(body, r"""
        CHECK: store into
        CHECK: } else {
        CHECK-NEXT: #pragma unroll
        CHECK-NEXT: for (int tj_g = 0; tj_g < 8; ++tj_g) {
    """)
    assert "tj_tmp" not in body


def test_element_wise_shared_copies_are_in_line():
    """The element-wise copy of a window cp.async cannot take is a rolled loop in line (`#pragma unroll 4`) in
    the prologue and, for the loop's own prefetch, in the branch taken by windows not wholly inside: no device
    function and no call (a call in the main loop costs the whole loop its scheduling)."""
    _, source = lowered("mm80_lowered")
    head, body = source.split('extern "C" __global__')
    assert "__noinline__" not in source
    site = r"""
        CHECK: tj_cp_async_16_zfill_if({{.*}}, tj_c[[@X@:[0-9]+]]_fast);
        CHECK: if ({{.*}} && !tj_c[[@X@]]_fast) {
        CHECK-NEXT: #pragma unroll 4
        CHECK-NEXT: for (int tj_j = 0; tj_j < 32; ++tj_j) {
        CHECK-NEXT: const int tj_e = tid + tj_j * 128;
        CHECK-NEXT: const int tj_r = @RK@;
        CHECK-NEXT: const bool tj_ok = tj_c[[@X@]]_dropped_ok && {{.*}}_@R@_size0 && {{.*}}_@R@_size1;
        CHECK-NEXT: *reinterpret_cast<tj_half*>(tj_smem + (tj_c[[@X@]]_dst - tj_smem_u32) + {{.*}}) = tj_ok ? tj_c[[@X@]]_p[(int64_t)(tj_r) * {{v[0-9]+}}_@R@_stride0 + (int64_t)(tj_k) * {{v[0-9]+}}_@R@_stride1] : tj_half{};
    """
    a_site = site.replace("@RK@", "(tj_e >> 5), tj_k = (tj_e & 31)").replace("@R@", "A")
    b_site = site.replace("@RK@", "(tj_e >> 7), tj_k = (tj_e & 127)").replace("@R@", "B")
    filecheck(body, "\n".join([
        "CHECK: #pragma unroll 1",
        "CHECK-NEXT: for (int tj_s = 0; tj_s < 2; ++tj_s) {",
        a_site.replace("@X@", "PA"), b_site.replace("@X@", "PB"),
        "CHECK: tj_mma_m16n8k16_f16(",
        "CHECK: if (tj_prefetch && !tj_inner) {",
        a_site.replace("@X@", "LA"), b_site.replace("@X@", "LB"),
        "CHECK: tj_cp_async_commit();",
    ]))
    assert body.count("#pragma unroll 4") == 4


def test_copies_across_loops_stay_in_line():
    """Two pipelined loops over tiles of the same shapes and dtype: 4 windows, each copied element-wise in line
    in its prologue and its loop (8 sites), no function."""
    _, source = lower(nested_pipelines, meta(256, 256), meta(256, 256), meta(256, 256), meta(256, 256),
                      meta(256, 256), BM=64, BN=64, BK=32, arch="sm_80")
    head, body = source.split('extern "C" __global__')
    assert "__noinline__" not in source
    assert len(re.findall(r"const bool tj_ok = tj_c[0-9]+_dropped_ok", body)) == 8


@pytest.mark.parametrize("arch, bk", [("sm_80", 32), ("sm_90a", 32), ("sm_90a", 64), ("sm_100a", 32), ("sm_100a", 64)])
def test_example_matmul_with_in_line_copies_compiles_cleanly(arch, bk):
    """NVRTC compiles the kernel for every target without a warning or a spill, and with no function or call."""
    if not nvrtc_supports(arch):
        pytest.skip(f"the installed NVRTC cannot target {arch}")
    _, source = lower(example_matmul, meta(4096, 4096), meta(4096, 4096), meta(4096, 4096), BM=128, BN=128,
                      BK=bk, num_warps=4, arch=arch)
    result = compile_cuda(source, name="tj_matmul", arch=arch, options=["--ptxas-options=-v"])
    assert "warning" not in result.log, result.log
    assert "\n.func " not in result.ptx and "call.uni" not in result.ptx
    assert result.log.count("0 bytes spill stores, 0 bytes spill loads") == 1
    assert result.cubin[:4] == b"\x7fELF"


# -- scope conversions ------------------------------------------------------------------------------------------------

def test_register_gemm_operand_is_converted_to_shared(compiled):
    c = compiled("register_operand")
    filecheck(c.asm["ir"], r"""
        CHECK: tj.for
        CHECK: tj.load %A{{.*}} : tile<64x32xf16, reg, #blocked<threads=128, vec=8>>
        CHECK: %a = tj.binary {{.*}} {op = mul} : tile<64x32xf16, reg, #blocked<threads=128, vec=8>>
        CHECK: tj.load %B{{.*}}pipeline = 3{{.*}} : tile<32x64xf16, shared, #shared<32x64, swizzle=128B, stages=3>>
        CHECK-NEXT: [[S:%[0-9]+]] = tj.convert_layout %a : tile<64x32xf16, shared, #shared<64x32, swizzle=64B, stages=1>>
        CHECK-NEXT: tj.gemm [[S]], {{.*}}impl = mma_sync_m16n8k16
    """)
    body = kernel_body(c.asm["cuda"])
    filecheck(body, r"""
        CHECK: write a register tile to shared memory for the tensor cores
        CHECK-NEXT: __syncthreads();
        CHECK: tj_fence_proxy_async(); __syncthreads();
        CHECK: tj_ldmatrix_x4_at<0>(tj_af[0]
    """)


def test_staged_load_used_elementwise_is_read_back_to_registers(compiled):
    c = compiled("staged_elementwise")
    filecheck(c.asm["ir"], r"""
        CHECK: %a = tj.load %A{{.*}} : tile<64x32xf16, shared, #shared<64x32, swizzle=64B, stages=1>>
        CHECK: tj.gemm %a, {{.*}}impl = mma_sync_m16n8k16
        CHECK: [[R:%[0-9]+]] = tj.convert_layout %a : tile<64x32xf16, reg, #blocked<{{.*}}>>
        CHECK-NEXT: tj.binary [[R]], {{.*}} {op = add} : tile<64x32xf16, reg, #blocked<{{.*}}>>
        CHECK: tj.store {{.*}}%D
    """)
    assert "read a shared tile into registers" in kernel_body(c.asm["cuda"])


@tilejit.kernel
def gemm_only_under_if(A, B, C, flag, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    extra = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, A.shape[1], BK, stages=3):
        a = A[m0:m0 + BM, k0:k0 + BK]
        b = B[k0:k0 + BK, n0:n0 + BN]
        if flag:  # a gemm under a runtime branch, before the loop's unconditional one
            extra += a @ b
        acc += a @ b
    C[m0:m0 + BM, n0:n0 + BN] = acc + extra


def test_prefetch_is_not_hidden_inside_a_runtime_branch():
    """The loop's prefetch must run every iteration, so a gemm inside an `if` must not host it."""
    _, source = lower(gemm_only_under_if, meta(256, 256), meta(256, 256), meta(256, 256), True,
                      BM=64, BN=64, BK=32, arch="sm_80")
    body = kernel_body(source)
    loop = body.index("for (int64_t")
    branch = body.index("if (v", loop)  # the runtime `if (flag)` inside the loop
    branch_end = body.index("tj_mma_m16n8k16", branch)
    prefetch = body.index("// prefetch iteration +2", loop)
    assert prefetch < branch or prefetch > branch_end, "prefetch emitted inside the runtime branch"
    assert body.count("// prefetch iteration +2") == 1
    assert _copies_never_issued(body) == []
