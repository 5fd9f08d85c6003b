#include "loader/device_api.h"

#include "loader/device_info_service.h"

#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/log.h"
#include "loader/device_code.h"
#include "loader/launch_config.h"

namespace kh::device_api {

namespace {

// The live objects of one handle kind; never destroyed (handles may be checked from static
// destructors of embedders).
template <typename T>
struct Live {
  mutable std::mutex mutex;
  std::unordered_set<const T*> set;

  static Live& get() {
    static Live* l = new Live;
    return *l;
  }
  void add(const T* p) {
    std::lock_guard lock(mutex);
    set.insert(p);
  }
  void remove(const T* p) {
    std::lock_guard lock(mutex);
    set.erase(p);
  }
  bool contains(const T* p) const {
    std::lock_guard lock(mutex);
    return set.count(p) != 0;
  }
};

// `h` when it is a live handle of its kind, else kInvalidInput naming `what`.
template <typename T>
T& checked(T* h, const char* what) {
  using Base = std::remove_const_t<T>;
  if (!h) throw Error(ErrorKind::kInvalidInput, fmt::format("{} must not be NULL", what));
  if (!Live<Base>::get().contains(h))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} {} is not a live handle: it was destroyed, or never created by "
                            "kernel-hub's device API",
                            what, static_cast<const void*>(h)));
  return *h;
}

const cuda::DeviceInfo& device_info(int device) {
  if (device < 0)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device {}: a CUDA device ordinal is 0 or more (kh_device_count "
                            "says how many there are)",
                            device));
  return cuda::device(device);  // loads the driver; kNotFound names how many devices exist
}

uint64_t address_of(const void* p) {
  return reinterpret_cast<uint64_t>(p);
}

// Checks a device range against the live pools: kInvalidInput when it lies in a freed block,
// runs past its allocation, or belongs to a pool of another device than `device`.
void check_device_range(const void* p, uint64_t bytes, int device, const std::string& what) {
  auto& live = Live<kh_device_pool>::get();
  std::lock_guard lock(live.mutex);
  for (const kh_device_pool* pool : live.set) {
    if (!pool->pool->check_range(address_of(p), bytes, what)) continue;
    if (pool->device != device)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{} {}: the memory belongs to a pool of CUDA device {} but the "
                              "stream is of CUDA device {}",
                              what, p, pool->device, device));
    return;
  }
}

}  // namespace

int device_count() {
  return cuda::device_count();
}

void get_info(int device, kh_device_info_t* info) {
  // The service checks the struct first; a device it cannot see is then refused as every call
  // here refuses it (a negative ordinal, no driver, no such device).
  std::string error;
  switch (query_device_info(&CudaDeviceBackend::instance(), device, info, error)) {
    case KH_OK:
      return;
    case KH_ERR_NO_DEVICE:
      device_info(device);
      throw Error(ErrorKind::kNotFound, error);
    case KH_ERR_ABI:
      throw Error(ErrorKind::kUnsupported, error);
    case KH_ERR_INVALID_ARGUMENT:
      throw Error(ErrorKind::kInvalidInput, error);
    default:
      throw std::runtime_error(error);  // KH_ERR_INTERNAL
  }
}

void mem_info(int device, uint64_t& free_bytes, uint64_t& total_bytes) {
  const cuda::DeviceInfo& dev = device_info(device);
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuMemGetInfo)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver has no cuMemGetInfo");
  cuda::ScopedContext scope(dev.primary_context);
  size_t f = 0, t = 0;
  cuda::check(d.cuMemGetInfo(&f, &t), fmt::format("cuMemGetInfo(CUDA device {})", device));
  free_bytes = f;
  total_bytes = t;
}

// ---- pools ----

kh_device_pool* pool_create(int device) {
  const cuda::DeviceInfo& dev = device_info(device);
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuMemAlloc || !d.cuMemFree)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver has no cuMemAlloc/cuMemFree");
  CachingPool::Backing backing;
  cuda::CUcontext ctx = dev.primary_context;
  backing.allocate = [ctx, device, &d](size_t bytes, bool& out_of_memory) -> uint64_t {
    cuda::ScopedContext scope(ctx);
    cuda::CUdeviceptr p = 0;
    cuda::CUresult r = d.cuMemAlloc(&p, bytes);
    out_of_memory = r == cuda::CUDA_ERROR_OUT_OF_MEMORY;
    cuda::check(r, fmt::format("cuMemAlloc({} bytes) on CUDA device {}", bytes, device));
    return p;
  };
  backing.release = [ctx, &d](uint64_t address) {
    try {
      cuda::ScopedContext scope(ctx);
      d.cuMemFree(address);
    } catch (const Error&) {  // nothing to do about it here
    }
  };
  auto pool = std::make_unique<kh_device_pool>();
  pool->device = device;
  pool->pool = std::make_unique<CachingPool>(fmt::format("device pool on CUDA device {}", device),
                                             std::move(backing));
  Live<kh_device_pool>::get().add(pool.get());
  return pool.release();
}

void pool_destroy(kh_device_pool* pool) {
  checked(pool, "pool");
  Live<kh_device_pool>::get().remove(pool);
  if (size_t live = pool->pool->live_blocks(); live)
    log_line(kLogWarn, fmt::format("{} destroyed with {} blocks still allocated ({} bytes): "
                                   "they are released, and pointers into them are now invalid",
                                   pool->pool->label(), live, pool->pool->stats().current_bytes));
  delete pool;
}

void* alloc(kh_device_pool* pool, uint64_t bytes) {
  return reinterpret_cast<void*>(checked(pool, "pool").pool->allocate(bytes));
}

void free(kh_device_pool* pool, void* ptr) {
  checked(pool, "pool");
  if (!ptr) throw Error(ErrorKind::kInvalidInput, "free of a NULL pointer");
  pool->pool->free(address_of(ptr));
}

uint64_t pool_trim(kh_device_pool* pool) {
  return checked(pool, "pool").pool->trim();
}

PoolStats pool_stats(const kh_device_pool* pool) {
  return checked(pool, "pool").pool->stats();
}

// ---- streams ----

kh_device_stream* stream_create(int device) {
  const cuda::DeviceInfo& dev = device_info(device);
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuStreamCreate || !d.cuStreamDestroy || !d.cuStreamSynchronize)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver has no cuStreamCreate");
  cuda::ScopedContext scope(dev.primary_context);
  auto s = std::make_unique<kh_device_stream>();
  s->device = device;
  cuda::check(d.cuStreamCreate(&s->handle, cuda::CU_STREAM_NON_BLOCKING),
              fmt::format("cuStreamCreate(CUDA device {})", device));
  Live<kh_device_stream>::get().add(s.get());
  return s.release();
}

void stream_destroy(kh_device_stream* stream) {
  checked(stream, "stream");
  Live<kh_device_stream>::get().remove(stream);
  cuda::ScopedContext scope(cuda::device(stream->device).primary_context);
  // cuStreamDestroy returns at once; work already queued still completes.
  cuda::cuda_driver().cuStreamDestroy(stream->handle);
  delete stream;
}

void stream_synchronize(kh_device_stream* stream) {
  checked(stream, "stream");
  cuda::check(cuda::cuda_driver().cuStreamSynchronize(stream->handle),
              fmt::format("cuStreamSynchronize(stream of CUDA device {})", stream->device));
}

void stream_wait_event(kh_device_stream* stream, kh_device_event* event) {
  checked(stream, "stream");
  checked(event, "event");
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuStreamWaitEvent)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver has no cuStreamWaitEvent");
  cuda::check(d.cuStreamWaitEvent(stream->handle, event->handle, 0),
              fmt::format("cuStreamWaitEvent(stream of CUDA device {}, event of CUDA device {})",
                          stream->device, event->device));
}

// ---- copies ----

void copy_async(void* dst, const void* src, uint64_t bytes, int32_t kind,
                kh_device_stream* stream) {
  checked(stream, "stream");
  const char* kind_name = kind == KH_COPY_H2D   ? "host-to-device copy"
                          : kind == KH_COPY_D2H ? "device-to-host copy"
                          : kind == KH_COPY_D2D ? "device-to-device copy"
                                                : nullptr;
  if (!kind_name)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("copy kind {}: use KH_COPY_H2D, KH_COPY_D2H or KH_COPY_D2D", kind));
  if (!dst || !src)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} with a NULL {}", kind_name, dst ? "source" : "destination"));
  if (bytes == 0)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{} of 0 bytes: ask for at least one byte", kind_name));
  const int device = stream->device;
  if (kind != KH_COPY_H2D)
    check_device_range(src, bytes, device, fmt::format("{} from", kind_name));
  if (kind != KH_COPY_D2H) check_device_range(dst, bytes, device, fmt::format("{} to", kind_name));
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuMemcpyHtoDAsync || !d.cuMemcpyDtoHAsync || !d.cuMemcpyDtoDAsync)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver has no cuMemcpy*Async");
  cuda::ScopedContext scope(cuda::device(device).primary_context);
  cuda::CUresult r = cuda::CUDA_SUCCESS;
  if (kind == KH_COPY_H2D)
    r = d.cuMemcpyHtoDAsync(address_of(dst), src, bytes, stream->handle);
  else if (kind == KH_COPY_D2H)
    r = d.cuMemcpyDtoHAsync(dst, address_of(src), bytes, stream->handle);
  else
    r = d.cuMemcpyDtoDAsync(address_of(dst), address_of(src), bytes, stream->handle);
  cuda::check(r, fmt::format("{} of {} bytes ({} -> {}) on CUDA device {}", kind_name, bytes, src,
                             static_cast<const void*>(dst), device));
}

void memset_async(void* dst, uint8_t value, uint64_t bytes, kh_device_stream* stream) {
  checked(stream, "stream");
  if (!dst) throw Error(ErrorKind::kInvalidInput, "memset of a NULL pointer");
  if (bytes == 0)
    throw Error(ErrorKind::kInvalidInput, "memset of 0 bytes: ask for at least one byte");
  check_device_range(dst, bytes, stream->device, "memset of");
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuMemsetD8Async)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver has no cuMemsetD8Async");
  cuda::ScopedContext scope(cuda::device(stream->device).primary_context);
  cuda::check(
      d.cuMemsetD8Async(address_of(dst), value, bytes, stream->handle),
      fmt::format("memset of {} bytes at {} on CUDA device {}", bytes, dst, stream->device));
}

// ---- events ----

kh_device_event* event_create(int device) {
  const cuda::DeviceInfo& dev = device_info(device);
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuEventCreate || !d.cuEventRecord || !d.cuEventSynchronize || !d.cuEventElapsedTime ||
      !d.cuEventDestroy)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver lacks the cuEvent* functions");
  cuda::ScopedContext scope(dev.primary_context);
  auto e = std::make_unique<kh_device_event>();
  e->device = device;
  cuda::check(d.cuEventCreate(&e->handle, cuda::CU_EVENT_DEFAULT),
              fmt::format("cuEventCreate(CUDA device {})", device));
  Live<kh_device_event>::get().add(e.get());
  return e.release();
}

void event_destroy(kh_device_event* event) {
  checked(event, "event");
  Live<kh_device_event>::get().remove(event);
  cuda::ScopedContext scope(cuda::device(event->device).primary_context);
  cuda::cuda_driver().cuEventDestroy(event->handle);
  delete event;
}

void event_record(kh_device_event* event, kh_device_stream* stream) {
  checked(event, "event");
  checked(stream, "stream");
  if (event->device != stream->device)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("recording an event of CUDA device {} on a stream of CUDA device {}: "
                            "create the event on the stream's device",
                            event->device, stream->device));
  cuda::check(cuda::cuda_driver().cuEventRecord(event->handle, stream->handle),
              fmt::format("cuEventRecord(CUDA device {})", event->device));
}

void event_synchronize(kh_device_event* event) {
  checked(event, "event");
  cuda::check(cuda::cuda_driver().cuEventSynchronize(event->handle),
              fmt::format("cuEventSynchronize(CUDA device {})", event->device));
}

float event_elapsed_ms(kh_device_event* start, kh_device_event* end) {
  checked(start, "start event");
  checked(end, "end event");
  if (start->device != end->device)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("elapsed time between events of CUDA devices {} and {}: both must be "
                            "of one device",
                            start->device, end->device));
  float ms = 0;
  cuda::check(cuda::cuda_driver().cuEventElapsedTime(&ms, start->handle, end->handle),
              "cuEventElapsedTime (were both events recorded and completed?)");
  return ms;
}

// ---- graphs ----

namespace {

const cuda::Driver& graph_driver() {
  const cuda::Driver& d = cuda::cuda_driver();
  if (!d.cuStreamBeginCapture || !d.cuStreamEndCapture || !d.cuGraphInstantiateWithFlags ||
      !d.cuGraphLaunch || !d.cuGraphExecDestroy || !d.cuGraphDestroy)
    throw Error(ErrorKind::kUnsupported, "the NVIDIA driver lacks the CUDA graph functions");
  return d;
}

}  // namespace

void graph_begin_capture(kh_device_stream* stream) {
  checked(stream, "stream");
  const cuda::Driver& d = graph_driver();
  cuda::ScopedContext scope(cuda::device(stream->device).primary_context);
  cuda::check(d.cuStreamBeginCapture(stream->handle, cuda::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              fmt::format("cuStreamBeginCapture(stream of CUDA device {})", stream->device));
}

kh_device_graph* graph_end_capture(kh_device_stream* stream) {
  checked(stream, "stream");
  const cuda::Driver& d = graph_driver();
  cuda::ScopedContext scope(cuda::device(stream->device).primary_context);
  auto g = std::make_unique<kh_device_graph>();
  g->device = stream->device;
  cuda::check(d.cuStreamEndCapture(stream->handle, &g->graph),
              fmt::format("cuStreamEndCapture(stream of CUDA device {}) (was a capture begun on "
                          "this stream, and did every call during it allow capturing?)",
                          stream->device));
  Live<kh_device_graph>::get().add(g.get());
  return g.release();
}

void graph_instantiate(kh_device_graph* graph) {
  checked(graph, "graph");
  if (graph->exec)
    throw Error(ErrorKind::kInvalidInput, "graph already instantiated: launch it, or destroy it");
  const cuda::Driver& d = graph_driver();
  cuda::ScopedContext scope(cuda::device(graph->device).primary_context);
  cuda::check(d.cuGraphInstantiateWithFlags(&graph->exec, graph->graph, 0),
              fmt::format("cuGraphInstantiateWithFlags(CUDA device {})", graph->device));
}

void graph_launch(kh_device_graph* graph, kh_device_stream* stream) {
  checked(graph, "graph");
  checked(stream, "stream");
  if (!graph->exec)
    throw Error(ErrorKind::kInvalidInput,
                "launch of a graph that was not instantiated: call kh_device_graph_instantiate "
                "once first");
  if (graph->device != stream->device)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("launch of a graph of CUDA device {} on a stream of CUDA device {}",
                            graph->device, stream->device));
  const cuda::Driver& d = graph_driver();
  cuda::ScopedContext scope(cuda::device(graph->device).primary_context);
  cuda::check(d.cuGraphLaunch(graph->exec, stream->handle),
              fmt::format("cuGraphLaunch(CUDA device {})", graph->device));
}

void graph_destroy(kh_device_graph* graph) {
  checked(graph, "graph");
  Live<kh_device_graph>::get().remove(graph);
  const cuda::Driver& d = graph_driver();
  cuda::ScopedContext scope(cuda::device(graph->device).primary_context);
  if (graph->exec) d.cuGraphExecDestroy(graph->exec);
  if (graph->graph) d.cuGraphDestroy(graph->graph);
  delete graph;
}

// ---- runtime modules ----

kh_device_module* module_from_source(int device, const std::string& name, const std::string& source,
                                     const std::vector<std::string>& options) {
  if (name.empty())
    throw Error(ErrorKind::kInvalidInput,
                "a runtime module needs a name (it names the source in NVRTC's messages)");
  if (source.empty())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("runtime module {}: the source is empty", name));
  const cuda::DeviceInfo& dev = device_info(device);
  const CudaArch target = nvrtc_target(CudaArch{dev.sm_major, dev.sm_minor, 0});
  const std::string file_name = name + ".cu";
  CudaDeviceBackend::SourceBuild build = CudaDeviceBackend::instance().build_source(
      source, file_name, fmt::format("{} (runtime module)", file_name), target, options);
  auto m = std::make_unique<kh_device_module>();
  m->device = device;
  m->name = name;
  m->description = build.description;
  m->library = build.library;
  log_line(kLogDebug,
           fmt::format("runtime module {} on CUDA device {}: {}", name, device, build.description));
  Live<kh_device_module>::get().add(m.get());
  return m.release();
}

void module_destroy(kh_device_module* module) {
  checked(module, "module");
  Live<kh_device_module>::get().remove(module);
  for (auto& [name, f] : module->functions) Live<kh_device_function>::get().remove(f.get());
  delete module;  // the CUlibrary stays loaded (CudaDeviceBackend::Library)
}

kh_device_function* module_get_function(kh_device_module* module, const std::string& kernel) {
  checked(module, "module");
  if (kernel.empty()) throw Error(ErrorKind::kInvalidInput, "kernel name is empty");
  std::lock_guard lock(module->mutex);
  if (auto it = module->functions.find(kernel); it != module->functions.end())
    return it->second.get();
  auto f = std::make_unique<kh_device_function>();
  f->module = module;
  std::string error;
  int32_t status = find_device_function(
      module->library->handle, cuda::device(module->device).primary_context, module->device, kernel,
      fmt::format("runtime module {}: {}", module->name, module->description), *f, error);
  if (status != KH_OK)
    throw Error(status == KH_ERR_NOT_FOUND ? ErrorKind::kNotFound : ErrorKind::kIo, error);
  kh_device_function* raw = f.get();
  module->functions.emplace(kernel, std::move(f));
  Live<kh_device_function>::get().add(raw);
  return raw;
}

int32_t launch(const kh_device_function* function, const kh_launch_cfg_t* cfg, void** args,
               kh_device_stream* stream, std::string& error) {
  checked(function, "function");
  checked(stream, "stream");
  kh_launch_cfg_t c;
  if (int32_t status = read_launch_cfg(cfg, c, error); status != KH_OK) return status;
  if (stream->device != function->device) {
    error = fmt::format(
        "launch of {} (a function of CUDA device {}) on a stream of CUDA device {}: get the "
        "function from a module of the stream's device",
        function->name, function->device, stream->device);
    return KH_ERR_INVALID_ARGUMENT;
  }
  // The launch path takes the DeviceFunction base (as void*: the packages' opaque handle).
  DeviceFunction* base = const_cast<kh_device_function*>(function);
  return launch_device_function(base, c, args, stream->handle, error);
}

}  // namespace kh::device_api
