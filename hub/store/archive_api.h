// libarchive, loaded on first use. Linking it maps libxml2, ICU and compression libraries into
// every process; dlopen defers that cost to the first archive actually read or written.
#pragma once

#include <archive.h>
#include <archive_entry.h>

namespace kh {

// The libarchive functions hub/store/archive.cpp calls, each named once: X(f) stands for
// archive_<f>, ArchiveApi's field f.
#define KH_ARCHIVE_FUNCTIONS(X)      \
  X(read_new)                        \
  X(read_support_format_tar)         \
  X(read_support_filter_zstd)        \
  X(read_support_filter_none)        \
  X(read_open_filename)              \
  X(read_next_header)                \
  X(read_data_block)                 \
  X(read_free)                       \
  X(write_new)                       \
  X(write_set_format_pax_restricted) \
  X(write_add_filter_zstd)           \
  X(write_set_filter_option)         \
  X(write_open_fd)                   \
  X(write_header)                    \
  X(write_data)                      \
  X(write_close)                     \
  X(write_free)                      \
  X(error_string)                    \
  X(entry_new)                       \
  X(entry_free)                      \
  X(entry_pathname)                  \
  X(entry_hardlink)                  \
  X(entry_symlink)                   \
  X(entry_filetype)                  \
  X(entry_perm)                      \
  X(entry_size)                      \
  X(entry_size_is_set)               \
  X(entry_sparse_count)              \
  X(entry_set_pathname)              \
  X(entry_set_filetype)              \
  X(entry_set_perm)                  \
  X(entry_set_mtime)                 \
  X(entry_set_uid)                   \
  X(entry_set_gid)                   \
  X(entry_set_uname)                 \
  X(entry_set_gname)                 \
  X(entry_set_size)

// Each pointer has the exact type of the function declared in <archive.h> / <archive_entry.h>,
// so a signature can never drift.
struct ArchiveApi {
#define KH_ARCHIVE_FIELD(f) decltype(&archive_##f) f;
  KH_ARCHIVE_FUNCTIONS(KH_ARCHIVE_FIELD)
#undef KH_ARCHIVE_FIELD
};

// Loads libarchive.so.13 once per process (thread-safe) and returns its function table. Throws
// kh::Error(kUnsupported) naming the library or symbol and what to install when it is missing;
// a later call tries again.
const ArchiveApi& archive_api();

}  // namespace kh
