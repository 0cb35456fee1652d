// TMA tile stores (shared -> global) and their bulk async-group waits: the TMA store epilogue (lower_tma).
#pragma once
#include "tilejit/prelude.cuh"
/// Tile copy shared -> global by the tensor memory accelerator, tracked by bulk async-groups (PTX 9.7.9.25.5.2);
/// the parts of the box outside the tensor are not written.
TJ_DEVICE void tj_tma_store_2d(const CUtensorMap* map, int c0, int c1, unsigned src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
TJ_DEVICE void tj_tma_store_3d(const CUtensorMap* map, int c0, int c1, int c2, unsigned src) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src) : "memory");
}
TJ_DEVICE void tj_tma_store_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3, unsigned src) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src) : "memory");
}
TJ_DEVICE void tj_tma_store_5d(const CUtensorMap* map, int c0, int c1, int c2, int c3, int c4, unsigned src) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(src) : "memory");
}
/// Close the bulk async-group of the stores issued so far (PTX 9.7.9.25.6.1).
TJ_DEVICE void tj_bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/// Wait until every committed bulk store has finished reading shared memory (PTX 9.7.9.25.6.2).
TJ_DEVICE void tj_bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
/// ... every one but the most recent group.
TJ_DEVICE void tj_bulk_wait_read1() { asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory"); }
