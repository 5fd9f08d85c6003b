#include "hub/data_dir.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <system_error>

#include "hub/base/env.h"
#include "hub/base/error.h"

// The data directory relative to the folder of the installed binary and of the installed
// library (from the install dirs, e.g. "../share/kernel-hub"; tools/cmake/install.cmake).
#ifndef KH_DATA_DIR_FROM_BIN
#error "KH_DATA_DIR_FROM_BIN must be defined by the build"
#endif
#ifndef KH_DATA_DIR_FROM_LIB
#error "KH_DATA_DIR_FROM_LIB must be defined by the build"
#endif

namespace kh {
namespace {

namespace stdfs = std::filesystem;

// How far up from the binary's folder a build tree's marker is looked for (tests and tools
// sit in build/<folder>/).
constexpr int kBuildTreeDepth = 3;

bool is_dir(const stdfs::path& p) {
  std::error_code ec;
  return stdfs::is_directory(p, ec);
}

// The file holding this code, with its links resolved, and whether it is the main program (the
// code is linked statically into kernel-hub and into libkernel_hub.so alike).
struct Module {
  stdfs::path file;
  bool executable = false;
};

std::optional<Module> this_module() {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&find_data_dir), &info, reinterpret_cast<void**>(&map),
              RTLD_DL_LINKMAP) == 0 ||
      map == nullptr)
    return std::nullopt;
  // The main program's link map has an empty name; its file is /proc/self/exe.
  const bool executable = map->l_name == nullptr || map->l_name[0] == '\0';
  std::error_code ec;
  stdfs::path file = stdfs::canonical(executable ? "/proc/self/exe" : map->l_name, ec);
  if (ec) return std::nullopt;
  return Module{file, executable};
}

// Why `path` may not hold the built-in key ("" when it may): it must be owned by this user, root
// or the owner of kernel-hub's own file (who decides what runs anyway: a shared install by an
// admin account), and be writable by no one else but its group (umask 002 systems). The key is
// trusted for kernel-hub/*, so a directory anyone can write (such as /tmp) must not supply it,
// nor the default hub.
std::string untrusted_because(const stdfs::path& path, uid_t code_owner) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "it cannot be examined";
  if (S_ISLNK(st.st_mode)) return "it is a symbolic link";
  if (st.st_uid != ::geteuid() && st.st_uid != 0 && st.st_uid != code_owner)
    return fmt::format("it is owned by uid {}, not by you, root or kernel-hub's owner", st.st_uid);
  if (st.st_mode & S_IWOTH) return "anyone can write it";
  return "";
}

DataDirLookup lookup() {
  DataDirLookup out;
  if (std::string env = env_string("KERNEL_HUB_DATA_DIR"); !env.empty()) {
    out.dir = stdfs::path(env);
    out.looked = "KERNEL_HUB_DATA_DIR=" + env;
    return out;
  }
  std::optional<Module> module = this_module();
  if (!module) {
    out.looked = "nowhere (the file holding kernel-hub's code could not be found)";
    return out;
  }
  const stdfs::path folder = module->file.parent_path();
  struct stat code {};
  const uid_t code_owner = ::stat(module->file.c_str(), &code) == 0 ? code.st_uid : ::geteuid();
  std::string untrusted;  // said after where it looked
  auto refused = [&](const stdfs::path& p, const std::string& why) {
    untrusted += fmt::format("; {} is not trusted: {}", p.string(), why);
  };
  const stdfs::path installed =
      (folder / (module->executable ? KH_DATA_DIR_FROM_BIN : KH_DATA_DIR_FROM_LIB))
          .lexically_normal();
  out.looked = fmt::format("{} (relative to {})", installed.string(), module->file.string());
  if (is_dir(installed / "default-hub")) {
    const std::string why = untrusted_because(installed, code_owner);
    if (why.empty()) {
      out.dir = installed;
      return out;
    }
    refused(installed, why);
  }
  stdfs::path up = folder;
  for (int i = 0; i <= kBuildTreeDepth && !up.empty(); ++i, up = up.parent_path()) {
    if (const std::string why = untrusted_because(up, code_owner); !why.empty()) {
      refused(up, why);
      break;  // nothing from here up (a shared /tmp, say)
    }
    std::error_code ec;
    if (stdfs::is_regular_file(up / kBuildTreeMarker, ec)) {
      const std::string why = untrusted_because(up / kBuildTreeMarker, code_owner);
      if (why.empty()) {
        out.dir = up;
        return out;
      }
      refused(up / kBuildTreeMarker, why);
    }
    if (up == up.root_path()) break;
  }
  out.looked += fmt::format(" and the build trees above {} (none){}", folder.string(), untrusted);
  return out;
}

}  // namespace

DataDirLookup find_data_dir() {
  return lookup();
}

stdfs::path data_dir() {
  const DataDirLookup found = find_data_dir();
  if (!found.dir) {
    throw Error(ErrorKind::kNotFound,
                fmt::format("kernel-hub's data directory (the embedded default hub and its key) "
                            "was not found: looked in {}; install kernel-hub with `cmake "
                            "--install` and run it from there, or set KERNEL_HUB_DATA_DIR to a "
                            "<prefix>/share/kernel-hub, or KERNEL_HUB_ENDPOINT to a hub",
                            found.looked));
  }
  return *found.dir;
}

}  // namespace kh
