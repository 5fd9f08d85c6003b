// The C embedding API (kernel_hub.h, libkernel_hub.so) over the C++ one (kernel_hub.hpp):
// exceptions become statuses (status.h, one per error kind) plus a thread-local message.
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/layer_table.h"
#include "registry/embed/c_guard.h"
#include "registry/embed/status.h"

struct kh_runtime {
  explicit kh_runtime(kh::RuntimeOptions options) : runtime(std::move(options)) {}
  kh::Runtime runtime;
  // Slot names handed out by kh_runtime_slot_binding (map nodes: the pointers stay valid).
  std::mutex names_mutex;
  std::map<uint32_t, std::string> names;
};

namespace {

using kh::capi::guarded;
using kh::capi::null_argument;
using kh::capi::t_last_error;

bool valid_mode(int32_t mode) {
  return mode == KH_MODE_EVAL || mode == KH_MODE_TRAIN;
}

int32_t call(const kh_runtime_t* rt, uint32_t slot, int32_t device, const kh_arg_t* args,
             int32_t nargs, void* stream, bool backward) {
  if (!rt) return null_argument("runtime");
  kh::clear_last_op_error();
  int32_t status = backward ? rt->runtime.backward(slot, device, args, nargs, stream)
                            : rt->runtime.forward(slot, device, args, nargs, stream);
  if (status != KH_OK) {
    const std::string& why = kh::last_op_error();
    t_last_error =
        why.empty() ? fmt::format("op failed with status {} and no message", status) : why;
  }
  return status;
}

}  // namespace

extern "C" {

kh_runtime_t* kh_runtime_create(int32_t strict) {
  kh_runtime_t* rt = nullptr;
  guarded([&] { rt = new kh_runtime(kh::RuntimeOptions{strict != 0}); });
  return rt;
}

void kh_runtime_destroy(kh_runtime_t* rt) {
  delete rt;
}

int32_t kh_runtime_add_slot(kh_runtime_t* rt, const char* name, kh_op_fn forward,
                            kh_op_fn forward_train, kh_op_fn backward, uint32_t flags,
                            uint32_t* slot_out) {
  if (!rt) return null_argument("runtime");
  if (!name) return null_argument("slot name");
  return guarded([&] {
    uint32_t s = rt->runtime.add_slot(name, {forward, forward_train, backward, flags});
    if (slot_out) *slot_out = s;
  });
}

int32_t kh_runtime_find_slot(const kh_runtime_t* rt, const char* name, uint32_t* slot_out) {
  if (!rt) return null_argument("runtime");
  if (!name) return null_argument("slot name");
  return guarded([&] {
    auto s = rt->runtime.find_slot(name);
    if (!s) throw kh::Error(kh::ErrorKind::kNotFound, fmt::format("no layer slot named {}", name));
    if (slot_out) *slot_out = *s;
  });
}

int32_t kh_runtime_bind(kh_runtime_t* rt, const char* slot, const char* package_dir,
                        const char* layer, int32_t mode, int32_t device, int32_t* bound_out) {
  if (!rt) return null_argument("runtime");
  if (!slot) return null_argument("slot name");
  if (!package_dir) return null_argument("package directory");
  if (!valid_mode(mode)) {
    t_last_error = fmt::format("mode {} is neither KH_MODE_EVAL (0) nor KH_MODE_TRAIN (1)", mode);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return guarded([&] {
    auto outcome = rt->runtime.bind(slot, package_dir, static_cast<kh::Mode>(mode), device,
                                    layer ? layer : "");
    if (bound_out) *bound_out = outcome == kh::BindOutcome::kBound ? 1 : 0;
  });
}

int32_t kh_runtime_slot_binding(const kh_runtime_t* rt, uint32_t slot, int32_t mode, int32_t device,
                                kh_slot_binding_t* out) {
  if (!rt) return null_argument("runtime");
  if (!out) return null_argument("slot binding");
  if (out->struct_size < offsetof(kh_slot_binding_t, slot)) {
    t_last_error =
        fmt::format("kh_slot_binding_t.struct_size is {}; set it to sizeof(kh_slot_binding_t)",
                    out->struct_size);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (!valid_mode(mode)) {
    t_last_error = fmt::format("mode {} is neither KH_MODE_EVAL (0) nor KH_MODE_TRAIN (1)", mode);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return guarded([&] {
    auto* mut = const_cast<kh_runtime_t*>(rt);  // the name cache only
    bool bound = false;
    const kh::BindingInfo* info =
        rt->runtime.table().binding(slot, device, static_cast<kh::Mode>(mode), &bound);
    kh_slot_binding_t b{};
    {
      std::lock_guard lock(mut->names_mutex);
      auto it = mut->names.find(slot);
      if (it == mut->names.end()) it = mut->names.emplace(slot, rt->runtime.slot_name(slot)).first;
      b.slot = it->second.c_str();
    }
    b.bound = bound ? 1 : 0;
    b.package = info ? info->package.c_str() : "";
    b.version = info ? info->version.c_str() : "";
    b.layer = info ? info->layer.c_str() : "";
    b.forward_op = info ? info->forward_op.c_str() : "";
    b.backward_op = info ? info->backward_op.c_str() : "";
    b.package_dir = info ? info->package_dir.c_str() : "";
    b.flags = info ? info->flags : 0;
    const uint32_t size = out->struct_size;
    b.struct_size = size;
    std::memcpy(out, &b, std::min<size_t>(size, sizeof(b)));
  });
}

int32_t kh_runtime_slot_bound(const kh_runtime_t* rt, uint32_t slot, int32_t device) {
  return rt && rt->runtime.slot_bound(slot, device) ? 1 : 0;
}

int32_t kh_runtime_set_mode(kh_runtime_t* rt, int32_t mode) {
  if (!rt) return null_argument("runtime");
  if (!valid_mode(mode)) {
    t_last_error = fmt::format("mode {} is neither KH_MODE_EVAL (0) nor KH_MODE_TRAIN (1)", mode);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return guarded([&] { rt->runtime.set_mode(static_cast<kh::Mode>(mode)); });
}

int32_t kh_runtime_get_mode(const kh_runtime_t* rt) {
  return rt ? static_cast<int32_t>(rt->runtime.mode()) : -1;
}

int32_t kh_runtime_set_capturing(kh_runtime_t* rt, int32_t capturing) {
  if (!rt) return null_argument("runtime");
  rt->runtime.set_capturing(capturing != 0);
  return KH_OK;
}

int32_t kh_runtime_forward(const kh_runtime_t* rt, uint32_t slot, int32_t device,
                           const kh_arg_t* args, int32_t nargs, void* stream) {
  return call(rt, slot, device, args, nargs, stream, false);
}

int32_t kh_runtime_backward(const kh_runtime_t* rt, uint32_t slot, int32_t device,
                            const kh_arg_t* args, int32_t nargs, void* stream) {
  return call(rt, slot, device, args, nargs, stream, true);
}

int32_t kh_runtime_kernelize(kh_runtime_t* rt, const char* config_json, const char* hub,
                             const char* device, uint32_t modes, int32_t strict,
                             const char* lock_path, char** report_json) {
  if (!rt) return null_argument("runtime");
  if (!config_json) return null_argument("config_json");
  if (report_json) *report_json = nullptr;
  if (modes & ~(KH_KERNELIZE_EVAL | KH_KERNELIZE_TRAIN)) {
    t_last_error = fmt::format(
        "modes 0x{:x} has bits other than KH_KERNELIZE_EVAL (0x1) and "
        "KH_KERNELIZE_TRAIN (0x2)",
        modes);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return guarded([&] {
    kh::EmbedOptions options;
    if (hub) options.hub = hub;
    if (device) options.device = device;
    options.modes.clear();
    if (modes == 0 || (modes & KH_KERNELIZE_EVAL)) options.modes.push_back(kh::Mode::kEval);
    if (modes == 0 || (modes & KH_KERNELIZE_TRAIN)) options.modes.push_back(kh::Mode::kTrain);
    options.strict = strict != 0;
    if (lock_path) options.lock = lock_path;
    kh::EmbedReport report = kh::kernelize(rt->runtime, config_json, options);
    if (report_json) {
      char* copy = static_cast<char*>(std::malloc(report.json.size() + 1));
      if (!copy) throw std::bad_alloc();
      std::memcpy(copy, report.json.c_str(), report.json.size() + 1);
      *report_json = copy;
    }
  });
}

void kh_runtime_free_report(char* report_json) {
  std::free(report_json);
}

int32_t kh_gemm(const kh_gemm_t* g, void* stream) {
  t_last_error.clear();
  if (!g) {
    t_last_error = "kh_gemm: the request is NULL; pass a kh_gemm_t (kernel_hub_abi.h)";
    return KH_ERR_INVALID_ARGUMENT;
  }
  int32_t status = kh::gemm(*g, stream);
  if (status != KH_OK) t_last_error = kh::last_op_error();
  return status;
}

}  // extern "C"
