// Lock files: round trip, atomic save, validation errors, mismatch checks.
#include <gtest/gtest.h>

#include <filesystem>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "registry/lock_file.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

Digest digest_of(char c) {
  return Digest::from_hex(std::string(64, c));
}

LockFile sample() {
  LockFile lock;
  LockEntry a;
  a.ref = Ref::parse("org/norm@v1");
  a.hub = "dir/hub";
  a.index_digest = digest_of('a');
  a.targets["cpu:linux/amd64"] = {digest_of('b'), digest_of('c'), 123};
  a.targets["cuda:sm_90:cuda_13.0:linux/amd64"] = {digest_of('d'), digest_of('e'), 456};
  LockEntry b;
  b.ref = Ref::parse("org/act@sha256:" + std::string(64, 'f'));
  b.hub = "dir/hub";
  b.index_digest = digest_of('f');
  lock.entries = {b, a};
  return lock;
}

TEST(LockFile, RoundTripAndAtomicSave) {
  LockFile lock = sample();
  std::string text = lock.serialize();
  LockFile back = LockFile::parse(text);
  EXPECT_EQ(back.serialize(), text);
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0].ref.str(), "org/act@sha256:" + std::string(64, 'f'));  // sorted
  const LockEntry* e = back.find(Ref::parse("org/norm@v1"));
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->targets.at("cuda:sm_90:cuda_13.0:linux/amd64").layer_size, 456);
  EXPECT_EQ(back.find(Ref::parse("org/norm@v2")), nullptr);

  test::TempDir tmp;
  auto path = tmp.path() / "kernels.lock";
  lock.save(path);
  EXPECT_EQ(LockFile::load(path).serialize(), text);
  size_t files = 0;
  for ([[maybe_unused]] auto& f : std::filesystem::directory_iterator(tmp.path())) ++files;
  EXPECT_EQ(files, 1u);  // no temp file left behind

  LockFile example =
      LockFile::load(std::filesystem::path(KH_SOURCE_DIR) / "manifests/examples/kernels.lock.json");
  EXPECT_EQ(example.entries.size(), 1u);
}

TEST(LockFile, PutReplacesSameRef) {
  LockFile lock = sample();
  LockEntry e = lock.entries[1];
  e.index_digest = digest_of('9');
  lock.put(e);
  EXPECT_EQ(lock.entries.size(), 2u);
  EXPECT_EQ(lock.find(e.ref)->index_digest, digest_of('9'));
}

TEST(LockFile, Errors) {
  std::string d = "\"sha256:" + std::string(64, 'a') + "\"";
  struct Case {
    std::string json;
    const char* expect;
  } cases[] = {
      {"[]", "$: expected {\"version\": 1"},
      {"{\"version\": 2, \"entries\": []}", "$.version: unsupported lock file version 2"},
      {"{\"entries\": []}", "$.version: missing"},
      {"{\"version\": 1}", "$.entries: missing"},
      {"{\"version\": 1, \"entries\": [{\"ref\": \"Bad\", \"hub\": \"h\", \"index_digest\": " + d +
           ", \"targets\": {}}]}",
       "$.entries[0].ref: invalid ref 'Bad'"},
      {"{\"version\": 1, \"entries\": [{\"ref\": \"o/n\", \"hub\": \"h\", \"index_digest\": "
       "\"sha256:12\", \"targets\": {}}]}",
       "$.entries[0].index_digest: expected \"sha256:<64 lowercase hex>\""},
      {"{\"version\": 1, \"entries\": [{\"ref\": \"o/n\", \"hub\": \"h\", \"index_digest\": " + d +
           "}]}",
       "$.entries[0].targets: missing"},
      {"{\"version\": 1, \"entries\": [{\"ref\": \"o/n\", \"hub\": \"h\", \"index_digest\": " + d +
           ", \"targets\": {\"gpu\": {}}}]}",
       "$.entries[0].targets.gpu: 'gpu' is not a device"},
      {"{\"version\": 1, \"entries\": [{\"ref\": \"o/n\", \"hub\": \"h\", \"index_digest\": " + d +
           ", \"targets\": {\"cpu:linux/amd64\": {\"manifest_digest\": " + d +
           ", \"layer_digest\": " + d + ", \"layer_size\": -1}}}]}",
       "$.entries[0].targets[\"cpu:linux/amd64\"].layer_size: expected a byte count"},
      {"{\"version\": 1, \"entries\": [{\"ref\": \"o/n\", \"hub\": \"h\", \"index_digest\": " + d +
           ", \"targets\": {}}, {\"ref\": \"o/n@v1\", \"hub\": \"h\", \"index_digest\": " + d +
           ", \"targets\": {}}]}",
       "$.entries[1]: ref o/n@v1 is locked twice"},
      {"{\"version\": 1, \"entries\": [], \"extra\": 1}", "$.extra: unknown key 'extra'"},
  };
  for (auto& c : cases) {
    try {
      LockFile::parse(c.json, "kernels.lock");
      ADD_FAILURE() << "accepted " << c.json;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << "message: " << e.what() << "\nwant: " << c.expect;
    }
  }
}

TEST(LockFile, ChecksNameRefExpectedAndFound) {
  LockFile lock = sample();
  Ref norm = Ref::parse("org/norm@v1");
  const LockEntry& e = require_locked(lock, norm);
  EXPECT_NO_THROW(check_locked_index(e, "dir/hub", digest_of('a')));
  try {
    check_locked_index(e, "dir/hub", digest_of('7'));
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kIntegrity);
    std::string m = err.what();
    EXPECT_NE(m.find("org/norm@v1"), std::string::npos) << m;
    EXPECT_NE(m.find("expected " + digest_of('a').str()), std::string::npos) << m;
    EXPECT_NE(m.find("found " + digest_of('7').str()), std::string::npos) << m;
  }
  EXPECT_THROW(check_locked_index(e, "other/hub", digest_of('a')), Error);
  try {
    require_locked(lock, Ref::parse("org/missing@v1"));
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kNotFound);
  }
  try {
    require_locked_target(e, "cuda:sm_80:cuda_12.4:linux/amd64");
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(err.what()).find("cpu:linux/amd64"), std::string::npos);
  }
}

}  // namespace
}  // namespace kh
