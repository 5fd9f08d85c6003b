// Writes downloaded bytes into their sinks on a thread of its own, so that the thread receiving
// them (libcurl's callbacks, one thread for every parallel transfer) only copies them: a sink's
// work (the store's temp-file write and SHA-256, a VerifyingSink's hash) overlaps receiving
// instead of stalling every transfer while it runs. Measured on loopback (tools/bench/RESULTS.md)
// that work was half of the receive thread's time.
//
// Nothing about verification changes: the same sink sees the same bytes in the same order, and
// the caller reads offset() and the digest only after drain(), so a blob still counts as fetched
// only when everything it received went through its sink.
//
// Bounded: push() blocks while max_queued_bytes are waiting. A sink's first exception is kept
// (later bytes for it are dropped) and handed back by error() and settle(), until restart().
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hub/transport/blob_sink.h"

namespace kh::http {

class WriteBehind {
 public:
  // One sink's queue state.
  struct Lane {
    BlobSink* sink = nullptr;
    size_t pending = 0;  // chunks queued, not yet written
    std::exception_ptr error;
  };

  explicit WriteBehind(size_t max_queued_bytes = 16u << 20);
  ~WriteBehind();  // writes what is queued, then stops the thread
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  // A lane for sink, alive as long as this object.
  Lane& lane(BlobSink* sink);
  // Queues a copy of the bytes for the lane's sink (dropped when the lane has an error).
  void push(Lane& lane, const char* data, size_t size);
  // The lane's first error so far, without waiting (null when none).
  std::exception_ptr error(Lane& lane);
  // Waits until everything queued for the lane reached its sink; returns its first error.
  std::exception_ptr settle(Lane& lane);
  // settle(), then the sink's offset().
  uint64_t offset(Lane& lane);
  // settle(), then the sink's restart(); the error is cleared.
  void restart(Lane& lane);

 private:
  struct Chunk {
    Lane* lane;
    std::string bytes;
  };
  void run();

  static constexpr size_t kChunkBytes = 1u << 20;  // receive callbacks are appended up to this
  static constexpr size_t kSpareChunks = 16;

  const size_t max_queued_bytes_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // chunks queued, or stop
  std::condition_variable done_cv_;  // a chunk written
  std::deque<Chunk> queue_;
  std::vector<std::string> spare_;  // buffers of written chunks, reused (no malloc per chunk)
  std::list<Lane> lanes_;
  size_t queued_bytes_ = 0;
  int waiters_ = 0;           // threads in done_cv_.wait (no wake-up per chunk without one)
  bool worker_idle_ = false;  // the worker is in work_cv_.wait (no wake-up per chunk otherwise)
  bool stop_ = false;
  std::thread worker_;  // started on the first push
};

}  // namespace kh::http
