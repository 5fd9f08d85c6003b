#include "hub/archive_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

#include "hub/error.h"

namespace kh {

namespace {

constexpr const char* kLibrary = "libarchive.so.13";

ArchiveApi load() {
  // RTLD_LOCAL: libarchive's symbols stay out of the global namespace.
  void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    throw Error(ErrorKind::kUnsupported,
                std::string(kLibrary) + " not found: install Debian's libarchive13 (reading and " +
                    "writing package archives needs it)" +
                    (why ? std::string(" [") + why + "]" : std::string()));
  }
  ArchiveApi api{};
  auto resolve = [&](const char* name, auto& slot) {
    void* sym = ::dlsym(lib, name);
    if (sym == nullptr) {
      ::dlclose(lib);
      throw Error(ErrorKind::kUnsupported,
                  std::string(kLibrary) + " has no " + name +
                      ": it is too old; install a current Debian libarchive13 (3.6 or newer)");
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(sym);
  };
#define KH_ARCHIVE_RESOLVE(field) resolve("archive_" #field, api.field)
  KH_ARCHIVE_RESOLVE(read_new);
  KH_ARCHIVE_RESOLVE(read_support_format_tar);
  KH_ARCHIVE_RESOLVE(read_support_filter_zstd);
  KH_ARCHIVE_RESOLVE(read_support_filter_none);
  KH_ARCHIVE_RESOLVE(read_open_filename);
  KH_ARCHIVE_RESOLVE(read_next_header);
  KH_ARCHIVE_RESOLVE(read_data_block);
  KH_ARCHIVE_RESOLVE(read_free);
  KH_ARCHIVE_RESOLVE(write_new);
  KH_ARCHIVE_RESOLVE(write_set_format_pax_restricted);
  KH_ARCHIVE_RESOLVE(write_add_filter_zstd);
  KH_ARCHIVE_RESOLVE(write_set_filter_option);
  KH_ARCHIVE_RESOLVE(write_open_fd);
  KH_ARCHIVE_RESOLVE(write_header);
  KH_ARCHIVE_RESOLVE(write_data);
  KH_ARCHIVE_RESOLVE(write_close);
  KH_ARCHIVE_RESOLVE(write_free);
  KH_ARCHIVE_RESOLVE(error_string);
  KH_ARCHIVE_RESOLVE(entry_new);
  KH_ARCHIVE_RESOLVE(entry_free);
  KH_ARCHIVE_RESOLVE(entry_pathname);
  KH_ARCHIVE_RESOLVE(entry_hardlink);
  KH_ARCHIVE_RESOLVE(entry_symlink);
  KH_ARCHIVE_RESOLVE(entry_filetype);
  KH_ARCHIVE_RESOLVE(entry_perm);
  KH_ARCHIVE_RESOLVE(entry_size);
  KH_ARCHIVE_RESOLVE(entry_size_is_set);
  KH_ARCHIVE_RESOLVE(entry_sparse_count);
  KH_ARCHIVE_RESOLVE(entry_set_pathname);
  KH_ARCHIVE_RESOLVE(entry_set_filetype);
  KH_ARCHIVE_RESOLVE(entry_set_perm);
  KH_ARCHIVE_RESOLVE(entry_set_mtime);
  KH_ARCHIVE_RESOLVE(entry_set_uid);
  KH_ARCHIVE_RESOLVE(entry_set_gid);
  KH_ARCHIVE_RESOLVE(entry_set_uname);
  KH_ARCHIVE_RESOLVE(entry_set_gname);
  KH_ARCHIVE_RESOLVE(entry_set_size);
#undef KH_ARCHIVE_RESOLVE
  // The library stays loaded for the life of the process.
  return api;
}

}  // namespace

const ArchiveApi& archive_api() {
  static std::once_flag once;
  static ArchiveApi api{};
  // A throwing load leaves the flag unset, so a later call tries again.
  std::call_once(once, [] { api = load(); });
  return api;
}

}  // namespace kh
