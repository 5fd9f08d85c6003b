// Clocks. unix_now: wall-clock time in unix seconds, for what is compared with other machines'
// clocks or kept on disk: ref record ages, signature serials and expiry, mirror timestamps.
// ms_since: elapsed time on the monotonic clock, for durations measured in this process (load
// times, reports, benchmarks).
#pragma once

#include <chrono>
#include <cstdint>

namespace kh {

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Wall-clock time in nanoseconds since the epoch, to compare with file times (a file written
// after this call never has an earlier time: file times come from a coarser copy of this clock).
inline int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Milliseconds since t0 (a std::chrono::steady_clock::now()).
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kh
