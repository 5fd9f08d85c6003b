// Decode-shape GEMMs, y[M, N] = x[M, K] . W[N, K]^T in bf16 with fp32 accumulation: the runtime's
// skinny GEMM (tools/demo/skinny_gemm.h, its default plan; every compiled variant too with
// --sweep) against cuBLASLt through the GEMM service, in the same run, on the projections of real
// models at decode batches 1-64.
//
// Each figure is one GEMM's time inside a CUDA graph of launches over distinct weight copies (at
// least 256 MiB of weights, so they come from HBM as in a decode step, not from L2): the median
// of --reps replays over the launches in the graph. TB/s counts the bytes a GEMM must move:
// weights, x and y once. The last column is the largest difference between the two results
// relative to cuBLASLt's largest magnitude (both round to bf16).
//
// The gate/up weights also run with SiluAndMul as the skinny GEMM's epilogue (on Hopper; rows
// "+ SiluAndMul"), against cuBLASLt followed by the runtime's SiluAndMul kernel.
//   bench_skinny_gemm [--reps N] [--rows 1,16,64] [--sweep] [--only SUBSTRING]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "kernels/common/kh_prelude.cuh"
#include "tools/demo/device_kernels.h"
#include "tools/demo/device_linear.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/skinny_gemm.h"

using namespace kh;
using namespace kh::demo;

namespace {

struct Shape {
  const char* name;
  int64_t N, K;
};

// q/k/v (one weight), o, gate/up (one weight), down and the LM head of the models the runtime
// targets, by hidden size.
const Shape kShapes[] = {
    {"qwen3-0.6b qkv", 4096, 1024},
    {"qwen3-0.6b o", 1024, 2048},
    {"qwen3-0.6b gate_up", 6144, 1024},
    {"qwen3-0.6b down", 1024, 3072},
    {"qwen3-0.6b lm_head", 151936, 1024},
    {"gpt-oss h2880 qkv", 5120, 2880},
    {"gpt-oss h2880 o", 2880, 4096},
    {"llama-3-8b qkv", 6144, 4096},
    {"llama-3-8b o", 4096, 4096},
    {"llama-3-8b gate_up", 28672, 4096},
    {"llama-3-8b down", 4096, 14336},
    {"qwen2.5-32b h5120 qkv", 7168, 5120},
    {"qwen2.5-32b h5120 down", 5120, 25600},
    {"llama-3-70b h8192 qkv", 10240, 8192},
    {"llama-3-70b h8192 o", 8192, 8192},
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = kh_float_to_bf16_bits(dist(rng));
  return v;
}

// Median ms of one launch of `body` over the copies, from `reps` replays of a graph of them.
template <typename F>
double graph_us(DeviceStream& s, size_t copies, int reps, F&& body) {
  for (size_t i = 0; i < copies; ++i) body(i);  // eager: plans, code loads, workspaces
  s.synchronize();
  s.begin_capture();
  for (size_t i = 0; i < copies; ++i) body(i);
  DeviceGraph g = DeviceGraph::end_capture(s);
  g.launch(s);  // warm
  std::vector<double> ms;
  DeviceEvent a(s.device()), b(s.device());
  for (int r = 0; r < reps; ++r) {
    a.record(s);
    g.launch(s);
    b.record(s);
    b.synchronize();
    ms.push_back(b.elapsed_ms_since(a));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3 / static_cast<double>(copies);
}

double max_rel_diff(DeviceStream& s, const DeviceTensor& a, const DeviceTensor& b) {
  std::vector<uint16_t> ha(static_cast<size_t>(a.numel())), hb(ha.size());
  a.download(s, ha.data(), ha.size() * 2);
  b.download(s, hb.data(), hb.size() * 2);
  s.synchronize();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ha.size(); ++i) {
    const double x = kh_bf16_bits_to_float(ha[i]), y = kh_bf16_bits_to_float(hb[i]);
    diff = std::max(diff, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return scale > 0 ? diff / scale : diff;
}

// One row of the table: `baseline` and `us` for a GEMM of `bytes`, the plan, the difference.
void print_row(const Shape& sh, const char* what, bool default_plan, int64_t M, double bytes,
               double baseline, double us, const SkinnyPlan& p, double diff) {
  fmt::print(
      "| {}{}{} | {} | {} x {} | {:.1f} | {:.2f} | {:.1f} | {:.2f} | {:.2f}x | {} x {} splits | "
      "{:.1e} |\n",
      sh.name, what, default_plan ? "" : " (sweep)", M, sh.N, sh.K, baseline,
      bytes / (baseline * 1e-6) / 1e12, us, bytes / (us * 1e-6) / 1e12, baseline / us,
      p.kernel().substr(10), p.splits, diff);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool sweep = false;
  std::string only;
  std::vector<int64_t> rows = {1, 16, 64};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--sweep") {
      sweep = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--rows" && i + 1 < argc) {
      rows.clear();
      std::string list = argv[++i];
      for (size_t p = 0; p < list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        rows.push_back(std::atoll(list.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else {
      fmt::print(stderr,
                 "usage: bench_skinny_gemm [--reps N] [--rows 1,16,64] [--sweep] [--only TEXT]\n");
      return 2;
    }
  }
  int32_t n = 0;
  if (kh_device_count(&n) != KH_OK || n < 1) {
    fmt::print(stderr, "bench_skinny_gemm: no CUDA device ({})\n", kh_last_error());
    return 77;
  }
  try {
    DevicePool pool(0);
    DeviceStream s(0);
    SkinnyGemm skinny(0, pool);
    DeviceKernels kernels(0);
    std::mt19937 rng(1);
    fmt::print(
        "| GEMM | M | N x K | cuBLASLt us | TB/s | skinny us | TB/s | vs cuBLASLt | plan | "
        "max diff |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Shape& sh : kShapes) {
      if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
      const double w_bytes = static_cast<double>(sh.N * sh.K * 2);
      const size_t copies =
          static_cast<size_t>(std::clamp(std::ceil((256.0 * (1 << 20)) / w_bytes), 2.0, 28.0));
      std::vector<DeviceTensor> w;
      for (size_t c = 0; c < copies; ++c) {
        w.emplace_back(pool, std::vector<int64_t>{sh.N, sh.K}, kBF16);
        const std::vector<uint16_t> h = random_bf16(static_cast<size_t>(sh.N * sh.K), rng, 0.02f);
        w.back().upload(s, h.data(), h.size() * 2);
      }
      for (int64_t M : rows) {
        DeviceTensor x(pool, {M, sh.K}, kBF16), y(pool, {M, sh.N}, kBF16),
            y_ref(pool, {M, sh.N}, kBF16);
        const std::vector<uint16_t> hx = random_bf16(static_cast<size_t>(M * sh.K), rng, 1.f);
        x.upload(s, hx.data(), hx.size() * 2);
        const double bytes = w_bytes + static_cast<double>((M * sh.K + M * sh.N) * 2);
        const double cublas =
            graph_us(s, copies, reps, [&](size_t c) { linear_forward(s, x, w[c], y_ref); });
        const SkinnyPlan plan = skinny.default_plan(M, sh.N, sh.K);
        std::vector<SkinnyPlan> plans = {plan};
        if (sweep)
          for (SkinnyPlan p : skinny_variants())
            for (int splits : {1, 2, 3, 4, 6, 8}) {
              p.splits = splits;
              if (skinny_plan_refusal(p, sh.K).empty() && !(p == plan) &&
                  (!p.wgmma || skinny.has_wgmma()))
                plans.push_back(p);
            }
        for (const SkinnyPlan& p : plans) {
          const double us =
              graph_us(s, copies, reps, [&](size_t c) { skinny.run(s, x, w[c], nullptr, y, p); });
          // Both results from the last copy.
          print_row(sh, "", &p == &plans.front(), M, bytes, cublas, us, p,
                    max_rel_diff(s, y, y_ref));
        }
        if (std::string(sh.name).find("gate_up") == std::string::npos || !skinny.has_wgmma())
          continue;
        // gate/up + SiluAndMul: cuBLASLt then the runtime's kernel, against the epilogue.
        const int64_t F = sh.N / 2;
        DeviceTensor act(pool, {M, F}, kBF16), act_ref(pool, {M, F}, kBF16);
        const double act_bytes = w_bytes + static_cast<double>((M * sh.K + M * F) * 2);
        const double two = graph_us(s, copies, reps, [&](size_t c) {
          linear_forward(s, x, w[c], y_ref);
          kernels.silu_and_mul(s, y_ref, act_ref);
        });
        const SkinnyPlan silu = skinny_silu_plan(M, F, sh.K, skinny.multiprocessors());
        std::vector<SkinnyPlan> silu_plans = {silu};
        if (sweep)
          for (SkinnyPlan p : skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul))
            for (int splits : {1, 2, 4, 8}) {
              p.splits = splits;
              if (skinny_plan_refusal(p, sh.K).empty() && !(p == silu)) silu_plans.push_back(p);
            }
        for (const SkinnyPlan& p : silu_plans) {
          const double us = graph_us(
              s, copies, reps, [&](size_t c) { skinny.run_silu_and_mul(s, x, w[c], act, p); });
          print_row(sh, " + SiluAndMul", &p == &silu_plans.front(), M, act_bytes, two, us, p,
                    max_rel_diff(s, act, act_ref));
        }
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "bench_skinny_gemm: {}\n", e.what());
    return 1;
  }
  return 0;
}
