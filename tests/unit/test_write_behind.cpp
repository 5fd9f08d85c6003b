// The download client's write-behind thread (hub/transport/write_behind.h): every byte reaches
// its sink in order, offsets and restarts wait for what is queued, a sink's error is kept and
// handed back, and the queue stays bounded.
#include "hub/transport/write_behind.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "hub/base/error.h"

namespace kh::http {
namespace {

class SlowSink : public BlobSink {
 public:
  explicit SlowSink(size_t fail_after = SIZE_MAX) : fail_after_(fail_after) {}
  uint64_t offset() const override { return data.size(); }
  void write(const char* p, size_t n) override {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (data.size() + n > fail_after_)
      throw Error(ErrorKind::kIntegrity, "more bytes than the descriptor says");
    data.append(p, n);
    writes.fetch_add(1);
    written.fetch_add(n);
  }
  void restart() override { data.clear(); }
  std::string data;
  std::atomic<int> writes{0};
  std::atomic<size_t> written{0};

 private:
  size_t fail_after_;
};

TEST(WriteBehind, EveryByteReachesItsSinkInOrder) {
  SlowSink a, b;
  std::string expect_a, expect_b;
  {
    WriteBehind behind(4096);
    auto& la = behind.lane(&a);
    auto& lb = behind.lane(&b);
    for (int i = 0; i < 200; ++i) {
      std::string chunk(100 + i, static_cast<char>('a' + i % 26));
      behind.push(la, chunk.data(), chunk.size());
      expect_a += chunk;
      std::string other(37, static_cast<char>('A' + i % 26));
      behind.push(lb, other.data(), other.size());
      expect_b += other;
    }
    EXPECT_EQ(behind.offset(la), expect_a.size());  // waits for the queue
    EXPECT_EQ(a.data, expect_a);
    EXPECT_EQ(behind.settle(lb), nullptr);
  }
  EXPECT_EQ(b.data, expect_b);
}

TEST(WriteBehind, ASinkErrorIsKeptUntilRestart) {
  SlowSink sink(250);
  WriteBehind behind;
  auto& lane = behind.lane(&sink);
  std::string chunk(100, 'x');
  // Settled after each push: one sink write each (queued pushes are appended to one chunk).
  for (int i = 0; i < 3; ++i) {
    behind.push(lane, chunk.data(), chunk.size());
    behind.settle(lane);
  }
  behind.push(lane, chunk.data(), chunk.size());
  behind.push(lane, chunk.data(), chunk.size());
  std::exception_ptr failed = behind.settle(lane);
  ASSERT_NE(failed, nullptr);
  try {
    std::rethrow_exception(failed);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity);
  }
  EXPECT_EQ(sink.data.size(), 200u);  // what came after the error was dropped
  EXPECT_EQ(sink.writes.load(), 2);
  EXPECT_NE(behind.error(lane), nullptr);
  behind.restart(lane);
  EXPECT_EQ(behind.error(lane), nullptr);
  EXPECT_EQ(sink.data.size(), 0u);
  behind.push(lane, chunk.data(), chunk.size());
  EXPECT_EQ(behind.offset(lane), 100u);
}

TEST(WriteBehind, PushWaitsWhileTheQueueIsFull) {
  SlowSink sink;
  WriteBehind behind(1000);
  auto& lane = behind.lane(&sink);
  std::string chunk(400, 'y');
  // At most 1000 bytes wait (the one being written included): when the last push returns, the
  // sink has seen all but those.
  for (int i = 0; i < 50; ++i) behind.push(lane, chunk.data(), chunk.size());
  EXPECT_GE(sink.written.load(), 50u * 400u - 1000u);
  EXPECT_EQ(behind.offset(lane), 50u * 400u);
}

}  // namespace
}  // namespace kh::http
