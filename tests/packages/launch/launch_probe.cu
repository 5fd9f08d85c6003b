// Device code of the launch-probe test package: kernels that show what the loader's launch
// did (cluster shape, PDL ordering, dynamic shared memory), checked by tests/gpu. Header-free
// once pdl.cuh is inlined (the build does it), so the loader can compile it with NVRTC.
#include "pdl.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned probe_sreg_cluster_ctarank() {
  unsigned v;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(v));
  return v;
}
__device__ __forceinline__ unsigned probe_sreg_cluster_nctarank() {
  unsigned v;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(v));
  return v;
}
__device__ __forceinline__ void probe_cluster_nctaid(unsigned* x, unsigned* y, unsigned* z) {
  asm volatile("mov.u32 %0, %%cluster_nctaid.x;" : "=r"(*x));
  asm volatile("mov.u32 %0, %%cluster_nctaid.y;" : "=r"(*y));
  asm volatile("mov.u32 %0, %%cluster_nctaid.z;" : "=r"(*z));
}
__device__ __forceinline__ void probe_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}
// Reads the u32 at `local` (this block's shared memory) in the shared memory of block `rank` of
// the cluster (distributed shared memory: only a real cluster maps its peers).
__device__ __forceinline__ unsigned probe_read_peer(const unsigned* local, unsigned rank) {
  unsigned addr, remote, v;
  asm volatile("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }"
               : "=r"(addr)
               : "l"(local));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
  return v;
}
#endif

// One row of 6 words per block (linear block id b = x + y * gx + z * gx * gy): cluster_ctarank,
// cluster_nctarank, cluster_nctaid.x/.y/.z, and the linear block id the next rank of the cluster
// ((rank + 1) % nctarank) stored in its shared memory. Below sm_90 every word is 0xFFFFFFFF.
extern "C" __global__ void probe_cluster_info(unsigned* out) {
  const unsigned b = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
  unsigned* row = out + 6ull * b;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ unsigned mine;
  if (threadIdx.x == 0) mine = b;
  probe_cluster_sync();  // every block of the cluster has stored its id
  if (threadIdx.x == 0) {
    const unsigned rank = probe_sreg_cluster_ctarank();
    const unsigned n = probe_sreg_cluster_nctarank();
    unsigned x, y, z;
    probe_cluster_nctaid(&x, &y, &z);
    row[0] = rank;
    row[1] = n;
    row[2] = x;
    row[3] = y;
    row[4] = z;
    row[5] = probe_read_peer(&mine, (rank + 1) % n);
  }
  probe_cluster_sync();  // no block leaves while a peer may still read its shared memory
#else
  if (threadIdx.x < 6) row[threadIdx.x] = 0xFFFFFFFFu;
#endif
}

// The first kernel of a PDL pair: lets the next kernel start at once, then spins for `spin`
// clock cycles before it writes buf[i] = 2i + 1, so a dependent that did not wait reads the
// poison the test put there.
extern "C" __global__ void probe_pdl_produce(unsigned* buf, unsigned n, long long spin) {
  kh_pdl_launch_dependents();
  const long long start = clock64();
  while (clock64() - start < spin) {
  }
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = 2u * i + 1u;
}

// The second kernel: out[i] = buf[i] + 1, after kh_pdl_wait() when `wait` is set (a test with
// wait = 0 shows whether the launch overlapped at all).
extern "C" __global__ void probe_pdl_consume(const unsigned* buf, unsigned* out, unsigned n,
                                             int wait) {
  if (wait) kh_pdl_wait();
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = buf[i] + 1u;
}

// Fills `bytes` of dynamic shared memory (a multiple of 4) with a pattern, then each block's
// thread 0 sums it (wrapping) into out[blockIdx.x]: a launch without the memory faults or sums
// wrong.
extern "C" __global__ void probe_big_smem(unsigned* out, unsigned bytes) {
  extern __shared__ unsigned smem[];
  const unsigned words = bytes / 4;
  for (unsigned i = threadIdx.x; i < words; i += blockDim.x) smem[i] = i * 2654435761u + blockIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned s = 0;
    for (unsigned i = 0; i < words; ++i) s += smem[i];
    out[blockIdx.x] = s;
  }
}
