// Shared by the kernelize tests and the kernelize benchmark: the toy package (layers Scale and
// ScaleInfer: y = x * alpha + offset, offset 0 in 1.0.0 and 1 in 2.0.0), a runtime with slots
// whose fallbacks answer a status the packages never return, and tensors.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "hub/base/fs.h"
#include "hub/trust/signature.h"
#include "hub/trust/trust_store.h"

#include "kernel_hub/kernel_hub.hpp"
#include "registry/pack.h"

namespace kh::test {

// What a slot's fallback returns: tells "the runtime's own implementation ran" from a package op.
constexpr int32_t kFallbackStatus = 77;

inline int32_t toy_fallback(const kh_arg_t*, int32_t, void*) {
  return kFallbackStatus;
}

inline std::filesystem::path toy_package(const std::string& variant) {
  return std::filesystem::path(KH_TOY_PACKAGES_DIR) / variant;
}

// Slots named after the toy's layers (and more, for benchmarks), each with the fallback.
inline void add_slots(Runtime& rt, const std::vector<std::string>& names) {
  for (auto& n : names)
    rt.add_slot(n, {toy_fallback, toy_fallback, toy_fallback, KH_FLAG_HAS_BACKWARD});
}

// A cpu float32 vector as a DLTensor.
struct Vec {
  std::vector<float> data;
  int64_t shape[1];
  DLTensor t{};
  explicit Vec(std::vector<float> values) : data(std::move(values)) {
    shape[0] = static_cast<int64_t>(data.size());
    t.data = data.data();
    t.device = {kDLCPU, 0};
    t.ndim = 1;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
  }
};

// Calls the slot's forward (or backward) as scale(x, alpha, y); returns the status.
inline int32_t call_scale(const Runtime& rt, const std::string& slot, const Vec& x, double alpha,
                          Vec& y, bool backward = false) {
  kh_arg_t a[3];
  a[0].kind = KH_ARG_TENSOR;
  a[0].v.t = &x.t;
  a[1].kind = KH_ARG_FLOAT;
  a[1].v.f = alpha;
  a[2].kind = KH_ARG_TENSOR;
  a[2].v.t = &y.t;
  uint32_t s = *rt.find_slot(slot);
  return backward ? rt.backward(s, kCpuDevice, a, 3, nullptr)
                  : rt.forward(s, kCpuDevice, a, 3, nullptr);
}

// The publisher of the test packages: one Ed25519 key per test process, trusted for every repo
// through a private trust dir that KERNEL_HUB_TRUST_DIR names (CLI child processes inherit it).
// Packages packed with sign_as_test_publisher() then load under the default policy, as signed
// packages from a real publisher do.
inline const trust::PrivateKey& test_publisher() {
  struct Publisher {
    trust::PrivateKey key = trust::PrivateKey::generate();
    std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("kh-test-trust-" + std::to_string(::getpid()));
    Publisher() {
      trust::TrustStore::open(dir).add(key.public_key(), {"*"});
      ::setenv("KERNEL_HUB_TRUST_DIR", dir.c_str(), 1);
    }
    ~Publisher() { fs::remove_tree(dir); }
  };
  static const Publisher publisher;
  return publisher.key;
}

// Signs every tag of a pack with test_publisher(), for `repo` (empty: the pack's repo).
inline void sign_as_test_publisher(PackOptions& o, const std::string& repo = "") {
  o.sign_key = &test_publisher();
  o.sign_repo = repo;
}

// Packs a toy variant into a single OCI layout: cpu only unless sms are given (cuda needs NVRTC).
inline PackReport pack_toy(const std::string& variant, const std::filesystem::path& out,
                           std::vector<std::string> devices = {"cpu"},
                           std::vector<std::string> sms = {}) {
  PackOptions o;
  o.package_dir = toy_package(variant);
  o.output = out;
  o.devices = std::move(devices);
  o.sms = std::move(sms);
  sign_as_test_publisher(o, "test/toy");
  return pack_package(o);
}

// A layout hub directory at `hub_dir` holding the signed toy 1.0.0 as test/toy (cpu variant).
inline PackReport pack_toy_hub(const std::filesystem::path& hub_dir) {
  PackOptions o;
  o.package_dir = toy_package("toy-1.0.0");
  o.output = hub_dir;
  o.repo = "test/toy";
  o.devices = {"cpu"};
  sign_as_test_publisher(o);
  return pack_package(o);
}

// Scale in both modes; ScaleInfer (no backward op) in the Transformers form (both modes).
inline std::string toy_config(const std::string& repo) {
  return R"({"Scale": {"cpu": {"eval": ")" + repo + R"(@v1", "train": ")" + repo +
         R"(@v1"}}, "ScaleInfer": ")" + repo + R"(:ScaleInfer"})";
}

}  // namespace kh::test
