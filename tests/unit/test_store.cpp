// The content-addressed store: verified writes, damage detection, ref records, behaviour
// under concurrent and killed processes, unpacking, and gc by age and by size.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/oci/oci.h"
#include "hub/store/archive.h"
#include "hub/store/store.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

std::string pseudo_random_bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s[i] = static_cast<char>(x & 0xff);
  }
  return s;
}

oci::Descriptor blob_desc(const std::string& bytes) {
  return oci::describe(bytes, oci::kMediaTypeOctetStream);
}

std::vector<std::string> names_in(const stdfs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : stdfs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

void expect_integrity_error(const std::function<void()>& f, const std::string& needle = "") {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity) << e.what();
    if (!needle.empty()) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message '" << e.what() << "' lacks '" << needle << "'";
    }
  }
}

// Runs f in a forked child; returns its pid. The child exits 0 on success, 1 on an exception.
pid_t fork_child(const std::function<void()>& f) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      f();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", ::getpid(), e.what());
      code = 1;
    }
    ::_exit(code);
  }
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void age_file(const stdfs::path& p, std::chrono::hours by) {
  stdfs::last_write_time(p, stdfs::file_time_type::clock::now() - by);
}

class StoreTest : public ::testing::Test {
 protected:
  stdfs::path root() const { return tmp_.path() / "cache"; }
  TempDir tmp_{"kh-store"};
};

TEST_F(StoreTest, LayoutAndCacheDirTag) {
  Store s(root());
  for (const char* d : {"blobs/sha256", "tmp", "refs", "unpacked", "locks"}) {
    EXPECT_TRUE(stdfs::is_directory(root() / d)) << d;
  }
  std::string tag = fs::read_file(root() / "CACHEDIR.TAG");
  EXPECT_TRUE(tag.starts_with("Signature: 8a477f597d28d172789f06886806bc55"));
  Store again(root());  // reopening is harmless
  EXPECT_EQ(fs::read_file(root() / "CACHEDIR.TAG"), tag);
}

// A download batch is checked against the free space as a whole: more than the file system
// holds is refused before anything is written, naming the need and what the batch is.
TEST_F(StoreTest, FreeSpaceIsCheckedForAWholeBatch) {
  Store s(root());
  EXPECT_NO_THROW(s.require_free_space(1, "one byte"));
  try {
    s.require_free_space(uint64_t{1} << 62, "3 blobs of org/x@v1");
    FAIL() << "4 EiB fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("for 3 blobs of org/x@v1: need"), std::string::npos)
        << e.what();
  }
}

TEST_F(StoreTest, DefaultRootFollowsEnvironment) {
  std::string saved_cache = std::getenv("KERNEL_HUB_CACHE") ? std::getenv("KERNEL_HUB_CACHE") : "";
  std::string saved_xdg = std::getenv("XDG_CACHE_HOME") ? std::getenv("XDG_CACHE_HOME") : "";
  std::string saved_home = std::getenv("HOME") ? std::getenv("HOME") : "";
  ::setenv("KERNEL_HUB_CACHE", "/x/kh", 1);
  ::setenv("XDG_CACHE_HOME", "/x/xdg", 1);
  ::setenv("HOME", "/x/home", 1);
  EXPECT_EQ(Store::default_root(), stdfs::path("/x/kh"));
  ::unsetenv("KERNEL_HUB_CACHE");
  EXPECT_EQ(Store::default_root(), stdfs::path("/x/xdg/kernel-hub"));
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(Store::default_root(), stdfs::path("/x/home/.cache/kernel-hub"));
  auto restore = [](const char* name, const std::string& v) {
    if (v.empty()) {
      ::unsetenv(name);
    } else {
      ::setenv(name, v.c_str(), 1);
    }
  };
  restore("KERNEL_HUB_CACHE", saved_cache);
  restore("XDG_CACHE_HOME", saved_xdg);
  restore("HOME", saved_home);
}

TEST_F(StoreTest, PutReadAndVerifyBlobs) {
  Store s(root());
  std::string bytes = "some blob content";
  oci::Descriptor d = blob_desc(bytes);
  EXPECT_FALSE(s.has_blob(d.digest));
  EXPECT_EQ(s.read_blob(d.digest, 1 << 20), std::nullopt);
  s.put_blob(d, bytes);
  s.put_blob(d, bytes);  // idempotent
  EXPECT_TRUE(s.has_blob(d.digest));
  EXPECT_EQ(s.blob_path(d.digest), root() / "blobs" / "sha256" / d.digest.hex);
  EXPECT_EQ(s.read_blob(d.digest, 1 << 20), bytes);
  struct stat st;
  ASSERT_EQ(::stat(s.blob_path(d.digest).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  EXPECT_EQ(s.blobs_size(), bytes.size());
  EXPECT_TRUE(s.verify().empty());
  EXPECT_TRUE(names_in(root() / "tmp").empty());

  // Bytes that do not match their descriptor are never stored.
  oci::Descriptor other = blob_desc("other content");
  expect_integrity_error([&] { s.put_blob(other, "tampered content"); });
  EXPECT_FALSE(s.has_blob(other.digest));
  EXPECT_TRUE(names_in(root() / "tmp").empty());
}

// A cached blob is judged by its content: intact content is kept whatever size a descriptor
// claims (a hub naming a cached digest with a wrong size must not delete it), damaged content is
// removed so that it is fetched again.
TEST_F(StoreTest, IntactBlobsAreJudgedByTheirContentNotByADescriptor) {
  Store s(root());
  const std::string bytes = "cached blob content";
  oci::Descriptor d = blob_desc(bytes);
  EXPECT_FALSE(s.has_intact_blob(d));
  s.put_blob(d, bytes);
  EXPECT_TRUE(s.has_intact_blob(d));
  oci::Descriptor lying = d;
  lying.size = 5;
  expect_integrity_error([&] { s.has_intact_blob(lying); });
  EXPECT_TRUE(s.has_blob(d.digest)) << "a wrong size in a descriptor deleted an intact blob";
  // Damage: removed, then absent.
  const stdfs::path p = s.blob_path(d.digest);
  ::chmod(p.c_str(), 0644);
  fs::write_file_atomic(p, "cached blob CONTENT", 0444);
  EXPECT_FALSE(s.has_intact_blob(d));
  EXPECT_FALSE(s.has_blob(d.digest));
}

// A damaged entry's removal takes only the file that was checked: a good copy another process
// renamed into its place meanwhile stays, with no window between the check and the removal.
TEST_F(StoreTest, RemovingADamagedEntrySparesAReplacement) {
  Store s(root());
  const stdfs::path p = s.blob_path(blob_desc("x").digest);
  const stdfs::path tmp = root() / "tmp";
  struct stat checked {};
  fs::write_file_atomic(p, "damaged", 0444);
  ASSERT_EQ(::lstat(p.c_str(), &checked), 0);
  EXPECT_TRUE(fs::remove_if_unchanged(p, tmp, checked));
  EXPECT_FALSE(stdfs::exists(p));
  EXPECT_FALSE(fs::remove_if_unchanged(p, tmp, checked)) << "nothing there to remove";

  fs::write_file_atomic(p, "damaged", 0444);
  ASSERT_EQ(::lstat(p.c_str(), &checked), 0);
  fs::write_file_atomic(p, "good copy", 0444);  // renamed over it: another inode
  EXPECT_FALSE(fs::remove_if_unchanged(p, tmp, checked));
  EXPECT_EQ(fs::read_file(p), "good copy");
  // A link put in its place is neither followed nor kept aside.
  const stdfs::path target = root() / "outside";
  fs::write_file_atomic(target, "not the cache's", 0644);
  fs::remove_tree(p);
  stdfs::create_symlink(target, p);
  ASSERT_EQ(::lstat(target.c_str(), &checked), 0);
  EXPECT_FALSE(fs::remove_if_unchanged(p, tmp, checked));
  EXPECT_TRUE(stdfs::is_symlink(p));
  EXPECT_EQ(fs::read_file(target), "not the cache's");
  EXPECT_TRUE(names_in(tmp).empty()) << "an entry was left aside";
  // Where nothing can be moved aside (here: no such directory; another file system or one
  // without RENAME_NOREPLACE alike), the check and the removal are two steps, and still work.
  fs::remove_tree(p);
  const stdfs::path nowhere = root() / "no-such-dir";
  fs::write_file_atomic(p, "damaged", 0444);
  ASSERT_EQ(::lstat(p.c_str(), &checked), 0);
  fs::write_file_atomic(p, "good copy", 0444);
  EXPECT_FALSE(fs::remove_if_unchanged(p, nowhere, checked));
  EXPECT_EQ(fs::read_file(p), "good copy");
  ASSERT_EQ(::lstat(p.c_str(), &checked), 0);
  EXPECT_TRUE(fs::remove_if_unchanged(p, nowhere, checked));
  EXPECT_FALSE(stdfs::exists(p));
}

TEST_F(StoreTest, BlobWriterCommitsVerifiedContent) {
  Store s(root());
  std::string bytes = pseudo_random_bytes(300000, 1);
  oci::Descriptor d = blob_desc(bytes);
  auto w = s.begin_blob(d);
  for (size_t off = 0; off < bytes.size(); off += 65536) {
    size_t n = std::min<size_t>(65536, bytes.size() - off);
    w->write(bytes.data() + off, n);
    EXPECT_EQ(w->offset(), off + n);
  }
  EXPECT_FALSE(s.has_blob(d.digest));  // nothing visible before commit
  EXPECT_EQ(names_in(root() / "tmp").size(), 1u);
  EXPECT_TRUE(names_in(root() / "tmp")[0].starts_with(d.digest.hex + "."));
  w->commit();
  EXPECT_TRUE(s.has_blob(d.digest));
  EXPECT_EQ(s.read_blob(d.digest, 1 << 20), bytes);
  EXPECT_TRUE(names_in(root() / "tmp").empty());
}

TEST_F(StoreTest, BlobWriterRefusesTooManyBytes) {
  Store s(root());
  std::string bytes = pseudo_random_bytes(1000, 2);
  oci::Descriptor d = blob_desc(bytes);
  auto w = s.begin_blob(d);
  w->write(bytes.data(), 600);
  std::string more = bytes.substr(600) + "X";
  expect_integrity_error([&] { w->write(more.data(), more.size()); }, "1000");
  EXPECT_FALSE(s.has_blob(d.digest));
  EXPECT_TRUE(names_in(root() / "tmp").empty());  // failed at once, temp removed
  expect_integrity_error([&] { w->commit(); });
  EXPECT_FALSE(s.has_blob(d.digest));
  // A restart after the failure (a retry of the download) can still succeed.
  w->restart();
  EXPECT_EQ(w->offset(), 0u);
  w->write(bytes.data(), bytes.size());
  w->commit();
  EXPECT_EQ(s.read_blob(d.digest, 1 << 20), bytes);
}

TEST_F(StoreTest, BlobWriterRefusesWrongDigestAndShortContent) {
  Store s(root());
  std::string bytes = pseudo_random_bytes(1000, 3);
  oci::Descriptor d = blob_desc(bytes);
  std::string wrong = bytes;
  wrong[500] ^= 1;
  {
    auto w = s.begin_blob(d);
    w->write(wrong.data(), wrong.size());
    // The message names both digests.
    expect_integrity_error([&] { w->commit(); }, d.digest.str());
  }
  {
    auto w = s.begin_blob(d);
    w->write(wrong.data(), wrong.size());
    expect_integrity_error([&] { w->commit(); }, sha256_of(wrong).str());
  }
  {
    auto w = s.begin_blob(d);
    w->write(bytes.data(), 999);
    expect_integrity_error([&] { w->commit(); }, "999");
  }
  EXPECT_FALSE(s.has_blob(d.digest));
  EXPECT_TRUE(names_in(root() / "blobs" / "sha256").empty());
  EXPECT_TRUE(names_in(root() / "tmp").empty());
}

TEST_F(StoreTest, BlobWriterRestartDropsEarlierBytes) {
  Store s(root());
  std::string bytes = pseudo_random_bytes(5000, 4);
  oci::Descriptor d = blob_desc(bytes);
  auto w = s.begin_blob(d);
  std::string junk = pseudo_random_bytes(3000, 99);
  w->write(junk.data(), junk.size());
  w->restart();
  EXPECT_EQ(w->offset(), 0u);
  w->write(bytes.data(), bytes.size());
  w->commit();
  EXPECT_EQ(s.read_blob(d.digest, 1 << 20), bytes);
}

TEST_F(StoreTest, UncommittedWriterLeavesNothing) {
  Store s(root());
  std::string bytes = pseudo_random_bytes(5000, 5);
  oci::Descriptor d = blob_desc(bytes);
  {
    auto w = s.begin_blob(d);
    w->write(bytes.data(), 2000);
  }
  EXPECT_FALSE(s.has_blob(d.digest));
  EXPECT_TRUE(names_in(root() / "tmp").empty());
}

TEST_F(StoreTest, DamagedEntryIsRemovedAndReportedAbsent) {
  Store s(root());
  std::string bytes = pseudo_random_bytes(4096, 6);
  oci::Descriptor d = blob_desc(bytes);
  s.put_blob(d, bytes);
  stdfs::path p = s.blob_path(d.digest);
  ASSERT_EQ(::chmod(p.c_str(), 0644), 0);
  std::string damaged = bytes;
  damaged[100] ^= 0x40;
  {
    FILE* f = std::fopen(p.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fwrite(damaged.data(), 1, damaged.size(), f);
    std::fclose(f);
  }
  EXPECT_EQ(s.read_blob(d.digest, 1 << 20), std::nullopt);
  EXPECT_FALSE(s.has_blob(d.digest));
  EXPECT_FALSE(stdfs::exists(p));
  // A fresh, good copy can be stored again.
  s.put_blob(d, bytes);
  EXPECT_EQ(s.read_blob(d.digest, 1 << 20), bytes);
  // Unpacking checks the layer again: damaged, it is removed and refused.
  ASSERT_EQ(::chmod(p.c_str(), 0644), 0);
  fs::write_file_atomic(p, damaged, 0444);
  try {
    s.unpack(d.digest);
    ADD_FAILURE() << "unpacked a damaged layer";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
    EXPECT_NE(std::string(e.what()).find("is damaged"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(stdfs::exists(p));
  EXPECT_TRUE(names_in(root() / "tmp").empty());
}

TEST_F(StoreTest, VerifyReportsDamagedAndStrayFiles) {
  Store s(root());
  std::string good = "good blob", bad = "bad blob";
  s.put_blob(blob_desc(good), good);
  oci::Descriptor bad_desc = blob_desc(bad);
  s.put_blob(bad_desc, bad);
  EXPECT_TRUE(s.verify().empty());
  stdfs::path bad_path = s.blob_path(bad_desc.digest);
  ASSERT_EQ(::chmod(bad_path.c_str(), 0644), 0);
  fs::write_file_atomic(bad_path, "BAD blob", 0444);
  fs::write_file_atomic(root() / "blobs" / "sha256" / "not-a-digest", "x");
  stdfs::create_directories(root() / "blobs" / "md5");

  auto damage = s.verify();
  std::set<stdfs::path> paths;
  for (const auto& d : damage) paths.insert(d.path);
  EXPECT_EQ(damage.size(), 3u);
  EXPECT_TRUE(paths.contains(bad_path));
  EXPECT_TRUE(paths.contains(root() / "blobs" / "sha256" / "not-a-digest"));
  EXPECT_TRUE(paths.contains(root() / "blobs" / "md5"));
  for (const auto& d : damage) {
    if (d.path == bad_path) {
      EXPECT_NE(d.problem.find(sha256_of("BAD blob").str()), std::string::npos) << d.problem;
    }
  }
}

TEST_F(StoreTest, LocksExcludeEachOther) {
  Store s(root());
  auto held = s.lock("blob sha256:abc/../../x");  // odd keys are sanitized
  // OFD locks conflict between open file descriptions, even within one process.
  EXPECT_FALSE(s.try_lock("blob sha256:abc/../../x").has_value());
  EXPECT_TRUE(s.try_lock("another key").has_value());
  for (const auto& n : names_in(root() / "locks")) {
    EXPECT_EQ(n.find('/'), std::string::npos);
    EXPECT_TRUE(n.ends_with(".lock")) << n;
  }
  { auto moved = std::move(held); }
  EXPECT_TRUE(s.try_lock("blob sha256:abc/../../x").has_value());
}

TEST_F(StoreTest, RefRecordsRoundTrip) {
  Store s(root());
  Digest d1 = sha256_of("index one"), d2 = sha256_of("index two");
  RefRecord r{"registry/127.0.0.1_5000/team/x", "org/name", "v1", d1, 1700000000};
  s.write_ref(r);
  auto back = s.read_ref(r.hub_id, r.repo, r.tag);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->hub_id, r.hub_id);
  EXPECT_EQ(back->repo, r.repo);
  EXPECT_EQ(back->tag, r.tag);
  EXPECT_EQ(back->digest, d1);
  EXPECT_EQ(back->resolved_at, 1700000000);
  EXPECT_EQ(s.read_ref(r.hub_id, r.repo, "v2"), std::nullopt);
  EXPECT_EQ(s.read_ref("registry/127.0.0.1_5000", "team/x/org/name", "v1"), std::nullopt);

  // Replacing a ref record.
  r.digest = d2;
  r.resolved_at = 1700000100;
  s.write_ref(r);
  EXPECT_EQ(s.read_ref(r.hub_id, r.repo, r.tag)->digest, d2);

  // Hub ids and repos that split differently on '/' stay distinct.
  RefRecord a{"a/b", "c/d", "v1", d1, 1};
  RefRecord b{"a", "b/c/d", "v1", d2, 2};
  RefRecord c{"a/b", "c/d/v1", "v1", d2, 3};  // repo whose last part equals a sibling's tag
  s.write_ref(a);
  s.write_ref(b);
  s.write_ref(c);
  EXPECT_EQ(s.read_ref("a/b", "c/d", "v1")->digest, d1);
  EXPECT_EQ(s.read_ref("a", "b/c/d", "v1")->digest, d2);
  EXPECT_EQ(s.read_ref("a/b", "c/d/v1", "v1")->resolved_at, 3);

  auto all = s.list_refs();
  ASSERT_EQ(all.size(), 4u);
  std::set<std::string> keys;
  for (const auto& x : all) keys.insert(x.hub_id + "|" + x.repo + "|" + x.tag + "|" + x.digest.hex);
  EXPECT_TRUE(keys.contains("registry/127.0.0.1_5000/team/x|org/name|v1|" + d2.hex));
  EXPECT_TRUE(keys.contains("a/b|c/d|v1|" + d1.hex));
  EXPECT_TRUE(keys.contains("a|b/c/d|v1|" + d2.hex));
  EXPECT_TRUE(keys.contains("a/b|c/d/v1|v1|" + d2.hex));
  // Nothing escaped refs/.
  for (const auto& e : stdfs::recursive_directory_iterator(root())) {
    std::string rel = stdfs::relative(e.path(), root()).string();
    EXPECT_TRUE(rel.starts_with("refs") || rel.starts_with("blobs") || rel.starts_with("tmp") ||
                rel.starts_with("unpacked") || rel.starts_with("locks") || rel == "CACHEDIR.TAG")
        << rel;
  }
}

TEST_F(StoreTest, CorruptRefRecordIsAbsent) {
  Store s(root());
  RefRecord r{"registry/h", "org/name", "v1", sha256_of("x"), 5};
  s.write_ref(r);
  std::vector<stdfs::path> files;
  for (const auto& e : stdfs::recursive_directory_iterator(root() / "refs")) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  ASSERT_EQ(files.size(), 1u);
  fs::write_file_atomic(files[0], "{\"digest\": \"sha256:nope\"");
  EXPECT_EQ(s.read_ref(r.hub_id, r.repo, r.tag), std::nullopt);
  EXPECT_TRUE(s.list_refs().empty());
  s.write_ref(r);  // the next resolve repairs it
  EXPECT_TRUE(s.read_ref(r.hub_id, r.repo, r.tag).has_value());
}

TEST_F(StoreTest, ConcurrentWritersStoreOneBlob) {
  Store s(root());
  const std::string shared = pseudo_random_bytes(8 << 20, 7);
  const oci::Descriptor shared_desc = blob_desc(shared);
  std::vector<pid_t> children;
  for (int i = 0; i < 8; ++i) {
    children.push_back(fork_child([&, i] {
      Store mine(root());
      auto w = mine.begin_blob(shared_desc);
      for (size_t off = 0; off < shared.size(); off += 1 << 16) {
        w->write(shared.data() + off, std::min<size_t>(1 << 16, shared.size() - off));
      }
      w->commit();
      std::string own = "distinct blob " + std::to_string(i);
      mine.put_blob(blob_desc(own), own);
    }));
  }
  for (pid_t pid : children) EXPECT_EQ(wait_exit_code(pid), 0);
  EXPECT_EQ(s.read_blob(shared_desc.digest, 16 << 20), shared);
  for (int i = 0; i < 8; ++i) {
    std::string own = "distinct blob " + std::to_string(i);
    EXPECT_EQ(s.read_blob(blob_desc(own).digest, 1024), own);
  }
  EXPECT_EQ(names_in(root() / "blobs" / "sha256").size(), 9u);  // one shared + eight own
  EXPECT_TRUE(s.verify().empty());
  EXPECT_TRUE(names_in(root() / "tmp").empty());
}

TEST_F(StoreTest, KilledWriterLeavesOnlyATempThatGcSweeps) {
  Store s(root());
  const std::string bytes = pseudo_random_bytes(1 << 20, 8);
  const oci::Descriptor d = blob_desc(bytes);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    Store mine(root());
    auto w = mine.begin_blob(d);
    w->write(bytes.data(), bytes.size() / 2);
    char c = 'x';
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));

  EXPECT_FALSE(s.has_blob(d.digest));
  EXPECT_TRUE(names_in(root() / "blobs" / "sha256").empty());
  auto temps = names_in(root() / "tmp");
  ASSERT_EQ(temps.size(), 1u);
  EXPECT_TRUE(temps[0].ends_with(".part"));
  // Opening the store does not sweep a young temp (it may be another live download)...
  Store reopened(root());
  EXPECT_EQ(names_in(root() / "tmp").size(), 1u);
  // ...nor does gc within the grace period; a temp untouched for longer is swept.
  GcOptions keep;
  reopened.gc(keep);
  EXPECT_EQ(names_in(root() / "tmp").size(), 1u);
  GcOptions now;
  now.grace_s = 0;
  reopened.gc(now);
  EXPECT_TRUE(names_in(root() / "tmp").empty());
  // A temp untouched for many hours goes at the first write of a process, not when a store is
  // only read (ls, verify and gc --dry-run modify nothing).
  fs::write_file_atomic(root() / "tmp" / "stale.1.abc.part", "x");
  age_file(root() / "tmp" / "stale.1.abc.part", std::chrono::hours(48));
  Store third(root());
  third.list_refs();
  third.verify();
  GcOptions dry;
  dry.dry_run = true;
  dry.grace_s = 0;
  third.gc(dry);
  EXPECT_EQ(names_in(root() / "tmp").size(), 1u);
  third.write_signatures(Digest::parse("sha256:" + std::string(64, 'a')), "{}");
  EXPECT_TRUE(names_in(root() / "tmp").empty());
}

// A layer archive holding `files` (name -> content), stored in the store.
oci::Descriptor put_layer(Store& s, const stdfs::path& scratch,
                          const std::vector<std::pair<std::string, std::string>>& files) {
  stdfs::path src = scratch / ("src-" + fs::random_hex(8));
  for (const auto& [name, content] : files) fs::write_file_atomic(src / name, content);
  stdfs::path out = scratch / ("layer-" + fs::random_hex(8) + ".tar.zst");
  create_archive(src, out);
  std::string bytes = fs::read_file(out);
  oci::Descriptor d = oci::describe(bytes, oci::kMediaTypeLayerTarZstd);
  s.put_blob(d, bytes);
  return d;
}

TEST_F(StoreTest, UnpackOnceAcrossProcesses) {
  Store s(root());
  oci::Descriptor layer =
      put_layer(s, tmp_.path(), {{"lib.so", pseudo_random_bytes(1 << 20, 9)}, {"meta", "m"}});
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i) {
    children.push_back(fork_child([&] {
      Store mine(root());
      stdfs::path p = mine.unpack(layer.digest);
      if (p != root() / "unpacked" / layer.digest.hex) throw std::runtime_error("wrong path");
      if (fs::read_file(p / "meta") != "m") throw std::runtime_error("wrong content");
    }));
  }
  for (pid_t pid : children) EXPECT_EQ(wait_exit_code(pid), 0);
  EXPECT_EQ(names_in(root() / "unpacked"), std::vector<std::string>{layer.digest.hex});
  stdfs::path p = root() / "unpacked" / layer.digest.hex;
  EXPECT_EQ(s.unpacked_path(layer.digest), p);
  EXPECT_EQ(s.unpack(layer.digest), p);
  EXPECT_EQ(fs::read_file(p / "lib.so"), pseudo_random_bytes(1 << 20, 9));
  struct stat st;
  ASSERT_EQ(::stat((p / "lib.so").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0555u);
}

TEST_F(StoreTest, UnpackNeedsTheBlobAndRefusesBadLayers) {
  Store s(root());
  Digest missing = sha256_of("not stored");
  try {
    s.unpack(missing);
    ADD_FAILURE() << "unpacked a missing layer";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
  EXPECT_EQ(s.unpacked_path(missing), std::nullopt);

  // A layer over the limits is refused and leaves nothing in unpacked/.
  oci::Descriptor layer = put_layer(s, tmp_.path(), {{"a", "aaaa"}, {"b", "bbbb"}});
  ArchiveLimits tight;
  tight.max_entries = 1;
  try {
    s.unpack(layer.digest, tight);
    ADD_FAILURE() << "limits ignored";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
  }
  EXPECT_TRUE(names_in(root() / "unpacked").empty());
}

// One budget covers every layer a command unpacks: each layer here is within the per-archive
// limits, the third takes the total over the budget and is refused naming the layer, the budget
// and the variable, leaving nothing of itself in unpacked/ (not even a hidden temp tree). A tree
// already there costs nothing.
TEST_F(StoreTest, UnpackBudgetCoversEveryLayerOfACommand) {
  Store s(root());
  std::vector<oci::Descriptor> layers;
  for (uint32_t i = 0; i < 3; ++i)
    layers.push_back(put_layer(s, tmp_.path(), {{"lib.so", pseudo_random_bytes(1 << 20, 30 + i)}}));
  UnpackBudget budget;
  budget.limit = (5u << 20) / 2;  // 2.5 MiB: two layers fit, three do not
  s.unpack(layers[0].digest, {}, &budget);
  s.unpack(layers[1].digest, {}, &budget);
  EXPECT_EQ(budget.used, 2u << 20);
  try {
    s.unpack(layers[2].digest, {}, &budget);
    ADD_FAILURE() << "the budget was not enforced";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    std::string what = e.what();
    for (const std::string& needle : {layers[2].digest.str(), std::to_string(budget.limit),
                                      std::string("budget"), std::string(UnpackBudget::kVariable)})
      EXPECT_NE(what.find(needle), std::string::npos) << needle << " not in: " << what;
  }
  std::vector<std::string> names = names_in(root() / "unpacked");
  std::sort(names.begin(), names.end());
  std::vector<std::string> want{layers[0].digest.hex, layers[1].digest.hex};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  EXPECT_FALSE(s.unpacked_path(layers[2].digest).has_value());
  // Trees already made cost nothing; another command's budget unpacks the third.
  uint64_t used = budget.used;
  s.unpack(layers[0].digest, {}, &budget);
  EXPECT_EQ(budget.used, used);
  UnpackBudget next;
  EXPECT_NO_THROW(s.unpack(layers[2].digest, {}, &next));
  EXPECT_EQ(next.used, 1u << 20);
}

TEST_F(StoreTest, UnpackBudgetFromTheEnvironment) {
  ::unsetenv(UnpackBudget::kVariable);
  EXPECT_EQ(UnpackBudget::limit_from_env(), UnpackBudget::kDefault);
  ::setenv(UnpackBudget::kVariable, "1048576", 1);
  EXPECT_EQ(UnpackBudget::limit_from_env(), 1048576u);
  for (const char* bad : {"8G", "-1", "0"}) {
    ::setenv(UnpackBudget::kVariable, bad, 1);
    try {
      UnpackBudget::limit_from_env();
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find(UnpackBudget::kVariable), std::string::npos);
    }
  }
  ::unsetenv(UnpackBudget::kVariable);
}

// A kernel package in the store: index -> manifest -> (shared empty config, one layer).
struct Package {
  oci::Descriptor index;
  oci::Descriptor manifest;
  oci::Descriptor layer;
};

Package put_package(Store& s, const stdfs::path& scratch, const std::string& payload) {
  Package p;
  p.layer = put_layer(s, scratch, {{"payload.bin", payload}});
  oci::Manifest m;
  m.artifact_type = std::string(oci::kArtifactTypeKernel);
  m.config = oci::empty_descriptor();
  m.layers.push_back(p.layer);
  std::string mbytes = oci::serialize(m);
  p.manifest = oci::describe(mbytes, oci::kMediaTypeManifest);
  s.put_blob(oci::empty_descriptor(), "{}");
  s.put_blob(p.manifest, mbytes);
  oci::Index idx;
  idx.manifests.push_back(p.manifest);
  std::string ibytes = oci::serialize(idx);
  p.index = oci::describe(ibytes, oci::kMediaTypeIndex);
  s.put_blob(p.index, ibytes);
  return p;
}

void age_tree(const stdfs::path& root, std::chrono::hours by) {
  for (const auto& e : stdfs::recursive_directory_iterator(root)) age_file(e.path(), by);
}

TEST_F(StoreTest, GcByAgeKeepsWhatRecentRefsNeed) {
  Store s(root());
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  Package old_pkg = put_package(s, tmp_.path(), pseudo_random_bytes(20000, 10));
  Package new_pkg = put_package(s, tmp_.path(), pseudo_random_bytes(20000, 11));
  std::string orphan = pseudo_random_bytes(5000, 12);
  s.put_blob(blob_desc(orphan), orphan);
  s.unpack(old_pkg.layer.digest);
  s.unpack(new_pkg.layer.digest);
  s.write_ref({"registry/h", "org/old", "v1", old_pkg.index.digest, now - 40 * 86400});
  age_tree(root() / "refs", std::chrono::hours(40 * 24));  // last touched long ago too
  s.write_ref({"registry/h", "org/new", "v1", new_pkg.index.digest, now});

  // Within the default grace period nothing is removed, whatever the age of the refs.
  GcOptions fresh;
  fresh.older_than_s = 30 * 86400;
  fresh.grace_s = 3600 * 1000;
  GcResult none = s.gc(fresh);
  EXPECT_EQ(none.removed_bytes, 0u);
  EXPECT_TRUE(s.has_blob(old_pkg.layer.digest));

  GcOptions opts;
  opts.older_than_s = 30 * 86400;
  opts.grace_s = 0;
  opts.dry_run = true;
  GcResult dry = s.gc(opts);
  EXPECT_GT(dry.removed_bytes, 0u);
  EXPECT_TRUE(s.has_blob(old_pkg.layer.digest));  // dry run only counts
  EXPECT_TRUE(s.read_ref("registry/h", "org/old", "v1").has_value());

  opts.dry_run = false;
  GcResult res = s.gc(opts);
  EXPECT_EQ(res.removed_bytes, dry.removed_bytes);
  EXPECT_EQ(res.removed_entries, dry.removed_entries);
  // old ref, old index, old manifest, old layer, old unpacked tree, orphan.
  EXPECT_EQ(res.removed_entries, 6u);
  EXPECT_EQ(s.read_ref("registry/h", "org/old", "v1"), std::nullopt);
  EXPECT_FALSE(s.has_blob(old_pkg.index.digest));
  EXPECT_FALSE(s.has_blob(old_pkg.manifest.digest));
  EXPECT_FALSE(s.has_blob(old_pkg.layer.digest));
  EXPECT_FALSE(s.unpacked_path(old_pkg.layer.digest).has_value());
  EXPECT_FALSE(s.has_blob(blob_desc(orphan).digest));
  // Everything the kept ref needs is still there, including the shared config.
  EXPECT_TRUE(s.read_ref("registry/h", "org/new", "v1").has_value());
  EXPECT_TRUE(s.has_blob(new_pkg.index.digest));
  EXPECT_TRUE(s.has_blob(new_pkg.manifest.digest));
  EXPECT_TRUE(s.has_blob(new_pkg.layer.digest));
  EXPECT_TRUE(s.has_blob(oci::empty_descriptor().digest));
  EXPECT_TRUE(s.unpacked_path(new_pkg.layer.digest).has_value());
  EXPECT_EQ(res.kept_bytes, s.blobs_size() + 20000u);  // blobs + the unpacked payload
  EXPECT_TRUE(s.verify().empty());

  // Nothing more to do on a second run.
  GcResult again = s.gc(opts);
  EXPECT_EQ(again.removed_entries, 0u);
}

TEST_F(StoreTest, GcBySizeDropsLeastRecentlyUsedRefs) {
  Store s(root());
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  Package a = put_package(s, tmp_.path(), pseudo_random_bytes(100000, 20));
  Package b = put_package(s, tmp_.path(), pseudo_random_bytes(100000, 21));
  Package c = put_package(s, tmp_.path(), pseudo_random_bytes(100000, 22));
  std::string orphan = pseudo_random_bytes(50000, 23);
  s.put_blob(blob_desc(orphan), orphan);
  s.unpack(c.layer.digest);
  s.write_ref({"oci/h", "org/a", "v1", a.index.digest, now - 300});
  s.write_ref({"oci/h", "org/b", "v1", b.index.digest, now - 200});
  age_tree(root() / "refs", std::chrono::hours(1));
  s.write_ref({"oci/h", "org/c", "v1", c.index.digest, now - 100});
  // b is also reachable from a second, recent tag: it must survive.
  s.write_ref({"oci/h", "org/b", "latest", b.index.digest, now});

  auto pkg_size = [&](const Package& p) {
    return stdfs::file_size(s.blob_path(p.index.digest)) +
           stdfs::file_size(s.blob_path(p.manifest.digest)) +
           stdfs::file_size(s.blob_path(p.layer.digest));
  };
  // Room for b, c, the shared config and c's unpacked tree, not for a as well.
  const uint64_t needed = pkg_size(b) + pkg_size(c) + 2 + 100000;
  ASSERT_GT(needed + pkg_size(a), needed + 1000);
  GcOptions opts;
  opts.grace_s = 0;
  opts.max_size = needed + 1000;
  GcResult res = s.gc(opts);
  EXPECT_LE(res.kept_bytes, *opts.max_size);
  EXPECT_EQ(res.kept_bytes, needed);
  EXPECT_FALSE(s.has_blob(blob_desc(orphan).digest));           // unreachable goes first
  EXPECT_EQ(s.read_ref("oci/h", "org/a", "v1"), std::nullopt);  // least recently used
  EXPECT_FALSE(s.has_blob(a.layer.digest));
  EXPECT_FALSE(s.has_blob(a.index.digest));
  EXPECT_TRUE(s.read_ref("oci/h", "org/b", "latest").has_value());
  EXPECT_TRUE(s.has_blob(b.layer.digest));
  EXPECT_TRUE(s.has_blob(c.layer.digest));
  EXPECT_TRUE(s.unpacked_path(c.layer.digest).has_value());
  EXPECT_TRUE(s.has_blob(oci::empty_descriptor().digest));

  // A cap below what any single package needs drops every ref, oldest first, and with them
  // everything they held; no ref is left pointing at a removed blob.
  opts.max_size = 1000;
  s.gc(opts);
  for (const auto& r : s.list_refs()) EXPECT_TRUE(s.has_blob(r.digest)) << r.repo;
  EXPECT_TRUE(s.list_refs().empty());
  EXPECT_EQ(s.blobs_size(), 0u);
  EXPECT_TRUE(names_in(root() / "unpacked").empty());
}

// A grace of 0 drops everything the size asks for, even a ref whose file timestamp reads ahead
// of the clock gc compares with (fine-grained file times against a coarse clock: this made
// GcBySizeDropsLeastRecentlyUsedRefs fail now and then under load).
TEST_F(StoreTest, GcWithoutGraceDropsRefsTouchedAheadOfTheClock) {
  Store s(root());
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  Package a = put_package(s, tmp_.path(), pseudo_random_bytes(10000, 30));
  s.write_ref({"oci/h", "org/a", "v1", a.index.digest, now});
  for (const auto& e : stdfs::recursive_directory_iterator(root() / "refs"))
    stdfs::last_write_time(e.path(), stdfs::file_time_type::clock::now() + std::chrono::seconds(5));
  GcOptions opts;
  opts.grace_s = 0;
  opts.max_size = 0;
  s.gc(opts);
  EXPECT_TRUE(s.list_refs().empty());
  EXPECT_EQ(s.blobs_size(), 0u);
}

TEST_F(StoreTest, GcSurvivesDamagedRootsAndKeepsYoungEntries) {
  Store s(root());
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  // A ref whose index blob is missing: the walk just ends.
  s.write_ref({"oci/h", "org/gone", "v1", sha256_of("missing index"), now});
  Package p = put_package(s, tmp_.path(), "payload");
  std::string orphan = "young orphan";
  s.put_blob(blob_desc(orphan), orphan);
  GcOptions opts;  // default grace: an hour
  GcResult res = s.gc(opts);
  EXPECT_EQ(res.removed_entries, 0u);
  EXPECT_TRUE(s.has_blob(blob_desc(orphan).digest));
  EXPECT_TRUE(s.has_blob(p.layer.digest));
  // Once old enough, unreferenced entries go, the dangling ref stays (it may be re-pulled).
  opts.grace_s = 0;
  s.gc(opts);
  EXPECT_FALSE(s.has_blob(blob_desc(orphan).digest));
  EXPECT_FALSE(s.has_blob(p.layer.digest));
  EXPECT_TRUE(s.read_ref("oci/h", "org/gone", "v1").has_value());
}

}  // namespace
}  // namespace kh
