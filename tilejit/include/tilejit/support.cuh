// Helpers of the generated code itself, included by every kernel after the prelude: 16- and 8-byte vector
// types, Python's floor division and modulo, predicated cp.async, the generic-to-async proxy fence, integer
// min/max.
#pragma once
#include "tilejit/prelude.cuh"
// ===== tilejit generated-code support =====
struct alignas(16) tj_v16 { unsigned x, y, z, w; };
struct alignas(8) tj_v8 { unsigned x, y; };
/// Python floor division and modulo (the language's // and %).
template <class T> TJ_DEVICE T tj_floordiv(T a, T b) { T q = a / b; T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q; }
template <class T> TJ_DEVICE T tj_pymod(T a, T b) { T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
/// cp.async of 16 bytes (src_bytes of them read, the rest zero-filled) issued only when pred holds;
/// a PTX predicate, so the copy stays branch-free and schedulable next to the tensor-core work.
TJ_DEVICE void tj_cp_async_16_if(unsigned smem_addr, const void* gptr, int src_bytes, bool pred) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %3, 0; @p cp.async.cg.shared.global [%0], [%1], 16, %2; }"
               :: "r"(smem_addr), "l"(gptr), "r"(src_bytes), "r"((int)pred) : "memory");
}
/// 16-byte cp.async issued when pred holds, copying zeros instead of reading when zero holds (the
/// ignore-src operand; PTX 9.7.9.25.3): no src-size arithmetic on the address path.
TJ_DEVICE void tj_cp_async_16_zfill_if(unsigned smem_addr, const void* gptr, bool zero, bool pred) {
  asm volatile("{ .reg .pred p, z; setp.ne.b32 p, %2, 0; setp.ne.b32 z, %3, 0; @p cp.async.cg.shared.global [%0], [%1], 16, z; }"
               :: "r"(smem_addr), "l"(gptr), "r"((int)pred), "r"((int)zero) : "memory");
}
/// Make this thread's generic-proxy writes to shared memory (st.shared, cp.async) visible to the async
/// proxy (wgmma) before a barrier; nothing to do before sm_90.
TJ_DEVICE void tj_fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
template <class T> TJ_DEVICE T tj_imax(T a, T b) { return a > b ? a : b; }
template <class T> TJ_DEVICE T tj_imin(T a, T b) { return a < b ? a : b; }
