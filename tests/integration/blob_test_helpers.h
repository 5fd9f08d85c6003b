// Helpers shared by the registry and fault tests: an in-memory BlobSink that verifies size
// and digest when finished (standing in for the store's BlobWriter), deterministic test
// bytes, and a registry Source with fast test timings.
#pragma once

#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/oci/oci.h"
#include "hub/transport/source.h"

namespace kh::test {

class MemorySink : public BlobSink {
 public:
  explicit MemorySink(const oci::Descriptor& d) : expected_(d) {}
  uint64_t offset() const override { return data_.size(); }
  void write(const char* p, size_t n) override {
    if (data_.size() + n > static_cast<uint64_t>(expected_.size)) {
      throw Error(ErrorKind::kIntegrity, "blob " + expected_.digest.str() + " is larger than " +
                                             std::to_string(expected_.size) + " bytes");
    }
    data_.append(p, n);
  }
  void restart() override {
    data_.clear();
    ++restarts_;
  }
  // "Commits" only verified content; returns whether it did.
  bool finish() {
    committed_ = data_.size() == static_cast<uint64_t>(expected_.size) &&
                 sha256_of(data_) == expected_.digest;
    return committed_;
  }
  bool committed() const { return committed_; }
  const std::string& data() const { return data_; }
  int restarts() const { return restarts_; }

 private:
  oci::Descriptor expected_;
  std::string data_;
  bool committed_ = false;
  int restarts_ = 0;
};

inline BlobFetch blob_fetch(const oci::Descriptor& d, BlobSink* sink) {
  BlobFetch f;
  f.desc = d;
  f.sink = sink;
  return f;
}

inline std::string test_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

inline oci::Descriptor layer_descriptor(const std::string& bytes) {
  return oci::describe(bytes, oci::kMediaTypeLayerTarZstd);
}

inline SourceOptions fast_source_options() {
  SourceOptions o;
  o.http.allow_plain_http = true;
  o.http.backoff_initial_s = 0.05;
  o.http.backoff_max_s = 0.2;
  o.http.max_attempts = 5;
  o.http.connect_timeout_ms = 3000;
  o.http.low_speed_time_s = 5;
  o.http.metadata_timeout_s = 30;
  return o;
}

inline std::unique_ptr<Source> registry_source(const std::string& oci_url, const SourceOptions& o) {
  return open_registry_source(HubAddress::parse(oci_url, /*plain_http=*/true), o);
}

// Writes bytes to a file under dir and pushes them as a blob.
inline void push_bytes(Source& src, const std::string& repo, const std::filesystem::path& dir,
                       const std::string& bytes, const oci::Descriptor& d) {
  auto path = dir / ("blob-" + d.digest.hex);
  fs::write_file_atomic(path, bytes);
  src.push_blob(repo, d, path);
}

// A one-layer artifact manifest (empty config) around `layer`; returns its bytes.
inline std::string artifact_manifest(const oci::Descriptor& layer) {
  oci::Manifest m;
  m.artifact_type = std::string(oci::kArtifactTypeKernel);
  m.config = oci::empty_descriptor();
  m.layers = {layer};
  return oci::serialize(m);
}

}  // namespace kh::test
