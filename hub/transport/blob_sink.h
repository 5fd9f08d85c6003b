// Where downloaded bytes go. The download client writes into a sink, may resume it at
// offset() with an HTTP Range request, or restart() it when the server ignores Range.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kh {

class BlobSink {
 public:
  virtual ~BlobSink() = default;
  // Bytes written and kept so far.
  virtual uint64_t offset() const = 0;
  // Appends bytes. Throws kIntegrity when they would pass the expected size.
  virtual void write(const char* data, size_t size) = 0;
  // Drops everything written so far.
  virtual void restart() = 0;
  // True when the sink itself checks size and digest before it keeps anything (the store's
  // BlobWriter does). Sources then skip hashing the bytes a second time.
  virtual bool verifies_digest() const { return false; }
};

}  // namespace kh
