// The training step's GEMMs one at a time: each projection of a model at `--tokens` rows in the
// layouts the GPU-resident runtime runs them (tools/demo/device_linear.h, through the GEMM
// service: cuBLASLt, its candidates timed at a shape's first call), so that a step's GEMM time
// can be split into what the kernels reach alone and what the step costs them (clocks under
// load, L2), and one alternative beside its baseline in the same run:
//
//   forward      y  = x . W^T            (cuBLASLt TN)
//   dx           dx = dy . W             (NN: the runtime's backward)
//   dx, W^T copy dx = dy . (W^T)^T       (TN: a transposed copy of W [in, out]; its transpose, a
//                                         pass over W's bytes twice, is not in the figure)
//   dW           dW  = dy^T . x, fp32    (NT, overwritten: a step's first; += with --accumulate)
//
// Each figure is the median of --reps launches (CUDA events around each, after a warm-up that
// plans and times the candidates), on random inputs; TFLOP/s counts 2 M N K.
//   bench_train_gemms [--model qwen3-0.6b|llama-3-8b|...] [--tokens 16384] [--reps 20]
//                     [--loss-chunk 1024] [--accumulate]
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "kernels/common/kh_prelude.cuh"
#include "tools/demo/device_linear.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/model_config.h"

using namespace kh;
using namespace kh::demo;

namespace {

struct Projection {
  std::string name;
  int64_t rows, out, in;  // W [out, in]
};

// The projections of one training step: q/k/v and gate/up as the runtime fuses them, and the LM
// head a loss chunk at a time.
std::vector<Projection> projections(const ModelConfig& c, int64_t tokens, int64_t chunk) {
  return {{"qkv", tokens, c.q_dim() + 2 * c.kv_dim(), c.hidden},
          {"o", tokens, c.hidden, c.q_dim()},
          {"gate_up", tokens, 2 * c.ffn, c.hidden},
          {"down", tokens, c.hidden, c.ffn},
          {"lm_head chunk", std::min(chunk, tokens), c.vocab, c.hidden}};
}

DeviceTensor random_bf16(DevicePool& pool, DeviceStream& s, std::vector<int64_t> shape,
                         std::mt19937& rng, float scale, std::vector<uint16_t>* host = nullptr) {
  DeviceTensor t(pool, shape, kBF16);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
  for (auto& x : h) x = kh_float_to_bf16_bits(dist(rng));
  t.upload(s, h.data(), h.size() * 2);
  s.synchronize();
  if (host) *host = std::move(h);
  return t;
}

// Median microseconds of one `body` launch.
template <typename F>
double median_us(DeviceStream& s, int reps, F&& body) {
  body();  // plans the shape (and times cuBLASLt's candidates)
  body();
  s.synchronize();
  std::vector<double> us;
  DeviceEvent a(s.device()), b(s.device());
  for (int r = 0; r < reps; ++r) {
    a.record(s);
    body();
    b.record(s);
    b.synchronize();
    us.push_back(b.elapsed_ms_since(a) * 1e3);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "qwen3-0.6b";
  int64_t tokens = 16384, chunk = 1024;
  int reps = 20;
  bool accumulate = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model = argv[++i];
    } else if (a == "--tokens" && i + 1 < argc) {
      tokens = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (a == "--loss-chunk" && i + 1 < argc) {
      chunk = std::max<int64_t>(1, std::atoll(argv[++i]));
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--accumulate") {
      accumulate = true;
    } else {
      fmt::print(stderr,
                 "usage: bench_train_gemms [--model NAME] [--tokens N] [--reps N] "
                 "[--loss-chunk N] [--accumulate]\n");
      return 2;
    }
  }
  int32_t n = 0;
  if (kh_device_count(&n) != KH_OK || n < 1) {
    fmt::print(stderr, "bench_train_gemms: no CUDA device ({})\n", kh_last_error());
    return 77;
  }
  try {
    const ModelConfig cfg = preset(model);
    DevicePool pool(0);
    DeviceStream s(0);
    std::mt19937 rng(1);
    fmt::print("{} ({}), {} tokens, bf16 in, fp32 accumulation; median of {} launches\n\n", model,
               cfg.describe(), tokens, reps);
    fmt::print(
        "| GEMM | M x N x K | op | us | TFLOP/s | vs the runtime's |\n|---|---|---|---|---|---|\n");
    // A step's GEMM time: the runtime's layouts, and with the faster dx of each projection.
    double step_us[2] = {0, 0};
    for (const Projection& p : projections(cfg, tokens, chunk)) {
      std::vector<uint16_t> hw;
      DeviceTensor w = random_bf16(pool, s, {p.out, p.in}, rng, 0.02f, &hw);
      // W^T [in, out], transposed on the host.
      std::vector<uint16_t> ht(hw.size());
      for (int64_t o = 0; o < p.out; ++o)
        for (int64_t i = 0; i < p.in; ++i)
          ht[static_cast<size_t>(i * p.out + o)] = hw[static_cast<size_t>(o * p.in + i)];
      DeviceTensor wt(pool, {p.in, p.out}, kBF16);
      wt.upload(s, ht.data(), ht.size() * 2);
      DeviceTensor x = random_bf16(pool, s, {p.rows, p.in}, rng, 1.f);
      DeviceTensor dy = random_bf16(pool, s, {p.rows, p.out}, rng, 1e-3f);
      DeviceTensor y(pool, {p.rows, p.out}, kBF16), dx(pool, {p.rows, p.in}, kBF16);
      DeviceTensor dw(pool, {p.out, p.in}, kF32);
      dw.zero(s);
      const double flop = 2.0 * static_cast<double>(p.rows) * p.out * p.in;
      auto row = [&](const char* op, int64_t m, int64_t nn, int64_t k, double us, double base) {
        fmt::print("| {} | {} x {} x {} | {} | {:.1f} | {:.0f} | {} |\n", p.name, m, nn, k, op, us,
                   flop / (us * 1e-6) / 1e12, base > 0 ? fmt::format("{:.3f}x", base / us) : "-");
      };
      const double fwd = median_us(s, reps, [&] { linear_forward(s, x, w, y); });
      row("forward (TN)", p.rows, p.out, p.in, fwd, 0);
      const double bdx =
          median_us(s, reps, [&] { linear_backward(s, x, w, dy, &dx, nullptr, false, false); });
      row("dx (NN)", p.rows, p.in, p.out, bdx, 0);
      // dx = dy . W as a forward of dy with W^T [in, out] as the weight.
      const double tdx = median_us(s, reps, [&] { linear_forward(s, dy, wt, dx); });
      row("dx, W^T copy (TN)", p.rows, p.in, p.out, tdx, bdx);
      const double bdw = median_us(
          s, reps, [&] { linear_backward(s, x, w, dy, nullptr, &dw, false, accumulate); });
      row(accumulate ? "dW += (NT)" : "dW = (NT)", p.out, p.in, p.rows, bdw, 0);
      // Each layer runs the four projections; the LM head runs once a chunk.
      const int64_t times =
          p.name == "lm_head chunk" ? (tokens + p.rows - 1) / p.rows : int64_t{cfg.layers};
      step_us[0] += static_cast<double>(times) * (fwd + bdx + bdw);
      step_us[1] += static_cast<double>(times) * (fwd + std::min(bdx, tdx) + bdw);
    }
    fmt::print(
        "\nA training step's GEMMs alone (every layer's forward, dx and dW, the LM head's a "
        "chunk at a time): {:.1f} ms; with the faster dx of each projection: {:.1f} ms (the "
        "transposed copies' passes not counted)\n",
        step_us[0] / 1e3, step_us[1] / 1e3);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_train_gemms: {}\n", e.what());
    return 1;
  }
  return 0;
}
