// The CLI's handling of bad usage and input, with no server: error objects on stdout with
// --json on every failure path, exit codes, unknown commands, options that cannot go together,
// bad environment values and limits, and warnings that -q does not hide. The hub is an empty
// layout directory (every ref is absent), so nothing here needs the network.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/fixtures/process.h"

namespace kh::test {
namespace {

using nlohmann::json;

class CliUsage : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(hub_.path());
    std::ofstream(config_)
        << R"({"RMSNorm": {"cpu": {"eval": "acme/none@v1", "train": "acme/none@v1"}}})";
  }

  // kernel-hub with a fresh cache and trust store, the empty hub and no data directory (no
  // built-in key, no default hub), unless `env` says otherwise.
  ProcessResult cli(const std::vector<std::string>& args, Env env = {}) {
    std::vector<std::string> argv = {cli_path(), "--cache", (work_ / "cache").string(), "--hub",
                                     hub_.path().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace("KERNEL_HUB_TRUST_DIR", (work_ / "trust").string());
    env.emplace("KERNEL_HUB_DATA_DIR", (work_ / "no-data").string());
    env.emplace("KERNEL_HUB_OFFLINE", "\x01");
    env.emplace("KERNEL_HUB_PLAIN_HTTP", "\x01");
    env.emplace("KERNEL_HUB_ENDPOINT", "\x01");
    return run_process(argv, env, 60);
  }

  // The --json error object on stdout: its kind, after checking stdout holds nothing else.
  static std::string error_kind(const ProcessResult& r) {
    json j = json::parse(r.out, nullptr, false);
    if (j.is_discarded() || !j.contains("error")) return "no error object in: " + r.out;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r.out;
    return j["error"]["kind"].get<std::string>();
  }

  static bool has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  }

  TempDir work_{"kh-cli-usage"};
  TempDir hub_{"kh-empty-hub"};
  std::filesystem::path config_ = work_ / "config.json";
};

TEST_F(CliUsage, BadBooleanVariablesAreErrorsNotAborts) {
  for (const char* var : {"KERNEL_HUB_OFFLINE", "KERNEL_HUB_PLAIN_HTTP"}) {
    SCOPED_TRACE(var);
    // cli() unsets both; a value given here replaces that.
    std::vector<std::string> argv = {cli_path(), "--cache", (work_ / "cache").string(), "--json",
                                     "ls"};
    ProcessResult r = run_process(argv, {{var, "maybe"}}, 60);
    EXPECT_EQ(r.exit_code, 2) << r.err;  // was SIGABRT (exit_code -1)
    EXPECT_TRUE(has(r.err, std::string("error: ") + var + "='maybe'")) << r.err;
    EXPECT_EQ(error_kind(r), "invalid_input");
  }
}

TEST_F(CliUsage, GcRefusesLimitsThatOverflowOrAreEmpty) {
  struct Case {
    std::string option, value, says;
  };
  for (const Case& c : std::vector<Case>{{"--max-size", "16777216T", "too large"},
                                         {"--max-size", "99999999999999999999", "not a size"},
                                         {"--older-than", "213503982334602d", "too large"},
                                         {"--max-size", "", "not a size"},
                                         {"--older-than", "", "not a duration"}}) {
    SCOPED_TRACE(c.option + "=" + c.value);
    ProcessResult r = cli({"--json", "gc", c.option, c.value, "--dry-run"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(has(r.err, "gc " + c.option + " '" + c.value + "'")) << r.err;
    EXPECT_TRUE(has(r.err, c.says)) << r.err;
    EXPECT_EQ(error_kind(r), "invalid_input");
  }
  // The largest sizes that fit are accepted.
  EXPECT_EQ(cli({"gc", "--max-size", "16777215T", "--older-than", "106751991167300d", "--dry-run"})
                .exit_code,
            0);
}

TEST_F(CliUsage, JsonAfterTheCommandKeepsStdoutOneDocument) {
  ProcessResult r = cli({"resolve", "--config", config_.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["unserved"].size(), 2u);
  r = cli({"why", "RMSNorm", "--config", config_.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["layer"], "RMSNorm");
}

TEST_F(CliUsage, EveryFailureWithJsonPrintsAnErrorObject) {
  const std::string lock = (work_ / "s.lock").string();
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string kind;
  };
  for (const Case& c : std::vector<Case>{
           {{"resolve", "--config", "/nonexistent.json", "--json"}, 1, "not_found"},
           {{"--json", "ls", "--bogus"}, 2, "invalid_input"},
           {{"--json", "nosuchcmd"}, 2, "invalid_input"},
           {{"--json", "lock"}, 2, "invalid_input"},  // --config missing
           {{"--json", "lock", "--config", config_.string(), "--strict", "-o", lock},
            1,
            "not_found"},
           {{"lock", "--config", config_.string(), "--strict", "-o", lock, "--json"},
            1,
            "not_found"},
       }) {
    std::string line;
    for (auto& a : c.args) line += a + " ";
    SCOPED_TRACE(line);
    ProcessResult r = cli(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << r.err;
    EXPECT_EQ(error_kind(r), c.kind);
    EXPECT_TRUE(has(r.err, "error: ")) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(lock));
}

TEST_F(CliUsage, UnknownCommandSaysSoAndSuggests) {
  ProcessResult r = cli({"pul", "kernel-hub/example"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "error: unknown command 'pul' (did you mean 'pull'?)")) << r.err;
  r = cli({"-q", "nosuchcmd"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "unknown command 'nosuchcmd'; commands: pull, ")) << r.err;
  r = cli({"trust", "bogus"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "unknown command 'bogus' for 'kernel-hub trust'; commands: add, ls, rm"))
      << r.err;
  // Global options before and after the command still work (cli() puts --cache and --hub first;
  // a global option with a value after the command name, too).
  r = run_process({cli_path(), "ls", "--cache", (work_ / "other").string()},
                  {{"KERNEL_HUB_OFFLINE", "\x01"}}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(cli({"--json", "-q", "trust", "ls"}).exit_code, 0);
  r = cli({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "A subcommand is required")) << r.err;
}

TEST_F(CliUsage, DeviceOptionsThatWouldBeIgnoredAreRefused) {
  const std::string lock = (work_ / "k.lock").string();
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"pull", "--lock", lock, "--device", "cpu"}, "cannot be combined with --lock"},
           {{"pull", "--lock", lock, "--target", "cuda:sm_90:cuda_13.0"},
            "cannot be combined with --lock"},
           {{"pull", "--config", config_.string(), "--all-variants", "--sm", "90"},
            "cannot be combined with --all-variants"},
           {{"export", "--lock", lock, "--target", "cpu", "-o", (work_ / "m").string()},
            "cannot be combined with --lock"},
           {{"export", "--config", config_.string(), "--all-variants", "--os", "linux", "-o",
             (work_ / "m").string()},
            "cannot be combined with --all-variants"},
       }) {
    SCOPED_TRACE(c.args[0] + " " + c.args[1]);
    ProcessResult r = cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_TRUE(has(r.err, c.says)) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(work_ / "m"));
}

TEST_F(CliUsage, QuietHidesNotesButNotWarnings) {
  ProcessResult r = cli({"-q", "resolve", "--config", config_.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: unserved: RMSNorm eval")) << r.err;
  r = cli(
      {"-q", "--json", "lock", "--config", config_.string(), "-o", (work_ / "q.lock").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "warning: unserved (not locked): RMSNorm cpu eval")) << r.err;
  EXPECT_FALSE(json::parse(r.out, nullptr, false).is_discarded()) << r.out;
}

// A config or lock file that is not there is named with what it should be; a directory given
// for one is bad input (exit 2).
TEST_F(CliUsage, AMissingConfigOrLockIsNamedWithWhatItShouldBe) {
  const std::string missing = (work_ / "nope.json").string();
  ProcessResult r = cli({"--json", "resolve", "--config", missing});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(has(r.err, missing + " not found")) << r.err;
  EXPECT_TRUE(has(r.err, "KernelConfig JSON file")) << r.err;
  EXPECT_EQ(error_kind(r), "not_found");
  r = cli({"pull", "--lock", missing});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "lock file")) << r.err;
  r = cli({"resolve", "--config", work_.path().string()});  // a directory
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

// A hub directory that is not there is a wrong --hub, not a missing repository; a push source
// that is not a layout says so.
TEST_F(CliUsage, AMissingHubDirectoryOrLayoutIsNamedAsSuch) {
  std::vector<std::string> argv = {
      cli_path(), "--cache",  (work_ / "cache").string(), "--hub", (work_ / "no-hub").string(),
      "info",     "acme/none"};
  ProcessResult r = run_process(argv, {{"KERNEL_HUB_TRUST_DIR", (work_ / "trust").string()}}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "the hub directory " + (work_ / "no-hub").string() + " does not exist"))
      << r.err;
  std::filesystem::create_directories(work_ / "empty-layout");
  r = cli({"push", (work_ / "empty-layout").string(), "acme/none@v1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "is not an OCI image layout")) << r.err;
}

// A hub that cannot be asked is not a ref that is absent: lock, pull --config and export fail
// naming the ref, and no (empty) lock is written. Port 9 (discard) refuses the connection.
TEST_F(CliUsage, AnUnreachableHubFailsLockAndPullRatherThanWarning) {
  const std::string lock = (work_ / "down.lock").string();
  const std::vector<std::vector<std::string>> commands = {
      {"lock", "--config", config_.string(), "-o", lock},
      {"pull", "--config", config_.string()},
      {"export", "--config", config_.string(), "-o", (work_ / "mirror").string()}};
  for (const auto& command : commands) {
    SCOPED_TRACE(command.front());
    std::vector<std::string> argv = {cli_path(), "--cache",           (work_ / "cache").string(),
                                     "--hub",    "oci://127.0.0.1:9", "--plain-http"};
    argv.insert(argv.end(), command.begin(), command.end());
    ProcessResult r = run_process(
        argv,
        {{"KERNEL_HUB_TRUST_DIR", (work_ / "trust").string()}, {"KERNEL_HUB_MAX_ATTEMPTS", "1"}},
        60);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_TRUE(has(r.err, "acme/none")) << r.err;
    EXPECT_FALSE(has(r.err, "unserved")) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(lock)) << "a lock was written";
}

TEST_F(CliUsage, TheBuiltInKeyIsNamedAsSuchByTrustRm) {
  // A data directory whose default-hub-key is a key made here: `trust ls` lists it as built in.
  auto data = work_ / "data";
  std::filesystem::create_directories(data / "default-hub-key");
  ASSERT_EQ(cli({"keygen", "-o", (work_ / "k.key").string()}).exit_code, 0);
  std::filesystem::copy_file(work_ / "k.key.pub", data / "default-hub-key" / "signing.pub");
  Env env = {{"KERNEL_HUB_DATA_DIR", data.string()}};
  ProcessResult ls = cli({"--json", "trust", "ls"}, env);
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  json keys = json::parse(ls.out)["keys"];
  ASSERT_EQ(keys.size(), 1u) << ls.out;
  ASSERT_TRUE(keys[0]["builtin"].get<bool>());
  std::string id = keys[0]["keyid"].get<std::string>().substr(0, 12);
  ProcessResult rm = cli({"trust", "rm", id}, env);
  EXPECT_EQ(rm.exit_code, 1);
  EXPECT_TRUE(has(rm.err, "key " + id + " is built in")) << rm.err;
  EXPECT_TRUE(has(rm.err, "cannot be removed")) << rm.err;
  // A key nobody trusts is still "no trusted key".
  rm = cli({"trust", "rm", "0123456789ab"}, env);
  EXPECT_EQ(rm.exit_code, 1);
  EXPECT_TRUE(has(rm.err, "no trusted key 0123456789ab")) << rm.err;
}

// The built-in key (trusted for kernel-hub/*) and the default hub come from the data directory
// beside the binary, or from a build tree above it: never from a directory another user can
// write. A binary under a world-writable folder (/tmp, say) where someone planted a build-tree
// marker and a key does not trust that key; the same tree in a folder only we can write does.
TEST_F(CliUsage, APlantedBuildTreeInASharedFolderSuppliesNoKey) {
  const auto shared = work_ / "shared";
  std::filesystem::create_directories(shared / "app/bin");
  std::filesystem::create_directories(shared / "default-hub-key");
  std::filesystem::copy_file(cli_path(), shared / "app/bin/kernel-hub");
  std::ofstream(shared / "kernel-hub-build-tree") << "planted\n";
  ASSERT_EQ(cli({"keygen", "-o", (work_ / "k.key").string()}).exit_code, 0);
  std::filesystem::copy_file(work_ / "k.key.pub", shared / "default-hub-key" / "signing.pub");
  auto builtin_keys = [&] {
    ProcessResult ls = run_process(
        {(shared / "app/bin/kernel-hub").string(), "--json", "trust", "ls"},
        {{"KERNEL_HUB_TRUST_DIR", (work_ / "trust").string()}, {"KERNEL_HUB_DATA_DIR", ""}}, 60);
    EXPECT_EQ(ls.exit_code, 0) << ls.err;
    size_t n = 0;
    const json listed = json::parse(ls.out, nullptr, false);
    for (const auto& k : listed["keys"]) n += k["builtin"] == true;
    return n;
  };
  ::chmod(shared.c_str(), 01777);
  EXPECT_EQ(builtin_keys(), 0u) << "a key planted in a world-writable folder was trusted";
  // The lookup says why (here through `pull`, which needs the default hub).
  ProcessResult pull = run_process({(shared / "app/bin/kernel-hub").string(), "--cache",
                                    (work_ / "cache").string(), "pull", "kernel-hub/example"},
                                   {{"KERNEL_HUB_TRUST_DIR", (work_ / "trust").string()},
                                    {"KERNEL_HUB_DATA_DIR", ""},
                                    {"KERNEL_HUB_ENDPOINT", ""}},
                                   60);
  EXPECT_NE(pull.exit_code, 0);
  EXPECT_TRUE(has(pull.err, shared.string() + " is not trusted: anyone can write it")) << pull.err;
  ::chmod(shared.c_str(), 0755);
  EXPECT_EQ(builtin_keys(), 1u) << "the control: the same tree, private, is used";
}

}  // namespace
}  // namespace kh::test
