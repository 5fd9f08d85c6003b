// File-system helpers that keep the project's rule: every file is written atomically
// (temp file in the same directory -> fsync -> rename -> fsync of the directory).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "hub/base/guarded_root.h"

namespace kh::fs {

namespace stdfs = std::filesystem;

// Reads a whole file. Throws kNotFound when it does not exist, kIo on other errors,
// kRefused when it is larger than max_size.
std::string read_file(const stdfs::path& path, uint64_t max_size = UINT64_MAX);
// read_file for a file the user named (a config, a lock file), its errors naming `what` it
// should be: kNotFound when missing, kInvalidInput when unreadable or not a regular file.
std::string read_input_file(const stdfs::path& path, uint64_t max_size, std::string_view what);
std::optional<std::string> read_file_if_exists(const stdfs::path& path,
                                               uint64_t max_size = UINT64_MAX);

// Writes bytes to path atomically with the given mode; creates parent directories.
void write_file_atomic(const stdfs::path& path, std::string_view bytes, mode_t mode = 0644);
// Beneath a guarded root (hub/base/guarded_root.h) every function here resolves the path without
// following symlinks and creates directories with the root's exact mode. Reads open only
// regular files (a FIFO or device is refused at once, never waited on).

void fsync_dir(const stdfs::path& dir);
// Removes a file or a whole tree, also where entries were made read-only (blobs are 0444,
// unpacked packages 0555). Never follows symlinks. Missing paths are not an error.
void remove_tree(const stdfs::path& path);
// Removes the file at `path` only while it is still the one `expected` describes (st_dev and
// st_ino from an fstat of what was checked), with no window in which a replacement another
// process put there could be removed instead: the entry is moved into `aside_dir` (on the same
// file system) in one rename, which takes whatever is there at that instant; it is deleted there
// when it is the expected file, else moved back, unless yet another file took the place meanwhile
// (that one stands, and the moved one is deleted; on any other failure to move it back it stays
// in aside_dir for the sweep of stale temp files). Where the move cannot be made (aside_dir on
// another file system, or missing; a file system without RENAME_NOREPLACE) the check and the
// unlink are two steps. Returns whether the expected file was removed. Opened as remove_tree
// opens paths: no symlink followed.
bool remove_if_unchanged(const stdfs::path& path, const stdfs::path& aside_dir,
                         const struct stat& expected);
// Removes the directory `dir` if it is empty (else leaves it), its parent opened as remove_tree
// opens it: no symlink followed on the way.
void remove_empty_dir(const stdfs::path& dir);
// Calls fn(data, size) for successive chunks of a file. Throws kNotFound / kIo.
void for_each_chunk(const stdfs::path& path, const std::function<void(const char*, size_t)>& fn);
// The same from an open descriptor's offset to its end (`path` names it in errors).
void for_each_chunk(int fd, const stdfs::path& path,
                    const std::function<void(const char*, size_t)>& fn);
// The bytes from an open descriptor's offset to its end; kRefused past max_size.
std::string read_all(int fd, const stdfs::path& path, uint64_t max_size);
// Opens a regular file for reading as for_each_chunk does (beneath a guarded root: no link
// followed). Throws kNotFound, kRefused for a link or special file, kIo.
Fd open_file(const stdfs::path& path);
void make_dirs(const stdfs::path& dir);

// A unique, process-private temp file (O_CREAT|O_EXCL, 0600) that is removed unless committed.
class TempFile {
 public:
  // Creates <dir>/<stem>.<pid>.<random>.part
  TempFile(const stdfs::path& dir, std::string_view stem);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  TempFile(TempFile&& other) noexcept;

  void write(const void* data, size_t size);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void truncate();  // back to zero bytes, for restarts
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  const stdfs::path& path() const { return path_; }

  // fsync, chmod, rename over dest, fsync dest's directory. Returns false (and removes the
  // temp) when keep_existing is set and dest already exists.
  bool commit(const stdfs::path& dest, mode_t mode, bool keep_existing = false);
  void discard();

 private:
  stdfs::path path_;
  std::string name_;  // path_'s last component, in dir_fd_
  int dir_fd_ = -1;   // the directory, opened once (beneath a guarded root: without links)
  int fd_ = -1;
  uint64_t size_ = 0;
};

// How long FileLock::acquire waits by default before giving up (KERNEL_HUB_LOCK_TIMEOUT
// overrides; 0 = forever).
constexpr int64_t kDefaultLockTimeoutS = 600;
int64_t lock_timeout_s();

// "a regular file", "a FIFO", "a symbolic link", ... for messages.
const char* file_type_name(mode_t mode);

// How FileLock::acquire waits for a lock another process holds.
struct LockWait {
  // Give up at this time (kIo, with timeout_message(holder)); max(): wait forever.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Called once with who holds the lock ("pid 123 (kernel-hub)") when it has been found held for
  // on_wait_after (0: as soon as it is found held).
  std::function<void(const std::string& holder)> on_wait;
  std::chrono::milliseconds on_wait_after{0};
  // The error when the deadline passes: what was waited for and what to do.
  std::function<std::string(const std::string& holder)> timeout_message;
};

// An open-file-description lock (fcntl F_OFD_SETLK*, flock's semantics: owned by the open file,
// released when the process dies, so a killed holder never blocks anyone). Locks only avoid
// duplicate work; correctness never depends on them. The holder writes its pid and command into
// the lock file so that a waiter can say who it waits for. The lock file is opened with
// O_NOFOLLOW|O_CLOEXEC (beneath a guarded root its directory is walked without links too), made
// with the cache's file mode, never removed, and refused when it is not a regular file.
class FileLock {
 public:
  // Waits until the lock is held; says on stderr who holds it after 2 s, and gives up (kIo,
  // naming the holder) after lock_timeout_s().
  static FileLock acquire(const stdfs::path& path);
  // Waits as `wait` says.
  static FileLock acquire(const stdfs::path& path, const LockWait& wait);
  // Returns nullopt when another process holds it.
  static std::optional<FileLock> try_acquire(const stdfs::path& path);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Random lowercase hex of n characters (from /dev/urandom via OpenSSL).
std::string random_hex(size_t n);

}  // namespace kh::fs
