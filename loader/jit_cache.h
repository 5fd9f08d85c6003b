// The JIT cache: NVRTC output kept in the store's directory as <dir>/<key-hex>.cubin.
//
// Key = SHA-256 over a length-prefixed tuple (key format version, ABI version, source, included
// headers, sorted options, NVRTC version, target), so any input that can change the cubin
// changes the key and no entry is ever invalidated in place.
// Entry = header {magic, format version, payload size, sha256(payload)} + payload, verified on
// every read: a damaged or truncated entry is a miss, is deleted and rebuilt.
// Writes are atomic (temp file + rename); readers never lock. A miss takes an OFD lock
// (<dir>/locks/<key-hex>.lock) and checks again before building, so N processes asking for one
// key build it once.
//
// Whose entries: the key is a hash of the inputs, not of the output, and the checksum is the
// entry's own, so an entry is only as good as whoever could write it. A private cache (one
// user) keeps entries in the directory given. In the shared mode (the directory lies beneath a
// guarded root shared by a group, or KERNEL_HUB_SHARED_CACHE is set) each user gets a private
// subdirectory <dir>/u<uid>/, mode 0700: a group member can rename it away (its parent is
// group-writable) and put their own in its place, but not write into it. So every read opens
// that subdirectory, checks through the descriptor that this user owns it and no one else may
// write it, and opens the entry relative to it (no link followed), accepting only a regular file
// this user owns. Anything else is never returned: a subdirectory owned by another user is
// refused (kRefused naming it and its owner), a foreign entry is deleted and rebuilt.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hub/base/digest.h"

namespace kh {

// Bumped whenever the key's composition changes.
constexpr uint32_t kJitKeyFormatVersion = 1;

struct JitKeyInput {
  uint32_t abi_major = 0;
  std::string_view source;
  std::vector<std::pair<std::string, std::string>> headers;  // (include name, contents)
  std::vector<std::string> options;                          // sorted by jit_cache_key
  int nvrtc_major = 0;
  int nvrtc_minor = 0;
  std::string target;  // "sm_90"
};

Digest jit_cache_key(const JitKeyInput& input);

// Entry encoding, exposed for tests.
constexpr uint32_t kJitEntryFormatVersion = 1;
constexpr size_t kJitEntryHeaderSize = 56;  // magic 8, version 4, reserved 4, size 8, sha 32
std::string encode_jit_entry(std::string_view payload);
// The payload, or nullopt with `why` set when the entry is damaged.
std::optional<std::string> decode_jit_entry(std::string_view entry, std::string* why);

class JitCache {
 public:
  // `dir`: <cache root>/jit (cache_layout::kJit). In the shared mode entries live in dir/u<uid>.
  explicit JitCache(const std::filesystem::path& dir);

  // Where entries live: `dir`, or dir/u<uid> in the shared mode.
  const std::filesystem::path& dir() const { return dir_; }
  bool per_user() const { return per_user_; }
  std::filesystem::path entry_path(const Digest& key) const;

  // The verified payload, or nullopt (absent, or damaged or another user's: then deleted and
  // logged). Shared mode: kRefused when dir() is not this user's private directory.
  std::optional<std::string> lookup(const Digest& key) const;
  // Writes the entry atomically.
  void store(const Digest& key, std::string_view payload) const;

  struct Result {
    std::string payload;
    bool built = false;  // this call ran `build`
  };
  // Lookup; on a miss, under the key's cross-process lock: lookup again, else build + store.
  Result get_or_build(const Digest& key, const std::function<std::string()>& build) const;

 private:
  std::optional<std::string> read_entry(const Digest& key) const;
  std::optional<std::string> read_private_entry(const Digest& key) const;

  std::filesystem::path dir_;
  bool per_user_ = false;
};

}  // namespace kh
