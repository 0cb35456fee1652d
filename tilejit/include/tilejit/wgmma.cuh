// sm_90a warpgroup MMA: the shared-memory matrix descriptor, fence and commit (lower_wgmma).
#pragma once
#include "tilejit/prelude.cuh"
/// wgmma shared-memory matrix descriptor (PTX 9.7.15.5.1.2.2); LAYOUT is the swizzle mode in bits 62-63:
/// 1 = 128-byte, 2 = 64-byte, 3 = 32-byte.
TJ_DEVICE uint64_t tj_wgmma_desc(unsigned smem_addr, unsigned lbo, unsigned sbo, unsigned layout = 1) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16)
       | ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | ((uint64_t)layout << 62);
}
TJ_DEVICE void tj_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
TJ_DEVICE void tj_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
