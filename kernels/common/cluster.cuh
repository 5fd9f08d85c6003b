// Thread block clusters (sm_90+): a CTA's rank in its cluster, a barrier of the whole cluster,
// and reads of another CTA's shared memory (distributed shared memory). Header-free for NVRTC;
// the includer brings kh_prelude.cuh first and includes this only where the device code targets
// sm_90 or newer (the demo runtime's skinny GEMM sums its splits of K with it). The kernel
// must be launched with a cluster (kh_launch_cfg_t.cluster); without one every CTA is a cluster
// of its own.
#ifndef KH_COMMON_CLUSTER_CUH_
#define KH_COMMON_CLUSTER_CUH_

KH_DEV kh_u32 kh_cluster_rank() {
  kh_u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// How many CTAs this CTA's cluster has.
KH_DEV kh_u32 kh_cluster_size() {
  kh_u32 n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}

// Every CTA of the cluster arrives, then waits for all (release / acquire: shared memory written
// before it is visible to the other CTAs' reads after it). Also what keeps a CTA from exiting
// while another still reads its shared memory.
KH_DEV void kh_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

// The address in CTA `rank`'s shared memory of what sits at `local` in this CTA's.
KH_DEV kh_u32 kh_cluster_map(kh_u32 local, kh_u32 rank) {
  kh_u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

KH_DEV void kh_ld_cluster_f32x4(kh_u32 remote, float (&v)[4]) {
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "r"(remote)
               : "memory");
}

#endif  // KH_COMMON_CLUSTER_CUH_
