#include "hub/base/cache_layout.h"

#include <pwd.h>
#include <unistd.h>

#include <string>

#include "hub/base/env.h"
#include "hub/base/error.h"

namespace kh::cache_layout {

std::filesystem::path default_root() {
  if (std::string v = env_string("KERNEL_HUB_CACHE"); !v.empty()) return v;
  // The XDG spec says relative paths in XDG_CACHE_HOME are invalid and must be ignored.
  if (std::string v = env_string("XDG_CACHE_HOME"); !v.empty() && v.front() == '/') {
    return std::filesystem::path(v) / "kernel-hub";
  }
  std::string home = env_string("HOME");
  if (home.empty()) {
    if (const struct passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) home = pw->pw_dir;
  }
  if (home.empty()) {
    throw Error(ErrorKind::kInvalidInput,
                "cannot find a cache directory: set KERNEL_HUB_CACHE (or HOME)");
  }
  return std::filesystem::path(home) / ".cache" / "kernel-hub";
}

}  // namespace kh::cache_layout
