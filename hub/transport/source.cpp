#include "hub/transport/source.h"

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"

namespace kh {

std::unique_ptr<Source> open_source(const HubAddress& address, const SourceOptions& options) {
  if (address.kind == HubAddress::Kind::kRegistry)
    return open_mirrored_registry_source(address, options);
  return open_layout_source(address, options);
}

std::string referrers_tag(const Digest& digest) {
  return "sha256-" + digest.hex;
}

std::string signature_sidecar_rel(const Digest& index) {
  return "signatures/sha256-" + index.hex + ".json";
}

namespace {

// Collects a small blob in memory; the source verifies size and digest.
class StringSink : public BlobSink {
 public:
  explicit StringSink(uint64_t cap) : cap_(cap) {}
  uint64_t offset() const override { return bytes.size(); }
  void write(const char* data, size_t size) override {
    if (bytes.size() + size > cap_)
      throw Error(ErrorKind::kIntegrity, fmt::format("blob larger than {} bytes", cap_));
    bytes.append(data, size);
  }
  void restart() override { bytes.clear(); }
  std::string bytes;

 private:
  uint64_t cap_;
};

}  // namespace

std::string fetch_small_blob(Source& source, const std::string& repo, const oci::Descriptor& desc,
                             uint64_t cap) {
  if (desc.size < 0 || static_cast<uint64_t>(desc.size) > cap)
    throw Error(ErrorKind::kRefused,
                fmt::format("{}: blob {} is {} bytes, over the limit of {} for this document", repo,
                            desc.digest.str(), desc.size, cap));
  StringSink sink(cap);
  std::vector<BlobFetch> fetch(1);
  fetch[0].desc = desc;
  fetch[0].sink = &sink;
  source.fetch_blobs(repo, fetch, nullptr);
  if (!fetch[0].ok)
    throw Error(ErrorKind::kNotFound, fmt::format("{}: cannot fetch blob {}: {}", repo,
                                                  desc.digest.str(), fetch[0].error));
  oci::verify_bytes(desc, sink.bytes, repo + " blob " + desc.digest.str());
  return std::move(sink.bytes);
}

void push_small_blob(Source& source, const std::string& repo, const oci::Descriptor& desc,
                     std::string_view bytes) {
  fs::TempFile tmp(std::filesystem::temp_directory_path(), "kh-blob-" + desc.digest.hex);
  tmp.write(bytes);
  source.push_blob(repo, desc, tmp.path());
}

}  // namespace kh
