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
#define KH_VERSION_MINOR 2
#define KH_VERSION_PATCH 0
#define KH_VERSION_STRING "0.2.0"
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

/* Runs one GEMM request (kernel_hub_abi.h, kh_gemm_t: row-major, fp32 accumulation) on
 * `stream`, with cuBLASLt on a CUDA device or on the calling thread for device_id < 0: the
 * service packages reach through kh_host_v1_t.gemm. Never synchronizes. */
KH_EXPORT int32_t kh_gemm(const kh_gemm_t* g, void* stream);

/* This thread's last error message ("" when none). Valid until this thread's next call. */
KH_EXPORT const char* kh_last_error(void);
/* The name of a status: "KH_OK", "KH_ERR_OFFLINE", ...; "unknown status" for other values. */
KH_EXPORT const char* kh_status_name(int32_t status);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KERNEL_HUB_H_ */
