// Fleet cold start (issue 17): many `kernel-hub pull` processes started at once on one empty
// cache, against a real docker-registry whose access log counts every request. Each blob and
// each manifest fetched by digest is downloaded once (the others wait on its lock in the cache
// and read the stored copy); only the tag is resolved once per process. A holder killed
// mid-download blocks nobody past its death and leaves no partial blob; a lock held forever
// ends at the command deadline with a message naming the digest; planted links and a lock
// directory replaced by a file are refused. The same fleet with every process in its own
// network and mount namespace, sharing the cache directory through bind mounts, stands in for
// nodes sharing a cluster file system.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <regex>
#include <thread>

#include "hub/base/fs.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"

#ifndef KH_NETNS_RUNNER
#define KH_NETNS_RUNNER ""
#endif

namespace kh::test {
namespace {

constexpr int kFleet = 16;

using Clock = std::chrono::steady_clock;

// One request of the registry's access log (combined log format): "GET /v2/... HTTP/1.1".
struct Logged {
  std::string method;
  std::string target;
};

class FleetPull : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!registry_.available()) GTEST_SKIP() << registry_.why();
  }

  BuiltLayout push_layout(const std::string& ref, LayoutSpec spec) {
    layouts_.push_back(std::make_unique<TempDir>("kh-fleet-layout"));
    BuiltLayout b = build_layout(layouts_.back()->path(), spec);
    auto r =
        run_process({cli_path(), "--cache", push_cache_.path().string(), "--plain-http", "--hub",
                     registry_.oci_url(), "-q", "push", layouts_.back()->path().string(), ref},
                    {{"KERNEL_HUB_ENDPOINT", "\x01"}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return b;
  }

  // Requests the registry logged after `from` bytes of its log.
  std::vector<Logged> requests_since(size_t from) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // logged after the response
    std::string log = registry_.log();
    static const std::regex line("\"(GET|HEAD|POST|PUT|PATCH|DELETE) (/v2/[^ \"]*) HTTP");
    std::vector<Logged> out;
    std::string tail = log.substr(std::min(from, log.size()));
    for (std::sregex_iterator it(tail.begin(), tail.end(), line), end; it != end; ++it) {
      out.push_back({(*it)[1], (*it)[2]});
    }
    return out;
  }

  std::vector<std::string> pull_argv(const std::string& hub, const std::string& cache,
                                     const std::string& ref) {
    return {cli_path(), "--cache", cache, "--plain-http", "--hub", hub, "-q", "-v", "pull", ref};
  }

  // Checks the fleet's requests: each blob and each manifest fetched by digest at most once,
  // the tag at most once per process, nothing else more than once; returns how many there were.
  void expect_coalesced(const std::vector<Logged>& seen, const BuiltLayout& b,
                        const std::string& repo, int processes) {
    std::map<std::string, int> count;
    int tag = 0;
    for (const auto& r : seen) {
      if (r.target == "/v2/" + repo + "/manifests/v1") {
        ++tag;
        continue;
      }
      ++count[r.method + " " + r.target];
    }
    EXPECT_LE(tag, processes);
    for (const auto& [what, n] : count)
      EXPECT_EQ(n, 1) << what << " was requested " << n << " times";
    for (const auto& l : b.layers) {
      EXPECT_EQ(count["GET /v2/" + repo + "/blobs/" + l.digest.str()], 1) << l.digest.str();
    }
    // The target: requests <= blobs + manifests + one tag resolution per process. Blobs: the
    // layers (the empty config is inline); manifests: the variants, plus the signature lookup
    // (the referrers API and its tag-schema fallback: a document each).
    const size_t bound = b.layers.size() + b.manifests.size() + 2 + static_cast<size_t>(processes);
    EXPECT_LE(seen.size(), bound);
  }

  void expect_verified(const std::filesystem::path& cache) {
    auto v = run_process({cli_path(), "--cache", cache.string(), "verify"});
    EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  }

  // Four variants of 1 KiB layers: the first layer can be slowed down without being cut.
  static LayoutSpec small_layers() {
    LayoutSpec spec;
    spec.variants = 4;
    spec.layer_bytes = 1 << 10;
    return spec;
  }
  // The first layer's download trickles for about a second (through the proxy, whole): the
  // others certainly arrive while it is in flight and must wait for it rather than fetch it.
  static void slow_first_layer(FaultProxy& proxy, const BuiltLayout& b) {
    FaultProxy::Rule trickle{"GET", "/blobs/" + b.layers[0].digest.str(),
                             FaultProxy::Action::kTrickle};
    trickle.interval_ms = 1;
    proxy.add_rule(trickle);
  }

  RegistryFixture registry_;
  TempDir push_cache_{"kh-fleet-push"};
  TempDir logs_{"kh-fleet-logs"};
  std::vector<std::unique_ptr<TempDir>> layouts_;
};

TEST_F(FleetPull, SixteenProcessesFetchEachBlobAndManifestOnce) {
  BuiltLayout b = push_layout("fleet/pkg@v1", small_layers());
  FaultProxy proxy(registry_.port());
  slow_first_layer(proxy, b);
  TempDir cache{"kh-fleet-cache"};
  const size_t from = registry_.log().size();
  std::vector<pid_t> pids;
  for (int i = 0; i < kFleet; ++i) {
    pids.push_back(spawn_process(pull_argv(proxy.oci_url(), cache.path().string(), "fleet/pkg@v1"),
                                 {{"KERNEL_HUB_ENDPOINT", "\x01"}},
                                 logs_ / ("pull" + std::to_string(i) + ".log")));
  }
  int waited = 0;
  for (int i = 0; i < kFleet; ++i) {
    auto r = wait_process(pids[i]);
    std::string log = fs::read_file(logs_ / ("pull" + std::to_string(i) + ".log"));
    EXPECT_EQ(r.exit_code, 0) << log;
    if (log.find("waiting for another process downloading") != std::string::npos) ++waited;
  }
  EXPECT_GT(waited, 0) << "no process said it waited for another one's download";
  expect_coalesced(requests_since(from), b, "fleet/pkg", kFleet);
  expect_verified(cache.path());
}

TEST_F(FleetPull, KilledHolderBlocksNobodyAndLeavesNoPartialBlob) {
  LayoutSpec spec;
  spec.variants = 1;
  spec.layer_bytes = 8 << 20;
  BuiltLayout b = push_layout("fleet/crash@v1", spec);
  const oci::Descriptor& layer = b.layers[0];
  // The first download of the layer hangs after 2 MiB for a minute: its holder is killed then.
  FaultProxy proxy(registry_.port());
  proxy.add_rule(
      {"GET", "/blobs/" + layer.digest.str(), FaultProxy::Action::kStall, 1, 2 << 20, 60, 0});
  TempDir cache{"kh-fleet-cache"};
  const std::string hub = proxy.oci_url();
  pid_t holder = spawn_process(pull_argv(hub, cache.path().string(), "fleet/crash@v1"),
                               {{"KERNEL_HUB_ENDPOINT", "\x01"}}, logs_ / "holder.log");
  for (int i = 0; i < 400 && proxy.count("GET", "/blobs/" + layer.digest.str()) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_EQ(proxy.count("GET", "/blobs/" + layer.digest.str()), 1u)
      << fs::read_file(logs_ / "holder.log");
  std::vector<pid_t> others;
  for (int i = 0; i < 7; ++i) {
    others.push_back(
        spawn_process(pull_argv(hub, cache.path().string(), "fleet/crash@v1"),
                      {{"KERNEL_HUB_ENDPOINT", "\x01"}, {"KERNEL_HUB_COMMAND_TIMEOUT_S", "120"}},
                      logs_ / ("other" + std::to_string(i) + ".log")));
  }
  // Until every other process is waiting on the holder's lock (each says so).
  auto all_waiting = [&] {
    for (int i = 0; i < 7; ++i) {
      auto log = fs::read_file_if_exists(logs_ / ("other" + std::to_string(i) + ".log"));
      if (!log || log->find("waiting for another process downloading blob " + layer.digest.str()) ==
                      std::string::npos)
        return false;
    }
    return true;
  };
  for (int i = 0; i < 600 && !all_waiting(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(all_waiting());
  EXPECT_FALSE(std::filesystem::exists(cache.path() / "blobs/sha256" / layer.digest.hex));

  ::kill(holder, SIGKILL);
  const auto killed_at = Clock::now();
  EXPECT_EQ(wait_process(holder).term_signal, SIGKILL);
  for (int i = 0; i < 7; ++i) {
    auto r = wait_process(others[i]);
    EXPECT_EQ(r.exit_code, 0) << fs::read_file(logs_ / ("other" + std::to_string(i) + ".log"));
  }
  // Well before the stall (60 s) or the others' deadline (120 s) would have ended it.
  EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(20));
  // One of the others took the blob over and downloaded it whole once; the rest used it.
  EXPECT_EQ(proxy.count("GET", "/blobs/" + layer.digest.str()), 2u);
  // The stored blob is the whole, verified layer; the holder's partial temp file was never
  // renamed into blobs/ (it stays in tmp/ until swept as stale).
  EXPECT_EQ(sha256_of_file(cache.path() / "blobs/sha256" / layer.digest.hex), layer.digest);
  expect_verified(cache.path());
}

TEST_F(FleetPull, LockHeldForeverEndsAtTheDeadlineNamingTheDigest) {
  LayoutSpec spec;
  spec.variants = 1;
  BuiltLayout b = push_layout("fleet/stuck@v1", spec);
  TempDir cache{"kh-fleet-cache"};
  // A first pull makes the cache; its blob is removed again, and this test holds its lock as a
  // stuck process would (stopped with Ctrl-Z, say).
  ASSERT_EQ(run_process(pull_argv(registry_.oci_url(), cache.path().string(), "fleet/stuck@v1"),
                        {{"KERNEL_HUB_ENDPOINT", "\x01"}})
                .exit_code,
            0);
  const std::string hex = b.layers[0].digest.hex;
  fs::remove_tree(cache.path() / "blobs/sha256" / hex);
  auto held = fs::FileLock::try_acquire(cache.path() / "locks" / ("blob-" + hex + ".lock"));
  ASSERT_TRUE(held.has_value());

  const auto start = Clock::now();
  auto r = run_process(pull_argv(registry_.oci_url(), cache.path().string(), "fleet/stuck@v1"),
                       {{"KERNEL_HUB_ENDPOINT", "\x01"}, {"KERNEL_HUB_COMMAND_TIMEOUT_S", "2"}});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
  EXPECT_NE(r.err.find("sha256:" + hex), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pid " + std::to_string(::getpid())), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resume or end it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("KERNEL_HUB_COMMAND_TIMEOUT_S"), std::string::npos) << r.err;

  held.reset();  // the stuck process ends: the next pull goes through
  auto again = run_process(pull_argv(registry_.oci_url(), cache.path().string(), "fleet/stuck@v1"),
                           {{"KERNEL_HUB_ENDPOINT", "\x01"}});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  expect_verified(cache.path());
}

TEST_F(FleetPull, PlantedLockLinkAndLockDirectoryFileAreRefused) {
  LayoutSpec spec;
  spec.variants = 1;
  BuiltLayout b = push_layout("fleet/planted@v1", spec);
  TempDir cache{"kh-fleet-cache"};
  TempDir elsewhere{"kh-fleet-elsewhere"};
  ASSERT_EQ(run_process({cli_path(), "--cache", cache.path().string(), "ls"}).exit_code, 0);

  // A link planted where a blob's lock file goes: never followed, nothing written through it.
  const std::filesystem::path target = elsewhere / "victim";
  const std::string lock_name = "blob-" + b.layers[0].digest.hex + ".lock";
  std::filesystem::create_symlink(target, cache.path() / "locks" / lock_name);
  auto r = run_process(pull_argv(registry_.oci_url(), cache.path().string(), "fleet/planted@v1"),
                       {{"KERNEL_HUB_ENDPOINT", "\x01"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("symbolic link"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(lock_name), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(target)));
  EXPECT_FALSE(std::filesystem::exists(cache.path() / "blobs/sha256" / b.layers[0].digest.hex));

  // The lock directory replaced by a file: refused with the path, nothing written into it.
  fs::remove_tree(cache.path() / "locks");
  fs::write_file_atomic(cache.path() / "locks", "not a directory\n");
  auto d = run_process(pull_argv(registry_.oci_url(), cache.path().string(), "fleet/planted@v1"),
                       {{"KERNEL_HUB_ENDPOINT", "\x01"}});
  EXPECT_NE(d.exit_code, 0);
  EXPECT_NE(d.err.find((cache.path() / "locks").string()), std::string::npos) << d.err;
  EXPECT_EQ(fs::read_file(cache.path() / "locks"), "not a directory\n");
}

// Each process in its own network namespace (reaching the registry through a relay, as a node
// reaches a registry over its own network) and its own mount namespace, where the one cache
// directory is bind-mounted at a path of its own: a cluster file system's stand-in.
TEST_F(FleetPull, SixteenNamespacesSharingOneCacheDirectoryFetchEachBlobOnce) {
  const std::string runner = KH_NETNS_RUNNER;
  if (runner.empty()) GTEST_SKIP() << "netns_runner was not built";
  TempDir nodes{"kh-fleet-nodes"};
  std::filesystem::create_directories(nodes / "probe");
  auto probe = run_process({runner, std::to_string(registry_.port()), nodes.path().string(),
                            (nodes / "probe").string(), "--", "true"});
  if (probe.exit_code == 77) GTEST_SKIP() << "network/mount namespaces unavailable: " << probe.err;
  ASSERT_EQ(probe.exit_code, 0) << probe.err;

  BuiltLayout b = push_layout("fleet/nodes@v1", small_layers());
  FaultProxy proxy(registry_.port());
  slow_first_layer(proxy, b);
  TempDir shared{"kh-fleet-shared"};
  const size_t from = registry_.log().size();
  std::vector<pid_t> pids;
  for (int i = 0; i < kFleet; ++i) {
    const std::filesystem::path mount = nodes / ("node" + std::to_string(i));
    std::filesystem::create_directories(mount);
    std::vector<std::string> argv = {runner, std::to_string(proxy.port()), shared.path().string(),
                                     mount.string(), "--"};
    for (auto& a : pull_argv(proxy.oci_url(), mount.string(), "fleet/nodes@v1")) argv.push_back(a);
    pids.push_back(spawn_process(argv, {{"KERNEL_HUB_ENDPOINT", "\x01"}},
                                 logs_ / ("node" + std::to_string(i) + ".log")));
  }
  for (int i = 0; i < kFleet; ++i) {
    auto r = wait_process(pids[i]);
    EXPECT_EQ(r.exit_code, 0) << fs::read_file(logs_ / ("node" + std::to_string(i) + ".log"));
  }
  expect_coalesced(requests_since(from), b, "fleet/nodes", kFleet);
  expect_verified(shared.path());
}

}  // namespace
}  // namespace kh::test
