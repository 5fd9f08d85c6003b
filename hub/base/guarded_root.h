// Guarded roots: directories whose contents only kernel-hub writes (the cache, the trust store),
// treated as storage someone else may touch. Once a root is guarded, every kh::fs function given
// a path beneath it resolves the part below the root one component at a time, each opened
// relative to its parent's descriptor with O_NOFOLLOW: no symlink inside a guarded root is ever
// followed (for reads, writes, renames, permission changes and locks alike), ".." is refused,
// and each directory walked is checked like OpenSSH's StrictModes (owned by this user or root,
// writable by no one else; group-writable only in the shared mode). The part of the path above
// the root is the user's and may contain symlinks.
//
// Directories created beneath a guarded root get an exact mode whatever the umask: 0700
// (private) or 02770 (shared: group-owned, setgid so entries inherit the group).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace kh::fs {

enum class Sharing {
  kPrivate,  // one user: directories 0700, nothing writable by group or others
  kShared,   // many users of one group (a cluster cache): directories 02770, files group-readable
};

// Checks `dir` (and creates it and its missing parents when absent, with the root's mode), then
// registers it. `what` names it in errors ("cache", "trust store"). Throws kh::Error kRefused
// naming the path, its owner and mode and what to do when the directory is owned by someone
// else, writable by others (or by the group in the private mode), or not a directory.
// Guarding the same root again only re-checks it.
void guard_root(const std::filesystem::path& dir, Sharing sharing, std::string_view what);

// Forgets every guarded root (tests).
void unguard_all_roots_for_tests();

struct GuardedRootInfo {
  std::filesystem::path root;
  Sharing sharing = Sharing::kPrivate;
  std::string what;
};
// The guarded root `path` lies beneath (or is), if any.
std::optional<GuardedRootInfo> guarded_root_of(const std::filesystem::path& path);

// A file descriptor closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() { *this = Fd(); }

 private:
  int fd_ = -1;
};

// An opened parent directory and the last component of a path.
struct ParentDir {
  Fd dir;
  std::string leaf;
  bool guarded = false;                 // beneath a guarded root: open the leaf with O_NOFOLLOW
  Sharing sharing = Sharing::kPrivate;  // of that root
};

// Opens the parent directory of `path`. Beneath a guarded root: walked without following
// symlinks (missing directories created with the root's mode when `create`, else nullopt with
// errno ENOENT); elsewhere: opened by path (created with create_directories when `create`).
std::optional<ParentDir> open_parent(const std::filesystem::path& path, bool create);

// Opens the directory `dir` itself as open_parent opens a parent (guarded: no symlink followed).
std::optional<Fd> open_dir(const std::filesystem::path& dir, bool create);

// Mode of a directory created beneath a root of this sharing, and of lock files in it.
mode_t dir_mode(Sharing sharing);
mode_t lock_file_mode(Sharing sharing);

// Throws kRefused when a directory (its stat) breaks the ownership rules of `sharing`.
void check_dir_owner(const std::filesystem::path& dir, const struct stat& st, Sharing sharing,
                     std::string_view what);

// The sharing mode KERNEL_HUB_SHARED_CACHE asks for: "1"/"true"/"yes"/"on" shared,
// unset/""/"0"/"false"/"no"/"off" private; any other value is kInvalidInput.
Sharing cache_sharing_from_env();

}  // namespace kh::fs
