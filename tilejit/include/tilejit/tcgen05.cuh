// sm_100a / sm_103a fifth-generation tensor cores: the UMMA shared-memory descriptor, tensor-memory allocation,
// fences, commit and waits (lower_tcgen05). Its kernels also include tma.cuh (the completion mbarrier).
#pragma once
#include "tilejit/prelude.cuh"
/// sm_100 shared-memory matrix descriptor, 128-byte swizzle: the sm_90 fields, version 1 in bits 46-48,
/// swizzle mode 2 (128B) in bits 61-63 (lower_tcgen05.smem_desc).
TJ_DEVICE uint64_t tj_umma_desc(unsigned smem_addr, unsigned lbo, unsigned sbo) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16)
       | ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | 0x4000400000000000ull;
}
/// Allocate NCOLS tensor-memory columns (a power of 2, 32..512); the address lands in shared memory at DST.
TJ_DEVICE void tj_tmem_alloc(unsigned dst, unsigned ncols) {
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" :: "r"(dst), "r"(ncols) : "memory");
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
}
TJ_DEVICE void tj_tmem_dealloc(unsigned taddr, unsigned ncols) {
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" :: "r"(taddr), "r"(ncols) : "memory");
}
TJ_DEVICE void tj_tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory"); }
TJ_DEVICE void tj_tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory"); }
/// Arrive once on BAR when every tcgen05 operation this thread issued so far has completed.
TJ_DEVICE void tj_tc_commit(unsigned bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" :: "r"(bar) : "memory");
}
TJ_DEVICE void tj_tc_wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"); }
TJ_DEVICE void tj_tc_wait_st() { asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory"); }
/// All threads: every warp's TMEM accesses before this point are ordered before every warp's after it.
TJ_DEVICE void tj_tc_sync() { tj_tc_fence_before(); __syncthreads(); tj_tc_fence_after(); }
