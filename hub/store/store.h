// The content-addressed cache ($KERNEL_HUB_CACHE, default $XDG_CACHE_HOME/kernel-hub or
// ~/.cache/kernel-hub):
//   blobs/sha256/<hex>          immutable, verified, 0444
//   tmp/<hex>.<pid>.<rand>.part in-flight downloads (swept when stale)
//   refs/<hub-id>/<repo>/<tag>  {"digest", "resolved_at"} JSON, replaced by rename
//   unpacked/<layer-hex>/       extracted package, read-only
//   signatures/<index-hex>.json signature envelopes seen for an index (each verified on use)
//   trust/<hub-id>/<repo>/<tag>.json  highest signature serial accepted (rollback protection)
//   locks/<name>.lock           single-flight locks (bandwidth only, never correctness):
//                               blob-<hex> (downloads), signatures-<hex>, unpack-<hex>, ...
//   CACHEDIR.TAG
// Every write is temp -> fsync -> rename. A killed process leaves at most a temp file,
// which no reader mistakes for an entry.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hub/base/fs.h"
#include "hub/oci/graph.h"
#include "hub/oci/oci.h"
#include "hub/store/archive.h"
#include "hub/transport/blob_sink.h"

namespace kh {

struct RefRecord {
  std::string hub_id;
  std::string repo;
  std::string tag;
  Digest digest;
  int64_t resolved_at = 0;  // unix seconds
};

// Streams one blob into a temp file while hashing; commit() checks size and digest and
// only then renames into blobs/. A blob that fails the check is never stored.
class BlobWriter : public BlobSink {
 public:
  ~BlobWriter() override = default;
  bool verifies_digest() const override { return true; }
  // Throws kIntegrity (temp removed) when size or digest differ from the descriptor.
  virtual void commit() = 0;
};

struct StoreEntryDamage {
  std::filesystem::path path;
  std::string problem;
};

struct GcOptions {
  std::optional<uint64_t> max_size;     // shrink the cache to at most this many bytes
  std::optional<int64_t> older_than_s;  // remove entries unused for this long
  int64_t grace_s = 3600;               // never remove anything younger (in-flight pulls)
  bool dry_run = false;
  oci::GraphLimits graph_limits;  // per ref: a root over them fails gc (kRefused), removing nothing
};

struct GcResult {
  uint64_t removed_bytes = 0;
  uint64_t removed_entries = 0;
  uint64_t kept_bytes = 0;
};

class Store {
 public:
  // Opens (creating if needed) a cache at root, refusing one others could write
  // (hub/base/guarded_root.h). Deletes nothing: stale temp files are swept by the first write of
  // this Store (and by gc), so read-only commands (ls, verify, gc --dry-run) modify nothing.
  explicit Store(std::filesystem::path root);
  // $KERNEL_HUB_CACHE, else $XDG_CACHE_HOME/kernel-hub, else ~/.cache/kernel-hub.
  static std::filesystem::path default_root();

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path blob_path(const Digest& d) const;
  bool has_blob(const Digest& d) const;
  // Whether the blob is stored (its content hashing to its digest). A damaged one (a disk error,
  // a hand edit) is removed, with a warning, so that it is fetched again; intact content whose
  // size the descriptor misstates is kIntegrity naming the descriptor, and stays.
  bool has_intact_blob(const oci::Descriptor& d);

  // Reads a small blob and verifies its digest (a damaged entry is removed and reported
  // as missing). Returns nullopt when absent.
  std::optional<std::string> read_blob(const Digest& d, uint64_t max_size) const;
  // Stores bytes after checking them against the descriptor (kIntegrity otherwise).
  void put_blob(const oci::Descriptor& desc, std::string_view bytes);
  // Starts a streaming write for a download.
  std::unique_ptr<BlobWriter> begin_blob(const oci::Descriptor& desc);
  // Throws kIo naming the need and what is free when the cache's file system has less than
  // `bytes` free: a batch is checked as a whole before it starts (each blob alone fitting does
  // not mean they all do).
  void require_free_space(uint64_t bytes, const std::string& what) const;

  // Single-flight lock for a blob digest or any key (JIT compiles, unpacking).
  fs::FileLock lock(const std::string& key);
  fs::FileLock lock(const std::string& key, const fs::LockWait& wait);
  std::optional<fs::FileLock> try_lock(const std::string& key);

  // Single flight for one blob or manifest across the processes sharing this cache (one
  // machine, or a directory shared between namespaces or hosts): whoever holds a digest's lock
  // (locks/blob-<hex>.lock) downloads it; the others wait and then read the stored copy, which
  // is verified as every read of the cache is. claim_blob returns the lock to hold while
  // downloading, or nullopt when the blob is in the store (perhaps after waiting, as `wait`
  // says, for the process that was downloading it). A holder that dies releases its lock and
  // leaves at most a temp file, never a blob; its waiters then claim the blob in turn.
  std::optional<fs::FileLock> claim_blob(const Digest& d, const fs::LockWait& wait);
  // The same without waiting: nullopt when the blob is stored or another process holds it.
  std::optional<fs::FileLock> try_claim_blob(const Digest& d);

  void write_ref(const RefRecord& r);
  std::optional<RefRecord> read_ref(const std::string& hub_id, const std::string& repo,
                                    const std::string& tag) const;
  std::vector<RefRecord> list_refs() const;

  // The signature set (trust::SignatureSet JSON) kept for an index. Not content-addressed and
  // not trusted: every envelope in it is verified whenever it is used, so a damaged or forged
  // file can only make a package count as unsigned.
  std::optional<std::string> read_signatures(const Digest& index) const;
  void write_signatures(const Digest& index, std::string_view set_json);
  // When the kept set was last written (the file's time, in nanoseconds since the epoch): the
  // hub writes it after every fetch, so this says how fresh the hub's answer is.
  std::optional<int64_t> signatures_written_at_ns(const Digest& index) const;

  // Extracts a stored tar+zstd layer into unpacked/<hex>/ (once; safe across processes)
  // and returns that directory. Unpacked trees are derived data made when a package is about to
  // be used, after its index passed the trust check (pull unpacks nothing). The bytes written are
  // charged to `budget` when given (a tree already there costs nothing); a refusal (limits,
  // budget) names the layer and leaves nothing in unpacked/.
  std::filesystem::path unpack(const Digest& layer, const ArchiveLimits& limits = {},
                               UnpackBudget* budget = nullptr);
  std::optional<std::filesystem::path> unpacked_path(const Digest& layer) const;

  // Re-hashes every blob; returns the damaged ones (and stray files in blobs/).
  std::vector<StoreEntryDamage> verify() const;

  // Removes blobs and unpacked trees that no kept ref needs, by age or LRU to a size.
  // Roots: every ref record's index and everything it references.
  GcResult gc(const GcOptions& options);

  // Total bytes of blobs (for ls/gc).
  uint64_t blobs_size() const;

 private:
  // Once per Store, before its first write: sweeps temp files of crashed writers.
  void sweep_before_first_write();
  // Removes the damaged entry at `p` that `fd` was opened on, and only that file; says what
  // became of it, for the message ("removed it", ...).
  std::string remove_damaged(const std::filesystem::path& p, int fd) const;

  std::filesystem::path root_;
  std::once_flag swept_;
};

}  // namespace kh
