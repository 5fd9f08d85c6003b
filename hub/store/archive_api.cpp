#include "hub/store/archive_api.h"

#include "hub/base/dynamic_library.h"

namespace kh {

namespace {

ArchiveApi load() {
  DynamicLibrary lib("libarchive.so.13",
                     "install Debian's libarchive13 (reading and writing package archives needs "
                     "it)");
  ArchiveApi api{};
#define KH_ARCHIVE_RESOLVE(field) lib.resolve("archive_" #field, api.field)
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
  return api;
}

}  // namespace

const ArchiveApi& archive_api() {
  return load_once<ArchiveApi>(load);
}

}  // namespace kh
