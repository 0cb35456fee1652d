"""Every kernel the repository ships compiles to a cubin on the CPU (NVRTC), for sm_80 and sm_90a.

The kernels tests/gpu/test_gpu_kernels.py launches (from tests/kernels.py, with a representative subset of the tile
configurations those GPU tests launch), examples/matmul.py (also for sm_100a when the installed NVRTC knows it),
benchmarks/kernels.py (the plain kernel under the autotuner, with a few of its default configs) and the
module-level kernels of tests/frontend/test_interpreter.py. Meta tensors stand in for the arguments; one fresh cache directory per module, so a
specialization compiled twice is a cache hit.
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from benchmarks import kernels as bench_kernels
from tilejit.backend_cuda.nvrtc import nvrtc_supports
from tilejit.configs import matmul_configs
from tilejit.runtime.jit import Kernel

import kernels as gk
import test_interpreter as ti

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ["sm_80", "sm_90a"]
MAX_SHARED = 227 * 1024  # H100/H200 opt-in dynamic shared memory per block

f16, bf16, f32, i8, i32, i64 = torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int32, torch.int64


def _load_example():
    spec = importlib.util.spec_from_file_location("tilejit_examples_matmul_all", ROOT / "examples" / "matmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example_matmul = _load_example().matmul


def m(*shape, dtype=f16):
    return torch.empty(*shape, dtype=dtype, device="meta")


pytestmark = pytest.mark.usefixtures("fresh_compile_cache")  # tests/conftest.py


def _cubin_sm(cubin: bytes) -> int | None:
    """The SM number in a CUDA ELF's e_flags (as NVRTC writes it: ABI version 7 keeps it in the low byte,
    version 8 in the second byte); None for a layout this helper does not know."""
    flags = int.from_bytes(cubin[48:52], "little")
    return {7: flags & 0xFF, 8: (flags >> 8) & 0xFF}.get(cubin[8])


def check_cubin(compiled, arch: str, num_warps: int) -> None:
    cubin = compiled.asm["cubin"]
    assert cubin[:4] == b"\x7fELF", "not an ELF file"
    assert cubin[4] == 2 and int.from_bytes(cubin[18:20], "little") == 190  # ELF64, EM_CUDA
    sm = _cubin_sm(cubin)
    if sm is not None:
        assert sm == int("".join(ch for ch in arch[3:] if ch.isdigit())), (arch, sm)
    assert compiled.name.encode() in cubin  # the kernel symbol
    assert compiled.arch == arch and compiled.meta["arch"] == arch
    assert compiled.threads == 32 * num_warps
    assert 0 <= compiled.shared_bytes <= MAX_SHARED


def _mm(kernel, bm, bn, bk, warps=4, stages=None, dtype=f16, out=None, a=None, b=None, expect=None):
    """A matmul-shaped case: (kernel, args, kwargs, {arch: expected gemm impl})."""
    args = (a if a is not None else m(512, 512, dtype=dtype), b if b is not None else m(512, 512, dtype=dtype),
            m(512, 512, dtype=out or dtype))
    kwargs = dict(BM=bm, BN=bn, BK=bk, num_warps=warps)
    if stages is not None:
        kwargs["num_stages"] = stages
    return kernel, args, kwargs, expect or {}


MMA = "mma_sync_m16n8k16"
WGMMA = "wgmma_m64nNk16"
BOTH_MMA = {"sm_80": MMA, "sm_90a": MMA}
WG_ON_90 = {"sm_80": MMA, "sm_90a": WGMMA}

# -- the kernels of tests/gpu/test_gpu_kernels.py (tests/kernels.py) -----------------------------------------------

GPU_CASES = {
    "matmul-f16-128x128x32": _mm(gk.matmul_staged, 128, 128, 32, expect=WG_ON_90),
    "matmul-bf16-128x128x32": _mm(gk.matmul_staged, 128, 128, 32, dtype=bf16, expect=WG_ON_90),
    "matmul-64x64x32-w1-s1": _mm(gk.matmul_staged, 64, 64, 32, warps=1, stages=1, expect=BOTH_MMA),
    "matmul-64x64x32-w8-s4": _mm(gk.matmul_staged, 64, 64, 32, warps=8, stages=4, expect=BOTH_MMA),
    "matmul-strided-a-colmajor-b-f32-out": _mm(gk.matmul_staged, 64, 64, 32, out=f32, a=m(300, 500)[:, ::2],
                                               b=m(130, 250).T, expect=WG_ON_90),
    "matmul-wgmma-128x128x64-w4": _mm(gk.matmul_staged, 128, 128, 64, stages=3, expect=WG_ON_90),
    "matmul-wgmma-128x256x64-w8-bf16": _mm(gk.matmul_staged, 128, 256, 64, warps=8, stages=3, dtype=bf16, expect=WG_ON_90),
    "matmul-wgmma-64x128x64-w4": _mm(gk.matmul_staged, 64, 128, 64, stages=3, expect=WG_ON_90),
    "matmul-wgmma-128x64x128-w8-bf16": _mm(gk.matmul_staged, 128, 64, 128, warps=8, stages=3, dtype=bf16, expect=WG_ON_90),
    "matmul-wgmma-stages1": _mm(gk.matmul_staged, 128, 128, 64, stages=1, dtype=bf16, expect=WG_ON_90),
    "matmul-wgmma-stages5": _mm(gk.matmul_staged, 128, 128, 64, stages=5, dtype=bf16, expect=WG_ON_90),
    "matmul_nt-64x128x32": _mm(gk.matmul_nt, 64, 128, 32, expect=WG_ON_90),
    "matmul_nt-wgmma-128x128x64": _mm(gk.matmul_nt, 128, 128, 64, dtype=bf16, expect=WG_ON_90),
    "matmul_tn-128x64x32-bf16": _mm(gk.matmul_tn, 128, 64, 32, dtype=bf16, expect=WG_ON_90),
    "bmm_epilogue": (gk.bmm_epilogue, (m(3, 100, 70, dtype=bf16), m(3, 70, 90, dtype=bf16), m(90, dtype=bf16),
                                       m(3, 100, 90), 0.5), dict(BM=64, BN=64, BK=32), WG_ON_90),
    "softmax_rows-128": (gk.softmax_rows, (m(37, 100), m(37, 100)), dict(BN=128), {}),
    "softmax_rows-1024": (gk.softmax_rows, (m(37, 1000), m(37, 1000)), dict(BN=1024), {}),
    "atom-1-warp": (gk.atom, (m(16, 16), m(16, 8), m(16, 8)), dict(num_warps=1), BOTH_MMA),
}

# -- examples/matmul.py and benchmarks/kernels.py -------------------------------------------------------------

_configs = {(c.kwargs["BM"], c.kwargs["BN"], c.kwargs["BK"], c.num_warps, c.num_stages): c for c in matmul_configs()
            if c.split_k == 1 and not c.warp_specialize and not c.persistent}
_BENCH_CONFIGS = [(64, 64, 32, 4, 3), (128, 128, 64, 4, 3), (128, 256, 64, 8, 3)]


def _bench_case(key):
    config = _configs[key]
    return (bench_kernels.matmul.kernel, (m(1024, 1024), m(1024, 1024), m(1024, 1024)),
            dict(config.all_kwargs()), WG_ON_90)


OTHER_CASES = {
    "example-matmul-128x128x32": _mm(example_matmul, 128, 128, 32, expect=WG_ON_90),
    "example-matmul-128x128x64": _mm(example_matmul, 128, 128, 64, expect=WG_ON_90),
    **{f"bench-matmul-{'x'.join(map(str, k[:3]))}-w{k[3]}-s{k[4]}": _bench_case(k) for k in _BENCH_CONFIGS},
    "bench-tiny": (bench_kernels.tiny, (m(4096, dtype=f32), m(4096, dtype=f32), m(4096, dtype=f32),
                                        m(4096, dtype=f32), 7, 3), dict(BLOCK=128), {}),
}

# -- tests/frontend/test_interpreter.py module-level kernels --------------------------------------------------------------

INTERPRETER_CASES = {
    "matmul-f16": _mm(ti.matmul, 32, 32, 16, expect=BOTH_MMA),
    "matmul-bf16": _mm(ti.matmul, 64, 64, 32, dtype=bf16, expect=WG_ON_90),
    "matmul-f32-tf32": _mm(ti.matmul, 32, 32, 16, dtype=f32,
                           expect={"sm_80": "mma_sync_m16n8k8_tf32", "sm_90a": "mma_sync_m16n8k8_tf32"}),
    "matmul-fp8e4m3": _mm(ti.matmul, 32, 32, 32, dtype=torch.float8_e4m3fn, out=f32,
                          expect={"sm_80": "fma_fallback", "sm_90a": "mma_sync_m16n8k32_fp8"}),
    "matmul-fp8e5m2": _mm(ti.matmul, 32, 32, 32, dtype=torch.float8_e5m2, out=f32,
                          expect={"sm_80": "fma_fallback", "sm_90a": "mma_sync_m16n8k32_fp8"}),
    "matmul_nt_view": _mm(ti.matmul_nt_view, 32, 32, 16, expect=BOTH_MMA),
    "matmul_nt_gemm": _mm(ti.matmul_nt_gemm, 32, 32, 16, expect=BOTH_MMA),
    "bmm": (ti.bmm, (m(3, 45, 40), m(3, 40, 37), m(3, 45, 37)), dict(BM=32, BN=16, BK=16), BOTH_MMA),
    "matmul_epilogue": (ti.matmul_epilogue, (m(90, 60), m(60, 75), m(75, dtype=f32), m(90, 75), 0.5),
                        dict(BM=32, BN=32, BK=16), BOTH_MMA),
    "softmax_masked": (ti.softmax_masked, (m(7, 100), m(7, 128)[:, :100]), dict(BN=128), {}),
    "softmax_full": (ti.softmax_full, (m(5, 37, dtype=f32), m(5, 37, dtype=f32)), {}, {}),
    "while_gcd": (ti.while_gcd, (m(6, dtype=torch.int32),) * 4, {}, {}),
    "reduce2d": (ti.reduce2d, (m(16, 32), m(32, dtype=f32), m(16, dtype=f32), m(32), m(16), m(32), m(16),
                               m(1, dtype=f32)), dict(BM=16, BN=32), {}),
    "reduce_int": (ti.reduce_int, (m(50, dtype=i8), m(4, dtype=i32)), dict(BN=64), {}),
    "loops": (ti.loops, (m(8, 16, dtype=f32), m(16, dtype=f32), m(2, dtype=i64), 5), dict(BN=16), {}),
    "branch_on_program": (ti.branch_on_program, (m(4, 8, dtype=f32), m(4, 8, dtype=f32)), dict(BN=8), {}),
    "static_rows": (ti.static_rows, (m(4, 20, dtype=f32), m(20, dtype=f32)), dict(ROWS=4, BN=32), {}),
    "use_helpers": (ti.use_helpers, (m(100, dtype=f32), m(100, dtype=f32)), dict(BN=32), {}),
    "int_divmod": (ti.int_divmod, (m(70, dtype=i32), m(70, dtype=i32), m(70, dtype=i32), m(70, dtype=i32),
                                   m(3, dtype=i64), -7, 2), dict(BN=32), {}),
    "casts": (ti.casts, (m(8, dtype=f32), m(8, dtype=i32), m(8, dtype=torch.bool)), dict(BN=8), {}),
    "half_ops": (ti.half_ops, (m(8), m(8)), dict(BN=8), {}),
    "float_math-bf16": (ti.float_math, (m(50, dtype=bf16), m(7, 50, dtype=bf16)), dict(BN=64), {}),
    "int_ops": (ti.int_ops, (m(40, dtype=i32), m(40, dtype=i32), m(10, 40, dtype=i32)), dict(BN=64), {}),
    "tensor_meta": (ti.tensor_meta, (m(12, 30, dtype=f32)[1:, ::3], m(4, dtype=i64)), {}, {}),
    "shifted_copy": (ti.shifted_copy, (m(10, dtype=f32), m(10, dtype=f32), -5), dict(BN=8), {}),
    "store_then_loop": (ti.store_then_loop, (m(8, dtype=i32), m(8, dtype=i32), 2), dict(BN=8), {}),
}

ALL = {**{f"gpu_kernels/{k}": v for k, v in GPU_CASES.items()},
       **{f"repo/{k}": v for k, v in OTHER_CASES.items()},
       **{f"interpreter/{k}": v for k, v in INTERPRETER_CASES.items()}}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", sorted(ALL))
def test_compiles_to_a_cubin(case, arch):
    kernel, args, kwargs, expect = ALL[case]
    compiled = kernel.compile(*args, arch=arch, **kwargs)
    check_cubin(compiled, arch, kwargs.get("num_warps", 4))
    ir = compiled.asm["ir"]
    assert f"arch = {arch}" in ir
    if arch in expect:
        assert f"impl = {expect[arch]}" in ir, f"expected the {expect[arch]} lowering on {arch}"
    if not case.startswith("interpreter/"):  # the shipped configurations: ptxas reports no local-memory spills
        assert compiled.meta.get("spills") in (0, None), compiled.meta.get("spills")
    # a second compile of the same specialization is the same object (in-memory hit)
    assert kernel.compile(*args, arch=arch, **kwargs) is compiled


def test_every_module_level_interpreter_kernel_is_covered():
    """A kernel added to test_interpreter.py should get a case here (or a reason not to)."""
    kernels = {value.__name__ for value in vars(ti).values() if isinstance(value, Kernel)}
    covered = {kernel.__name__ for kernel, *_ in INTERPRETER_CASES.values()}
    assert kernels <= covered, f"not compiled here: {sorted(kernels - covered)}"


def test_every_gpu_test_kernel_is_covered():
    """Every kernel tests/gpu/test_gpu_kernels.py runs has a compile case here. Its imports from tests/kernels.py
    are read from its source (a CPU test module imports no GPU test module)."""
    source = Path(__file__).resolve().parents[1] / "gpu" / "test_gpu_kernels.py"
    names = {alias.name for node in ast.walk(ast.parse(source.read_text()))
             if isinstance(node, ast.ImportFrom) and node.module == "kernels" for alias in node.names}
    kernels = {name for name in names if isinstance(getattr(gk, name), Kernel)}
    covered = {kernel.__name__ for kernel, *_ in GPU_CASES.values()}
    assert kernels and kernels == covered


@pytest.mark.skipif(not nvrtc_supports("sm_100a"), reason="the installed NVRTC cannot target sm_100a")
@pytest.mark.parametrize("bk", [32, 64])
def test_design_matmul_compiles_for_sm100a(bk):
    kernel, args, kwargs, _ = _mm(example_matmul, 128, 128, bk)
    compiled = kernel.compile(*args, arch="sm_100a", **kwargs)
    check_cubin(compiled, "sm_100a", 4)
    assert "arch = sm_100a" in compiled.asm["ir"] and "tj.gemm" in compiled.asm["ir"]


def test_the_three_archs_give_different_binaries():
    kernel, args, kwargs, _ = _mm(example_matmul, 128, 128, 64)
    cubins = {arch: kernel.compile(*args, arch=arch, **kwargs).asm["cubin"] for arch in ARCHS}
    assert cubins["sm_80"] != cubins["sm_90a"]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_column_major_window_is_copied_down_its_columns(arch):
    """B given as ``w.T`` (unit stride in its first dim) goes to shared memory element by element: neighbouring
    threads take neighbouring rows of a column (consecutive addresses), where walking along a row would read
    elements a whole stride apart. A's window, strided in both dims, is walked along its rows."""
    kernel, args, kwargs, _ = GPU_CASES["matmul-strided-a-colmajor-b-f32-out"]
    cuda = kernel.compile(*args, arch=arch, stop_after="cuda", **kwargs).cuda
    copies = [line.strip() for line in cuda.splitlines() if "const int tj_" in line and "tj_e" in line]
    column = "const int tj_k = (tj_e >> 5), tj_r = (tj_e & 31);  // column-major window"  # BK = 32 rows of B
    assert column in copies, copies
    assert "const int tj_r = (tj_e >> 5), tj_k = (tj_e & 31);" in copies, copies  # A: 64 x 32, along its rows
