// Loader micro-benchmarks (CPU): the cost of calling an op through a bound layer slot against a
// direct call of the same function, and of set_mode on a table with 64 slots against a bare
// atomic pointer store. Prints figure, baseline, ratio; medians of repeated runs.
//   build-dir/bench_loader [repeats]
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "loader/layer_table.h"

namespace {

using Clock = std::chrono::steady_clock;

int64_t g_sink = 0;

__attribute__((noinline)) int32_t bench_op(const kh_arg_t* args, int32_t, void*) {
  g_sink += args[0].v.i;
  asm volatile("" ::: "memory");
  return KH_OK;
}

__attribute__((noinline)) int32_t bench_op_other(const kh_arg_t* args, int32_t, void*) {
  g_sink -= args[0].v.i;
  asm volatile("" ::: "memory");
  return KH_OK;
}

// Median ns per iteration of `body` run `iterations` times, over `repeats` runs.
template <typename F>
double median_ns(int repeats, int64_t iterations, F&& body) {
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    auto start = Clock::now();
    for (int64_t i = 0; i < iterations; ++i) body(i);
    std::chrono::duration<double, std::nano> d = Clock::now() - start;
    samples.push_back(d.count() / static_cast<double>(iterations));
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

void row(const char* figure, double value, const char* baseline, double base) {
  fmt::print("| {:<46} | {:>8.2f} ns | {:<30} | {:>8.2f} ns | {:>6.2f}x |\n", figure, value,
             baseline, base, value / base);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  constexpr int64_t kCalls = 2'000'000;
  constexpr int64_t kSwitches = 1'000'000;

  kh::Runtime rt;
  kh::SlotOps ops{bench_op, bench_op, bench_op, KH_FLAG_HAS_BACKWARD};
  kh::SlotOps other{bench_op_other, bench_op_other, bench_op_other, KH_FLAG_HAS_BACKWARD};
  std::vector<uint32_t> slots;
  for (int i = 0; i < 64; ++i) slots.push_back(rt.add_slot(fmt::format("slot{}", i), ops));
  // Bind a different function for train on every slot, so both tables are real bindings.
  for (uint32_t s : slots)
    rt.table().bind(s, kh::kCpuDevice, kh::Mode::kTrain, other, "bench train", true);
  rt.set_mode(kh::Mode::kEval);

  kh_arg_t arg{};
  arg.kind = KH_ARG_INT;
  arg.v.i = 1;
  kh_op_fn volatile direct_fn = bench_op;  // volatile: keep the baseline an indirect call too

  double direct = median_ns(repeats, kCalls, [&](int64_t) { bench_op(&arg, 1, nullptr); });
  double indirect = median_ns(repeats, kCalls, [&](int64_t) { direct_fn(&arg, 1, nullptr); });
  double via_runtime = median_ns(
      repeats, kCalls, [&](int64_t) { rt.forward(slots[7], kh::kCpuDevice, &arg, 1, nullptr); });
  double via_table = median_ns(repeats, kCalls, [&](int64_t) {
    const kh::Table* t = rt.table().current();
    t->entry(kh::kCpuDevice, slots[7]).forward(&arg, 1, nullptr);
  });

  std::atomic<const void*> bare{nullptr};
  const void* targets[2] = {&arg, &direct};
  double bare_store = median_ns(repeats, kSwitches, [&](int64_t i) {
    bare.store(targets[i & 1], std::memory_order_release);
  });
  double set_mode = median_ns(repeats, kSwitches, [&](int64_t i) {
    rt.set_mode((i & 1) ? kh::Mode::kTrain : kh::Mode::kEval);
  });

  fmt::print("bench_loader: median of {} runs; {} calls, {} mode switches per run\n\n", repeats,
             kCalls, kSwitches);
  fmt::print("| {:<46} | {:>11} | {:<30} | {:>11} | {:>7} |\n", "figure", "value", "baseline",
             "baseline", "ratio");
  fmt::print("|{:-<48}|{:-<13}|{:-<32}|{:-<13}|{:-<9}|\n", "", "", "", "", "");
  row("call via Runtime::forward (slot, cpu)", via_runtime, "direct call", direct);
  row("call via Table::entry (table loaded per call)", via_table, "direct call", direct);
  row("indirect call through a function pointer", indirect, "direct call", direct);
  row("set_mode, 64 slots", set_mode, "atomic pointer store", bare_store);
  fmt::print(
      "\nextra per call through the slot: {:.2f} ns (target <= 5 ns); set_mode {:.2f} ns "
      "(target <= 100 ns)\n",
      via_runtime - direct, set_mode);
  return g_sink == 42 ? 1 : 0;  // keeps g_sink observable
}
