// kh::Runtime (kernel_hub.hpp): the embedding API over the layer table and package loading.
#include <fmt/format.h>

#include "hub/base/error.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/cuda_driver.h"
#include "loader/device_backend.h"
#include "loader/host_services.h"
#include "loader/layer_table.h"
#include "loader/loaded_package.h"

namespace kh {

Runtime::Runtime(RuntimeOptions options)
    : options_(std::move(options)), table_(std::make_unique<LayerTable>()) {
  install_cuda_device_backend();
  if (!options_.jit_cache_dir.empty())
    CudaDeviceBackend::instance().set_jit_cache_dir(options_.jit_cache_dir);
}

Runtime::~Runtime() = default;

uint32_t Runtime::add_slot(const std::string& name, SlotOps fallback) {
  return table_->add_slot(name, fallback);
}

uint32_t Runtime::num_slots() const {
  return table_->num_slots();
}

std::string Runtime::slot_name(uint32_t slot) const {
  return table_->slot_name(slot);
}

void Runtime::set_mode(Mode mode) {
  table_->set_mode(mode);
}

Mode Runtime::mode() const noexcept {
  return table_->mode();
}

void Runtime::set_capturing(bool capturing) noexcept {
  table_->set_capturing(capturing);
}

void Runtime::set_mode(Mode mode, const std::vector<void*>& streams) {
  for (void* stream : streams) {
    auto status = cuda::stream_capture_status(static_cast<cuda::CUstream>(stream));
    if (status != cuda::CU_STREAM_CAPTURE_STATUS_NONE)
      throw Error(
          ErrorKind::kRefused,
          fmt::format(
              "set_mode({}) refused: stream {} is {} a CUDA graph capture; switch "
              "modes between captures",
              mode_name(mode), stream,
              status == cuda::CU_STREAM_CAPTURE_STATUS_ACTIVE ? "in" : "in an invalidated"));
  }
  table_->set_mode(mode);
}

std::optional<uint32_t> Runtime::find_slot(const std::string& name) const {
  int i = table_->find_slot(name);
  if (i < 0) return std::nullopt;
  return static_cast<uint32_t>(i);
}

BindOutcome Runtime::bind(const std::string& slot, const std::filesystem::path& package_dir,
                          Mode mode, int device, const std::string& layer,
                          std::optional<bool> strict, const std::string& manifest_digest) {
  auto index = find_slot(slot);
  if (!index)
    throw Error(ErrorKind::kNotFound,
                fmt::format("no layer slot named {}; add it with add_slot first", slot));
  LoadedPackage p = load_package(
      package_dir, manifest_digest.empty() ? std::nullopt
                                           : std::optional<Digest>(Digest::parse(manifest_digest)));
  const ModuleView& v = p.module->view;
  const std::string layer_name = layer.empty() ? slot : layer;
  const kh_layer_v1_t* l = v.find_layer(layer_name);
  if (!l) {
    std::string have;
    for (auto* x : v.layers) have += (have.empty() ? "" : ", ") + std::string(x->name);
    throw Error(ErrorKind::kNotFound,
                fmt::format("package {} {} ({}) has no layer {}; it has: {}", v.name, v.version,
                            package_dir.string(), layer_name, have));
  }
  // The table validated that every op name resolves.
  SlotOps ops;
  ops.forward = v.find_op(l->forward)->call;
  if (l->forward_train) ops.forward_train = v.find_op(l->forward_train)->call;
  if (l->backward) ops.backward = v.find_op(l->backward)->call;
  ops.flags = l->flags;
  if (device != kCpuDevice) {
    // Device code is loaded (or compiled) at bind time, so calls and mode switches never do it.
    DeviceBackend* backend = device_backend();
    if (!backend)
      throw Error(ErrorKind::kUnsupported,
                  fmt::format("cannot bind {} to CUDA device {}: no device code backend is "
                              "installed; bind the cpu device instead",
                              slot, device));
    backend->prepare(p.module->host->package, device);
  }
  std::string source = fmt::format("{} {} {}", v.name, v.version, l->name);
  auto info = std::make_shared<BindingInfo>();
  info->package = v.name;
  info->version = v.version;
  info->layer = l->name;
  info->forward_op = (mode == Mode::kTrain && l->forward_train) ? l->forward_train : l->forward;
  info->backward_op = l->backward ? l->backward : "";
  info->package_dir = package_dir.string();
  info->flags = l->flags;
  return table_->bind(*index, device, mode, ops, source, strict.value_or(options_.strict),
                      std::move(info));
}

SlotBinding Runtime::slot_binding(uint32_t slot, int device, Mode mode) const {
  bool bound = false;
  const BindingInfo* info = table_->binding(slot, device, mode, &bound);
  SlotBinding b;
  b.slot = table_->slot_name(slot);
  b.mode = mode;
  b.device = device;
  b.bound = bound;
  if (info) {
    b.package = info->package;
    b.version = info->version;
    b.layer = info->layer;
    b.forward_op = info->forward_op;
    b.backward_op = info->backward_op;
    b.package_dir = info->package_dir;
    b.flags = info->flags;
  }
  return b;
}

bool Runtime::slot_bound(uint32_t slot, int device) const noexcept {
  const Table* t = table_->current();
  return slot < t->num_slots && !t->entry(device, slot).is_fallback;
}

int32_t Runtime::call(uint32_t slot, int device, bool backward, const kh_arg_t* args, int32_t nargs,
                      void* stream) const noexcept {
  const Table* t = table_->current();
  if (slot >= t->num_slots) {
    try {
      set_last_op_error(fmt::format("no layer slot {} (the table has {})", slot, t->num_slots));
    } catch (...) {  // out of memory while reporting: the status still says what happened
    }
    return KH_ERR_INVALID_ARGUMENT;
  }
  const SlotEntry& e = t->entry(device, slot);
  kh_op_fn fn = backward ? e.backward : e.forward;
  if (!fn) {
    try {
      set_last_op_error(fmt::format(
          "layer slot {} has no {} for device {} in {} mode: nothing bound and no fallback; "
          "bind a package layer or give the slot a fallback",
          table_->slot_name(slot), backward ? "backward" : "forward", device, mode_name(t->mode)));
    } catch (...) {
    }
    return KH_ERR_NOT_FOUND;
  }
  return fn(args, nargs, stream);
}

int32_t Runtime::forward(uint32_t slot, int device, const kh_arg_t* args, int32_t nargs,
                         void* stream) const noexcept {
  return call(slot, device, false, args, nargs, stream);
}

int32_t Runtime::backward(uint32_t slot, int device, const kh_arg_t* args, int32_t nargs,
                          void* stream) const noexcept {
  return call(slot, device, true, args, nargs, stream);
}

}  // namespace kh
