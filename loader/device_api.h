// The device API of kernel_hub.h (kh_device_*), in C++: the objects behind its opaque handles and
// the calls, each throwing kh::Error (registry/embed/c_api_device.cpp turns them into statuses).
// Everything goes through the lazily loaded driver (cuda_driver.h) in the device's primary
// context; memory through CachingPool (device_pool.h); runtime modules through the one NVRTC +
// JIT cache path of packages (CudaDeviceBackend::build_source) and launches through the one
// launch path (device_function.h).
//
// Every handle is checked against the live objects of its kind (a destroyed one is refused with
// kInvalidInput), so a stale handle is an error message, not a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.h"
#include "loader/cuda_driver.h"
#include "loader/device_backend.h"
#include "loader/device_function.h"
#include "loader/device_pool.h"

struct kh_device_pool {
  int device = -1;
  std::unique_ptr<kh::CachingPool> pool;
};

struct kh_device_stream {
  int device = -1;
  kh::cuda::CUstream handle = nullptr;
};

struct kh_device_event {
  int device = -1;
  kh::cuda::CUevent handle = nullptr;
};

struct kh_device_graph {
  int device = -1;
  kh::cuda::CUgraph graph = nullptr;
  kh::cuda::CUgraphExec exec = nullptr;  // set by instantiate
};

struct kh_device_function : kh::DeviceFunction {
  const kh_device_module* module = nullptr;
};

struct kh_device_module {
  int device = -1;
  std::string name;
  std::string description;  // how it was built (NVRTC version, target, JIT cache hit or miss)
  const kh::CudaDeviceBackend::Library* library = nullptr;
  std::mutex mutex;  // functions
  std::map<std::string, std::unique_ptr<kh_device_function>, std::less<>> functions;
};

namespace kh::device_api {

int device_count();
void mem_info(int device, uint64_t& free_bytes, uint64_t& total_bytes);
// What `device` is and holds (kh_device_info_t, checked as the device-info service checks it:
// the packages' answer). Throws kInvalidInput for a bad ordinal or struct (NULL, smaller than
// ABI 1.4's), kUnsupported for another ABI major, kNotFound without a driver or that device;
// the struct is checked before the driver is loaded.
void get_info(int device, kh_device_info_t* info);

kh_device_pool* pool_create(int device);
void pool_destroy(kh_device_pool* pool);
void* alloc(kh_device_pool* pool, uint64_t bytes);
void free(kh_device_pool* pool, void* ptr);
uint64_t pool_trim(kh_device_pool* pool);
PoolStats pool_stats(const kh_device_pool* pool);

kh_device_stream* stream_create(int device);
void stream_destroy(kh_device_stream* stream);
void stream_synchronize(kh_device_stream* stream);
void stream_wait_event(kh_device_stream* stream, kh_device_event* event);

void copy_async(void* dst, const void* src, uint64_t bytes, int32_t kind, kh_device_stream* stream);
void memset_async(void* dst, uint8_t value, uint64_t bytes, kh_device_stream* stream);

kh_device_event* event_create(int device);
void event_destroy(kh_device_event* event);
void event_record(kh_device_event* event, kh_device_stream* stream);
void event_synchronize(kh_device_event* event);
float event_elapsed_ms(kh_device_event* start, kh_device_event* end);

void graph_begin_capture(kh_device_stream* stream);
kh_device_graph* graph_end_capture(kh_device_stream* stream);
void graph_instantiate(kh_device_graph* graph);
void graph_launch(kh_device_graph* graph, kh_device_stream* stream);
void graph_destroy(kh_device_graph* graph);

kh_device_module* module_from_source(int device, const std::string& name, const std::string& source,
                                     const std::vector<std::string>& options);
void module_destroy(kh_device_module* module);
kh_device_function* module_get_function(kh_device_module* module, const std::string& kernel);
// KH_OK or the launch path's status with `error` set (invalid handles throw kInvalidInput).
int32_t launch(const kh_device_function* function, const kh_launch_cfg_t* cfg, void** args,
               kh_device_stream* stream, std::string& error);

}  // namespace kh::device_api
