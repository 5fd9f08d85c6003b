#include "loader/verified_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <compare>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"

namespace kh {

namespace {

constexpr unsigned kSeals = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL;

// Digests of files this process hashed, by inode and change time. A hit needs the same inode
// (a rename swaps in another one) with the same size, mtime and ctime: any write to the content
// moves ctime, which no user can set back, so the bytes are the ones hashed. This keeps warm
// kernelize from hashing every library once per slot and mode. Files another user owns are never
// remembered (they are copied and hashed each time).
struct InodeVersion {
  dev_t dev;
  ino_t ino;
  off_t size;
  int64_t mtime_ns, ctime_ns;
  auto operator<=>(const InodeVersion&) const = default;
};
InodeVersion version_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size,
          int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
          int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec};
}
std::mutex g_memo_mutex;
std::map<InodeVersion, Digest>& digest_memo() {
  static auto* m = new std::map<InodeVersion, Digest>();
  return *m;
}

// Reads from `fd` at `offset`, retrying on EINTR. Returns the bytes read (0 at the end).
size_t pread_some(int fd, char* buf, size_t n, uint64_t offset, const std::filesystem::path& p) {
  for (;;) {
    ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(offset));
    if (r >= 0) return static_cast<size_t>(r);
    if (errno != EINTR) throw_errno("cannot read " + p.string());
  }
}

void write_all(int fd, const char* data, size_t n, const std::filesystem::path& p) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot copy " + p.string() + " into memory");
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::string VerifiedFile::fd_path() const {
  return fmt::format("/proc/self/fd/{}", fd.get());
}

std::string VerifiedFile::read_all(uint64_t max_size) const {
  if (size > max_size)
    throw Error(ErrorKind::kRefused,
                fmt::format("{} is larger than the limit of {} bytes", path.string(), max_size));
  std::string out(size, '\0');
  uint64_t at = 0;
  while (at < size) {
    size_t n = pread_some(fd.get(), out.data() + at, static_cast<size_t>(size - at), at, path);
    if (n == 0)
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("{} shrank after it was verified", path.string()));
    at += n;
  }
  return out;
}

VerifiedFile open_verified(const std::filesystem::path& path,
                           const std::optional<Digest>& expected) {
  auto parent = fs::open_parent(path, false);
  if (!parent) throw Error(ErrorKind::kNotFound, "file not found: " + path.string());
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (parent->guarded ? O_NOFOLLOW : 0);
  fs::Fd fd(::openat(parent->dir.get(), parent->leaf.c_str(), flags));
  if (!fd) {
    if (errno == ENOENT) throw Error(ErrorKind::kNotFound, "file not found: " + path.string());
    if (errno == ELOOP)
      throw Error(ErrorKind::kRefused, path.string() +
                                           " is a symbolic link inside kernel-hub's "
                                           "storage; links are never loaded");
    throw_errno("cannot open " + path.string());
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("cannot stat " + path.string());
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorKind::kRefused, fmt::format("{} is {}, not a regular file", path.string(),
                                                 fs::file_type_name(st.st_mode)));
  ::fcntl(fd.get(), F_SETFL, O_RDONLY);

  VerifiedFile out;
  out.path = path;
  // Another user's file could be rewritten in place by its owner after we hash it: hash a copy
  // that nobody can change instead.
  const bool copy = st.st_uid != ::geteuid();
  fs::Fd sealed;
  if (copy) {
    sealed = fs::Fd(::memfd_create(path.filename().c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!sealed) throw_errno("cannot make a sealed copy of " + path.string());
  }
  const InodeVersion version = version_of(st);
  std::optional<Digest> known;
  if (!copy) {
    std::lock_guard lock(g_memo_mutex);
    if (auto it = digest_memo().find(version); it != digest_memo().end()) known = it->second;
  }
  if (known) {
    out.digest = *known;
    out.size = static_cast<uint64_t>(st.st_size);
  } else {
    Sha256 hash;
    std::vector<char> buf(1 << 16);
    uint64_t at = 0;
    for (;;) {
      size_t n = pread_some(fd.get(), buf.data(), buf.size(), at, path);
      if (n == 0) break;
      hash.update(buf.data(), n);
      if (copy) write_all(sealed.get(), buf.data(), n, path);
      at += n;
    }
    out.digest = hash.finish();
    out.size = at;
    struct stat after {};
    // Remember it only when nothing moved while it was read.
    if (!copy && ::fstat(fd.get(), &after) == 0 && version_of(after) == version &&
        at == static_cast<uint64_t>(st.st_size)) {
      std::lock_guard lock(g_memo_mutex);
      digest_memo()[version] = out.digest;
    }
  }
  if (copy) {
    if (::fcntl(sealed.get(), F_ADD_SEALS, kSeals) != 0)
      throw_errno("cannot seal the copy of " + path.string());
    out.fd = std::move(sealed);
    out.sealed_copy = true;
  } else {
    out.fd = std::move(fd);
  }
  if (expected && *expected != out.digest) {
    throw Error(ErrorKind::kIntegrity,
                fmt::format("{} has digest {}, but the verified package says {}: the cached file "
                            "was changed; nothing was loaded. Remove the package's directory "
                            "from the cache (or run `kernel-hub verify`) and pull it again",
                            path.string(), out.digest.str(), expected->str()));
  }
  return out;
}

}  // namespace kh
