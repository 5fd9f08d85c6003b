#include "hub/base/cache_layout.h"

#include <pwd.h>
#include <unistd.h>

#include <string>

#include "hub/base/env.h"
#include "hub/base/error.h"

namespace kh::cache_layout {

std::filesystem::path default_root() {
  return user_dir("KERNEL_HUB_CACHE", "XDG_CACHE_HOME", ".cache", "kernel-hub");
}

}  // namespace kh::cache_layout
