// Package archives: tar + zstd. Extraction refuses absolute paths, "..", links of any kind,
// device files and FIFOs, odd path characters, and archives over size/entry limits; it
// writes into a fresh temp directory that is renamed into place only when every entry
// passed, so a refused archive leaves nothing behind. Creation is reproducible: sorted
// entries, zero timestamps and owners, normalized modes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace kh {

struct ArchiveLimits {
  uint64_t max_total_bytes = 4ull << 30;  // sum of entry sizes
  uint64_t max_entry_bytes = 2ull << 30;
  uint32_t max_entries = 10000;
  uint32_t max_depth = 16;
  uint32_t max_path_length = 512;
};

// The bytes every archive one command extracts may add up to: ArchiveLimits bound one layer, this
// bounds a command that unpacks many (a hub cannot make one kernelize or pull expand without
// bound). Charged with the bytes actually written, refused ones included. One per command, used
// by one thread at a time.
struct UnpackBudget {
  static constexpr uint64_t kDefault = 8ull << 30;
  static constexpr const char* kVariable = "KERNEL_HUB_UNPACK_BUDGET";
  uint64_t limit = kDefault;
  uint64_t used = 0;
  // The limit from KERNEL_HUB_UNPACK_BUDGET (bytes, >= 1), else kDefault; kInvalidInput naming
  // the variable when it is not a number.
  static uint64_t limit_from_env();
};

// Extracts archive into dest, which must not exist; its parent must. Files are 0444
// (0555 for .so and executables), directories 0555. Throws kRefused naming the entry and
// the rule (or the budget, when the bytes written would exceed it), kInvalidInput for a damaged
// archive. On any failure nothing is left at dest.
void extract_archive(const std::filesystem::path& archive, const std::filesystem::path& dest,
                     const ArchiveLimits& limits = {}, UnpackBudget* budget = nullptr);

// The bytes of the regular file `name` at the archive's root (as extraction would write it),
// nullopt when there is none; read with the same path rules, so the two cannot disagree. Throws
// kRefused for a duplicate or an entry over max_bytes, kInvalidInput for a damaged archive.
std::optional<std::string> read_archive_member(const std::filesystem::path& archive,
                                               std::string_view name, uint64_t max_bytes,
                                               const ArchiveLimits& limits = {});

// Writes a reproducible tar+zstd of every regular file and directory under src_dir to
// out (atomically). Symlinks and special files in src_dir are refused.
void create_archive(const std::filesystem::path& src_dir, const std::filesystem::path& out);

}  // namespace kh
