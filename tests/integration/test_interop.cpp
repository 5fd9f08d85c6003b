// Interop with skopeo: what kernel-hub pushes is standard OCI. skopeo reads the exact
// manifest bytes, copies the artifact to an oci: layout, and kernel-hub pulls that layout;
// and the reverse direction, a layout copied to the registry by skopeo, pulled by kernel-hub.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hub/base/digest.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"

namespace kh::test {
namespace {

class SkopeoInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_program("skopeo")) GTEST_SKIP() << "skopeo is not installed";
    if (!registry_.available()) GTEST_SKIP() << registry_.why();
  }
  ProcessResult cli(std::vector<std::string> args, const std::string& hub) {
    std::vector<std::string> argv = {cli_path(),     "--cache", cache_.path().string(),
                                     "--plain-http", "--hub",   hub};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, {{"KERNEL_HUB_OFFLINE", "\x01"}});
  }
  ProcessResult skopeo(std::vector<std::string> args) {
    args.insert(args.begin(), {"skopeo", "--insecure-policy"});
    return run_process(args, {{"HOME", home_.path().string()}}, 120);
  }
  std::string docker_ref(const std::string& repo_tag) {
    return "docker://" + registry_.host() + "/" + repo_tag;
  }

  RegistryFixture registry_;
  TempDir cache_{"kh-interop-cache"};
  TempDir home_{"kh-interop-home"};
};

TEST_F(SkopeoInterop, PushedByKernelHubReadAndCopiedBySkopeo) {
  TempDir layout;
  BuiltLayout b = build_layout(layout.path(), LayoutSpec{});
  auto push = cli({"push", layout.path().string(), "interop/pkg@v1"}, registry_.oci_url());
  ASSERT_EQ(push.exit_code, 0) << push.err;

  auto raw = skopeo({"inspect", "--raw", "--tls-verify=false", docker_ref("interop/pkg:v1")});
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  EXPECT_EQ(sha256_of(raw.out), b.index.digest) << raw.out;

  // skopeo copies it into an oci: layout inside a layout hub; kernel-hub pulls from there.
  TempDir hub;
  auto dest = hub.path() / "interop" / "pkg";
  std::filesystem::create_directories(dest);
  auto copy = skopeo({"copy", "--all", "--preserve-digests", "--src-tls-verify=false",
                      docker_ref("interop/pkg:v1"), "oci:" + dest.string() + ":v1"});
  ASSERT_EQ(copy.exit_code, 0) << copy.err;
  auto pull = cli({"--json", "pull", "interop/pkg@v1"}, hub.path().string());
  ASSERT_EQ(pull.exit_code, 0) << pull.err;
  EXPECT_EQ(nlohmann::json::parse(pull.out)[0]["digest"], b.index.digest.str());
  EXPECT_EQ(cli({"verify"}, hub.path().string()).exit_code, 0);
}

TEST_F(SkopeoInterop, CopiedBySkopeoPulledByKernelHub) {
  TempDir layout;
  BuiltLayout b = build_layout(layout.path(), LayoutSpec{});
  auto copy = skopeo({"copy", "--all", "--preserve-digests", "--dest-tls-verify=false",
                      "oci:" + layout.path().string() + ":v1", docker_ref("interop/rev:v1")});
  ASSERT_EQ(copy.exit_code, 0) << copy.err;
  auto pull = cli({"--json", "pull", "interop/rev@v1"}, registry_.oci_url());
  ASSERT_EQ(pull.exit_code, 0) << pull.err;
  auto j = nlohmann::json::parse(pull.out);
  EXPECT_EQ(j[0]["digest"], b.index.digest.str());
  EXPECT_EQ(j[0]["manifests"], 2);
}

}  // namespace
}  // namespace kh::test
