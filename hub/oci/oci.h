// The OCI data model (image spec 1.1): descriptors, image manifests, image indexes.
// Parsing validates media types, digest syntax, sizes and inline data; serialization is
// canonical (sorted keys, no whitespace) so that packing the same inputs twice gives the same
// digests. Bytes fetched from a hub are always hashed as received, never re-serialized.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/base64.h"
#include "hub/base/digest.h"

namespace kh::oci {

inline constexpr std::string_view kMediaTypeIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kMediaTypeManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kMediaTypeEmpty = "application/vnd.oci.empty.v1+json";
inline constexpr std::string_view kMediaTypeLayerTarZstd =
    "application/vnd.oci.image.layer.v1.tar+zstd";
inline constexpr std::string_view kMediaTypeOctetStream = "application/octet-stream";
// kernel-hub's own namespace ("kernelhub"), fixed before the first publish.
inline constexpr std::string_view kArtifactTypeKernel = "application/vnd.kernelhub.kernel.v1";
inline constexpr std::string_view kArtifactTypeSignature =
    "application/vnd.kernelhub.signature.v1+json";
inline constexpr std::string_view kAnnotationPrefix = "kernelhub.";
inline constexpr std::string_view kAnnotationRefName = "org.opencontainers.image.ref.name";
inline constexpr std::string_view kAnnotationTitle = "org.opencontainers.image.title";
inline constexpr std::string_view kAnnotationVersion = "org.opencontainers.image.version";
inline constexpr std::string_view kAnnotationCreated = "org.opencontainers.image.created";

// Metadata documents (manifests, indexes) are capped when fetched.
inline constexpr uint64_t kMaxManifestBytes = 4 << 20;

using Annotations = std::map<std::string, std::string>;

struct Platform {
  std::string os;
  std::string architecture;
  std::string variant;
  bool operator==(const Platform&) const = default;
};

struct Descriptor {
  std::string media_type;
  Digest digest;
  int64_t size = 0;
  std::string artifact_type;
  Annotations annotations;
  std::vector<std::string> urls;
  std::optional<std::string> data;  // base64, verified against digest and size when parsed
  std::optional<Platform> platform;
  bool operator==(const Descriptor&) const = default;
};

struct Manifest {
  std::string media_type{kMediaTypeManifest};
  std::string artifact_type;
  Descriptor config;
  std::vector<Descriptor> layers;
  std::optional<Descriptor> subject;
  Annotations annotations;
};

struct Index {
  std::string media_type{kMediaTypeIndex};
  std::string artifact_type;
  std::vector<Descriptor> manifests;
  std::optional<Descriptor> subject;
  Annotations annotations;
};

// The empty JSON descriptor "{}" used as config of artifacts.
Descriptor empty_descriptor();
// A descriptor of bytes with the given media type.
Descriptor describe(std::string_view bytes, std::string_view media_type);

// Parse and validate. Errors are kInvalidInput and name the JSON path, e.g.
// "manifest: layers[0].digest: invalid digest 'x'". `what` names the document in messages.
Manifest parse_manifest(std::string_view bytes, std::string_view what = "manifest");
Index parse_index(std::string_view bytes, std::string_view what = "index");
Descriptor parse_descriptor_json(std::string_view bytes, std::string_view what = "descriptor");
// Returns the mediaType field of a manifest or index document (empty when absent).
std::string peek_media_type(std::string_view bytes);
// Throws kIntegrity unless bytes match the descriptor's size and digest.
void verify_bytes(const Descriptor& d, std::string_view bytes, std::string_view what);

// Canonical serialization.
std::string serialize(const Manifest& m);
std::string serialize(const Index& i);
std::string serialize(const Descriptor& d);

}  // namespace kh::oci
