// Load what was verified (issue 12): a package file is hashed and used through one descriptor,
// so a file swapped on disk between the check and the load is never what gets loaded. The stress
// test races a thread that keeps swapping the host library of a package for another (valid,
// self-consistent but unlisted) library against thousands of loads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "loader/loaded_package.h"
#include "loader/verified_file.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

stdfs::path toy_dir(const std::string& variant) {
  return stdfs::path(KH_TOY_PACKAGES_DIR) / variant;
}

// A copy of toy 1.0.0 whose kernel.json lists its files' digests, in `dir`.
void make_listed_package(const stdfs::path& dir) {
  stdfs::create_directories(dir);
  stdfs::copy_file(toy_dir("toy-1.0.0") / "libtoy.so", dir / "libtoy.so");
  const Digest lib = sha256_of_file(dir / "libtoy.so");
  fs::write_file_atomic(dir / "kernel.json",
                        R"({"name": "toy", "version": "1.0.0", "host_library": "libtoy.so",
                            "files": {"libtoy.so": ")" +
                            lib.str() + R"("}})");
}

TEST(VerifiedFile, ReadsWhatWasHashedWhateverHappensToTheName) {
  TempDir tmp;
  fs::write_file_atomic(tmp / "a", "original bytes");
  VerifiedFile f = open_verified(tmp / "a", sha256_of("original bytes"));
  fs::write_file_atomic(tmp / "a", "replaced, and longer than the original");  // rename over
  EXPECT_EQ(f.read_all(), "original bytes");
  EXPECT_EQ(f.digest, sha256_of("original bytes"));
  EXPECT_EQ(fs::read_file(f.fd_path()), "original bytes");  // the descriptor's inode
  try {
    open_verified(tmp / "a", sha256_of("original bytes"));
    ADD_FAILURE() << "a changed file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
    EXPECT_NE(std::string(e.what()).find("nothing was loaded"), std::string::npos) << e.what();
  }
}

TEST(VerifiedLoad, AKernelJsonOtherThanTheSignedOneIsRefused) {
  TempDir tmp;
  make_listed_package(tmp / "pkg");
  const Digest good = sha256_of_file(tmp / "pkg/kernel.json");
  EXPECT_NO_THROW(load_package(tmp / "pkg", good));
  try {
    load_package(tmp / "pkg", sha256_of("another kernel.json"));
    ADD_FAILURE() << "kernel.json was not checked against the signed digest";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity) << e.what();
  }
}

TEST(VerifiedLoad, ALibraryOtherThanKernelJsonListsIsNeverLoaded) {
  TempDir tmp;
  make_listed_package(tmp / "pkg");
  stdfs::remove(tmp / "pkg/libtoy.so");
  stdfs::copy_file(toy_dir("toy-2.0.0") / "libtoy.so", tmp / "pkg/libtoy.so");
  try {
    load_package(tmp / "pkg");
    ADD_FAILURE() << "an unlisted library was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("digest"), std::string::npos) << e.what();
  }
}

// A swapper thread renames toy 2.0.0's library over the package's libtoy.so and the genuine one
// back, as fast as it can, while this thread loads: every load either refuses the file (digest)
// or loads 1.0.0, never 2.0.0. Fresh directories make each round a real dlopen, one directory
// loaded over and over makes thousands of check-then-use rounds.
TEST(VerifiedLoad, SwappingTheLibraryWhileLoadingNeverLoadsTheSwappedFile) {
  TempDir tmp;
  const stdfs::path good = tmp / "good.so", evil = tmp / "evil.so";
  stdfs::copy_file(toy_dir("toy-1.0.0") / "libtoy.so", good);
  stdfs::copy_file(toy_dir("toy-2.0.0") / "libtoy.so", evil);
  std::atomic<bool> stop{false};
  std::atomic<const char*> target{nullptr};  // the libtoy.so path the swapper works on
  std::string target_text;
  std::thread swapper([&] {
    unsigned n = 0;
    while (!stop.load()) {
      const char* t = target.load();
      if (!t) continue;
      const stdfs::path lib = t;
      const stdfs::path from = (n++ % 2) ? good : evil;
      const stdfs::path staged = lib.parent_path() / ".swap";
      if (::link(from.c_str(), staged.c_str()) == 0) std::rename(staged.c_str(), lib.c_str());
    }
  });
  int loaded = 0, refused = 0;
  auto attempt = [&](const stdfs::path& dir) {
    try {
      LoadedPackage p = load_package(dir);
      ASSERT_EQ(p.module->view.version, "1.0.0") << "the swapped library was loaded";
      ASSERT_EQ(p.module->digest, sha256_of_file(good));
      ++loaded;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("digest"), std::string::npos) << e.what();
      ++refused;
    }
  };
  for (int round = 0; round < 150; ++round) {  // a fresh path each round: a real dlopen
    const stdfs::path dir = tmp / ("pkg" + std::to_string(round));
    make_listed_package(dir);
    target_text = (dir / "libtoy.so").string();
    target.store(target_text.c_str());
    attempt(dir);
    target.store(nullptr);
  }
  const stdfs::path dir = tmp / "many";
  make_listed_package(dir);
  target_text = (dir / "libtoy.so").string();
  target.store(target_text.c_str());
  for (int i = 0; i < 3000; ++i) attempt(dir);
  stop.store(true);
  swapper.join();
  EXPECT_GT(loaded, 0);
  EXPECT_GT(refused, 0) << "the swapper never won a race: the test proves nothing";
  std::printf("loads: %d of 1.0.0, %d refused, 0 of the swapped library\n", loaded, refused);
}

}  // namespace
}  // namespace kh
