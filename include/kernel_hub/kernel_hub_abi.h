/* kernel_hub_abi.h: the C ABI between the kernel-hub loader and a package's host library.
 *
 * A package host library exports exactly one symbol:
 *
 *     const kh_module_v1_t* kh_module_v1(const kh_host_v1_t* host);
 *
 * (define it with KH_MODULE_ENTRY below). The loader calls it once after dlopen; it returns a
 * static table describing the package: its layers and its ops. Rules for package authors:
 *
 *  - Versioning. Every versioned struct starts with kh_header_t {struct_size, abi_major,
 *    abi_minor}. A minor version only appends fields at the end, so a reader accepts a larger
 *    struct_size and a higher abi_minor and reads the prefix it knows. A different abi_major is
 *    rejected before anything past the header is read. Arrays (layers, ops) are walked with a
 *    stride equal to their first element's struct_size; every element of one array has the same
 *    struct_size.
 *    KH_ABI_MINOR is bumped when a field is appended to a struct or a status, flag or argument
 *    kind is added; KH_ABI_MAJOR when anything else changes (a field moved, removed or retyped, a
 *    meaning changed). A loader accepts every package of its own abi_major, whatever its
 *    abi_minor, and refuses a package of another major at load. The package ABI is versioned
 *    apart from libkernel_hub.so (kernel_hub.h, "Versions"): a new library keeps loading old
 *    packages as long as KH_ABI_MAJOR stays, and a SONAME bump says nothing about packages.
 *  - The entry point is idempotent and thread-safe, does no GPU work (bind may run before any
 *    CUDA context exists) and lets no C++ exception escape. It checks host->h.abi_major (and
 *    host->h.struct_size for fields it needs) and returns NULL after host->set_error() when the
 *    host is too old.
 *  - Host libraries do not link the CUDA runtime (libcudart) or any library outside the
 *    loader's allowlist (libc, libm, libdl, libpthread, librt, libstdc++, libgcc_s, the dynamic
 *    linker). Device code is owned by the loader: an op asks host->get_function() for a kernel
 *    by its extern "C" name (the loader loads the packaged cubin or JIT-compiles the package's
 *    .cu source for the device's exact sm) and starts it with host->launch() on the stream it was
 *    given.
 *  - Build flags: -fvisibility=hidden, -Wl,--version-script exporting only kh_module_v1,
 *    -fno-gnu-unique, and either no libstdc++ use or -static-libstdc++ -static-libgcc.
 *  - Ops take non-owning DLPack tensors (inputs and preallocated outputs), scalars and a stream,
 *    launch only on that stream, never synchronize, never allocate device memory and never
 *    keep pointers to their arguments. They return KH_OK or another status after calling
 *    host->set_error() with a message saying what failed and on which input.
 *
 * DLPack: <dlpack/dlpack.h>; only DLTensor, DLDevice and DLDataType are used, whose layout has
 * been stable since DLPack 0.6.
 */
#ifndef KERNEL_HUB_ABI_H_
#define KERNEL_HUB_ABI_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KH_ABI_MAJOR 1
#define KH_ABI_MINOR 4

/* Status codes returned by ops and host services. */
#define KH_OK 0
#define KH_ERR_INVALID_ARGUMENT 1 /* wrong argument count, kind, shape or stride */
#define KH_ERR_UNSUPPORTED 2      /* dtype, device or layout this op does not handle */
#define KH_ERR_NO_DEVICE 3        /* no GPU, no driver, or no device code backend */
#define KH_ERR_NOT_FOUND 4        /* get_function: no kernel of that name in the package */
#define KH_ERR_LAUNCH 5           /* the driver refused a launch */
#define KH_ERR_ABI 6              /* incompatible ABI version */
#define KH_ERR_INTERNAL 7         /* anything else; the message says what */
/* Embedding APIs only (kernel_hub.h); each is one kind of kh::Error (kernel_hub_base.hpp). */
#define KH_ERR_REFUSED 8    /* a safety rule refused: preflight, trust, strict, graph capture */
#define KH_ERR_NETWORK 9    /* the hub could not be reached, or kept failing after retries */
#define KH_ERR_AUTH 10      /* the hub refused the credentials (401/403) */
#define KH_ERR_INTEGRITY 11 /* digest, size or lock mismatch: a tampered or damaged hub or cache */
#define KH_ERR_OFFLINE 12   /* offline mode, and the cache cannot answer */
#define KH_ERR_IO 13        /* a local file system failure */

/* Log levels for kh_host_v1_t.log. */
#define KH_LOG_DEBUG 0
#define KH_LOG_INFO 1
#define KH_LOG_WARN 2
#define KH_LOG_ERROR 3

/* First member of every versioned struct. Never changes. */
typedef struct kh_header_t {
  uint32_t struct_size; /* sizeof the struct as the writer compiled it */
  uint16_t abi_major;   /* KH_ABI_MAJOR of the writer */
  uint16_t abi_minor;   /* KH_ABI_MINOR of the writer */
} kh_header_t;

#define KH_HEADER_INIT(type) \
  { (uint32_t)sizeof(type), (uint16_t)KH_ABI_MAJOR, (uint16_t)KH_ABI_MINOR }

/* Launch flags of kh_launch_cfg_t.flags (ABI 1.1). */
/* Programmatic dependent launch: the kernel may start while the previous kernel on the stream is
 * still running (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION). The kernel must call
 * griddepcontrol.wait (kh_pdl_wait, kernels/common/pdl.cuh) before it reads what the previous
 * kernel writes. On devices below sm_90 the loader launches in plain stream order, which is
 * always correct (the wait is a no-op there). */
#define KH_LAUNCH_PDL 0x1u
#define KH_LAUNCH_FLAGS_KNOWN 0x1u

/* Launch geometry for kh_host_v1_t.launch. Zero-initialize it, then set the fields: fields are
 * appended in minor versions, and a field a writer does not set must read as 0. */
typedef struct kh_launch_cfg_t {
  kh_header_t h;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_mem_bytes; /* dynamic shared memory; above 48 KiB the loader opts in */
  int32_t device_id;         /* the CUDA device ordinal the kernel was looked up for */
  /* ABI 1.1. A loader of ABI 1.0 ignores these fields: a package that needs them checks
   * host->h.abi_minor >= 1 first. The loader reads them only when h.struct_size covers them. */
  uint32_t cluster[3]; /* thread block cluster dims (sm_90+); {0,0,0} or {1,1,1}: no cluster.
                          Each divides grid; their product is at most 16 (above 8 the loader
                          allows the non-portable size, which the kernel's resources must fit) */
  uint32_t flags;      /* KH_LAUNCH_*; an unknown bit is refused (KH_ERR_INVALID_ARGUMENT) */
} kh_launch_cfg_t;

/* struct_size of an ABI 1.0 kh_launch_cfg_t (through device_id): the smallest the loader takes. */
#define KH_LAUNCH_CFG_V1_0_SIZE 40u

/* ---- The GEMM service (ABI 1.2): kh_host_v1_t.gemm, and kh_gemm() for embedders ----
 *
 * One request, ROW-MAJOR, fp32 accumulation always:
 *
 *     D[m,n] = alpha * op(A)[m,k] @ op(B)[k,n]                 (flags without KH_GEMM_ACCUMULATE)
 *     D[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * D[m,n]  (with KH_GEMM_ACCUMULATE)
 *
 * for each of `batch` problems (0 reads as 1), problem i reading A + i*stride_a, B + i*stride_b and
 * writing D + i*stride_d (strides and leading dimensions in elements, not bytes).
 *
 *   op(A) = A        stored row-major [m,k], element (r,c) at a[r*lda + c], lda >= k
 *   op(A) = A^T      (KH_GEMM_TRANS_A) stored row-major [k,m], (r,c) at a[c*lda + r], lda >= m
 *   op(B) = B        stored row-major [k,n], (r,c) at b[r*ldb + c], ldb >= n
 *   op(B) = B^T      (KH_GEMM_TRANS_B) stored row-major [n,k], (r,c) at b[c*ldb + r], ldb >= k
 *   D                row-major [m,n], (r,c) at d[r*ldd + c], ldd >= n
 *
 * Without KH_GEMM_ACCUMULATE, D is only written (its old contents, NaN included, are never
 * read) and beta must be 0. With it, beta = 1 gives D += alpha * op(A) @ op(B).
 * dtype_ab (A and B) is one KH_DTYPE_BF16, KH_DTYPE_FP16 or KH_DTYPE_FP32 code; dtype_d is
 * dtype_ab or KH_DTYPE_FP32 (bf16 products written as fp32, say). Products accumulate in fp32,
 * and fp32 inputs are never rounded to TF32.
 * m == 0 or n == 0 is an empty product (nothing is read or written); k >= 1, and m*k, k*n and
 * m*n elements (and batch*stride) must fit in int64. With batch > 1, stride_d >= m*ldd (problems
 * never write over each other); stride_a or stride_b 0 reuses one matrix for every problem.
 *
 * device_id >= 0: a, b and d are device pointers on that CUDA device, and the products run on
 * `stream` (a CUstream; NULL = the legacy default stream) through cuBLASLt, which the loader
 * loads on first use (libcublasLt.so.13, then .so.12); without it the call fails with
 * KH_ERR_NO_DEVICE and a message naming what to install. a, b and d must be aligned to their
 * element size (refused otherwise); 16 bytes allows the fastest algorithms, less still works.
 * The first call per device and shape may allocate (cuBLASLt handle and workspace) and, with
 * batch 1 on a stream that is not capturing, times up to KERNEL_HUB_GEMM_AUTOTUNE (default 8)
 * of cuBLASLt's candidate algorithms on `stream` (into scratch memory, freed after) and waits for
 * them: make it before a CUDA graph capture and outside timed code. Every other call never
 * synchronizes.
 * device_id < 0: host pointers, computed on the calling thread (stream is ignored), so cpu
 * variants call the same service.
 * Zero-initialize the struct, then set h (KH_HEADER_INIT(kh_gemm_t)) and the fields: fields may
 * be appended in later minors, and one a writer does not set must read as 0. */
#define KH_GEMM_TRANS_A 0x1u
#define KH_GEMM_TRANS_B 0x2u
#define KH_GEMM_ACCUMULATE 0x4u
#define KH_GEMM_FLAGS_KNOWN 0x7u

typedef struct kh_gemm_t {
  kh_header_t h;
  int32_t device_id; /* CUDA ordinal, or < 0: host pointers, computed on the cpu */
  uint32_t flags;    /* KH_GEMM_*; an unknown bit is refused (KH_ERR_INVALID_ARGUMENT) */
  int64_t m, n, k;
  uint32_t dtype_ab; /* KH_DTYPE_BF16, KH_DTYPE_FP16 or KH_DTYPE_FP32 (one bit) */
  uint32_t dtype_d;  /* dtype_ab or KH_DTYPE_FP32 */
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* d;
  int64_t ldd;
  float alpha, beta;
  int64_t batch; /* number of problems; 0 reads as 1 */
  int64_t stride_a, stride_b, stride_d;
} kh_gemm_t;

/* ---- The tensor-map service (ABI 1.3): kh_host_v1_t.tensor_map ----
 *
 * Packages link no CUDA library, so their host code cannot call the driver's
 * cuTensorMapEncodeTiled to build the TMA descriptors (CUtensorMap) that sm_90+ kernels take as
 * __grid_constant__ parameters. The loader encodes one for them: a tiled view of a row-major
 * tensor of `rank` dimensions, dims[0] the contiguous one, copied box by box into shared memory.
 * The map is fixed to the common case: element strides 1, no interleave, out-of-bounds elements
 * read as zero, L2 promotion 256 B; swizzle_bytes picks the shared memory swizzle (128 B for
 * wgmma operands).
 *
 * Rules (the driver's, checked before it is called, each refusal KH_ERR_INVALID_ARGUMENT with a
 * message naming the field): h from KH_HEADER_INIT(kh_tensor_map_t); device_id >= 0; one dtype
 * bit; rank 1..5; swizzle_bytes 0, 32, 64 or 128; base non-NULL and 16-byte aligned; dims[i] in
 * 1..2^32; strides[i] (1 <= i < rank) multiples of 16 and below 2^40; box[i] in 1..256 with
 * box[0] * element size a multiple of 16 and, with a swizzle, at most swizzle_bytes. Entries at
 * and past `rank` are ignored; another ABI major is KH_ERR_ABI. The caller needs no current
 * context. The loader cannot check that base points at memory of that size: it must hold dims
 * with those strides (TMA copies are bounded by dims, not by the allocation).
 * Zero-initialize the struct, then set h and the fields: fields may be appended in later minors,
 * and one a writer does not set must read as 0. */
#define KH_TENSOR_MAP_BYTES 128u
typedef struct kh_tensor_map_t {
  kh_header_t h;
  int32_t device_id;      /* CUDA ordinal the map will be used on (>= 0) */
  uint32_t dtype;         /* KH_DTYPE_BF16, KH_DTYPE_FP16 or KH_DTYPE_FP32 (one bit) */
  uint32_t rank;          /* 1..5 */
  uint32_t swizzle_bytes; /* 0 (none), 32, 64 or 128 */
  const void* base;       /* device address of element (0, ..., 0), 16-byte aligned */
  uint64_t dims[5];       /* elements along each dimension; dims[0] is the contiguous one */
  uint64_t strides[5];    /* bytes between consecutive indices of dimension i, for i >= 1
                             (multiples of 16, below 2^40); strides[0] is ignored */
  uint32_t box[5];        /* elements of one copy along each dimension, 1..256 each; with a
                             swizzle, box[0] * element size <= swizzle_bytes */
} kh_tensor_map_t;

/* ---- The device-info service (ABI 1.4): kh_host_v1_t.device_info ----
 *
 * What a package's host code plans launches by on a CUDA device (packages link no CUDA library,
 * so they cannot ask the driver): how many multiprocessors there are and what one holds, so that
 * a grid can fill whole waves or match the CTAs resident at once on the GPU it runs on.
 * Zero-initialize the struct and set h (KH_HEADER_INIT(kh_device_info_t)); the loader writes the
 * fields it knows, up to h.struct_size (fields of a later minor stay as the caller left them),
 * and leaves h alone. The loader queries each device once per process; the call needs no stream
 * and launches nothing, so it may run while a CUDA graph is captured. */
typedef struct kh_device_info_t {
  kh_header_t h;
  int32_t sm_major, sm_minor;               /* compute capability, e.g. 9 and 0 */
  int32_t multiprocessors;                  /* SMs */
  int32_t max_threads_per_multiprocessor;   /* resident threads an SM holds */
  int32_t registers_per_multiprocessor;     /* 32-bit registers an SM holds */
  int32_t reserved0;                        /* 0 */
  int64_t shared_memory_per_multiprocessor; /* bytes an SM holds, all its blocks together */
  int64_t shared_memory_per_block_optin;    /* bytes one block may opt in to */
  int64_t shared_memory_reserved_per_block; /* bytes the driver keeps per resident block */
  int64_t total_memory;                     /* bytes of device memory */
} kh_device_info_t;

/* Services the loader gives a package (host -> package). One table per loaded package; `ctx`
 * identifies the package to the loader and is passed back as the first argument of every
 * service. The table lives for the rest of the process. */
typedef struct kh_host_v1_t {
  kh_header_t h;
  void* ctx;
  /* Writes a log line (level KH_LOG_*). */
  void (*log)(void* ctx, int32_t level, const char* msg);
  /* Records the error message of the failing call on this thread; the op then returns a status
   * other than KH_OK. */
  void (*set_error)(void* ctx, const char* msg);
  /* Looks up the package's device kernel `kernel_name` (an extern "C" __global__ name) for CUDA
   * device `device_id`. On success *fn is an opaque handle valid for the rest of the process.
   * May compile or load device code on first use; warm ops before graph capture. */
  int32_t (*get_function)(void* ctx, int32_t device_id, const char* kernel_name, void** fn);
  /* Launches `fn` with kernel parameters `args` (pointers to each parameter's value) on
   * `stream` (a CUstream; NULL is the legacy default stream). Never synchronizes. Returns
   * KH_ERR_INVALID_ARGUMENT for a cfg it cannot read or that is inconsistent (a cluster that
   * does not divide the grid or has more than 16 blocks, an unknown flag) and KH_ERR_LAUNCH when
   * the device or the driver cannot launch it (a cluster below sm_90, a driver error). */
  int32_t (*launch)(void* ctx, void* fn, const kh_launch_cfg_t* cfg, void** args, void* stream);
  /* ABI 1.2. Runs one GEMM request (kh_gemm_t above) on `stream`. A package checks
   * host->h.abi_minor >= 2 and host->h.struct_size >= KH_HOST_V1_2_SIZE before calling it; an
   * older loader has no such field. Returns KH_ERR_INVALID_ARGUMENT for a request it cannot read
   * or that is inconsistent, KH_ERR_UNSUPPORTED for a dtype pair it does not handle,
   * KH_ERR_NO_DEVICE without a GPU or cuBLASLt, KH_ERR_LAUNCH when cuBLASLt fails. */
  int32_t (*gemm)(void* ctx, const kh_gemm_t* g, void* stream);
  /* ABI 1.3. Encodes a TMA descriptor (the driver's CUtensorMap, tiled mode, element strides 1,
   * no interleave, out-of-bounds elements read as zero, L2 promotion 256 B) for `req` into
   * `map` (KH_TENSOR_MAP_BYTES, 64-byte aligned), for a kernel parameter declared
   * __grid_constant__. A package checks host->h.abi_minor >= 3 and host->h.struct_size >=
   * KH_HOST_V1_3_SIZE before calling it. Never touches a stream: the map is a value, passed to
   * launch() like any other parameter, and may be reused while `base` stays valid. Returns
   * KH_ERR_INVALID_ARGUMENT for a request that breaks a rule above (or a NULL or misaligned
   * map), KH_ERR_NO_DEVICE without a driver or without device `device_id`, KH_ERR_LAUNCH when
   * the driver refuses the encode (the message carries its CUresult). */
  int32_t (*tensor_map)(void* ctx, const kh_tensor_map_t* req, void* map);
  /* ABI 1.4. Fills `info` (kh_device_info_t above) for CUDA device `device_id`. A package checks
   * host->h.abi_minor >= 4 and host->h.struct_size >= KH_HOST_V1_4_SIZE before calling it, and
   * plans with its own assumption where the service is missing or fails. Returns
   * KH_ERR_INVALID_ARGUMENT for a NULL info or one whose header is too small,
   * KH_ERR_ABI for another ABI major, KH_ERR_NO_DEVICE without a driver or without device
   * `device_id` (the message says which), KH_ERR_INTERNAL if the loader itself fails. */
  int32_t (*device_info)(void* ctx, int32_t device_id, kh_device_info_t* info);
} kh_host_v1_t;

/* struct_size of a kh_host_v1_t that has the gemm service. */
#define KH_HOST_V1_2_SIZE ((uint32_t)(offsetof(kh_host_v1_t, gemm) + sizeof(void*)))
/* struct_size of a kh_host_v1_t that has the tensor-map service. */
#define KH_HOST_V1_3_SIZE ((uint32_t)(offsetof(kh_host_v1_t, tensor_map) + sizeof(void*)))
/* struct_size of a kh_host_v1_t that has the device-info service. */
#define KH_HOST_V1_4_SIZE ((uint32_t)(offsetof(kh_host_v1_t, device_info) + sizeof(void*)))

/* Argument kinds of kh_arg_t. */
#define KH_ARG_TENSOR 1
#define KH_ARG_INT 2
#define KH_ARG_FLOAT 3
#define KH_ARG_DTYPE 4

/* One op argument. Tensors are non-owning; outputs are preallocated tensors too. */
typedef struct kh_arg_t {
  int32_t kind; /* KH_ARG_* */
  union {
    const DLTensor* t;
    int64_t i;
    double f;
    DLDataType dt;
  } v;
} kh_arg_t;

/* An op's function: arguments in schema order, a stream (CUstream, or NULL for cpu tensors). */
typedef int32_t (*kh_op_fn)(const kh_arg_t* args, int32_t nargs, void* stream);

/* Capability flags, for ops and layers. */
#define KH_FLAG_HAS_BACKWARD 0x1u   /* the layer has a backward op (required to bind for train) */
#define KH_FLAG_GRAPH_SAFE 0x2u     /* may run inside a CUDA graph capture */
#define KH_FLAG_DETERMINISTIC 0x4u  /* bit-identical results run to run */
#define KH_FLAG_INFERENCE_ONLY 0x8u /* op flag: not for training */
#define KH_FLAGS_KNOWN 0xFu

/* Supported dtypes of a layer, as a bitmask. */
#define KH_DTYPE_BF16 0x1u
#define KH_DTYPE_FP16 0x2u
#define KH_DTYPE_FP32 0x4u
#define KH_DTYPES_KNOWN 0x7u

typedef struct kh_op_v1_t {
  kh_header_t h;
  const char* name;   /* unique in the package, e.g. "rms_norm" */
  const char* schema; /* e.g. "rms_norm(Tensor x, Tensor w, float eps, Tensor(a!) y) -> ()" */
  uint32_t flags;     /* KH_FLAG_* */
  kh_op_fn call;
} kh_op_v1_t;

typedef struct kh_layer_v1_t {
  kh_header_t h;
  const char* name;          /* layer type, e.g. "RMSNorm" */
  const char* forward;       /* op name used in eval mode; required */
  const char* forward_train; /* op name used in train mode (saves what backward needs); NULL =
                                forward */
  const char* backward;      /* op name; required when flags has KH_FLAG_HAS_BACKWARD */
  uint32_t flags;            /* KH_FLAG_HAS_BACKWARD | KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC */
  uint32_t dtypes;           /* KH_DTYPE_* bitmask, at least one */
} kh_layer_v1_t;

typedef struct kh_module_v1_t {
  kh_header_t h;
  const char* name;     /* package name, as in its manifest */
  const char* version;  /* package version, e.g. "1.0.0" */
  const char* build_id; /* free-form identity of the build (commit, compiler) */
  uint32_t num_layers;
  const kh_layer_v1_t* layers;
  uint32_t num_ops;
  const kh_op_v1_t* ops;
  const void* prev; /* an older-ABI view of the same package, or NULL */
} kh_module_v1_t;

/* The entry point's type. The exported symbol is named kh_module_v1. */
typedef const kh_module_v1_t* (*kh_module_v1_fn)(const kh_host_v1_t* host);

#define KH_MODULE_ENTRY_NAME "kh_module_v1"

#if defined(__GNUC__) || defined(__clang__)
#define KH_EXPORT __attribute__((visibility("default")))
#else
#define KH_EXPORT
#endif

/* Defines the entry point with default visibility and C linkage:
 *     KH_MODULE_ENTRY(host) { ...; return &my_module; } */
#ifdef __cplusplus
#define KH_MODULE_ENTRY(host_param) \
  extern "C" KH_EXPORT const kh_module_v1_t* kh_module_v1(const kh_host_v1_t* host_param)
#else
#define KH_MODULE_ENTRY(host_param) \
  KH_EXPORT const kh_module_v1_t* kh_module_v1(const kh_host_v1_t* host_param)
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KERNEL_HUB_ABI_H_ */
