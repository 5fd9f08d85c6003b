// A Source is a place packages come from: an OCI distribution registry, or an OCI image
// layout hub (a directory or a static HTTP server). Repos are "org/name" (the registry
// namespace is added by the source). References are tags or "sha256:..." digests.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/progress.h"
#include "hub/oci/address.h"
#include "hub/oci/oci.h"
#include "hub/transport/blob_sink.h"
#include "hub/transport/http.h"
#include "hub/transport/registry_mirrors.h"

namespace kh {

namespace trust {
struct Envelope;
struct SignatureSet;
}  // namespace trust

struct FetchedManifest {
  std::string bytes;       // exactly as served; hash these, never re-serialize
  std::string media_type;  // from Content-Type or the document
  Digest digest;           // sha256 of bytes (checked against Docker-Content-Digest if sent)
};

struct BlobFetch {
  oci::Descriptor desc;
  BlobSink* sink = nullptr;
  // Filled in by fetch_blobs():
  bool ok = false;
  std::string error;
  bool integrity = false;  // the hub served other bytes than desc names (not worth a retry)
};

struct SourceOptions {
  http::Options http;
  // Basic credentials for this registry; default from KERNEL_HUB_USERNAME / KERNEL_HUB_PASSWORD
  // when they are scoped to it (KERNEL_HUB_CREDENTIALS_HOST, else KERNEL_HUB_ENDPOINT), else the
  // credentials file ($KERNEL_HUB_CREDENTIALS, default ~/.config/kernel-hub/credentials.json:
  // {"HOST[:PORT]": {"username": "...", "password": "..."}}).
  std::string username;
  std::string password;
  // Blobs larger than this are pushed in chunks (PATCH); 0 = always monolithic.
  uint64_t chunk_size = 64ull << 20;
  // Pull-through mirrors tried before a registry hub (registry_mirrors.h; KERNEL_HUB_MIRRORS
  // through HubOptions::from_env). Ignored for layout hubs.
  std::vector<RegistryMirror> mirrors;
};

class Source {
 public:
  virtual ~Source() = default;
  virtual const HubAddress& address() const = 0;

  // GETs an index or manifest by tag or digest, size-capped. Pulled by digest, the bytes are
  // verified. Throws kNotFound naming repo and reference when the hub has neither.
  virtual FetchedManifest get_manifest(const std::string& repo, const std::string& reference) = 0;

  // Downloads blobs in parallel into their sinks (which verify). Sets ok/error per blob;
  // throws only for whole-source failures (offline, auth).
  virtual void fetch_blobs(const std::string& repo, std::vector<BlobFetch>& blobs,
                           Progress* progress) = 0;

  virtual bool has_blob(const std::string& repo, const oci::Descriptor& desc) = 0;
  // Uploads a blob from a local file (size and digest already known to be right).
  virtual void push_blob(const std::string& repo, const oci::Descriptor& desc,
                         const std::filesystem::path& file) = 0;
  // PUTs manifest bytes under a reference (tag or digest).
  virtual void push_manifest(const std::string& repo, const std::string& reference,
                             std::string_view bytes, std::string_view media_type) = 0;
  virtual std::vector<std::string> list_tags(const std::string& repo) = 0;

  // Signature envelopes attached to an index (unverified: trust_verify.h decides). Registries
  // keep each as an OCI artifact whose subject is the index, found through the referrers API or,
  // where the registry lacks it (docker-registry 2.8), the referrers tag sha256-<hex>; layouts
  // keep them in the sidecar signatures/sha256-<hex>.json. An index without any gives an empty
  // set; malformed envelopes are skipped (they could never verify).
  virtual trust::SignatureSet get_signatures(const std::string& repo,
                                             const oci::Descriptor& index) = 0;
  // Attaches an envelope to an index the hub already has.
  virtual void push_signature(const std::string& repo, const oci::Descriptor& index,
                              const trust::Envelope& envelope) = 0;
};

// The referrers tag of a digest when a registry has no referrers API: "sha256-<hex>".
std::string referrers_tag(const Digest& digest);
// Where a layout keeps the signatures of an index, relative to the layout:
// signatures/sha256-<hex>.json.
std::string signature_sidecar_rel(const Digest& index);
// Reads a blob of at most `cap` bytes into memory through fetch_blobs (verified).
std::string fetch_small_blob(Source& source, const std::string& repo, const oci::Descriptor& desc,
                             uint64_t cap);
// Uploads bytes as a blob (through a temp file: push_blob streams files).
void push_small_blob(Source& source, const std::string& repo, const oci::Descriptor& desc,
                     std::string_view bytes);

std::unique_ptr<Source> open_registry_source(const HubAddress& address,
                                             const SourceOptions& options);
std::unique_ptr<Source> open_layout_source(const HubAddress& address, const SourceOptions& options);
// One OCI image layout directory (what `skopeo copy ... oci:DIR:TAG` writes), read as a source
// whose repo argument is ignored. Used by `push DIR REF`.
std::unique_ptr<Source> open_single_layout_source(const std::filesystem::path& layout_dir,
                                                  const SourceOptions& options);
// A registry hub behind the options' mirrors that apply to it (mirrored_source.cpp); the plain
// registry source when none does.
std::unique_ptr<Source> open_mirrored_registry_source(const HubAddress& address,
                                                      const SourceOptions& options);
// Picks the transport from the address kind (registries with their mirrors).
std::unique_ptr<Source> open_source(const HubAddress& address, const SourceOptions& options);

}  // namespace kh
