"""NVRTC compilation of the prelude (included from tilejit's headers) for every supported arch, and NVRTC's error
paths. CPU only."""
from __future__ import annotations

import os
import re

import pytest

from tilejit.backend_cuda import nvrtc
from tilejit.backend_cuda.nvrtc import compile_cuda, nvrtc_supports, nvrtc_version
from tilejit.target import SUPPORTED_ARCHS, Arch
from tilejit.backend_cuda.headers import include_directive
from tilejit.errors import BackendCompileError, BackendUnavailableError, TilejitError

PRELUDE = include_directive("prelude")

# Calls every prelude function once, so a typo in any inline PTX string fails to compile here.
PROBE_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(32) tj_prelude_probe(
    const tj_half* xh, const tj_bf16* xb, const tj_fp8e4m3* x8a, const tj_fp8e5m2* x8b, const float* xf,
    const int8_t* xi8, const int32_t* xi32, const int64_t* xi64, const bool* xbool,
    float* out, tj_half* oh, tj_bf16* ob, tj_fp8e4m3* o8a, tj_fp8e5m2* o8b,
    int32_t* oi32, int64_t* oi64, int8_t* oi8, bool* obool, unsigned* opack, int n)
{
  __shared__ alignas(128) unsigned short smem[16 * 16];
  const int t = threadIdx.x;
  // cp.async: 16 rows of 16 halves = 32 chunks of 16 B, one per lane; rows past n zero-filled.
  tj_cp_async_16(tj_smem_addr(smem + t * 8), xh + t * 8, t / 2 < n ? 16 : 0);
  tj_cp_async_commit();
  tj_cp_async_wait<0>();
  __syncthreads();
  unsigned a0, a1, a2, a3, b0, b1, c0, c1, e0;
  tj_ldmatrix_x4(a0, a1, a2, a3, tj_smem_addr(smem + (t % 16) * 16 + (t / 16) * 8));
  tj_ldmatrix_x2(b0, b1, tj_smem_addr(smem + (t % 8) * 16 + ((t / 8) & 1) * 8));
  tj_ldmatrix_x1(e0, tj_smem_addr(smem + (t % 8) * 16));
  tj_ldmatrix_x4_trans(c0, c1, a2, a3, tj_smem_addr(smem + (t % 16) * 16 + (t / 16) * 8));
  tj_ldmatrix_x2_trans(b0, c1, tj_smem_addr(smem + (t % 8) * 16 + ((t / 8) & 1) * 8));
  tj_ldmatrix_x1_trans(e0, tj_smem_addr(smem + (t % 8) * 16));
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  tj_mma_m16n8k16_f16(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1);
  tj_mma_m16n8k16_bf16(d0, d1, d2, d3, a0, a1, a2, a3, b0, c1);
  tj_mma_m16n8k8_f16(d0, d1, d2, d3, a0, a1, e0);
  tj_mma_m16n8k8_bf16(d0, d1, d2, d3, c0, a1, e0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  tj_mma_m16n8k32_e4m3(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1);
  tj_mma_m16n8k32_e5m2(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1);
#endif
  float v = tj_to_f32(xh[t]) + tj_to_f32(xb[t]) + tj_to_f32(x8a[t]) + tj_to_f32(x8b[t]) + tj_to_f32(xf[t])
          + tj_to_f32(xi8[t]) + tj_to_f32(xi32[t]) + tj_to_f32(xi64[t]) + tj_to_f32(xbool[t]);
  v += tj_exp(v) + tj_exp2(v) + tj_log(v) + tj_sqrt(v) + tj_rsqrt(v) + tj_abs(v) + tj_max(v, d0) + tj_min(v, d1);
  v += tj_shfl_xor(v, 16) + (float)tj_shfl_xor(t, 1) + d2 + d3;
  out[t] = v;
  oh[t] = tj_from_f32<tj_half>(v);
  ob[t] = tj_from_f32<tj_bf16>(v);
  o8a[t] = tj_from_f32<tj_fp8e4m3>(v);
  o8b[t] = tj_from_f32<tj_fp8e5m2>(v);
  oi32[t] = tj_from_f32<int32_t>(v);
  oi64[t] = tj_from_f32<int64_t>(v);
  oi8[t] = tj_from_f32<int8_t>(v);
  obool[t] = tj_from_f32<bool>(v);
  opack[t] = tj_pack_half2(v, d0) ^ tj_pack_bf162(d1, v) ^ tj_f32_to_e4m3_sw(v) ^ tj_f32_to_e5m2_sw(v);
}
"""

ARCHS_HERE = [a for a in SUPPORTED_ARCHS if nvrtc_supports(a)]


def test_nvrtc_version_is_known():
    major, minor = nvrtc_version()
    assert major >= 12 and minor >= 0
    assert nvrtc_version() is nvrtc_version()  # cached


def test_this_nvrtc_supports_every_arch_it_should():
    # NVRTC 12.8+ (what the project depends on) targets all of them.
    if nvrtc_version() >= (12, 8):
        assert ARCHS_HERE == list(SUPPORTED_ARCHS)
    assert "sm_80" in ARCHS_HERE


@pytest.mark.parametrize("arch", ARCHS_HERE)
def test_prelude_probe_compiles_to_cubin_and_ptx(arch):
    result = compile_cuda(PRELUDE + PROBE_KERNEL, name="tj_prelude_probe", arch=arch)
    assert result.cubin[:4] == b"\x7fELF"
    assert result.ptx is not None and ".entry tj_prelude_probe" in result.ptx
    assert f".target {arch}" in result.ptx
    assert result.arch == arch
    assert result.nvrtc_version == nvrtc_version()
    assert 0 < result.seconds < 30
    # The fp8 hardware cvt is used exactly where the arch has it, the software fallback elsewhere.
    has_fp8_cvt = arch not in ("sm_80", "sm_86")
    assert ("cvt.rn.satfinite.e4m3x2.f32" in result.ptx) == has_fp8_cvt
    for instr in ("cp.async.cg.shared.global", "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "max.NaN.f32"):
        assert instr in result.ptx


def test_keep_ptx_false_gives_no_ptx():
    result = compile_cuda(PRELUDE + PROBE_KERNEL, name="tj_prelude_probe", arch="sm_80", keep_ptx=False)
    assert result.ptx is None
    assert result.cubin[:4] == b"\x7fELF"


def test_extra_options_are_passed():
    src = 'extern "C" __global__ void k(float* x) {\n#ifdef TJ_TEST_DEFINE\n x[0] = 1.f;\n#endif\n}\n'
    with_def = compile_cuda(src, name="k", arch="sm_80", options=["-DTJ_TEST_DEFINE"])
    without = compile_cuda(src, name="k", arch="sm_80")
    assert "st.global" in with_def.ptx
    assert "st.global" not in without.ptx


def test_syntax_error_raises_backend_compile_error_with_log_and_source_path():
    src = PRELUDE + 'extern "C" __global__ void broken(float* x) {\n  x[0] = undefined_thing;\n}\n'
    with pytest.raises(BackendCompileError) as info:
        compile_cuda(src, name="broken", arch="sm_90a")
    err = info.value
    assert isinstance(err, TilejitError)
    assert err.arch == "sm_90a"
    assert err.source == src
    assert re.search(r'broken\.cu\(\d+\): error: identifier "undefined_thing" is undefined', err.log)
    assert err.source_path is not None and os.path.exists(err.source_path)
    with open(err.source_path, encoding="utf-8") as f:
        assert f.read() == src
    message = str(err)
    assert 'identifier "undefined_thing" is undefined' in message
    assert err.source_path in message
    assert "sm_90a" in message
    os.unlink(err.source_path)


def test_bad_option_is_a_backend_compile_error():
    with pytest.raises(BackendCompileError) as info:
        compile_cuda('extern "C" __global__ void k() {}', name="k", arch="sm_80", options=["--no-such-option"])
    assert "--no-such-option" in str(info.value)
    os.unlink(info.value.source_path)


@pytest.mark.parametrize("bad", ["sm_75", "sm_91a", "gfx90a", "", "sm_100"])
def test_unknown_arch_raises_value_error_listing_supported(bad):
    with pytest.raises(ValueError) as info:
        compile_cuda('extern "C" __global__ void k() {}', name="k", arch=bad)
    for arch in SUPPORTED_ARCHS:
        assert arch in str(info.value)


def test_sm_90_without_a_suggests_sm_90a():
    with pytest.raises(ValueError, match="did you mean 'sm_90a'"):
        Arch.parse("sm_90")


@pytest.mark.parametrize(
    "given, expected",
    [("sm_90a", "sm_90a"), ("90a", "sm_90a"), ("SM_100A", "sm_100a"), (" sm_80 ", "sm_80"), (86, "sm_86"),
     ("sm89", "sm_89"), ("120a", "sm_120a")],
)
def test_normalize_arch(given, expected):
    assert Arch.parse(given).name == expected


@pytest.mark.parametrize(
    "cap, expected",
    [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 9), "sm_89"), ((9, 0), "sm_90a"), ((10, 0), "sm_100a"),
     ((12, 0), "sm_120a")],
)
def test_default_arch_for_capability(cap, expected):
    assert Arch.for_capability(*cap).name == expected


@pytest.mark.parametrize("cap", [(7, 5), (8, 7), (11, 0)])
def test_default_arch_for_unsupported_capability(cap):
    with pytest.raises(ValueError, match="sm_80"):
        Arch.for_capability(*cap)


def test_too_old_nvrtc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (12, 4))
    monkeypatch.setattr(nvrtc, "_library_version", lambda: (12, 4))  # (a refusal asks the library itself)
    with pytest.raises(BackendUnavailableError, match=r"sm_100a needs NVRTC >= 12\.8.*12\.4"):
        compile_cuda('extern "C" __global__ void k() {}', name="k", arch="sm_100a")
    assert not nvrtc_supports("sm_120a")
    assert nvrtc_supports("sm_90a")


def test_specializations_with_the_same_cuda_each_get_ptxas_resources():
    """NVRTC 12.9+ caches programs and a hit's log has no ptxas report; the compiler tags each program with its
    cache key (a global variable named after it), so two specializations whose CUDA is the same are two programs
    to NVRTC and both get registers and spills, while one specialization compiled again gives the same cubin."""
    src = 'extern "C" __global__ void tj_twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'

    def compile_tagged(tag):
        return compile_cuda(src, name="tj_twice", arch="sm_90a", keep_ptx=False, options=["--ptxas-options=-v"],
                            tag=tag)

    a, b, again = compile_tagged("key-a"), compile_tagged("key-b"), compile_tagged("key-a")
    for log in (a.log, b.log):
        assert re.search(r"Used \d+ registers", log) and "spill" in log, log
    assert a.cubin != b.cubin and again.cubin == a.cubin


def test_a_compile_answered_from_nvrtc_cache_without_a_report_runs_again(monkeypatch):
    """NVRTC 13 (not 12.9) answers a program it compiled before (same source and tag: a cleared tilejit cache,
    two processes compiling one kernel) from its own cache with a log that has no ptxas report; compile_cuda then
    compiles once more under a tag of its own, so registers and spills are always known."""
    src = 'extern "C" __global__ void tj_thrice(float* x) { x[threadIdx.x] *= 3.0f; }\n'
    real = nvrtc._run_nvrtc
    tags = []

    def cache_hit_first(source, name, arch, options, *, want_cubin, want_ptx, tag=""):
        tags.append(tag)
        cubin, ptx, log = real(source, name, arch, options, want_cubin=want_cubin, want_ptx=want_ptx, tag=tag)
        return (cubin, ptx, "") if len(tags) == 1 else (cubin, ptx, log)  # the first, as a cache hit returns it

    monkeypatch.setattr(nvrtc, "_run_nvrtc", cache_hit_first)
    result = compile_cuda(src, name="tj_thrice", arch="sm_90a", keep_ptx=False, options=["--ptxas-options=-v"],
                          tag="key")
    assert len(tags) == 2 and tags[0] == "key" and tags[1].startswith("key:") and len(tags[1]) > 10
    assert re.search(r"Used \d+ registers", result.log)
    tags.clear()
    compile_cuda(src, name="tj_thrice", arch="sm_90a", keep_ptx=False, tag="key")  # no -v asked: no second run
    assert tags == ["key"]
