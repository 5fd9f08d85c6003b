// The cache and trust store as storage someone else may touch (issue 12): directories private
// whatever the umask, StrictModes-style refusals (a second user via setpriv), no symlink inside
// a guarded root ever followed, special files refused without blocking, lock waits that name the
// holder and give up, a per-user JIT cache in the shared mode.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/guarded_root.h"
#include "hub/base/log.h"
#include "hub/oci/oci.h"
#include "hub/store/archive.h"
#include "hub/store/store.h"
#include "hub/trust/signature.h"
#include "hub/trust/trust_store.h"
#include "loader/jit_cache.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

mode_t mode_of(const stdfs::path& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// Runs body expecting a kh::Error of `kind` whose message contains every needle.
template <typename F>
void expect_error(F&& body, ErrorKind kind, std::initializer_list<std::string> needles) {
  try {
    body();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' not in: " << e.what();
  }
}

class CacheSecurity : public ::testing::Test {
 protected:
  void SetUp() override { ::unsetenv("KERNEL_HUB_SHARED_CACHE"); }
  void TearDown() override {
    ::unsetenv("KERNEL_HUB_SHARED_CACHE");
    ::unsetenv("KERNEL_HUB_LOCK_TIMEOUT");
    fs::unguard_all_roots_for_tests();
  }
  TempDir tmp_;
};

TEST_F(CacheSecurity, DirectoriesArePrivateWhateverTheUmask) {
  const mode_t old = ::umask(0);
  stdfs::path root = tmp_ / "a/b/cache";
  {
    Store store(root);
    store.write_signatures(Digest::parse("sha256:" + std::string(64, 'a')), "{}");
  }
  ::umask(old);
  EXPECT_EQ(mode_of(root), 0700u);
  EXPECT_EQ(mode_of(tmp_ / "a"), 0700u);  // missing parents too
  for (const char* sub :
       {"blobs", "blobs/sha256", "tmp", "refs", "unpacked", "locks", "signatures"})
    EXPECT_EQ(mode_of(root / sub), 0700u) << sub;
}

TEST_F(CacheSecurity, SharedModeMakesGroupDirectories) {
  ::setenv("KERNEL_HUB_SHARED_CACHE", "1", 1);
  stdfs::path root = tmp_ / "shared";
  Store store(root);
  EXPECT_EQ(mode_of(root), 02770u);
  EXPECT_EQ(mode_of(root / "refs"), 02770u);
  // A group-writable root is fine in the shared mode, refused in the private one.
  ::unsetenv("KERNEL_HUB_SHARED_CACHE");
  fs::unguard_all_roots_for_tests();
  expect_error([&] { Store again(root); }, ErrorKind::kRefused,
               {root.string(), "writable by its group", "KERNEL_HUB_SHARED_CACHE=1"});
  ::setenv("KERNEL_HUB_SHARED_CACHE", "maybe", 1);
  expect_error([&] { Store again(root); }, ErrorKind::kInvalidInput,
               {"KERNEL_HUB_SHARED_CACHE='maybe'", "1 or 0"});
}

TEST_F(CacheSecurity, WorldWritableCacheIsRefused) {
  stdfs::path root = tmp_ / "cache";
  stdfs::create_directories(root);
  ::chmod(root.c_str(), 0777);
  expect_error([&] { Store store(root); }, ErrorKind::kRefused,
               {root.string(), "writable by every user", "chmod o-w"});
  // A subdirectory made world-writable is refused when it is walked.
  ::chmod(root.c_str(), 0700);
  { Store store(root); }
  ::chmod((root / "refs").c_str(), 0777);
  expect_error([&] { Store store(root); }, ErrorKind::kRefused,
               {(root / "refs").string(), "writable by every user"});
}

// A second user: `nobody` makes a cache (setpriv), this user must refuse to load from it.
TEST_F(CacheSecurity, CacheOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0 || !test::have_program("setpriv"))
    GTEST_SKIP() << "needs root and setpriv to act as a second user";
  // Where both users may create entries, as in /tmp.
  ::chmod(tmp_.path().c_str(), 0755);
  stdfs::create_directories(tmp_ / "pub");
  ::chmod((tmp_ / "pub").c_str(), 01777);
  stdfs::path root = tmp_ / "pub/theirs";
  auto r = test::run_process(
      {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", test::cli_path(), "ls"},
      {{"KERNEL_HUB_CACHE", root.string()}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::stat(root.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  expect_error([&] { Store store(root); }, ErrorKind::kRefused,
               {root.string(), "owned by uid 65534", "not by you"});
  // The CLI says the same and exits non-zero.
  auto cli = test::run_process({test::cli_path(), "ls"}, {{"KERNEL_HUB_CACHE", root.string()}});
  EXPECT_NE(cli.exit_code, 0);
  EXPECT_NE(cli.err.find("owned by uid 65534"), std::string::npos) << cli.err;
}

TEST_F(CacheSecurity, SymlinksInsideTheCacheAreNeverFollowed) {
  stdfs::path root = tmp_ / "cache";
  stdfs::path outside = tmp_ / "outside";
  stdfs::create_directories(outside);
  Store store(root);
  // refs/ replaced by a link to a directory outside: the write is refused, nothing lands there.
  fs::remove_tree(root / "refs");
  stdfs::create_directory_symlink(outside, root / "refs");
  RefRecord r{"hub", "kernel-hub/norm", "v1", Digest::parse("sha256:" + std::string(64, 'c')), 1};
  expect_error([&] { store.write_ref(r); }, ErrorKind::kRefused,
               {"'refs' is a symbolic link", "never follows links"});
  // signatures/ and locks/ alike.
  stdfs::create_directory_symlink(outside, root / "signatures");
  expect_error(
      [&] { store.write_signatures(Digest::parse("sha256:" + std::string(64, 'd')), "{}"); },
      ErrorKind::kRefused, {"'signatures' is a symbolic link"});
  fs::remove_tree(root / "locks");
  stdfs::create_directory_symlink(outside, root / "locks");
  expect_error([&] { store.lock("x"); }, ErrorKind::kRefused, {"'locks' is a symbolic link"});
  // A file link is not read through.
  std::ofstream(outside / "secret") << "secret";
  stdfs::create_directories(root / "blobs/sha256");
  const std::string hex(64, 'e');
  stdfs::create_symlink(outside / "secret", root / "blobs/sha256" / hex);
  expect_error([&] { fs::read_file(root / "blobs/sha256" / hex); }, ErrorKind::kRefused,
               {"symbolic link"});
  EXPECT_TRUE(stdfs::is_empty(outside / "secret") == false);
  EXPECT_EQ(std::distance(stdfs::directory_iterator(outside), stdfs::directory_iterator()), 1);
}

TEST_F(CacheSecurity, UnpackingNeverFollowsALinkedUnpackedDirectory) {
  stdfs::path root = tmp_ / "cache", outside = tmp_ / "outside";
  stdfs::create_directories(outside);
  Store store(root);
  fs::write_file_atomic(tmp_ / "src/kernel.json", "{}");
  create_archive(tmp_ / "src", tmp_ / "layer.tar.zst");
  const std::string bytes = fs::read_file(tmp_ / "layer.tar.zst");
  oci::Descriptor d;
  d.media_type = std::string(oci::kMediaTypeLayerTarZstd);
  d.digest = sha256_of(bytes);
  d.size = static_cast<int64_t>(bytes.size());
  store.put_blob(d, bytes);
  fs::remove_tree(root / "unpacked");
  stdfs::create_directory_symlink(outside, root / "unpacked");
  expect_error([&] { store.unpack(d.digest); }, ErrorKind::kRefused,
               {"'unpacked' is a symbolic link"});
  EXPECT_TRUE(stdfs::is_empty(outside)) << "the extraction went through the link";
}

TEST_F(CacheSecurity, RemovingATreeNeverChangesWhatALinkPointsTo) {
  stdfs::path root = tmp_ / "cache";
  Store store(root);
  stdfs::path outside = tmp_ / "outside";
  stdfs::create_directories(outside / "keep");
  std::ofstream(outside / "keep/file") << "x";
  ::chmod((outside / "keep").c_str(), 0555);
  stdfs::path tree = root / "unpacked" / ".stale";
  stdfs::create_directories(tree);
  stdfs::create_directory_symlink(outside / "keep", tree / "link");
  fs::remove_tree(tree);
  EXPECT_FALSE(stdfs::exists(tree));
  EXPECT_TRUE(stdfs::exists(outside / "keep/file"));
  EXPECT_EQ(mode_of(outside / "keep"), 0555u);  // no chmod through the link
  ::chmod((outside / "keep").c_str(), 0755);
}

// gc's removals (a ref record, its emptied directories, a blob) go through descriptors: a
// directory of the path swapped for a link between gc's scan and its removal (a shared cache's
// other writers can) does not aim them outside the cache.
TEST_F(CacheSecurity, RemovalsThroughASwappedDirectoryStayInsideTheCache) {
  stdfs::path root = tmp_ / "cache", outside = tmp_ / "outside";
  Store store(root);
  stdfs::create_directories(outside / "empty");
  std::ofstream(outside / "authorized_keys") << "keep";
  stdfs::create_directories(root / "refs/H");
  stdfs::create_directory_symlink(outside, root / "refs/H/R");
  expect_error([&] { fs::remove_tree(root / "refs/H/R/authorized_keys"); }, ErrorKind::kRefused,
               {"'R' is a symbolic link"});
  expect_error([&] { fs::remove_empty_dir(root / "refs/H/R/empty"); }, ErrorKind::kRefused,
               {"'R' is a symbolic link"});
  EXPECT_TRUE(stdfs::exists(outside / "authorized_keys")) << "removed through the link";
  EXPECT_TRUE(stdfs::exists(outside / "empty")) << "removed through the link";
  fs::remove_empty_dir(root / "refs/H");  // not empty: stays
  EXPECT_TRUE(stdfs::exists(root / "refs/H"));
}

// A relative cache path is made absolute once: the guard covers it, and an embedding program
// that changes directory afterwards still uses (and guards) the same cache.
TEST_F(CacheSecurity, ARelativeCacheStaysTheSameCacheAfterAChdir) {
  const stdfs::path before = stdfs::current_path();
  stdfs::create_directories(tmp_ / "a");
  stdfs::create_directories(tmp_ / "b/rel");
  stdfs::current_path(tmp_ / "a");
  Store store("rel/cache");
  stdfs::current_path(tmp_ / "b");
  // b/rel/cache would be another, unguarded directory: plant a link there.
  stdfs::create_directory_symlink(tmp_.path(), tmp_ / "b/rel/cache");
  EXPECT_EQ(store.root(), tmp_ / "a/rel/cache");
  RefRecord r{"hub", "kernel-hub/norm", "v1", Digest::parse("sha256:" + std::string(64, 'c')), 1};
  store.write_ref(r);
  stdfs::current_path(before);
  EXPECT_TRUE(stdfs::exists(tmp_ / "a/rel/cache/refs"));
  EXPECT_FALSE(stdfs::exists(tmp_ / "refs")) << "written through the link after the chdir";
}

TEST_F(CacheSecurity, SpecialFilesAreRefusedWithoutBlocking) {
  stdfs::path fifo = tmp_ / "blob";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto start = std::chrono::steady_clock::now();
  expect_error([&] { fs::read_file(fifo); }, ErrorKind::kRefused, {"a FIFO", "regular file"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  expect_error([&] { fs::for_each_chunk("/dev/zero", [](const char*, size_t) {}); },
               ErrorKind::kRefused, {"a device"});
}

TEST_F(CacheSecurity, LockWaitNamesTheHolderAndGivesUp) {
  stdfs::path root = tmp_ / "cache";
  Store store(root);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t holder = ::fork();
  if (holder == 0) {
    auto held = fs::FileLock::acquire(root / "locks" / "busy.lock");
    (void)!::write(ready[1], "x", 1);
    ::raise(SIGSTOP);  // a holder stopped with Ctrl-Z
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::setenv("KERNEL_HUB_LOCK_TIMEOUT", "1", 1);
  auto start = std::chrono::steady_clock::now();
  expect_error([&] { fs::FileLock::acquire(root / "locks" / "busy.lock"); }, ErrorKind::kIo,
               {"gave up after 1 s", "pid " + std::to_string(holder), "KERNEL_HUB_LOCK_TIMEOUT"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ::setenv("KERNEL_HUB_LOCK_TIMEOUT", "soon", 1);
  expect_error([&] { fs::FileLock::acquire(root / "locks" / "busy.lock"); },
               ErrorKind::kInvalidInput, {"KERNEL_HUB_LOCK_TIMEOUT='soon'"});
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  ::unsetenv("KERNEL_HUB_LOCK_TIMEOUT");
  fs::FileLock::acquire(root / "locks" / "busy.lock");  // released by the holder's death
}

// A JIT cache used without a Store (the device API, binding a local package) guards itself: a
// link planted as an entry is not read through (a miss, rebuilt), as beneath a guarded cache.
TEST_F(CacheSecurity, AJitCacheWithoutAStoreNeverReadsThroughALink) {
  stdfs::path dir = tmp_ / "jit-alone", elsewhere = tmp_ / "elsewhere";
  stdfs::create_directories(elsewhere);
  JitCache jit(dir);
  const Digest key = sha256_of("key");
  fs::write_file_atomic(elsewhere / "x", encode_jit_entry("FOREIGN CUBIN"));
  stdfs::create_directories(jit.dir());
  stdfs::create_symlink(elsewhere / "x", jit.entry_path(key));
  std::optional<std::string> hit;
  try {
    hit = jit.lookup(key);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused) << e.what();
  }
  EXPECT_FALSE(hit.has_value()) << "read through a link: " << *hit;
  EXPECT_TRUE(stdfs::exists(elsewhere / "x"));
}

TEST_F(CacheSecurity, TrustStoreMustBePrivateAndKeysYours) {
  stdfs::path dir = tmp_ / "trust";
  const mode_t old = ::umask(0);
  auto store = trust::TrustStore::open(dir);
  auto key = trust::PrivateKey::generate();
  store.add(key.public_key(), {"org/*"});
  ::umask(old);
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(trust::TrustStore::open(dir).list().size(), 1u);
  // A key file another user could have written is not trusted.
  stdfs::path file = dir / (key.public_key().key_id() + ".json");
  ::chmod(file.c_str(), 0666);
  auto loose = trust::TrustStore::open(dir);
  EXPECT_TRUE(loose.list().empty());
  ASSERT_FALSE(loose.problems().empty());
  EXPECT_NE(loose.problems().front().find("writable by no one else"), std::string::npos);
  if (::geteuid() == 0) {
    ::chmod(file.c_str(), 0644);
    ASSERT_EQ(::chown(file.c_str(), 65534, 65534), 0);
    EXPECT_TRUE(trust::TrustStore::open(dir).list().empty());
  }
  // A group-writable trust directory is refused outright.
  ::chmod(dir.c_str(), 0770);
  fs::unguard_all_roots_for_tests();
  expect_error([&] { trust::TrustStore::open(dir); }, ErrorKind::kRefused,
               {dir.string(), "writable by its group"});
}

// NVRTC output is keyed by its inputs, not signed: in the shared mode each user's JIT cache is a
// private directory (jit/u<uid>, 0700) checked through its descriptor, and a cubin another member
// of the cache's group plants (beside it, in a u<uid> they made or swapped in by renaming ours, or
// in ours while it was group-writable) is never returned. The private mode keeps jit/ itself.
TEST_F(CacheSecurity, SharedModeJitCacheIsPerUserAndNeverReturnsAPlantedCubin) {
  {
    Store store(tmp_ / "private");
    JitCache cache(tmp_ / "private/jit");
    EXPECT_FALSE(cache.per_user());
    EXPECT_EQ(cache.dir(), tmp_ / "private/jit");
  }
  if (::geteuid() != 0 || !test::have_program("setpriv"))
    GTEST_SKIP() << "needs root and setpriv to act as a second user";
  ::setenv("KERNEL_HUB_SHARED_CACHE", "1", 1);
  ::chmod(tmp_.path().c_str(), 0755);
  const stdfs::path root = tmp_ / "shared";
  Store store(root);  // 02770, group of this user (0)
  const stdfs::path jit = root / "jit", mine = jit / ("u" + std::to_string(::geteuid()));
  fs::make_dirs(jit);
  const Digest key = sha256_of("the inputs of one compile");
  const std::string name = key.hex + ".cubin";
  fs::write_file_atomic(tmp_ / "planted", encode_jit_entry("planted cubin"), 0644);
  // Another member of the cache's group: nobody, with the group 0.
  auto as_member = [&](const std::string& script) {
    auto r = test::run_process(
        {"setpriv", "--reuid=65534", "--regid=0", "--clear-groups", "sh", "-ec", script}, {});
    ASSERT_EQ(r.exit_code, 0) << script << ": " << r.err;
  };
  const std::string planted = (tmp_ / "planted").string();
  const std::string build_result = "built by this user";
  auto build = [&] { return build_result; };

  JitCache cache(jit);
  EXPECT_TRUE(cache.per_user());
  EXPECT_EQ(cache.dir(), mine);
  // 1. A u<uid> the member made first, with a cubin in it (and one beside it in jit/).
  as_member("mkdir " + mine.string() + "; cp " + planted + " " + (mine / name).string() + "; cp " +
            planted + " " + (jit / name).string());
  expect_error([&] { cache.lookup(key); }, ErrorKind::kRefused,
               {mine.string(), "owned by uid 65534", "not by you"});
  expect_error([&] { cache.get_or_build(key, build); }, ErrorKind::kRefused, {mine.string()});

  // 2. Made by this user: private whatever the umask, entries read back.
  fs::remove_tree(mine);
  const mode_t old = ::umask(0);
  JitCache::Result r = cache.get_or_build(key, build);
  ::umask(old);
  EXPECT_TRUE(r.built);
  EXPECT_EQ(r.payload, build_result);
  EXPECT_EQ(mode_of(mine), 0700u);
  EXPECT_EQ(cache.lookup(key), build_result);

  // 3. The member renames ours away (its parent is group-writable) and puts theirs in its place.
  as_member("mv " + mine.string() + " " + mine.string() + ".old; mkdir " + mine.string() + "; cp " +
            planted + " " + (mine / name).string());
  expect_error([&] { cache.lookup(key); }, ErrorKind::kRefused, {"owned by uid 65534"});
  fs::remove_tree(mine);
  stdfs::rename(mine.string() + ".old", mine);
  EXPECT_EQ(cache.lookup(key), build_result);

  // 4. Ours, but left group-writable (as an older kernel-hub made it): the member's entry is
  // deleted, not returned, and the directory is made private again.
  ::chmod(mine.c_str(), 02770);
  as_member("rm -f " + (mine / name).string() + "; cp " + planted + " " + (mine / name).string());
  EXPECT_EQ(cache.lookup(key), std::nullopt);
  EXPECT_FALSE(stdfs::exists(mine / name));
  EXPECT_EQ(mode_of(mine), 0700u);
  r = cache.get_or_build(key, build);
  EXPECT_TRUE(r.built);
  EXPECT_EQ(r.payload, build_result);
}

// Text that reaches the terminal (errors, warnings) carries no control characters: an escape
// sequence in a hub's answer or a name is printed as \xNN.
TEST_F(CacheSecurity, HubTextIsEscapedBeforeItReachesTheTerminal) {
  EXPECT_EQ(terminal_safe("a\x1b[2Jb\r\x07\x7f\tc\n"), "a\\x1b[2Jb\\x0d\\x07\\x7f\tc\n");
  auto r = test::run_process({test::cli_path(), "info", "org/\x1b[2Jname\x07"},
                             {{"KERNEL_HUB_CACHE", (tmp_ / "cache").string()}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x07'), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\\x1b[2J"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kh
