#include "hub/transport/write_behind.h"

namespace kh::http {

WriteBehind::WriteBehind(size_t max_queued_bytes) : max_queued_bytes_(max_queued_bytes) {}

WriteBehind::~WriteBehind() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

WriteBehind::Lane& WriteBehind::lane(BlobSink* sink) {
  std::lock_guard lock(mu_);
  lanes_.push_back(Lane{sink, 0, nullptr});
  return lanes_.back();
}

void WriteBehind::push(Lane& lane, const char* data, size_t size) {
  if (size == 0) return;
  std::unique_lock lock(mu_);
  if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
  // One chunk always fits, however large: the bound is on what waits, not on a chunk.
  ++waiters_;
  done_cv_.wait(lock,
                [&] { return queued_bytes_ == 0 || queued_bytes_ + size <= max_queued_bytes_; });
  --waiters_;
  queued_bytes_ += size;
  // Appended to the lane's last chunk while the worker has not taken it: fewer, larger writes
  // (and wake-ups) than one per receive callback.
  if (!queue_.empty() && queue_.back().lane == &lane &&
      queue_.back().bytes.size() + size <= kChunkBytes) {
    queue_.back().bytes.append(data, size);
    return;
  }
  std::string buffer;
  if (!spare_.empty()) {
    buffer = std::move(spare_.back());
    spare_.pop_back();
  }
  buffer.reserve(kChunkBytes);
  buffer.assign(data, size);
  ++lane.pending;
  queue_.push_back(Chunk{&lane, std::move(buffer)});
  if (worker_idle_) work_cv_.notify_one();
}

std::exception_ptr WriteBehind::error(Lane& lane) {
  std::lock_guard lock(mu_);
  return lane.error;
}

std::exception_ptr WriteBehind::settle(Lane& lane) {
  std::unique_lock lock(mu_);
  ++waiters_;
  done_cv_.wait(lock, [&] { return lane.pending == 0; });
  --waiters_;
  return lane.error;
}

uint64_t WriteBehind::offset(Lane& lane) {
  settle(lane);
  return lane.sink->offset();
}

void WriteBehind::restart(Lane& lane) {
  settle(lane);
  lane.sink->restart();
  std::lock_guard lock(mu_);
  lane.error = nullptr;
}

void WriteBehind::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    worker_idle_ = true;
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    worker_idle_ = false;
    if (queue_.empty()) return;  // stopping, and everything was written
    Chunk chunk = std::move(queue_.front());
    queue_.pop_front();
    Lane& lane = *chunk.lane;
    const bool drop = lane.error != nullptr;
    lock.unlock();
    std::exception_ptr failed;
    if (!drop) {
      try {
        lane.sink->write(chunk.bytes.data(), chunk.bytes.size());
      } catch (...) {
        failed = std::current_exception();
      }
    }
    lock.lock();
    if (failed && !lane.error) lane.error = failed;
    --lane.pending;
    queued_bytes_ -= chunk.bytes.size();
    if (spare_.size() < kSpareChunks) {
      chunk.bytes.clear();
      spare_.push_back(std::move(chunk.bytes));
    }
    if (waiters_ > 0) done_cv_.notify_all();
  }
}

}  // namespace kh::http
