#include "loader/module.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/log.h"
#include "loader/verified_file.h"

namespace kh {

namespace {

// Serializes dlopen (glibc's loader lock is not visible to TSan) and guards the registry.
std::mutex& load_mutex() {
  static std::mutex m;
  return m;
}

// Loaded modules by canonical path; never freed, like the libraries themselves.
std::map<std::string, const LoadedModule*>& registry() {
  static auto* r = new std::map<std::string, const LoadedModule*>();
  return *r;
}

// Every library dlopen mapped, by handle, refused ones included: the digest verified before it
// was opened, and its descriptor, held for the life of the process: glibc knows a library by the
// name it was opened with, /proc/self/fd/N, and would hand the old handle back to a later dlopen
// of a reused N, running the earlier library's code in place of the one just verified. One
// descriptor a handle: loading the same library again holds no new one.
std::map<void*, std::shared_ptr<VerifiedFile>>& mapped_libraries() {
  static auto* mapped = new std::map<void*, std::shared_ptr<VerifiedFile>>();
  return *mapped;
}

// Whether `handle` (one this loader did not map: the application loaded it itself) maps the
// file open as `fd`: judged by the inode actually mapped where the library's dynamic section is
// (/proc/self/maps), never by its name, which may since name another file (a closed
// /proc/self/fd/N now naming ours, say).
bool maps_same_file(void* handle, int fd) {
  link_map* map = nullptr;
  struct stat ours {};
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_ld || ::fstat(fd, &ours) != 0)
    return false;
  const auto at = reinterpret_cast<uintptr_t>(map->l_ld);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t start = 0, end = 0;
    unsigned dev_major = 0, dev_minor = 0;
    unsigned long long inode = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %*s %*s %x:%x %llu", &start, &end,
                    &dev_major, &dev_minor, &inode) != 5)
      continue;
    if (at < start || at >= end) continue;
    return inode == ours.st_ino && dev_major == major(ours.st_dev) &&
           dev_minor == minor(ours.st_dev);
  }
  return false;
}

Check failed(const std::string& rule, const std::string& file, const std::string& what) {
  return {rule, false, fmt::format("{}: refused by rule {}: {}", file, rule, what)};
}

}  // namespace

LoadResult try_load_module(const std::filesystem::path& library,
                           const std::optional<Digest>& expected) {
  // One descriptor from here on: what is preflighted and dlopen'ed is what was hashed, whatever
  // happens to the path meanwhile (loader/verified_file.h).
  VerifiedFile verified;
  try {
    verified = open_verified(library, expected);
  } catch (const Error& e) {
    return {{library.string(),
             {failed(e.kind() == ErrorKind::kIntegrity ? "digest" : "readable", library.string(),
                     e.what())}},
            nullptr};
  }
  const std::string file = library.string();
  // Per file and content: a path whose bytes changed is a different module, never the old one.
  const std::string key = file + "\n" + verified.digest.str();

  std::lock_guard lock(load_mutex());
  if (auto it = registry().find(key); it != registry().end()) {
    LoadResult cached{{file, {{"loaded", true, "already loaded in this process"}}}, it->second};
    return cached;
  }

  std::string bytes;
  try {
    bytes = verified.read_all(uint64_t{1} << 30);
  } catch (const Error& e) {
    return {{file, {failed("readable", file, e.what())}}, nullptr};
  }
  if (sha256_of(bytes) != verified.digest)  // changed under us (a shared cache's owner)
    return {{file, {failed("digest", file, "the file changed while it was being loaded")}},
            nullptr};
  LoadResult result{
      preflight_elf(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), file),
      nullptr};
  auto& checks = result.report.checks;
  if (!result.report.ok()) return result;

  // The preflight passed: only now may the library's constructors run. dlopen the descriptor,
  // not the name: /proc/self/fd/N maps the very inode (or sealed copy) that was checked. A name
  // or inode the link map already holds gives back that library: fine when it is these bytes
  // (the same file linked elsewhere), refused when it is anything else.
  std::shared_ptr<VerifiedFile> mapped;
  if (void* known = dlopen(verified.fd_path().c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(known);  // drops only the reference NOLOAD took
    auto it = mapped_libraries().find(known);
    const bool same = it != mapped_libraries().end() ? it->second->digest == verified.digest
                                                     : maps_same_file(known, verified.fd.get());
    if (!same) {
      checks.push_back(failed("dlopen", file,
                              fmt::format("{} already names a loaded library with other content "
                                          "(a reused descriptor number or file); dlopen would "
                                          "return that library, not the one verified",
                                          verified.fd_path())));
      return result;
    }
    if (it != mapped_libraries().end()) mapped = it->second;
  }
  dlerror();
  void* handle = dlopen(verified.fd_path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    const char* why = dlerror();
    checks.push_back(failed("dlopen", file,
                            fmt::format("{}; an unresolved symbol means the library needs "
                                        "something this host does not provide",
                                        why ? why : "unknown error")));
    return result;
  }
  checks.push_back({"dlopen", true, "loaded with RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE"});
  // Never dlclose: RTLD_NODELETE keeps it mapped, and ops or kernels may still be in flight.
  // Nor close its descriptor, whatever is refused below (mapped_libraries()).
  if (!mapped) {
    mapped = std::make_shared<VerifiedFile>(std::move(verified));
    mapped_libraries().emplace(handle, mapped);
  }

  dlerror();
  auto entry = reinterpret_cast<kh_module_v1_fn>(dlsym(handle, KH_MODULE_ENTRY_NAME));
  if (!entry) {
    checks.push_back(failed("entry-symbol", file, "dlsym(kh_module_v1) found nothing"));
    return result;
  }

  auto module = std::make_unique<LoadedModule>();
  module->path = library;
  module->digest = mapped->digest;
  module->host = make_host_context({library, library.parent_path(), {}, {}, {}});
  module->file = mapped;  // the mapping's descriptor
  clear_last_op_error();
  const kh_module_v1_t* table = entry(&module->host->table);
  if (!table) {
    std::string why = last_op_error().empty() ? "no message" : last_op_error();
    checks.push_back(failed("entry-call", file,
                            fmt::format("kh_module_v1 returned NULL ({}); the package may need a "
                                        "newer kernel-hub loader",
                                        why)));
    return result;
  }
  checks.push_back({"entry-call", true, "kh_module_v1 returned a table"});

  read_module_table(table, file, checks, module->view);
  if (!result.report.ok()) return result;
  module->host->package.name = module->view.name;
  module->host->package.version = module->view.version;
  if (module->view.abi_minor > KH_ABI_MINOR)
    log_line(kLogDebug, fmt::format("{}: package ABI minor {} is newer than the loader's {}; "
                                    "newer fields are ignored",
                                    file, module->view.abi_minor, KH_ABI_MINOR));
  result.module = module.release();
  registry()[key] = result.module;
  return result;
}

const LoadedModule& load_module(const std::filesystem::path& library,
                                const std::optional<Digest>& expected) {
  LoadResult r = try_load_module(library, expected);
  if (!r.module) throw Error(ErrorKind::kRefused, r.report.failures());
  return *r.module;
}

}  // namespace kh
