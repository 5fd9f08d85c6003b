// The device-code half of the loader, on a machine without a GPU: CUDA architectures and the
// choice of device code (table-driven), kernel.json's device-code fields, NVRTC compiles (NVRTC
// needs no GPU), the JIT cache (keys, verified entries, a flipped byte rebuilt, 8 processes
// compiling one key once), and GPU binds failing with a clear error when no driver is reachable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <link.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/cuda_arch.h"
#include "loader/cuda_driver.h"
#include "loader/device_backend.h"
#include "loader/device_code.h"
#include "loader/jit_cache.h"
#include "loader/nvrtc.h"
#include "loader/package_dir.h"
#include "tests/fixtures/process.h"

namespace kh {

using test::loaded_matching;
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

std::string pkg(const std::string& variant) {
  return std::string(KH_TOY_PACKAGES_DIR) + "/" + variant;
}

std::string toy_source() {
  return fs::read_file(std::string(KH_SOURCE_DIR) + "/tests/packages/toy/toy.cu");
}

// NVRTC, or a skip saying why not.
const NvrtcInfo* nvrtc_or_null(std::string* why) {
  try {
    return &nvrtc();
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
}

#define REQUIRE_NVRTC()                                      \
  std::string nvrtc_missing;                                 \
  const NvrtcInfo* compiler = nvrtc_or_null(&nvrtc_missing); \
  if (!compiler) GTEST_SKIP() << nvrtc_missing

CudaArch arch(const std::string& s) {
  auto a = CudaArch::parse(s);
  if (!a) throw std::runtime_error("bad arch in test: " + s);
  return *a;
}

// --- architectures ---

TEST(LoaderJit, CudaArchParsesAndPrints) {
  EXPECT_EQ(arch("90").sm(), "sm_90");
  EXPECT_EQ(arch("sm_90a").number(), "90a");
  EXPECT_EQ(arch("100f").major, 10);
  EXPECT_EQ(arch("100f").minor, 0);
  EXPECT_EQ(arch("86").minor, 6);
  for (const char* bad : {"", "9", "sm_", "x90", "9000", "90b", "sm_90aa", "05"})
    EXPECT_FALSE(CudaArch::parse(bad)) << bad;
}

TEST(LoaderJit, CubinCompatibility) {
  struct Row {
    const char* code;
    const char* gpu;
    bool runs;
  } rows[] = {
      {"90", "90", true},  {"80", "86", true},   {"86", "80", false},   {"80", "90", false},
      {"90a", "90", true}, {"90a", "91", false}, {"100f", "100", true}, {"90", "100", false},
  };
  for (const auto& r : rows)
    EXPECT_EQ(cubin_runs_on(arch(r.code), arch(r.gpu)), r.runs) << r.code << " on " << r.gpu;
}

// --- choice of device code (table-driven) ---

TEST(LoaderJit, DeviceCodeChoiceTable) {
  struct Row {
    std::vector<std::string> cubins;
    bool source;
    std::string gpu;
    DeviceCodeKind kind;
    std::string arch;  // chosen cubin target or NVRTC target
  } rows[] = {
      {{"90"}, true, "90", DeviceCodeKind::kCubin, "90"},               // exact
      {{"90"}, false, "90", DeviceCodeKind::kCubin, "90"},              // exact, no source needed
      {{"90", "90a"}, true, "90", DeviceCodeKind::kCubin, "90a"},       // arch-specific preferred
      {{"80", "86", "89"}, false, "87", DeviceCodeKind::kCubin, "86"},  // same major, lower minor
      {{"80"}, false, "86", DeviceCodeKind::kCubin, "80"},
      {{"86a"}, true, "89", DeviceCodeKind::kSource, "89"},  // 86a never on another minor
      {{"86a"}, false, "89", DeviceCodeKind::kNone, "89"},
      {{"90a"}, true, "90", DeviceCodeKind::kCubin, "90a"},    // 90a only on 90
      {{"89"}, true, "86", DeviceCodeKind::kSource, "86"},     // higher minor never
      {{"90"}, true, "100", DeviceCodeKind::kSource, "100a"},  // other major never; NVRTC: "a"
      {{"80", "90"}, true, "120", DeviceCodeKind::kSource, "120a"},
      {{}, true, "90", DeviceCodeKind::kSource, "90a"},  // source fallback, arch-specific
      {{}, false, "90", DeviceCodeKind::kNone, "90"},    // nothing
      {{"100"}, false, "90", DeviceCodeKind::kNone, "90"},
  };
  for (const auto& r : rows) {
    std::map<CudaArch, stdfs::path> cubins;
    for (const auto& c : r.cubins) cubins[arch(c)] = "/pkg/toy.sm_" + c + ".cubin";
    stdfs::path source = r.source ? "/pkg/toy.cu" : "";
    auto choice = choose_device_code(cubins, source, arch(r.gpu), "toy 1.0.0", "GPU X");
    std::string label = "cubins " + std::to_string(r.cubins.size()) + " source " +
                        std::to_string(r.source) + " gpu " + r.gpu;
    EXPECT_EQ(choice.kind, r.kind) << label << ": " << choice.reason;
    EXPECT_EQ(choice.arch, arch(r.arch)) << label;
    if (r.kind == DeviceCodeKind::kCubin) {
      EXPECT_EQ(choice.file, "/pkg/toy.sm_" + r.arch + ".cubin") << label;
    }
    if (r.kind == DeviceCodeKind::kSource) {
      EXPECT_EQ(choice.file, "/pkg/toy.cu") << label;
    }
  }
}

TEST(LoaderJit, NoDeviceCodeErrorListsWhatThePackageHasAndWhatTheGpuIs) {
  std::map<CudaArch, stdfs::path> cubins{{arch("80"), "a"}, {arch("100a"), "b"}};
  auto choice =
      choose_device_code(cubins, "", arch("90"), "toy 1.0.0 (/pkg)", "CUDA device 0, NVIDIA H200");
  ASSERT_EQ(choice.kind, DeviceCodeKind::kNone);
  for (const char* part : {"toy 1.0.0 (/pkg)", "CUDA device 0, NVIDIA H200", "sm_90",
                           "cubins for sm_80, sm_100a", "no CUDA source", "cpu device"})
    EXPECT_NE(choice.reason.find(part), std::string::npos) << part << " in: " << choice.reason;
  auto empty = choose_device_code({}, "", arch("90"), "toy", "GPU");
  EXPECT_NE(empty.reason.find("no cubins and no CUDA source"), std::string::npos) << empty.reason;
}

// --- kernel.json device-code fields ---

TEST(LoaderJit, PackageDirReadsCubinsAndSource) {
  PackageDir p = read_package_dir(pkg("toy-1.0.0"));
  EXPECT_EQ(p.cuda_source, stdfs::path(pkg("toy-1.0.0")) / "toy.cu");
  EXPECT_TRUE(stdfs::exists(p.cuda_source));
  if (std::string(KH_TOY_CUBIN_ARCHS).empty()) {
    EXPECT_TRUE(p.cubins.empty());
  } else {
    ASSERT_EQ(p.cubins.count("90"), 1u);
    EXPECT_TRUE(stdfs::exists(p.cubins.at("90"))) << p.cubins.at("90");
  }
  PackageDir none = read_package_dir(pkg("toy-no-device-code"));
  EXPECT_TRUE(none.cubins.empty());
  EXPECT_TRUE(none.cuda_source.empty());
}

TEST(LoaderJit, PackageDirRefusesBadDeviceCodeFields) {
  TempDir dir;
  auto refused = [&](const std::string& extra, const std::string& expect) {
    fs::write_file_atomic(
        dir / "kernel.json",
        R"({"name": "t", "version": "1", "host_library": "libt.so")" + extra + "}");
    try {
      read_package_dir(dir.path());
      ADD_FAILURE() << "accepted: " << extra;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  };
  refused(R"(, "cubins": {"9x": "a.cubin"})", "not a CUDA architecture");
  refused(R"(, "cubins": {"sm_90": "a.cubin"})", "not a CUDA architecture");
  refused(R"(, "cubins": {"90": "../a.cubin"})", "must be a file name inside");
  refused(R"(, "cubins": {"90": 3})", "must be a file name");
  refused(R"(, "cubins": ["90"])", "must be an object");
  refused(R"(, "cuda_source": "/etc/passwd")", "must be a file name inside");
  refused(R"(, "cuda_source": 1)", "must be a file name");
}

// --- NVRTC (no GPU needed) ---

TEST(LoaderJit, NvrtcOptions) {
  auto o13 = nvrtc_options(arch("90"), {13, 0});
  EXPECT_TRUE(std::is_sorted(o13.begin(), o13.end()));
  for (const char* want : {"--gpu-architecture=sm_90", "--std=c++17", "-default-device",
                           "--no-cache", "--modify-stack-limit=false"})
    EXPECT_NE(std::find(o13.begin(), o13.end(), want), o13.end()) << want;
  auto o12 = nvrtc_options(arch("80"), {12, 8});
  EXPECT_EQ(std::find(o12.begin(), o12.end(), "--no-cache"), o12.end());
  EXPECT_NE(std::find(o12.begin(), o12.end(), "--gpu-architecture=sm_80"), o12.end());
}

TEST(LoaderJit, NvrtcCompilesTheToySourceForSm80AndSm90) {
  REQUIRE_NVRTC();
  EXPECT_GE(compiler->version.major, 12);
  std::string source = toy_source();
  std::map<std::string, std::string> cubins;
  for (const char* target : {"80", "90"}) {
    auto opts = nvrtc_options(arch(target), compiler->version);
    std::string cubin = nvrtc_compile_cubin(source, "toy.cu", opts, "toy.cu");
    ASSERT_GT(cubin.size(), 64u);
    EXPECT_EQ(cubin.substr(0, 4),
              "\x7f"
              "ELF")
        << target;
    EXPECT_NE(cubin.find("toy_scale_f32"), std::string::npos) << target;
    cubins[target] = cubin;
  }
  EXPECT_NE(cubins["80"], cubins["90"]);
  // Deterministic: the same inputs give the same bytes, which is what makes a key-addressed
  // cache sound.
  EXPECT_EQ(
      nvrtc_compile_cubin(source, "toy.cu", nvrtc_options(arch("90"), compiler->version), "toy.cu"),
      cubins["90"]);
}

TEST(LoaderJit, NvrtcCompileErrorCarriesTheLogWithFileAndLine) {
  REQUIRE_NVRTC();
  const std::string bad =
      "extern \"C\" __global__ void broken(float* y) {\n"
      "  y[0] = undefined_name;\n"
      "}\n";
  try {
    nvrtc_compile_cubin(bad, "broken.cu", nvrtc_options(arch("90"), compiler->version),
                        "/pkgs/broken/broken.cu");
    FAIL() << "a broken source compiled";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(m.find("/pkgs/broken/broken.cu"), std::string::npos) << m;
    EXPECT_NE(m.find("broken.cu(2)"), std::string::npos) << m;  // file(line) from NVRTC's log
    EXPECT_NE(m.find("undefined_name"), std::string::npos) << m;
    EXPECT_NE(m.find("sm_90"), std::string::npos) << m;
  }
}

// --- JIT cache ---

JitKeyInput base_key_input(const std::string& source) {
  JitKeyInput k;
  k.abi_major = 1;
  k.source = source;
  k.options = {"--std=c++17", "--gpu-architecture=sm_90"};
  k.nvrtc_major = 13;
  k.nvrtc_minor = 0;
  k.target = "sm_90";
  return k;
}

TEST(LoaderJit, KeyCoversEveryInput) {
  const std::string src = "a", src2 = "b";
  JitKeyInput base = base_key_input(src);
  Digest k0 = jit_cache_key(base);
  EXPECT_EQ(k0.hex.size(), 64u);
  std::vector<JitKeyInput> changed(7, base);
  changed[0].source = src2;
  changed[1].abi_major = 2;
  changed[2].options.push_back("--use_fast_math");
  changed[3].nvrtc_minor = 1;
  changed[4].target = "sm_90a";
  changed[5].headers = {{"h.cuh", "x"}};
  changed[6].nvrtc_major = 12;
  for (size_t i = 0; i < changed.size(); ++i)
    EXPECT_NE(jit_cache_key(changed[i]), k0) << "input " << i;
  // Option order does not matter; field boundaries do (length prefixes).
  JitKeyInput reordered = base;
  std::swap(reordered.options[0], reordered.options[1]);
  EXPECT_EQ(jit_cache_key(reordered), k0);
  JitKeyInput h1 = base, h2 = base;
  h1.headers = {{"ab", "c"}};
  h2.headers = {{"a", "bc"}};
  EXPECT_NE(jit_cache_key(h1), jit_cache_key(h2));
}

TEST(LoaderJit, EntryEncodingIsVerified) {
  const std::string payload =
      "\x7f"
      "ELF payload bytes";
  std::string entry = encode_jit_entry(payload);
  ASSERT_EQ(entry.size(), kJitEntryHeaderSize + payload.size());
  std::string why;
  ASSERT_EQ(decode_jit_entry(entry, &why).value_or("?"), payload) << why;
  for (size_t i = 0; i < entry.size(); ++i) {  // every single flipped byte is caught
    std::string damaged = entry;
    damaged[i] = static_cast<char>(damaged[i] ^ 0x01);
    EXPECT_FALSE(decode_jit_entry(damaged, &why)) << "flip at " << i;
  }
  EXPECT_FALSE(decode_jit_entry(entry.substr(0, entry.size() - 1), &why));
  EXPECT_NE(why.find("payload size"), std::string::npos) << why;
  EXPECT_FALSE(decode_jit_entry(entry.substr(0, 10), &why));
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
  EXPECT_FALSE(decode_jit_entry(entry + "x", &why));
}

TEST(LoaderJit, FlippedByteInAnEntryIsAMissAndARebuild) {
  TempDir dir;
  JitCache cache(dir / "jit");
  const std::string src = "source " + fs::random_hex(8);
  Digest key = jit_cache_key(base_key_input(src));
  int builds = 0;
  auto build = [&] {
    ++builds;
    return std::string("cubin-for-") + src;
  };
  auto r1 = cache.get_or_build(key, build);
  EXPECT_TRUE(r1.built);
  EXPECT_EQ(builds, 1);
  auto r2 = cache.get_or_build(key, build);
  EXPECT_FALSE(r2.built);
  EXPECT_EQ(r2.payload, r1.payload);
  EXPECT_EQ(builds, 1);

  // Flip one payload byte in place (a bit rot, not a rewrite).
  stdfs::path entry = cache.entry_path(key);
  ASSERT_TRUE(stdfs::exists(entry));
  {
    int fd = ::open(entry.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c = 0;
    off_t at = static_cast<off_t>(kJitEntryHeaderSize + 3);
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c = static_cast<char>(c ^ 0x20);
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ::close(fd);
  }
  EXPECT_FALSE(cache.lookup(key));
  EXPECT_FALSE(stdfs::exists(entry)) << "a damaged entry is deleted";
  auto r3 = cache.get_or_build(key, build);
  EXPECT_TRUE(r3.built);
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(r3.payload, r1.payload);
  EXPECT_EQ(cache.lookup(key).value_or("?"), r1.payload);

  // Truncation too.
  stdfs::resize_file(entry, 20);
  auto r4 = cache.get_or_build(key, build);
  EXPECT_TRUE(r4.built);
  EXPECT_EQ(builds, 3);
  // No temp files left behind.
  for (const auto& f : stdfs::directory_iterator(dir / "jit"))
    EXPECT_EQ(f.path().extension() != ".part", true) << f.path();
}

// 8 processes ask for one key at once: exactly one compiles (with the real NVRTC), all get the
// same verified cubin.
TEST(LoaderJit, EightProcessesCompileOneKeyOnce) {
  REQUIRE_NVRTC();
  TempDir dir;
  const stdfs::path jit_dir = dir / "jit";
  const stdfs::path marker = dir / "compiles.log";
  // A fresh key: a comment makes this source unique to this run.
  const std::string source = toy_source() + "\n// run " + fs::random_hex(16) + "\n";
  const auto options = nvrtc_options(arch("90"), compiler->version);
  JitKeyInput in = base_key_input(source);
  in.options = options;
  in.nvrtc_major = compiler->version.major;
  in.nvrtc_minor = compiler->version.minor;
  const Digest key = jit_cache_key(in);

  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < 8; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      char c;
      if (::read(go[0], &c, 1) != 0) _exit(10);  // wait until the parent closes the pipe
      int code = 0;
      try {
        JitCache cache(jit_dir);
        auto r = cache.get_or_build(key, [&] {
          int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
          std::string line = std::to_string(::getpid()) + "\n";
          if (fd < 0 || ::write(fd, line.data(), line.size()) < 0) _exit(11);
          ::close(fd);
          return nvrtc_compile_cubin(source, "toy.cu", options, "toy.cu");
        });
        if (r.payload.substr(0, 4) !=
            "\x7f"
            "ELF")
          code = 12;
      } catch (...) {
        code = 13;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);  // all children start now
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  std::string log = fs::read_file(marker);
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "compiles by pid:\n" << log;
  JitCache cache(jit_dir);
  auto entry = cache.lookup(key);
  ASSERT_TRUE(entry);
  EXPECT_EQ(entry->substr(0, 4),
            "\x7f"
            "ELF");
}

// --- no driver ---

// With no libcuda reachable: cpu binding works and never loads the driver; a GPU bind and a
// CUDA tensor fail with an error naming the cause and suggesting the cpu device.
TEST(LoaderJit, NoDriverCpuWorksGpuBindFailsClearly) {
  ASSERT_FALSE(cuda::cuda_driver_attempted()) << "run this test in its own process";
  // Hide the driver even on a GPU machine (read once, at the first GPU use).
  setenv("KERNEL_HUB_LIBCUDA", "libcuda-absent-for-this-test.so.1", 1);
  Runtime rt;
  uint32_t slot = rt.add_slot("Scale");
  rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval);
  rt.set_mode(Mode::kEval, {nullptr});  // no driver used yet: no capture, no driver load
  EXPECT_FALSE(cuda::cuda_driver_attempted());
  EXPECT_TRUE(loaded_matching("libcuda").empty());
  try {
    rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval, 0);
    FAIL() << "a GPU bind succeeded without a driver";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(m.find("libcuda-absent-for-this-test.so.1 not found: no NVIDIA driver on this "
                     "machine"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("bind the cpu device instead"), std::string::npos) << m;
  }
  EXPECT_TRUE(loaded_matching("libcuda").empty());
  // The cpu binding still serves; a CUDA tensor reaching the op gets KH_ERR_NO_DEVICE.
  float xs[2] = {1, 2}, ys[2] = {0, 0};
  int64_t shape[1] = {2};
  DLTensor x{}, y{};
  x.data = xs;
  y.data = ys;
  x.device = y.device = {kDLCPU, 0};
  x.ndim = y.ndim = 1;
  x.dtype = y.dtype = {kDLFloat, 32, 1};
  x.shape = y.shape = shape;
  kh_arg_t args[3];
  args[0].kind = KH_ARG_TENSOR;
  args[0].v.t = &x;
  args[1].kind = KH_ARG_FLOAT;
  args[1].v.f = 3.0;
  args[2].kind = KH_ARG_TENSOR;
  args[2].v.t = &y;
  ASSERT_EQ(rt.forward(slot, kCpuDevice, args, 3, nullptr), KH_OK) << last_op_error();
  EXPECT_EQ(ys[1], 6.0f);
  x.device = y.device = {kDLCUDA, 0};
  EXPECT_EQ(rt.forward(slot, kCpuDevice, args, 3, nullptr), KH_ERR_NO_DEVICE);
  EXPECT_NE(last_op_error().find("not found: no NVIDIA driver"), std::string::npos)
      << last_op_error();
  EXPECT_NE(last_op_error().find("toy_scale_f32"), std::string::npos) << last_op_error();
}

// Without a driver the choice of device code is never reached, but the default libcuda name is
// what a user sees: on this GPU-less machine the real name fails the same way.
TEST(LoaderJit, DefaultDriverNameErrorOnAMachineWithoutOne) {
  if (::getenv("KERNEL_HUB_LIBCUDA")) GTEST_SKIP() << "KERNEL_HUB_LIBCUDA is set";
  try {
    int n = cuda::device_count();
    GTEST_SKIP() << "this machine has a CUDA driver and " << n << " device(s)";
  } catch (const Error& e) {
    std::string m = e.what();
    if (m.find("libcuda.so.1 not found") == std::string::npos)
      GTEST_SKIP() << "a driver is present but unusable here: " << m;
    EXPECT_NE(m.find("libcuda.so.1 not found: no NVIDIA driver on this machine"),
              std::string::npos);
    EXPECT_NE(m.find("bind the cpu device instead"), std::string::npos);
    // Remembered: the second call throws the same without retrying.
    try {
      cuda::cuda_driver();
      FAIL();
    } catch (const Error& again) {
      EXPECT_EQ(std::string(again.what()), m);
    }
  }
}

}  // namespace
}  // namespace kh
