// The demo model (tools/demo) against Transformers, and its checkpoint loading:
// - parity: tests/data/demo_reference holds tiny Qwen3 (BF16, tied, q/k norms, head_dim !=
//   hidden / heads), Llama (fp32, 3 shards, untied) and Qwen2 (F16, q/k/v biases) checkpoints,
//   all GQA, with Transformers' fp32 logits and loss on a fixed batch and the losses of 3 AdamW
//   steps (tools/demo/make_reference.py generated them once). The demo model loaded from each
//   gives the same logits and loss and tracks the losses, with the runtime's fallbacks AND with
//   the embedded default hub's cpu packages bound, and eval and train mode agree;
// - checkpoints: sharded, tied, dtype conversion, and each kind of bad checkpoint refused with an
//   error naming what is wrong;
// - the safetensors reader's checks (tools/demo/safetensors.h; also fuzzed);
// - the presets' shapes (qwen3-0.6b has Qwen3-0.6B's 596,049,920 parameters).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "hub/base/fs.h"
#include "hub/hub.h"
#include "hub/store/store.h"
#include "registry/kernelize.h"
#include "tests/fixtures/process.h"
#include "tools/demo/checkpoint.h"
#include "tools/demo/default_config.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/model.h"
#include "tools/demo/safetensors.h"

namespace kh::test {
namespace {

namespace stdfs = std::filesystem;
using demo::CausalLM;
using demo::Checkpoint;
using demo::SafetensorsFile;

const stdfs::path kData = KH_DEMO_REFERENCE_DIR;

// Tolerances. Both sides are fp32 with the same math; they differ in summation order (our
// 8-lane dot products vs PyTorch's blocked GEMMs, the packages' blocked sums, softmax merges)
// and in expf / rsqrt, i.e. a few ulp per op compounding through 2 layers. Measured here
// (x86-64, g++ 12, torch 2.15 CPU): logits within 4.3e-6 of Transformers' (|logits| up to ~5),
// losses and the losses of 3 AdamW steps within 1.1e-7 relative (1 ulp). The bounds leave 20-100x
// headroom for other compilers, libms and BLAS blockings (and for Adam's 1 / sqrt(v), which
// amplifies ulp-level gradient differences), and stay far below what a wrong op does: a wrong
// rope_theta or GQA head mapping moves logits by > 1e-1 and the loss by > 1e-3.
constexpr float kLogitTol = 1e-4f;
constexpr double kLossRelTol = 1e-5;
constexpr double kTrainLossRelTol = 1e-5;

struct Reference {
  int batch = 0, seq = 0;
  std::vector<int64_t> tokens, targets;
  double loss = 0;
  std::vector<double> train_losses;
  demo::AdamConfig adam;
  std::vector<float> logits;

  explicit Reference(const std::string& model) {
    const auto j = nlohmann::json::parse(fs::read_file(kData / (model + ".reference.json")));
    batch = j["batch"];
    seq = j["seq"];
    tokens = j["tokens"].get<std::vector<int64_t>>();
    targets = j["targets"].get<std::vector<int64_t>>();
    loss = j["loss"];
    train_losses = j["train_losses"].get<std::vector<double>>();
    adam.lr = j["adamw"]["lr"];
    adam.beta1 = j["adamw"]["beta1"];
    adam.beta2 = j["adamw"]["beta2"];
    adam.eps = j["adamw"]["eps"];
    adam.weight_decay = j["adamw"]["weight_decay"];
    const SafetensorsFile f = SafetensorsFile::read(kData / (model + ".logits.safetensors"));
    logits = f.to_f32(*f.find("logits"));
  }
};

// A runtime with the demo slots, kernelized on this machine's cpu from the embedded default hub
// (every slot a package), or with the runtime's fallbacks only.
struct DemoRuntime {
  TempDir cache{"kh-demo-model"};
  Store store{cache.path()};
  std::unique_ptr<Hub> hub;
  Runtime rt;
  demo::DemoSlots slots = demo::add_demo_slots(rt);
  KernelizeReport report;

  explicit DemoRuntime(bool fallback_only) {
    ::unsetenv("KERNEL_HUB_ALLOW_UNSIGNED");
    HubOptions ho = HubOptions::from_env();
    ho.progress = false;
    ho.offline = false;
    hub = std::make_unique<Hub>(HubAddress::parse(KH_DEFAULT_HUB_DIR, false), store, ho);
    KernelizeOptions o;
    o.disable = fallback_only;
    o.local = std::map<std::string, std::filesystem::path>{};  // ignore KERNEL_HUB_LOCAL
    report = kernelize(rt, KernelConfig::parse(demo::default_demo_config_json()), *hub,
                       local_cpu_device(), o);
  }
};

float worst_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float w = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) w = std::max(w, std::fabs(a[i] - b[i]));
  return w;
}

// --- parity with Transformers ---

struct ParityCase {
  const char* model;
  bool packages;  // the hub's cpu packages bound (else the runtime's fallbacks)
};

class DemoModelParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(DemoModelParity, LogitsLossAndAdamWStepsMatchTransformers) {
  const ParityCase& c = GetParam();
  const Reference ref(c.model);
  DemoRuntime r(!c.packages);
  for (Mode m : {Mode::kEval, Mode::kTrain})
    for (const char* layer : {demo::kRMSNorm, demo::kRotaryEmbedding, demo::kSiluAndMul,
                              demo::kCrossEntropy, demo::kAttention}) {
      const KernelizeBinding* b = r.report.find(layer, m);
      ASSERT_NE(b, nullptr) << layer;
      EXPECT_EQ(b->source != BindingSource::kFallback, c.packages)
          << layer << " " << r.report.str();
    }
  Checkpoint ckpt = demo::load_checkpoint(kData / c.model);
  ckpt.config.seq = ref.seq;
  CausalLM model(ckpt.config, r.slots, std::move(ckpt.weights));
  demo::SlotCaller call(r.rt, -1);

  // Eval, then train mode on the same weights: the same logits (the train ops save more).
  for (Mode m : {Mode::kEval, Mode::kTrain}) {
    SCOPED_TRACE(mode_name(m));
    r.rt.set_mode(m);
    const float loss =
        model.forward(call, r.rt, ref.tokens.data(), ref.targets.data(), ref.batch, ref.seq);
    const float w = worst_diff(model.logits(), ref.logits);
    EXPECT_LT(w, kLogitTol);
    EXPECT_NEAR(loss, ref.loss, kLossRelTol * ref.loss);
    std::printf("%s %s %s: worst logit diff %.3g, loss %.8f vs %.8f\n", c.model,
                c.packages ? "packages" : "fallbacks", mode_name(m), w, loss, ref.loss);
  }

  // AdamW steps on the batch (train mode): the loss before each step and after the last.
  r.rt.set_mode(Mode::kTrain);
  std::vector<float> losses;
  for (size_t step = 0; step < ref.train_losses.size(); ++step) {
    model.zero_grad();
    losses.push_back(
        model.forward(call, r.rt, ref.tokens.data(), ref.targets.data(), ref.batch, ref.seq));
    if (step + 1 == ref.train_losses.size()) break;
    model.backward(call);
    model.adam_step(ref.adam);
  }
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], ref.train_losses[i], kTrainLossRelTol * ref.train_losses[i])
        << "step " << i;
    std::printf("  step %zu: loss %.8f vs %.8f (rel %.2g)\n", i, losses[i], ref.train_losses[i],
                std::fabs(losses[i] - ref.train_losses[i]) / ref.train_losses[i]);
  }
  EXPECT_LT(losses.back(), losses.front() - 0.1f);  // it learns

  // Back to eval on the trained weights: the loss the last train forward saw.
  r.rt.set_mode(Mode::kEval);
  const float eval_loss =
      model.forward(call, r.rt, ref.tokens.data(), ref.targets.data(), ref.batch, ref.seq);
  EXPECT_NEAR(eval_loss, losses.back(), 1e-6f * losses.back());
}

INSTANTIATE_TEST_SUITE_P(, DemoModelParity,
                         ::testing::Values(ParityCase{"qwen3", false}, ParityCase{"qwen3", true},
                                           ParityCase{"llama", false}, ParityCase{"llama", true},
                                           ParityCase{"qwen2", false}, ParityCase{"qwen2", true}),
                         [](const auto& info) {
                           return fmt::format("{}_{}", info.param.model,
                                              info.param.packages ? "packages" : "fallbacks");
                         });

// --- checkpoint loading ---

TEST(DemoCheckpoint, LoadsShardedTiedAndConvertedCheckpoints) {
  const Checkpoint qwen3 = demo::load_checkpoint(kData / "qwen3");  // BF16, one file, tied
  EXPECT_EQ(qwen3.config.arch, demo::Arch::kQwen3);
  EXPECT_TRUE(qwen3.config.tie_embeddings);
  EXPECT_TRUE(qwen3.config.qk_norm);
  EXPECT_EQ(qwen3.config.head_dim, 16);  // not hidden / heads = 8
  EXPECT_EQ(qwen3.config.kv_heads, 2);
  EXPECT_DOUBLE_EQ(qwen3.config.rope_theta, 500.0);  // from rope_parameters (Transformers 5)
  EXPECT_FALSE(qwen3.weights.contains("lm_head.weight"));
  EXPECT_TRUE(qwen3.weights.contains("model.layers.1.self_attn.k_norm.weight"));

  const Checkpoint llama = demo::load_checkpoint(kData / "llama");  // fp32, 3 shards, untied
  EXPECT_EQ(llama.config.arch, demo::Arch::kLlama);
  EXPECT_FALSE(llama.config.tie_embeddings);
  EXPECT_EQ(llama.config.head_dim, 8);
  EXPECT_TRUE(llama.weights.contains("lm_head.weight"));
  EXPECT_EQ(llama.weights.size(), demo::weight_specs(llama.config).size());
  size_t n = 0;
  for (auto& [name, w] : llama.weights) n += w.size();
  EXPECT_EQ(n, 23712u);  // the index's metadata.total_parameters

  const Checkpoint qwen2 = demo::load_checkpoint(kData / "qwen2");  // F16, q/k/v biases
  EXPECT_TRUE(qwen2.config.qkv_bias);
  EXPECT_FALSE(qwen2.config.o_bias);
  EXPECT_TRUE(qwen2.weights.contains("model.layers.0.self_attn.v_proj.bias"));
  EXPECT_EQ(qwen2.config.kv_heads, 1);
}

// A copy of a reference checkpoint in a temp dir, to break.
struct BrokenCheckpoint {
  TempDir dir{"kh-demo-ckpt"};
  stdfs::path path;

  explicit BrokenCheckpoint(const std::string& model) : path(dir.path() / model) {
    stdfs::copy(kData / model, path, stdfs::copy_options::recursive);
  }
  nlohmann::json config() const {
    return nlohmann::json::parse(fs::read_file(path / "config.json"));
  }
  void write_config(const nlohmann::json& j) const {
    fs::write_file_atomic(path / "config.json", j.dump());
  }
  // Rewrites a single-file checkpoint's weights (as fp32) after `edit`.
  void edit_weights(const std::function<void(std::map<std::string, demo::F32Tensor>&)>& edit) {
    const SafetensorsFile f = SafetensorsFile::read(path / "model.safetensors");
    std::map<std::string, demo::F32Tensor> t;
    for (const auto& x : f.tensors()) t[x.name] = {x.shape, f.to_f32(x)};
    edit(t);
    fs::write_file_atomic(path / "model.safetensors", demo::encode_safetensors(t));
  }
};

// Loads the checkpoint expecting an error whose message holds every one of `needles`.
void expect_refused(const stdfs::path& dir, std::initializer_list<std::string> needles) {
  try {
    demo::load_checkpoint(dir);
    ADD_FAILURE() << "loaded; expected an error naming " << *needles.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(DemoCheckpoint, RefusesBadCheckpointsNamingTheProblem) {
  {  // a tensor missing
    BrokenCheckpoint b("qwen3");
    b.edit_weights([](auto& t) { t.erase("model.layers.1.self_attn.q_norm.weight"); });
    expect_refused(b.path, {"model.layers.1.self_attn.q_norm.weight", "model.safetensors"});
  }
  {  // a tensor of the wrong shape: expected and actual
    BrokenCheckpoint b("qwen3");
    b.edit_weights([](auto& t) { t["model.norm.weight"] = {{31}, std::vector<float>(31, 1.f)}; });
    expect_refused(b.path, {"model.norm.weight", "[31]", "expected [32]"});
  }
  {  // untied config without lm_head
    BrokenCheckpoint b("qwen3");
    auto j = b.config();
    j["tie_word_embeddings"] = false;
    b.write_config(j);
    expect_refused(b.path, {"lm_head.weight"});
  }
  {  // a bad safetensors header: the length runs past the end
    BrokenCheckpoint b("qwen2");
    std::string bytes = fs::read_file(b.path / "model.safetensors");
    const uint64_t huge = bytes.size();
    std::memcpy(bytes.data(), &huge, 8);
    fs::write_file_atomic(b.path / "model.safetensors", bytes);
    expect_refused(b.path, {"not a valid safetensors file", "header length"});
  }
  {  // a truncated file: the data ends early
    BrokenCheckpoint b("qwen2");
    std::string bytes = fs::read_file(b.path / "model.safetensors");
    bytes.resize(bytes.size() - 4);
    fs::write_file_atomic(b.path / "model.safetensors", bytes);
    expect_refused(b.path, {"not a valid safetensors file", "outside the"});
  }
  {  // a shard the index names is missing
    BrokenCheckpoint b("llama");
    stdfs::remove(b.path / "model-00002-of-00003.safetensors");
    expect_refused(
        b.path, {"model-00002-of-00003.safetensors", "is missing", "model.safetensors.index.json"});
  }
  {  // an index naming a path outside the directory
    BrokenCheckpoint b("llama");
    auto j = nlohmann::json::parse(fs::read_file(b.path / "model.safetensors.index.json"));
    j["weight_map"]["model.norm.weight"] = "../model-00001-of-00003.safetensors";
    fs::write_file_atomic(b.path / "model.safetensors.index.json", j.dump());
    expect_refused(b.path, {"model.norm.weight", "not a file name"});
  }
  {  // no weights at all
    BrokenCheckpoint b("qwen2");
    stdfs::remove(b.path / "model.safetensors");
    expect_refused(b.path, {"model.safetensors", "model.safetensors.index.json"});
  }
  {  // no config.json
    BrokenCheckpoint b("qwen2");
    stdfs::remove(b.path / "config.json");
    expect_refused(b.path, {"config.json"});
  }
  // Configs the runtime does not implement, each naming its field.
  const std::pair<std::function<void(nlohmann::json&)>, std::string> configs[] = {
      {[](auto& j) { j["model_type"] = "gpt2"; }, "\"model_type\""},
      {[](auto& j) { j["architectures"] = {"Qwen2Model"}; }, "\"architectures\""},
      {[](auto& j) { j["hidden_act"] = "gelu"; }, "\"hidden_act\""},
      {[](auto& j) { j["use_sliding_window"] = true; }, "\"use_sliding_window\""},
      {[](auto& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}};
       },
       "\"rope_scaling\""},
      {[](auto& j) {
         j["rope_parameters"] = {{"rope_type", "llama3"}};
       },
       "\"rope_parameters.rope_type\""},
      {[](auto& j) { j.erase("hidden_size"); }, "\"hidden_size\""},
      {[](auto& j) { j["num_key_value_heads"] = 3; }, "key/value heads"},
      // Sizes past any model of the family, refused before a weight is listed or read: as int
      // products q_dim() and kv_dim() overflowed; a million layers' weight list took gigabytes.
      {[](auto& j) {
         j["num_attention_heads"] = 65536;
         j["num_key_value_heads"] = 65536;
         j["head_dim"] = 65536;
       },
       "heads x head_dim (4294967296)"},
      {[](auto& j) { j["num_hidden_layers"] = 1000000; }, "1000000 layers; at most 1024"},
      {[](auto& j) {
         j["vocab_size"] = 1 << 24;
         j["hidden_size"] = 1 << 20;
       },
       "parameters; at most 1099511627776"},
  };
  for (const auto& [edit, needle] : configs) {
    BrokenCheckpoint b("qwen2");
    auto j = b.config();
    edit(j);
    b.write_config(j);
    expect_refused(b.path, {needle, "config.json"});
  }
}

// --- the safetensors reader ---

std::string raw_safetensors(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

void expect_bad(const std::string& bytes, const std::string& needle) {
  try {
    SafetensorsFile::parse(bytes, "test.safetensors");
    ADD_FAILURE() << "parsed; expected an error naming " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(Safetensors, RefusesMalformedFiles) {
  const std::string d8(8, '\0');
  expect_bad("abc", "8-byte header length");
  expect_bad(raw_safetensors("{", ""), "not JSON");
  expect_bad(raw_safetensors("[]", ""), "not a JSON object");
  std::string huge(8, '\0');
  const uint64_t big = SafetensorsFile::kMaxHeaderBytes + 1;
  std::memcpy(huge.data(), &big, 8);
  expect_bad(huge, "limit");
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"),
             "outside the 4 bytes");
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
             "3 elements of 4 bytes");
  expect_bad(raw_safetensors(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", d8),
             "unknown dtype 'Q4'");
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
             "tensor 'a'");
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8),
             "tensor 'a'");
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],)"
                             R"("data_offsets":[0,8]}})",
                             d8),
             "overflows");
  expect_bad(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                             d8),
             "overlap");
  expect_bad(raw_safetensors(R"({"__metadata__":{"k":1}})", ""), "__metadata__");
}

TEST(Safetensors, ConvertsFloatDtypesExactly) {
  // BF16 1.0, -2.0; F16 1.0, the smallest subnormal, +inf, -0.5.
  const uint16_t bf16[] = {0x3f80, 0xc000}, f16[] = {0x3c00, 0x0001, 0x7c00, 0xb800};
  std::string data(reinterpret_cast<const char*>(bf16), 4);
  data.append(reinterpret_cast<const char*>(f16), 8);
  const SafetensorsFile f = SafetensorsFile::parse(
      raw_safetensors(R"({"__metadata__":{"format":"pt"},)"
                      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                      R"("h":{"dtype":"F16","shape":[2,2],"data_offsets":[4,12]}})",
                      data),
      "t");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.to_f32(*f.find("b")), (std::vector<float>{1.f, -2.f}));
  const std::vector<float> h = f.to_f32(*f.find("h"));
  EXPECT_EQ(h[0], 1.f);
  EXPECT_EQ(h[1], 0x1.0p-24f);
  EXPECT_TRUE(std::isinf(h[2]) && h[2] > 0);
  EXPECT_EQ(h[3], -0.5f);
  EXPECT_EQ(f.find("h")->shape, (std::vector<int64_t>{2, 2}));

  // Round trip of the test encoder; an integer tensor is refused by to_f32, naming it.
  const std::string enc = demo::encode_safetensors({{"x", {{2, 1}, {3.f, -4.f}}}});
  const SafetensorsFile g = SafetensorsFile::parse(enc, "enc");
  EXPECT_EQ(g.to_f32(*g.find("x")), (std::vector<float>{3.f, -4.f}));
  const SafetensorsFile i = SafetensorsFile::parse(
      raw_safetensors(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                      std::string(8, '\0')),
      "ids.safetensors");
  try {
    i.to_f32(*i.find("ids"));
    ADD_FAILURE() << "converted I64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ids' is I64"), std::string::npos) << e.what();
  }
}

// --- presets ---

size_t parameters(const demo::ModelConfig& c) {
  size_t n = 0;
  for (const auto& s : demo::weight_specs(c))
    n += std::accumulate(s.shape.begin(), s.shape.end(), size_t{1}, std::multiplies<>());
  return n;
}

TEST(DemoPresets, ShapesOfTheNamedModels) {
  const demo::ModelConfig q = demo::preset("qwen3-0.6b");
  EXPECT_EQ(q.arch, demo::Arch::kQwen3);
  EXPECT_EQ(q.hidden, 1024);
  EXPECT_EQ(q.layers, 28);
  EXPECT_EQ(q.heads, 16);
  EXPECT_EQ(q.kv_heads, 8);
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.ffn, 3072);
  EXPECT_EQ(q.vocab, 151936);
  EXPECT_TRUE(q.tie_embeddings && q.qk_norm);
  EXPECT_DOUBLE_EQ(q.rope_theta, 1e6);
  EXPECT_FLOAT_EQ(q.eps, 1e-6f);
  EXPECT_EQ(parameters(q), 596049920u);  // Qwen/Qwen3-0.6B
  EXPECT_NO_THROW(q.validate());

  const demo::ModelConfig t = demo::preset("tiny");
  EXPECT_EQ(parameters(t), 115008u);  // the demo's model as before
  EXPECT_NO_THROW(demo::preset("llama-3-8b-layers").validate());
  try {
    demo::preset("gpt-5");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3-0.6b"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kh::test
