// Package archives: reproducible creation, read-only extraction, and refusal of every unsafe
// entry without leaving anything behind, inside or outside the destination.
#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/store/archive.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

// One entry of a hand-crafted archive (written with libarchive's write API, which does not
// sanitize anything: exactly what a hostile publisher could produce).
struct TarEntry {
  std::string name;
  mode_t type = AE_IFREG;
  std::string data;
  mode_t perm = 0644;
  std::string symlink;   // AE_IFLNK target
  std::string hardlink;  // hard link target
};

TarEntry file_entry(std::string name, std::string data, mode_t perm = 0644) {
  TarEntry e;
  e.name = std::move(name);
  e.data = std::move(data);
  e.perm = perm;
  return e;
}
TarEntry dir_entry(std::string name) {
  TarEntry e;
  e.name = std::move(name);
  e.type = AE_IFDIR;
  e.perm = 0755;
  return e;
}
TarEntry special_entry(std::string name, mode_t type) {
  TarEntry e;
  e.name = std::move(name);
  e.type = type;
  return e;
}
TarEntry symlink_entry(std::string name, std::string target) {
  TarEntry e = special_entry(std::move(name), AE_IFLNK);
  e.symlink = std::move(target);
  return e;
}
TarEntry hardlink_entry(std::string name, std::string target) {
  TarEntry e;
  e.name = std::move(name);
  e.hardlink = std::move(target);
  return e;
}

enum class Filter { kZstd, kNone, kGzip };

void write_tar(const stdfs::path& out, const std::vector<TarEntry>& entries,
               Filter filter = Filter::kZstd) {
  struct archive* a = archive_write_new();
  ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  if (filter == Filter::kZstd) {
    ASSERT_EQ(archive_write_add_filter_zstd(a), ARCHIVE_OK);
  }
  if (filter == Filter::kGzip) {
    ASSERT_EQ(archive_write_add_filter_gzip(a), ARCHIVE_OK);
  }
  ASSERT_EQ(archive_write_open_filename(a, out.c_str()), ARCHIVE_OK) << archive_error_string(a);
  for (const auto& e : entries) {
    struct archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, e.name.c_str());
    archive_entry_set_filetype(entry, e.type);
    archive_entry_set_perm(entry, e.perm);
    if (!e.symlink.empty()) archive_entry_set_symlink(entry, e.symlink.c_str());
    if (!e.hardlink.empty()) archive_entry_set_hardlink(entry, e.hardlink.c_str());
    if (e.type == AE_IFCHR) archive_entry_set_rdev(entry, makedev(1, 3));
    archive_entry_set_size(entry, e.type == AE_IFREG ? static_cast<la_int64_t>(e.data.size()) : 0);
    ASSERT_GE(archive_write_header(a, entry), ARCHIVE_WARN) << archive_error_string(a);
    if (e.type == AE_IFREG && !e.data.empty()) {
      ASSERT_EQ(archive_write_data(a, e.data.data(), e.data.size()),
                static_cast<la_ssize_t>(e.data.size()));
    }
    archive_entry_free(entry);
  }
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

void write_text(const stdfs::path& p, const std::string& s, mode_t mode = 0644) {
  stdfs::create_directories(p.parent_path());
  fs::write_file_atomic(p, s, mode);
}

mode_t mode_of(const stdfs::path& p) {
  struct stat st;
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// rel path -> "d" for directories, "f:<content>" for files.
std::map<std::string, std::string> snapshot(const stdfs::path& root) {
  std::map<std::string, std::string> out;
  for (auto it = stdfs::recursive_directory_iterator(root);
       it != stdfs::recursive_directory_iterator(); ++it) {
    std::string rel = stdfs::relative(it->path(), root).string();
    if (it->is_symlink()) {
      out[rel] = "l";
    } else if (it->is_directory()) {
      out[rel] = "d";
    } else {
      out[rel] = "f:" + fs::read_file(it->path());
    }
  }
  return out;
}

std::vector<std::string> names_in(const stdfs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : stdfs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

// A working area: <base>/work is dest's parent, <base>/outside holds things an escape would hit.
class ArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stdfs::create_directories(tmp_.path() / "work");
    stdfs::create_directories(tmp_.path() / "outside");
  }
  stdfs::path base() const { return tmp_.path(); }
  stdfs::path work() const { return tmp_.path() / "work"; }
  stdfs::path dest() const { return work() / "dest"; }
  stdfs::path archive() const { return tmp_.path() / "pkg.tar.zst"; }

  // Extraction must be refused with kRefused and leave nothing at all behind.
  void expect_refused(const std::vector<TarEntry>& entries, const std::string& needle,
                      const ArchiveLimits& limits = {}) {
    write_tar(archive(), entries);
    try {
      extract_archive(archive(), dest(), limits);
      ADD_FAILURE() << "archive with '" << needle << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRefused) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message '" << e.what() << "' lacks '" << needle << "'";
    }
    EXPECT_FALSE(stdfs::exists(stdfs::symlink_status(dest())));
    EXPECT_TRUE(names_in(work()).empty())
        << "leftover in " << work() << ": " << names_in(work())[0];
    EXPECT_TRUE(names_in(base() / "outside").empty());
    for (const char* p : {"escape", "b", "x", "work/escape", "work/b", "abs_target"}) {
      EXPECT_FALSE(stdfs::exists(stdfs::symlink_status(base() / p))) << p << " was created";
    }
  }

  TempDir tmp_{"kh-archive"};
};

TEST_F(ArchiveTest, RoundTripGivesReadOnlyTree) {
  stdfs::path src = base() / "src";
  write_text(src / "README.md", "hello\n");
  write_text(src / "bin" / "run", "#!/bin/sh\n", 0755);
  write_text(src / "lib" / "libkernel.so",
             "\x7f"
             "ELF fake",
             0644);
  write_text(src / "a" / "b" / "c" / "deep.txt", std::string(100000, 'z'));
  stdfs::create_directories(src / "empty");
  create_archive(src, archive());
  extract_archive(archive(), dest());

  EXPECT_EQ(snapshot(src), snapshot(dest()));
  EXPECT_EQ(mode_of(dest() / "README.md"), 0444);
  EXPECT_EQ(mode_of(dest() / "bin" / "run"), 0555);
  EXPECT_EQ(mode_of(dest() / "lib" / "libkernel.so"), 0555);
  EXPECT_EQ(mode_of(dest() / "a" / "b" / "c" / "deep.txt"), 0444);
  EXPECT_EQ(mode_of(dest() / "a" / "b"), 0555);
  EXPECT_EQ(mode_of(dest() / "empty"), 0555);
  EXPECT_EQ(mode_of(dest()), 0555);
  // Only dest was created in its parent: the temp directory was renamed away.
  EXPECT_EQ(names_in(work()), std::vector<std::string>{"dest"});
}

TEST_F(ArchiveTest, CreationIsReproducible) {
  stdfs::path src = base() / "src";
  write_text(src / "z.txt", "last");
  write_text(src / "a.txt", "first", 0600);
  write_text(src / "tool", "x", 0700);
  // Long enough for pax/ustar prefix handling.
  std::string long_dir(90, 'd');
  write_text(src / long_dir / std::string(80, 'f'), "long");
  create_archive(src, base() / "one.tar.zst");
  // Same content, different mtimes and permission bits that do not matter.
  stdfs::last_write_time(src / "z.txt",
                         stdfs::file_time_type::clock::now() - std::chrono::hours(50));
  stdfs::last_write_time(src / long_dir,
                         stdfs::file_time_type::clock::now() - std::chrono::hours(5));
  stdfs::permissions(src / "a.txt", stdfs::perms(0644));
  stdfs::permissions(src / "tool", stdfs::perms(0755));
  ::sleep(1);
  create_archive(src, base() / "two.tar.zst");
  EXPECT_EQ(fs::read_file(base() / "one.tar.zst"), fs::read_file(base() / "two.tar.zst"));

  // From another process too (nothing may depend on the pid).
  pid_t child = ::fork();
  if (child == 0) {
    try {
      create_archive(src, base() / "three.tar.zst");
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(fs::read_file(base() / "one.tar.zst"), fs::read_file(base() / "three.tar.zst"));

  // A content change changes the bytes (the comparison above can fail).
  write_text(src / "z.txt", "LAST");
  create_archive(src, base() / "four.tar.zst");
  EXPECT_NE(fs::read_file(base() / "one.tar.zst"), fs::read_file(base() / "four.tar.zst"));
}

TEST_F(ArchiveTest, CreatedArchiveHasNormalizedHeaders) {
  stdfs::path src = base() / "src";
  write_text(src / "f", "data", 0600);
  write_text(src / "x", "data", 0700);
  stdfs::create_directories(src / "d");
  create_archive(src, archive());
  struct archive* a = archive_read_new();
  archive_read_support_format_tar(a);
  archive_read_support_filter_zstd(a);
  ASSERT_EQ(archive_read_open_filename(a, archive().c_str(), 4096), ARCHIVE_OK);
  struct archive_entry* e = nullptr;
  std::vector<std::string> names;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    names.push_back(archive_entry_pathname(e));
    EXPECT_EQ(archive_entry_mtime(e), 0);
    EXPECT_EQ(archive_entry_uid(e), 0);
    EXPECT_EQ(archive_entry_gid(e), 0);
    const char* uname = archive_entry_uname(e);
    EXPECT_TRUE(uname == nullptr || std::string(uname).empty());
    mode_t perm = archive_entry_perm(e);
    if (archive_entry_filetype(e) == AE_IFDIR || names.back() == "x") {
      EXPECT_EQ(perm, 0755u) << names.back();
    } else {
      EXPECT_EQ(perm, 0644u) << names.back();
    }
  }
  archive_read_free(a);
  EXPECT_EQ(names, (std::vector<std::string>{"d/", "f", "x"}));
}

TEST_F(ArchiveTest, CreationRefusesLinksAndSpecialFiles) {
  stdfs::path src = base() / "src";
  write_text(src / "f", "data");
  stdfs::create_symlink("/etc/passwd", src / "link");
  try {
    create_archive(src, archive());
    ADD_FAILURE() << "symlink packaged";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
  }
  stdfs::remove(src / "link");
  ASSERT_EQ(::mkfifo((src / "fifo").c_str(), 0644), 0);
  try {
    create_archive(src, archive());
    ADD_FAILURE() << "fifo packaged";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
  }
  stdfs::remove(src / "fifo");
  write_text(src / "bad name", "x");
  EXPECT_THROW(create_archive(src, archive()), Error);
  EXPECT_FALSE(stdfs::exists(archive()));
  // No temp files left next to the output.
  for (const auto& n : names_in(base())) EXPECT_FALSE(n.ends_with(".part")) << n;
}

TEST_F(ArchiveTest, LeadingDotSlashAndRootEntryAccepted) {
  write_tar(archive(), {dir_entry("./"), file_entry("./a", "A"), dir_entry("./sub/"),
                        file_entry("./sub/b", "B"), file_entry("implicit/parent/c", "C")});
  extract_archive(archive(), dest());
  EXPECT_EQ(fs::read_file(dest() / "a"), "A");
  EXPECT_EQ(fs::read_file(dest() / "sub" / "b"), "B");
  EXPECT_EQ(fs::read_file(dest() / "implicit" / "parent" / "c"), "C");
  EXPECT_EQ(mode_of(dest() / "implicit" / "parent"), 0555);
}

TEST_F(ArchiveTest, PlainTarAccepted) {
  write_tar(archive(), {file_entry("a", "A")}, Filter::kNone);
  extract_archive(archive(), dest());
  EXPECT_EQ(fs::read_file(dest() / "a"), "A");
}

TEST_F(ArchiveTest, DestinationMustNotExist) {
  write_tar(archive(), {file_entry("a", "A")});
  stdfs::create_directories(dest());
  EXPECT_THROW(extract_archive(archive(), dest()), Error);
  EXPECT_TRUE(stdfs::is_empty(dest()));
}

TEST_F(ArchiveTest, GoodEntriesBeforeABadOneAreRemoved) {
  expect_refused({dir_entry("lib/"), file_entry("lib/libok.so", "ok", 0755), dir_entry("ro/"),
                  file_entry("ro/file", "ro", 0444), file_entry("../escape", "pwned")},
                 "'..'");
}

TEST_F(ArchiveTest, RefusesDotDot) {
  expect_refused({file_entry("../escape", "pwned")}, "'..'");
  expect_refused({dir_entry("a/"), file_entry("a/../../b", "pwned")}, "'..'");
  expect_refused({file_entry("../../outside/x", "pwned")}, "'..'");
}

TEST_F(ArchiveTest, RefusesAbsolutePaths) {
  expect_refused({file_entry("/abs/path", "pwned")}, "absolute");
  expect_refused({file_entry((base() / "abs_target").string(), "pwned")}, "absolute");
}

TEST_F(ArchiveTest, RefusesSymlinkThenWriteThroughIt) {
  expect_refused({symlink_entry("link", "/etc/passwd"), file_entry("link/x", "pwned")},
                 "symbolic links");
  expect_refused(
      {symlink_entry("link", (base() / "outside").string()), file_entry("link/x", "pwned")},
      "symbolic links");
}

TEST_F(ArchiveTest, RefusesHardlinks) {
  expect_refused({hardlink_entry("h", "/etc/passwd")}, "hard links");
  expect_refused({file_entry("a", "A"), hardlink_entry("h", "a")}, "hard links");
}

TEST_F(ArchiveTest, RefusesDevicesAndFifos) {
  expect_refused({special_entry("null", AE_IFCHR)}, "character devices");
  expect_refused({special_entry("disk", AE_IFBLK)}, "block devices");
  expect_refused({special_entry("pipe", AE_IFIFO)}, "FIFOs");
}

TEST_F(ArchiveTest, RefusesOddPaths) {
  expect_refused({file_entry("a b", "x")}, "character outside");
  expect_refused({file_entry("a\\b", "x")}, "character outside");
  expect_refused({file_entry("caf\xc3\xa9", "x")}, "character outside");
  expect_refused({file_entry("a//b", "x")}, "empty path component");
  expect_refused({file_entry("a/./b", "x")}, "'.' component");
  ArchiveLimits limits;
  limits.max_depth = 3;
  expect_refused({file_entry("a/b/c/d", "x")}, "deeper than 3", limits);
  limits = {};
  limits.max_path_length = 20;
  expect_refused({file_entry(std::string(21, 'n'), "x")}, "longer than 20", limits);
}

TEST_F(ArchiveTest, RefusesDuplicatesAndTypeClashes) {
  expect_refused({file_entry("f", "1"), file_entry("f", "2")}, "duplicate");
  expect_refused({file_entry("f", "1"), dir_entry("f/")}, "same name");
  expect_refused({file_entry("f", "1"), file_entry("f/x", "2")}, "same name");
}

TEST_F(ArchiveTest, RefusesTooManyEntries) {
  ArchiveLimits limits;
  limits.max_entries = 3;
  std::vector<TarEntry> entries;
  for (int i = 0; i < 5; ++i) entries.push_back(file_entry("f" + std::to_string(i), "x"));
  expect_refused(entries, "more than 3 entries", limits);
  // Exactly at the limit is fine.
  entries.resize(3);
  write_tar(archive(), entries);
  extract_archive(archive(), dest(), limits);
  EXPECT_EQ(names_in(dest()).size(), 3u);
}

TEST_F(ArchiveTest, RefusesOversizedContent) {
  ArchiveLimits limits;
  limits.max_total_bytes = 100;
  expect_refused({file_entry("a", std::string(60, 'a')), file_entry("b", std::string(60, 'b'))},
                 "more than 100 bytes", limits);
  limits = {};
  limits.max_entry_bytes = 50;
  expect_refused({file_entry("a", std::string(51, 'a'))}, "per-entry limit", limits);
  // Highly compressible data: the limit counts unpacked bytes, not archive bytes.
  limits = {};
  limits.max_total_bytes = 1 << 20;
  expect_refused({file_entry("zeros", std::string(2 << 20, '\0'))}, "more than 1048576", limits);
}

TEST_F(ArchiveTest, DamagedOrForeignArchivesAreInvalidInput) {
  fs::write_file_atomic(archive(), std::string(4096, 'g'));
  try {
    extract_archive(archive(), dest());
    ADD_FAILURE() << "garbage accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
  }
  EXPECT_TRUE(names_in(work()).empty());
  // gzip is not a filter packages use.
  write_tar(archive(), {file_entry("a", "A")}, Filter::kGzip);
  EXPECT_THROW(extract_archive(archive(), dest()), Error);
  EXPECT_TRUE(names_in(work()).empty());
  // Truncated zstd stream.
  write_tar(archive(), {file_entry("a", std::string(200000, 'q') + "tail")});
  std::string bytes = fs::read_file(archive());
  fs::write_file_atomic(archive(), bytes.substr(0, bytes.size() / 2));
  EXPECT_THROW(extract_archive(archive(), dest()), Error);
  EXPECT_TRUE(names_in(work()).empty());
}

}  // namespace
}  // namespace kh
