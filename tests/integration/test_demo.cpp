// The demo model runtime (tools/demo, `kernel-hub demo`):
// - in process: the same model kernelized on cpu from the embedded default hub and with the
//   runtime's fallbacks only gives the same logits and losses (within fp32 rounding) and learns;
//   the Attention slot binds kernel-hub/attention's cpu variant, whose ops agree with the
//   runtime's own attention (the fallback), which refuses what it does not implement;
// - the CLI as a child process with an empty cache: `demo --device cpu --steps 50 --json` binds
//   every slot from a package in both modes and the loss falls;
// - `demo --model PATH` trains a Transformers checkpoint (tests/data/demo_reference);
// - `demo --device cuda:0` fails clearly without a GPU, --dtype/--profile/--decode-* on the cpu
//   are refused; DemoGpu.* (CTest label gpu) runs the device-resident model (bf16 from packages,
//   fp32 with the runtime's attention; the KV-cache decode, its tokens/s and roofline figures in
//   the JSON) on a GPU and skips without one.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

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

constexpr const char* kLayers[] = {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "CrossEntropy",
                                   "Attention"};
constexpr size_t kBindings = 2 * std::size(kLayers);  // eval and train

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
    demo::CausalLM a(cfg, kern.slots, 3), b(cfg, fall.slots, 3);
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

TEST_F(DemoInProcess, AttentionSlotBindsThePackagesCpuVariant) {
  DemoRuntime kern(*hub_, /*fallback_only=*/false);
  SCOPED_TRACE(kern.report.str());
  for (Mode m : {Mode::kEval, Mode::kTrain}) {
    const KernelizeBinding* b = kern.report.find("Attention", m);
    ASSERT_NE(b, nullptr) << mode_name(m);
    EXPECT_EQ(b->source, BindingSource::kHub) << mode_name(m);
    EXPECT_TRUE(b->package.starts_with("kernel-hub/attention@")) << b->package;
    EXPECT_TRUE(b->kernel.starts_with("kernel-hub/attention@v1")) << b->kernel;
    kern.rt.set_mode(m);
    EXPECT_FALSE(kern.rt.table().current()->entry(kCpuDevice, kern.slots.attention).is_fallback);
  }
}

// One padded causal batch through the Attention slot of two runtimes: forward_train (out, lse)
// and backward (dq, dk, dv) of kernel-hub/attention's cpu variant and of the runtime's own
// attention agree. Odd length and several heads, so a wrong layout or mask shows.
TEST_F(DemoInProcess, PackageAndFallbackAttentionAgree) {
  DemoRuntime kern(*hub_, /*fallback_only=*/false);
  DemoRuntime fall(*hub_, /*fallback_only=*/true);
  constexpr int64_t B = 2, S = 7, NH = 3, HD = 16, T = B * S, N = T * NH * HD;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(N), k(N), v(N), dout(N);
  for (auto* x : {&q, &k, &v, &dout})
    for (float& f : *x) f = u(rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  struct Result {
    std::vector<float> out = std::vector<float>(N), lse = std::vector<float>(NH * T),
                       dq = std::vector<float>(N), dk = std::vector<float>(N),
                       dv = std::vector<float>(N), ws = std::vector<float>(T * NH * (HD + 1));
  };
  auto run = [&](DemoRuntime& r) {
    using namespace demo;
    r.rt.set_mode(Mode::kTrain);
    SlotCaller call(r.rt, -1);
    Result x;
    call.forward(r.slots.attention,
                 {in(q.data(), {B, S, NH, HD}), in(k.data(), {B, S, NH, HD}),
                  in(v.data(), {B, S, NH, HD}), none(), none(), integer(S), integer(1), integer(-1),
                  real(scale), out(x.out.data(), {B, S, NH, HD}), out(x.lse.data(), {NH, T})});
    call.backward(
        r.slots.attention,
        {in(dout.data(), {B, S, NH, HD}), in(q.data(), {B, S, NH, HD}),
         in(k.data(), {B, S, NH, HD}), in(v.data(), {B, S, NH, HD}),
         in(x.out.data(), {B, S, NH, HD}), in(x.lse.data(), {NH, T}), none(), none(), integer(S),
         integer(S), integer(1), integer(-1), real(scale), out(x.dq.data(), {B, S, NH, HD}),
         out(x.dk.data(), {B, S, NH, HD}), out(x.dv.data(), {B, S, NH, HD}),
         scratch(x.ws.data(), {static_cast<int64_t>(x.ws.size())})});
    return x;
  };
  const Result a = run(kern), b = run(fall);
  auto worst = [](const std::vector<float>& x, const std::vector<float>& y) {
    float w = 0;
    for (size_t i = 0; i < x.size(); ++i) w = std::max(w, std::fabs(x[i] - y[i]));
    return w;
  };
  // fp32, the same formulas, different summation order: a few ulp; a wrong op is off by >1e-2.
  EXPECT_LT(worst(a.out, b.out), 1e-5f);
  EXPECT_LT(worst(a.lse, b.lse), 1e-5f);
  EXPECT_LT(worst(a.dq, b.dq), 1e-5f);
  EXPECT_LT(worst(a.dk, b.dk), 1e-5f);
  EXPECT_LT(worst(a.dv, b.dv), 1e-5f);
  // The first query sees only key 0 (causal): its output is v's row 0.
  for (int64_t d = 0; d < HD; ++d) EXPECT_FLOAT_EQ(b.out[d], v[d]);
}

// The fallback implements padded causal attention only and says so for everything else.
TEST_F(DemoInProcess, FallbackAttentionRefusesWhatItDoesNotImplement) {
  DemoRuntime fall(*hub_, /*fallback_only=*/true);
  fall.rt.set_mode(Mode::kEval);
  demo::SlotCaller call(fall.rt, -1);
  constexpr int64_t B = 1, S = 4, NH = 2, HD = 8, N = B * S * NH * HD;
  std::vector<float> q(N, 0.5f), kv_short(N / 2, 0.5f), o(N);
  const int32_t cu[] = {0, 4};
  using namespace demo;
  auto refuses = [&](OpArgs args, const std::string& why) {
    try {
      call.forward(fall.slots.attention, args);
      ADD_FAILURE() << "accepted; expected a refusal naming " << why;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(fmt::format("(status {})", KH_ERR_UNSUPPORTED)), std::string::npos) << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
      EXPECT_NE(msg.find("runtime fallback"), std::string::npos) << msg;
    }
  };
  // short_keys: k and v of half q's length (a decode against a context), which the package
  // takes and the fallback does not.
  auto args = [&](int64_t causal, int64_t window, bool varlen, bool short_keys) {
    const float* kv = short_keys ? kv_short.data() : q.data();
    const int64_t kv_len = short_keys ? S / 2 : S;
    OpArgs a = {in(q.data(), {B, S, NH, HD}),
                in(kv, {B, kv_len, NH, HD}),
                in(kv, {B, kv_len, NH, HD}),
                none(),
                none(),
                integer(S),
                integer(causal),
                integer(window),
                real(0.25),
                out(o.data(), {B, S, NH, HD}),
                none()};
    if (varlen) {
      a[3].t = make_tensor(cu, {2}, {kDLInt, 32, 1}, Role::kIn);
      a[4].t = make_tensor(cu, {2}, {kDLInt, 32, 1}, Role::kIn);
    }
    return a;
  };
  refuses(args(0, -1, false, false), "causal must be 1");
  refuses(args(1, 2, false, false), "window_left must be -1");
  refuses(args(1, -1, true, false), "cu_seqlens");
  refuses(args(1, -1, false, true), "no key lengths other than q's");
  call.forward(fall.slots.attention, args(1, -1, false, false));  // and runs the supported case
  EXPECT_FLOAT_EQ(o[0], 0.5f);
}

// --- the CLI as a child process ---

Env cli_env(const std::filesystem::path& cache) {
  return {{"KERNEL_HUB_CACHE", cache.string()}, {kAllowUnsigned, "\x01"},
          {"KERNEL_HUB_ENDPOINT", "\x01"},  // the embedded default hub
          {"KERNEL_HUB_OFFLINE", "\x01"},       {"KERNEL_HUB_LOCAL", "\x01"},
          {"KERNEL_HUB_DISABLE", "\x01"}};
}

// Checks `demo --json` output: every slot bound from a package (not the fallback) in both modes,
// except `fallbacks`, which keep the runtime's fallback; and the loss fell.
void expect_kernelized_run(const ProcessResult& r, const std::string& device,
                           const std::set<std::string>& fallbacks = {}) {
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["device"], device);
  EXPECT_EQ(j["fallback_only"], false);
  ASSERT_EQ(j["bindings"].size(), kBindings) << j["bindings"].dump(2);
  for (const char* mode : {"eval", "train"})
    for (const char* layer : kLayers) {
      bool found = false;
      for (auto& b : j["bindings"]) {
        if (b["layer"] != layer || b["mode"] != mode) continue;
        found = true;
        if (fallbacks.contains(layer)) {
          EXPECT_EQ(b["source"], "fallback") << b.dump(2);
          continue;
        }
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
  EXPECT_EQ(j["fetched"], 5);  // the cache was empty: each package came from the hub, once
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

// --model PATH: a Transformers checkpoint (tests/data/demo_reference/qwen3: BF16, tied, GQA,
// q/k norms) trains with every slot from a package; an unknown name lists the presets.
TEST(DemoCli, ModelFromACheckpointDirectory) {
  TempDir cache("kh-demo-cli");
  const std::string ckpt = std::string(KH_SOURCE_DIR) + "/tests/data/demo_reference/qwen3";
  ProcessResult r = run_process(
      {cli_path(), "demo", "--device", "cpu", "--steps", "20", "--model", ckpt, "--json"},
      cli_env(cache.path()), 240);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model"]["name"], ckpt);
  EXPECT_EQ(j["model"]["arch"], "qwen3");
  EXPECT_EQ(j["model"]["checkpoint"], true);
  EXPECT_EQ(j["model"]["kv_heads"], 2);
  EXPECT_EQ(j["model"]["head_dim"], 16);
  EXPECT_EQ(j["model"]["tie_embeddings"], true);
  EXPECT_EQ(j["model"]["qk_norm"], true);
  for (auto& b : j["bindings"]) EXPECT_NE(b["source"], "fallback") << b.dump(2);
  EXPECT_LT(j["train"]["last_loss"].get<float>(), j["train"]["first_loss"].get<float>() - 1.0f);

  r = run_process({cli_path(), "demo", "--device", "cpu", "--model", "gpt-5"},
                  cli_env(cache.path()), 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("qwen3-0.6b"), std::string::npos) << r.err;
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

// Label gpu (tests/CMakeLists.txt): the CLI on cuda:0, the model resident on the device.
nlohmann::json device_run_json(const std::vector<std::string>& extra) {
  TempDir cache("kh-demo-cli");
  std::vector<std::string> args = {cli_path(), "demo", "--device", "cuda:0", "--json"};
  args.insert(args.end(), extra.begin(), extra.end());
  ProcessResult r = run_process(args, cli_env(cache.path()), 480);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  if (r.exit_code != 0) return {};
  return nlohmann::json::parse(r.out);
}

bool has(const nlohmann::json& list, const std::string& name) {
  for (auto& v : list)
    if (v == name) return true;
  return false;
}

TEST(DemoGpu, CudaBf16RunsOnTheDeviceFromPackagesAndLearns) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA driver or device";
  nlohmann::json j = device_run_json({"--steps", "50", "--profile"});
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["device"], "cuda:0");
  EXPECT_FALSE(j.contains("staging")) << "nothing is staged through the host";
  // Fourteen slots (the five, FusedLinearCrossEntropy, FusedAddRMSNorm, QKNormRotaryEmbedding,
  // SiluAndMulRecompute, the two FromOutput slots, PagedKVAppend, PagedAttention and
  // PagedAttentionWithKVAppend), every one from a package in both modes but the three decode
  // slots, which the config maps for eval only (QKNormRotaryEmbedding has served training too
  // since rotary 1.2.0).
  ASSERT_EQ(j["bindings"].size(), kBindings + 18) << j["bindings"].dump(2);
  for (auto& b : j["bindings"]) {
    const bool decode_slot = b["layer"] == "PagedKVAppend" || b["layer"] == "PagedAttention" ||
                             b["layer"] == "PagedAttentionWithKVAppend";
    EXPECT_EQ(b["source"] == "fallback", decode_slot && b["mode"] == "train") << b.dump(2);
  }
  const nlohmann::json& d = j["device_run"];
  EXPECT_EQ(d["dtype"], "bf16");
  // (keep_normed auto: the norms' backwards from their outputs.)
  for (const char* slot : {"RMSNorm", "RotaryEmbedding", "SiluAndMul", "FusedLinearCrossEntropy",
                           "FusedAddRMSNorm", "SiluAndMulRecompute", "FusedAddRMSNormFromOutput"})
    EXPECT_TRUE(has(d["package_slots"], slot)) << slot << " " << d.dump(2);
  // The tiny model's head_dim 16 is not one the attention package's cuda kernels take (64, 128,
  // 256): the call is refused and the runtime's attention serves it, saying why.
  EXPECT_TRUE(has(d["runtime_slots"], "Attention")) << d.dump(2);
  EXPECT_NE(d["refused_slots"]["Attention"].get<std::string>().find("head_dim"), std::string::npos)
      << d.dump(2);
  EXPECT_GT(d["train_tokens_per_s"].get<double>(), 0);
  // One time a timed step (all but the first), which add up to the rate's time.
  const nlohmann::json& step_ms = d["train_step_ms"];
  ASSERT_EQ(step_ms.size(), 49u) << d.dump(2);
  double sum_ms = 0;
  for (const auto& ms : step_ms) {
    EXPECT_GT(ms.get<double>(), 0);
    sum_ms += ms.get<double>();
  }
  const double tokens_a_step = j["model"]["batch"].get<double>() * j["model"]["seq"].get<double>();
  EXPECT_NEAR(d["train_tokens_per_s"].get<double>() * sum_ms / 1e3, 49 * tokens_a_step,
              0.01 * tokens_a_step);
  EXPECT_GT(d["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(d["peak_bytes"].get<uint64_t>(), 0u);
  // What the pool holds from the device: every block it took (freed ones stay cached), so at least
  // the peak of what it handed out.
  EXPECT_GE(d["reserved_bytes"].get<uint64_t>(), d["peak_bytes"].get<uint64_t>());
  const nlohmann::json& p = d["profile"]["train_step"];
  EXPECT_GT(p["total_ms"].get<double>(), 0);
  EXPECT_GT(p["gemm_ms"].get<double>(), 0);
  EXPECT_GT(p["attention_ms"].get<double>(), 0);
  EXPECT_LE(p["gemm_ms"].get<double>() + p["attention_ms"].get<double>() +
                p["hub_kernels_ms"].get<double>(),
            p["total_ms"].get<double>() * 1.01);
  // Decode: tiny defaults (8 sequences, the whole 32-token context: 16 prompt + 16 generated),
  // graph replays timed. The package's decode kernels lack head_dim 16: bound, refused, and the
  // runtime's decode kernels serve on the package's bf16 cache.
  const nlohmann::json& dec = d["decode"];
  EXPECT_EQ(dec["batch"], 8);
  EXPECT_EQ(dec["prompt_tokens"], 16);
  EXPECT_EQ(dec["generated_tokens"], 16);
  EXPECT_EQ(dec["timed_steps"], 14);
  EXPECT_EQ(dec["cuda_graph"], true);
  EXPECT_EQ(dec["package"], false) << dec.dump(2);
  EXPECT_EQ(dec["cache_dtype"], "bf16");
  // --decode-fuse on (the default): SiluAndMul in the gate/up GEMM where the skinny GEMM runs it
  // (Hopper); the tiny Llama has no q/k norms to fold and no fused q/k/v GEMM.
  EXPECT_TRUE(dec["fused_silu"].is_boolean()) << dec.dump(2);
  EXPECT_EQ(dec["fused_qk_norm"], false) << dec.dump(2);
  EXPECT_EQ(dec["fused_norm"], false) << dec.dump(2);  // no fused q/k/v GEMM to fold into
  // The greedy argmax in the LM head's GEMM where the skinny GEMM runs (Hopper), and the final
  // norm with it where the last down projection added into the residual (its epilogue).
  EXPECT_TRUE(dec["fused_head_argmax"].is_boolean()) << dec.dump(2);
  EXPECT_TRUE(dec["fused_final_norm"].is_boolean()) << dec.dump(2);
  if (dec["fused_final_norm"] == true) {
    EXPECT_EQ(dec["fused_head_argmax"], true) << dec.dump(2);
  }
  EXPECT_TRUE(d["refused_slots"].contains("PagedAttention")) << d.dump(2);
  EXPECT_TRUE(has(d["runtime_slots"], "PagedAttention")) << d.dump(2);
  EXPECT_GT(dec["tokens_per_s"].get<double>(), 0);
  EXPECT_NEAR(dec["tokens_per_s"].get<double>() * dec["ms_per_step"].get<double>() / 1e3, 8, 1e-6);
  EXPECT_DOUBLE_EQ(dec["average_context"].get<double>(), 16 + 17 / 2.0);
  EXPECT_DOUBLE_EQ(dec["step_bytes"].get<double>(),
                   dec["weight_bytes"].get<double>() + dec["kv_bytes"].get<double>());
  // 2 layers x K and V x 4 kv heads x 16 x 2 bytes a token, 8 sequences.
  EXPECT_DOUBLE_EQ(dec["kv_bytes"].get<double>(), 2 * 2 * 4 * 16 * 2 * 24.5 * 8);
  EXPECT_GT(dec["peak_bandwidth_bytes_per_s"].get<double>(), 1e11);
  EXPECT_FALSE(dec["peak_bandwidth_source"].get<std::string>().empty());
  EXPECT_GT(dec["roofline_fraction"].get<double>(), 0);
  EXPECT_LT(dec["roofline_fraction"].get<double>(), 1.5);
  EXPECT_GT(dec["read_bandwidth_bytes_per_s"].get<double>(), 1e10);
  EXPECT_GT(dec["read_roofline_fraction"].get<double>(), 0);
  EXPECT_GT(dec["pattern_match"].get<double>(), 0.1) << "well above chance (1 / 256)";
  EXPECT_GE(dec["peak_bytes"].get<uint64_t>(), d["peak_bytes"].get<uint64_t>());
  EXPECT_GT(d["profile"]["decode_step"]["total_ms"].get<double>(), 0);
  const float first = j["train"]["first_loss"], last = j["train"]["last_loss"];
  EXPECT_GT(first, 5.0f);
  EXPECT_LT(last, first - 1.5f);
  EXPECT_LT(j["eval"]["loss"].get<float>(), first - 1.5f);
  EXPECT_EQ(j["generation"]["tokens"].size(), 16u);
}

TEST(DemoGpu, CudaFp32RunsTheRuntimesOwnAttention) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA driver or device";
  // --loss-chunk 7: the 8 x 32 tokens' loss in 37 chunks, the last one short.
  nlohmann::json j = device_run_json({"--steps", "30", "--dtype", "fp32", "--decode-batch", "3",
                                      "--decode-context", "20", "--loss-chunk", "7"});
  ASSERT_FALSE(j.is_null());
  const nlohmann::json& d = j["device_run"];
  EXPECT_EQ(d["dtype"], "fp32");
  // The attention package's cuda kernels take bf16/fp16: bound, but the fp32 model runs its own.
  EXPECT_FALSE(has(d["package_slots"], "Attention")) << d.dump(2);
  EXPECT_TRUE(has(d["runtime_slots"], "Attention")) << d.dump(2);
  EXPECT_TRUE(has(d["package_slots"], "RMSNorm")) << d.dump(2);
  const float first = j["train"]["first_loss"], last = j["train"]["last_loss"];
  EXPECT_LT(last, first - 1.0f);
  // Decode with the options: the fp32 model's cache is bf16 (the package's decode is bound; it
  // refuses head_dim 16 and the runtime's kernels serve that cache).
  EXPECT_EQ(d["decode"]["batch"], 3);
  EXPECT_EQ(d["decode"]["prompt_tokens"], 10);
  EXPECT_EQ(d["decode"]["generated_tokens"], 10);
  EXPECT_EQ(d["decode"]["cache_dtype"], "bf16");
  EXPECT_GT(d["decode"]["tokens_per_s"].get<double>(), 0);
}

// A context longer than the model's sequence is refused before anything runs, naming the option.
TEST(DemoGpu, DecodeContextBeyondTheSequenceIsRefused) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA driver or device";
  TempDir cache("kh-demo-cli");
  ProcessResult r = run_process({cli_path(), "demo", "--device", "cuda:0", "--steps", "2", "--seq",
                                 "64", "--decode-context", "65"},
                                cli_env(cache.path()), 120);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--decode-context 65"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--seq 64"), std::string::npos) << r.err;
}

TEST(DemoCli, DtypeAndProfileNeedACudaDevice) {
  TempDir cache("kh-demo-cli");
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--dtype", "bf16"}, std::vector<std::string>{"--profile"},
        std::vector<std::string>{"--decode-batch", "4"},
        std::vector<std::string>{"--decode-context", "16"},
        std::vector<std::string>{"--decode-overlap", "on"},
        std::vector<std::string>{"--decode-gemm", "skinny"},
        std::vector<std::string>{"--decode-fuse", "off"},
        std::vector<std::string>{"--loss-chunk", "64"},
        std::vector<std::string>{"--keep-normed", "off"}}) {
    std::vector<std::string> args = {cli_path(), "demo", "--device", "cpu", "--steps", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    ProcessResult r = run_process(args, cli_env(cache.path()), 120);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(extra[0]), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("needs a CUDA device"), std::string::npos) << r.err;
  }
  ProcessResult r = run_process({cli_path(), "demo", "--device", "cpu", "--dtype", "fp16"},
                                cli_env(cache.path()), 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--dtype"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kh::test
