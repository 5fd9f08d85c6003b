#include "loader/host_services.h"

#include <atomic>

#include <fmt/format.h>

#include "hub/base/log.h"
#include "loader/device_info_service.h"
#include "loader/gemm_service.h"
#include "loader/launch_config.h"
#include "loader/tensor_map_service.h"

namespace kh {

namespace {

std::atomic<DeviceBackend*> g_backend{nullptr};

thread_local std::string t_op_error;

HostContext* context_of(void* ctx) {
  return static_cast<HostContext*>(ctx);
}

std::string package_label(const HostContext* c) {
  if (!c->package.name.empty()) return c->package.name + " " + c->package.version;
  return c->package.library.string();
}

void host_log(void* ctx, int32_t level, const char* msg) {
  auto* c = context_of(ctx);
  log_line(level, fmt::format("[{}] {}", package_label(c), msg ? msg : "(null)"));
}

void host_set_error(void* ctx, const char* msg) {
  auto* c = context_of(ctx);
  t_op_error = fmt::format("{}: {}", package_label(c), msg ? msg : "(no message)");
}

// No exception may cross back into the package: every path below catches.
int32_t host_get_function(void* ctx, int32_t device_id, const char* kernel_name, void** fn) {
  auto* c = context_of(ctx);
  if (!kernel_name || !fn) {
    t_op_error =
        fmt::format("{}: get_function called with a null name or output pointer", package_label(c));
    return KH_ERR_INVALID_ARGUMENT;
  }
  *fn = nullptr;
  DeviceBackend* backend = g_backend.load(std::memory_order_acquire);
  if (!backend) {
    t_op_error = fmt::format(
        "{}: no device code backend yet: this loader build cannot load or JIT-compile device "
        "code, so kernel {} cannot run on CUDA device {}; pass cpu tensors (bind the cpu "
        "device) instead",
        package_label(c), kernel_name, device_id);
    return KH_ERR_NO_DEVICE;
  }
  try {
    std::string error;
    int32_t status = backend->get_function(c->package, device_id, kernel_name, fn, error);
    if (status != KH_OK) t_op_error = fmt::format("{}: {}", package_label(c), error);
    return status;
  } catch (const std::exception& e) {
    t_op_error = fmt::format("{}: get_function({}): {}", package_label(c), kernel_name, e.what());
    return KH_ERR_INTERNAL;
  }
}

int32_t host_launch(void* ctx, void* fn, const kh_launch_cfg_t* in, void** args, void* stream) {
  auto* c = context_of(ctx);
  if (!fn) {
    t_op_error = fmt::format("{}: launch called with a null function", package_label(c));
    return KH_ERR_INVALID_ARGUMENT;
  }
  // The backend sees a whole kh_launch_cfg_t of this loader's ABI: fields a package of an older
  // minor did not write are 0.
  try {
    kh_launch_cfg_t cfg;
    std::string error;
    if (int32_t status = read_launch_cfg(in, cfg, error); status != KH_OK) {
      t_op_error = fmt::format("{}: {}", package_label(c), error);
      return status;
    }
    DeviceBackend* backend = g_backend.load(std::memory_order_acquire);
    if (!backend) {
      t_op_error = fmt::format("{}: no device code backend yet: cannot launch on CUDA device {}",
                               package_label(c), cfg.device_id);
      return KH_ERR_NO_DEVICE;
    }
    int32_t status = backend->launch(c->package, fn, cfg, args, stream, error);
    if (status != KH_OK) t_op_error = fmt::format("{}: {}", package_label(c), error);
    return status;
  } catch (const std::exception& e) {
    t_op_error = fmt::format("{}: launch: {}", package_label(c), e.what());
    return KH_ERR_INTERNAL;
  }
}

int32_t host_gemm(void* ctx, const kh_gemm_t* g, void* stream) {
  auto* c = context_of(ctx);
  std::string error;
  int32_t status = run_gemm(g, stream, error);
  if (status != KH_OK) t_op_error = fmt::format("{}: gemm: {}", package_label(c), error);
  return status;
}

int32_t host_tensor_map(void* ctx, const kh_tensor_map_t* req, void* map) {
  auto* c = context_of(ctx);
  std::string error;
  int32_t status = encode_tensor_map(req, map, error);
  if (status != KH_OK) t_op_error = fmt::format("{}: tensor_map: {}", package_label(c), error);
  return status;
}

int32_t host_device_info(void* ctx, int32_t device_id, kh_device_info_t* info) {
  auto* c = context_of(ctx);
  std::string error;
  int32_t status = query_device_info(device_id, info, error);
  if (status != KH_OK) t_op_error = fmt::format("{}: device_info: {}", package_label(c), error);
  return status;
}

}  // namespace

void set_device_backend(DeviceBackend* backend) {
  g_backend.store(backend, std::memory_order_release);
}

DeviceBackend* device_backend() {
  return g_backend.load(std::memory_order_acquire);
}

HostContext* make_host_context(PackageIdentity package) {
  auto* c = new HostContext{std::move(package), {}};  // never freed: packages keep the pointer
  c->table.h = KH_HEADER_INIT(kh_host_v1_t);
  c->table.ctx = c;
  c->table.log = host_log;
  c->table.set_error = host_set_error;
  c->table.get_function = host_get_function;
  c->table.launch = host_launch;
  c->table.gemm = host_gemm;
  c->table.tensor_map = host_tensor_map;
  c->table.device_info = host_device_info;
  return c;
}

const std::string& last_op_error() {
  return t_op_error;
}
void set_last_op_error(std::string message) {
  t_op_error = std::move(message);
}
void clear_last_op_error() {
  t_op_error.clear();
}

}  // namespace kh
