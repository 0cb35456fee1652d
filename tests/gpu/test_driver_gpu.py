"""Prelude kernels loaded with the CUDA driver and launched through make_launcher, checked against torch.

GPU tests are marked ``gpu``; the kernels are also compiled on the CPU (unmarked test) so a broken kernel text
shows up without a GPU. Outputs are poisoned (NaN / 0xff bytes) before each launch so an unwritten element
fails the comparison.
"""
from __future__ import annotations

import pytest

from tilejit.backend_cuda.nvrtc import compile_cuda
from tilejit.target import Arch
from tilejit.backend_cuda.headers import include_directive
from tilejit.errors import LaunchError

PRELUDE = include_directive("prelude")

KERNELS = r"""
extern "C" __global__ void convert_probe(const float* x, int n, unsigned short* h, unsigned short* b,
    unsigned char* e4, unsigned char* e5, unsigned char* e4sw, unsigned char* e5sw,
    int32_t* i32, int64_t* i64, int8_t* i8, unsigned* ph, unsigned* pb, unsigned short* h2, unsigned short* b2) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  h[i] = tj_from_f32<tj_half>(v).bits;
  b[i] = tj_from_f32<tj_bf16>(v).bits;
  e4[i] = tj_from_f32<tj_fp8e4m3>(v).bits;
  e5[i] = tj_from_f32<tj_fp8e5m2>(v).bits;
  e4sw[i] = tj_f32_to_e4m3_sw(v);
  e5sw[i] = tj_f32_to_e5m2_sw(v);
  i32[i] = tj_from_f32<int32_t>(v);
  i64[i] = tj_from_f32<int64_t>(v);
  i8[i] = tj_from_f32<int8_t>(v);
  ph[i] = tj_pack_half2(v, -v);
  pb[i] = tj_pack_bf162(v, -v);
  // the register tiles' paired cast: element i from x[i], its neighbour from -x[i]
  tj_half hp[2]; tj_from_f32x2<tj_half>(v, -v, hp);
  tj_bf16 bp[2]; tj_from_f32x2<tj_bf16>(v, -v, bp);
  h2[2 * i] = hp[0].bits; h2[2 * i + 1] = hp[1].bits;
  b2[2 * i] = bp[0].bits; b2[2 * i + 1] = bp[1].bits;
}

// i < 65536 decodes 16-bit patterns; i < 256 also decodes 8-bit ones.
extern "C" __global__ void decode_probe(float* fh, float* fb, float* f4, float* f5, float* f4sw) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tj_half h; h.bits = (unsigned short)i; fh[i] = tj_to_f32(h);
  tj_bf16 b; b.bits = (unsigned short)i; fb[i] = tj_to_f32(b);
  if (i < 256) {
    tj_fp8e4m3 e4; e4.bits = (unsigned char)i; f4[i] = tj_to_f32(e4);
    tj_fp8e5m2 e5; e5.bits = (unsigned char)i; f5[i] = tj_to_f32(e5);
    f4sw[i] = tj_e4m3_to_f32_sw((unsigned char)i);
  }
}

extern "C" __global__ void math_probe(const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;  // n is a multiple of 32, so whole warps stay for the shuffles
  float v = x[i], w = y[i];
  out[0 * n + i] = tj_exp(v);
  out[1 * n + i] = tj_exp2(v);
  out[2 * n + i] = tj_log(tj_abs(v));
  out[3 * n + i] = tj_sqrt(tj_abs(v));
  out[4 * n + i] = tj_rsqrt(tj_abs(v));
  out[5 * n + i] = tj_max(v, w);
  out[6 * n + i] = tj_min(v, w);
  float s = w;
  for (int m = 16; m >= 1; m /= 2) s += tj_shfl_xor(s, m);
  out[7 * n + i] = s;
  out[8 * n + i] = (float)tj_shfl_xor((int)threadIdx.x, 5);
}

// One warp: D(16x8) = C + A(16x16, row-major) @ B, B stored N x K (B_KN false) or K x N (B_KN true).
template <bool BF16, bool B_KN>
__device__ void mma_m16n8k16_probe(const unsigned short* A, const unsigned short* B, const float* C, float* D) {
  __shared__ alignas(128) unsigned short sA[16 * 16];
  __shared__ alignas(128) unsigned short sB[16 * 8];
  const int l = threadIdx.x, g = l >> 2, t = l & 3;
  tj_cp_async_16(tj_smem_addr(sA + l * 8), A + l * 8, 16);
  if (l < 16) tj_cp_async_16(tj_smem_addr(sB + l * 8), B + l * 8, 16);
  tj_cp_async_commit();
  tj_cp_async_wait<0>();
  __syncthreads();
  unsigned a0, a1, a2, a3, b0, b1;
  tj_ldmatrix_x4(a0, a1, a2, a3, tj_smem_addr(sA + (l % 16) * 16 + (l / 16) * 8));
  if (B_KN) tj_ldmatrix_x2_trans(b0, b1, tj_smem_addr(sB + (l % 16) * 8));
  else tj_ldmatrix_x2(b0, b1, tj_smem_addr(sB + (l % 8) * 16 + ((l / 8) & 1) * 8));
  float d[4];
  for (int i = 0; i < 4; ++i) d[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  if (BF16) tj_mma_m16n8k16_bf16(d[0], d[1], d[2], d[3], a0, a1, a2, a3, b0, b1);
  else tj_mma_m16n8k16_f16(d[0], d[1], d[2], d[3], a0, a1, a2, a3, b0, b1);
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
}
extern "C" __global__ void mma16_f16_nk(const unsigned short* A, const unsigned short* B, const float* C, float* D) { mma_m16n8k16_probe<false, false>(A, B, C, D); }
extern "C" __global__ void mma16_bf16_nk(const unsigned short* A, const unsigned short* B, const float* C, float* D) { mma_m16n8k16_probe<true, false>(A, B, C, D); }
extern "C" __global__ void mma16_f16_kn(const unsigned short* A, const unsigned short* B, const float* C, float* D) { mma_m16n8k16_probe<false, true>(A, B, C, D); }
extern "C" __global__ void mma16_bf16_kn(const unsigned short* A, const unsigned short* B, const float* C, float* D) { mma_m16n8k16_probe<true, true>(A, B, C, D); }

// One warp: D(16x8) = C + A(16x8, row-major) @ B, B stored N x K (8 x 8); ldmatrix x2 / x1 (and .trans x1
// reading a K x N copy of B).
template <bool BF16>
__device__ void mma_m16n8k8_probe(const unsigned short* A, const unsigned short* B, const unsigned short* Bkn,
                                  const float* C, float* D, float* D2) {
  __shared__ alignas(128) unsigned short sA[16 * 8];
  __shared__ alignas(128) unsigned short sB[8 * 8];
  __shared__ alignas(128) unsigned short sBkn[8 * 8];
  const int l = threadIdx.x, g = l >> 2, t = l & 3;
  if (l < 16) tj_cp_async_16(tj_smem_addr(sA + l * 8), A + l * 8, 16);
  if (l < 8) tj_cp_async_16(tj_smem_addr(sB + l * 8), B + l * 8, 16);
  if (l < 8) tj_cp_async_16(tj_smem_addr(sBkn + l * 8), Bkn + l * 8, 16);
  tj_cp_async_commit();
  tj_cp_async_wait<0>();
  __syncthreads();
  unsigned a0, a1, b0, bt0;
  tj_ldmatrix_x2(a0, a1, tj_smem_addr(sA + (l % 16) * 8));
  tj_ldmatrix_x1(b0, tj_smem_addr(sB + (l % 8) * 8));
  tj_ldmatrix_x1_trans(bt0, tj_smem_addr(sBkn + (l % 8) * 8));
  float d[4], e[4];
  for (int i = 0; i < 4; ++i) d[i] = e[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
  if (BF16) { tj_mma_m16n8k8_bf16(d[0], d[1], d[2], d[3], a0, a1, b0); tj_mma_m16n8k8_bf16(e[0], e[1], e[2], e[3], a0, a1, bt0); }
  else { tj_mma_m16n8k8_f16(d[0], d[1], d[2], d[3], a0, a1, b0); tj_mma_m16n8k8_f16(e[0], e[1], e[2], e[3], a0, a1, bt0); }
  for (int i = 0; i < 4; ++i) {
    D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
    D2[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = e[i];
  }
}
extern "C" __global__ void mma8_f16(const unsigned short* A, const unsigned short* B, const unsigned short* Bkn, const float* C, float* D, float* D2) { mma_m16n8k8_probe<false>(A, B, Bkn, C, D, D2); }
extern "C" __global__ void mma8_bf16(const unsigned short* A, const unsigned short* B, const unsigned short* Bkn, const float* C, float* D, float* D2) { mma_m16n8k8_probe<true>(A, B, Bkn, C, D, D2); }

// Every parameter kind, echoed back: checks the launcher's packing and the by-value CUtensorMap.
extern "C" __global__ void params_probe(int64_t* out, const float* p, int64_t a, int32_t b, float c,
                                        const __grid_constant__ CUtensorMap tm, int32_t d) {
  out[0] = (int64_t)p; out[1] = a; out[2] = b; out[3] = __float_as_int(c);
  for (int k = 0; k < 16; ++k) out[4 + k] = (int64_t)tm.opaque[k];
  out[20] = d;
  out[21] = gridDim.x * 100 + gridDim.y * 10 + gridDim.z;
  out[22] = blockDim.x;
}

extern "C" __global__ void big_smem_probe(float* out) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = (float)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}
"""


def _fake_loaded(max_threads=1024):
    from tilejit.runtime.driver import KernelAttributes, LoadedKernel

    attrs = KernelAttributes(num_regs=32, local_bytes=0, static_smem_bytes=0, max_threads_per_block=max_threads,
                             max_smem_optin_bytes=227 * 1024)
    return LoadedKernel("fake", 0, context=None, module=None, function=None, attributes=attrs)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gpu_probe_kernels_compile(arch):
    result = compile_cuda(PRELUDE + KERNELS, name="probes", arch=arch)
    for name in ("convert_probe", "decode_probe", "math_probe", "mma16_bf16_kn", "mma8_f16", "params_probe"):
        assert f".entry {name}" in result.ptx


def test_launcher_packs_parameters_with_kernel_alignment():
    from tilejit.runtime.driver import make_launcher

    launcher = make_launcher(_fake_loaded(), ["ptr", "ptr", "i64", "i32", "f32", "tmap", "i32"], (32, 1, 1))
    # ptr 0, ptr 8, i64 16, i32 24, f32 28, tmap at the next multiple of 64 (64), i32 192
    assert launcher._struct.size == 196
    base = launcher._pointers[0]
    assert [p - base for p in launcher._pointers] == [0, 8, 16, 24, 28, 64, 192]


def test_launcher_rejects_bad_values_naming_the_parameter():
    from tilejit.runtime.driver import make_launcher

    launcher = make_launcher(_fake_loaded(), ["ptr", "i32"], (32, 1, 1))
    with pytest.raises(LaunchError, match=r"parameter 1 \(i32\)"):
        launcher((1, 1, 1), 0, [0, 2**40])
    with pytest.raises(LaunchError, match="takes 2 parameters"):
        launcher((1, 1, 1), 0, [0])


def test_launcher_parameters_do_not_mix_between_threads(monkeypatch):
    """cuLaunchKernel releases the GIL: a launch on one thread must not see parameters another thread packed.
    The fake driver reads the parameters through the void** it is given, yields the GIL, and reads again."""
    import ctypes
    import threading
    import time
    import types

    from tilejit.runtime import driver

    mixed = []

    def fake_launch(function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        slots = (ctypes.c_void_p * 2).from_address(params)
        first = [ctypes.c_int64.from_address(slots[k]).value for k in range(2)]
        time.sleep(0)  # let another thread pack and launch in between
        again = [ctypes.c_int64.from_address(slots[k]).value for k in range(2)]
        if first != [stream, -stream] or again != first:
            mixed.append((stream, first, again))
        return (0,)

    monkeypatch.setattr(driver, "_driver", lambda: types.SimpleNamespace(cuLaunchKernel=fake_launch))
    launcher = driver.make_launcher(_fake_loaded(), ["i64", "i64"], (32, 1, 1), impl="bindings")

    def launch_many(thread: int) -> None:
        for _ in range(2000):
            launcher((1, 1, 1), thread, [thread, -thread])

    threads = [threading.Thread(target=launch_many, args=(t,)) for t in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mixed == []


def test_launcher_rejects_too_many_threads():
    from tilejit.runtime.driver import make_launcher

    with pytest.raises(LaunchError, match="at most 256"):
        make_launcher(_fake_loaded(max_threads=256), ["ptr"], (512, 1, 1))


def test_driver_imports_without_gpu():
    import tilejit.runtime.driver as driver

    assert driver.DEFAULT_LAUNCH_IMPL in driver.LAUNCH_IMPLS


# ---------------------------------------------------------------- GPU ----


@pytest.fixture(scope="module")
def probes():
    import torch

    from tilejit.runtime.driver import load_cubin, make_launcher

    arch = Arch.for_capability(*torch.cuda.get_device_capability(0)).name
    cubin = compile_cuda(PRELUDE + KERNELS, name="probes", arch=arch).cubin

    def launcher(name, kinds, block=(32, 1, 1), smem=0, impl="bindings"):
        loaded = load_cubin(cubin, name, 0, smem)
        return make_launcher(loaded, kinds, block, smem, impl=impl)

    return launcher


def _stream():
    import torch

    return torch.cuda.current_stream(0).cuda_stream


def _poisoned(shape, dtype):
    import torch

    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    return torch.full(shape, -1, dtype=dtype, device="cuda")


def _random_inputs(n, seed):
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-20, 12, (n,), generator=gen).float())
    specials = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, 448.0, -448.0, 57344.0, 65504.0, 65520.0, 1e-8, -1e-8,
                             2.0**-9, 2.0**-10, 1.5 * 2.0**-9, 2.0**-16, 3 * 2.0**-17, 300.5, -127.9, 128.0])
    return torch.cat([specials, x]).float()


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["bindings", "ctypes"])
def test_conversions_match_torch(probes, impl):
    import torch

    x_cpu = _random_inputs(1 << 16, seed=1234)
    n = x_cpu.numel()
    x = x_cpu.cuda()
    outs = {
        "h": _poisoned((n,), torch.int16), "b": _poisoned((n,), torch.int16),
        "e4": _poisoned((n,), torch.uint8), "e5": _poisoned((n,), torch.uint8),
        "e4sw": _poisoned((n,), torch.uint8), "e5sw": _poisoned((n,), torch.uint8),
        "i32": _poisoned((n,), torch.int32), "i64": _poisoned((n,), torch.int64), "i8": _poisoned((n,), torch.int8),
        "ph": _poisoned((n,), torch.int32), "pb": _poisoned((n,), torch.int32),
        "h2": _poisoned((2 * n,), torch.int16), "b2": _poisoned((2 * n,), torch.int16),
    }
    launch = probes("convert_probe", ["ptr", "i32"] + ["ptr"] * len(outs), block=(256, 1, 1), impl=impl)
    launch(((n + 255) // 256, 1, 1), _stream(), [x.data_ptr(), n] + [t.data_ptr() for t in outs.values()])
    torch.cuda.synchronize()
    o = {k: v.cpu() for k, v in outs.items()}

    assert torch.equal(o["h"], x_cpu.to(torch.float16).view(torch.int16))
    assert torch.equal(o["b"], x_cpu.to(torch.bfloat16).view(torch.int16))
    # fp8: torch maps |x| >= 480 (e4m3) to NaN and overflow to inf (e5m2); the prelude saturates (satfinite),
    # so compare on the representable range and check saturation separately.
    in_e4 = x_cpu.abs() < 448
    in_e5 = x_cpu.abs() < 57344
    ref_e4 = x_cpu.to(torch.float8_e4m3fn).view(torch.uint8)
    ref_e5 = x_cpu.to(torch.float8_e5m2).view(torch.uint8)
    for got, ref, mask in ((o["e4"], ref_e4, in_e4), (o["e4sw"], ref_e4, in_e4),
                           (o["e5"], ref_e5, in_e5), (o["e5sw"], ref_e5, in_e5)):
        assert torch.equal(got[mask], ref[mask])
    big = x_cpu.abs() >= 448
    assert torch.equal(o["e4"][big], torch.where(x_cpu[big] > 0, 0x7E, 0xFE).to(torch.uint8))
    assert torch.equal(o["e4sw"][big], o["e4"][big])
    big5 = x_cpu.abs() >= 57344
    assert big5.any()
    assert torch.equal(o["e5"][big5], torch.where(x_cpu[big5] > 0, 0x7B, 0xFB).to(torch.uint8))
    assert torch.equal(o["e5sw"][big5], o["e5"][big5])

    small = x_cpu.abs() < 2**31 - 128
    assert torch.equal(o["i32"][small], x_cpu[small].to(torch.int32))
    assert torch.equal(o["i64"][small], x_cpu[small].to(torch.int64))
    in8 = x_cpu.abs() < 128
    assert torch.equal(o["i8"][in8], x_cpu[in8].to(torch.int8))

    for key, dt in (("ph", torch.float16), ("pb", torch.bfloat16)):
        lo = x_cpu.to(dt).view(torch.int16).to(torch.int64) & 0xFFFF
        hi = (-x_cpu).to(dt).view(torch.int16).to(torch.int64) & 0xFFFF
        assert torch.equal(o[key].to(torch.int64) & 0xFFFFFFFF, lo | (hi << 16))
    for key, dt in (("h2", torch.float16), ("b2", torch.bfloat16)):  # tj_from_f32x2 rounds as tj_from_f32
        assert torch.equal(o[key], torch.stack([x_cpu, -x_cpu], 1).reshape(-1).to(dt).view(torch.int16))


@pytest.mark.gpu
def test_nan_and_inf_conversions(probes):
    import torch

    x = torch.tensor([float("nan"), float("inf"), float("-inf")] * 11 + [0.0] * 3, device="cuda")
    n = x.numel()
    outs = [_poisoned((n,), torch.int16), _poisoned((n,), torch.int16)] + [_poisoned((n,), torch.uint8) for _ in range(4)]
    rest = [_poisoned((n,), torch.int32), _poisoned((n,), torch.int64), _poisoned((n,), torch.int8),
            _poisoned((n,), torch.int32), _poisoned((n,), torch.int32), _poisoned((2 * n,), torch.int16),
            _poisoned((2 * n,), torch.int16)]
    launch = probes("convert_probe", ["ptr", "i32"] + ["ptr"] * 13)
    launch((2, 1, 1), _stream(), [x.data_ptr(), n] + [t.data_ptr() for t in outs + rest])
    torch.cuda.synchronize()
    h, b, e4, e5, e4sw, e5sw = (t.cpu() for t in outs)
    assert torch.isnan(h[0:1].view(torch.float16)).all() and torch.isnan(b[0:1].view(torch.bfloat16)).all()
    assert h[1].item() == 0x7C00 and b[1].item() == 0x7F80
    assert torch.isnan(e4[0:1].view(torch.float8_e4m3fn).float()).all()
    assert e4[1].item() == 0x7E and e4[2].item() == 0xFE and e4sw[1].item() == 0x7E and e4sw[2].item() == 0xFE
    assert torch.isnan(e4sw[0:1].view(torch.float8_e4m3fn).float()).all()
    assert torch.isnan(e5[0:1].view(torch.float8_e5m2).float()).all()
    assert torch.isnan(e5sw[0:1].view(torch.float8_e5m2).float()).all()
    assert e5[1].item() == 0x7B and e5sw[1].item() == 0x7B and e5[2].item() == 0xFB and e5sw[2].item() == 0xFB


@pytest.mark.gpu
def test_decoding_every_bit_pattern(probes):
    import torch

    outs = [_poisoned((1 << 16,), torch.float32), _poisoned((1 << 16,), torch.float32)] + [
        _poisoned((256,), torch.float32) for _ in range(3)]
    probes("decode_probe", ["ptr"] * 5, block=(256, 1, 1))((256, 1, 1), _stream(), [t.data_ptr() for t in outs])
    torch.cuda.synchronize()
    fh, fb, f4, f5, f4sw = (t.cpu() for t in outs)
    bits16 = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    bits8 = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    torch.testing.assert_close(fh, bits16.view(torch.float16).float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(fb, bits16.view(torch.bfloat16).float(), rtol=0, atol=0, equal_nan=True)
    ref4 = bits8.view(torch.float8_e4m3fn).float()
    torch.testing.assert_close(f4, ref4, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(f4sw, ref4, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(f5, bits8.view(torch.float8_e5m2).float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
def test_math_and_shuffles(probes):
    import torch

    n = 1024
    gen = torch.Generator().manual_seed(7)
    x = (torch.rand(n, generator=gen) * 40 - 20)
    y = torch.randn(n, generator=gen)
    x[::17] = float("nan")
    y[::13] = float("nan")
    out = _poisoned((9, n), torch.float32)
    xg, yg = x.cuda(), y.cuda()  # held: a freed temporary's memory could be reused before the kernel runs
    probes("math_probe", ["ptr", "ptr", "ptr", "i32"], block=(128, 1, 1))(
        (n // 128, 1, 1), _stream(), [xg.data_ptr(), yg.data_ptr(), out.data_ptr(), n])
    torch.cuda.synchronize()
    o = out.cpu()
    xd, a = x.double(), x.abs().double()
    close = dict(rtol=1e-6, atol=0, equal_nan=True)
    torch.testing.assert_close(o[0].double(), torch.exp(xd).float().double(), **close)
    torch.testing.assert_close(o[1].double(), torch.exp2(xd).float().double(), **close)
    torch.testing.assert_close(o[2].double(), torch.log(a).float().double(), **close)
    torch.testing.assert_close(o[3], torch.sqrt(a).float(), rtol=0, atol=0, equal_nan=True)  # IEEE sqrt.rn
    torch.testing.assert_close(o[4].double(), torch.rsqrt(a).float().double(), **close)
    torch.testing.assert_close(o[5], torch.maximum(x, y), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(o[6], torch.minimum(x, y), rtol=0, atol=0, equal_nan=True)
    warp_sums = y.view(-1, 32).sum(dim=1, keepdim=True).expand(-1, 32).reshape(-1)
    torch.testing.assert_close(o[7], warp_sums, rtol=1e-5, atol=1e-5, equal_nan=True)
    lanes = torch.arange(n) % 128
    assert torch.equal(o[8], (lanes ^ 5).float())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_mma_m16n8k16_with_ldmatrix_and_cp_async(probes, dtype_name, b_layout):
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(11)
    A = torch.randn(16, 16, generator=gen).to(dtype)
    B = torch.randn(16, 8, generator=gen).to(dtype)  # K x N
    C = torch.randn(16, 8, generator=gen)
    B_stored = B.t().contiguous() if b_layout == "nk" else B.contiguous()
    D = _poisoned((16, 8), torch.float32)
    name = f"mma16_{'bf16' if dtype is torch.bfloat16 else 'f16'}_{b_layout}"
    dev = [t.cuda() for t in (A, B_stored, C)]
    probes(name, ["ptr"] * 4)((1, 1, 1), _stream(), [t.data_ptr() for t in dev] + [D.data_ptr()])
    torch.cuda.synchronize()
    ref = C.double() + A.double() @ B.double()
    torch.testing.assert_close(D.cpu().double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_mma_m16n8k8(probes, dtype_name):
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(12)
    A = torch.randn(16, 8, generator=gen).to(dtype)
    B = torch.randn(8, 8, generator=gen).to(dtype)  # K x N
    C = torch.randn(16, 8, generator=gen)
    D, D2 = _poisoned((16, 8), torch.float32), _poisoned((16, 8), torch.float32)
    dev = [t.cuda() for t in (A, B.t().contiguous(), B.contiguous(), C)]
    name = "mma8_bf16" if dtype is torch.bfloat16 else "mma8_f16"
    probes(name, ["ptr"] * 6)((1, 1, 1), _stream(), [t.data_ptr() for t in dev] + [D.data_ptr(), D2.data_ptr()])
    torch.cuda.synchronize()
    ref = C.double() + A.double() @ B.double()
    torch.testing.assert_close(D.cpu().double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(D2.cpu().double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["bindings", "ctypes"])
def test_every_parameter_kind_reaches_the_kernel(probes, impl):
    import struct

    import torch

    out = _poisoned((23,), torch.int64)
    src = torch.zeros(4, device="cuda")
    words = [(0x0123456789ABCDEF * (k + 1)) & 0x7FFFFFFFFFFFFFFF for k in range(16)]
    tmap = struct.pack("<16Q", *words)
    launch = probes("params_probe", ["ptr", "ptr", "i64", "i32", "f32", "tmap", "i32"], block=(64, 1, 1), impl=impl)
    launch((3, 2, 1), _stream(), [out.data_ptr(), src.data_ptr(), -(2**40) - 3, -7, 1.5, tmap, 2**31 - 1])
    torch.cuda.synchronize()
    got = out.cpu().tolist()
    assert got[0] == src.data_ptr()
    assert got[1:4] == [-(2**40) - 3, -7, struct.unpack("<i", struct.pack("<f", 1.5))[0]]
    assert got[4:20] == words
    assert got[20:23] == [2**31 - 1, 321, 64]


@pytest.mark.gpu
def test_launch_on_a_side_stream(probes):
    import torch

    out = _poisoned((23,), torch.int64)
    launch = probes("params_probe", ["ptr", "ptr", "i64", "i32", "f32", "tmap", "i32"])
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        launch((1, 1, 1), side.cuda_stream, [out.data_ptr(), 0, 5, 6, 0.0, bytes(128), 9])
    side.synchronize()
    assert out.cpu().tolist()[1:3] == [5, 6]


@pytest.mark.gpu
def test_launch_from_a_thread_with_no_current_context(probes):
    import threading

    import torch

    out = _poisoned((23,), torch.int64)
    launch = probes("params_probe", ["ptr", "ptr", "i64", "i32", "f32", "tmap", "i32"])
    stream = _stream()
    errors = []

    def worker():  # a fresh thread has no current CUDA context: the launcher must retry in the kernel's own
        try:
            launch((1, 1, 1), stream, [out.data_ptr(), 0, 11, 12, 0.0, bytes(128), 13])
        except Exception as exc:  # noqa: BLE001 - re-raised in the main thread below
            errors.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors, errors
    torch.cuda.synchronize()
    assert out.cpu().tolist()[1:3] == [11, 12]


@pytest.mark.gpu
def test_large_dynamic_shared_memory(probes):
    import torch

    from tilejit.runtime.driver import load_cubin

    launch = probes("big_smem_probe", ["ptr"], block=(256, 1, 1), smem=100 * 1024)
    out = _poisoned((256,), torch.float32)
    launch((1, 1, 1), _stream(), [out.data_ptr()])
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), ((torch.arange(256) + 1) % 256).float())

    arch = Arch.for_capability(*torch.cuda.get_device_capability(0)).name
    cubin = compile_cuda(PRELUDE + KERNELS, name="probes", arch=arch).cubin
    with pytest.raises(LaunchError, match=r"needs 1048576 bytes of shared memory .* at most \d+"):
        load_cubin(cubin, "big_smem_probe", 0, 1024 * 1024)


@pytest.mark.gpu
def test_launch_failure_names_the_error(probes):
    launch = probes("params_probe", ["ptr", "ptr", "i64", "i32", "f32", "tmap", "i32"])
    with pytest.raises(LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        launch((0, 1, 1), _stream(), [0, 0, 0, 0, 0.0, bytes(128), 0])


@pytest.mark.gpu
def test_unknown_kernel_name_is_a_launch_error():
    import torch

    from tilejit.runtime.driver import load_cubin

    arch = Arch.for_capability(*torch.cuda.get_device_capability(0)).name
    cubin = compile_cuda(PRELUDE + KERNELS, name="probes", arch=arch).cubin
    with pytest.raises(LaunchError, match="CUDA_ERROR_NOT_FOUND"):
        load_cubin(cubin, "no_such_kernel", 0)
