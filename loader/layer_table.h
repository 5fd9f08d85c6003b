// The layer table: named slots, each with the runtime's own implementation as fallback, bound to
// package ops per mode (eval, train) and per device. Binding builds one immutable Table per mode;
// set_mode publishes the other one with a single atomic store (release) and calls load it with
// acquire: no lock, I/O or allocation on the switch or on a call. Tables are never freed while
// the LayerTable lives (an append-only arena), so a call that loaded a table before a switch
// finishes on it safely.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"  // Mode, kCpuDevice, SlotOps, BindOutcome

namespace kh {

// Highest CUDA ordinal a slot can be bound on.
constexpr int kMaxDeviceIndex = 255;

// What one slot does on one device in one mode.
struct SlotEntry {
  kh_op_fn forward = nullptr;  // eval: forward; train: forward_train or forward
  kh_op_fn backward = nullptr;
  uint32_t flags = 0;
  bool is_fallback = true;
  const char* source = "";  // "fallback" or "<package> <version> <layer>"
};

// What a package binding is, for the slot query (Runtime::slot_binding, kh_runtime_slot_binding).
// The table keeps every one it was given for its whole life, so the C API can hand out pointers
// to these strings.
struct BindingInfo {
  std::string package, version, layer, forward_op, backward_op, package_dir;
  uint32_t flags = 0;  // the layer's KH_FLAG_*
};

struct Table {
  uint64_t generation = 0;
  Mode mode = Mode::kEval;
  uint32_t num_slots = 0;
  uint32_t num_rows = 0;  // row 0: cpu, row d+1: CUDA device d, last row: unbound devices
  const SlotEntry* entries = nullptr;

  // Never fails for a valid slot: devices without a row get the fallback row.
  const SlotEntry& entry(int device, uint32_t slot) const noexcept {
    uint32_t row = static_cast<uint32_t>(device + 1);
    if (row >= num_rows - 1) row = num_rows - 1;
    return entries[static_cast<size_t>(row) * num_slots + slot];
  }
};

class LayerTable {
 public:
  LayerTable();
  ~LayerTable();
  LayerTable(const LayerTable&) = delete;
  LayerTable& operator=(const LayerTable&) = delete;

  // Control plane. add_slot, bind and set_capturing may run concurrently with calls, but not
  // with set_mode or each other from several threads without the caller's ordering (they take
  // an internal mutex; set_mode does not).

  // Adds a slot; the name must be new. Returns its index, valid for the table's lifetime.
  uint32_t add_slot(const std::string& name, SlotOps fallback);
  // Index of a slot, or -1.
  int find_slot(const std::string& name) const;
  std::string slot_name(uint32_t slot) const;
  uint32_t num_slots() const;

  // Binds `ops` (labelled `source`) to a slot on a device for a mode, and republishes. For
  // kTrain the ops need KH_FLAG_HAS_BACKWARD and a backward function: otherwise the slot keeps
  // its fallback and a log line says why (kKeptFallback), or, when strict, kh::Error(kRefused).
  // `info` (may be null) describes the package layer for the slot query.
  BindOutcome bind(uint32_t slot, int device, Mode mode, const SlotOps& ops,
                   const std::string& source, bool strict,
                   std::shared_ptr<const BindingInfo> info = nullptr);
  // What serves the slot on the device in the mode: the package binding's description, or
  // nullptr for the fallback (a bind without info counts as bound, with empty strings). The
  // pointee lives as long as the table. Throws kh::Error kInvalidInput for an unknown slot.
  const BindingInfo* binding(uint32_t slot, int device, Mode mode, bool* bound) const;

  // Publishes the table of `mode` with one atomic store. Refused (kh::Error kRefused) while a
  // CUDA graph capture is declared in progress. No lock, no I/O, no allocation on success.
  void set_mode(Mode mode);
  Mode mode() const noexcept { return current()->mode; }

  // The runtime declares a CUDA graph capture in progress (or over).
  void set_capturing(bool capturing) noexcept {
    capturing_.store(capturing, std::memory_order_release);
  }
  bool capturing() const noexcept { return capturing_.load(std::memory_order_acquire); }

  // The published table; load once per step so a step never mixes modes.
  const Table* current() const noexcept { return current_.load(std::memory_order_acquire); }

 private:
  struct Storage;
  void rebuild_locked();

  mutable std::mutex mutex_;  // writers only
  struct Slot {
    std::string name;
    SlotOps fallback;
  };
  std::vector<Slot> slots_;
  struct Bound {
    SlotOps ops;
    std::string source;
    std::shared_ptr<const BindingInfo> info;
  };
  std::vector<std::shared_ptr<const BindingInfo>> infos_;  // every info ever bound (see binding)
  std::map<std::tuple<uint32_t, int, Mode>, Bound> bindings_;  // (slot, device, mode)
  int max_device_ = kCpuDevice;
  uint64_t generation_ = 0;
  std::vector<std::unique_ptr<Storage>> arena_;  // every table ever built
  std::atomic<const Table*> by_mode_[2];
  std::atomic<const Table*> current_{nullptr};
  std::atomic<bool> capturing_{false};
};

}  // namespace kh
