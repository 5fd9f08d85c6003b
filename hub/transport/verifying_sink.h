// Hashes what passes through to the real sink, so that a source can tell a blob corrupted in
// transit (or served wrong by a mirror) from a good one before it reports the fetch as done.
// Resumes keep the hash; restarts reset it. The source that made it compares digest() with the
// descriptor: sources do not wrap it again (verifies_digest()).
#pragma once

#include "hub/base/digest.h"
#include "hub/transport/blob_sink.h"

namespace kh {

class VerifyingSink : public BlobSink {
 public:
  explicit VerifyingSink(BlobSink* inner) : inner_(inner) {
    // We cannot hash bytes written before we got the sink: start clean.
    if (inner_->offset() > 0) inner_->restart();
  }
  uint64_t offset() const override { return inner_->offset(); }
  void write(const char* data, size_t size) override {
    inner_->write(data, size);
    hash_.update(data, size);
  }
  void restart() override {
    inner_->restart();
    hash_.reset();
  }
  bool verifies_digest() const override { return true; }
  Digest digest() { return hash_.finish(); }

 private:
  BlobSink* inner_;
  Sha256 hash_;
};

}  // namespace kh
