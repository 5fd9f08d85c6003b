// Hopper (sm_90a) synchronization and copy building blocks of the attention kernels: mbarriers,
// TMA tensor loads, named barriers between warpgroups and register budgets (setmaxnreg).
// Header-free for NVRTC; compiled only where the device code targets sm_90a. The wgmma pieces
// they pair with are kernels/common/wgmma.cuh (shared with the demo runtime's skinny GEMM).
#ifndef KH_ATTENTION_SM90_SYNC_CUH_
#define KH_ATTENTION_SM90_SYNC_CUH_

#include "attention_params.h"

// mbarriers (shared memory, 8 bytes each) and named barriers between warpgroups.
KH_DEV void kh_mbar_init(kh_u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
KH_DEV void kh_mbar_arrive(kh_u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase with parity `parity` has completed.
KH_DEV void kh_mbar_wait(kh_u32 bar, int parity) {
  kh_u32 done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}
// mbarrier arrival that also expects `bytes` more from asynchronous copies (TMA) this phase.
KH_DEV void kh_mbar_arrive_tx(kh_u32 bar, kh_u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Expects `bytes` more from asynchronous copies this phase, without arriving.
KH_DEV void kh_mbar_expect_tx(kh_u32 bar, kh_u32 bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Makes mbarrier initialization visible to the async proxy (TMA completes transactions on it).
KH_DEV void kh_fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// TMA: the box at coordinates {c0, c1, c2, c3} of the 4-d tensor `map` (a __grid_constant__
// kernel parameter) into shared memory at `dst`, completing `bytes` on mbarrier `bar`.
KH_DEV void kh_tma_load4(kh_u32 dst, const kh_tma_desc* map, int c0, int c1, int c2, int c3,
                         kh_u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
KH_DEV void kh_tma_prefetch_desc(const kh_tma_desc* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
KH_DEV void kh_named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
KH_DEV void kh_named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Bulk reduction shared -> global by the tensor copy engine: adds `bytes` (a multiple of 16) of
// fp32 at `smem` into global memory at `gmem` (both 16-byte aligned), element by element and
// atomically with respect to other reductions; completes through the issuing thread's bulk
// groups. kh_bulk_wait_read: its groups but the N newest have read their shared memory (which
// may then be overwritten); kh_bulk_wait: have completed.
KH_DEV void kh_bulk_reduce_add_f32(float* gmem, kh_u32 smem, kh_u32 bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
      "r"(smem), "r"(bytes)
      : "memory");
}
KH_DEV void kh_bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
KH_DEV void kh_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
KH_DEV void kh_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Moves this warpgroup's register budget (setmaxnreg; needs a register cap at entry).
template <int N>
KH_DEV void kh_regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
KH_DEV void kh_regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

#endif  // KH_ATTENTION_SM90_SYNC_CUH_
