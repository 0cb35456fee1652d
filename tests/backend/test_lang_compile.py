"""The language constructs of tests/lang_kernels.py compile to cubins with NVRTC for sm_80 and sm_90a."""
from __future__ import annotations

import pytest
import torch

import lang_kernels as lk
from test_compile_all import check_cubin

f32, i32, i64 = torch.float32, torch.int32, torch.int64
ARCHS = ["sm_80", "sm_90a"]


def m(*shape, dtype=f32):
    return torch.empty(*shape, dtype=dtype, device="meta")


pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py


CASES = {
    "scalar_index": (lk.scalar_index, lambda: (m(5, 7), m(5, 7)), dict(BN=8)),
    "scalar_index_mixed": (lk.scalar_index_mixed, lambda: (m(8, 16), m(16), m(8, 16), 3, 5), dict(BN=16)),
}
for _fn in ("log2", "sin", "cos", "tanh", "erf", "sigmoid", "fma"):
    for _dt in (f32, torch.float16, torch.bfloat16, torch.float64):
        CASES[f"math_{_fn}_{str(_dt)[6:]}"] = (lk.math_fns, lambda _dt=_dt: (m(33, 40, dtype=_dt),) * 4,
                                               dict(FN=_fn, BM=32, BN=32))
for _dt in (f32, torch.float64, i32, i64, torch.float16, torch.bfloat16):
    for _op in ("add", "max", "min"):
        for _sem in ("relaxed", "acq_rel"):
            CASES[f"atomic_rows_{_op}_{str(_dt)[6:]}_{_sem}"] = (
                lk.atomic_rows, lambda _dt=_dt: (m(4, 10, dtype=_dt), m(10, dtype=_dt), m(1, dtype=i32)),
                dict(OP=_op, BN=16, SEM=_sem))
CASES.update({
    "atomic_xchg_old_i64": (lk.atomic_xchg_old, lambda: (m(8, dtype=i64), m(4, 8, dtype=i64)), dict(BN=8)),
    "atomic_xchg_old_f32": (lk.atomic_xchg_old, lambda: (m(8), m(4, 8)), dict(BN=8)),
    "atomic_xchg_old_bf16": (lk.atomic_xchg_old, lambda: (m(8, dtype=torch.bfloat16), m(4, 8, dtype=torch.bfloat16)),
                             dict(BN=8)),
    "atomic_cas_f16": (lk.atomic_cas_scoped, lambda: (m(8, dtype=torch.float16),) * 3, dict(BN=8, SCOPE="gpu")),
    "atomic_2d_old": (lk.atomic_2d_old, lambda: (m(13, 21), m(13, 21), m(3, 3, 32, 64)), dict(BM=32, BN=64)),
    "spin_lock_counter": (lk.spin_lock_counter, lambda: (m(1, dtype=i32), m(1, dtype=i32), m(6, dtype=i32)), {}),
    "atomic_cas_cta_i32": (lk.atomic_cas_scoped, lambda: (m(8, dtype=i32), m(8, dtype=i32), m(8, dtype=i32)),
                           dict(BN=8, SCOPE="cta")),
    "atomic_cas_sys_f64": (lk.atomic_cas_scoped, lambda: (m(8, dtype=torch.float64),) * 3, dict(BN=8, SCOPE="sys")),
    "splitk_f16": (lk.load_example("splitk_matmul").matmul_splitk,
                   lambda: (m(200, 4097, dtype=torch.float16), m(4097, 300, dtype=torch.float16), m(200, 300), 1024),
                   dict(BM=64, BN=64, BK=32)),
    "splitk_bf16_128": (lk.load_example("splitk_matmul").matmul_splitk,
                        lambda: (m(512, 4096, dtype=torch.bfloat16), m(4096, 512, dtype=torch.bfloat16),
                                 m(512, 512), 1024), dict(BM=128, BN=128, BK=64, num_warps=8)),
    "embedding_i32": (lk.embedding, lambda: (m(37, dtype=i32), m(50, 24), m(37, 32)), dict(BM=16, D=32)),
    "embedding_i64_bf16": (lk.embedding, lambda: (m(300, dtype=i64), m(1000, 128, dtype=torch.bfloat16),
                                                  m(300, 128, dtype=torch.bfloat16)), dict(BM=64, D=128)),
    "gather_1d": (lk.gather_1d, lambda: (m(100, dtype=torch.float64), m(8, dtype=i32), m(8, dtype=torch.float64)),
                  dict(B=8)),
    "gather_cols": (lk.gather_cols, lambda: (m(20, 9), m(8, dtype=i32), m(20, 8)), dict(BM=16, BC=8)),
    "scatter_rows": (lk.scatter_rows, lambda: (m(30, 8), m(30, dtype=i32), m(40, 8)), dict(BM=16, D=8)),
    "scatter_1d": (lk.scatter_1d, lambda: (m(16, dtype=i32),) * 3, dict(B=16)),
    "cumsum_f32_axis1": (lk.cumsum_2d, lambda: (m(45, 20), m(45, 32)), dict(AXIS=1, BM=32, BN=32)),
    "cumsum_i8_axis0": (lk.cumsum_2d, lambda: (m(45, 20, dtype=torch.int8), m(45, 32, dtype=i32)),
                        dict(AXIS=0, BM=32, BN=32)),
    "cumsum_f16_64x128": (lk.cumsum_2d, lambda: (m(100, 128, dtype=torch.float16), m(100, 128)),
                          dict(AXIS=1, BM=64, BN=128, num_warps=8)),
    "cumsum_of_reduction": (lk.cumsum_of_reduction, lambda: (m(20, 50), m(20)), dict(BM=32, BN=64)),
    "splitk_32x32x16_f16": (lk.load_example("splitk_matmul").matmul_splitk,
                            lambda: (m(100, 700, dtype=torch.float16), m(700, 90, dtype=torch.float16), m(100, 90),
                                     240), dict(BM=32, BN=32, BK=16)),
    "scale_rows": (lk.scale_rows, lambda: (m(300, 200), m(300), m(300, 200)), dict(BM=32, BN=32)),
    "scale_rows_64": (lk.scale_rows_tuned.kernel, lambda: (m(300, 200), m(300), m(300, 200)), dict(BM=64, BN=32)),
    "bounded_copy": (lk.bounded_copy, lambda: (m(40, 50), m(40, 50), m(64, dtype=i32), 30, 37), dict(BM=16, BN=32)),
    "grouped_matmul_bounded_bf16": (
        lk.grouped_matmul_bounded, lambda: (m(3, 256, 512, dtype=torch.bfloat16), m(512, 256, dtype=torch.bfloat16),
                                            m(3, 256, 256, dtype=torch.bfloat16), m(3, dtype=i32)),
        dict(BM=128, BN=128, BK=64, num_warps=8)),
    "grouped_matmul_bounded_f16_64": (
        lk.grouped_matmul_bounded, lambda: (m(4, 100, 96, dtype=torch.float16), m(96, 80, dtype=torch.float16),
                                            m(4, 100, 80, dtype=torch.float16), m(4, dtype=i32)),
        dict(BM=64, BN=64, BK=32)),
    "row_max_atomic": (lk.row_max_atomic, lambda: (m(100, 300), m(100), m(100)), dict(BM=64, BN=64)),
    "atomic_in_loop": (lk.atomic_in_loop, lambda: (m(100, 300), m(64), 300), dict(BM=32, BK=64)),
    "histogram": (lk.histogram, lambda: (m(1000, dtype=i32), m(16, dtype=i32)), dict(BLOCK=256)),
})


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_compiles_to_cubin(name, arch):
    kernel, args, kwargs = CASES[name]
    compiled = kernel.compile(*args(), arch=arch, **kwargs)
    check_cubin(compiled, arch, kwargs.get("num_warps", 4))


def test_scoped_cas_cuda_text():
    cuda = lk.atomic_cas_scoped.compile(m(8, dtype=i32), m(8, dtype=i32), m(8, dtype=i32), BN=8, SCOPE="cta",
                                        arch="sm_80", stop_after="cuda").cuda
    assert "atom.relaxed.cta.global.cas.b32 %0, [%1], %2, %3;" in cuda
    cuda = lk.atomic_cas_scoped.compile(*(m(8, dtype=torch.float64),) * 3, BN=8, SCOPE="sys", arch="sm_80",
                                        stop_after="cuda").cuda
    assert "atom.relaxed.sys.global.cas.b64 %0, [%1], %2, %3;" in cuda
