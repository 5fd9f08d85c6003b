#include "loader/layer_table.h"

#include <deque>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/log.h"

namespace kh {

struct LayerTable::Storage {
  Table table;
  std::vector<SlotEntry> entries;
  std::deque<std::string> labels;  // deque: push_back keeps earlier c_str() pointers valid
};

namespace {

SlotEntry entry_for(const SlotOps& ops, Mode mode, bool is_fallback, const char* source) {
  SlotEntry e;
  e.forward = (mode == Mode::kTrain && ops.forward_train) ? ops.forward_train : ops.forward;
  e.backward = ops.backward;
  e.flags = ops.flags;
  e.is_fallback = is_fallback;
  e.source = source;
  return e;
}

std::string device_name(int device) {
  return device == kCpuDevice ? "cpu" : fmt::format("cuda:{}", device);
}

}  // namespace

const char* mode_name(Mode mode) {
  return mode == Mode::kTrain ? "train" : "eval";
}

LayerTable::LayerTable() {
  std::lock_guard lock(mutex_);
  rebuild_locked();
}

LayerTable::~LayerTable() = default;

uint32_t LayerTable::add_slot(const std::string& name, SlotOps fallback) {
  std::lock_guard lock(mutex_);
  if (name.empty()) throw Error(ErrorKind::kInvalidInput, "a layer slot needs a non-empty name");
  for (const auto& s : slots_)
    if (s.name == name)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("layer slot {} already exists; slot names must be unique", name));
  slots_.push_back({name, fallback});
  rebuild_locked();
  return static_cast<uint32_t>(slots_.size() - 1);
}

int LayerTable::find_slot(const std::string& name) const {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].name == name) return static_cast<int>(i);
  return -1;
}

std::string LayerTable::slot_name(uint32_t slot) const {
  std::lock_guard lock(mutex_);
  return slots_.at(slot).name;  // names are never removed or changed
}

uint32_t LayerTable::num_slots() const {
  std::lock_guard lock(mutex_);
  return static_cast<uint32_t>(slots_.size());
}

BindOutcome LayerTable::bind(uint32_t slot, int device, Mode mode, const SlotOps& ops,
                             const std::string& source, bool strict,
                             std::shared_ptr<const BindingInfo> info) {
  std::lock_guard lock(mutex_);
  if (slot >= slots_.size())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("no layer slot {} (the table has {})", slot, slots_.size()));
  if (device < kCpuDevice || device > kMaxDeviceIndex)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device index {} is out of range (-1 for cpu, 0..{} for CUDA)", device,
                            kMaxDeviceIndex));
  const std::string& name = slots_[slot].name;
  if (!ops.forward)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("binding {} to slot {} needs a forward function", source, name));
  if (mode == Mode::kTrain && (!(ops.flags & KH_FLAG_HAS_BACKWARD) || !ops.backward)) {
    std::string why =
        fmt::format("slot {} ({}, {}): {} has no backward op, so it cannot serve train mode", name,
                    mode_name(mode), device_name(device), source);
    if (strict)
      throw Error(ErrorKind::kRefused,
                  why +
                      "; bind it for eval only, or choose a package whose layer has "
                      "HAS_BACKWARD");
    log_line(kLogWarn, why + "; keeping the built-in fallback");
    return BindOutcome::kKeptFallback;
  }
  if (info) infos_.push_back(info);
  bindings_[{slot, device, mode}] = {ops, source, std::move(info)};
  if (device > max_device_) max_device_ = device;
  rebuild_locked();
  return BindOutcome::kBound;
}

const BindingInfo* LayerTable::binding(uint32_t slot, int device, Mode mode, bool* bound) const {
  static const BindingInfo kNoInfo;
  std::lock_guard lock(mutex_);
  if (slot >= slots_.size())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("no layer slot {} (the runtime has {})", slot, slots_.size()));
  auto it = bindings_.find({slot, device, mode});
  *bound = it != bindings_.end();
  if (!*bound) return nullptr;
  return it->second.info ? it->second.info.get() : &kNoInfo;
}

void LayerTable::set_mode(Mode mode) {
  if (capturing_.load(std::memory_order_acquire))
    throw Error(ErrorKind::kRefused,
                fmt::format("cannot switch to {} mode while a CUDA graph capture is in progress; "
                            "end the capture, then switch",
                            mode_name(mode)));
  current_.store(by_mode_[static_cast<int>(mode)].load(std::memory_order_acquire),
                 std::memory_order_release);
}

void LayerTable::rebuild_locked() {
  const Table* now = current_.load(std::memory_order_acquire);
  Mode active = now ? now->mode : Mode::kEval;
  const uint32_t n = static_cast<uint32_t>(slots_.size());
  const uint32_t rows = static_cast<uint32_t>(max_device_ + 3);  // cpu, 0..max, unbound
  for (Mode mode : {Mode::kEval, Mode::kTrain}) {
    auto storage = std::make_unique<Storage>();
    storage->entries.reserve(static_cast<size_t>(rows) * n);
    for (uint32_t row = 0; row < rows; ++row) {
      int device = static_cast<int>(row) - 1;
      bool unbound_row = row == rows - 1;
      for (uint32_t s = 0; s < n; ++s) {
        auto it = unbound_row ? bindings_.end() : bindings_.find({s, device, mode});
        if (it == bindings_.end()) {
          storage->entries.push_back(entry_for(slots_[s].fallback, mode, true, "fallback"));
        } else {
          storage->labels.push_back(it->second.source);
          storage->entries.push_back(
              entry_for(it->second.ops, mode, false, storage->labels.back().c_str()));
        }
      }
    }
    storage->table = {++generation_, mode, n, rows, storage->entries.data()};
    by_mode_[static_cast<int>(mode)].store(&storage->table, std::memory_order_release);
    arena_.push_back(std::move(storage));
  }
  current_.store(by_mode_[static_cast<int>(active)].load(std::memory_order_relaxed),
                 std::memory_order_release);
}

}  // namespace kh
