"""Stream-K (the ``stream_k`` launch option; passes/split_k.stream_k, lower_specialized._stream_k_schedule,
lower_split_k._stream_k_fixup), on CPU: the rewritten IR (the loop's bounds from the current run, one fix-up of
the accumulators, the epilogue guarded by its owner bit), the generated CUDA (the grid and workspace parameters,
the last wave's schedule, the counter protocol in which nobody waits), cubins without spills, the cache key and
meta, located errors for kernels, options and archs it cannot serve, ``Config(stream_k=)`` and the runtime's
launcher (one program per SM, the grid and the stream's workspace appended before the tensor maps). GPU results:
tests/gpu/test_gpu_stream_k.py.
"""
from __future__ import annotations

import pytest
import torch

import tilejit
import tilejit.language as T
from tilejit.autotuner import Config
from tilejit.errors import CompilationError, UsageValueError
from tilejit.ir import OpKind
from tilejit.passes.split_k import StreamKError
from tilejit.target import LaunchOptions
from test_warp_specialize import _args, _compile, _meta, mm

pytestmark = pytest.mark.usefixtures("fresh_compile_cache")


def test_structure_of_the_design_matmul():
    st = _compile(mm, *_args(4096, 4096, 4096), stream_k=True)
    ops = [o.kind for o in st.fn.body.ops]
    assert ops.count(OpKind.STREAM_K_BOUND) == 2 and ops.count(OpKind.STREAM_K_FIXUP) == 1
    loop = next(o for o in st.fn.body.ops if o.kind is OpKind.FOR)
    assert loop.operands[0].name == "k_run_lo" and loop.operands[1].name == "k_run_hi"
    fixup = next(o for o in st.fn.body.ops if o.kind is OpKind.STREAM_K_FIXUP)
    guard = st.fn.body.ops[-1]
    assert guard.kind is OpKind.IF and guard.operands[0] is fixup.results[-1]
    assert any(o.kind is OpKind.STORE for o in guard.regions[0].walk())  # the epilogue runs in the owner only
    cuda = st.cuda
    # the user's grid and the workspace come after the user's parameters, before the tensor maps
    assert st.param_kinds[-9:] == ["i32", "i32", "i32", "ptr", "ptr", "i32", "tmap", "tmap", "tmap"]
    assert "int32_t tj_grid0," in cuda and "unsigned* __restrict__ tj_sk_ws," in cuda
    assert "const long long tj_nprogs = (long long)tj_grid0 * tj_grid1 * tj_grid2;" in cuda
    assert "gridDim" not in cuda.split("tj_smem_addr(tj_smem)")[1]  # launched as 132 programs: the grid is a parameter
    # the schedule, in the producer's walk and in the math warps' (after the register split: nothing spilled)
    assert cuda.count("const int tj_sk_tiles = (int)(tj_nprogs % 132);") == 2
    assert cuda.count("while (tj_w < tj_sk_dp || tj_sk_it < tj_sk_end)") == 2
    # the fix-up: stores, a counter per tile, the owner learned by every math warp; nobody spins
    assert "atom.acq_rel.gpu.global.cas.b64" in cuda and "bar.red.or.pred p, 1, 256, q;" in cuda
    assert "ld.acquire" not in cuda and "__nanosleep" not in cuda
    assert "(unsigned)(tj_want >> 32) == (unsigned)tj_sk_epoch ? (unsigned)tj_want : 0u" in cuda
    assert "if (tj_last) *tj_count = 0ull;" in cuda


def test_cubin_meta_and_key():
    args = _args(1000, 3000, 776)
    plain = _compile(mm, *args, persistent=True, stop_after=None)
    sk = _compile(mm, *args, stream_k=True, stop_after=None)
    assert sk.key != plain.key and plain.meta["stream_k"] == 0
    assert sk.meta["stream_k"] == 132 and sk.meta["stream_k_flags"] == 2
    # two slots per program of 128x256 f32 accumulators (256 math threads x 128 registers x 4 bytes)
    assert sk.meta["stream_k_slot_bytes"] == 2 * 256 * 128 * 4
    assert sk.meta["spills"] == 0 and sk.meta["registers"] <= 168
    assert sk.threads == 384


@pytest.mark.parametrize("dtype,acc", [(torch.int8, T.int32), (torch.float32, T.float32)])
def test_int_and_tf32_accumulators(dtype, acc):
    from kernels import matmul_any

    out = torch.int32 if dtype == torch.int8 else torch.float32
    bk = 128 if dtype == torch.int8 else 32
    st = matmul_any.compile(_meta(1000, 784, dtype=dtype), _meta(300, 784, dtype=dtype), _meta(1000, 300, dtype=out),
                            BM=128, BN=128, BK=bk, TA=False, TB=True, ACC=acc, num_warps=4, num_stages=4,
                            stream_k=True, arch="sm_90a", stop_after=None)
    assert st.meta["stream_k"] == 132 and st.meta["spills"] == 0
    words = "(int32_t)(x.x)" if dtype == torch.int8 else "__uint_as_float(x.x)"
    assert words in st.asm["cuda"]


def test_the_gpus_sm_count_sets_the_programs(monkeypatch):
    """Compiled for the GPU's SMs (an H100 PCIe's 114 here), as a persistent kernel is."""
    from tilejit.runtime import jit

    monkeypatch.setattr(jit, "_sm_count", lambda device_index: 114)
    st = _compile(mm, *_args(1000, 3000, 776), stream_k=True, stop_after=None)
    assert st.meta["stream_k"] == 114 and "const int tj_sk_tiles = (int)(tj_nprogs % 114);" in st.asm["cuda"]


# -- what it refuses ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, why", [({"pingpong": True}, "pingpong"), ({"cluster": 2}, "cluster=2"),
                                        ({"split_k": 2}, "split_k")])
def test_refused_with_other_options(extra, why):
    with pytest.raises(StreamKError, match=f"stream_k does not combine with {why}") as info:
        _compile(mm, *_args(), stream_k=True, **extra)
    assert "launch without stream_k" in info.value.hint
    assert info.value.lineno is not None and "@" in info.value.source_line, "pointed at the kernel's product"


@pytest.mark.parametrize("arch", ["sm_80", "sm_100a"])
def test_passed_over_off_sm90(arch):
    """Like the other warp-specialization options, it means nothing on other archs (an autotune space that
    offers it stays portable): the kernel compiles as without it, and its meta says so."""
    from tilejit.backend_cuda.nvrtc import nvrtc_supports

    if not nvrtc_supports(arch):
        pytest.skip(f"this NVRTC has no {arch}")
    st = _compile(mm, *_args(), stream_k=True, arch=arch, BK=32, stop_after=None)
    assert st.meta["stream_k"] == 0 and "tj_sk" not in st.asm["cuda"]


@tilejit.kernel
def causal_bound(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, m0 + BM, BK):
        acc += A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@tilejit.kernel
def rescaled(A, B, C, BM: T.constexpr, BN: T.constexpr, BK: T.constexpr):
    K = A.shape[1]
    m0 = T.program_id(0) * BM
    n0 = T.program_id(1) * BN
    acc = T.zeros((BM, BN), T.float32)
    for k0 in T.range(0, K, BK):
        acc = acc * 0.5 + A[m0:m0 + BM, k0:k0 + BK] @ B[k0:k0 + BK, n0:n0 + BN]
    C[m0:m0 + BM, n0:n0 + BN] = acc.to(C.dtype)


@pytest.mark.parametrize("kernel, match, line", [
    (causal_bound, "as many iterations in every output tile; its bounds depend on T.program_id", "for k0"),
    (rescaled, "cannot|needs", "for k0"),
])
def test_refused_kernels_point_at_the_loop(kernel, match, line):
    with pytest.raises(CompilationError, match=match) as info:
        _compile(kernel, *_args(), stream_k=True)
    assert line in str(info.value) and "^" in str(info.value)


def test_passed_over_without_a_tma_loop():
    """B of 700 columns: its rows are not 16-byte aligned, so no TMA load and no warp-specialized loop; as with
    ``persistent``, the kernel compiles as without the option (an autotune space that offers it stays usable)."""
    st = _compile(mm, *_args(1000, 700, 512), stream_k=True, stop_after=None)
    assert st.meta["stream_k"] == 0 and "tj_sk" not in st.asm["cuda"]


# -- the option, the config, the launcher ------------------------------------------------------------------

def test_option_validation_and_config():
    with pytest.raises(UsageValueError, match="stream_k must be True or False"):
        LaunchOptions(stream_k=1)
    assert "stream_k" in LaunchOptions.names() and LaunchOptions(stream_k=True).as_dict()["stream_k"] is True
    c = Config({"BM": 128}, num_warps=4, stream_k=True)
    assert c.all_kwargs()["stream_k"] is True and "stream_k=True" in repr(c) and "stream_k=True" in c.identity
    assert "stream_k" not in Config({"BM": 128}).all_kwargs()
    with pytest.raises(ValueError, match="stream_k must be True or False"):
        Config({"BM": 128}, stream_k="yes")


def test_launcher_runs_one_program_per_sm_with_the_grid_and_workspace(monkeypatch):
    from tilejit.runtime import launch

    seen, asked = [], []
    monkeypatch.setattr(launch, "stream_k_workspace",
                        lambda device, stream, nbytes, flags: asked.append((device, stream, nbytes, flags))
                        or (0xA000, 0xB000))
    sk = launch.StreamKLauncher(lambda grid, stream, values: seen.append((grid, stream, values)), 132, 4096, 2, 1)
    sk((40, 3, 2), 0x55, [1, 2, 3])
    sk((40, 3, 2), 0x55, [1, 2, 3])
    (grid, stream, first), (_, _, second) = seen
    assert grid == (132, 1, 1) and stream == 0x55 and first[:-1] == [1, 2, 3, 40, 3, 2, 0xA000, 0xB000]
    assert 0 < first[-1] < 2**31 and second[-1] != first[-1]  # a new epoch per launch
    assert asked == [(1, 0x55, 132 * 4096, 264)] * 2


def test_meta_of_a_stream_k_entry_is_checked():
    from tilejit.compiler import check_meta

    st = _compile(mm, *_args(1000, 3000, 776), stream_k=True, stop_after=None)
    meta = dict(st.meta)
    check_meta(meta)
    for broken in ({"stream_k_slot_bytes": 0}, {"stream_k": -1}, {"stream_k_flags": "2"}):
        with pytest.raises(ValueError, match="meta.json"):
            check_meta({**meta, **broken})
