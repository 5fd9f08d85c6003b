#include "hub/base/guarded_root.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "hub/base/env.h"
#include "hub/base/error.h"

namespace kh::fs {

namespace stdfs = std::filesystem;

namespace {

std::mutex g_mutex;
std::vector<GuardedRootInfo> g_roots;  // guarded roots, absolute and lexically normal

stdfs::path normal_absolute(const stdfs::path& p) {
  std::error_code ec;
  stdfs::path a = stdfs::absolute(p, ec);
  if (ec) a = p;
  a = a.lexically_normal();
  // "dir/" and "dir" name the same root.
  if (!a.has_filename() && a.has_parent_path() && a != a.root_path()) a = a.parent_path();
  return a;
}

// The components of `path` below `root`, or nullopt when `path` is not beneath it.
std::optional<std::vector<std::string>> components_below(const stdfs::path& root,
                                                         const stdfs::path& path) {
  auto r = root.begin();
  auto p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (p == path.end() || *r != *p) return std::nullopt;
  }
  std::vector<std::string> out;
  for (; p != path.end(); ++p) {
    std::string c = p->string();
    if (c.empty() || c == ".") continue;
    out.push_back(std::move(c));
  }
  return out;
}

std::string user_name(uid_t uid) {
  if (const struct passwd* pw = ::getpwuid(uid); pw && pw->pw_name)
    return fmt::format("uid {} ({})", uid, pw->pw_name);
  return fmt::format("uid {}", uid);
}

bool in_group(gid_t gid) {
  if (gid == ::getegid()) return true;
  int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  n = ::getgroups(n, groups.data());
  for (int i = 0; i < n; ++i)
    if (groups[static_cast<size_t>(i)] == gid) return true;
  return false;
}

[[noreturn]] void refuse_link(const stdfs::path& path, const std::string& component,
                              const GuardedRootInfo& root, int dirfd) {
  struct stat st {};
  std::string kind = "not a directory";
  if (::fstatat(dirfd, component.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
    kind = "a symbolic link";
  throw Error(
      ErrorKind::kRefused,
      fmt::format("{}: '{}' is {} inside the {} ({}); kernel-hub never follows links "
                  "or special entries there: remove it (the {} rebuilds what it needs)",
                  path.string(), component, kind, root.what, root.root.string(), root.what));
}

// Opens `component` below dirfd as a directory, never following a link; creates it when asked.
// Returns -1 with errno ENOENT when it is missing and !create.
int open_component(int dirfd, const std::string& component, const stdfs::path& at,
                   const stdfs::path& path, const GuardedRootInfo& root, bool create) {
  if (component == "..")
    throw Error(ErrorKind::kRefused,
                fmt::format("{}: '..' is not allowed in a path inside the {} ({})", path.string(),
                            root.what, root.root.string()));
  bool created = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::openat(dirfd, component.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st {};
      if (::fstat(fd, &st) != 0) {
        ::close(fd);
        throw_errno("cannot stat " + path.string());
      }
      // A directory we just made gets its exact mode whatever the umask.
      if (created && ::fchmod(fd, dir_mode(root.sharing)) != 0) {
        ::close(fd);
        throw_errno("cannot set the mode of a directory in " + path.string());
      }
      if (created) st.st_mode = (st.st_mode & ~07777) | dir_mode(root.sharing);
      try {
        check_dir_owner(at, st, root.sharing, root.what);
      } catch (...) {
        ::close(fd);
        throw;
      }
      return fd;
    }
    if (errno == ELOOP || errno == ENOTDIR) refuse_link(path, component, root, dirfd);
    if (errno != ENOENT) throw_errno("cannot open " + path.string());
    if (!create) return -1;
    if (::mkdirat(dirfd, component.c_str(), dir_mode(root.sharing)) == 0) {
      created = true;
    } else if (errno != EEXIST) {
      throw_errno("cannot create a directory for " + path.string());
    }
  }
  throw_errno("cannot open " + path.string());
}

// Walks `dirs` below the guarded root without following links. Returns the last directory's
// descriptor, or an empty Fd (errno ENOENT) when one is missing and !create.
Fd walk(const GuardedRootInfo& root, const std::vector<std::string>& dirs, const stdfs::path& path,
        bool create) {
  Fd fd(::open(root.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT && create) {
      guard_root(root.root, root.sharing, root.what);  // removed since: make it again
      fd = Fd(::open(root.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    }
    if (!fd) {
      if (errno == ENOENT) return Fd();
      throw_errno("cannot open the " + root.what + " " + root.root.string());
    }
  }
  stdfs::path at = root.root;
  for (const auto& c : dirs) {
    at /= c;
    int next = open_component(fd.get(), c, at, path, root, create);
    if (next < 0) return Fd();
    fd = Fd(next);
  }
  return fd;
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

mode_t dir_mode(Sharing sharing) {
  return sharing == Sharing::kShared ? 02770 : 0700;
}

mode_t lock_file_mode(Sharing sharing) {
  return sharing == Sharing::kShared ? 0660 : 0600;
}

void check_dir_owner(const stdfs::path& dir, const struct stat& st, Sharing sharing,
                     std::string_view what) {
  if (!S_ISDIR(st.st_mode))
    throw Error(ErrorKind::kRefused,
                fmt::format("the {} {} is not a directory", what, dir.string()));
  const uid_t me = ::geteuid();
  const bool mine = st.st_uid == me || st.st_uid == 0;
  const bool shared = sharing == Sharing::kShared;
  if (!mine && !(shared && in_group(st.st_gid))) {
    throw Error(ErrorKind::kRefused,
                fmt::format("the {} directory {} is owned by {}, not by you ({}): kernel-hub will "
                            "not load code from storage another user controls. Use a directory "
                            "of your own (KERNEL_HUB_CACHE / KERNEL_HUB_TRUST_DIR), or for a "
                            "cache shared by a group set KERNEL_HUB_SHARED_CACHE=1",
                            what, dir.string(), user_name(st.st_uid), user_name(me)));
  }
  if (st.st_mode & S_IWOTH) {
    throw Error(ErrorKind::kRefused,
                fmt::format("the {} directory {} is writable by every user (mode {:04o}): anyone "
                            "could replace what kernel-hub loads. Run `chmod o-w {}`",
                            what, dir.string(), st.st_mode & 07777, dir.string()));
  }
  if (!shared && (st.st_mode & S_IWGRP)) {
    throw Error(ErrorKind::kRefused,
                fmt::format("the {} directory {} is writable by its group (mode {:04o}): run "
                            "`chmod g-w {}`, or set KERNEL_HUB_SHARED_CACHE=1 if the {} is "
                            "meant to be shared by that group",
                            what, dir.string(), st.st_mode & 07777, dir.string(), what));
  }
}

void guard_root(const stdfs::path& dir, Sharing sharing, std::string_view what) {
  const stdfs::path root = normal_absolute(dir);
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) {
    if (errno != ENOENT) throw_errno(fmt::format("cannot read the {} {}", what, root.string()));
    // Create it (and missing parents) with the private or shared mode, whatever the umask.
    stdfs::path built;
    for (const auto& part : root) {
      built /= part;
      if (::mkdir(built.c_str(), dir_mode(sharing)) == 0) {
        if (::chmod(built.c_str(), dir_mode(sharing)) != 0)
          throw_errno(fmt::format("cannot set the mode of {}", built.string()));
      } else if (errno != EEXIST) {
        throw_errno(fmt::format("cannot create the {} {}", what, built.string()));
      }
    }
    if (::stat(root.c_str(), &st) != 0)
      throw_errno(fmt::format("cannot read the {} {}", what, root.string()));
  }
  check_dir_owner(root, st, sharing, what);
  std::lock_guard lock(g_mutex);
  for (auto& r : g_roots) {
    if (r.root == root) {
      r.sharing = sharing;
      r.what = std::string(what);
      return;
    }
  }
  g_roots.push_back({root, sharing, std::string(what)});
}

void unguard_all_roots_for_tests() {
  std::lock_guard lock(g_mutex);
  g_roots.clear();
}

std::optional<GuardedRootInfo> guarded_root_of(const stdfs::path& path) {
  const stdfs::path p = normal_absolute(path);
  std::lock_guard lock(g_mutex);
  const GuardedRootInfo* best = nullptr;
  size_t best_len = 0;
  for (const auto& r : g_roots) {
    if (!components_below(r.root, p)) continue;
    size_t len = r.root.native().size();
    if (!best || len > best_len) best = &r, best_len = len;  // the innermost root wins
  }
  if (!best) return std::nullopt;
  return *best;
}

std::optional<ParentDir> open_parent(const stdfs::path& path, bool create) {
  if (auto root = guarded_root_of(path)) {
    const stdfs::path p = normal_absolute(path);
    std::vector<std::string> parts = *components_below(root->root, p);
    // The root itself: its parent lies outside the guarded tree, opened as any other path.
    if (!parts.empty()) {
      ParentDir out;
      out.leaf = parts.back();
      parts.pop_back();
      if (out.leaf == "..")
        throw Error(ErrorKind::kRefused, fmt::format("{}: '..' is not allowed", p.string()));
      out.dir = walk(*root, parts, p, create);
      if (!out.dir) return std::nullopt;
      out.guarded = true;
      out.sharing = root->sharing;
      return out;
    }
  }
  stdfs::path parent = path.parent_path().empty() ? stdfs::path(".") : path.parent_path();
  if (create) {
    std::error_code ec;
    stdfs::create_directories(parent, ec);
    if (ec)
      throw Error(ErrorKind::kIo,
                  "cannot create directory " + parent.string() + ": " + ec.message());
  }
  ParentDir out;
  out.dir = Fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!out.dir) {
    if (errno == ENOENT || errno == ENOTDIR) {
      errno = ENOENT;
      return std::nullopt;
    }
    throw_errno("cannot open directory " + parent.string());
  }
  out.leaf = path.filename().string();
  return out;
}

std::optional<Fd> open_dir(const stdfs::path& dir, bool create) {
  if (auto root = guarded_root_of(dir)) {
    const stdfs::path p = normal_absolute(dir);
    Fd fd = walk(*root, *components_below(root->root, p), p, create);
    if (!fd) return std::nullopt;
    return fd;
  }
  if (create) {
    std::error_code ec;
    stdfs::create_directories(dir, ec);
    if (ec)
      throw Error(ErrorKind::kIo, "cannot create directory " + dir.string() + ": " + ec.message());
  }
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    throw_errno("cannot open directory " + dir.string());
  }
  return fd;
}

Sharing cache_sharing_from_env() {
  return env_flag("KERNEL_HUB_SHARED_CACHE") ? Sharing::kShared : Sharing::kPrivate;
}

}  // namespace kh::fs
