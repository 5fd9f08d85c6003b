// The shipped kernel packages through the whole pipeline on cpu: each of kernels/ (norm,
// activation, rotary, softmax) is packed by pack_package, pushed to a real docker-registry, and
// kernelized into a runtime from a KernelConfig on an empty cache. Then the same float64-reference
// cases the package tests run (fresh random inputs, poisoned outputs, every dtype) are called
// through the runtime's slots, in the mode each op belongs to, so what is checked is the code that
// came back from the hub, bound where a model would call it.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/base/fs.h"
#include "loader/package_dir.h"
#include "registry/kernelize.h"
#include "registry/pack.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/unit/test_kernels_activation_cases.h"
#include "tests/unit/test_kernels_linear_ce_cases.h"
#include "tests/unit/test_kernels_norm_cases.h"
#include "tests/unit/test_kernels_rotary_cases.h"
#include "tests/unit/test_kernels_softmax_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

using test::RegistryFixture;
using test::TempDir;

constexpr int32_t kFallbackStatus = 77;  // a status no package op returns

int32_t fallback(const kh_arg_t*, int32_t, void*) {
  return kFallbackStatus;
}

const std::vector<std::string> kPackages = {"norm", "activation", "rotary", "softmax"};

// Where each op of a bound package is reached from the runtime: its slot, the mode that
// publishes it, and whether it is the slot's backward.
struct SlotOp {
  uint32_t slot;
  Mode mode;
  bool backward;
};

// Runs the package test cases through a kernelized Runtime instead of calling ops by name.
class SlotExecutor : public Executor {
 public:
  explicit SlotExecutor(Runtime& rt) : rt_(rt) {}

  // Learns the op -> slot routes from a package's module table (slots are named after layers).
  void add_routes(const LoadedModule& m) {
    for (const kh_layer_v1_t* l : m.view.layers) {
      uint32_t slot = *rt_.find_slot(l->name);
      routes_[l->forward] = {slot, Mode::kEval, false};
      // A layer without a backward op binds in eval only (train keeps the fallback).
      if (l->forward_train && (l->flags & KH_FLAG_HAS_BACKWARD))
        routes_[l->forward_train] = {slot, Mode::kTrain, false};
      if (l->backward) routes_[l->backward] = {slot, Mode::kTrain, true};
    }
  }

  const DLTensor* arg(HostTensor& t) override { return t.dl(); }
  int32_t call(const Package&, const std::string& op, const std::vector<kh_arg_t>& args,
               std::string* error) override {
    auto it = routes_.find(op);
    if (it == routes_.end()) {
      ADD_FAILURE() << "op " << op << " is reached through no slot";
      return KH_ERR_NOT_FOUND;
    }
    const SlotOp& r = it->second;
    rt_.set_mode(r.mode);
    clear_last_op_error();
    const int32_t n = static_cast<int32_t>(args.size());
    int32_t s = r.backward ? rt_.backward(r.slot, kCpuDevice, args.data(), n, nullptr)
                           : rt_.forward(r.slot, kCpuDevice, args.data(), n, nullptr);
    if (error) *error = last_op_error();
    used_.insert(op);
    return s;
  }
  // Ops of the bound packages that no case has called.
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (auto& [op, route] : routes_)
      if (!used_.count(op)) out.push_back(op);
    return out;
  }

 private:
  Runtime& rt_;
  std::map<std::string, SlotOp> routes_;
  std::set<std::string> used_;
};

class KernelsHubE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!registry_.available()) GTEST_SKIP() << registry_.why();
  }

  std::unique_ptr<Hub> hub(Store& store) {
    HubOptions o;
    o.progress = false;
    o.source.http.allow_plain_http = true;
    return std::make_unique<Hub>(HubAddress::parse(registry_.oci_url(), true), store, o);
  }

  RegistryFixture registry_;
};

TEST_F(KernelsHubE2E, PackPushKernelizeCpuGivesFloat64ReferenceResults) {
  // Pack and push every package (cpu variant: packing cuda would only add NVRTC time here; the
  // cuda variants are packed into the default hub by the build and tested on the GPU).
  TempDir push_cache("kh-push-cache");
  Store push_store(push_cache.path());
  auto pusher = hub(push_store);
  std::vector<std::unique_ptr<TempDir>> layouts;
  const trust::PrivateKey key = trust::PrivateKey::generate();  // the packages' publisher
  nlohmann::json config = nlohmann::json::object();
  std::vector<std::string> layers;
  std::set<std::string> eval_only;  // layers without a backward op (QKNormRotaryEmbedding)
  for (auto& pkg : kPackages) {
    layouts.push_back(std::make_unique<TempDir>("kh-layout"));
    PackOptions o;
    o.package_dir = package_dir(pkg);
    o.output = layouts.back()->path();
    o.devices = {"cpu"};
    o.tags = {"v1"};
    o.sign_key = &key;
    o.sign_repo = "kernel-hub/" + pkg;
    PackReport packed = pack_package(o);
    PushReport pushed =
        pusher->push(layouts.back()->path(), Ref::parse("kernel-hub/" + pkg + "@v1"));
    EXPECT_EQ(pushed.digest, packed.index.digest) << pkg;
    const LoadedModule& m = Package(pkg).module();
    for (const kh_layer_v1_t* l : m.view.layers) {
      std::string layer = l->name;
      config[layer] = {{"cpu", "kernel-hub/" + pkg + "@v1:" + layer}};
      layers.push_back(layer);
      if (!(l->flags & KH_FLAG_HAS_BACKWARD)) eval_only.insert(layer);
    }
  }

  // Kernelize on an empty cache: every layer bound from the hub in both modes (eval only for a
  // layer without a backward op: train keeps the fallback).
  TempDir cache("kh-cache");
  Store store(cache.path());
  auto h = hub(store);
  Runtime rt;
  for (auto& l : layers) rt.add_slot(l, {fallback, fallback, fallback, KH_FLAG_HAS_BACKWARD});
  trust::TrustStore keys;
  keys.add_builtin(key.public_key(), {"kernel-hub/*"});
  KernelizeOptions ko;
  ko.trust_keys = &keys;
  KernelizeReport r = kernelize(rt, KernelConfig::parse(config.dump()), *h, local_cpu_device(), ko);
  SCOPED_TRACE(r.str());
  EXPECT_EQ(r.fetched, kPackages.size());
  for (auto& l : layers)
    for (Mode mode : {Mode::kEval, Mode::kTrain}) {
      const KernelizeBinding* b = r.find(l, mode);
      ASSERT_NE(b, nullptr) << l;
      if (mode == Mode::kTrain && eval_only.contains(l)) {
        EXPECT_NE(b->source, BindingSource::kHub) << l << " has no backward op";
        continue;
      }
      EXPECT_EQ(b->source, BindingSource::kHub) << l << " " << mode_name(mode);
      EXPECT_TRUE(b->package_dir.string().starts_with(cache.path().string())) << l;
      EXPECT_TRUE(b->trust.starts_with("signed by " + key.public_key().key_id().substr(0, 16)))
          << b->trust;
    }

  // The bound code, called through the slots, against float64 references. The packages' own
  // tests cover every case; here a spread of shapes (odd, one row, strided) per dtype.
  SlotExecutor ex(rt);
  std::map<std::string, std::unique_ptr<Package>> bound;
  for (auto& pkg : kPackages) {
    const KernelizeBinding* b = nullptr;
    for (auto& binding : r.bindings)
      if (binding.kernel.starts_with("kernel-hub/" + pkg + "@")) b = &binding;
    ASSERT_NE(b, nullptr) << pkg;
    bound[pkg] = std::make_unique<Package>(read_package_dir(b->package_dir).host_library, 0);
    ex.add_routes(bound[pkg]->module());
  }
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int dtype : {kBF16, kFP16, kFP32}) {
    for (int i : {0, 1, 3, 4})
      for (int kind = 0; kind < 3; ++kind)
        norm_cases::run_case(ex, *bound["norm"], kind, dtype, norm_cases::kCases[i], rng);
    for (int i : {0, 1, 3})
      for (int op = 0; op < 5; ++op)
        act_cases::run_case(ex, *bound["activation"], op, dtype, act_cases::kCases[i], rng);
    for (int i : {0, 1, 2})
      for (bool neox : {true, false}) {
        rope_cases::run_case(ex, *bound["rotary"], dtype, neox, rope_cases::kCases[i], rng);
        rope_cases::run_qk_norm_case(ex, *bound["rotary"], dtype, neox, rope_cases::kCases[i], rng);
        for (bool from_output : {false, true})
          rope_cases::run_qk_norm_train_case(ex, *bound["rotary"], dtype, neox,
                                             rope_cases::kCases[i], rng, /*cuda=*/false,
                                             from_output);
      }
    for (int i : {0, 1, 3}) {
      softmax_cases::run_softmax_case(ex, *bound["softmax"], dtype, softmax_cases::kSoftmaxCases[i],
                                      rng);
      softmax_cases::run_ce_case(ex, *bound["softmax"], dtype, softmax_cases::kCeCases[i], rng);
    }
    for (int i : {0, 3})  // FusedLinearCrossEntropy: its GEMMs through the loader's service
      linear_ce_cases::run_case(ex, *bound["softmax"], dtype, linear_ce_cases::kCases[i], rng);
  }
  // Every op of every package went through a slot: forward, forward_train and backward.
  EXPECT_EQ(ex.unused(), std::vector<std::string>{});
}

}  // namespace
}  // namespace kh::kernels_test
