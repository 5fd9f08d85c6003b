// ThreadSanitizer stress of the layer table (built with -fsanitize=thread; not GoogleTest so the
// binary holds only instrumented code). 8 reader threads call through the published table while
// the main thread rebinds (building and publishing new tables) and then flips train/eval 10^6
// times. Every call must see a coherent (generation, mode, function); TSan must stay silent
// (any report makes the process exit non-zero).
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "loader/layer_table.h"

namespace {

int32_t eval_fn(const kh_arg_t*, int32_t, void*) {
  return 100;
}
int32_t train_fn(const kh_arg_t*, int32_t, void*) {
  return 200;
}
int32_t bwd_fn(const kh_arg_t*, int32_t, void*) {
  return 300;
}
int32_t eval_fn2(const kh_arg_t*, int32_t, void*) {
  return 101;
}

}  // namespace

int main() {
  using kh::Mode;
  kh::LayerTable table;
  constexpr int kSlots = 8;
  for (int i = 0; i < kSlots; ++i) table.add_slot("slot" + std::to_string(i), {});
  for (uint32_t s = 0; s < kSlots; ++s) {
    table.bind(s, kh::kCpuDevice, Mode::kEval, {eval_fn, nullptr, nullptr, 0}, "eval", true);
    table.bind(s, kh::kCpuDevice, Mode::kTrain, {eval_fn, train_fn, bwd_fn, KH_FLAG_HAS_BACKWARD},
               "train", true);
  }

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0}, incoherent{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 8; ++r) {
    readers.emplace_back([&, r] {
      uint64_t n = 0, bad = 0;
      uint32_t slot = static_cast<uint32_t>(r % kSlots);
      while (!stop.load(std::memory_order_relaxed)) {
        const kh::Table* t = table.current();  // once per "step"
        const kh::SlotEntry& e = t->entry(kh::kCpuDevice, slot);
        int32_t got = e.forward(nullptr, 0, nullptr);
        bool ok = t->mode == Mode::kTrain ? (got == 200 && e.backward == bwd_fn)
                                          : (got == 100 || got == 101);
        bad += ok ? 0 : 1;
        ++n;
      }
      calls.fetch_add(n);
      incoherent.fetch_add(bad);
    });
  }

  // Phase 1: rebinding publishes new tables while readers run.
  for (int i = 0; i < 2000; ++i)
    table.bind(static_cast<uint32_t>(i % kSlots), kh::kCpuDevice, Mode::kEval,
               {(i & 1) ? eval_fn2 : eval_fn, nullptr, nullptr, 0}, "eval", true);
  // Phase 2: 10^6 mode flips.
  for (int i = 0; i < 1'000'000; ++i) table.set_mode((i & 1) ? Mode::kEval : Mode::kTrain);
  stop.store(true);
  for (auto& t : readers) t.join();

  std::printf("loader_tsan_stress: %llu calls, %llu incoherent, final mode %s\n",
              static_cast<unsigned long long>(calls.load()),
              static_cast<unsigned long long>(incoherent.load()), kh::mode_name(table.mode()));
  if (incoherent.load() != 0 || calls.load() == 0) return 1;
  return 0;
}
