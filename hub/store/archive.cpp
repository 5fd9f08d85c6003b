// Safe extraction and reproducible creation of tar+zstd package archives.
//
// Extraction does not use archive_write_disk: every entry is written by us relative to
// directory file descriptors (openat/mkdirat with O_NOFOLLOW and O_EXCL), so a path can never
// be redirected through a link, and nothing outside the fresh temp directory is touched.
#include "hub/store/archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/guarded_root.h"
#include "hub/store/archive_api.h"

namespace kh {

namespace stdfs = std::filesystem;

namespace {

// zstd level for package archives: fixed so that packing twice gives the same bytes.
constexpr int kZstdLevel = 19;

struct ReadArchiveDeleter {
  void operator()(struct archive* a) const { archive_api().read_free(a); }
};
struct WriteArchiveDeleter {
  void operator()(struct archive* a) const { archive_api().write_free(a); }
};
struct EntryDeleter {
  void operator()(struct archive_entry* e) const { archive_api().entry_free(e); }
};

using fs::Fd;

bool is_component_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '+' || c == '-';
}

[[noreturn]] void refuse(std::string_view entry, const std::string& rule) {
  throw Error(ErrorKind::kRefused,
              "archive entry '" + std::string(entry) + "' refused: " + rule +
                  "; the package is unsafe or damaged, ask its publisher to rebuild it");
}

// Splits an entry path into checked components. A leading "./" is dropped and a single
// trailing "/" is allowed (directory entries). Returns an empty vector for the root itself
// ("./" or ".").
std::vector<std::string> split_entry_path(std::string_view path, const ArchiveLimits& limits) {
  std::string_view original = path;
  if (path.size() > limits.max_path_length) {
    refuse(original.substr(0, 64),
           "path longer than " + std::to_string(limits.max_path_length) + " characters");
  }
  if (path.empty()) refuse(original, "empty path");
  if (path.front() == '/') refuse(original, "absolute path");
  while (path.starts_with("./")) path.remove_prefix(2);
  if (path == "." || path.empty()) return {};
  if (path.back() == '/') path.remove_suffix(1);
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t slash = path.find('/', start);
    std::string_view part = path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty()) refuse(original, "empty path component");
    if (part == "..") refuse(original, "'..' component");
    if (part == ".") refuse(original, "'.' component");
    if (part.size() > 255) refuse(original, "path component longer than 255 characters");
    for (char c : part) {
      if (!is_component_char(c)) {
        refuse(original, "character outside [A-Za-z0-9._+-] in a path component");
      }
    }
    parts.emplace_back(part);
    if (parts.size() > limits.max_depth) {
      refuse(original, "deeper than " + std::to_string(limits.max_depth) + " levels");
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return parts;
}

std::string join(const std::vector<std::string>& parts, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out;
}

bool ends_with_so(const std::string& name) {
  return name.size() > 3 && name.ends_with(".so");
}

// Creates entries of one archive inside a root directory, by file descriptor only.
class Extractor {
 public:
  Extractor(const stdfs::path& root, const ArchiveLimits& limits, UnpackBudget* budget)
      : root_path_(root),
        limits_(limits),
        budget_(budget),
        root_(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) {
    if (root_.get() < 0) throw_errno("cannot open extraction directory " + root.string());
  }

  void run(struct archive* a) {
    const ArchiveApi& api = archive_api();
    uint32_t entries = 0;
    for (;;) {
      struct archive_entry* entry = nullptr;
      int r = api.read_next_header(a, &entry);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN) damaged(a);
      if (++entries > limits_.max_entries) {
        const char* name = api.entry_pathname(entry);
        refuse(name ? name : "?",
               "more than " + std::to_string(limits_.max_entries) + " entries in the archive");
      }
      extract_entry(a, entry);
    }
    finish();
  }

 private:
  [[noreturn]] void damaged(struct archive* a) {
    const ArchiveApi& api = archive_api();
    const char* msg = api.error_string(a);
    throw Error(ErrorKind::kInvalidInput,
                "damaged or unsupported package archive: " + std::string(msg ? msg : "unknown") +
                    " (expected tar or tar+zstd); pull the package again or ask its publisher");
  }

  void extract_entry(struct archive* a, struct archive_entry* entry) {
    const ArchiveApi& api = archive_api();
    const char* raw_name = api.entry_pathname(entry);
    if (raw_name == nullptr) refuse("?", "path is not representable");
    std::string name = raw_name;
    if (api.entry_hardlink(entry) != nullptr) refuse(name, "hard links are not allowed");
    if (api.entry_symlink(entry) != nullptr) refuse(name, "symbolic links are not allowed");
    mode_t type = api.entry_filetype(entry);
    if (type != AE_IFREG && type != AE_IFDIR) {
      const char* what = type == AE_IFLNK    ? "symbolic links"
                         : type == AE_IFCHR  ? "character devices"
                         : type == AE_IFBLK  ? "block devices"
                         : type == AE_IFIFO  ? "FIFOs"
                         : type == AE_IFSOCK ? "sockets"
                                             : "entries of this type";
      refuse(name, std::string(what) + " are not allowed (regular files and directories only)");
    }
    if (api.entry_sparse_count(entry) > 0) refuse(name, "sparse files are not allowed");
    std::vector<std::string> parts = split_entry_path(name, limits_);
    if (parts.empty()) {
      if (type != AE_IFDIR) refuse(name, "a file cannot be the archive root");
      return;  // "./": the root itself
    }
    Fd parent = open_parent(parts, name);
    const std::string& leaf = parts.back();
    if (type == AE_IFDIR) {
      make_dir(parent.get(), leaf, join(parts, parts.size()), name);
      return;
    }
    if (api.entry_size_is_set(entry) &&
        static_cast<uint64_t>(api.entry_size(entry)) > limits_.max_entry_bytes) {
      refuse(name, "larger than the per-entry limit of " + std::to_string(limits_.max_entry_bytes) +
                       " bytes");
    }
    bool executable = (api.entry_perm(entry) & 0111) != 0 || ends_with_so(leaf);
    write_file(a, entry, parent.get(), leaf, name, executable ? 0555 : 0444);
  }

  // Opens (creating where the archive omitted them) the directories above the leaf.
  Fd open_parent(const std::vector<std::string>& parts, const std::string& name) {
    Fd current(::dup(root_.get()));
    if (current.get() < 0) throw_errno("dup");
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      make_dir(current.get(), parts[i], join(parts, i + 1), name);
      int next = ::openat(current.get(), parts[i].c_str(),
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next < 0) {
        if (errno == ENOTDIR || errno == ELOOP) refuse(name, "a parent is not a directory");
        throw_errno("cannot open directory " + join(parts, i + 1) + " in " + root_path_.string());
      }
      current = Fd(next);
    }
    return current;
  }

  void make_dir(int parent, const std::string& leaf, const std::string& rel,
                const std::string& name) {
    if (::mkdirat(parent, leaf.c_str(), 0700) == 0) {
      dirs_.insert(rel);
      return;
    }
    if (errno != EEXIST)
      throw_errno("cannot create directory " + rel + " in " + root_path_.string());
    // Only a directory we created ourselves may already be there.
    if (!dirs_.contains(rel)) refuse(name, "a file of the same name is already in the archive");
  }

  void write_file(struct archive* a, struct archive_entry* entry, int parent,
                  const std::string& leaf, const std::string& name, mode_t mode) {
    const ArchiveApi& api = archive_api();
    Fd fd(
        ::openat(parent, leaf.c_str(), O_CREAT | O_EXCL | O_NOFOLLOW | O_WRONLY | O_CLOEXEC, 0600));
    if (fd.get() < 0) {
      if (errno == EEXIST) refuse(name, "duplicate entry");
      throw_errno("cannot create " + name + " in " + root_path_.string());
    }
    const int64_t header_size = api.entry_size_is_set(entry) ? api.entry_size(entry) : -1;
    uint64_t written = 0;
    for (;;) {
      const void* buf = nullptr;
      size_t size = 0;
      la_int64_t offset = 0;
      int r = api.read_data_block(a, &buf, &size, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN) damaged(a);
      if (offset < 0 || static_cast<uint64_t>(offset) != written) {
        refuse(name, "data with holes (sparse entries are not allowed)");
      }
      // Counted here, from the bytes actually delivered, never from the header alone.
      written += size;
      total_ += size;
      if (header_size >= 0 && written > static_cast<uint64_t>(header_size)) {
        refuse(name, "more data than its header declares");
      }
      if (written > limits_.max_entry_bytes) {
        refuse(name, "larger than the per-entry limit of " +
                         std::to_string(limits_.max_entry_bytes) + " bytes");
      }
      if (total_ > limits_.max_total_bytes) {
        refuse(name, "the archive unpacks to more than " + std::to_string(limits_.max_total_bytes) +
                         " bytes");
      }
      charge_budget(name, size);
      const char* p = static_cast<const char*>(buf);
      while (size > 0) {
        ssize_t n = ::write(fd.get(), p, size);
        if (n < 0) {
          if (errno == EINTR) continue;
          throw_errno("cannot write " + name + " in " + root_path_.string());
        }
        p += n;
        size -= static_cast<size_t>(n);
      }
    }
    if (::fsync(fd.get()) != 0) throw_errno("cannot fsync " + name);
    if (::fchmod(fd.get(), mode) != 0) throw_errno("cannot chmod " + name);
  }

  // Every byte written counts against the command's budget, before it is written.
  void charge_budget(const std::string& name, uint64_t size) {
    if (!budget_) return;
    budget_->used += size;
    if (budget_->used <= budget_->limit) return;
    throw Error(ErrorKind::kRefused, "archive entry '" + name +
                                         "' refused: it would take this command's unpacking " +
                                         "past its budget of " + std::to_string(budget_->limit) +
                                         " bytes (" + std::to_string(budget_->used - size) +
                                         " unpacked before it); set " + UnpackBudget::kVariable +
                                         " (bytes) higher if the packages are meant to be "
                                         "this large");
  }

  // Directories become read-only only after everything inside them was written, deepest first.
  void finish() {
    std::vector<std::string> dirs(dirs_.begin(), dirs_.end());
    std::sort(dirs.begin(), dirs.end(), [](const std::string& x, const std::string& y) {
      auto depth = [](const std::string& s) { return std::count(s.begin(), s.end(), '/'); };
      return depth(x) > depth(y);
    });
    for (const auto& rel : dirs) {
      Fd d(::openat(root_.get(), rel.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (d.get() < 0) throw_errno("cannot open directory " + rel + " in " + root_path_.string());
      ::fsync(d.get());
      if (::fchmod(d.get(), 0555) != 0) throw_errno("cannot chmod directory " + rel);
    }
    ::fsync(root_.get());
    if (::fchmod(root_.get(), 0555) != 0) throw_errno("cannot chmod " + root_path_.string());
  }

  stdfs::path root_path_;
  ArchiveLimits limits_;
  UnpackBudget* budget_;
  Fd root_;
  std::set<std::string> dirs_;
  uint64_t total_ = 0;
};

// ---- creation ----

struct SourceEntry {
  std::string rel;  // archive path, "/"-separated, no leading "./"
  stdfs::path path;
  bool is_dir = false;
  bool executable = false;
  uint64_t size = 0;
};

// Pre-order walk, children sorted by name (byte order): a directory always precedes its
// content, and the order never depends on the file system's directory order.
void collect(const stdfs::path& dir, const std::string& prefix, std::vector<SourceEntry>& out) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = stdfs::directory_iterator(dir, ec); !ec && it != stdfs::directory_iterator();
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) throw Error(ErrorKind::kIo, "cannot list " + dir.string() + ": " + ec.message());
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    SourceEntry e;
    e.rel = prefix.empty() ? name : prefix + "/" + name;
    e.path = dir / name;
    struct stat st;
    if (::lstat(e.path.c_str(), &st) != 0) throw_errno("cannot stat " + e.path.string());
    if (S_ISLNK(st.st_mode)) {
      throw Error(ErrorKind::kRefused, "cannot package " + e.path.string() +
                                           ": symbolic links are not allowed in packages; "
                                           "copy the target file instead");
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
      throw Error(ErrorKind::kRefused, "cannot package " + e.path.string() +
                                           ": only regular files and directories are allowed");
    }
    e.is_dir = S_ISDIR(st.st_mode);
    e.executable = (st.st_mode & 0111) != 0;
    e.size = static_cast<uint64_t>(st.st_size);
    out.push_back(e);
    if (e.is_dir) collect(e.path, e.rel, out);
  }
}

void check_write(struct archive* a, int r, const std::string& what) {
  if (r < ARCHIVE_WARN) {
    const ArchiveApi& api = archive_api();
    const char* msg = api.error_string(a);
    throw Error(ErrorKind::kIo, "cannot write package archive (" + what +
                                    "): " + std::string(msg ? msg : "unknown error"));
  }
}

using ReadArchive = std::unique_ptr<struct archive, ReadArchiveDeleter>;

// A reader of `archive` (tar, or tar+zstd). kNotFound when it is absent, kInvalidInput when it
// cannot be read as one.
ReadArchive open_archive(const stdfs::path& archive) {
  const ArchiveApi& api = archive_api();
  ReadArchive a(api.read_new());
  if (!a) throw Error(ErrorKind::kIo, "libarchive: out of memory");
  api.read_support_format_tar(a.get());
  api.read_support_filter_zstd(a.get());
  api.read_support_filter_none(a.get());
  if (api.read_open_filename(a.get(), archive.c_str(), 1 << 16) != ARCHIVE_OK) {
    const char* msg = api.error_string(a.get());
    std::string why = msg ? msg : "unknown error";
    std::error_code ec;
    if (!stdfs::exists(archive, ec)) {
      throw Error(ErrorKind::kNotFound, "package archive not found: " + archive.string());
    }
    throw Error(ErrorKind::kInvalidInput, "cannot open package archive " + archive.string() + ": " +
                                              why + " (expected tar or tar+zstd)");
  }
  return a;
}

}  // namespace

std::optional<std::string> read_archive_member(const stdfs::path& archive, std::string_view name,
                                               uint64_t max_bytes, const ArchiveLimits& limits) {
  const ArchiveApi& api = archive_api();
  ReadArchive a = open_archive(archive);
  struct archive_entry* entry = nullptr;
  std::optional<std::string> found;
  for (uint32_t entries = 0;;) {
    int r = api.read_next_header(a.get(), &entry);
    if (r == ARCHIVE_EOF) return found;
    const char* msg = r < ARCHIVE_WARN ? api.error_string(a.get()) : nullptr;
    if (r < ARCHIVE_WARN)
      throw Error(ErrorKind::kInvalidInput, "damaged or unsupported package archive " +
                                                archive.string() + ": " +
                                                std::string(msg ? msg : "unknown"));
    if (++entries > limits.max_entries)
      refuse("?", "more than " + std::to_string(limits.max_entries) + " entries in the archive");
    const char* raw = api.entry_pathname(entry);
    if (!raw || api.entry_filetype(entry) != AE_IFREG) continue;
    std::vector<std::string> parts = split_entry_path(raw, limits);
    if (parts.size() != 1 || parts[0] != name) continue;
    // Extraction refuses duplicates: so must the one reading it here, or the two would disagree.
    if (found) refuse(raw, "duplicate entry");
    found.emplace();
    for (;;) {
      const void* buf = nullptr;
      size_t size = 0;
      la_int64_t offset = 0;
      int d = api.read_data_block(a.get(), &buf, &size, &offset);
      if (d == ARCHIVE_EOF) break;
      if (d < ARCHIVE_WARN || offset < 0 || static_cast<uint64_t>(offset) != found->size())
        refuse(raw, "damaged data (or holes, which are not allowed)");
      if (found->size() + size > max_bytes)
        refuse(raw, "larger than " + std::to_string(max_bytes) + " bytes");
      found->append(static_cast<const char*>(buf), size);
    }
  }
}

uint64_t UnpackBudget::limit_from_env() {
  return static_cast<uint64_t>(env_long(kVariable, static_cast<long>(kDefault), 1));
}

void extract_archive(const stdfs::path& archive, const stdfs::path& dest,
                     const ArchiveLimits& limits, UnpackBudget* budget) {
  // Loaded before anything is created, so a missing libarchive leaves nothing behind.
  archive_api();
  std::error_code ec;
  if (stdfs::symlink_status(dest, ec).type() != stdfs::file_type::not_found) {
    throw Error(ErrorKind::kIo, "cannot extract " + archive.string() + ": destination " +
                                    dest.string() + " already exists");
  }
  stdfs::path parent = dest.parent_path().empty() ? stdfs::path(".") : dest.parent_path();
  stdfs::path tmp = parent / ("." + dest.filename().string() + "." + std::to_string(::getpid()) +
                              "." + fs::random_hex(12) + ".tmp");
  if (::mkdir(tmp.c_str(), 0700) != 0) throw_errno("cannot create " + tmp.string());
  try {
    ReadArchive a = open_archive(archive);
    Extractor(tmp, limits, budget).run(a.get());
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE) != 0) {
      throw_errno("cannot move extracted package to " + dest.string());
    }
  } catch (...) {
    fs::remove_tree(tmp);
    throw;
  }
  fs::fsync_dir(parent);
}

void create_archive(const stdfs::path& src_dir, const stdfs::path& out) {
  const ArchiveApi& api = archive_api();
  struct stat st;
  if (::stat(src_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw Error(ErrorKind::kNotFound, "cannot package " + src_dir.string() + ": not a directory");
  }
  std::vector<SourceEntry> entries;
  collect(src_dir, "", entries);
  // Refuse here what extraction would refuse later, so a bad package is never published.
  ArchiveLimits limits;
  if (entries.size() > limits.max_entries) {
    throw Error(ErrorKind::kRefused, "cannot package " + src_dir.string() + ": more than " +
                                         std::to_string(limits.max_entries) +
                                         " entries, which extraction would refuse");
  }
  uint64_t total = 0;
  for (const auto& e : entries) total += e.size;
  if (total > limits.max_total_bytes) {
    throw Error(ErrorKind::kRefused, "cannot package " + src_dir.string() + ": more than " +
                                         std::to_string(limits.max_total_bytes) +
                                         " bytes, which extraction would refuse");
  }
  for (const auto& e : entries) {
    try {
      split_entry_path(e.rel, limits);
    } catch (const Error& err) {
      throw Error(ErrorKind::kRefused, "cannot package " + src_dir.string() + ": " + err.what());
    }
  }

  stdfs::path dir = out.parent_path().empty() ? stdfs::path(".") : out.parent_path();
  fs::TempFile tmp(dir, "." + out.filename().string());
  {
    std::unique_ptr<struct archive, WriteArchiveDeleter> a(api.write_new());
    if (!a) throw Error(ErrorKind::kIo, "libarchive: out of memory");
    check_write(a.get(), api.write_set_format_pax_restricted(a.get()), "format");
    check_write(a.get(), api.write_add_filter_zstd(a.get()), "zstd filter");
    check_write(a.get(),
                api.write_set_filter_option(a.get(), "zstd", "compression-level",
                                            std::to_string(kZstdLevel).c_str()),
                "zstd level");
    check_write(a.get(), api.write_open_fd(a.get(), tmp.fd()), "open " + tmp.path().string());
    std::vector<char> buf(1 << 16);
    for (const auto& e : entries) {
      std::unique_ptr<struct archive_entry, EntryDeleter> entry(api.entry_new());
      api.entry_set_pathname(entry.get(), e.rel.c_str());
      api.entry_set_filetype(entry.get(), e.is_dir ? AE_IFDIR : AE_IFREG);
      api.entry_set_perm(entry.get(), (e.is_dir || e.executable) ? 0755 : 0644);
      api.entry_set_mtime(entry.get(), 0, 0);
      api.entry_set_uid(entry.get(), 0);
      api.entry_set_gid(entry.get(), 0);
      api.entry_set_uname(entry.get(), "");
      api.entry_set_gname(entry.get(), "");
      api.entry_set_size(entry.get(), e.is_dir ? 0 : static_cast<la_int64_t>(e.size));
      check_write(a.get(), api.write_header(a.get(), entry.get()), "header of " + e.rel);
      if (e.is_dir) continue;
      Fd fd(::open(e.path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (fd.get() < 0) throw_errno("cannot open " + e.path.string());
      uint64_t done = 0;
      for (;;) {
        ssize_t n = ::read(fd.get(), buf.data(), buf.size());
        if (n < 0) {
          if (errno == EINTR) continue;
          throw_errno("cannot read " + e.path.string());
        }
        if (n == 0) break;
        done += static_cast<uint64_t>(n);
        if (done > e.size) break;
        la_ssize_t w = api.write_data(a.get(), buf.data(), static_cast<size_t>(n));
        if (w < 0) check_write(a.get(), static_cast<int>(w), "data of " + e.rel);
      }
      if (done != e.size) {
        throw Error(ErrorKind::kIo, "cannot package " + e.path.string() +
                                        ": the file changed while it was being archived");
      }
    }
    check_write(a.get(), api.write_close(a.get()), "close");
  }
  tmp.commit(out, 0644);
}

}  // namespace kh
