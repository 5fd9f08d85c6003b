#include "hub/base/fs.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "hub/base/digest.h"
#include "hub/base/error.h"

namespace kh::fs {

namespace {
// Opens a file for reading: -1 with errno ENOENT/ENOTDIR when absent, throws on other errors.
int open_for_reading(const stdfs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno != ENOENT && errno != ENOTDIR) throw_errno("cannot open " + path.string());
  return fd;
}

// Reads fd to the end in chunks; closes it.
void read_chunks(int fd, const stdfs::path& path,
                 const std::function<void(const char*, size_t)>& fn) {
  char buf[1 << 16];
  try {
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno("cannot read " + path.string());
      }
      if (n == 0) break;
      fn(buf, static_cast<size_t>(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}
}  // namespace

void for_each_chunk(const stdfs::path& path, const std::function<void(const char*, size_t)>& fn) {
  int fd = open_for_reading(path);
  if (fd < 0) throw Error(ErrorKind::kNotFound, "file not found: " + path.string());
  read_chunks(fd, path, fn);
}

std::optional<std::string> read_file_if_exists(const stdfs::path& path, uint64_t max_size) {
  int fd = open_for_reading(path);
  if (fd < 0) return std::nullopt;
  std::string out;
  read_chunks(fd, path, [&](const char* data, size_t n) {
    if (out.size() + n > max_size) {
      throw Error(ErrorKind::kRefused, path.string() + " is larger than the limit of " +
                                           std::to_string(max_size) + " bytes");
    }
    out.append(data, n);
  });
  return out;
}

std::string read_file(const stdfs::path& path, uint64_t max_size) {
  auto s = read_file_if_exists(path, max_size);
  if (!s) throw Error(ErrorKind::kNotFound, "file not found: " + path.string());
  return std::move(*s);
}

void make_dirs(const stdfs::path& dir) {
  std::error_code ec;
  stdfs::create_directories(dir, ec);
  if (ec)
    throw Error(ErrorKind::kIo, "cannot create directory " + dir.string() + ": " + ec.message());
}

void remove_tree(const stdfs::path& p) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    ::chmod(p.c_str(), 0700);
    std::error_code ec;
    std::vector<stdfs::path> children;
    for (auto it = stdfs::directory_iterator(p, ec); !ec && it != stdfs::directory_iterator();
         it.increment(ec)) {
      children.push_back(it->path());
    }
    for (const auto& c : children) remove_tree(c);
    ::rmdir(p.c_str());
  } else {
    ::unlink(p.c_str());
  }
}

void fsync_dir(const stdfs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory " + dir.string());
  ::fsync(fd);  // best effort: some file systems refuse fsync on directories
  ::close(fd);
}

void write_file_atomic(const stdfs::path& path, std::string_view bytes, mode_t mode) {
  stdfs::path dir = path.parent_path().empty() ? stdfs::path(".") : path.parent_path();
  make_dirs(dir);
  TempFile tmp(dir, "." + path.filename().string());
  tmp.write(bytes);
  tmp.commit(path, mode);
}

std::string random_hex(size_t n) {
  std::string raw((n + 1) / 2, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(raw.size())) != 1) {
    throw Error(ErrorKind::kIo, "OpenSSL: RAND_bytes failed");
  }
  return to_hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size()).substr(0, n);
}

TempFile::TempFile(const stdfs::path& dir, std::string_view stem) {
  make_dirs(dir);
  for (int attempt = 0; attempt < 16; ++attempt) {
    path_ = dir /
            (std::string(stem) + "." + std::to_string(::getpid()) + "." + random_hex(12) + ".part");
    fd_ = ::open(path_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ >= 0) return;
    if (errno != EEXIST) throw_errno("cannot create temp file " + path_.string());
  }
  throw Error(ErrorKind::kIo, "cannot create a unique temp file in " + dir.string());
}

TempFile::TempFile(TempFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

TempFile::~TempFile() {
  discard();
}

void TempFile::discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
  }
}

void TempFile::write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write " + path_.string());
    }
    p += n;
    size -= static_cast<size_t>(n);
    size_ += static_cast<uint64_t>(n);
  }
}

void TempFile::truncate() {
  if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0) {
    throw_errno("cannot truncate " + path_.string());
  }
  size_ = 0;
}

bool TempFile::commit(const stdfs::path& dest, mode_t mode, bool keep_existing) {
  if (::fsync(fd_) != 0) throw_errno("cannot fsync " + path_.string());
  if (::fchmod(fd_, mode) != 0) throw_errno("cannot chmod " + path_.string());
  if (keep_existing) {
    // link() fails with EEXIST instead of replacing: the first complete writer wins.
    bool created = ::link(path_.c_str(), dest.c_str()) == 0;
    if (!created && errno != EEXIST) {
      throw_errno("cannot move " + path_.string() + " to " + dest.string());
    }
    discard();
    fsync_dir(dest.parent_path());
    return created;
  }
  if (::rename(path_.c_str(), dest.c_str()) != 0) {
    throw_errno("cannot move " + path_.string() + " to " + dest.string());
  }
  ::close(fd_);
  fd_ = -1;
  fsync_dir(dest.parent_path().empty() ? stdfs::path(".") : dest.parent_path());
  return true;
}

namespace {
int open_lock_file(const stdfs::path& path) {
  make_dirs(path.parent_path());
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot open lock file " + path.string());
  return fd;
}
struct flock whole_file_write_lock() {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return fl;
}
}  // namespace

FileLock FileLock::acquire(const stdfs::path& path) {
  int fd = open_lock_file(path);
  struct flock fl = whole_file_write_lock();
  while (::fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
    if (errno == EINTR) continue;
    int e = errno;
    ::close(fd);
    errno = e;
    throw_errno("cannot lock " + path.string());
  }
  return FileLock(fd);
}

std::optional<FileLock> FileLock::try_acquire(const stdfs::path& path) {
  int fd = open_lock_file(path);
  struct flock fl = whole_file_write_lock();
  if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    int e = errno;
    ::close(fd);
    if (e == EAGAIN || e == EACCES) return std::nullopt;
    errno = e;
    throw_errno("cannot lock " + path.string());
  }
  return FileLock(fd);
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the description releases the OFD lock
}

}  // namespace kh::fs
