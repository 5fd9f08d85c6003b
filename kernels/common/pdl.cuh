// pdl.cuh: programmatic dependent launch (PDL) in device code, for kernels launched with
// KH_LAUNCH_PDL (kernel_hub_abi.h: kh_launch_cfg_t.flags).
//
// With PDL a kernel may start while the kernel before it on the stream is still running, so that
// its prologue (index math, loads of weights or of anything the previous kernel does not write)
// overlaps the previous kernel's tail. The contract:
//   - kh_pdl_wait() before the first read of memory the previous kernel writes (and before any
//     write the previous kernel might read): it returns once every grid this one depends on has
//     completed and its memory operations are visible.
//   - kh_pdl_launch_dependents() (optional) where the rest of this kernel no longer keeps the
//     next kernel from starting its prologue; without it the next kernel starts when this one
//     ends, as without PDL. It does not make this kernel's writes visible early: the next
//     kernel's kh_pdl_wait() still waits for this whole grid.
// Both compile to nothing below sm_90, where the loader launches in plain stream order (always
// correct: the previous kernel has finished before this one starts). Header-free (NVRTC):
// kernels/common is inlined into a package's shipped .cu by KernelHubExpandIncludes.cmake.
#ifndef KH_PDL_CUH_
#define KH_PDL_CUH_

// Waits for the grids this one depends on (griddepcontrol.wait). A no-op when the kernel was
// launched without PDL or below sm_90.
__device__ __forceinline__ void kh_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next PDL kernel on the stream start (griddepcontrol.launch_dependents). Each block
// signals for itself; the dependent grid starts once every block signalled or exited.
__device__ __forceinline__ void kh_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The first statement of a kernel its package launches with KH_LAUNCH_PDL and that needs no
// prologue of its own: waits for the previous grid (so everything after it reads and writes as in
// plain stream order), then lets the next PDL kernel launch at once, so that its blocks are
// resident and waiting in their own kh_pdl_enter() when this grid ends, instead of being launched
// only then (the gap between two small kernels of a decode step).
__device__ __forceinline__ void kh_pdl_enter() {
  kh_pdl_wait();
  kh_pdl_launch_dependents();
}

#endif  // KH_PDL_CUH_
