// The C embedding API over kh::Runtime: exceptions become statuses plus a thread-local message.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "hub/base/error.h"
#include "loader/host_services.h"
#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"
// kernelize lives in the registry (which builds on the loader); only this shared library joins
// the two, so kh_loader itself never depends on kh_registry.
#include "registry/kernelize.h"

struct kh_runtime {
  kh::Runtime runtime;
};

namespace {

thread_local std::string t_last_error;

int32_t status_of(const kh::Error& e) {
  switch (e.kind()) {
    case kh::ErrorKind::kInvalidInput:
      return KH_ERR_INVALID_ARGUMENT;
    case kh::ErrorKind::kNotFound:
      return KH_ERR_NOT_FOUND;
    case kh::ErrorKind::kRefused:
      return KH_ERR_REFUSED;
    default:
      return KH_ERR_INTERNAL;
  }
}

// Runs `body`, mapping exceptions to a status and this thread's message.
template <typename F>
int32_t guarded(F&& body) noexcept {
  try {
    t_last_error.clear();
    body();
    return KH_OK;
  } catch (const kh::Error& e) {
    t_last_error = e.what();
    return status_of(e);
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return KH_ERR_INTERNAL;
  } catch (...) {
    t_last_error = "unknown exception";
    return KH_ERR_INTERNAL;
  }
}

int32_t null_argument(const char* what) {
  t_last_error = fmt::format("{} must not be NULL", what);
  return KH_ERR_INVALID_ARGUMENT;
}

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
  guarded([&] { rt = new kh_runtime{kh::Runtime(kh::RuntimeOptions{strict != 0})}; });
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
    kh::KernelConfig config = kh::KernelConfig::parse(config_json, "config_json");
    kh::Device dev = kh::parse_device_target(device ? device : "cpu");
    std::optional<kh::LockFile> lock;
    if (lock_path) lock = kh::LockFile::load(lock_path);
    kh::Store store(kh::Store::default_root());
    kh::HubOptions hub_options = kh::HubOptions::from_env();
    hub_options.progress = false;
    kh::HubAddress address =
        hub ? kh::HubAddress::parse(hub, hub_options.source.http.allow_plain_http)
            : kh::default_hub_address(store, hub_options.source.http.allow_plain_http);
    kh::Hub h(address, store, hub_options);
    kh::KernelizeOptions options;
    options.modes.clear();
    if (modes == 0 || (modes & KH_KERNELIZE_EVAL)) options.modes.push_back(kh::Mode::kEval);
    if (modes == 0 || (modes & KH_KERNELIZE_TRAIN)) options.modes.push_back(kh::Mode::kTrain);
    options.strict = strict != 0;
    options.lock = lock ? &*lock : nullptr;
    kh::KernelizeReport report = kh::kernelize(rt->runtime, config, h, dev, options);
    if (report_json) {
      std::string text = report.to_json().dump();
      char* copy = static_cast<char*>(std::malloc(text.size() + 1));
      if (!copy) throw std::bad_alloc();
      std::memcpy(copy, text.c_str(), text.size() + 1);
      *report_json = copy;
    }
  });
}

void kh_runtime_free_report(char* report_json) {
  std::free(report_json);
}

const char* kh_last_error(void) {
  return t_last_error.c_str();
}

}  // extern "C"
