// The embedding composition (registry/embed): the C API's status per error kind; the one-call
// kernelize of kernel_hub.hpp against a layout hub (what it binds, its report, its options); and
// kh_runtime_kernelize's statuses for real failures, through libkernel_hub.so as a C program
// uses it.
#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>

#include <cxxabi.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "hub/base/digest.h"
#include "hub/base/fs.h"
#include "hub/hub.h"
#include "hub/store/store.h"
#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/elf_reader.h"
#include "registry/device.h"
#include "registry/embed/status.h"
#include "registry/kernelize.h"
#include "registry/resolver.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernelize_util.h"

namespace kh::test {
namespace {

TEST(EmbedStatus, EveryErrorKindHasItsOwnStatus) {
  const std::pair<ErrorKind, int32_t> expected[] = {
      {ErrorKind::kInvalidInput, KH_ERR_INVALID_ARGUMENT},
      {ErrorKind::kNotFound, KH_ERR_NOT_FOUND},
      {ErrorKind::kNetwork, KH_ERR_NETWORK},
      {ErrorKind::kAuth, KH_ERR_AUTH},
      {ErrorKind::kIntegrity, KH_ERR_INTEGRITY},
      {ErrorKind::kOffline, KH_ERR_OFFLINE},
      {ErrorKind::kIo, KH_ERR_IO},
      {ErrorKind::kUnsupported, KH_ERR_UNSUPPORTED},
      {ErrorKind::kRefused, KH_ERR_REFUSED},
  };
  std::set<int32_t> seen = {KH_OK, KH_ERR_INTERNAL};
  for (auto [kind, status] : expected) {
    SCOPED_TRACE(error_kind_name(kind));
    EXPECT_EQ(status_of(kind), status);
    EXPECT_TRUE(seen.insert(status).second) << "status " << status << " is not this kind's own";
    EXPECT_NE(std::string(status_name(status)), "unknown status");
  }
  EXPECT_STREQ(status_name(KH_ERR_OFFLINE), "KH_ERR_OFFLINE");
  EXPECT_STREQ(status_name(KH_OK), "KH_OK");
  EXPECT_STREQ(status_name(99), "unknown status");
}

// Sets an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) previous_ = v;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (previous_)
      ::setenv(name_, previous_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

// A layout hub with the signed toy package as test/toy, and a cache of the test's own
// ($KERNEL_HUB_CACHE: kernelize picks the store itself).
class EmbedLayout : public ::testing::Test {
 protected:
  void SetUp() override { pack_toy_hub(hub_dir_.path()); }
  EmbedOptions options() const {
    EmbedOptions o;
    o.hub = hub_dir_.path().string();
    return o;
  }
  // The kind of kh::Error kernelize throws for `config` with `o`; nullopt when it succeeds.
  std::optional<ErrorKind> error_of(const std::string& config, const EmbedOptions& o) {
    Runtime rt;
    add_slots(rt, {"Scale", "ScaleInfer"});
    try {
      kernelize(rt, config, o);
    } catch (const Error& e) {
      return e.kind();
    }
    return std::nullopt;
  }

  TempDir hub_dir_{"kh-embed-hub"};
  TempDir cache_{"kh-embed-cache"};
  ScopedEnv cache_env_{"KERNEL_HUB_CACHE", cache_.path().string()};
};

TEST_F(EmbedLayout, OneCallBindsEveryModeFromConfigJson) {
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer", "Unmapped"});
  EmbedReport r = kernelize(rt, toy_config("test/toy"), options());
  ASSERT_EQ(r.bindings.size(), 6u) << r.text;
  EXPECT_EQ(r.fetched, 1u);
  EXPECT_EQ(r.device, local_cpu_device().str());
  const EmbedReport::Binding* scale = r.find("Scale", Mode::kTrain);
  ASSERT_NE(scale, nullptr) << r.text;
  EXPECT_TRUE(scale->bound) << scale->note;
  EXPECT_EQ(scale->source, "hub");
  EXPECT_EQ(scale->package, "toy@1.0.0");
  EXPECT_EQ(scale->kernel, "test/toy@v1:Scale");
  EXPECT_TRUE(scale->index_digest.starts_with("sha256:")) << scale->index_digest;
  EXPECT_TRUE(scale->variant_digest.starts_with("sha256:")) << scale->variant_digest;
  EXPECT_TRUE(std::filesystem::exists(scale->package_dir / "kernel.json"));
  EXPECT_NE(scale->trust.find("signed by"), std::string::npos) << scale->trust;
  // ScaleInfer has no backward op: train keeps the fallback, and the report says why.
  const EmbedReport::Binding* infer = r.find("ScaleInfer", Mode::kTrain);
  ASSERT_NE(infer, nullptr);
  EXPECT_FALSE(infer->bound);
  EXPECT_EQ(infer->source, "fallback");
  EXPECT_FALSE(infer->note.empty());
  EXPECT_FALSE(r.find("Unmapped", Mode::kEval)->bound);
  EXPECT_EQ(r.find("Unmapped", Mode::kTrain)->index_digest, "");
  EXPECT_NE(r.text.find("Scale train: test/toy@v1:Scale toy@1.0.0"), std::string::npos) << r.text;
  nlohmann::json j = nlohmann::json::parse(r.json);
  ASSERT_EQ(j["bindings"].size(), 6u);
  EXPECT_FALSE(j["bindings"][0]["trace"].empty()) << j.dump();

  Vec x({1, 2, 3}), y({0, 0, 0});
  rt.set_mode(Mode::kEval);
  ASSERT_EQ(call_scale(rt, "Scale", x, 2.0, y), KH_OK) << last_op_error();
  EXPECT_EQ(y.data, (std::vector<float>{2, 4, 6}));

  // Another runtime in the same cache: nothing fetched.
  Runtime again;
  add_slots(again, {"Scale"});
  EmbedReport cached = kernelize(again, toy_config("test/toy"), options());
  EXPECT_EQ(cached.fetched, 0u);
  EXPECT_EQ(cached.find("Scale", Mode::kEval)->source, "cache") << cached.text;
}

TEST_F(EmbedLayout, OptionsChooseModesDeviceAndStrictness) {
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer"});
  EmbedOptions eval_only = options();
  eval_only.modes = {Mode::kEval};
  EmbedReport r = kernelize(rt, toy_config("test/toy"), eval_only);
  EXPECT_EQ(r.bindings.size(), 2u) << r.text;
  EXPECT_EQ(r.find("ScaleInfer", Mode::kTrain), nullptr);

  EmbedOptions no_mode = options();
  no_mode.modes.clear();
  EXPECT_EQ(error_of(toy_config("test/toy"), no_mode), ErrorKind::kInvalidInput);
  EmbedOptions gpu = options();
  gpu.device = "gpu";
  EXPECT_EQ(error_of(toy_config("test/toy"), gpu), ErrorKind::kInvalidInput);
  EXPECT_EQ(error_of("{not json", options()), ErrorKind::kInvalidInput);
  // Strict: ScaleInfer is mapped for train but keeps its fallback there.
  EmbedOptions strict = options();
  strict.strict = true;
  EXPECT_EQ(error_of(toy_config("test/toy"), strict), ErrorKind::kRefused);
  EXPECT_EQ(error_of(toy_config("test/toy"), options()), std::nullopt);
}

// libkernel_hub.so, opened as a C program's loader would: only the C API is visible.
struct CApi {
  void* lib = dlopen(KH_LIBKERNEL_HUB, RTLD_NOW | RTLD_LOCAL);
  template <typename F>
  F* get(const char* name) const {
    return reinterpret_cast<F*>(dlsym(lib, name));
  }
  decltype(&kh_runtime_create) create = get<decltype(kh_runtime_create)>("kh_runtime_create");
  decltype(&kh_runtime_destroy) destroy = get<decltype(kh_runtime_destroy)>("kh_runtime_destroy");
  decltype(&kh_runtime_add_slot) add_slot =
      get<decltype(kh_runtime_add_slot)>("kh_runtime_add_slot");
  decltype(&kh_runtime_kernelize) kernelize =
      get<decltype(kh_runtime_kernelize)>("kh_runtime_kernelize");
  decltype(&kh_last_error) last_error = get<decltype(kh_last_error)>("kh_last_error");
  decltype(&kh_status_name) status_name = get<decltype(kh_status_name)>("kh_status_name");
  bool ok() const {
    return lib && create && destroy && add_slot && kernelize && last_error && status_name;
  }
};

// kh_gemm through libkernel_hub.so: a cpu product, and a refusal whose message kh_last_error
// gives (the service itself: tests/unit/test_loader_gemm.cpp).
TEST(EmbedCApi, GemmRunsOnTheCpuAndReportsErrors) {
  CApi c;
  ASSERT_TRUE(c.ok()) << dlerror();
  auto gemm = c.get<decltype(kh_gemm)>("kh_gemm");
  ASSERT_NE(gemm, nullptr);
  float a[2] = {1, 2}, b[2] = {3, 4}, d[1] = {0};
  kh_gemm_t g{};
  g.h = KH_HEADER_INIT(kh_gemm_t);
  g.device_id = KH_DEVICE_CPU;
  g.m = g.n = 1;
  g.k = 2;
  g.dtype_ab = g.dtype_d = KH_DTYPE_FP32;
  g.a = a;
  g.lda = 2;
  g.b = b;
  g.ldb = 1;
  g.d = d;
  g.ldd = 1;
  g.alpha = 1.f;
  ASSERT_EQ(gemm(&g, nullptr), KH_OK) << c.last_error();
  EXPECT_EQ(d[0], 11.f);
  g.ldb = 0;
  EXPECT_EQ(gemm(&g, nullptr), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(c.last_error()).find("ldb is 0"), std::string::npos) << c.last_error();
  EXPECT_EQ(gemm(nullptr, nullptr), KH_ERR_INVALID_ARGUMENT);
}

// The shared library exports the C API and the public C++ API, exactly the symbols of
// tests/sdk/exported_symbols.txt, and nothing else (kernel_hub.map): the static libraries inside
// it keep their other symbols to themselves. (sdk.install checks the installed copy with nm.)
TEST(EmbedCApi, ExportsExactlyThePublicApi) {
  std::string bytes = fs::read_file(KH_LIBKERNEL_HUB, 256u << 20);
  elf::ElfInfo info;
  auto error = elf::parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, info);
  ASSERT_FALSE(error) << error->message;
  std::set<std::string> exported;
  for (const elf::DynamicSymbol& s : info.dynamic_symbols) {
    if (!s.defined || s.bind == STB_LOCAL) continue;
    int status = -1;
    char* demangled = abi::__cxa_demangle(s.name.c_str(), nullptr, nullptr, &status);
    exported.insert(status == 0 ? std::string(demangled) : s.name);
    std::free(demangled);
  }
  std::set<std::string> expected;
  std::istringstream list(fs::read_file(source_dir() / "tests/sdk/exported_symbols.txt", 1u << 20));
  for (std::string line; std::getline(list, line);)
    if (!line.empty() && line[0] != '#') expected.insert(line);
  for (const std::string& name : exported)
    EXPECT_TRUE(expected.count(name)) << name << " is exported but not public";
  for (const std::string& name : expected)
    EXPECT_TRUE(exported.count(name)) << name << " is public but not exported";
}

TEST_F(EmbedLayout, CApiStatusSaysWhichKindOfFailure) {
  CApi c;
  ASSERT_TRUE(c.ok()) << dlerror();
  const std::string hub = hub_dir_.path().string();
  const std::string config = R"({"Scale": "test/toy@v1"})";
  // Runs kh_runtime_kernelize on a fresh runtime; returns (status name, message).
  auto kernelize = [&](const std::string& config_json, const char* lock) {
    kh_runtime_t* rt = c.create(0);
    uint32_t slot = 0;
    EXPECT_EQ(c.add_slot(rt, "Scale", toy_fallback, toy_fallback, nullptr, 0, &slot), KH_OK);
    int32_t status =
        c.kernelize(rt, config_json.c_str(), hub.c_str(), nullptr, 0, 0, lock, nullptr);
    std::pair<std::string, std::string> out{c.status_name(status), c.last_error()};
    c.destroy(rt);
    return out;
  };
  EXPECT_EQ(kernelize(config, nullptr).first, "KH_OK");
  EXPECT_EQ(kernelize("{not json", nullptr).first, "KH_ERR_INVALID_ARGUMENT");

  // A lock for test/toy@v1, and the same lock with another index digest: the hub now serves
  // bytes the lock does not name.
  Store store(cache_.path());
  HubOptions ho;
  ho.progress = false;
  Hub h(HubAddress::parse(hub, false), store, ho);
  KernelizeIndexProvider provider(h);
  LockBuild built = build_lock(KernelConfig::parse(config), {local_cpu_device()}, provider);
  ASSERT_TRUE(built.misses.empty()) << built.misses.front();
  TempDir work("kh-embed-lock");
  built.lock.save(work / "kernels.lock");
  LockFile tampered = built.lock;
  tampered.entries.at(0).index_digest = sha256_of("other bytes");
  tampered.save(work / "tampered.lock");
  EXPECT_EQ(kernelize(config, (work / "kernels.lock").c_str()).first, "KH_OK");
  auto [integrity, why] = kernelize(config, (work / "tampered.lock").c_str());
  EXPECT_EQ(integrity, "KH_ERR_INTEGRITY") << why;
  EXPECT_NE(why.find("test/toy@v1"), std::string::npos) << why;

  // A cache that cannot be created: a file where its parent directory should be.
  {
    fs::write_file_atomic(work / "not-a-dir", "x", 0644);
    ScopedEnv cache("KERNEL_HUB_CACHE", (work / "not-a-dir" / "cache").string());
    auto [status, message] = kernelize(config, nullptr);
    EXPECT_EQ(status, "KH_ERR_IO") << message;
  }
  auto [missing, message] = kernelize(config, (work / "absent.lock").c_str());
  EXPECT_EQ(missing, "KH_ERR_NOT_FOUND") << message;
}

// Unserved entries are reported, never silent: in the C++ report's note and json, and in the C
// API's report JSON ("unserved", each binding's "unserved").
TEST_F(EmbedLayout, UnservedEntriesAreReportedInBothApis) {
  const std::string config = R"({"Scale": {"cpu": {"eval": "test/toy@v9", "train": "test/toy@v1"}},
                                 "ScaleInfer": {"cpu": {"eval": "test/toy@v1:Missing"}}})";
  Runtime rt;
  add_slots(rt, {"Scale", "ScaleInfer"});
  EmbedOptions o = options();
  o.modes = {Mode::kEval};
  EmbedReport r = kernelize(rt, config, o);
  // eval: the v9 entry is missing, the train entry serves (the mode chain): nothing unserved.
  EXPECT_TRUE(r.find("Scale", Mode::kEval)->bound) << r.text;
  const EmbedReport::Binding* missing = r.find("ScaleInfer", Mode::kEval);
  ASSERT_NE(missing, nullptr);
  EXPECT_FALSE(missing->bound);
  EXPECT_EQ(missing->note.rfind("unserved: eval: test/toy@v1:Missing: ", 0), 0u) << missing->note;
  EXPECT_NE(missing->note.find("has no layer Missing (has: Scale, ScaleInfer)"), std::string::npos)
      << missing->note;
  auto j = nlohmann::json::parse(r.json);
  ASSERT_EQ(j["unserved"].size(), 1u) << r.json;
  EXPECT_EQ(j["unserved"][0]["layer"], "ScaleInfer");

  CApi c;
  ASSERT_TRUE(c.ok()) << dlerror();
  auto free_report = c.get<decltype(kh_runtime_free_report)>("kh_runtime_free_report");
  ASSERT_NE(free_report, nullptr);
  kh_runtime_t* crt = c.create(0);
  uint32_t slot = 0;
  ASSERT_EQ(c.add_slot(crt, "Scale", toy_fallback, toy_fallback, nullptr, 0, &slot), KH_OK);
  char* report = nullptr;
  const std::string hub = hub_dir_.path().string();
  ASSERT_EQ(c.kernelize(crt, R"({"Scale": "test/toy@v9"})", hub.c_str(), nullptr, KH_KERNELIZE_EVAL,
                        0, nullptr, &report),
            KH_OK)
      << c.last_error();
  ASSERT_NE(report, nullptr);
  auto cj = nlohmann::json::parse(report);
  free_report(report);
  c.destroy(crt);
  ASSERT_EQ(cj["unserved"].size(), 1u) << cj.dump(2);
  EXPECT_EQ(cj["unserved"][0]["layer"], "Scale");
  std::string reason = cj["unserved"][0]["reason"];
  EXPECT_NE(reason.find("no tag 'v9'"), std::string::npos) << reason;
  EXPECT_NE(reason.find("v1"), std::string::npos) << reason;  // what the hub has
  EXPECT_EQ(cj["bindings"][0]["unserved"], cj["unserved"][0]["reason"]);
}

}  // namespace
}  // namespace kh::test
