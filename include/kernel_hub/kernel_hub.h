/* kernel_hub.h: kernel-hub's C embedding API (libkernel_hub.so), for runtimes in C and for other
 * languages (Python ctypes, Rust, Go). Every function returns KH_OK or a KH_ERR_* status; after a
 * failure kh_last_error() gives this thread's message (what failed, which input, what to do).
 *
 * Statuses (kernel_hub_abi.h), one per kind of failure:
 *   KH_ERR_INVALID_ARGUMENT  malformed input: config, device, address, lock, NULL argument
 *   KH_ERR_NOT_FOUND         no such slot, layer, package, ref or file
 *   KH_ERR_UNSUPPORTED       something kernel-hub does not handle (a server, a file format)
 *   KH_ERR_REFUSED           a safety rule refused: preflight, ABI, trust, strict, graph capture
 *   KH_ERR_NETWORK           the hub could not be reached, or kept failing after retries
 *   KH_ERR_AUTH              the hub refused the credentials
 *   KH_ERR_INTEGRITY         a digest, size or lock mismatch: a tampered or damaged hub or cache
 *   KH_ERR_OFFLINE           offline, and the cache cannot answer
 *   KH_ERR_IO                a local file system failure
 *   KH_ERR_INTERNAL          anything else (out of memory, a bug); the message says what
 * kh_runtime_forward and kh_runtime_backward return the op's own status (any KH_ERR_*).
 *
 * The smallest embedding (tools/examples/embed_minimal.c is a complete one):
 *
 *   kh_runtime_t* rt = kh_runtime_create(0);
 *   uint32_t slot;
 *   kh_runtime_add_slot(rt, "SiluAndMul", my_fwd, my_fwd, NULL, 0, &slot);
 *   int32_t status = kh_runtime_kernelize(rt, "{\"SiluAndMul\": \"kernel-hub/activation@v1\"}",
 *                                         NULL, NULL, 0, 0, NULL, NULL);
 *   if (status != KH_OK) fprintf(stderr, "%s: %s\n", kh_status_name(status), kh_last_error());
 *   kh_runtime_set_mode(rt, KH_MODE_EVAL);
 *   if (kh_runtime_forward(rt, slot, KH_DEVICE_CPU, args, nargs, NULL) != KH_OK)
 *     fprintf(stderr, "%s\n", kh_last_error());
 *   kh_runtime_destroy(rt);
 *
 * Binding one package directory by hand instead of kernelize:
 *
 *   kh_runtime_bind(rt, "Scale", "/path/to/package", NULL, KH_MODE_EVAL, KH_DEVICE_CPU, NULL);
 */
#ifndef KERNEL_HUB_H_
#define KERNEL_HUB_H_

#include <stdint.h>

#include "kernel_hub/kernel_hub_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versions ----
 *
 * The version of this header, MAJOR.MINOR.PATCH (the build reads it from here: there is no other
 * copy). kh_version() is the version of the libkernel_hub.so actually loaded; a program may
 * compare the two (same MAJOR: compatible, see below).
 *
 * libkernel_hub.so's SONAME is libkernel_hub.so.MAJOR (libkernel_hub.so.0 -> .so.0.1.0):
 *   MAJOR  bumped by any change that breaks a program built against an older library of the same
 *          MAJOR: a C function or exported C++ symbol removed or its signature changed, a public
 *          struct or class changed in layout (the C++ API's RuntimeOptions, EmbedOptions,
 *          EmbedReport and SlotOps are passed across the library boundary, so appending a field
 *          to one of them is a MAJOR change too), a status or constant changing meaning. While
 *          MAJOR is 0, such a change still bumps it (to 1): the SONAME never lies.
 *   MINOR  bumped by additions only: a new function, a new exported C++ symbol, a new status.
 *   PATCH  bumped by fixes that change no declaration.
 * The C++ API (kernel_hub.hpp) passes std::string and std::function, so it also needs the
 * libstdc++ "new" string ABI (_GLIBCXX_USE_CXX11_ABI=1, GCC's default since 5) on both sides;
 * the C API has no such condition.
 *
 * The package ABI (KH_ABI_MAJOR/KH_ABI_MINOR in kernel_hub_abi.h, the contract between the loader
 * and a package's host library) is versioned on its own: see that header. */
#define KH_VERSION_MAJOR 0
#define KH_VERSION_MINOR 4
#define KH_VERSION_PATCH 0
#define KH_VERSION_STRING "0.4.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons. */
#define KH_VERSION_NUMBER (KH_VERSION_MAJOR * 10000 + KH_VERSION_MINOR * 100 + KH_VERSION_PATCH)

/* The loaded library's version, "MAJOR.MINOR.PATCH" (static storage). */
KH_EXPORT const char* kh_version(void);

#define KH_MODE_EVAL 0
#define KH_MODE_TRAIN 1
#define KH_DEVICE_CPU (-1)

typedef struct kh_runtime kh_runtime_t;

/* A runtime with its own layer table. strict != 0: binding a layer without a backward op for
 * train fails instead of keeping the fallback. Returns NULL on failure (see kh_last_error). */
KH_EXPORT kh_runtime_t* kh_runtime_create(int32_t strict);
/* Frees the runtime and its tables. No thread may still call through it. Packages stay loaded. */
KH_EXPORT void kh_runtime_destroy(kh_runtime_t* rt);

/* Adds a layer slot with the runtime's own implementation as fallback (any function may be
 * NULL; forward_train NULL = forward). *slot_out receives its index. */
KH_EXPORT int32_t kh_runtime_add_slot(kh_runtime_t* rt, const char* name, kh_op_fn forward,
                                      kh_op_fn forward_train, kh_op_fn backward, uint32_t flags,
                                      uint32_t* slot_out);
/* Looks up a slot by name; KH_ERR_NOT_FOUND when there is none. */
KH_EXPORT int32_t kh_runtime_find_slot(const kh_runtime_t* rt, const char* name,
                                       uint32_t* slot_out);

/* Loads the package directory (kernel.json + host library; preflight before dlopen) and binds
 * its layer `layer` (NULL = the slot's name) to the slot for `mode` on `device`
 * (KH_DEVICE_CPU or a CUDA ordinal). *bound_out (may be NULL) is 1 when bound, 0 when a train
 * bind kept the fallback because the layer has no backward op. */
KH_EXPORT int32_t kh_runtime_bind(kh_runtime_t* rt, const char* slot, const char* package_dir,
                                  const char* layer, int32_t mode, int32_t device,
                                  int32_t* bound_out);

/* Publishes the table of `mode` (one atomic store). KH_ERR_REFUSED during a graph capture. */
KH_EXPORT int32_t kh_runtime_set_mode(kh_runtime_t* rt, int32_t mode);
KH_EXPORT int32_t kh_runtime_get_mode(const kh_runtime_t* rt);
/* Declares a CUDA graph capture in progress (1) or over (0). */
KH_EXPORT int32_t kh_runtime_set_capturing(kh_runtime_t* rt, int32_t capturing);

/* Calls the slot's forward (train mode: forward_train) or backward on `device`. */
KH_EXPORT int32_t kh_runtime_forward(const kh_runtime_t* rt, uint32_t slot, int32_t device,
                                     const kh_arg_t* args, int32_t nargs, void* stream);
KH_EXPORT int32_t kh_runtime_backward(const kh_runtime_t* rt, uint32_t slot, int32_t device,
                                      const kh_arg_t* args, int32_t nargs, void* stream);

/* ---- Slot query (0.3): what serves a slot, for the binding table an embedder prints ----
 *
 * kh_runtime_slot_binding fills *out with what serves `slot` on `device` (KH_DEVICE_CPU or a CUDA
 * ordinal) in `mode` (KH_MODE_EVAL or KH_MODE_TRAIN; the current one: kh_runtime_get_mode):
 * bound 1 with the package layer's names, or bound 0 and "" strings when the runtime's fallback
 * serves it. The strings live as long as the runtime. out->struct_size must be set by the
 * caller; fields are only ever appended. KH_ERR_INVALID_ARGUMENT for an unknown slot or mode.
 *
 *   kh_slot_binding_t b = {sizeof(b)};
 *   kh_runtime_slot_binding(rt, slot, kh_runtime_get_mode(rt), 0, &b);
 *   printf("%s: %s\n", b.slot, b.bound ? b.package : "fallback");
 *
 * kh_runtime_slot_bound is the hot-path form: 1 when a package serves the slot on the device in
 * the published table (current mode), 0 for the fallback or an unknown slot. No lock. */
typedef struct kh_slot_binding_t {
  uint32_t struct_size;    /* set by the caller: sizeof(kh_slot_binding_t) */
  int32_t bound;           /* 1: a package layer serves the slot; 0: the runtime's fallback */
  const char* slot;        /* the slot's name */
  const char* package;     /* kernel.json "name" ("" for the fallback) */
  const char* version;     /* kernel.json "version" */
  const char* layer;       /* the package layer bound to the slot */
  const char* forward_op;  /* the op a forward call runs (train: the layer's forward_train op) */
  const char* backward_op; /* the layer's backward op ("" when none) */
  const char* package_dir; /* the package directory (its variant, in the cache) that was loaded */
  uint32_t flags;          /* the layer's KH_FLAG_* (GRAPH_SAFE: may run in a CUDA graph) */
} kh_slot_binding_t;
KH_EXPORT int32_t kh_runtime_slot_binding(const kh_runtime_t* rt, uint32_t slot, int32_t mode,
                                          int32_t device, kh_slot_binding_t* out);
KH_EXPORT int32_t kh_runtime_slot_bound(const kh_runtime_t* rt, uint32_t slot, int32_t device);

/* kernelize: resolves every slot of the runtime (layer name = slot name) against a KernelConfig
 * for each requested mode, fetches only the chosen variants into the cache ($KERNEL_HUB_CACHE),
 * verifies their signatures and files, and binds them; slots the config does not serve keep
 * their fallback. After it returns, set_mode and calls do no I/O.
 *
 *   config_json  the KernelConfig as JSON text (native or Transformers forms)
 *   hub          hub address: oci://HOST[/NS], http(s)://URL or file://DIR;
 *                NULL: $KERNEL_HUB_ENDPOINT, else the embedded default hub
 *                (<prefix>/share/kernel-hub/default-hub beside the library, or
 *                $KERNEL_HUB_DATA_DIR/default-hub; KH_ERR_NOT_FOUND when there is none)
 *   device       NULL or "cpu" (this machine), or "cuda:sm_90:cuda_13.0[:OS/ARCH]"
 *                (binds CUDA device 0)
 *   modes        KH_KERNELIZE_EVAL | KH_KERNELIZE_TRAIN (0: both)
 *   strict       != 0: a mapped layer that falls back, or a train bind without backward, fails
 *   lock_path    NULL, or a kernels.lock: only its digests are accepted
 *   report_json  NULL, or receives a malloc'ed JSON report (per layer and mode: package, index
 *                digest, variant, source, load time, trace; "unserved": the layers the config
 *                maps on this device that no entry could serve, each with its reason, also as
 *                each binding's "unserved" and "note"); free it with kh_runtime_free_report.
 *
 * KERNEL_HUB_OFFLINE, KERNEL_HUB_LOCAL, KERNEL_HUB_DISABLE and KERNEL_HUB_REF_TTL apply. A hub
 * that is missing, offline or unreachable leaves the fallbacks in place (with strict, that is
 * KH_ERR_REFUSED); a tampered one is KH_ERR_INTEGRITY. */
#define KH_KERNELIZE_EVAL 0x1u
#define KH_KERNELIZE_TRAIN 0x2u
KH_EXPORT int32_t kh_runtime_kernelize(kh_runtime_t* rt, const char* config_json, const char* hub,
                                       const char* device, uint32_t modes, int32_t strict,
                                       const char* lock_path, char** report_json);
/* Frees a report kh_runtime_kernelize handed out. NULL is fine. */
KH_EXPORT void kh_runtime_free_report(char* report_json);

/* ---- Device API (0.2): memory, streams, events, CUDA graphs and runtime modules ----
 *
 * What a GPU runtime needs beside the layer table, on the CUDA driver that kernel-hub loads
 * lazily (libcuda.so.1; no CUDA runtime, no CUDA headers). Every call that needs a GPU fails
 * with a clear message where there is none (KH_ERR_NOT_FOUND: no driver or no such device), and
 * refuses bad arguments (KH_ERR_INVALID_ARGUMENT: NULL, a zero size, a negative device, a
 * destroyed handle, a pointer the pool did not hand out, a function or stream of another
 * device). Handles are checked against the live ones of their kind on every call; a destroyed
 * handle is refused (unless its address was reused by a newer object of the same kind). Destroy
 * must not race with other calls on the same handle.
 *
 *   kh_device_pool_t* pool;  kh_device_stream_t* s;  kh_device_module_t* m;
 *   kh_device_function_t* fn;  void* x;
 *   kh_device_pool_create(0, &pool);
 *   kh_device_stream_create(0, &s);
 *   kh_device_alloc(pool, n * sizeof(float), &x);
 *   kh_device_copy_async(x, host, n * sizeof(float), KH_COPY_H2D, s);
 *   kh_device_module_from_source(0, "scale", "extern \"C\" __global__ void scale(float* x, "
 *                                "int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; "
 *                                "if (i < n) x[i] *= 2; }", NULL, 0, &m);
 *   kh_device_module_get_function(m, "scale", &fn);
 *   kh_launch_cfg_t cfg = {KH_HEADER_INIT(kh_launch_cfg_t), {(n + 255) / 256, 1, 1},
 *                          {256, 1, 1}, 0, 0};
 *   void* args[] = {&x, &n};
 *   kh_device_launch(fn, &cfg, args, s);
 *   kh_device_copy_async(host, x, n * sizeof(float), KH_COPY_D2H, s);
 *   kh_device_stream_synchronize(s);
 *   kh_device_free(pool, x);  ...  kh_device_pool_destroy(pool);
 */
typedef struct kh_device_pool kh_device_pool_t;
typedef struct kh_device_stream kh_device_stream_t;
typedef struct kh_device_event kh_device_event_t;
typedef struct kh_device_graph kh_device_graph_t;
typedef struct kh_device_module kh_device_module_t;
typedef struct kh_device_function kh_device_function_t;

/* Number of CUDA devices. */
KH_EXPORT int32_t kh_device_count(int32_t* count_out);
/* Free and total memory of the device, in bytes (cuMemGetInfo). */
KH_EXPORT int32_t kh_device_mem_info(int32_t device, uint64_t* free_out, uint64_t* total_out);
/* What the device is and holds: compute capability, multiprocessors, and the threads, registers
 * and shared memory of one (kh_device_info_t, kernel_hub_abi.h; the answer packages get from the
 * device-info service). Set info->h = KH_HEADER_INIT(kh_device_info_t) first; fields past
 * h.struct_size are left alone. KH_ERR_UNSUPPORTED for another ABI major, KH_ERR_INVALID_ARGUMENT
 * for a struct smaller than ABI 1.4's or a negative ordinal, KH_ERR_NOT_FOUND without a driver or
 * that device (the struct is checked first; the statuses are the device API's, where the package
 * service answers KH_ERR_ABI and KH_ERR_NO_DEVICE). */
KH_EXPORT int32_t kh_device_get_info(int32_t device, kh_device_info_t* info);

/* Memory pool: a caching allocator over cuMemAlloc. Requests are rounded to a size class (512 B
 * steps up to 4 KiB, then 4 classes per power of two); a freed block is kept and reused by the
 * next request of its class without a driver call (so also during a graph capture); when the
 * driver is out of memory the cache is released and the allocation tried once more. A freed
 * block may be handed out again at once: free only memory whose users are ordered before the
 * next user (one stream, or synchronize first). Destroying the pool releases every block, those
 * still allocated included (a warning says how many). */
KH_EXPORT int32_t kh_device_pool_create(int32_t device, kh_device_pool_t** pool_out);
KH_EXPORT int32_t kh_device_pool_destroy(kh_device_pool_t* pool);
/* A block of at least `bytes` (> 0), aligned to 512 bytes. */
KH_EXPORT int32_t kh_device_alloc(kh_device_pool_t* pool, uint64_t bytes, void** ptr_out);
/* Refuses a double free, an interior pointer and another pool's pointer. */
KH_EXPORT int32_t kh_device_free(kh_device_pool_t* pool, void* ptr);
/* Releases the cached blocks to the driver; *released_out (may be NULL) gets their bytes. */
KH_EXPORT int32_t kh_device_pool_trim(kh_device_pool_t* pool, uint64_t* released_out);
typedef struct kh_device_pool_stats_t {
  uint32_t struct_size;    /* set by the caller: sizeof(kh_device_pool_stats_t) */
  uint32_t reserved;       /* 0 */
  uint64_t current_bytes;  /* in blocks handed out (with rounding) */
  uint64_t peak_bytes;     /* the largest current_bytes so far */
  uint64_t reserved_bytes; /* held from the driver: handed out + cached */
  uint64_t cached_bytes;   /* freed blocks kept for reuse */
  uint64_t allocations;    /* successful kh_device_alloc calls */
  uint64_t reuses;         /* of those, served from the cache */
  uint64_t driver_allocations;
} kh_device_pool_stats_t;
/* Fills *stats as far as stats->struct_size reaches (fields are only ever appended). */
KH_EXPORT int32_t kh_device_pool_stats(const kh_device_pool_t* pool, kh_device_pool_stats_t* stats);

/* Streams: non-blocking (CU_STREAM_NON_BLOCKING) streams of one device. kh_device_stream_handle
 * is the CUstream, for kh_runtime_forward/backward and kh_gemm. */
KH_EXPORT int32_t kh_device_stream_create(int32_t device, kh_device_stream_t** stream_out);
KH_EXPORT int32_t kh_device_stream_destroy(kh_device_stream_t* stream);
KH_EXPORT int32_t kh_device_stream_synchronize(kh_device_stream_t* stream);
/* The stream waits (on the device) for the event's last record. */
KH_EXPORT int32_t kh_device_stream_wait_event(kh_device_stream_t* stream, kh_device_event_t* event);
KH_EXPORT void* kh_device_stream_handle(const kh_device_stream_t* stream);

/* Copies and memset, ordered on the stream. A device pointer inside a block of a pool of the
 * stream's device is checked: the range must lie in a live block. Host memory of H2D and D2H
 * copies is pageable or pinned; with pageable memory the driver may return before the copy runs
 * (H2D) or only after it (D2H). */
#define KH_COPY_H2D 1
#define KH_COPY_D2H 2
#define KH_COPY_D2D 3
KH_EXPORT int32_t kh_device_copy_async(void* dst, const void* src, uint64_t bytes, int32_t kind,
                                       kh_device_stream_t* stream);
KH_EXPORT int32_t kh_device_memset_async(void* dst, uint8_t value, uint64_t bytes,
                                         kh_device_stream_t* stream);

/* Events (with timing). */
KH_EXPORT int32_t kh_device_event_create(int32_t device, kh_device_event_t** event_out);
KH_EXPORT int32_t kh_device_event_destroy(kh_device_event_t* event);
KH_EXPORT int32_t kh_device_event_record(kh_device_event_t* event, kh_device_stream_t* stream);
KH_EXPORT int32_t kh_device_event_synchronize(kh_device_event_t* event);
/* Milliseconds between two recorded, completed events of one device. */
KH_EXPORT int32_t kh_device_event_elapsed_ms(kh_device_event_t* start, kh_device_event_t* end,
                                             float* ms_out);

/* CUDA graphs: capture the work issued to a stream (thread-local capture mode: this thread may
 * not call unsafe driver functions meanwhile, so a pool miss fails during a capture; cached
 * blocks are reused), then instantiate once and launch many times. Declare the capture to the
 * layer table too (kh_runtime_set_capturing). */
KH_EXPORT int32_t kh_device_graph_begin_capture(kh_device_stream_t* stream);
KH_EXPORT int32_t kh_device_graph_end_capture(kh_device_stream_t* stream,
                                              kh_device_graph_t** graph_out);
KH_EXPORT int32_t kh_device_graph_instantiate(kh_device_graph_t* graph);
KH_EXPORT int32_t kh_device_graph_launch(kh_device_graph_t* graph, kh_device_stream_t* stream);
KH_EXPORT int32_t kh_device_graph_destroy(kh_device_graph_t* graph);

/* Runtime modules: CUDA C++ source compiled by the loader's NVRTC for the device's exact
 * architecture (sm_90a on Hopper: __CUDA_ARCH_FEAT_SM90_ALL is defined) with the loader's
 * options (-default-device --std=c++17 ...) plus `options`, through the JIT cache that package
 * sources use ($KERNEL_HUB_CACHE/jit): the second process compiles nothing. `name` names the
 * source in NVRTC's log ("<name>.cu(12): error ..."); a source that does not compile is
 * KH_ERR_INVALID_ARGUMENT with the log in kh_last_error(); no NVRTC is KH_ERR_NOT_FOUND. The
 * loaded code stays in the process after kh_device_module_destroy (kernels may still run or be
 * captured); the module's function handles become invalid. */
KH_EXPORT int32_t kh_device_module_from_source(int32_t device, const char* name, const char* source,
                                               const char* const* options, int32_t num_options,
                                               kh_device_module_t** module_out);
KH_EXPORT int32_t kh_device_module_destroy(kh_device_module_t* module);
/* The kernel by its extern "C" __global__ name; KH_ERR_NOT_FOUND when there is none. */
KH_EXPORT int32_t kh_device_module_get_function(kh_device_module_t* module, const char* kernel,
                                                kh_device_function_t** function_out);
/* Launches on the stream, through the loader's launch path: kh_launch_cfg_t (KH_HEADER_INIT;
 * device_id the function's device) with clusters, PDL and >48 KiB dynamic shared memory as for
 * packages. `args` point at each kernel parameter's value. The stream must be of the function's
 * device. KH_ERR_LAUNCH when the driver refuses the launch. */
KH_EXPORT int32_t kh_device_launch(const kh_device_function_t* function, const kh_launch_cfg_t* cfg,
                                   void** args, kh_device_stream_t* stream);

/* Runs one GEMM request (kernel_hub_abi.h, kh_gemm_t: row-major, fp32 accumulation) on
 * `stream`, with cuBLASLt on a CUDA device or on the calling thread for device_id < 0: the
 * service packages reach through kh_host_v1_t.gemm. Never synchronizes, except a shape's first
 * call on a device, which times cuBLASLt's candidates on `stream` and waits for them (see
 * kernel_hub_abi.h). */
KH_EXPORT int32_t kh_gemm(const kh_gemm_t* g, void* stream);

/* This thread's last error message ("" when none). Valid until this thread's next call. */
KH_EXPORT const char* kh_last_error(void);
/* The name of a status: "KH_OK", "KH_ERR_OFFLINE", ...; "unknown status" for other values. */
KH_EXPORT const char* kh_status_name(int32_t status);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KERNEL_HUB_H_ */
