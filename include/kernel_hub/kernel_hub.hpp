// kernel_hub.hpp: kernel-hub's C++ embedding API, the one header an embedder includes.
//
// A runtime declares layer slots, each with its own implementation as the fallback; kernelize
// resolves a KernelConfig against a hub, fetches and verifies the chosen kernels and binds them
// to the slots for every mode up front; set_mode switches modes with one atomic store; calls
// take DLPack tensors (kernel_hub_abi.h) and never lock, allocate or do I/O.
//
//   kh::Runtime rt;
//   uint32_t norm = rt.add_slot("RMSNorm", {my_rms_norm, my_rms_norm, my_rms_norm_bwd,
//                                           KH_FLAG_HAS_BACKWARD});
//   kh::EmbedReport report = kh::kernelize(rt, R"({"RMSNorm": "kernel-hub/norm@v1"})");
//   std::printf("%s", report.text.c_str());  // per layer and mode: package, variant, trust
//
//   rt.set_mode(kh::Mode::kEval);            // one atomic store; no I/O from here on
//   if (rt.forward(norm, kh::kCpuDevice, args, nargs, /*stream=*/nullptr) != KH_OK)
//     std::fprintf(stderr, "%s\n", kh::last_op_error().c_str());
//
// Errors are kh::Error exceptions (kernel_hub_base.hpp) whose message says what failed, on which
// input and what to do; calls (forward, backward) return a KH_* status instead. Every log line,
// the hub's warnings included, goes through the sink set with kh::set_log_sink.
//
// Link: libkernel_hub.so, which exports this API and the C API of kernel_hub.h (CMake:
// find_package(KernelHub) and the target KernelHub::kernel_hub; pkg-config: kernel_hub). Inside
// the build, the static target kh_embed gives the same API. Versions, the SONAME rule and what
// the C++ API asks of the compiler: kernel_hub.h, "Versions".
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub_abi.h"
#include "kernel_hub/kernel_hub_base.hpp"

namespace kh {

// The loaded library's version, "MAJOR.MINOR.PATCH" (kh_version(); the header's is
// KH_VERSION_STRING).
const char* version() noexcept;

static_assert(kLogDebug == KH_LOG_DEBUG && kLogInfo == KH_LOG_INFO && kLogWarn == KH_LOG_WARN &&
                  kLogError == KH_LOG_ERROR,
              "kh::LogLevel and KH_LOG_* must agree");

// ---- Slots and modes ----

enum class Mode : uint8_t { kEval = 0, kTrain = 1 };
// "eval" or "train".
const char* mode_name(Mode mode);

// The device of a call or a binding: kCpuDevice for host tensors, 0.. for CUDA ordinals.
constexpr int kCpuDevice = -1;

// The functions serving a slot: the runtime's fallback, or a package layer's ops.
struct SlotOps {
  kh_op_fn forward = nullptr;        // eval
  kh_op_fn forward_train = nullptr;  // train; nullptr = forward
  kh_op_fn backward = nullptr;
  uint32_t flags = 0;  // KH_FLAG_*; a fallback with a backward should set HAS_BACKWARD
};

// What a bind did: bound the package layer, or kept the fallback because a train bind found no
// backward op (and the runtime is not strict).
enum class BindOutcome { kBound, kKeptFallback };

// The message the last failing op or host service set on this thread (empty when none). Ops
// written by the embedder (fallbacks) may set it too before returning a status other than KH_OK.
const std::string& last_op_error();
void set_last_op_error(std::string message);
void clear_last_op_error();

// ---- The GEMM service ----

// Runs one GEMM request (kernel_hub_abi.h, kh_gemm_t: row-major, fp32 accumulation) on `stream`:
// cuBLASLt on CUDA device g.device_id, or the calling thread for device_id < 0. The same service
// packages reach through kh_host_v1_t.gemm. Returns KH_OK, or a status with last_op_error()
// saying what failed and what to do. Never throws; never synchronizes, except a shape's first
// call on a device, which times cuBLASLt's candidates (kernel_hub_abi.h).
int32_t gemm(const kh_gemm_t& g, void* stream = nullptr) noexcept;

// ---- The runtime ----

struct RuntimeOptions {
  // Binding a layer without a backward op for train fails instead of keeping the fallback.
  bool strict = false;
  // Where NVRTC output of packages' CUDA sources is cached; empty = <store root>/jit. The device
  // backend is process-wide: the last runtime that sets it wins for later compiles.
  std::filesystem::path jit_cache_dir = {};
};

// What serves a slot on a device in a mode (Runtime::slot_binding): a package layer, or the
// runtime's fallback (bound false, empty names). The binding table an embedder prints.
struct SlotBinding {
  std::string slot;  // the slot's name
  Mode mode = Mode::kEval;
  int device = kCpuDevice;
  bool bound = false;
  std::string package;                // kernel.json "name"
  std::string version;                // kernel.json "version"
  std::string layer;                  // the package layer
  std::string forward_op;             // the op a forward call runs (train: the forward_train op)
  std::string backward_op;            // empty when none
  std::filesystem::path package_dir;  // the package directory (variant) loaded
  uint32_t flags = 0;  // the layer's KH_FLAG_* (GRAPH_SAFE: may run inside a CUDA graph capture)
};

class LayerTable;  // the slots and their per-mode tables (loader/layer_table.h)

class Runtime {
 public:
  // Installs the process-wide CUDA device backend (touches no driver: libcuda and NVRTC load on
  // the first GPU bind).
  explicit Runtime(RuntimeOptions options = {});
  // No thread may still call through the runtime. Packages stay loaded.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Adds a layer slot with the runtime's own implementation as its fallback. The name must be
  // new (kh::Error kInvalidInput otherwise). Returns its index, valid for the runtime's life.
  uint32_t add_slot(const std::string& name, SlotOps fallback = {});
  // Looks up a slot by name: its index, or nullopt.
  std::optional<uint32_t> find_slot(const std::string& name) const;
  uint32_t num_slots() const;
  std::string slot_name(uint32_t slot) const;

  // Binds the package directory's layer `layer` (default: the slot's name) to `slot` for
  // `mode` on `device`. Loading reads kernel.json, preflights the host library (ELF checks),
  // dlopens it once per process and checks its module table. Returns kKeptFallback when a train
  // bind lacks a backward op (not strict). For a CUDA device (>= 0) the package's device code
  // is loaded or compiled now. Every file is opened once (no symlink followed inside the cache),
  // checked against kernel.json's "files" digests from that descriptor and used through it (the
  // library is dlopen'ed as /proc/self/fd/N). `manifest_digest` ("sha256:<hex>"), when given,
  // is what the caller's signed chain says kernel.json is: a different kernel.json is refused
  // (kIntegrity) before anything is loaded; kernelize always passes it for hub packages.
  // Throws kh::Error: kRefused (every failed check), kIntegrity, kNotFound, kInvalidInput,
  // kUnsupported (no device code backend).
  BindOutcome bind(const std::string& slot, const std::filesystem::path& package_dir, Mode mode,
                   int device = kCpuDevice, const std::string& layer = "",
                   std::optional<bool> strict = std::nullopt,
                   const std::string& manifest_digest = "");

  // What serves `slot` on `device` in `mode` (the slot query). Throws kh::Error kInvalidInput
  // for an unknown slot. Takes the table's lock: not for a hot path (see slot_bound).
  SlotBinding slot_binding(uint32_t slot, int device, Mode mode) const;
  // Whether a package serves `slot` on `device` in the published table (the current mode): one
  // atomic load, no lock. False for the fallback and for an unknown slot.
  bool slot_bound(uint32_t slot, int device) const noexcept;

  // Publishes the table of `mode` with one atomic store: no lock, I/O or allocation. Refused
  // (kh::Error kRefused) while a CUDA graph capture is declared with set_capturing.
  void set_mode(Mode mode);
  // As set_mode, but first asks the driver whether any of `streams` (CUstream; nullptr = the
  // legacy default stream) is capturing a CUDA graph, and refuses (kh::Error kRefused) if so.
  void set_mode(Mode mode, const std::vector<void*>& streams);
  Mode mode() const noexcept;
  // Declares a CUDA graph capture in progress (true) or over (false).
  void set_capturing(bool capturing) noexcept;

  // Calls the slot's forward (eval: forward, train: forward_train) or backward for `device`
  // through the published table. On failure the status is not KH_OK and last_op_error() says
  // why. No lock, no allocation on success.
  int32_t forward(uint32_t slot, int device, const kh_arg_t* args, int32_t nargs,
                  void* stream) const noexcept;
  int32_t backward(uint32_t slot, int device, const kh_arg_t* args, int32_t nargs,
                   void* stream) const noexcept;

  // The layer table behind the runtime, for tools that read its tables (include
  // loader/layer_table.h to use it).
  LayerTable& table() noexcept { return *table_; }
  const LayerTable& table() const noexcept { return *table_; }

 private:
  int32_t call(uint32_t slot, int device, bool backward, const kh_arg_t* args, int32_t nargs,
               void* stream) const noexcept;

  RuntimeOptions options_;
  std::unique_ptr<LayerTable> table_;  // never null; its tables outlive every call
};

// ---- kernelize: a KernelConfig to bound slots, in one call ----
//
// It picks the cache and the hub itself. (Inside kernel-hub, registry/kernelize.h has the
// kernelize underneath, over a given Hub and Device, with its own KernelizeOptions and
// KernelizeReport.)

struct EmbedOptions {
  // The hub: oci://HOST[/NS], http(s)://URL or file://DIR (a layout directory). Empty:
  // $KERNEL_HUB_ENDPOINT, else the embedded default hub: <prefix>/share/kernel-hub/default-hub of
  // the install libkernel_hub.so is in, or $KERNEL_HUB_DATA_DIR/default-hub (kh::Error kNotFound
  // when there is none).
  std::string hub = {};
  // The device to resolve for: "cpu" (this machine), "cpu:linux/arm64",
  // "cuda:sm_90:cuda_13.0" or "cuda:sm_90:cuda_13.0:linux/amd64".
  std::string device = "cpu";
  // The CUDA device bound when `device` is a cuda device.
  int cuda_ordinal = 0;
  // The modes resolved and bound (at least one).
  std::vector<Mode> modes = {Mode::kEval, Mode::kTrain};
  // A mapped layer that falls back, or a train bind without a backward op, is an error.
  bool strict = false;
  // A kernels.lock (`kernel-hub lock`): only its digests are accepted. Empty: no lock.
  std::filesystem::path lock = {};
  // Progress bars on stderr while fetching (shown on a terminal only).
  bool progress = false;
};

// What kernelize did.
struct EmbedReport {
  // One slot in one mode.
  struct Binding {
    std::string layer;  // the slot name
    Mode mode = Mode::kEval;
    bool bound = false;          // false: the runtime's fallback serves it (note says why)
    std::string source;          // "hub" (fetched by this call), "cache", "local" or "fallback"
    std::string kernel;          // the config's ref, "org/name@v1:Layer"; empty for a fallback
    std::string package;         // "name@version" from kernel.json
    std::string index_digest;    // "sha256:..." of the package index
    std::string variant_digest;  // "sha256:..." of the chosen variant
    std::string variant;         // "variant 0 host code", "variant 2 cubin sm_90", ...
    std::filesystem::path package_dir;  // the unpacked package that was loaded
    std::string trust;  // "signed by <keyid> serial N", "UNSIGNED (allowed)", "local ..."
    // Why the fallback serves, when it does; "unserved: <why>" when the config maps the layer
    // for this device but no entry could serve it (not on the hub, no such tag, a revision that
    // is not a tag or digest, the package lacks the layer, no variant fits). `json` lists them
    // under "unserved" too.
    std::string note;
    double load_ms = 0;  // verify + preflight + dlopen + bind (fetch excluded)
  };

  std::string device;             // the device resolved for, in full form
  std::vector<Binding> bindings;  // per slot, per requested mode
  size_t fetched = 0;             // variants fetched from the hub by this call
  double total_ms = 0;
  std::string text;  // one line per binding: kernel, package, index, variant, source, trust
  std::string json;  // the full report with each resolution's trace (kh_runtime_kernelize's)

  // The binding of `layer` in `mode`, or nullptr.
  const Binding* find(std::string_view layer, Mode mode) const;
};

// Resolves every slot of the runtime (layer name = slot name) against the KernelConfig for
// each requested mode, fetches only the chosen variants into the cache ($KERNEL_HUB_CACHE),
// verifies their signatures and files, and binds them; slots the config does not serve keep
// their fallback. After it returns, set_mode and calls do no I/O. `config_json` is the
// KernelConfig as JSON text (native or Transformers forms).
//
// KERNEL_HUB_OFFLINE, KERNEL_HUB_LOCAL, KERNEL_HUB_DISABLE, KERNEL_HUB_REF_TTL and the trust
// variables apply. Throws kh::Error: kInvalidInput (config, device, options), kIntegrity (lock
// or file digests), kRefused (preflight, trust, strict), kOffline, kNetwork, kAuth, kNotFound,
// kIo. A hub that is missing, offline or unreachable leaves the fallbacks in place instead.
EmbedReport kernelize(Runtime& runtime, const std::string& config_json,
                      const EmbedOptions& options = {});

// As above, for a KernelConfig already parsed (registry/kernel_config.h).
struct KernelConfig;
EmbedReport kernelize(Runtime& runtime, const KernelConfig& config,
                      const EmbedOptions& options = {});

// ---- The device API (kernel_hub.h, "Device API"): RAII over the C functions ----
//
// Header-only: each class owns one C handle and throws kh::Error (the C status's kind, with
// kh_last_error()'s message) when a call fails.
//
//   kh::DevicePool pool(0);
//   kh::DeviceStream stream(0);
//   kh::DeviceBuffer x = pool.allocate(n * sizeof(float));
//   stream.copy(x.data(), host.data(), x.size(), KH_COPY_H2D);
//   kh::DeviceModule m(0, "scale", source);
//   const uint32_t blocks = (n + 255) / 256;
//   kh_launch_cfg_t cfg = kh::launch_cfg(0, {blocks, 1, 1}, {256, 1, 1});
//   void* px = x.data();
//   void* args[] = {&px, &n};
//   kh::launch(m.function("scale"), cfg, args, stream);
//   stream.synchronize();

namespace device_detail {

inline ErrorKind kind_of_status(int32_t status) {
  switch (status) {
    case KH_ERR_INVALID_ARGUMENT:
      return ErrorKind::kInvalidInput;
    case KH_ERR_NOT_FOUND:
    case KH_ERR_NO_DEVICE:
      return ErrorKind::kNotFound;
    case KH_ERR_UNSUPPORTED:
      return ErrorKind::kUnsupported;
    case KH_ERR_REFUSED:
      return ErrorKind::kRefused;
    case KH_ERR_NETWORK:
      return ErrorKind::kNetwork;
    case KH_ERR_AUTH:
      return ErrorKind::kAuth;
    case KH_ERR_INTEGRITY:
      return ErrorKind::kIntegrity;
    case KH_ERR_OFFLINE:
      return ErrorKind::kOffline;
    default:  // KH_ERR_IO, KH_ERR_LAUNCH, KH_ERR_INTERNAL
      return ErrorKind::kIo;
  }
}

inline void check(int32_t status) {
  if (status != KH_OK) throw Error(kind_of_status(status), kh_last_error());
}

}  // namespace device_detail

// What CUDA device `device` is and holds (kh_device_get_info): compute capability, SMs, what one
// SM holds. Throws kh::Error (kNotFound without a driver or that device, kInvalidInput for a
// negative ordinal).
inline kh_device_info_t device_info(int device) {
  kh_device_info_t info{};
  info.h = KH_HEADER_INIT(kh_device_info_t);
  device_detail::check(kh_device_get_info(device, &info));
  return info;
}

// A kh_launch_cfg_t of this header's ABI for `device`.
inline kh_launch_cfg_t launch_cfg(int device, const uint32_t (&grid)[3], const uint32_t (&block)[3],
                                  uint32_t shared_mem_bytes = 0) {
  kh_launch_cfg_t cfg{};
  cfg.h = KH_HEADER_INIT(kh_launch_cfg_t);
  for (int i = 0; i < 3; ++i) {
    cfg.grid[i] = grid[i];
    cfg.block[i] = block[i];
  }
  cfg.shared_mem_bytes = shared_mem_bytes;
  cfg.device_id = device;
  return cfg;
}

// One block of a DevicePool, freed when destroyed (a failure then, such as a pool destroyed
// first, is ignored: the pool released the memory already).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(kh_device_pool_t* pool, void* ptr, size_t bytes)
      : pool_(pool), ptr_(ptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : pool_(o.pool_), ptr_(o.ptr_), bytes_(o.bytes_) {
    o.pool_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(pool_, o.pool_);
      std::swap(ptr_, o.ptr_);
      std::swap(bytes_, o.bytes_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const noexcept { return ptr_; }
  template <typename T>
  T* as() const noexcept {
    return static_cast<T*>(ptr_);
  }
  size_t size() const noexcept { return bytes_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }
  void reset() noexcept {
    if (ptr_) kh_device_free(pool_, ptr_);
    pool_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  kh_device_pool_t* pool_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// kh_device_pool_*: a caching allocator of one device.
class DevicePool {
 public:
  explicit DevicePool(int device) : device_(device) {
    device_detail::check(kh_device_pool_create(device, &pool_));
  }
  ~DevicePool() {
    if (pool_) kh_device_pool_destroy(pool_);
  }
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  DeviceBuffer allocate(size_t bytes) {
    void* p = nullptr;
    device_detail::check(kh_device_alloc(pool_, bytes, &p));
    return DeviceBuffer(pool_, p, bytes);
  }
  kh_device_pool_stats_t stats() const {
    kh_device_pool_stats_t s{};
    s.struct_size = sizeof(s);
    device_detail::check(kh_device_pool_stats(pool_, &s));
    return s;
  }
  uint64_t trim() {
    uint64_t released = 0;
    device_detail::check(kh_device_pool_trim(pool_, &released));
    return released;
  }
  int device() const noexcept { return device_; }
  kh_device_pool_t* get() const noexcept { return pool_; }

 private:
  int device_;
  kh_device_pool_t* pool_ = nullptr;
};

class DeviceEvent;

// kh_device_stream_*: a non-blocking stream of one device, with its copies and captures.
class DeviceStream {
 public:
  explicit DeviceStream(int device) : device_(device) {
    device_detail::check(kh_device_stream_create(device, &stream_));
  }
  ~DeviceStream() {
    if (stream_) kh_device_stream_destroy(stream_);
  }
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  // Movable (and so swappable): a runtime can point code written against one stream member at a
  // second stream for a branch of its work.
  DeviceStream(DeviceStream&& other) noexcept
      : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)) {}
  DeviceStream& operator=(DeviceStream&& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(stream_, other.stream_);
    return *this;
  }

  // kind: KH_COPY_H2D, KH_COPY_D2H or KH_COPY_D2D.
  void copy(void* dst, const void* src, size_t bytes, int32_t kind) {
    device_detail::check(kh_device_copy_async(dst, src, bytes, kind, stream_));
  }
  void memset(void* dst, uint8_t value, size_t bytes) {
    device_detail::check(kh_device_memset_async(dst, value, bytes, stream_));
  }
  void synchronize() { device_detail::check(kh_device_stream_synchronize(stream_)); }
  inline void wait(const DeviceEvent& event);
  void begin_capture() { device_detail::check(kh_device_graph_begin_capture(stream_)); }

  int device() const noexcept { return device_; }
  // The CUstream, for kh::Runtime::forward/backward and kh_gemm.
  void* handle() const noexcept { return kh_device_stream_handle(stream_); }
  kh_device_stream_t* get() const noexcept { return stream_; }

 private:
  int device_;
  kh_device_stream_t* stream_ = nullptr;
};

// kh_device_event_*: a timing event of one device.
class DeviceEvent {
 public:
  explicit DeviceEvent(int device) {
    device_detail::check(kh_device_event_create(device, &event_));
  }
  ~DeviceEvent() {
    if (event_) kh_device_event_destroy(event_);
  }
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  void record(DeviceStream& stream) {
    device_detail::check(kh_device_event_record(event_, stream.get()));
  }
  void synchronize() { device_detail::check(kh_device_event_synchronize(event_)); }
  // Milliseconds from `start` to this event (both recorded and completed).
  float elapsed_ms_since(const DeviceEvent& start) const {
    float ms = 0;
    device_detail::check(kh_device_event_elapsed_ms(start.event_, event_, &ms));
    return ms;
  }
  kh_device_event_t* get() const noexcept { return event_; }

 private:
  kh_device_event_t* event_ = nullptr;
};

inline void DeviceStream::wait(const DeviceEvent& event) {
  device_detail::check(kh_device_stream_wait_event(stream_, event.get()));
}

// kh_device_graph_*: the work captured on a stream, instantiated once, launched many times.
class DeviceGraph {
 public:
  // Ends the capture begun with stream.begin_capture() and instantiates the graph.
  static DeviceGraph end_capture(DeviceStream& stream) {
    DeviceGraph g;
    device_detail::check(kh_device_graph_end_capture(stream.get(), &g.graph_));
    device_detail::check(kh_device_graph_instantiate(g.graph_));
    return g;
  }
  DeviceGraph(DeviceGraph&& o) noexcept : graph_(o.graph_) { o.graph_ = nullptr; }
  DeviceGraph& operator=(DeviceGraph&& o) noexcept {
    std::swap(graph_, o.graph_);
    return *this;
  }
  ~DeviceGraph() {
    if (graph_) kh_device_graph_destroy(graph_);
  }
  void launch(DeviceStream& stream) {
    device_detail::check(kh_device_graph_launch(graph_, stream.get()));
  }

 private:
  DeviceGraph() = default;
  kh_device_graph_t* graph_ = nullptr;
};

// kh_device_module_*: CUDA source compiled for one device by the loader's NVRTC (JIT cached).
class DeviceModule {
 public:
  DeviceModule(int device, const std::string& name, const std::string& source,
               const std::vector<std::string>& options = {})
      : device_(device) {
    std::vector<const char*> opts;
    for (const auto& o : options) opts.push_back(o.c_str());
    device_detail::check(kh_device_module_from_source(device, name.c_str(), source.c_str(),
                                                      opts.data(),
                                                      static_cast<int32_t>(opts.size()), &module_));
  }
  ~DeviceModule() {
    if (module_) kh_device_module_destroy(module_);
  }
  DeviceModule(const DeviceModule&) = delete;
  DeviceModule& operator=(const DeviceModule&) = delete;

  // The kernel by its extern "C" name (looked up once, then cached by the module).
  kh_device_function_t* function(const std::string& kernel) {
    kh_device_function_t* fn = nullptr;
    device_detail::check(kh_device_module_get_function(module_, kernel.c_str(), &fn));
    return fn;
  }
  int device() const noexcept { return device_; }

 private:
  int device_;
  kh_device_module_t* module_ = nullptr;
};

inline void launch(const kh_device_function_t* fn, const kh_launch_cfg_t& cfg, void** args,
                   DeviceStream& stream) {
  device_detail::check(kh_device_launch(fn, &cfg, args, stream.get()));
}

}  // namespace kh
