// Lock files (kernels.lock): every ref of a KernelConfig pinned to the index digest its tag
// resolved to and, per target device, the chosen variant manifest and its package layer. Under a
// lock no other digest is accepted. Schema: manifests/schemas/lock.schema.json.
//
//   {"version": 1,
//    "entries": [{"ref": "org/norm@v1", "hub": "<hub id>", "index_digest": "sha256:...",
//                 "targets": {"cuda:sm_90:cuda_13.0:linux/amd64": {
//                     "manifest_digest": "sha256:...", "layer_digest": "sha256:...",
//                     "layer_size": 12345}}}]}
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/digest.h"
#include "hub/oci/ref.h"

namespace kh {

struct LockTarget {
  Digest manifest_digest;
  Digest layer_digest;
  int64_t layer_size = 0;
  bool operator==(const LockTarget&) const = default;
};

struct LockEntry {
  Ref ref;          // as written in the config (tag or digest)
  std::string hub;  // HubAddress::id() of the hub it was resolved on
  Digest index_digest;
  std::map<std::string, LockTarget> targets;  // Device::str() -> pinned variant
  bool operator==(const LockEntry&) const = default;
};

struct LockFile {
  static constexpr int kVersion = 1;
  std::vector<LockEntry> entries;  // sorted by (ref, hub) when serialized

  // Parses and validates: version 1, digests well formed, refs valid, no ref twice for one hub.
  // Errors are kInvalidInput naming `what` and the JSON path.
  static LockFile parse(std::string_view json_text, std::string_view what = "lock file");
  static LockFile load(const std::filesystem::path& path);
  // Canonical JSON (sorted, 2-space indent, trailing newline).
  std::string serialize() const;
  // Writes atomically (temp file, fsync, rename).
  void save(const std::filesystem::path& path) const;

  // The entry for ref (compared by its text, e.g. "org/norm@v1"); nullptr when absent.
  const LockEntry* find(const Ref& ref) const;
  // Adds or replaces the entry with the same ref.
  void put(LockEntry entry);
  bool operator==(const LockFile&) const = default;
};

// Lock checks. All throw kh::Error naming the ref, what was expected and what was found:
// kNotFound when the lock has no entry (or no target for the device): re-run `kernel-hub lock`;
// kIntegrity when a digest differs: the hub serves other bytes than were locked.
const LockEntry& require_locked(const LockFile& lock, const Ref& ref);
void check_locked_index(const LockEntry& entry, std::string_view hub, const Digest& found);
const LockTarget& require_locked_target(const LockEntry& entry, const std::string& device);
void check_locked_digest(const LockEntry& entry, std::string_view what, const Digest& expected,
                         const Digest& found);

}  // namespace kh
