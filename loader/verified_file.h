// Load what was verified: a package file is opened once (no symlink followed beneath a guarded
// root, regular files only), hashed from that descriptor, and from then on used only through it:
// the host library is dlopen'ed as /proc/self/fd/N (the same inode, whatever happens to the name)
// and device code is read from it. Where the file belongs to another user (a shared cache, whose
// owner could rewrite it in place), its bytes are copied into a sealed memfd while being hashed,
// and the copy is what gets used.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "hub/base/digest.h"
#include "hub/base/guarded_root.h"

namespace kh {

struct VerifiedFile {
  fs::Fd fd;                   // what was hashed; kept open for as long as it is used
  std::filesystem::path path;  // where it was opened, for messages
  Digest digest;
  uint64_t size = 0;
  bool sealed_copy = false;  // fd is a sealed memfd holding the bytes that were hashed

  // "/proc/self/fd/N": a name for this exact descriptor (dlopen).
  std::string fd_path() const;
  // The whole content, read through the descriptor (at most `max_size` bytes, else kRefused).
  std::string read_all(uint64_t max_size = UINT64_MAX) const;
};

// Opens and hashes `path`. Throws kh::Error: kNotFound when absent, kRefused for a link or a
// non-regular file, kIntegrity (naming the file, both digests and what to do) when `expected`
// is given and differs.
VerifiedFile open_verified(const std::filesystem::path& path,
                           const std::optional<Digest>& expected = std::nullopt);

}  // namespace kh
