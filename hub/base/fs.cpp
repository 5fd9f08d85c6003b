#include "hub/base/fs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/guarded_root.h"

namespace kh::fs {

const char* file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "a special file";
}

namespace {
// Opens a regular file for reading: -1 with errno ENOENT when absent, throws on other errors.
// Beneath a guarded root no symlink is followed. A FIFO, device or socket is refused without
// blocking (O_NONBLOCK until fstat says what it is): a hostile layout or mirror cannot stall us.
int open_for_reading(const stdfs::path& path) {
  auto parent = open_parent(path, false);
  if (!parent) {
    errno = ENOENT;
    return -1;
  }
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (parent->guarded ? O_NOFOLLOW : 0);
  int fd = ::openat(parent->dir.get(), parent->leaf.c_str(), flags);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return -1;
    if (errno == ELOOP && parent->guarded)
      throw Error(ErrorKind::kRefused,
                  path.string() +
                      " is a symbolic link inside kernel-hub's storage; links are "
                      "never followed there: remove it");
    throw_errno("cannot open " + path.string());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw_errno("cannot stat " + path.string());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kRefused, path.string() + " is not a regular file (" +
                                         file_type_name(st.st_mode) +
                                         "); kernel-hub reads only regular files");
  }
  ::fcntl(fd, F_SETFL, O_RDONLY);  // back to blocking reads
  return fd;
}

// Reads `fd` to its end in chunks, and closes it.
void read_chunks(int fd, const stdfs::path& path,
                 const std::function<void(const char*, size_t)>& fn) {
  Fd owned(fd);
  for_each_chunk(owned.get(), path, fn);
}
}  // namespace

void for_each_chunk(int fd, const stdfs::path& path,
                    const std::function<void(const char*, size_t)>& fn) {
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot read " + path.string());
    }
    if (n == 0) break;
    fn(buf, static_cast<size_t>(n));
  }
}

Fd open_file(const stdfs::path& path) {
  int fd = open_for_reading(path);
  if (fd < 0) throw Error(ErrorKind::kNotFound, "file not found: " + path.string());
  return Fd(fd);
}

void for_each_chunk(const stdfs::path& path, const std::function<void(const char*, size_t)>& fn) {
  int fd = open_for_reading(path);
  if (fd < 0) throw Error(ErrorKind::kNotFound, "file not found: " + path.string());
  read_chunks(fd, path, fn);
}

std::string read_all(int fd, const stdfs::path& path, uint64_t max_size) {
  std::string out;
  for_each_chunk(fd, path, [&](const char* data, size_t n) {
    if (out.size() + n > max_size) {
      throw Error(ErrorKind::kRefused, path.string() + " is larger than the limit of " +
                                           std::to_string(max_size) + " bytes");
    }
    out.append(data, n);
  });
  return out;
}

std::optional<std::string> read_file_if_exists(const stdfs::path& path, uint64_t max_size) {
  int fd = open_for_reading(path);
  if (fd < 0) return std::nullopt;
  Fd owned(fd);
  return read_all(owned.get(), path, max_size);
}

std::string read_file(const stdfs::path& path, uint64_t max_size) {
  auto s = read_file_if_exists(path, max_size);
  if (!s) throw Error(ErrorKind::kNotFound, "file not found: " + path.string());
  return std::move(*s);
}

std::string read_input_file(const stdfs::path& path, uint64_t max_size, std::string_view what) {
  try {
    return read_file(path, max_size);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound)  // kNotFound still: the C API documents it for files
      throw Error(ErrorKind::kNotFound, fmt::format("{} not found: {} (expected {})", path.string(),
                                                    std::strerror(ENOENT), what));
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("cannot read {} ({}): {}", path.string(), what, e.what()));
  }
}

void make_dirs(const stdfs::path& dir) {
  open_dir(dir, true);
}

namespace {
// Removes `name` in dirfd and everything below it, descending through descriptors opened with
// O_NOFOLLOW: a link is removed, never followed, and permission changes land only on what was
// opened.
void remove_at(int dirfd, const std::string& name) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    ::unlinkat(dirfd, name.c_str(), 0);
    return;
  }
  Fd dir(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) {
    ::unlinkat(dirfd, name.c_str(), 0);  // replaced by a non-directory meanwhile
    return;
  }
  ::fchmod(dir.get(), 0700);  // unpacked trees are 0555
  std::vector<std::string> children;
  if (DIR* d = ::fdopendir(::dup(dir.get()))) {
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") children.push_back(std::move(n));
    }
    ::closedir(d);
  }
  for (const auto& c : children) remove_at(dir.get(), c);
  ::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR);
}
}  // namespace

void remove_tree(const stdfs::path& p) {
  auto parent = open_parent(p, false);
  if (!parent || parent->leaf.empty() || parent->leaf == "." || parent->leaf == "..") return;
  remove_at(parent->dir.get(), parent->leaf);
}

bool remove_if_unchanged(const stdfs::path& path, const stdfs::path& aside_dir,
                         const struct stat& expected) {
  auto from = open_parent(path, false);
  if (!from || from->leaf.empty() || from->leaf == "." || from->leaf == "..") return false;
  const int src = from->dir.get();
  const char* leaf = from->leaf.c_str();
  auto is_expected = [&](int dir, const char* name) {
    struct stat now {};
    return ::fstatat(dir, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == expected.st_dev &&
           now.st_ino == expected.st_ino;
  };
  const std::string aside_name = "." + from->leaf + ".removing." + random_hex(12);
  auto aside = open_parent(aside_dir / aside_name, false);
  if (aside &&
      ::renameat2(src, leaf, aside->dir.get(), aside_name.c_str(), RENAME_NOREPLACE) == 0) {
    const int dst = aside->dir.get();
    if (is_expected(dst, aside_name.c_str())) {
      remove_at(dst, aside_name);
      return true;
    }
    // Another file took the place: back where it was. Should yet another have come meanwhile,
    // that one stands and this one goes; on any other failure it stays aside for the sweep of
    // stale temp files, never deleted for a reason that is not a copy in its place.
    if (::renameat2(dst, aside_name.c_str(), src, leaf, RENAME_NOREPLACE) != 0 && errno == EEXIST)
      remove_at(dst, aside_name);
    return false;
  }
  // Gone already, or the move is not possible here (aside_dir on another file system, or
  // missing; a file system without RENAME_NOREPLACE): the check and the removal in two steps.
  if (!is_expected(src, leaf)) return false;
  return ::unlinkat(src, leaf, 0) == 0;
}

void remove_empty_dir(const stdfs::path& dir) {
  auto parent = open_parent(dir, false);
  if (!parent || parent->leaf.empty() || parent->leaf == "." || parent->leaf == "..") return;
  ::unlinkat(parent->dir.get(), parent->leaf.c_str(), AT_REMOVEDIR);  // fails when not empty
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
  std::optional<Fd> d = open_dir(dir, true);
  if (!d) throw Error(ErrorKind::kIo, "cannot open directory " + dir.string());
  for (int attempt = 0; attempt < 16; ++attempt) {
    name_ = std::string(stem) + "." + std::to_string(::getpid()) + "." + random_hex(12) + ".part";
    path_ = dir / name_;
    fd_ =
        ::openat(d->get(), name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ >= 0) {
      dir_fd_ = d->release();
      return;
    }
    if (errno != EEXIST) throw_errno("cannot create temp file " + path_.string());
  }
  throw Error(ErrorKind::kIo, "cannot create a unique temp file in " + dir.string());
}

TempFile::TempFile(TempFile&& other) noexcept
    : path_(std::move(other.path_)),
      name_(std::move(other.name_)),
      dir_fd_(std::exchange(other.dir_fd_, -1)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_) {}

TempFile::~TempFile() {
  discard();
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

void TempFile::discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlinkat(dir_fd_, name_.c_str(), 0);
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
  // Both ends by descriptor: beneath a guarded root no link on the way to dest is followed.
  std::optional<ParentDir> parent = open_parent(dest, true);
  if (!parent) throw Error(ErrorKind::kIo, "cannot open the directory of " + dest.string());
  const int to = parent->dir.get();
  if (keep_existing) {
    // linkat() fails with EEXIST instead of replacing: the first complete writer wins.
    bool created = ::linkat(dir_fd_, name_.c_str(), to, parent->leaf.c_str(), 0) == 0;
    if (!created && errno != EEXIST) {
      throw_errno("cannot move " + path_.string() + " to " + dest.string());
    }
    discard();
    ::fsync(to);
    return created;
  }
  if (::renameat(dir_fd_, name_.c_str(), to, parent->leaf.c_str()) != 0) {
    throw_errno("cannot move " + path_.string() + " to " + dest.string());
  }
  ::close(fd_);
  fd_ = -1;
  ::fsync(to);  // best effort: some file systems refuse fsync on directories
  return true;
}

namespace {
int open_lock_file(const stdfs::path& path) {
  std::optional<ParentDir> parent = open_parent(path, true);
  if (!parent) throw Error(ErrorKind::kIo, "cannot open the directory of lock " + path.string());
  const mode_t mode = parent->guarded ? lock_file_mode(parent->sharing) : 0644;
  int fd = ::openat(parent->dir.get(), parent->leaf.c_str(),
                    O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, mode);
  if (fd < 0) {
    if (errno == ELOOP)
      throw Error(ErrorKind::kRefused, "lock file " + path.string() +
                                           " is a symbolic link; links are never followed: "
                                           "remove it");
    throw_errno("cannot open lock file " + path.string());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kRefused,
                "lock file " + path.string() + " is not a regular file: remove it");
  }
  return fd;
}
struct flock whole_file_write_lock() {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return fl;
}
// Who holds a lock: the holder writes "<pid> <command>" into the lock file once it has it.
std::string lock_holder(int fd) {
  char buf[256];
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "another process";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';  // never print controls
  return "pid " + s;
}
void record_holder(int fd) {
  std::string cmd;
  if (auto comm = read_file_if_exists("/proc/self/comm", 64)) cmd = *comm;
  while (!cmd.empty() && cmd.back() == '\n') cmd.pop_back();
  std::string text = std::to_string(::getpid()) + " (" + cmd + ")\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, text.data(), text.size(), 0);
}
}  // namespace

int64_t lock_timeout_s() {
  const char* v = std::getenv("KERNEL_HUB_LOCK_TIMEOUT");
  if (!v || !*v) return kDefaultLockTimeoutS;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < 0)
    throw Error(ErrorKind::kInvalidInput, std::string("KERNEL_HUB_LOCK_TIMEOUT='") + v +
                                              "' is not a number of seconds (0 = wait forever)");
  return n;
}

FileLock FileLock::acquire(const stdfs::path& path) {
  const int64_t timeout_s = lock_timeout_s();
  const auto start = std::chrono::steady_clock::now();
  LockWait wait;
  if (timeout_s > 0) wait.deadline = start + std::chrono::seconds(timeout_s);
  wait.timeout_message = [path, timeout_s](const std::string& holder) {
    return "gave up after " + std::to_string(timeout_s) + " s waiting for the lock " +
           path.string() + ", held by " + holder +
           ". If that process is stuck (stopped with Ctrl-Z, or hung), resume or end "
           "it; KERNEL_HUB_LOCK_TIMEOUT sets how long to wait (0 = forever)";
  };
  // Said after 2 s only: most waits for an unpack or a compile are shorter than that.
  wait.on_wait_after = std::chrono::seconds(2);
  wait.on_wait = [path](const std::string& holder) {
    std::fprintf(stderr, "kernel-hub: waiting for the lock %s, held by %s\n", path.c_str(),
                 holder.c_str());
  };
  return acquire(path, wait);
}

FileLock FileLock::acquire(const stdfs::path& path, const LockWait& wait) {
  int fd = open_lock_file(path);
  struct flock fl = whole_file_write_lock();
  const auto start = std::chrono::steady_clock::now();
  bool told = false;
  // Short sleeps: a waiter is usually waiting for a small download on the same machine, and
  // each poll is one fcntl.
  int sleep_ms = 1;
  for (;;) {
    if (::fcntl(fd, F_OFD_SETLK, &fl) == 0) break;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EACCES) {
      int e = errno;
      ::close(fd);
      errno = e;
      throw_errno("cannot lock " + path.string());
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= wait.deadline) {
      std::string holder = lock_holder(fd);
      ::close(fd);
      throw Error(ErrorKind::kIo, wait.timeout_message ? wait.timeout_message(holder)
                                                       : "gave up waiting for the lock " +
                                                             path.string() + ", held by " + holder);
    }
    if (!told && now - start >= wait.on_wait_after) {
      told = true;
      if (wait.on_wait) wait.on_wait(lock_holder(fd));
    }
    auto nap = std::chrono::milliseconds(sleep_ms);
    if (wait.deadline - now < nap)
      nap = std::chrono::duration_cast<std::chrono::milliseconds>(wait.deadline - now) +
            std::chrono::milliseconds(1);
    std::this_thread::sleep_for(nap);
    sleep_ms = std::min(sleep_ms * 2, 20);
  }
  record_holder(fd);
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
  record_holder(fd);
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
