#include "hub/store/archive_api.h"

#include "hub/base/dynamic_library.h"

namespace kh {

namespace {

ArchiveApi load() {
  DynamicLibrary lib("libarchive.so.13",
                     "install Debian's libarchive13 (reading and writing package archives needs "
                     "it)");
  ArchiveApi api{};
#define KH_ARCHIVE_RESOLVE(f) lib.resolve("archive_" #f, api.f);
  KH_ARCHIVE_FUNCTIONS(KH_ARCHIVE_RESOLVE)
#undef KH_ARCHIVE_RESOLVE
  return api;
}

}  // namespace

const ArchiveApi& archive_api() {
  return load_once<ArchiveApi>(load);
}

}  // namespace kh
