// Cluster pairs of a TMA multicast ring: cluster rank and size, cluster-wide barriers, the peer CTA's mbarrier (lower_specialized).
#pragma once
#include "tilejit/prelude.cuh"
#include "tilejit/tma.cuh"
/// A cluster's programs (1 when launched without clusters) and this one's rank in it (PTX 10.14, special registers).
TJ_DEVICE unsigned tj_cluster_ctas() { unsigned n; asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n)); return n; }
TJ_DEVICE unsigned tj_cluster_rank() { unsigned r; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
/// Every non-exited thread of the cluster gets here (PTX 9.7.13.4, barrier.cluster).
TJ_DEVICE void tj_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
/// ... with the mbarrier initializations before it visible to the cluster (PTX 9.7.13.14, fence.mbarrier_init).
TJ_DEVICE void tj_cluster_sync_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  tj_cluster_sync();
}
/// Arrive on a ring slot's "empty" mbarrier, here and at the same offset in the cluster's other program, whose
/// producer multicasts into this program's slot as well (PTX 9.7.9.18 mapa, 9.7.13.15.13 mbarrier.arrive). The
/// default semantics (release at CTA scope): the slot's readers are wgmma groups already waited for. With
/// .release.cluster here the GEMM ran at half its speed on an H100.
TJ_DEVICE void tj_mbar_arrive_pair(unsigned bar, unsigned ncta, unsigned rank) {
  tj_mbar_arrive(bar);
  if (ncta > 1) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank ^ 1u));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  }
}
