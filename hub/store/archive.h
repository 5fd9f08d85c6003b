// Package archives: tar + zstd. Extraction refuses absolute paths, "..", links of any kind,
// device files and FIFOs, odd path characters, and archives over size/entry limits; it
// writes into a fresh temp directory that is renamed into place only when every entry
// passed, so a refused archive leaves nothing behind. Creation is reproducible: sorted
// entries, zero timestamps and owners, normalized modes.
#pragma once

#include <cstdint>
#include <filesystem>

namespace kh {

struct ArchiveLimits {
  uint64_t max_total_bytes = 4ull << 30;  // sum of entry sizes
  uint64_t max_entry_bytes = 2ull << 30;
  uint32_t max_entries = 10000;
  uint32_t max_depth = 16;
  uint32_t max_path_length = 512;
};

// Extracts archive into dest, which must not exist; its parent must. Files are 0444
// (0555 for .so and executables), directories 0555. Throws kRefused naming the entry and
// the rule, kInvalidInput for a damaged archive.
void extract_archive(const std::filesystem::path& archive, const std::filesystem::path& dest,
                     const ArchiveLimits& limits = {});

// Writes a reproducible tar+zstd of every regular file and directory under src_dir to
// out (atomically). Symlinks and special files in src_dir are refused.
void create_archive(const std::filesystem::path& src_dir, const std::filesystem::path& out);

}  // namespace kh
