// Offline mirrors (REFERENCE 2.3, 3.7): a layout hub directory written from the cache with
// exactly what some refs need, carried to an air-gapped machine, and either served there as a
// hub (`--hub DIR`) or imported into a cache (`kernel-hub import DIR`).
//
//   DIR/kernel-hub-mirror.json          {"format": 1, "source_hub_id", "source", "created",
//                                        "refs": [{"repo", "tag", "index_digest", "resolved_at",
//                                                  "all_variants", "variants": [...]}]}
//   DIR/<org>/<name>/oci-layout, index.json, blobs/sha256/<hex>, signatures/sha256-<hex>.json
//
// Partial indexes. A signed index is kept byte for byte (its digest is what the signatures
// bind), with EVERY variant manifest it lists (small JSON documents): Hub::info, the resolver
// and lock files see the same index and the same candidates as on the source hub. Only the
// config and layer blobs of the selected variants travel (every variant's with all_variants).
// The variants whose blobs were left out are named in kernel-hub-mirror.json; fetching one of
// them from the mirror fails with "blob file ... is missing: the layout is incomplete", and
// offline after an import it is a cache miss that names the fix. Absence is never taken for
// damage: a blob that IS in the mirror must hash to its name, or the import fails naming it.
//
// Trust is not touched here: signature sets travel as they are (the layout sidecar, the cache's
// signatures/), and every load checks them against the user's keys as it does online.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/digest.h"
#include "hub/oci/address.h"
#include "hub/oci/graph.h"
#include "hub/store/store.h"

namespace kh::mirror {

inline constexpr std::string_view kMirrorFile = "kernel-hub-mirror.json";
inline constexpr int kMirrorFormat = 1;

// One index in a mirror: under its tag, or untagged for a digest pin.
struct MirrorRef {
  std::string repo;
  std::string tag;  // empty: a digest pin (an index.json entry without a ref name)
  Digest index;
  bool all_variants = false;
  std::set<Digest> variants;  // variant manifests whose config and layer blobs are exported
  int64_t resolved_at = 0;    // when the source hub's tag pointed here (0: unknown)

  std::string str() const;  // "org/name@v1" or "org/name@sha256:..."
};

// kernel-hub-mirror.json.
struct MirrorInfo {
  int format = kMirrorFormat;
  std::string source_hub_id;  // HubAddress::id() of the hub exported from
  std::string source;         // its address as given
  int64_t created = 0;        // unix seconds
  std::vector<MirrorRef> refs;

  std::string serialize() const;
  // Strict about what import relies on: format 1, a well-formed source_hub_id (the shape
  // HubAddress::id() gives), valid repos, tags and digests. kInvalidInput naming `what`.
  static MirrorInfo parse(std::string_view text, const std::string& what);
};

// Whether text has the shape HubAddress::id() gives: "registry/...", "http/..." or "dir/...",
// [A-Za-z0-9._/-] only, no empty, "." or ".." components, at most 512 characters.
bool is_valid_hub_id_path(std::string_view text);

using NoteFn = std::function<void(const std::string&)>;

struct ExportOptions {
  bool force = false;  // replace an existing mirror (a directory holding kernel-hub-mirror.json)
  NoteFn note;         // progress lines and warnings
  oci::GraphLimits graph_limits;  // per ref; a graph over them is refused (kRefused)
};

struct ExportedRef {
  MirrorRef ref;
  size_t variants_total = 0;     // variant manifests the index lists (all exported)
  size_t variants_exported = 0;  // with their blobs
  size_t blobs = 0;              // config and layer blobs written
  uint64_t bytes = 0;            // of those blobs
  size_t signatures = 0;         // envelopes in the sidecar
};

struct ExportReport {
  std::filesystem::path dir;
  MirrorInfo info;
  std::vector<ExportedRef> refs;
  size_t files = 0;    // distinct blob files written (indexes, manifests, configs, layers)
  uint64_t bytes = 0;  // their total size
};

// Writes a mirror of `refs` to dir from the store alone (everything must be cached: pull it
// first; a miss is kNotFound naming the ref and the blob). Refs with the same (repo, tag) are
// merged; one (repo, tag) for two indexes is kInvalidInput. Every blob is re-hashed while it is
// copied. Atomic: written into a temp directory beside dir, then renamed over it. An existing
// dir must be empty, or a mirror with options.force; anything else is refused (kInvalidInput).
// Whether dir can take a mirror: missing or empty (false), or an existing mirror with force
// (true: it will be replaced). kInvalidInput otherwise (see export_mirror).
bool check_output_dir(const std::filesystem::path& dir, bool force);

ExportReport export_mirror(const Store& store, const HubAddress& source,
                           std::vector<MirrorRef> refs, const std::filesystem::path& dir,
                           const ExportOptions& options);

struct ImportOptions {
  NoteFn note;
  oci::GraphLimits graph_limits;  // per index.json entry; over them: kRefused, nothing recorded
};

struct ImportedRef {
  std::string repo;
  std::string tag;  // empty for an untagged entry (recorded under its digest)
  Digest index;
  size_t variants_total = 0;
  size_t variants_complete = 0;      // manifest, config and layers all in the cache now
  size_t signatures = 0;             // envelopes the mirror holds for the index
  std::vector<std::string> hub_ids;  // ref records written
  std::vector<std::string> kept;     // hub ids whose newer record was kept
};

struct ImportReport {
  std::filesystem::path dir;
  std::string mirror_hub_id;  // HubAddress::id() of dir
  std::string source_hub_id;  // from kernel-hub-mirror.json ("" without one)
  std::string source;
  std::vector<ImportedRef> refs;
  size_t blobs_imported = 0;  // copied into the cache (verified)
  size_t blobs_cached = 0;    // already there
  uint64_t bytes_imported = 0;
  std::vector<std::string> warnings;
};

// Fills the store from a mirror (any layout hub directory; kernel-hub-mirror.json optional)
// with no network: every tagged (and untagged) index of every repository, the variant manifests
// present, the config and layer blobs present (each verified against its digest), the signature
// sets (merged into the cache's); nothing is unpacked (that happens on load, after the trust
// check). Only when all of it
// verified are ref records written, under the mirror directory's hub id and under the
// source_hub_id of kernel-hub-mirror.json (a newer record already there is kept), so that
// `--hub DIR --offline` and offline loads against the original hub both resolve from the cache.
// A blob that does not match its digest is kIntegrity naming the blob and its file; a variant
// kernel-hub-mirror.json says was exported whose blobs are missing is kNotFound.
ImportReport import_mirror(Store& store, const std::filesystem::path& dir,
                           const ImportOptions& options);

}  // namespace kh::mirror
