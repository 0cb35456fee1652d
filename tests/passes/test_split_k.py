"""Split-K (passes/split_k.py, backend_cuda/lower_split_k.py): the ``split_k`` launch option cuts a matmul's K loop
over the programs of a thread-block cluster.

CPU checks: the rewritten IR (loop bounds from the split index, the cluster sum, the epilogue guarded to program
0), the generated CUDA (cluster dims, distributed shared memory, ``program_id(2)`` kept in the user's terms),
cubins for sm_90a and sm_100a, located errors for kernels and archs it cannot serve, the option's validation,
``Config(split_k=)`` and the launchers' grid scaling. GPU results: tests/gpu/test_gpu_split_k.py.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.autotuner import Config
from tilejit.errors import ArgumentValueError, CompilationError
from tilejit.passes.split_k import SplitKError

from _lowering import kernel_body, lower
from filecheck import filecheck
from kernels import bmm_epilogue, matmul


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, dtype=dtype, device="meta")


MNK = (128, 4096, 4096)


def mm_args(m=MNK[0], n=MNK[1], k=MNK[2], dtype=torch.float16, out=None):
    return meta(m, k, dtype=dtype), meta(k, n, dtype=dtype), meta(m, n, dtype=out or dtype)


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEJIT_INTERPRET", raising=False)


def test_ir_splits_the_loop_bounds_sums_over_the_cluster_and_guards_the_epilogue():
    fn, _ = lower(matmul, *mm_args(), BM=64, BN=64, BK=64, num_warps=4, split_k=4, arch="sm_90a")
    from tilejit.ir import print_function

    filecheck(print_function(fn), """
        CHECK: attributes {{.*}}split_k = 4
        CHECK: [[R:%[0-9]+]] = tj.split_index {splits = 4} : i32
        CHECK: %k_split_lo = tj.binary
        CHECK: %k_split_hi = tj.binary %A_size1, {{%[0-9]+}} {op = min}
        CHECK: tj.for %k0 = %k_split_lo to %k_split_hi
        CHECK: tj.gemm
        CHECK: [[SUM:%acc_[0-9]+]] = tj.split_reduce [[ACC:%acc_[0-9]+]] {splits = 4}
        CHECK: [[LEAD:%[0-9]+]] = tj.cmp [[R]], {{%[0-9]+}} {op = eq}
        CHECK-NEXT: tj.if [[LEAD]] {
        CHECK-NEXT: tj.cast [[SUM]]
        CHECK-NEXT: tj.store
    """)


def test_cuda_has_cluster_dims_dsmem_sum_and_two_cluster_barriers():
    _, cuda = lower(matmul, *mm_args(), BM=64, BN=64, BK=64, num_warps=4, split_k=3, arch="sm_90a")
    body = kernel_body(cuda)
    filecheck(body, """
        CHECK: __launch_bounds__(128) __cluster_dims__(1, 1, 3) tj_matmul(
        CHECK: blockIdx.z % 3u
        CHECK: wgmma.mma_async
        CHECK: split-K: the partial accumulators of the cluster's 3 programs summed in program 0
        CHECK: if (tj_rank != 0)
        CHECK: st.shared.v4.f32
        CHECK: barrier.cluster.arrive.release;\\n\\tbarrier.cluster.wait.acquire;
        CHECK: if (tj_rank == 0)
        CHECK: mapa.shared::cluster.u32
        CHECK: ld.shared::cluster.v4.f32
        CHECK: barrier.cluster.arrive.release
        CHECK: tj_tma_store_2d
    """)
    assert body.count("barrier.cluster.arrive") == 2
    plain = kernel_body(lower(matmul, *mm_args(), BM=64, BN=64, BK=64, num_warps=4, arch="sm_90a")[1])
    assert "__cluster_dims__" not in plain and "split" not in plain


def test_program_id_2_keeps_the_users_meaning_and_the_epilogue_stays_fused():
    a, b = meta(3, 100, 900), meta(3, 900, 200)
    _, cuda = lower(bmm_epilogue, a, b, meta(200), meta(3, 100, 200), 0.5, BM=64, BN=64, BK=64, num_warps=4,
                    split_k=2, arch="sm_90a")
    body = kernel_body(cuda)
    assert "(int32_t)(blockIdx.z / 2u)" in body and "(int32_t)blockIdx.z;" not in body
    assert "blockIdx.z % 2u" in body
    assert body.index("ld.shared::cluster") < body.index("tj_max")  # the relu runs on the summed accumulator


@pytest.mark.parametrize("arch, bm, bk, mma", [("sm_90a", 64, 64, "wgmma.mma_async"), ("sm_90a", 64, 32, "wgmma.mma_async"),
                                               ("sm_100a", 128, 64, "tcgen05.mma")])
def test_compiles_to_a_cubin(arch, bm, bk, mma):
    from tilejit.backend_cuda.nvrtc import nvrtc_supports

    if not nvrtc_supports(arch):
        pytest.skip(f"this NVRTC cannot compile for {arch}")
    compiled = matmul.compile(*mm_args(), BM=bm, BN=64, BK=bk, num_warps=4, num_stages=3, split_k=4, arch=arch)
    ptx = matmul.compile(*mm_args(), BM=bm, BN=64, BK=bk, num_warps=4, num_stages=3, split_k=4, arch=arch,
                         stop_after="ptx").ptx
    assert compiled.meta["split_k"] == 4 and compiled.meta["spills"] == 0
    assert mma in ptx and "mapa.shared::cluster" in ptx and ".reqnctapercluster 1, 1, 4" in ptx
    assert ptx.count("barrier.cluster.arrive") == 2


@tilejit.kernel
def matmul_i32(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0, n0 = T.program_id(0) * BM, T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.int32)
    for k0 in T.range(0, K, BK, stages=3):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc


def test_int32_accumulators_are_summed_as_integers():
    _, cuda = lower(matmul_i32, *mm_args(dtype=torch.int8, out=torch.int32), BM=64, BN=64, BK=128, num_warps=4,
                    split_k=2, arch="sm_90a")
    body = kernel_body(cuda)
    assert "ld.shared::cluster.v4.b32" in body and "st.shared.v4.b32" in body and "int32_t x0" in body


def test_the_option_is_part_of_the_cache_key_and_absent_when_off():
    a = matmul.compile(*mm_args(), BM=64, BN=64, BK=64, num_warps=4, arch="sm_90a")
    b = matmul.compile(*mm_args(), BM=64, BN=64, BK=64, num_warps=4, split_k=2, arch="sm_90a")
    c = matmul.compile(*mm_args(), BM=64, BN=64, BK=64, num_warps=4, split_k=1, arch="sm_90a")
    assert a.key != b.key and a.key == c.key and a.meta["split_k"] == 1


# -- what it refuses ------------------------------------------------------------------------------------------

def _raises(kernel, args, match, arch="sm_90a", **kw):
    with pytest.raises(SplitKError, match=match) as info:
        kernel.compile(*args, arch=arch, split_k=2, stop_after="cuda", **{"num_warps": 4, **kw})
    assert isinstance(info.value, CompilationError)
    return info.value


def test_refused_without_clusters():
    err = _raises(matmul, mm_args(), "needs thread-block clusters .sm_90 or newer.; sm_80 has none", arch="sm_80",
                  BM=64, BN=64, BK=32)
    assert "split_k=1" in err.hint


@tilejit.kernel
def two_loops(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
    acc2 = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc2 += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
    C[0:BM, 0:BN] = (acc + acc2).to(C.dtype)


@tilejit.kernel
def rescaled(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = acc * 0.5 + A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
    C[0:BM, 0:BN] = acc.to(C.dtype)


@tilejit.kernel
def starts_at_one(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.full((BM, BN), 1.0, T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
    C[0:BM, 0:BN] = acc.to(C.dtype)


@tilejit.kernel
def store_first(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    C[0:BM, 0:BN] = T.zeros((BM, BN), T.float16)
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
    C[0:BM, 0:BN] = acc.to(C.dtype)


@tilejit.kernel
def runtime_step(A, B, C, step, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, step):
        acc += A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
    C[0:BM, 0:BN] = acc.to(C.dtype)


@pytest.mark.parametrize("kernel, extra, match, line", [
    (two_loops, (), "exactly one top-level loop that accumulates matrix products; this kernel has 2", "for k0"),
    (rescaled, (), r"carried value 'acc' is updated by '\*' \(.*test_split_k.py:\d+:\d+\), not by a sum", "for k0"),
    (starts_at_one, (), "carried value 'acc' does not start at zero", "for k0"),
    (store_first, (), "this write comes before the K loop", "C[0:BM, 0:BN] = T.zeros"),
    (runtime_step, (64,), "step that is a positive compile-time constant", "for k0"),
])
def test_kernels_it_cannot_split_get_a_located_error(kernel, extra, match, line):
    err = _raises(kernel, mm_args(64, 64, 256) + extra, match, BM=64, BN=64, BK=64)
    assert err.lineno is not None and line in err.source_line and "^" in str(err)


@tilejit.kernel
def no_products(X, Y, BN: T.constexpr):
    acc = T.zeros((BN,), T.float32)
    for i in range(0, X.shape[0]):
        acc += X[i, 0:BN]
    Y[0:BN] = acc


def test_a_kernel_without_products_is_pointed_at_its_loop():
    """Nothing in it to split: the error points at its first loop, not at the file alone."""
    with pytest.raises(tilejit.errors.CompilationError, match="this kernel has 0") as info:
        no_products.compile(torch.empty(8, 64, device="meta"), torch.empty(64, device="meta"), BN=64, split_k=2,
                            arch="sm_90a")
    assert info.value.lineno is not None and "for i in range" in info.value.source_line


def test_option_values_are_checked_at_launch():
    for bad in (0, 9, True, 2.0):
        with pytest.raises(ArgumentValueError, match="split_k must be one of"):
            matmul.compile(*mm_args(), BM=64, BN=64, BK=64, split_k=bad, arch="sm_90a", stop_after="ir")


def test_a_parameter_named_split_k_keeps_its_name():
    @tilejit.kernel
    def scaled(X, Y, split_k, BN: T.constexpr):
        Y[0:BN] = X[0:BN] * split_k

    ir = scaled.ir(torch.empty(16), torch.empty(16), 3, BN=16)
    assert "%split_k" in ir
    with pytest.raises(tilejit.errors.UsageTypeError, match="clashes with a launch option"):
        @tilejit.kernel
        def bad(X, num_warps):
            pass


def test_config_carries_split_k():
    c = Config({"BM": 64}, num_warps=4, num_stages=3, split_k=4)
    assert c.all_kwargs() == {"BM": 64, "num_warps": 4, "num_stages": 3, "split_k": 4}
    assert c.identity.endswith("split_k=4") and c.to_json()["split_k"] == 4 and "split_k=4" in repr(c)
    plain = Config({"BM": 64}, num_warps=4, num_stages=3)
    assert "split_k" not in plain.identity and "split_k" not in plain.all_kwargs() and c != plain
    with pytest.raises(ValueError, match="split_k must be one of"):
        Config({}, split_k=16)


def test_the_python_launcher_scales_grid_z_and_names_the_limit(monkeypatch):
    from types import SimpleNamespace

    from tilejit.errors import LaunchError
    from tilejit.runtime import driver

    launched = []
    fake_driver = SimpleNamespace(
        CUfunction=None,
        cuLaunchKernel=lambda f, gx, gy, gz, bx, by, bz, smem, stream, params, extra: (launched.append((gx, gy, gz))
                                                                                       or (0,)))
    monkeypatch.setattr(driver, "_driver", lambda: fake_driver)
    loaded = SimpleNamespace(name="tj_k", function=1, device_index=0,
                             attributes=SimpleNamespace(max_threads_per_block=1024),
                             reserve_dynamic_smem=lambda nbytes: None)
    launcher = driver.make_launcher(loaded, ["i32"], (128, 1, 1), 0, impl="bindings", cluster_z=4)
    launcher((5, 6, 7), 0, [1])
    assert launched == [(5, 6, 28)]
    with pytest.raises(LaunchError, match="grid z 20000 x split_k 4 exceeds CUDA's 65535"):
        launcher((1, 1, 20000), 0, [1])
    assert len(launched) == 1


@tilejit.kernel
def partial_sum_stored(A, B, C, D, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = acc + A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN]
        D[0:BM, 0:BN] = (acc + 1.0).to(D.dtype)  # reads the running sum: each program would see only its share
    C[0:BM, 0:BN] = acc.to(C.dtype)


def test_a_running_sum_read_inside_the_loop_is_refused():
    args = mm_args(64, 64, 256) + (meta(64, 64),)
    _raises(partial_sum_stored, args, r"carried value 'acc' is read by '\+' \(.*test_split_k.py:\d+:\d+\) inside "
            r"the loop", BM=64, BN=64, BK=64)


def test_a_block_scaled_loop_is_split():
    """``acc = fma(product, scale, acc)`` (a block-scaled float8 product) is a sum: the loop is cut over the
    cluster and, on sm_90a, the product still folds into a promoted gemm with its scale."""
    import tilejit.ops.fp8_blockscaled as F

    e4m3 = torch.float8_e4m3fn
    args = (meta(128, 2048, dtype=e4m3), meta(128, 16, dtype=torch.float32), meta(7168, 2048, dtype=e4m3),
            meta(56, 16, dtype=torch.float32), meta(128, 7168, dtype=torch.bfloat16))
    fn, _ = lower(F.blockscaled_mm, *args, BM=64, BN=64, STAGES=4, num_warps=4, split_k=2, arch="sm_90a")
    from tilejit.ir import print_function

    filecheck(print_function(fn), """
        CHECK: tj.split_index {splits = 2}
        CHECK: tj.for %k0 = %k_split_lo to %k_split_hi
        CHECK: tj.gemm %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}}, %{{[0-9a-z_]+}} {{{.*}}precision = precise
        CHECK: tj.split_reduce
    """)


@tilejit.kernel
def scaled_by_itself(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = T.fma(acc, A[0:BM, k0:k0 + BK] @ B[k0:k0 + BK, 0:BN], acc)
    C[0:BM, 0:BN] = acc.to(C.dtype)


def test_an_fma_whose_factor_is_the_running_sum_is_refused():
    err = _raises(scaled_by_itself, mm_args(64, 64, 256), "is added to a term computed from itself|is read by fma",
                  BM=64, BN=64, BK=64)
    assert "for k0" in err.source_line
