// `kernel-hub init` and `kernel-hub manifest` through the CLI: what init writes, what it refuses
// (names, non-empty and non-directory targets; nothing written on refusal; --force), and
// manifest's refusals (a template that disagrees with the module, a library the loader refuses).
// The scaffold's build, check and pack are tests/sdk/test_init.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fixtures/process.h"

namespace kh::test {
namespace {

namespace stdfs = std::filesystem;

ProcessResult cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv);
}

std::string read(const stdfs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write(const stdfs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

size_t entries(const stdfs::path& dir) {
  return std::distance(stdfs::directory_iterator(dir), stdfs::directory_iterator());
}

TEST(Init, WritesTheScaffoldWithTheNameFilledIn) {
  TempDir tmp;
  auto r = cli({"init", (tmp / "pkg").string(), "--name", "acme/fast-scale"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (auto f : {"CMakeLists.txt", "kernel.json.in", "host.cpp", "fast-scale.cu",
                 "kernel-config.json", "README.md", ".gitignore"})
    EXPECT_TRUE(stdfs::is_regular_file(tmp / "pkg" / f)) << f;
  EXPECT_NE(read(tmp / "pkg/kernel.json.in").find("\"name\": \"acme/fast-scale\""),
            std::string::npos);
  EXPECT_NE(read(tmp / "pkg/kernel.json.in").find("\"host_library\": \"libfast-scale.so\""),
            std::string::npos);
  EXPECT_NE(read(tmp / "pkg/CMakeLists.txt").find("find_package(KernelHub"), std::string::npos);
  for (auto f : {"CMakeLists.txt", "kernel.json.in", "host.cpp", "README.md", "kernel-config.json"})
    EXPECT_EQ(read(tmp / "pkg" / f).find("@KH_"), std::string::npos) << f << " has a placeholder";
  // The next steps name the commands to run.
  for (auto step : {"cmake --build", "kernel-hub check", "kernel-hub pack", "push"})
    EXPECT_NE(r.out.find(step), std::string::npos) << step;
}

TEST(Init, AcceptsAnEmptyExistingDirectory) {
  TempDir tmp;
  stdfs::create_directory(tmp / "empty");
  auto r = cli({"init", (tmp / "empty").string(), "--name", "acme/scale"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(stdfs::exists(tmp / "empty/scale.cu"));
}

TEST(Init, RefusesANonEmptyDirectoryAndWritesNothing) {
  TempDir tmp;
  stdfs::create_directory(tmp / "used");
  write(tmp / "used/notes.txt", "mine");
  auto r = cli({"init", (tmp / "used").string(), "--name", "acme/scale"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is not empty"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(entries(tmp / "used"), 1u);
}

TEST(Init, ForceWritesIntoANonEmptyDirectoryAndKeepsOtherFiles) {
  TempDir tmp;
  stdfs::create_directory(tmp / "used");
  write(tmp / "used/notes.txt", "mine");
  write(tmp / "used/host.cpp", "old");
  auto r = cli({"init", (tmp / "used").string(), "--name", "acme/scale", "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read(tmp / "used/notes.txt"), "mine");
  EXPECT_NE(read(tmp / "used/host.cpp"), "old");
}

TEST(Init, RefusesATargetThatIsNotADirectory) {
  TempDir tmp;
  write(tmp / "file", "x");
  for (bool force : {false, true}) {
    std::vector<std::string> args = {"init", (tmp / "file").string(), "--name", "acme/scale"};
    if (force) args.push_back("--force");
    auto r = cli(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("is not a directory"), std::string::npos) << r.err;
  }
  EXPECT_EQ(read(tmp / "file"), "x");
}

TEST(Init, RefusesNamesThatAreNotOrgSlashName) {
  TempDir tmp;
  for (std::string name : {"scale", "Acme/scale", "acme/", "/scale", "acme//scale", "acme/sc ale",
                           "../scale", "acme/-scale", ""}) {
    auto r = cli({"init", (tmp / "pkg").string(), "--name", name});
    EXPECT_EQ(r.exit_code, 2) << name;
    EXPECT_NE(r.err.find("is not a package name"), std::string::npos) << name << ": " << r.err;
    EXPECT_FALSE(stdfs::exists(tmp / "pkg")) << name << ": init wrote something";
  }
}

TEST(Init, NeedsDirAndName) {
  TempDir tmp;
  EXPECT_EQ(cli({"init", "--name", "acme/scale"}).exit_code, 2);
  EXPECT_EQ(cli({"init", (tmp / "pkg").string()}).exit_code, 2);
  EXPECT_FALSE(stdfs::exists(tmp / "pkg"));
}

// A package directory built like the embedded default hub's example package.
stdfs::path example_package() {
  return stdfs::path(KH_BUILD_DIR) / "example-package";
}

TEST(Manifest, FillsLayersAndFilesFromTheBuiltLibrary) {
  TempDir tmp;
  stdfs::copy(example_package() / "libexample.so", tmp / "libexample.so");
  write(tmp / "template.json",
        R"({"name": "kernel-hub/example", "version": "1.0.0", "device": "cpu",
            "abi": {"major": 1, "minor": 0}, "host_library": "libexample.so"})");
  auto r = cli({"manifest", tmp.path().string(), "--template", (tmp / "template.json").string()});
  // The template lies in the directory, so it is listed as a package file.
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string text = read(tmp / "kernel.json");
  EXPECT_NE(text.find("\"Copy\": {"), std::string::npos) << text;
  EXPECT_NE(text.find("\"libexample.so\": \"sha256:"), std::string::npos) << text;
  EXPECT_NE(text.find("\"template.json\""), std::string::npos) << text;
  // Refreshing in place (the default template is kernel.json itself) keeps the fields.
  stdfs::remove(tmp / "template.json");
  r = cli({"manifest", tmp.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  text = read(tmp / "kernel.json");
  EXPECT_EQ(text.find("template.json"), std::string::npos) << text;
  EXPECT_NE(text.find("\"device\": \"cpu\""), std::string::npos) << text;
  EXPECT_EQ(cli({"check", tmp.path().string()}).exit_code, 0);
}

TEST(Manifest, RefusesATemplateThatDisagreesWithTheModule) {
  TempDir tmp;
  stdfs::copy(example_package() / "libexample.so", tmp / "libexample.so");
  write(tmp / "kernel.json",
        R"({"name": "acme/other", "version": "1.0.0", "device": "cpu",
            "abi": {"major": 1, "minor": 0}, "host_library": "libexample.so"})");
  auto r = cli({"manifest", tmp.path().string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("acme/other 1.0.0 but libexample.so's module table says "
                       "kernel-hub/example 1.0.0"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(read(tmp / "kernel.json").find("layers"), std::string::npos);
}

TEST(Manifest, RefusesALibraryTheLoaderRefuses) {
  TempDir tmp;
  write(tmp / "libexample.so", "not an ELF file");
  write(tmp / "kernel.json",
        R"({"name": "kernel-hub/example", "version": "1.0.0", "host_library": "libexample.so"})");
  auto r = cli({"manifest", tmp.path().string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("failed the loader's checks"), std::string::npos) << r.err;
}

TEST(Manifest, RefusesAMissingOrBrokenTemplate) {
  TempDir tmp;
  EXPECT_NE(cli({"manifest", tmp.path().string()}).exit_code, 0);  // no kernel.json
  write(tmp / "kernel.json", R"({"name": "kernel-hub/example", "version": "1.0.0"})");
  auto r = cli({"manifest", tmp.path().string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("\"host_library\" must be a non-empty string"), std::string::npos) << r.err;
  write(tmp / "kernel.json", "{not json");
  EXPECT_EQ(cli({"manifest", tmp.path().string()}).exit_code, 2);
  EXPECT_EQ(cli({"manifest", (tmp / "absent").string()}).exit_code, 2);
}

}  // namespace
}  // namespace kh::test
