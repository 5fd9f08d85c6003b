// docker config.json / containers auth.json parsing and key matching (hub/transport/docker_config).
#include <gtest/gtest.h>

#include "hub/base/error.h"
#include "hub/transport/docker_config.h"

namespace kh {
namespace {

TEST(DockerConfig, KeysMatchAsDockerMatchesThem) {
  EXPECT_EQ(registry_key_host("https://Reg.Example:5000/v2/"), "reg.example:5000");
  EXPECT_EQ(registry_key_host("reg.example"), "reg.example");
  EXPECT_EQ(registry_key_host("quay.io/ns/repo"), "quay.io");
  EXPECT_EQ(registry_key_host("https://index.docker.io/v1/"), "docker.io");
  EXPECT_EQ(registry_key_host("registry-1.docker.io"), "docker.io");

  DockerConfig c = parse_docker_config(
      R"({"auths": {"https://index.docker.io/v1/": {"auth": "dTpwOmM="},
                    "http://reg.example:5000/v2/": {"username": "a", "password": "b"},
                    "reg.example": {"identitytoken": "id"}},
          "credHelpers": {"ecr.example": "ecr-login"}, "credsStore": "desktop",
          "HttpHeaders": {"X": "y"}})",
      "config.json");
  ASSERT_TRUE(c.auth_for("docker.io"));
  EXPECT_EQ(c.auth_for("docker.io")->username, "u");
  EXPECT_EQ(c.auth_for("docker.io")->password, "p:c");  // only the first ':' splits
  ASSERT_TRUE(c.auth_for("reg.example:5000"));
  EXPECT_EQ(c.auth_for("reg.example:5000")->username, "a");
  ASSERT_TRUE(c.auth_for("reg.example"));  // the port is part of the key
  EXPECT_EQ(c.auth_for("reg.example")->identity_token, "id");
  EXPECT_FALSE(c.auth_for("reg.example:5001"));
  EXPECT_EQ(c.helper_for("ecr.example"), "ecr-login");
  EXPECT_EQ(c.helper_for("reg.example"), "");
  EXPECT_EQ(c.creds_store, "desktop");
}

TEST(DockerConfig, MalformedEntriesNameFileAndMember) {
  auto message = [](const std::string& text) {
    try {
      parse_docker_config(text, "/home/u/.docker/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("parsed");
  };
  EXPECT_NE(message("{").find("/home/u/.docker/config.json: not valid JSON"), std::string::npos);
  EXPECT_NE(message(R"({"auths": {"r": {"auth": "bm9jb2xvbg=="}}})").find(R"(auths["r"].auth)"),
            std::string::npos);
  EXPECT_NE(message(R"({"auths": {"r": {"username": 3}}})").find("username is not a string"),
            std::string::npos);
  EXPECT_NE(message(R"({"credsStore": "../../bin/sh"})").find("contains '/'"), std::string::npos);
  EXPECT_NE(message(R"({"credHelpers": {"r": ""}})").find("credHelpers"), std::string::npos);
}

TEST(DockerConfig, HelperReplies) {
  AuthEntry a = parse_helper_reply(R"({"ServerURL": "r", "Username": "u", "Secret": "s"})", "h");
  EXPECT_EQ(a.username, "u");
  EXPECT_EQ(a.password, "s");
  AuthEntry t =
      parse_helper_reply(R"({"ServerURL": "r", "Username": "<token>", "Secret": "s"})", "h");
  EXPECT_EQ(t.identity_token, "s");
  EXPECT_TRUE(t.username.empty());
  EXPECT_THROW(parse_helper_reply("not json", "h"), Error);
}

}  // namespace
}  // namespace kh
