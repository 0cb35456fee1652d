// TMA tile reductions (shared -> global, each element added in place) and the wait for their completion: a relaxed
// tile atomic_add of a wgmma accumulator (lower_tma.emit_store with the reduce instruction).
#pragma once
#include "tilejit/prelude.cuh"
#include "tilejit/tma_store.cuh"
/// Add a shared tile into the tensor's box, element by element, by the tensor memory accelerator, tracked by bulk
/// async-groups (PTX 9.7.9.25.5.3): the element type is the tensor map's; each element's add is a relaxed atomic
/// at gpu scope; the parts of the box outside the tensor are not touched.
TJ_DEVICE void tj_tma_reduce_add_2d(const CUtensorMap* map, int c0, int c1, unsigned src) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
TJ_DEVICE void tj_tma_reduce_add_3d(const CUtensorMap* map, int c0, int c1, int c2, unsigned src) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src) : "memory");
}
TJ_DEVICE void tj_tma_reduce_add_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3, unsigned src) {
  asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];"
               :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src) : "memory");
}
TJ_DEVICE void tj_tma_reduce_add_5d(const CUtensorMap* map, int c0, int c1, int c2, int c3, int c4, unsigned src) {
  asm volatile("cp.reduce.async.bulk.tensor.5d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4, %5}], "
               "[%6];" :: "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(src) : "memory");
}
/// Wait until every committed bulk group is complete: its reads of shared memory, and its writes to global
/// memory done and visible to this thread (PTX 9.7.9.25.6.2, without .read).
TJ_DEVICE void tj_bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
