// TMA tile loads multicast into every program of a thread-block cluster (lower_tma.tma_issue, cluster=2).
#pragma once
#include "tilejit/prelude.cuh"
/// The same copies, written at the same offsets (tile and mbarrier) into the shared memory of every program of the
/// cluster in MASK (PTX 9.7.9.25.5.2, .multicast::cluster).
TJ_DEVICE void tj_tma_load_2d_mc(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
TJ_DEVICE void tj_tma_load_3d_mc(unsigned dst, const CUtensorMap* map, int c0, int c1, int c2, unsigned bar, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask) : "memory");
}
TJ_DEVICE void tj_tma_load_4d_mc(unsigned dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, unsigned bar, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4, %5}], [%6], %7;"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(mask) : "memory");
}
TJ_DEVICE void tj_tma_load_5d_mc(unsigned dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, int c4, unsigned bar, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar), "h"(mask) : "memory");
}
