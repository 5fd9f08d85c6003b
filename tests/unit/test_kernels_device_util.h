// Helpers shared by the device-code tests of the kernel packages (test_kernels_device_code.cpp,
// test_kernels_device_code_rotary_softmax.cpp): the NVRTC compile check of a shipped .cu, a device backend
// that records the launches a host library asks for, and the packaging checks (`kernel-hub
// check`, kernel.json against the module table).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "loader/host_services.h"
#include "registry/package_manifest.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernels_nvrtc.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {

// A device source (`name` for messages) compiles with NVRTC for `sm` with no #include left, no
// warnings and, as ptxas reports, no register spills, except kernels named in `allowed_spills`
// (kernel -> the most spill-store bytes accepted: known, measured spills a test keeps from
// growing).
inline void expect_source_compiles_without_spills(
    const std::string& src, const std::string& name, const std::string& sm,
    const std::map<std::string, int>& allowed_spills = {}) {
  // Header-free: nothing left for NVRTC to look up.
  EXPECT_EQ(src.find("#include"), std::string::npos) << name << " still has an #include";
  Nvrtc::Output out = Nvrtc::get().compile_source(
      src, name,
      {"--gpu-architecture=" + sm, "-default-device", "--std=c++17", "--ptxas-options=--verbose"});
  ASSERT_TRUE(out.ok) << name << " for " << sm << ":\n" << out.log;
  EXPECT_FALSE(out.cubin.empty());
  EXPECT_EQ(out.log.find("warning"), std::string::npos) << out.log;
  // ptxas -v, per kernel: "Function properties for NAME" then "N bytes stack frame, N bytes
  // spill stores, N bytes spill loads".
  std::regex spill(
      R"(Function properties for (\w+)\s*\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  int kernels = 0;
  for (auto it = std::sregex_iterator(out.log.begin(), out.log.end(), spill);
       it != std::sregex_iterator(); ++it) {
    ++kernels;
    const std::string kernel = (*it)[1].str();
    auto allowed = allowed_spills.find(kernel);
    const int limit = allowed == allowed_spills.end() ? 0 : allowed->second;
    EXPECT_LE(std::stoi((*it)[3].str()), limit)
        << name << " " << sm << " spills: " << (*it)[0].str();
    EXPECT_LE(std::stoi((*it)[4].str()), limit + 32)
        << name << " " << sm << " spills: " << (*it)[0].str();
  }
  EXPECT_GT(kernels, 0) << "no ptxas report in the log:\n" << out.log;
}

// The shipped `package`.cu, as above.
inline void expect_compiles_without_spills(const std::string& package, const std::string& sm,
                                           const std::map<std::string, int>& allowed_spills = {}) {
  expect_source_compiles_without_spills(shipped_source(package), package + ".cu", sm,
                                        allowed_spills);
}

// Test names "<package>_<sm>" for suites parameterized by (package, sm).
inline std::string package_sm_name(
    const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  return std::string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
}

// ---- programmatic dependent launch ------------------------------------------------------------
// The packages whose kernels all begin with kh_pdl_enter() (pdl.cuh) and are launched with
// KH_LAUNCH_PDL (package_host.h: kPdlEntry), by their kernels' name prefixes.
inline const std::vector<std::string>& pdl_packages() {
  static const std::vector<std::string> p{"norm", "activation", "rotary", "attention"};
  return p;
}
inline bool pdl_kernel(const std::string& kernel) {
  for (const char* prefix :
       {"norm_", "act_", "rope_", "qk_norm_rope_", "qknr_", "attn_", "paged_kv_append_"})
    if (kernel.rfind(prefix, 0) == 0) return true;
  return false;
}

// Every extern "C" kernel of `package`.cu begins with kh_pdl_enter(): launched with
// KH_LAUNCH_PDL, a kernel that read or wrote anything before waiting would race the kernel
// before it on the stream.
inline void expect_kernels_enter_with_pdl(const std::string& package) {
  const std::string src = shipped_source(package);
  const std::regex kernel(R"re(extern "C" __global__[^{;]*\{)re");
  // (In a macro, line continuations may separate the brace from the call.)
  const std::regex entered(R"re(extern "C" __global__[^{;]*\{[\s\\]*kh_pdl_enter\(\);)re");
  const auto count = [&](const std::regex& re) {
    return std::distance(std::sregex_iterator(src.begin(), src.end(), re), std::sregex_iterator());
  };
  const auto kernels = count(kernel);
  EXPECT_GT(kernels, 0) << package << ".cu defines no kernel";
  EXPECT_EQ(count(entered), kernels)
      << package << ".cu: a kernel launched with KH_LAUNCH_PDL does not begin with kh_pdl_enter()";
}

// ---- dispatch on kDLCUDA tensors with a recording backend -----------------------------------
struct Launch {
  std::string kernel;
  kh_launch_cfg_t cfg;
  std::vector<int64_t> ints;  // 8-byte parameters decoded by the test when it knows the layout
};

class RecordingBackend : public DeviceBackend {
 public:
  // Device `device`'s code has only `kernels` (a cubin's strings); other names are
  // KH_ERR_NOT_FOUND there, as the loader answers. Devices never given have every kernel.
  void set_kernels(int32_t device, std::set<std::string> kernels) {
    std::lock_guard<std::mutex> lock(mu_);
    kernels_[device] = std::move(kernels);
  }
  int32_t get_function(const PackageIdentity&, int32_t device, const char* kernel_name, void** fn,
                       std::string& error) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = kernels_.find(device); it != kernels_.end() && !it->second.count(kernel_name)) {
      error = std::string("kernel ") + kernel_name + " is not in the device code";
      return KH_ERR_NOT_FOUND;
    }
    names_.push_back(kernel_name);
    *fn = reinterpret_cast<void*>(names_.size());  // 1-based index into names_
    return KH_OK;
  }
  // Called with each launch's kernel and parameters, which live only during the launch: a test
  // that knows a kernel's parameter layout copies what it checks.
  std::function<void(const std::string& kernel, void** params)> on_params;
  int32_t launch(const PackageIdentity&, void* fn, const kh_launch_cfg_t& cfg, void** params, void*,
                 std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string& kernel = names_[reinterpret_cast<size_t>(fn) - 1];
    if (on_params) on_params(kernel, params);
    // Programmatic dependent launch exactly for the kernels that wait for their predecessor.
    EXPECT_EQ(cfg.flags & KH_LAUNCH_PDL, pdl_kernel(kernel) ? KH_LAUNCH_PDL : 0u) << kernel;
    launches_.push_back({kernel, cfg, {}});
    return KH_OK;
  }
  // What device `device` reports through the device-info service (ABI 1.4); devices never
  // given report none (KH_ERR_NO_DEVICE), as a loader without the answer does.
  void set_device_info(int32_t device, const kh_device_info_t& info) {
    std::lock_guard<std::mutex> lock(mu_);
    infos_[device] = info;
  }
  int32_t device_info(int32_t device, kh_device_info_t& out, std::string& error) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = infos_.find(device);
    if (it == infos_.end()) {
      error = "no device info for device " + std::to_string(device);
      return KH_ERR_NO_DEVICE;
    }
    const kh_header_t h = out.h;
    out = it->second;
    out.h = h;
    return KH_OK;
  }
  std::vector<Launch> take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Launch> out;
    out.swap(launches_);
    names_.clear();
    return out;
  }

 private:
  std::mutex mu_;
  std::map<int32_t, std::set<std::string>> kernels_;
  std::map<int32_t, kh_device_info_t> infos_;
  std::vector<std::string> names_;
  std::vector<Launch> launches_;
};

// Kernel names in a cubin: its symbol strings.
inline std::set<std::string> cubin_strings(const std::string& cubin) {
  std::set<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cubin.size(); ++i)
    if (cubin[i] == '\0') {
      if (i > start) out.insert(cubin.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

// A kDLCUDA view of a tensor (the device pointer is the host address; never dereferenced).
inline DLTensor on_cuda(const DLTensor* t, int32_t device = 0) {
  DLTensor d = *t;
  d.device = DLDevice{kDLCUDA, device};
  return d;
}
inline DLTensor on_cuda(HostTensor& t) {
  return on_cuda(t.dl());
}

// ---- packaging -------------------------------------------------------------------------------
// `kernel-hub check`, plain and --json, accepts each built package directory.
inline void expect_kernel_hub_check_accepts(std::span<const char* const> packages) {
  for (const char* p : packages) {
    test::ProcessResult r =
        test::run_process({test::cli_path(), "check", package_dir(p).string()}, {}, 60);
    EXPECT_EQ(r.exit_code, 0) << p << ":\n" << r.out << r.err;
    r = test::run_process({test::cli_path(), "check", "--json", package_dir(p).string()}, {}, 60);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::string("kernel-hub/") + p), std::string::npos) << r.out;
  }
}

// Each package's kernel.json is a valid registry package manifest whose file digests match and
// whose layers are the module table's, with the same ops, flags and dtypes.
inline void expect_manifest_matches_module(std::span<const char* const> packages) {
  for (const char* p : packages) {
    SCOPED_TRACE(p);
    PackageManifest m = read_package_manifest(package_dir(p));
    EXPECT_EQ(m.name, std::string("kernel-hub/") + p);
    Package pkg(p);
    const ModuleView& view = pkg.module().view;
    EXPECT_EQ(m.version, view.version);  // kernel.json.in and the host library agree
    EXPECT_EQ(m.cuda_source, std::string(p) + ".cu");
    EXPECT_NO_THROW(verify_package_files(package_dir(p), m));
    // The manifest's layers are the module's, one for one, with the same ops, flags and dtypes
    // (the build writes them from the module table: `kernel-hub manifest`).
    EXPECT_EQ(m.layers.size(), view.layers.size());
    for (const kh_layer_v1_t* l : view.layers)
      EXPECT_TRUE(m.layers.contains(l->name)) << "kernel.json lacks module layer " << l->name;
    for (auto& [name, layer] : m.layers) {
      SCOPED_TRACE(name);
      const kh_layer_v1_t* l = view.find_layer(name);
      ASSERT_NE(l, nullptr) << "kernel.json names a layer the module lacks";
      EXPECT_EQ(layer.forward, l->forward);
      EXPECT_EQ(layer.forward_train, l->forward_train ? l->forward_train : "");
      EXPECT_EQ(layer.backward, l->backward ? l->backward : "");
      EXPECT_EQ(layer.has_backward, (l->flags & KH_FLAG_HAS_BACKWARD) != 0);
      EXPECT_EQ(layer.graph_safe, (l->flags & KH_FLAG_GRAPH_SAFE) != 0);
      EXPECT_EQ(layer.deterministic, (l->flags & KH_FLAG_DETERMINISTIC) != 0);
      std::vector<std::string> dtypes;
      if (l->dtypes & KH_DTYPE_BF16) dtypes.push_back("bf16");
      if (l->dtypes & KH_DTYPE_FP16) dtypes.push_back("fp16");
      if (l->dtypes & KH_DTYPE_FP32) dtypes.push_back("fp32");
      EXPECT_EQ(layer.dtypes, dtypes);
    }
  }
}

}  // namespace kh::kernels_test
