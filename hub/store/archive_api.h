// libarchive, loaded on first use. Linking it maps libxml2, ICU and compression libraries into
// every process; dlopen defers that cost to the first archive actually read or written.
#pragma once

#include <archive.h>
#include <archive_entry.h>

namespace kh {

// The libarchive functions hub/store/archive.cpp calls. Each pointer has the exact type of the
// function declared in <archive.h> / <archive_entry.h>, so a signature can never drift.
struct ArchiveApi {
  decltype(&archive_read_new) read_new;
  decltype(&archive_read_support_format_tar) read_support_format_tar;
  decltype(&archive_read_support_filter_zstd) read_support_filter_zstd;
  decltype(&archive_read_support_filter_none) read_support_filter_none;
  decltype(&archive_read_open_filename) read_open_filename;
  decltype(&archive_read_next_header) read_next_header;
  decltype(&archive_read_data_block) read_data_block;
  decltype(&archive_read_free) read_free;
  decltype(&archive_write_new) write_new;
  decltype(&archive_write_set_format_pax_restricted) write_set_format_pax_restricted;
  decltype(&archive_write_add_filter_zstd) write_add_filter_zstd;
  decltype(&archive_write_set_filter_option) write_set_filter_option;
  decltype(&archive_write_open_fd) write_open_fd;
  decltype(&archive_write_header) write_header;
  decltype(&archive_write_data) write_data;
  decltype(&archive_write_close) write_close;
  decltype(&archive_write_free) write_free;
  decltype(&archive_error_string) error_string;
  decltype(&archive_entry_new) entry_new;
  decltype(&archive_entry_free) entry_free;
  decltype(&archive_entry_pathname) entry_pathname;
  decltype(&archive_entry_hardlink) entry_hardlink;
  decltype(&archive_entry_symlink) entry_symlink;
  decltype(&archive_entry_filetype) entry_filetype;
  decltype(&archive_entry_perm) entry_perm;
  decltype(&archive_entry_size) entry_size;
  decltype(&archive_entry_size_is_set) entry_size_is_set;
  decltype(&archive_entry_sparse_count) entry_sparse_count;
  decltype(&archive_entry_set_pathname) entry_set_pathname;
  decltype(&archive_entry_set_filetype) entry_set_filetype;
  decltype(&archive_entry_set_perm) entry_set_perm;
  decltype(&archive_entry_set_mtime) entry_set_mtime;
  decltype(&archive_entry_set_uid) entry_set_uid;
  decltype(&archive_entry_set_gid) entry_set_gid;
  decltype(&archive_entry_set_uname) entry_set_uname;
  decltype(&archive_entry_set_gname) entry_set_gname;
  decltype(&archive_entry_set_size) entry_set_size;
};

// Loads libarchive.so.13 once per process (thread-safe) and returns its function table. Throws
// kh::Error(kUnsupported) naming the library or symbol and what to install when it is missing;
// a later call tries again.
const ArchiveApi& archive_api();

}  // namespace kh
