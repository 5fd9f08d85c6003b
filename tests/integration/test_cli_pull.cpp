// The CLI end to end against a real docker-registry: push a layout, pull it, and the
// properties issue 2 asks for: single download under concurrency, recovery after SIGKILL,
// offline mode, clear errors.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "hub/base/fs.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"

namespace kh::test {
namespace {

class CliPull : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!registry_.available()) GTEST_SKIP() << registry_.why();
  }

  // Runs kernel-hub with --cache and the given hub; quiet test-friendly retry settings.
  ProcessResult cli(const std::vector<std::string>& args, const std::string& hub,
                    const std::filesystem::path& cache, Env env = {}) {
    std::vector<std::string> argv = {cli_path(), "--cache", cache.string(), "--plain-http"};
    if (!hub.empty()) argv.insert(argv.end(), {"--hub", hub});
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace("KERNEL_HUB_BACKOFF_S", "0.05");
    env.emplace("KERNEL_HUB_OFFLINE", "\x01");
    env.emplace("KERNEL_HUB_ENDPOINT", "\x01");
    return run_process(argv, env, 180);
  }

  BuiltLayout push_layout(const std::string& ref, LayoutSpec spec = {}) {
    built_dirs_.push_back(std::make_unique<TempDir>("kh-layout"));
    BuiltLayout b = build_layout(built_dirs_.back()->path(), spec);
    auto r = cli({"push", built_dirs_.back()->path().string(), ref}, registry_.oci_url(),
                 push_cache_.path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return b;
  }

  RegistryFixture registry_;
  TempDir push_cache_{"kh-push-cache"};
  std::vector<std::unique_ptr<TempDir>> built_dirs_;
};

TEST_F(CliPull, PushThenPullVerifiesAndRecords) {
  LayoutSpec spec;
  spec.variants = 3;
  spec.layer_bytes = 300 << 10;
  BuiltLayout b = push_layout("test/pkg@v1", spec);
  TempDir cache;
  auto r = cli({"--json", "pull", "test/pkg@v1"}, registry_.oci_url(), cache.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["digest"], b.index.digest.str());
  EXPECT_EQ(j[0]["manifests"], 3);
  EXPECT_EQ(j[0]["blobs"], 4);  // three layers and the shared empty config
  // The empty config travels inline in its descriptor: only the layers are downloaded.
  EXPECT_EQ(j[0]["bytes_downloaded"].get<uint64_t>(), b.layer_bytes);
  for (auto& l : b.layers) {
    EXPECT_TRUE(std::filesystem::exists(cache.path() / "blobs/sha256" / l.digest.hex));
  }
  // No progress bar without a TTY.
  EXPECT_EQ(r.err.find('\r'), std::string::npos);

  auto ls = cli({"--json", "ls"}, registry_.oci_url(), cache.path());
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  auto refs = nlohmann::json::parse(ls.out);
  ASSERT_EQ(refs.size(), 1u);
  EXPECT_EQ(refs[0]["ref"], "test/pkg@v1");
  EXPECT_EQ(refs[0]["digest"], b.index.digest.str());
  EXPECT_TRUE(refs[0]["complete"].get<bool>());

  auto info = cli({"--json", "info", "test/pkg"}, registry_.oci_url(), cache.path());
  ASSERT_EQ(info.exit_code, 0) << info.err;
  auto ij = nlohmann::json::parse(info.out);
  EXPECT_EQ(ij["variants"].size(), 3u);
  EXPECT_EQ(ij["variants"][0]["platform"], "linux/amd64");

  auto v = cli({"verify"}, "", cache.path());
  EXPECT_EQ(v.exit_code, 0) << v.err;

  // Pulling again downloads nothing.
  auto again = cli({"--json", "pull", "test/pkg@v1"}, registry_.oci_url(), cache.path());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)[0]["blobs_downloaded"], 0);

  // A pull by digest works too.
  auto by_digest =
      cli({"pull", "test/pkg@" + b.index.digest.str()}, registry_.oci_url(), cache.path());
  EXPECT_EQ(by_digest.exit_code, 0) << by_digest.err;
}

TEST_F(CliPull, ProgressBarOnlyOnATerminal) {
  if (!have_program("script")) GTEST_SKIP() << "script (util-linux) is not installed";
  LayoutSpec spec;
  spec.layer_bytes = 1 << 20;
  push_layout("test/tty@v1", spec);
  auto on_tty = [&](const std::string& extra, const std::filesystem::path& cache) {
    std::string cmd = cli_path() + " --cache " + cache.string() + " --plain-http --hub " +
                      registry_.oci_url() + " " + extra + " pull test/tty@v1";
    // script(1) gives the command a pseudo-terminal and copies what it printed.
    return run_process({"script", "-qec", cmd, "/dev/null"}, {{"KERNEL_HUB_OFFLINE", "\x01"}});
  };
  TempDir a, b;
  auto shown = on_tty("", a.path());
  ASSERT_EQ(shown.exit_code, 0) << shown.out << shown.err;
  EXPECT_NE(shown.out.find("100%"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("MiB"), std::string::npos) << shown.out;
  auto quiet = on_tty("-q", b.path());
  ASSERT_EQ(quiet.exit_code, 0) << quiet.out << quiet.err;
  EXPECT_EQ(quiet.out.find("100%"), std::string::npos) << quiet.out;
}

TEST_F(CliPull, VerifyReportsDamage) {
  BuiltLayout b = push_layout("test/dmg@v1");
  TempDir cache;
  ASSERT_EQ(cli({"pull", "test/dmg"}, registry_.oci_url(), cache.path()).exit_code, 0);
  auto blob = cache.path() / "blobs/sha256" / b.layers[0].digest.hex;
  std::filesystem::permissions(blob, std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::add);
  {
    std::string data = fs::read_file(blob);
    data[data.size() / 2] ^= 0x5a;
    std::FILE* f = std::fopen(blob.c_str(), "wb");
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  }
  auto v = cli({"verify"}, "", cache.path());
  EXPECT_EQ(v.exit_code, 1);
  EXPECT_NE(v.err.find(b.layers[0].digest.hex), std::string::npos) << v.err;
  EXPECT_NE(v.err.find("kernel-hub pull REF"), std::string::npos) << v.err;
  // Pulling again checks what is cached, not only that it is there: the damaged blob is
  // fetched again (it was reported as cached and verified), and the cache verifies clean.
  auto again = cli({"pull", "test/dmg"}, registry_.oci_url(), cache.path());
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("is damaged"), std::string::npos) << again.err;
  EXPECT_EQ(sha256_of_file(blob), b.layers[0].digest);
  EXPECT_EQ(cli({"verify"}, "", cache.path()).exit_code, 0);
}

TEST_F(CliPull, MissingTagAndBadRefAreClearErrors) {
  push_layout("test/there@v1");
  TempDir cache;
  auto r = cli({"pull", "test/there@v7"}, registry_.oci_url(), cache.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("v7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("test/there"), std::string::npos) << r.err;

  auto bad = cli({"pull", "NotARef"}, registry_.oci_url(), cache.path());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("invalid ref 'NotARef'"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(cache.path() / "refs/registry"));
}

TEST_F(CliPull, EightProcessesDownloadEachBlobOnce) {
  LayoutSpec spec;
  spec.variants = 4;
  spec.layer_bytes = 4 << 20;
  BuiltLayout b = push_layout("test/conc@v1", spec);
  FaultProxy proxy(registry_.port());
  // Slow the first blob response down a little so that the processes overlap.
  proxy.add_rule(
      {"GET", "/blobs/" + b.layers[0].digest.str(), FaultProxy::Action::kStall, 1, 1 << 20, 1, 0});
  TempDir cache;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int i = 0; i < 8; ++i) {
    auto log = cache.path().parent_path() /
               (cache.path().filename().string() + ".log" + std::to_string(i));
    logs.push_back(log.string());
    pids.push_back(spawn_process({cli_path(), "--cache", cache.path().string(), "--plain-http",
                                  "--hub", proxy.oci_url(), "-q", "pull", "test/conc@v1"},
                                 {{"KERNEL_HUB_BACKOFF_S", "0.05"}}, log));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    auto r = wait_process(pids[i]);
    EXPECT_EQ(r.exit_code, 0) << fs::read_file(logs[i]);
    std::filesystem::remove(logs[i]);
  }
  // Each blob is downloaded from scratch once; the stalled one may be resumed with Range
  // by the process that downloads it, never fetched again by another.
  for (auto& l : b.layers) {
    size_t fresh = 0;
    for (auto& seen : proxy.requests()) {
      if (seen.method == "GET" && seen.target.find(l.digest.str()) != std::string::npos &&
          seen.range.empty()) {
        ++fresh;
      }
    }
    EXPECT_EQ(fresh, 1u) << l.digest.str();
  }
  auto v = cli({"verify"}, "", cache.path());
  EXPECT_EQ(v.exit_code, 0) << v.err;
}

TEST_F(CliPull, KilledMidBlobThenPulledAgain) {
  LayoutSpec spec;
  spec.variants = 1;
  spec.layer_bytes = 8 << 20;
  BuiltLayout b = push_layout("test/crash@v1", spec);
  FaultProxy proxy(registry_.port());
  proxy.add_rule(
      {"GET", "/blobs/" + b.layers[0].digest.str(), FaultProxy::Action::kStall, 1, 2 << 20, 30, 0});
  TempDir cache;
  auto log = cache.path().string() + ".crash.log";
  pid_t pid = spawn_process({cli_path(), "--cache", cache.path().string(), "--plain-http", "--hub",
                             proxy.oci_url(), "-q", "pull", "test/crash@v1"},
                            {}, log);
  // Wait until the blob transfer is under way, then kill the puller outright.
  for (int i = 0; i < 200 && proxy.count("GET", "/blobs/" + b.layers[0].digest.str()) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pid, SIGKILL);
  auto killed = wait_process(pid);
  EXPECT_EQ(killed.term_signal, SIGKILL);
  std::filesystem::remove(log);
  EXPECT_FALSE(std::filesystem::exists(cache.path() / "blobs/sha256" / b.layers[0].digest.hex));
  EXPECT_FALSE(std::filesystem::exists(cache.path() / "refs" / "registry"));

  auto r = cli({"pull", "test/crash@v1"}, registry_.oci_url(), cache.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto v = cli({"verify"}, "", cache.path());
  EXPECT_EQ(v.exit_code, 0) << v.err;
}

TEST_F(CliPull, OfflineUsesTheCacheOnly) {
  BuiltLayout b = push_layout("test/off@v1");
  TempDir cache;
  ASSERT_EQ(cli({"pull", "test/off@v1"}, registry_.oci_url(), cache.path()).exit_code, 0);
  registry_.stop();

  auto r = cli({"--json", "--offline", "pull", "test/off@v1"}, registry_.oci_url(), cache.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j[0]["digest"], b.index.digest.str());
  EXPECT_TRUE(j[0]["from_cache"].get<bool>());

  // The environment variable works the same way.
  auto env = cli({"pull", "test/off"}, registry_.oci_url(), cache.path());
  EXPECT_NE(env.exit_code, 0);  // online with the registry gone: a network error
  auto env_off = run_process({cli_path(), "--cache", cache.path().string(), "--hub",
                              registry_.oci_url(), "--plain-http", "pull", "test/off"},
                             {{"KERNEL_HUB_OFFLINE", "1"}});
  EXPECT_EQ(env_off.exit_code, 0) << env_off.err;

  auto miss = cli({"--offline", "pull", "test/other@v2"}, registry_.oci_url(), cache.path());
  EXPECT_EQ(miss.exit_code, 1);
  EXPECT_NE(miss.err.find("test/other@v2"), std::string::npos) << miss.err;
  EXPECT_NE(miss.err.find("kernel-hub pull test/other@v2"), std::string::npos) << miss.err;
  EXPECT_NE(miss.err.find("offline"), std::string::npos) << miss.err;
}

TEST_F(CliPull, OfflineMakesNoConnection) {
  push_layout("test/zero@v1");
  FaultProxy proxy(registry_.port());
  TempDir cache;
  ASSERT_EQ(cli({"pull", "test/zero"}, proxy.oci_url(), cache.path()).exit_code, 0);
  size_t before = proxy.total();
  EXPECT_EQ(cli({"--offline", "pull", "test/zero"}, proxy.oci_url(), cache.path()).exit_code, 0);
  EXPECT_NE(cli({"--offline", "pull", "test/none"}, proxy.oci_url(), cache.path()).exit_code, 0);
  EXPECT_NE(cli({"--offline", "info", "test/none"}, proxy.oci_url(), cache.path()).exit_code, 0);
  EXPECT_EQ(proxy.total(), before);
}

}  // namespace
}  // namespace kh::test
