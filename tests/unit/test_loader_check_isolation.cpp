// `kernel-hub check` and pack run a package library's code only in a child process: constructors
// that crash, abort, exit, hang or print fail the check (or pass it) without touching the CLI or
// the calling process, and the pid a constructor records is never the caller's. Then a few
// thousand byte-mutated copies of a real package library (ELF header, program headers, dynamic
// segment): the preflight in process on all of them, `kernel-hub check` on 200, and the CLI only
// ever exits 0 or 1.
#include <elf.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "loader/package_check.h"
#include "registry/pack.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_loader_elf_util.h"

namespace kh {
namespace {

using namespace test_elf;

const std::string kCtorPackage = std::string(KH_ELF_PACKAGES_DIR) + "/elf-ctor";
const std::string kCtorLibrary = kCtorPackage + "/libtoy.so";

// Sets an environment variable for the scope; the checker child inherits it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

test::ProcessResult cli_check(const std::vector<std::string>& args, const test::Env& env = {}) {
  std::vector<std::string> argv = {test::cli_path(), "check"};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::run_process(argv, env, 120);
}

TEST(CheckIsolation, ACrashingConstructorFailsTheCheckNotTheCli) {
  struct Case {
    const char* action;
    const char* says;
  };
  for (const Case& c : {Case{"segv", "the library crashed the checker: SIGSEGV"},
                        Case{"abort", "the library crashed the checker: SIGABRT"},
                        Case{"exit", "the checker process exited without a report"}}) {
    SCOPED_TRACE(c.action);
    test::ProcessResult r = cli_check({kCtorPackage}, {{"KH_TEST_CTOR", c.action}});
    EXPECT_EQ(r.term_signal, 0);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.out.find("FAIL  isolated-load"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("check FAILED"), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("refused by rule isolated-load: " + std::string(c.says)),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find(kCtorLibrary), std::string::npos) << r.err;
  }
  test::ProcessResult r = cli_check({"--json", kCtorPackage}, {{"KH_TEST_CTOR", "segv"}});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["checks"].back()["name"], "isolated-load");
  EXPECT_FALSE(j.contains("module"));
}

TEST(CheckIsolation, ConstructorsRunOnlyInTheChild) {
  test::TempDir tmp;
  // The CLI: the constructor ran (it wrote a pid), in another process than the CLI.
  pid_t cli =
      test::spawn_process({test::cli_path(), "check", kCtorPackage},
                          {{"KH_TEST_CTOR_MARKER", (tmp / "cli.pid").string()}}, tmp / "cli.log");
  test::ProcessResult r = test::wait_process(cli);
  EXPECT_EQ(r.exit_code, 0) << fs::read_file(tmp / "cli.log");
  ASSERT_TRUE(std::filesystem::exists(tmp / "cli.pid")) << "the constructor never ran";
  EXPECT_NE(std::stoi(fs::read_file(tmp / "cli.pid")), cli);

  // In process (pack's path): same, and the library is never mapped into this process.
  ScopedEnv marker("KH_TEST_CTOR_MARKER", (tmp / "here.pid").string());
  PackageCheck c = check_package(kCtorPackage);
  ASSERT_TRUE(c.ok()) << c.report.failures();
  ASSERT_TRUE(std::filesystem::exists(tmp / "here.pid"));
  EXPECT_NE(std::stoi(fs::read_file(tmp / "here.pid")), getpid());
  EXPECT_FALSE(test::is_loaded(kCtorLibrary));
  // The table came back over the pipe: names, flags and dtypes, but nothing callable here.
  const ModuleView& v = c.module->view;
  EXPECT_EQ(v.name, "toy");
  EXPECT_EQ(v.layers.size(), 2u);
  ASSERT_NE(v.find_layer("Scale"), nullptr);
  EXPECT_STREQ(v.find_layer("Scale")->backward, "scale_backward");
  ASSERT_NE(v.find_op("scale_forward"), nullptr);
  EXPECT_EQ(v.find_op("scale_forward")->call(nullptr, 0, nullptr), KH_ERR_UNSUPPORTED);
}

TEST(CheckIsolation, APrintingConstructorLeavesJsonOnStdoutIntact) {
  test::ProcessResult r = cli_check({"--json", kCtorPackage}, {{"KH_TEST_CTOR", "print"}});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out);  // throws (fails the test) if the print got in
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["module"]["name"], "toy");
  EXPECT_NE(r.err.find("printed by a package constructor"), std::string::npos) << r.err;
}

TEST(CheckIsolation, AHangingLibraryIsKilledAtTheTimeout) {
  ScopedEnv hang("KH_TEST_CTOR", "hang");
  auto start = std::chrono::steady_clock::now();
  PackageCheck c = check_package(kCtorPackage, std::chrono::milliseconds(500));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(c.ok());
  const Check* failed = find_check(c.report, "isolated-load");
  ASSERT_NE(failed, nullptr) << c.to_text();
  EXPECT_NE(failed->message.find("did not finish within 0.5 s"), std::string::npos)
      << failed->message;
}

TEST(CheckIsolation, PackRefusesALibraryThatCrashesTheChecker) {
  ScopedEnv crash("KH_TEST_CTOR", "segv");
  test::TempDir tmp;
  PackOptions o;
  o.package_dir = kCtorPackage;
  o.output = tmp / "layout";
  o.devices = {"cpu"};
  try {
    pack_package(o);
    FAIL() << "a crashing library was packed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("the library crashed the checker: SIGSEGV"),
              std::string::npos)
        << e.what();
  }
}

// 1 to 4 random bytes of `seed` changed inside `ranges`.
Bytes mutant(const Bytes& seed, const std::vector<std::pair<size_t, size_t>>& ranges,
             std::mt19937_64& rng) {
  Bytes b = seed;
  int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    auto [off, len] = ranges[rng() % ranges.size()];
    b[off + rng() % len] = static_cast<uint8_t>(rng());
  }
  return b;
}

TEST(CheckIsolation, MutatedLibrariesNeverCrashTheCli) {
  const Bytes seed = read_bytes(toy("toy-1.0.0"));
  const auto ranges = loader_ranges(seed);
  std::mt19937_64 rng(20251130);
  // The preflight, in process, on every mutant.
  std::vector<Bytes> passed, refused;
  for (int i = 0; i < 3000; ++i) {
    Bytes b = mutant(seed, ranges, rng);
    PreflightReport r = preflight_elf(b, "mutant.so");
    ASSERT_FALSE(r.checks.empty());
    (r.ok() ? passed : refused).push_back(std::move(b));
  }
  // Those that pass reach dlopen (in the checker child): the CLI on 150 of them, and on 50 of
  // the refused ones, 4 at a time.
  ASSERT_GT(passed.size(), 20u) << "too few mutants reach the loader for this test to mean much";
  std::vector<const Bytes*> sample;
  for (size_t i = 0; i < passed.size() && sample.size() < 150; ++i) sample.push_back(&passed[i]);
  for (size_t i = 0; i < refused.size() && sample.size() < 200; ++i) sample.push_back(&refused[i]);
  test::TempDir tmp;
  int crashed_checker = 0, ok = 0;
  for (size_t first = 0; first < sample.size(); first += 4) {
    std::vector<std::pair<pid_t, size_t>> running;
    for (size_t i = first; i < std::min(first + 4, sample.size()); ++i) {
      auto lib = tmp / ("mutant-" + std::to_string(i) + ".so");
      fs::write_file_atomic(lib, std::string(sample[i]->begin(), sample[i]->end()));
      running.push_back({test::spawn_process({test::cli_path(), "check", lib.string()}, {},
                                             tmp / ("mutant-" + std::to_string(i) + ".log")),
                         i});
    }
    for (auto [pid, i] : running) {
      test::ProcessResult r = test::wait_process(pid);
      std::string log = fs::read_file(tmp / ("mutant-" + std::to_string(i) + ".log"));
      EXPECT_EQ(r.term_signal, 0) << "mutant " << i << " crashed the CLI:\n" << log;
      EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << "mutant " << i << ":\n" << log;
      ok += r.exit_code == 0;
      crashed_checker += log.find("crashed the checker") != std::string::npos;
    }
  }
  std::cout << "[ info ] " << passed.size() << " of 3000 mutants passed the preflight; of "
            << sample.size() << " checked by the CLI, " << ok << " passed and " << crashed_checker
            << " crashed the checker child\n";
}

}  // namespace
}  // namespace kh
