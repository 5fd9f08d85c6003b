// Package manifests (kernel.json): parse, validate, verify the files of a package directory;
// device descriptions.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "registry/device.h"
#include "registry/package_manifest.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;

std::string example_text() {
  return fs::read_file(stdfs::path(KH_SOURCE_DIR) / "manifests/examples/package-manifest.json");
}

TEST(PackageManifest, ExampleParsesAndRoundTrips) {
  PackageManifest m = PackageManifest::parse(example_text());
  EXPECT_EQ(m.name, "kernel-hub/norm");
  EXPECT_EQ(m.abi_major, 1);
  EXPECT_EQ(m.device, "cuda");
  EXPECT_EQ(m.cuda_version, "12.4");
  EXPECT_EQ(m.sm_list(), (std::vector<std::string>{"80", "90a"}));
  EXPECT_TRUE(m.has_source());
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_TRUE(m.layers.at("RMSNorm").has_backward);
  EXPECT_TRUE(m.layers.at("RMSNorm").deterministic);
  EXPECT_FALSE(m.layers.at("LayerNorm").has_backward);
  EXPECT_TRUE(m.layers.at("LayerNorm").graph_safe);
  EXPECT_EQ(m.files.size(), 4u);
  PackageManifest again = PackageManifest::parse(m.serialize());
  EXPECT_EQ(again.serialize(), m.serialize());
}

// Each validation error names its JSON path.
TEST(PackageManifest, Errors) {
  nlohmann::json base = nlohmann::json::parse(example_text());
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  } cases[] = {
      {[](auto& j) { j.erase("name"); }, "$.name: missing"},
      {[](auto& j) { j["version"] = 3; }, "$.version: expected a non-empty string"},
      {[](auto& j) { j["host_library"] = "../libx.so"; }, "$.host_library: '../libx.so' must be"},
      {[](auto& j) {
         j["abi"] = {{"minor", 1}};
       },
       "$.abi.major: missing"},
      {[](auto& j) { j["abi"]["major"] = 0; }, "$.abi.major: expected an integer 1..65535"},
      {[](auto& j) { j["device"] = "rocm"; }, "$.device: unknown device 'rocm'"},
      {[](auto& j) { j["cuda"]["version"] = "twelve"; }, "$.cuda.version: expected a CUDA version"},
      {[](auto& j) { j["cubins"]["9x"] = "a.cubin"; }, "$.cubins[\"9x\"]: '9x' is not an sm"},
      {[](auto& j) { j["cubins"]["100"] = "unlisted.cubin"; },
       "$.cubins[\"100\"]: 'unlisted.cubin' is not listed in \"files\""},
      {[](auto& j) { j["cubins"]["100"] = "sub/k.cubin"; },
       "$.cubins[\"100\"]: expected a file name in the package"},
      {[](auto& j) { j["cuda_source"] = "../norm.cu"; }, "$.cuda_source: expected the file name"},
      {[](auto& j) { j["cuda"]["arch"] = "x"; }, "$.cuda.arch: unknown key 'arch'"},
      {[](auto& j) { j["layers"]["RMSNorm"]["flags"] = {"graph_safe"}; },
       "$.layers.RMSNorm: ops.backward needs the flag \"backward\""},
      {[](auto& j) { j["layers"]["LayerNorm"]["flags"] = {"backward"}; },
       "$.layers.LayerNorm: flag \"backward\" needs ops.backward"},
      {[](auto& j) { j["layers"]["RMSNorm"]["dtypes"] = {"int8"}; },
       "$.layers.RMSNorm.dtypes[0]: expected one of bf16, fp16, fp32"},
      {[](auto& j) { j["layers"]["RMSNorm"]["ops"]["sideways"] = "x"; },
       "$.layers.RMSNorm.ops.sideways: unknown op"},
      {[](auto& j) { j["layers"]["RMSNorm"]["ops"].erase("forward"); },
       "$.layers.RMSNorm.ops.forward: missing"},
      {[](auto& j) { j["layers"] = nlohmann::json::object(); }, "$.layers: empty"},
      {[](auto& j) { j["files"]["../etc/passwd"] = std::string("sha256:") + std::string(64, '1'); },
       "$.files[\"../etc/passwd\"]: expected a relative path"},
      {[](auto& j) { j["files"]["kernel.json"] = std::string("sha256:") + std::string(64, '1'); },
       "kernel.json cannot list its own digest"},
      {[](auto& j) { j["files"]["libnorm.so"] = "md5:abc"; },
       "$.files[\"libnorm.so\"]: expected \"sha256:"},
      {[](auto& j) { j["device"] = "cpu"; }, "$.cuda: applies to device cuda only"},
      {[](auto& j) {
         j.erase("cubins");
         j.erase("cuda_source");
       },
       "$: a cuda package needs device code"},
  };
  for (auto& c : cases) {
    nlohmann::json j = base;
    c.edit(j);
    try {
      PackageManifest::parse(j.dump(), "pkg/kernel.json");
      ADD_FAILURE() << "accepted, expected " << c.expect;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << "message: " << e.what() << "\nwant: " << c.expect;
    }
  }
}

// A cpu package directory with its kernel.json listing every file.
PackageManifest write_cpu_package(const stdfs::path& dir) {
  fs::write_file_atomic(dir / "libscale.so", "not really an ELF");
  fs::write_file_atomic(dir / "data/table.bin", std::string(1000, '\x7f'));
  PackageManifest m;
  m.name = "org/scale";
  m.version = "1.0.0";
  m.abi_major = 1;
  m.device = "cpu";
  m.host_library = "libscale.so";
  m.layers["Scale"] = PackageLayer{"scale", "", "", false, false, true, {"fp32"}};
  m.files = hash_package_files(dir);
  fs::write_file_atomic(dir / "kernel.json", m.serialize());
  return m;
}

TEST(PackageFiles, VerifyAcceptsExactPackage) {
  test::TempDir tmp;
  PackageManifest m = write_cpu_package(tmp.path());
  EXPECT_EQ(m.files.size(), 2u);
  PackageManifest read = read_package_manifest(tmp.path());
  EXPECT_EQ(read.serialize(), m.serialize());
  EXPECT_NO_THROW(verify_package_files(tmp.path(), read));
}

TEST(PackageFiles, VerifyRefusesDifferences) {
  struct Case {
    const char* name;
    std::function<void(const stdfs::path&)> damage;
    std::vector<std::string> expect;
  } cases[] = {
      {"modified",
       [](auto& d) { fs::write_file_atomic(d / "data/table.bin", "tampered"); },
       {"'data/table.bin' has digest sha256:", "kernel.json expects sha256:"}},
      {"missing",
       [](auto& d) { stdfs::remove(d / "libscale.so"); },
       {"'libscale.so' is listed in kernel.json", "but missing"}},
      {"unlisted",
       [](auto& d) { fs::write_file_atomic(d / "extra/evil.so", "x"); },
       {"'extra/evil.so' is not listed in kernel.json \"files\""}},
      {"symlink",
       [](auto& d) { stdfs::create_symlink("/etc/hostname", d / "link"); },
       {"'link' is not a regular file"}},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    test::TempDir tmp;
    PackageManifest m = write_cpu_package(tmp.path());
    c.damage(tmp.path());
    try {
      verify_package_files(tmp.path(), m);
      ADD_FAILURE() << "accepted a " << c.name << " package";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
      for (auto& s : c.expect)
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  }
}

TEST(Device, HandGivenFields) {
  Device d = make_device({"cuda", "90", "13.0", "linux", "amd64"});
  EXPECT_EQ(d.sm, 90);
  EXPECT_EQ(d.cuda_major, 13);
  EXPECT_EQ(d.cuda_minor, 0);
  EXPECT_EQ(d.str(), "cuda:sm_90:cuda_13.0:linux/amd64");
  EXPECT_EQ(parse_device_spec(d.str()), d);
  for (const char* sm : {"90", "9.0", "sm_90", "90a", "sm_90a"})
    EXPECT_EQ(make_device({"cuda", sm, "13", "linux", "amd64"}).sm, 90) << sm;
  EXPECT_EQ(make_device({"cuda", "12.0", "12.8", "linux", "arm64"}).str(),
            "cuda:sm_120:cuda_12.8:linux/arm64");
  Device cpu = make_device({"cpu", {}, {}, "linux", "arm64"});
  EXPECT_EQ(cpu.str(), "cpu:linux/arm64");
  EXPECT_EQ(parse_device_spec("cpu:linux/arm64"), cpu);

  struct Bad {
    DeviceFields f;
    const char* expect;
  } bad[] = {
      {{"rocm", {}, {}, {}, {}}, "unknown device 'rocm'"},
      {{"cuda", {}, "13.0", {}, {}}, "cuda needs --sm"},
      {{"cuda", "90", {}, {}, {}}, "cuda needs --cuda"},
      {{"cuda", "nine", "13.0", {}, {}}, "--sm 'nine' is not a compute capability"},
      {{"cuda", "90", "x.y", {}, {}}, "--cuda 'x.y' is not a CUDA version"},
      {{"cpu", "90", {}, {}, {}}, "apply to --device cuda only"},
      {{"cpu", {}, {}, "Linux OS", {}}, "os 'linux os'"},
  };
  for (auto& b : bad) {
    try {
      make_device(b.f);
      ADD_FAILURE() << "accepted " << b.expect;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(b.expect), std::string::npos) << e.what();
    }
  }
  for (const char* spec : {"", "cuda", "cpu", "cpu:linux", "cuda:sm_90:linux/amd64",
                           "cuda:90:cuda_13.0:linux/amd64", "gpu:linux/amd64"})
    EXPECT_THROW(parse_device_spec(spec), Error) << spec;
}

TEST(Device, LocalCpu) {
  Device d = local_cpu_device();
  EXPECT_EQ(d.key, "cpu");
  EXPECT_EQ(d.os, "linux");
#if defined(__x86_64__)
  EXPECT_EQ(d.arch, "amd64");
#elif defined(__aarch64__)
  EXPECT_EQ(d.arch, "arm64");
#endif
}

}  // namespace
}  // namespace kh
