// The prelude every generated kernel starts with.
//
// NVRTC ships no CUDA headers (#include <cuda_fp16.h> and even <cstdint> fail with "no directories in search
// list"), so this header is self-contained: fixed-width integer typedefs, storage types for the 16- and 8-bit
// floats with round-to-nearest-even conversions written as inline PTX cvt, and thin wrappers over the PTX
// instructions the sm_80 path emits (cp.async, ldmatrix, mma.sync). The math builtins expf, exp2f, logf, sqrtf,
// rsqrtf, fabsf, fmaxf, fminf and __shfl_xor_sync are compiler builtins in NVRTC 12.9 and 13.0 and need no
// header; so are log2f, sinf, cosf, tanhf, erff, fmaf and their double versions (log2, sin, cos, tanh, erf, fma),
// checked with NVRTC 13.0: they link the accurate libdevice functions (no -use_fast_math), which the tj_ wrappers
// below call. Everything differing by arch is selected with __CUDA_ARCH__, so one prelude serves every target.
#pragma once
// ===== tilejit prelude (self-contained: NVRTC has no CUDA headers) =====
#define TJ_DEVICE __device__ __forceinline__

// ---- fixed-width integers (NVRTC predefines size_t but none of these; LP64 spellings as glibc's) ----
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
static_assert(sizeof(int64_t) == 8 && sizeof(void*) == 8, "tilejit assumes an LP64 device ABI");

// Opaque 128-byte TMA descriptor, as cuda.h declares it; kernels take `const __grid_constant__ CUtensorMap`.
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };

// ---- storage types: raw bits only; arithmetic happens in float ----
struct alignas(2) tj_half { unsigned short bits; };
struct alignas(2) tj_bf16 { unsigned short bits; };
struct tj_fp8e4m3 { unsigned char bits; };   // e4m3fn: bias 7, no inf, 0x7f/0xff = NaN, max 448
struct tj_fp8e5m2 { unsigned char bits; };   // e5m2: bias 15, IEEE-like inf/NaN, max finite 57344

// ---- to float32 (exact for every storage type) ----
/// f16 -> f32 (exact).
TJ_DEVICE float tj_to_f32(tj_half x) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits)); return f; }
/// bf16 -> f32 (exact: bf16 is the upper half of an f32).
TJ_DEVICE float tj_to_f32(tj_bf16 x) { return __uint_as_float(((unsigned)x.bits) << 16); }
/// e5m2 -> f32 (exact: e5m2 is the upper byte of an f16).
TJ_DEVICE float tj_to_f32(tj_fp8e5m2 x) {
  float f; unsigned short h = (unsigned short)(((unsigned)x.bits) << 8);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
/// e4m3fn bits -> f32 by bit manipulation (exact); the sm_80/86 path of tj_to_f32(tj_fp8e4m3).
TJ_DEVICE float tj_e4m3_to_f32_sw(unsigned char bits) {
  unsigned sign = ((unsigned)bits & 0x80u) << 24, e = ((unsigned)bits >> 3) & 0xfu, m = (unsigned)bits & 7u;
  if (e == 15u && m == 7u) return __uint_as_float(0x7fffffffu);
  if (e == 0u) return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));  // m * 2^-9
  return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}
/// e4m3fn -> f32 (exact; hardware cvt on sm_89+).
TJ_DEVICE float tj_to_f32(tj_fp8e4m3 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned h2; unsigned short in = x.bits; float f;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(in));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(h2 & 0xffffu)));
  return f;
#else
  return tj_e4m3_to_f32_sw(x.bits);
#endif
}
/// identity / C conversions for float, integer and bool values.
TJ_DEVICE float tj_to_f32(float x) { return x; }
TJ_DEVICE float tj_to_f32(int8_t x) { return (float)x; }
TJ_DEVICE float tj_to_f32(int32_t x) { return (float)x; }
TJ_DEVICE float tj_to_f32(int64_t x) { return (float)x; }
TJ_DEVICE float tj_to_f32(bool x) { return x ? 1.0f : 0.0f; }

// ---- software f32 -> fp8 (RNE, .satfinite semantics) for targets without the cvt (sm_80/86) ----
/// f32 -> e4m3fn bits, round to nearest even, |x| >= 448 and inf saturate to +-448, NaN -> 0x7f.
TJ_DEVICE unsigned char tj_f32_to_e4m3_sw(float f) {
  unsigned u = __float_as_uint(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return (unsigned char)(sign | 0x7eu);              // >= 448 (incl. inf)
  if (a >= 0x3c800000u) {                                                    // >= 2^-6: normal
    unsigned r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;                    // RNE to 3 mantissa bits
    return (unsigned char)(sign | (r - (120u << 3)));                        // rebias 127 -> 7
  }
  int k; asm("cvt.rni.s32.f32 %0, %1;" : "=r"(k) : "f"(__uint_as_float(a) * 512.0f));  // subnormal: k * 2^-9
  return (unsigned char)(sign | (unsigned)k);                                // k == 8 is the min normal
}
/// f32 -> e5m2 bits, round to nearest even, |x| >= 57344 and inf saturate to +-57344, NaN -> 0x7f.
TJ_DEVICE unsigned char tj_f32_to_e5m2_sw(float f) {
  unsigned u = __float_as_uint(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x47600000u) return (unsigned char)(sign | 0x7bu);              // >= 57344 (incl. inf)
  if (a >= 0x38800000u) {                                                    // >= 2^-14: normal
    unsigned r = (a + 0xfffffu + ((a >> 21) & 1u)) >> 21;                    // RNE to 2 mantissa bits
    return (unsigned char)(sign | (r - (112u << 2)));                        // rebias 127 -> 15
  }
  int k; asm("cvt.rni.s32.f32 %0, %1;" : "=r"(k) : "f"(__uint_as_float(a) * 65536.0f));  // subnormal: k * 2^-16
  return (unsigned char)(sign | (unsigned)k);
}

// ---- from float32 ----
template <class T> struct tj_dependent_false { static constexpr bool value = false; };
/// f32 -> T; floats round to nearest even (fp8 saturating to the max finite value), ints truncate toward zero.
template <class T> TJ_DEVICE T tj_from_f32(float) {
  static_assert(tj_dependent_false<T>::value, "tj_from_f32: no conversion to this type");
  return T();
}
template <> TJ_DEVICE float tj_from_f32<float>(float f) { return f; }
template <> TJ_DEVICE tj_half tj_from_f32<tj_half>(float f) {
  tj_half r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f)); return r;
}
template <> TJ_DEVICE tj_bf16 tj_from_f32<tj_bf16>(float f) {
  tj_bf16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f)); return r;
}
template <> TJ_DEVICE tj_fp8e4m3 tj_from_f32<tj_fp8e4m3>(float f) {
  tj_fp8e4m3 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // First source -> upper byte, second -> lower byte (PTX ISA, cvt).
  unsigned short p; asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(p) : "f"(0.0f), "f"(f));
  r.bits = (unsigned char)(p & 0xffu);
#else
  r.bits = tj_f32_to_e4m3_sw(f);
#endif
  return r;
}
template <> TJ_DEVICE tj_fp8e5m2 tj_from_f32<tj_fp8e5m2>(float f) {
  tj_fp8e5m2 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short p; asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(p) : "f"(0.0f), "f"(f));
  r.bits = (unsigned char)(p & 0xffu);
#else
  r.bits = tj_f32_to_e5m2_sw(f);
#endif
  return r;
}
// Integer results truncate toward zero like a C cast (cvt.rzi; PTX saturates out-of-range and maps NaN to 0).
template <> TJ_DEVICE int32_t tj_from_f32<int32_t>(float f) { int32_t r; asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(f)); return r; }
template <> TJ_DEVICE int64_t tj_from_f32<int64_t>(float f) { int64_t r; asm("cvt.rzi.s64.f32 %0, %1;" : "=l"(r) : "f"(f)); return r; }
template <> TJ_DEVICE int8_t tj_from_f32<int8_t>(float f) { return (int8_t)tj_from_f32<int32_t>(f); }  // wraps like torch
template <> TJ_DEVICE bool tj_from_f32<bool>(float f) { return f != 0.0f; }

/// Two f32 -> packed f16x2 (lo in bits 0-15). cvt.rn.f16x2.f32 puts its FIRST source in the upper half.
TJ_DEVICE unsigned tj_pack_half2(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
/// Two f32 -> packed bf16x2 (lo in bits 0-15); same operand order as tj_pack_half2.
TJ_DEVICE unsigned tj_pack_bf162(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
/// out[0] = tj_from_f32<T>(a), out[1] = tj_from_f32<T>(b) for T half or bf16, by one packed conversion (the same
/// rounding). A register tile's float32 -> 16-bit cast converts its registers so, two at a time: ptxas pairs single
/// conversions alike, but single conversions of wgmma accumulators that feed stores guarded element by element made
/// it serialize the main loop's wgmma (C7514).
template <class T> TJ_DEVICE void tj_from_f32x2(float a, float b, T* out);
template <> TJ_DEVICE void tj_from_f32x2<tj_half>(float a, float b, tj_half* out) {
  const unsigned p = tj_pack_half2(a, b);
  memcpy(out, &p, 4);  // the pair stays one packed register
}
template <> TJ_DEVICE void tj_from_f32x2<tj_bf16>(float a, float b, tj_bf16* out) {
  const unsigned p = tj_pack_bf162(a, b);
  memcpy(out, &p, 4);
}

// ---- math: the accurate device library (no -use_fast_math), plus NaN-propagating max/min like torch ----
/// e^x (expf, max 2 ulp; ex2.approx alone is not accurate enough).
TJ_DEVICE float tj_exp(float x) { return expf(x); }
/// 2^x: the hardware approximation with subnormals flushed (ex2.approx.ftz.f32, PTX ISA 9.7.4.9: max 2 ulp
/// over the normal range; results below 2^-126 are 0). One MUFU.EX2: the non-ftz form adds a compare, a select
/// and two multiplies around it to keep subnormal results, a fifth of an attention loop's instructions.
TJ_DEVICE float tj_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
/// natural log (logf).
TJ_DEVICE float tj_log(float x) { return logf(x); }
/// IEEE-rounded square root (sqrtf; NVRTC defaults to -prec-sqrt=true).
TJ_DEVICE float tj_sqrt(float x) { return sqrtf(x); }
/// 1/sqrt(x) (rsqrtf, 2 ulp).
TJ_DEVICE float tj_rsqrt(float x) { return rsqrtf(x); }
/// |x|.
TJ_DEVICE float tj_abs(float x) { return fabsf(x); }
/// log2 (log2f, 1 ulp).
TJ_DEVICE float tj_log2(float x) { return log2f(x); }
/// sine and cosine (sinf/cosf: full-range argument reduction, 2 ulp; not the __sinf approximation).
TJ_DEVICE float tj_sin(float x) { return sinf(x); }
TJ_DEVICE float tj_cos(float x) { return cosf(x); }
/// tanh (tanhf, 2 ulp; not tanh.approx).
TJ_DEVICE float tj_tanh(float x) { return tanhf(x); }
/// the error function (erff, 2 ulp).
TJ_DEVICE float tj_erf(float x) { return erff(x); }
/// 1 / (1 + e^-x): expf's accuracy; large |x| saturates to 0 or 1 without NaN (1 / inf = 0).
TJ_DEVICE float tj_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
TJ_DEVICE double tj_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
/// max with NaN propagation, like torch.maximum (max.NaN.f32, sm_80+); fmaxf would drop the NaN.
TJ_DEVICE float tj_max(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
/// min with NaN propagation, like torch.minimum (min.NaN.f32, sm_80+).
TJ_DEVICE float tj_min(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }

/// Butterfly exchange with lane ^ lane_mask across the full warp.
TJ_DEVICE float tj_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
TJ_DEVICE int tj_shfl_xor(int v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }

// ---- shared memory and cp.async (PTX 9.7.9.25.3) ----
/// 32-bit shared-window address of a generic pointer into shared memory (cvta.to.shared).
TJ_DEVICE unsigned tj_smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
/// 16-byte global->shared async copy; bytes src_bytes..15 are zero-filled (0 = pure zero fill, no read).
TJ_DEVICE void tj_cp_async_16(unsigned smem_addr, const void* gptr, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem_addr), "l"(gptr), "r"(src_bytes) : "memory");
}
/// Close the current group of cp.async operations (PTX 9.7.9.25.3, cp.async.commit_group).
TJ_DEVICE void tj_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/// Wait until at most N committed groups are still pending (PTX 9.7.9.25.3, cp.async.wait_group).
template <int N> TJ_DEVICE void tj_cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// ---- ldmatrix (PTX 9.7.14.5.15): lanes 8j..8j+7 give the row addresses of matrix j; reg j holds matrix j ----
/// Four 8x8 b16 matrices.
TJ_DEVICE void tj_ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr) : "memory");
}
/// Two 8x8 b16 matrices (addresses from lanes 0-15).
TJ_DEVICE void tj_ldmatrix_x2(unsigned& r0, unsigned& r1, unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(smem_addr) : "memory");
}
/// One 8x8 b16 matrix (addresses from lanes 0-7).
TJ_DEVICE void tj_ldmatrix_x1(unsigned& r0, unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r0) : "r"(smem_addr) : "memory");
}
/// Four 8x8 b16 matrices, each transposed.
TJ_DEVICE void tj_ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem_addr) : "memory");
}
/// Two 8x8 b16 matrices, each transposed.
TJ_DEVICE void tj_ldmatrix_x2_trans(unsigned& r0, unsigned& r1, unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(smem_addr) : "memory");
}
/// One 8x8 b16 matrix, transposed.
TJ_DEVICE void tj_ldmatrix_x1_trans(unsigned& r0, unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r0) : "r"(smem_addr) : "memory");
}

// ---- mma.sync, f32 accumulate in place: d += a @ b (fragments: shared/HARDWARE.md) ----
/// m16n8k16 row.col f16 x f16 + f32 (PTX 9.7.14.5.8).
TJ_DEVICE void tj_mma_m16n8k16_f16(float& d0, float& d1, float& d2, float& d3,
                                   unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/// m16n8k16 row.col bf16 x bf16 + f32 (PTX 9.7.14.5.8).
TJ_DEVICE void tj_mma_m16n8k16_bf16(float& d0, float& d1, float& d2, float& d3,
                                    unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/// m16n8k8 row.col f16 x f16 + f32 (PTX 9.7.14.5.7).
TJ_DEVICE void tj_mma_m16n8k8_f16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned b0) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(b0));
}
/// m16n8k8 row.col bf16 x bf16 + f32 (PTX 9.7.14.5.7).
TJ_DEVICE void tj_mma_m16n8k8_bf16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned b0) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(b0));
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
/// m16n8k32 row.col e4m3 x e4m3 + f32, sm_89+ (PTX ISA, mma.m16n8k32 fragments); each b32 register holds 4 fp8 along K.
TJ_DEVICE void tj_mma_m16n8k32_e4m3(float& d0, float& d1, float& d2, float& d3,
                                    unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/// m16n8k32 row.col e5m2 x e5m2 + f32, sm_89+ (PTX ISA, mma.m16n8k32 fragments).
TJ_DEVICE void tj_mma_m16n8k32_e5m2(float& d0, float& d1, float& d2, float& d3,
                                    unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif
// ===== end of tilejit prelude =====
