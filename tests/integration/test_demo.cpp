// The demo model runtime (tools/demo, `kernel-hub demo`):
// - in process: the same model kernelized on cpu from the embedded default hub and with the
//   runtime's fallbacks only gives the same logits and losses (within fp32 rounding) and learns;
// - the CLI as a child process with an empty cache: `demo --device cpu --steps 50 --json` binds
//   every slot from a package in both modes and the loss falls;
// - `demo --device cuda:0` fails clearly without a GPU; DemoGpu.* (CTest label gpu) runs it on a
//   GPU and skips without one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "hub/hub.h"
#include "hub/store/store.h"
#include "loader/cuda_driver.h"
#include "loader/layer_table.h"
#include "registry/kernelize.h"
#include "tests/fixtures/process.h"
#include "tools/demo/data.h"
#include "tools/demo/default_config.h"
#include "tools/demo/demo.h"

namespace kh::test {
namespace {

using demo::DemoOptions;
using demo::DemoRun;
using demo::DemoSlots;

constexpr const char* kLayers[] = {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "CrossEntropy"};

// The embedded default hub is signed at build time with a key the build trusts: the demo runs
// under the default policy, so an unsigned-package override must not leak in from outside.
constexpr const char* kAllowUnsigned = "KERNEL_HUB_ALLOW_UNSIGNED";

bool have_cuda_device() {
  try {
    return cuda::device_count() > 0;
  } catch (const Error&) {
    return false;
  }
}

// A runtime with the demo slots, kernelized on this machine's cpu (or with fallbacks only).
struct DemoRuntime {
  Runtime rt;
  DemoSlots slots = demo::add_demo_slots(rt);
  KernelizeReport report;

  DemoRuntime(Hub& hub, bool fallback_only) {
    KernelizeOptions o;
    o.disable = fallback_only;
    o.local = std::map<std::string, std::filesystem::path>{};  // ignore KERNEL_HUB_LOCAL
    report = kernelize(rt, KernelConfig::parse(demo::default_demo_config_json()), hub,
                       local_cpu_device(), o);
  }
};

class DemoInProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv(kAllowUnsigned);
    HubOptions o = HubOptions::from_env();
    o.progress = false;
    o.offline = false;
    hub_ = std::make_unique<Hub>(HubAddress::parse(KH_DEFAULT_HUB_DIR, false), store_, o);
  }

  TempDir cache_{"kh-demo-cache"};
  Store store_{cache_.path()};
  std::unique_ptr<Hub> hub_;
};

// Tolerances. Both implementations are fp32 with the same formulas; they may differ only in
// summation order (the packages' blocked sums, per-walker weight-gradient partials, online
// softmax merge) and in which expf runs, i.e. a few ulp (~1e-6 relative) per op. Measured here:
// logits bit-identical (rows of 64 fit one 256-term block), losses over 30 Adam steps within
// 2.3e-7 relative. The bounds leave ~100x headroom for other compilers and libms (which may
// contract to FMA or round expf differently, and Adam's 1/sqrt(v) amplifies ulp-level gradient
// differences), and stay far below what a wrong op does (logits off by >1e-2, losses by >1e-2).
constexpr float kLogitTol = 1e-4f;
constexpr float kLossRelTol = 1e-4f;

TEST_F(DemoInProcess, KernelizedAndFallbackRunsAgreeAndLearn) {
  DemoRuntime kern(*hub_, /*fallback_only=*/false);
  DemoRuntime fall(*hub_, /*fallback_only=*/true);
  SCOPED_TRACE(kern.report.str());
  // Every slot is served by a package in both modes (not the fallback) in the kernelized
  // runtime, and by the fallback in the other: the comparison below compares two implementations.
  for (Mode m : {Mode::kEval, Mode::kTrain})
    for (const char* layer : kLayers) {
      const KernelizeBinding* b = kern.report.find(layer, m);
      ASSERT_NE(b, nullptr) << layer;
      EXPECT_NE(b->source, BindingSource::kFallback) << layer << " " << mode_name(m);
      EXPECT_EQ(fall.report.find(layer, m)->source, BindingSource::kFallback);
    }
  for (Mode m : {Mode::kEval, Mode::kTrain}) {
    kern.rt.set_mode(m);
    fall.rt.set_mode(m);
    for (const char* layer : kLayers) {
      const uint32_t s = *kern.rt.find_slot(layer);
      EXPECT_FALSE(kern.rt.table().current()->entry(kCpuDevice, s).is_fallback) << layer;
      EXPECT_TRUE(fall.rt.table().current()->entry(kCpuDevice, s).is_fallback) << layer;
    }
  }

  // One forward from the same initial model, per mode: the same logits and loss.
  const demo::ModelConfig cfg;
  demo::BigramData data(cfg.vocab, 0.8, 7, 11);
  const demo::BigramData::Batch batch = data.next(4, cfg.seq);
  for (Mode m : {Mode::kTrain, Mode::kEval}) {
    SCOPED_TRACE(mode_name(m));
    kern.rt.set_mode(m);
    fall.rt.set_mode(m);
    demo::TinyLM a(cfg, kern.slots, 3), b(cfg, fall.slots, 3);
    demo::SlotCaller ca(kern.rt, -1), cb(fall.rt, -1);
    const float la = a.forward(ca, kern.rt, batch.inputs.data(), batch.targets.data(), 4, cfg.seq);
    const float lb = b.forward(cb, fall.rt, batch.inputs.data(), batch.targets.data(), 4, cfg.seq);
    EXPECT_NEAR(la, lb, kLossRelTol * lb);
    ASSERT_EQ(a.logits().size(), b.logits().size());
    float worst = 0;
    for (size_t i = 0; i < a.logits().size(); ++i)
      worst = std::max(worst, std::fabs(a.logits()[i] - b.logits()[i]));
    EXPECT_LT(worst, kLogitTol);
    if (m == Mode::kTrain) {  // backward runs through every slot's backward op
      a.backward(ca);
      b.backward(cb);
    }
  }

  // Training: the same loss curve and eval loss, and it learns.
  DemoOptions o;
  o.steps = 30;
  o.seed = 5;
  const DemoRun rk = demo::run_demo(kern.rt, kern.slots, o);
  const DemoRun rf = demo::run_demo(fall.rt, fall.slots, o);
  ASSERT_EQ(rk.train_loss.size(), 30u);
  ASSERT_EQ(rf.train_loss.size(), 30u);
  for (size_t i = 0; i < rk.train_loss.size(); ++i)
    EXPECT_NEAR(rk.train_loss[i], rf.train_loss[i], kLossRelTol * rf.train_loss[i]) << "step " << i;
  EXPECT_NEAR(rk.eval_loss, rf.eval_loss, kLossRelTol * rf.eval_loss);
  EXPECT_EQ(kern.rt.mode(), Mode::kEval);  // run_demo ends in eval
  // ln(256) = 5.55 at the start; 30 steps reach well under 4 (the floor is 1.6).
  EXPECT_GT(rk.train_loss.front(), 5.0f);
  EXPECT_LT(rk.train_loss.back(), rk.train_loss.front() - 1.5f);
  EXPECT_LT(rk.eval_loss, rk.train_loss.front() - 1.5f);
  EXPECT_EQ(rk.generated.size(), static_cast<size_t>(o.generate_tokens));
}

// --- the CLI as a child process ---

Env cli_env(const std::filesystem::path& cache) {
  return {{"KERNEL_HUB_CACHE", cache.string()}, {kAllowUnsigned, "\x01"},
          {"KERNEL_HUB_ENDPOINT", "\x01"},  // the embedded default hub
          {"KERNEL_HUB_OFFLINE", "\x01"},       {"KERNEL_HUB_LOCAL", "\x01"},
          {"KERNEL_HUB_DISABLE", "\x01"}};
}

// Checks `demo --json` output: every slot bound from a package (not the fallback) in both modes,
// and the loss fell.
void expect_kernelized_run(const ProcessResult& r, const std::string& device) {
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"], device);
  EXPECT_EQ(j["fallback_only"], false);
  ASSERT_EQ(j["bindings"].size(), 8u) << j["bindings"].dump(2);
  for (const char* mode : {"eval", "train"})
    for (const char* layer : kLayers) {
      bool found = false;
      for (auto& b : j["bindings"]) {
        if (b["layer"] != layer || b["mode"] != mode) continue;
        found = true;
        EXPECT_NE(b["source"], "fallback") << b.dump(2);
        EXPECT_TRUE(b["package"].get<std::string>().starts_with("kernel-hub/")) << b.dump(2);
        EXPECT_TRUE(b["index_digest"].get<std::string>().starts_with("sha256:"));
      }
      EXPECT_TRUE(found) << layer << " " << mode;
    }
  const float first = j["train"]["first_loss"], last = j["train"]["last_loss"];
  EXPECT_EQ(j["train"]["steps"], 50);
  EXPECT_GT(first, 5.0f);
  EXPECT_LT(last, first - 1.5f);
  EXPECT_LT(j["eval"]["loss"].get<float>(), first - 1.5f);
  EXPECT_EQ(j["generation"]["tokens"].size(), 16u);
}

TEST(DemoCli, CpuJsonFromAnEmptyCacheBindsEverySlot) {
  TempDir cache("kh-demo-cli");
  ProcessResult r = run_process({cli_path(), "demo", "--device", "cpu", "--steps", "50", "--json"},
                                cli_env(cache.path()), 240);
  ASSERT_NO_FATAL_FAILURE(expect_kernelized_run(r, "cpu"));
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["fetched"], 4);  // the cache was empty: each package came from the hub, once
  for (auto& b : j["bindings"]) EXPECT_EQ(b["source"], "hub") << b.dump(2);
  EXPECT_TRUE(j["staging"]["staged_slots"].empty());
}

TEST(DemoCli, FallbackFlagBindsNothing) {
  TempDir cache("kh-demo-cli");
  ProcessResult r =
      run_process({cli_path(), "demo", "--device", "cpu", "--steps", "5", "--fallback", "--json"},
                  cli_env(cache.path()), 240);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["fallback_only"], true);
  for (auto& b : j["bindings"]) EXPECT_EQ(b["source"], "fallback") << b.dump(2);
}

TEST(DemoCli, CudaWithoutAGpuFailsNamingTheDevice) {
  if (have_cuda_device()) GTEST_SKIP() << "this machine has a CUDA device";
  TempDir cache("kh-demo-cli");
  ProcessResult r = run_process({cli_path(), "demo", "--device", "cuda:0", "--steps", "5"},
                                cli_env(cache.path()), 120);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cuda:0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << r.err;
}

// Label gpu (tests/CMakeLists.txt): the CLI on cuda:0, slots staged to the device.
TEST(DemoGpu, CudaJsonBindsEverySlotAndLearns) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA driver or device";
  TempDir cache("kh-demo-cli");
  ProcessResult r =
      run_process({cli_path(), "demo", "--device", "cuda:0", "--steps", "50", "--json"},
                  cli_env(cache.path()), 480);
  ASSERT_NO_FATAL_FAILURE(expect_kernelized_run(r, "cuda:0"));
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["staging"]["staged_slots"].size(), 4u) << j["staging"].dump(2);
  EXPECT_GT(j["staging"]["staged_calls"].get<int>(), 0);
  EXPECT_EQ(j["staging"]["host_calls"], 0);
}

}  // namespace
}  // namespace kh::test
