// Module loading and the C++ embedding API on the toy package: ABI acceptance and rejection,
// refusals before dlopen, two versions side by side, no GPU, the device-code seam, check.
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <link.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/layer_table.h"
#include "loader/loaded_package.h"
#include "loader/package_check.h"
#include "tests/fixtures/process.h"

namespace kh {

using test::is_loaded;
using test::loaded_matching;
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

std::string pkg(const std::string& variant) {
  return std::string(KH_TOY_PACKAGES_DIR) + "/" + variant;
}
std::string toy(const std::string& variant) {
  return pkg(variant) + "/libtoy.so";
}

const Check* find_check(const PreflightReport& r, const std::string& name) {
  for (const auto& c : r.checks)
    if (c.name == name) return &c;
  return nullptr;
}

// A cpu float32 vector as a DLTensor.
struct Vec {
  std::vector<float> data;
  int64_t shape[1];
  DLTensor t{};
  explicit Vec(std::vector<float> values, DLDeviceType device = kDLCPU) : data(std::move(values)) {
    shape[0] = static_cast<int64_t>(data.size());
    t.data = data.data();
    t.device = {device, 0};
    t.ndim = 1;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
  }
};

std::vector<kh_arg_t> scale_args(const Vec& x, double alpha, const Vec& y) {
  std::vector<kh_arg_t> a(3);
  a[0].kind = KH_ARG_TENSOR;
  a[0].v.t = &x.t;
  a[1].kind = KH_ARG_FLOAT;
  a[1].v.f = alpha;
  a[2].kind = KH_ARG_TENSOR;
  a[2].v.t = &y.t;
  return a;
}

TEST(LoaderModule, GoodPackageLoadsAndValidates) {
  LoadResult r = try_load_module(toy("toy-1.0.0"));
  ASSERT_NE(r.module, nullptr) << r.report.failures();
  const ModuleView& v = r.module->view;
  EXPECT_EQ(v.name, "toy");
  EXPECT_EQ(v.version, "1.0.0");
  EXPECT_EQ(v.abi_minor, KH_ABI_MINOR);
  EXPECT_EQ(v.layers.size(), 2u);
  EXPECT_EQ(v.ops.size(), 3u);
  for (const char* name : {"dlopen", "entry-call", "abi-version", "module-table"}) {
    ASSERT_NE(find_check(r.report, name), nullptr) << name;
  }
  const kh_layer_v1_t* scale = v.find_layer("Scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_TRUE(scale->flags & KH_FLAG_HAS_BACKWARD);
  EXPECT_TRUE(is_loaded(toy("toy-1.0.0")));
  // Loading again returns the same module (one dlopen per path).
  EXPECT_EQ(&load_module(toy("toy-1.0.0")), r.module);
}

TEST(LoaderModule, HigherMinorWithLargerStructsLoads) {
  const LoadedModule& m = load_module(toy("toy-abi-minor-plus"));
  EXPECT_EQ(m.view.abi_minor, KH_ABI_MINOR + 1);
  EXPECT_GT(m.view.struct_size, sizeof(kh_module_v1_t));
  EXPECT_GT(m.view.ops[0]->h.struct_size, sizeof(kh_op_v1_t));
  // Arrays are walked by the element's struct_size: every op is found and callable.
  const kh_op_v1_t* fwd = m.view.find_op("scale_forward");
  ASSERT_NE(fwd, nullptr);
  ASSERT_NE(m.view.find_op("scale_backward"), nullptr);
  Vec x({1, 2, 3}), y({0, 0, 0});
  auto args = scale_args(x, 2.0, y);
  ASSERT_EQ(fwd->call(args.data(), 3, nullptr), KH_OK);
  EXPECT_EQ(y.data, (std::vector<float>{2, 4, 6}));
}

// The major-2 table has poison words right after the header: reading them as ABI 1 pointers
// would crash, so passing this test shows the loader stops at the header.
TEST(LoaderModule, AnotherMajorIsRejectedAtTheHeader) {
  LoadResult r = try_load_module(toy("toy-abi-major-2"));
  EXPECT_EQ(r.module, nullptr);
  const Check* c = find_check(r.report, "abi-version");
  ASSERT_NE(c, nullptr) << r.report.failures();
  EXPECT_FALSE(c->passed);
  EXPECT_NE(c->message.find("rule abi-version"), std::string::npos) << c->message;
  EXPECT_NE(c->message.find("ABI 2.0"), std::string::npos) << c->message;
  EXPECT_EQ(find_check(r.report, "module-table"), nullptr);
  try {
    load_module(toy("toy-abi-major-2"));
    FAIL() << "load_module accepted another ABI major";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
  }
}

// A library refused after dlopen stays mapped under the name it was opened with,
// /proc/self/fd/N: the next library verified on the same descriptor number must still be the
// one that loads (glibc would otherwise hand back the refused library's handle).
TEST(LoaderModule, ALibraryRefusedAfterDlopenCannotStandInForTheNext) {
  EXPECT_EQ(try_load_module(toy("toy-abi-major-2")).module, nullptr);
  LoadResult r = try_load_module(toy("toy-2.0.0"));
  ASSERT_NE(r.module, nullptr) << r.report.failures();
  EXPECT_EQ(r.module->view.version, "2.0.0");
}

// A library refused after dlopen and tried again holds one descriptor, not one more a try (a
// server that rebinds would run out of them).
TEST(LoaderModule, RetryingARefusedLibraryHoldsNoMoreDescriptors) {
  auto open_fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                         std::filesystem::directory_iterator());
  };
  EXPECT_EQ(try_load_module(toy("toy-abi-major-2")).module, nullptr);
  const auto before = open_fds();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(try_load_module(toy("toy-abi-major-2")).module, nullptr);
  EXPECT_LE(open_fds(), before + 1);
}

// A library the application loaded itself (the same file) is not taken for another library's
// reused name: the loader binds it.
TEST(LoaderModule, ALibraryTheApplicationLoadedItselfStillLoads) {
  void* own = dlopen(toy("toy-2.0.0").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(own, nullptr) << dlerror();
  LoadResult r = try_load_module(toy("toy-2.0.0"));
  ASSERT_NE(r.module, nullptr) << r.report.failures();
  EXPECT_EQ(r.module->view.version, "2.0.0");
}

// Other code that dlopened a library by /proc/self/fd/N and closed N leaves that name to whatever
// gets N next: when it is the loader's verified file, the other library must not be taken for it
// (judged by the inode mapped, not the name).
TEST(LoaderModule, AStaleFdNameOfAnotherLibraryIsNotTakenForTheVerifiedOne) {
  const int other = ::open(toy("toy-1.0.0").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(other, 0);
  const std::string name = "/proc/self/fd/" + std::to_string(other);
  ASSERT_NE(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL), nullptr) << dlerror();
  ::close(other);  // the loader's next open takes this number
  LoadResult r = try_load_module(toy("toy-2.0.0"));
  if (r.module) {
    EXPECT_EQ(r.module->view.version, "2.0.0") << "toy 1.0.0 ran in its place";
  }
}

// Refusals that must happen before dlopen: the library never appears in the link map.
TEST(LoaderModule, PreflightRefusalsHappenBeforeDlopen) {
  struct Case {
    std::string variant, rule, mentions;
  };
  for (const Case& c : {Case{"toy-no-entry", "entry-symbol", "kh_module_v1"},
                        Case{"toy-cudart", "needed-libraries", "libcudart.so.13"},
                        Case{"toy-rpath", "no-rpath", "/opt/elsewhere/lib"}}) {
    LoadResult r = try_load_module(toy(c.variant));
    EXPECT_EQ(r.module, nullptr) << c.variant;
    const Check* failed = find_check(r.report, c.rule);
    ASSERT_NE(failed, nullptr) << c.variant << ": " << r.report.failures();
    EXPECT_FALSE(failed->passed);
    EXPECT_NE(failed->message.find(c.mentions), std::string::npos) << failed->message;
    EXPECT_NE(failed->message.find(stdfs::canonical(toy(c.variant)).string()), std::string::npos)
        << failed->message;
    EXPECT_EQ(find_check(r.report, "dlopen"), nullptr) << c.variant << " reached dlopen";
    EXPECT_FALSE(is_loaded(toy(c.variant))) << c.variant;
  }
  EXPECT_TRUE(loaded_matching("libcudart").empty());
}

TEST(LoaderModule, AnotherMachineIsRefusedBeforeDlopen) {
  TempDir dir;
  std::string bytes = fs::read_file(toy("toy-1.0.0"));
  uint16_t m = EM_AARCH64;
#if defined(__aarch64__)
  m = EM_X86_64;
#endif
  std::memcpy(bytes.data() + offsetof(Elf64_Ehdr, e_machine), &m, sizeof m);
  stdfs::path lib = dir.path() / "libtoy.so";
  fs::write_file_atomic(lib, bytes, 0755);
  LoadResult r = try_load_module(lib);
  EXPECT_EQ(r.module, nullptr);
  ASSERT_EQ(r.report.checks.size(), 1u) << r.report.failures();
  EXPECT_EQ(r.report.checks[0].name, "elf-header");
  EXPECT_NE(r.report.checks[0].message.find("rule elf-header"), std::string::npos);
  EXPECT_FALSE(is_loaded(lib.string()));
}

TEST(LoaderModule, TwoVersionsLiveSideBySide) {
  Runtime rt;
  uint32_t a = rt.add_slot("Scale");
  uint32_t b = rt.add_slot("ScaleNext");
  EXPECT_EQ(rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval), BindOutcome::kBound);
  EXPECT_EQ(rt.bind("ScaleNext", pkg("toy-2.0.0"), Mode::kEval, kCpuDevice, "Scale"),
            BindOutcome::kBound);
  rt.set_mode(Mode::kEval);
  Vec x({1, 2, 3}), y1({0, 0, 0}), y2({0, 0, 0});
  auto args1 = scale_args(x, 3.0, y1);
  auto args2 = scale_args(x, 3.0, y2);
  ASSERT_EQ(rt.forward(a, kCpuDevice, args1.data(), 3, nullptr), KH_OK) << last_op_error();
  ASSERT_EQ(rt.forward(b, kCpuDevice, args2.data(), 3, nullptr), KH_OK) << last_op_error();
  EXPECT_EQ(y1.data, (std::vector<float>{3, 6, 9}));   // 1.0.0: x * alpha
  EXPECT_EQ(y2.data, (std::vector<float>{4, 7, 10}));  // 2.0.0: x * alpha + 1
  const Table* t = rt.table().current();
  EXPECT_NE(t->entry(kCpuDevice, a).forward, t->entry(kCpuDevice, b).forward);
  EXPECT_STREQ(t->entry(kCpuDevice, a).source, "toy 1.0.0 Scale");
  EXPECT_STREQ(t->entry(kCpuDevice, b).source, "toy 2.0.0 Scale");
  EXPECT_TRUE(is_loaded(toy("toy-1.0.0")));
  EXPECT_TRUE(is_loaded(toy("toy-2.0.0")));
}

int32_t fallback_forward(const kh_arg_t*, int32_t, void*) {
  return 77;
}

TEST(LoaderModule, RuntimeBindsPerModeAndKeepsFallbackWithoutBackward) {
  std::vector<std::string> lines;
  LogSink previous = set_log_sink([&](int, const std::string& l) { lines.push_back(l); });
  Runtime rt;
  uint32_t s = rt.add_slot("Scale", {fallback_forward, nullptr, nullptr, 0});
  EXPECT_EQ(rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval), BindOutcome::kBound);
  EXPECT_EQ(rt.bind("Scale", pkg("toy-1.0.0"), Mode::kTrain, kCpuDevice, "ScaleInfer"),
            BindOutcome::kKeptFallback);
  set_log_sink(previous);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("no backward"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("ScaleInfer"), std::string::npos) << lines[0];

  rt.set_mode(Mode::kTrain);
  EXPECT_EQ(rt.forward(s, kCpuDevice, nullptr, 0, nullptr), 77);  // the fallback serves train
  EXPECT_THROW(rt.bind("Scale", pkg("toy-1.0.0"), Mode::kTrain, kCpuDevice, "ScaleInfer", true),
               Error);
  // With a backward op, train binds forward_train and backward.
  EXPECT_EQ(rt.bind("Scale", pkg("toy-1.0.0"), Mode::kTrain), BindOutcome::kBound);
  const LoadedModule& m = load_module(toy("toy-1.0.0"));
  const SlotEntry& train = rt.table().current()->entry(kCpuDevice, s);
  EXPECT_EQ(train.forward, m.view.find_op("scale_forward_train")->call);
  EXPECT_EQ(train.backward, m.view.find_op("scale_backward")->call);
  rt.set_mode(Mode::kEval);
  EXPECT_EQ(rt.table().current()->entry(kCpuDevice, s).forward,
            m.view.find_op("scale_forward")->call);

  Vec dy({1, 1}), dx({0, 0});
  auto args = scale_args(dy, 5.0, dx);
  rt.set_mode(Mode::kTrain);
  ASSERT_EQ(rt.backward(s, kCpuDevice, args.data(), 3, nullptr), KH_OK) << last_op_error();
  EXPECT_EQ(dx.data, (std::vector<float>{5, 5}));
}

TEST(LoaderModule, OpErrorsReachTheHostSink) {
  Runtime rt;
  uint32_t s = rt.add_slot("Scale");
  rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval);
  Vec x({1}), y({0});
  auto args = scale_args(x, 1.0, y);
  EXPECT_EQ(rt.forward(s, kCpuDevice, args.data(), 2, nullptr), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_op_error().find("toy 1.0.0"), std::string::npos) << last_op_error();
  EXPECT_NE(last_op_error().find("expected arguments"), std::string::npos) << last_op_error();
  uint32_t empty = rt.add_slot("Empty");
  EXPECT_EQ(rt.forward(empty, kCpuDevice, nullptr, 0, nullptr), KH_ERR_NOT_FOUND);
  EXPECT_NE(last_op_error().find("Empty"), std::string::npos);
}

// No GPU: binding and running cpu ops never loads libcuda; a GPU bind and a CUDA tensor get a
// clear error naming the cause.
TEST(LoaderModule, CpuWorksWithoutLibcuda) {
  // No driver even on a GPU machine: the driver library's name is read at the first GPU use.
  setenv("KERNEL_HUB_LIBCUDA", "libcuda-absent-for-this-test.so.1", 1);
  Runtime rt;
  uint32_t s = rt.add_slot("Scale");
  rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval);
  Vec x({1, 2}), y({0, 0});
  auto args = scale_args(x, 2.0, y);
  ASSERT_EQ(rt.forward(s, kCpuDevice, args.data(), 3, nullptr), KH_OK) << last_op_error();
  EXPECT_EQ(y.data, (std::vector<float>{2, 4}));
  EXPECT_TRUE(loaded_matching("libcuda").empty()) << loaded_matching("libcuda")[0];
  EXPECT_THROW(rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval, 0), Error);
  Vec gx({1, 2}, kDLCUDA), gy({0, 0}, kDLCUDA);  // never dereferenced: no driver
  auto gargs = scale_args(gx, 2.0, gy);
  EXPECT_EQ(rt.forward(s, kCpuDevice, gargs.data(), 3, nullptr), KH_ERR_NO_DEVICE);
  EXPECT_NE(last_op_error().find("not found: no NVIDIA driver"), std::string::npos)
      << last_op_error();
  EXPECT_NE(last_op_error().find("toy_scale_f32"), std::string::npos);
  EXPECT_TRUE(loaded_matching("libcuda").empty()) << loaded_matching("libcuda")[0];
}

// The seam a CUDA backend plugs into: the package's launcher asks for its kernel by name and
// launches it with the geometry and parameters it chose.
class RecordingBackend : public DeviceBackend {
 public:
  int32_t get_function(const PackageIdentity& package, int32_t device_id, const char* name,
                       void** fn, std::string&) override {
    package_dir = package.package_dir;
    device = device_id;
    kernel = name;
    *fn = this;
    return KH_OK;
  }
  int32_t launch(const PackageIdentity&, void* fn, const kh_launch_cfg_t& cfg, void** args, void* s,
                 std::string&) override {
    launched_fn = fn;
    grid = cfg.grid[0];
    block = cfg.block[0];
    stream = s;
    n = *static_cast<long long*>(args[4]);
    return KH_OK;
  }
  stdfs::path package_dir;
  int32_t device = -9;
  std::string kernel;
  void* launched_fn = nullptr;
  uint32_t grid = 0, block = 0;
  void* stream = nullptr;
  long long n = 0;
};

TEST(LoaderModule, CudaTensorsGoThroughTheHostServices) {
  Runtime rt;
  uint32_t s = rt.add_slot("Scale");
  RecordingBackend backend;  // installed before the bind: a GPU bind prepares through it
  set_device_backend(&backend);
  rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval, 1);
  std::vector<float> big(1000, 1.0f);
  Vec gx(big, kDLCUDA), gy(big, kDLCUDA);
  gx.t.device.device_id = gy.t.device.device_id = 1;
  auto args = scale_args(gx, 2.0, gy);
  int dummy_stream = 0;
  int32_t status = rt.forward(s, 1, args.data(), 3, &dummy_stream);
  set_device_backend(nullptr);
  ASSERT_EQ(status, KH_OK) << last_op_error();
  EXPECT_EQ(backend.kernel, "toy_scale_f32");
  EXPECT_EQ(backend.device, 1);
  EXPECT_EQ(backend.package_dir, stdfs::canonical(pkg("toy-1.0.0")));
  EXPECT_EQ(backend.launched_fn, &backend);
  EXPECT_EQ(backend.grid, 4u);
  EXPECT_EQ(backend.block, 256u);
  EXPECT_EQ(backend.stream, &dummy_stream);
  EXPECT_EQ(backend.n, 1000);
}

TEST(LoaderModule, PackageDirectoryRules) {
  TempDir dir;
  EXPECT_THROW(
      {
        try {
          load_package(dir.path());
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
          throw;
        }
      },
      Error);
  fs::write_file_atomic(dir.path() / "kernel.json",
                        R"({"name":"toy","version":"1.0.0","host_library":"../libtoy.so"})");
  EXPECT_THROW(load_package(dir.path()), Error);
  // A NUL in a name would open "libtoy.so" but look its digest up under the whole name.
  fs::write_file_atomic(dir.path() / "kernel.json",
                        R"({"name":"toy","version":"1.0.0","host_library":"libtoy.so\u0000x"})");
  try {
    load_package(dir.path());
    FAIL() << "a name with a NUL was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    EXPECT_NE(std::string(e.what()).find("must be a file name"), std::string::npos) << e.what();
  }
  // kernel.json and the module must agree on name and version.
  fs::write_file_atomic(dir.path() / "libtoy.so", fs::read_file(toy("toy-1.0.0")), 0755);
  fs::write_file_atomic(dir.path() / "kernel.json",
                        R"({"name":"toy","version":"9.9.9","host_library":"libtoy.so"})");
  try {
    load_package(dir.path());
    FAIL() << "identity mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("package-identity"), std::string::npos) << e.what();
  }
}

TEST(LoaderModule, CheckReportsLayersOpsAndChecks) {
  PackageCheck good = check_package(pkg("toy-1.0.0"));
  ASSERT_TRUE(good.ok()) << good.report.failures();
  auto j = good.to_json();
  EXPECT_EQ(j["module"]["name"], "toy");
  EXPECT_EQ(j["module"]["layers"].size(), 2u);
  EXPECT_EQ(j["module"]["layers"][0]["flags"][0], "HAS_BACKWARD");
  EXPECT_EQ(j["module"]["ops"].size(), 3u);
  EXPECT_NE(good.to_text().find("scale_backward"), std::string::npos);

  PackageCheck bad = check_package(pkg("toy-cudart"));
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(bad.to_json()["ok"].get<bool>());
  EXPECT_NE(bad.to_text().find("FAIL  needed-libraries"), std::string::npos) << bad.to_text();

  PackageCheck major = check_package(toy("toy-abi-major-2"));  // a file, not a directory
  EXPECT_FALSE(major.ok());
  EXPECT_NE(major.report.failures().find("abi-version"), std::string::npos);
}

}  // namespace
}  // namespace kh
