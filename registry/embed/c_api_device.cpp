// The C device API (kernel_hub.h, "Device API") over loader/device_api.h: arguments the C side
// alone can get wrong (NULL outputs, negative counts) are refused here, the rest there; every
// exception becomes a status and this thread's message (c_guard.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.h"
#include "loader/device_api.h"
#include "registry/embed/c_guard.h"

namespace api = kh::device_api;
using kh::capi::guarded;
using kh::capi::null_argument;
using kh::capi::t_last_error;

extern "C" {

int32_t kh_device_count(int32_t* count_out) {
  if (!count_out) return null_argument("count_out");
  return guarded([&] { *count_out = api::device_count(); });
}

int32_t kh_device_mem_info(int32_t device, uint64_t* free_out, uint64_t* total_out) {
  if (!free_out) return null_argument("free_out");
  if (!total_out) return null_argument("total_out");
  return guarded([&] { api::mem_info(device, *free_out, *total_out); });
}

int32_t kh_device_get_info(int32_t device, kh_device_info_t* info) {
  if (!info) return null_argument("info");
  return guarded([&] { api::get_info(device, info); });
}

int32_t kh_device_pool_create(int32_t device, kh_device_pool_t** pool_out) {
  if (!pool_out) return null_argument("pool_out");
  *pool_out = nullptr;
  return guarded([&] { *pool_out = api::pool_create(device); });
}

int32_t kh_device_pool_destroy(kh_device_pool_t* pool) {
  return guarded([&] { api::pool_destroy(pool); });
}

int32_t kh_device_alloc(kh_device_pool_t* pool, uint64_t bytes, void** ptr_out) {
  if (!ptr_out) return null_argument("ptr_out");
  *ptr_out = nullptr;
  return guarded([&] { *ptr_out = api::alloc(pool, bytes); });
}

int32_t kh_device_free(kh_device_pool_t* pool, void* ptr) {
  return guarded([&] { api::free(pool, ptr); });
}

int32_t kh_device_pool_trim(kh_device_pool_t* pool, uint64_t* released_out) {
  return guarded([&] {
    uint64_t released = api::pool_trim(pool);
    if (released_out) *released_out = released;
  });
}

int32_t kh_device_pool_stats(const kh_device_pool_t* pool, kh_device_pool_stats_t* stats) {
  if (!stats) return null_argument("stats");
  if (stats->struct_size < 2 * sizeof(uint32_t)) {
    t_last_error = fmt::format(
        "kh_device_pool_stats_t.struct_size is {}: set it to sizeof(kh_device_pool_stats_t)",
        stats->struct_size);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return guarded([&] {
    kh::PoolStats s = api::pool_stats(pool);
    kh_device_pool_stats_t full{};
    full.struct_size = static_cast<uint32_t>(sizeof(full));
    full.current_bytes = s.current_bytes;
    full.peak_bytes = s.peak_bytes;
    full.reserved_bytes = s.reserved_bytes;
    full.cached_bytes = s.cached_bytes;
    full.allocations = s.allocations;
    full.reuses = s.reuses;
    full.driver_allocations = s.backing_allocations;
    // A caller compiled against an older header has a shorter struct: fill what it has, keep
    // its struct_size.
    const uint32_t size = std::min<uint32_t>(stats->struct_size, sizeof(full));
    const uint32_t caller_size = stats->struct_size;
    std::memcpy(stats, &full, size);
    stats->struct_size = caller_size;
  });
}

int32_t kh_device_stream_create(int32_t device, kh_device_stream_t** stream_out) {
  if (!stream_out) return null_argument("stream_out");
  *stream_out = nullptr;
  return guarded([&] { *stream_out = api::stream_create(device); });
}

int32_t kh_device_stream_destroy(kh_device_stream_t* stream) {
  return guarded([&] { api::stream_destroy(stream); });
}

int32_t kh_device_stream_synchronize(kh_device_stream_t* stream) {
  return guarded([&] { api::stream_synchronize(stream); });
}

int32_t kh_device_stream_wait_event(kh_device_stream_t* stream, kh_device_event_t* event) {
  return guarded([&] { api::stream_wait_event(stream, event); });
}

void* kh_device_stream_handle(const kh_device_stream_t* stream) {
  return stream ? static_cast<void*>(stream->handle) : nullptr;
}

int32_t kh_device_copy_async(void* dst, const void* src, uint64_t bytes, int32_t kind,
                             kh_device_stream_t* stream) {
  return guarded([&] { api::copy_async(dst, src, bytes, kind, stream); });
}

int32_t kh_device_memset_async(void* dst, uint8_t value, uint64_t bytes,
                               kh_device_stream_t* stream) {
  return guarded([&] { api::memset_async(dst, value, bytes, stream); });
}

int32_t kh_device_event_create(int32_t device, kh_device_event_t** event_out) {
  if (!event_out) return null_argument("event_out");
  *event_out = nullptr;
  return guarded([&] { *event_out = api::event_create(device); });
}

int32_t kh_device_event_destroy(kh_device_event_t* event) {
  return guarded([&] { api::event_destroy(event); });
}

int32_t kh_device_event_record(kh_device_event_t* event, kh_device_stream_t* stream) {
  return guarded([&] { api::event_record(event, stream); });
}

int32_t kh_device_event_synchronize(kh_device_event_t* event) {
  return guarded([&] { api::event_synchronize(event); });
}

int32_t kh_device_event_elapsed_ms(kh_device_event_t* start, kh_device_event_t* end,
                                   float* ms_out) {
  if (!ms_out) return null_argument("ms_out");
  return guarded([&] { *ms_out = api::event_elapsed_ms(start, end); });
}

int32_t kh_device_graph_begin_capture(kh_device_stream_t* stream) {
  return guarded([&] { api::graph_begin_capture(stream); });
}

int32_t kh_device_graph_end_capture(kh_device_stream_t* stream, kh_device_graph_t** graph_out) {
  if (!graph_out) return null_argument("graph_out");
  *graph_out = nullptr;
  return guarded([&] { *graph_out = api::graph_end_capture(stream); });
}

int32_t kh_device_graph_instantiate(kh_device_graph_t* graph) {
  return guarded([&] { api::graph_instantiate(graph); });
}

int32_t kh_device_graph_launch(kh_device_graph_t* graph, kh_device_stream_t* stream) {
  return guarded([&] { api::graph_launch(graph, stream); });
}

int32_t kh_device_graph_destroy(kh_device_graph_t* graph) {
  return guarded([&] { api::graph_destroy(graph); });
}

int32_t kh_device_module_from_source(int32_t device, const char* name, const char* source,
                                     const char* const* options, int32_t num_options,
                                     kh_device_module_t** module_out) {
  if (!module_out) return null_argument("module_out");
  *module_out = nullptr;
  if (!name) return null_argument("module name");
  if (!source) return null_argument("source");
  if (num_options < 0 || (num_options > 0 && !options)) {
    t_last_error = fmt::format(
        "num_options is {} with options {}: give an array of that many "
        "option strings, or 0",
        num_options, static_cast<const void*>(options));
    return KH_ERR_INVALID_ARGUMENT;
  }
  std::vector<std::string> opts;
  for (int32_t i = 0; i < num_options; ++i) {
    if (!options[i]) {
      t_last_error = fmt::format("options[{}] is NULL", i);
      return KH_ERR_INVALID_ARGUMENT;
    }
    opts.emplace_back(options[i]);
  }
  return guarded([&] { *module_out = api::module_from_source(device, name, source, opts); });
}

int32_t kh_device_module_destroy(kh_device_module_t* module) {
  return guarded([&] { api::module_destroy(module); });
}

int32_t kh_device_module_get_function(kh_device_module_t* module, const char* kernel,
                                      kh_device_function_t** function_out) {
  if (!function_out) return null_argument("function_out");
  *function_out = nullptr;
  if (!kernel) return null_argument("kernel name");
  return guarded([&] { *function_out = api::module_get_function(module, kernel); });
}

int32_t kh_device_launch(const kh_device_function_t* function, const kh_launch_cfg_t* cfg,
                         void** args, kh_device_stream_t* stream) {
  int32_t launch_status = KH_OK;
  int32_t status = guarded([&] {
    std::string error;
    launch_status = api::launch(function, cfg, args, stream, error);
    if (launch_status != KH_OK) t_last_error = error;
  });
  return status != KH_OK ? status : launch_status;
}

}  // extern "C"
